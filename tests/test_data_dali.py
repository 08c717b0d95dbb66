"""The optional DALI backend (skipped cleanly where nvidia-dali is not installed)."""

import pytest
import torch

from dlperf.data.dali import DaliLoader, dali_available
from dlperf.data.loader import LoaderConfig
from dlperf.data.sources import open_source
from imagegen import make_folder

needs_dali = pytest.mark.skipif(not dali_available(), reason="nvidia-dali is not installed")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("dali"), classes=3, per_class=7)  # 21 samples


@needs_dali
def test_dali_batches_follow_the_loader_contract(folder):
    src = open_source(folder)
    ld = DaliLoader(src, LoaderConfig(batch_size=4, size=48, threads=2, drop_last=False))
    batches = list(ld)
    assert len(batches) == len(ld) == 6 and ld.epoch == 1
    b = batches[0]
    assert b.images.dtype == torch.uint8 and b.images.shape == (4, 48, 48, 3)
    assert b.labels.dtype == torch.int64 and set(b.labels.tolist()) <= {0, 1, 2}
    assert sum(len(x) for x in batches) == 21
    assert len(list(ld)) == 6  # a second epoch


@needs_dali
def test_dali_sharding_gives_equal_batch_counts(folder):
    src = open_source(folder)
    counts = {len(DaliLoader(src, LoaderConfig(batch_size=2, size=32, rank=r, world_size=3)))
              for r in range(3)}
    assert counts == {3}


@needs_dali
def test_dali_resume_skips_to_the_saved_batch(folder):
    src = open_source(folder)
    cfg = LoaderConfig(batch_size=4, size=32, threads=1, drop_last=False)
    ld = DaliLoader(src, cfg)
    it = iter(ld)
    next(it)
    next(it)
    state = ld.state_dict()
    again = DaliLoader(src, cfg)
    again.load_state_dict(state)
    assert len(list(again)) == len(again) - 2


def test_text_labels_parse_and_garbage_is_refused():
    from dlperf.data.dali import LABEL_BYTES, parse_text_labels
    from dlperf.errors import DlperfError

    def raw(*texts):
        out = torch.zeros(len(texts), LABEL_BYTES, dtype=torch.uint8)
        for i, t in enumerate(texts):
            out[i, :len(t)] = torch.tensor(list(t.encode()), dtype=torch.uint8)
        return out

    assert parse_text_labels(raw("0", "7", "12", "999", "100000")).tolist() == [0, 7, 12, 999,
                                                                               100000]
    for bad in ("", "-1", "1 2", "3\n"):
        with pytest.raises(DlperfError, match="not a decimal number"):
            parse_text_labels(raw("5", bad))


@needs_dali
def test_dali_reads_dlperf_shards_with_their_labels(folder, tmp_path):
    from dlperf.data.prepare import prepare
    from dlperf.data.sources import ShardSource

    prepare(folder, tmp_path / "shards")
    shards = ShardSource(tmp_path / "shards")
    ld = DaliLoader(shards, LoaderConfig(batch_size=4, size=32, threads=1, drop_last=False,
                                         shuffle=False))
    batches = list(ld)
    assert sum(len(b) for b in batches) == 21 and batches[0].images.shape == (4, 32, 32, 3)
    got = torch.cat([b.labels for b in batches]).tolist()
    assert got == [shards.label(i) for i in range(21)]  # unshuffled: the shards' order
