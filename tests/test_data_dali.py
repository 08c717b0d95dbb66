"""The optional DALI backend (skipped cleanly where nvidia-dali is not installed)."""

import pytest
import torch

from dlperf.data.dali import DaliLoader, dali_available
from dlperf.data.loader import LoaderConfig
from dlperf.data.sources import open_source
from imagegen import make_folder

pytestmark = pytest.mark.skipif(not dali_available(), reason="nvidia-dali is not installed")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("dali"), classes=3, per_class=7)  # 21 samples


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


def test_dali_sharding_gives_equal_batch_counts(folder):
    src = open_source(folder)
    counts = {len(DaliLoader(src, LoaderConfig(batch_size=2, size=32, rank=r, world_size=3)))
              for r in range(3)}
    assert counts == {3}


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
