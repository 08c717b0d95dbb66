"""Loader: determinism across threads, exact resume, sharding, bad files, flat memory."""

import dataclasses
import os

import numpy as np
import pytest
import torch

from dlperf.data.augment import TrainAugment, random_resized_crop, sample_rng
from dlperf.data.loader import DataError, Loader, LoaderConfig, SyntheticLoader
from dlperf.data.sources import FileSource, open_source
from dlperf.errors import DlperfError
from imagegen import (cmyk_jpeg_bytes, exif_jpeg_bytes, jpeg_bytes, make_folder, png16_bytes,
                      png_bytes, smooth_rgb)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("ds"), classes=3, per_class=7)  # 21 samples


def _epoch(loader):
    imgs, labels, ids = [], [], []
    for b in loader:
        imgs.append(b.images.clone())
        labels.append(b.labels.clone())
        ids.append(b.indices.copy())
    return torch.cat(imgs), torch.cat(labels), np.concatenate(ids)


def test_rrc_params_follow_torchvision_rules():
    aug = TrainAugment(224)
    for i in range(300):
        p = random_resized_crop(375, 500, aug, sample_rng(0, 0, i))
        assert 0 <= p.top and p.top + p.height <= 375 and 0 <= p.left and p.left + p.width <= 500
        frac = p.height * p.width / (375 * 500)
        assert 0.07 <= frac <= 1.0
        assert 3 / 4 * 0.95 <= p.width / p.height <= 4 / 3 * 1.05 or p.height == 375
    # same (seed, epoch, index) -> same crop; another index -> another crop
    a = random_resized_crop(375, 500, aug, sample_rng(1, 2, 3))
    assert a == random_resized_crop(375, 500, aug, sample_rng(1, 2, 3))
    assert a != random_resized_crop(375, 500, aug, sample_rng(1, 2, 4))
    # a very wide image falls back to a centred crop clamped to ratio 4/3
    p = random_resized_crop(10, 1000, TrainAugment(224, scale=(0.9, 1.0)), sample_rng(0, 0, 0))
    assert (p.height, p.width) == (10, 13) and p.left == (1000 - 13) // 2


def test_same_crops_for_one_and_two_threads(folder):
    src = open_source(folder)
    one = _epoch(Loader(src, LoaderConfig(batch_size=4, size=64, threads=1, seed=3)))
    two = _epoch(Loader(src, LoaderConfig(batch_size=4, size=64, threads=2, seed=3)))
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])
    assert np.array_equal(one[2], two[2])


def test_epochs_differ_and_labels_match_folders(folder):
    src = open_source(folder)
    ld = Loader(src, LoaderConfig(batch_size=5, size=48, threads=2, drop_last=False))
    e0, e1 = _epoch(ld), _epoch(ld)
    assert ld.epoch == 2
    assert not np.array_equal(e0[2], e1[2])  # new permutation
    assert sorted(e0[2].tolist()) == list(range(len(src)))  # every sample once
    assert all(src.label(int(i)) == int(lab) for i, lab in zip(e0[2], e0[1]))


class CountingSource(FileSource):
    def __init__(self, inner):
        super().__init__(inner.items, inner.classes)
        self.reads = []

    def read_limited(self, index, limit):
        self.reads.append(index)
        return super().read_limited(index, limit)


def test_resume_mid_epoch_equals_uninterrupted(folder):
    cfg = LoaderConfig(batch_size=4, size=48, threads=2, seed=7)
    src = open_source(folder)
    full = Loader(src, cfg)
    _epoch(full)  # epoch 0
    ref = _epoch(full)  # epoch 1, uninterrupted

    first = Loader(src, cfg)
    first.set_epoch(1)
    it = iter(first)
    head = [next(it).images.clone() for _ in range(2)]
    state = first.state_dict()
    assert state["epoch"] == 1 and state["next_batch"] == 2

    counting = CountingSource(src)
    # one thread, prefetch 1: reads happen in submission order (crops do not depend on either)
    resumed = Loader(counting, dataclasses.replace(cfg, threads=1, prefetch=1))
    resumed.load_state_dict(state)
    tail = _epoch(resumed)
    assert torch.equal(torch.cat(head + [tail[0]]), ref[0])
    # the two batches before the resume point were not read again: the resumed epoch read
    # exactly the rest of epoch 1's order (then began epoch 2 ahead of time)
    order = resumed.rank_order(1).tolist()
    rest = (len(full) - 2) * cfg.batch_size
    assert counting.reads[:rest] == order[2 * cfg.batch_size:len(full) * cfg.batch_size]
    assert len(counting.reads) <= rest + cfg.batch_size  # + at most the prefetched batch
    with pytest.raises(DlperfError, match="batch_size was 4, now 8"):
        Loader(src, LoaderConfig(batch_size=8, seed=7)).load_state_dict(state)


@pytest.mark.parametrize("n", [21, 16])
@pytest.mark.parametrize("drop_last", [True, False])
def test_sharding_no_overlap_equal_batches(folder, n, drop_last):
    src = open_source(folder)
    src = FileSource(src.items[:n], src.classes)
    for world in (1, 2, 3, 4):
        loaders = [Loader(src, LoaderConfig(batch_size=2, size=32, threads=1, rank=r,
                                            world_size=world, drop_last=drop_last))
                   for r in range(world)]
        assert len({len(ld) for ld in loaders}) == 1  # same batch count on every rank
        real = []
        for ld in loaders:
            batches = list(ld)
            assert len(batches) == len(ld)
            for b in batches:
                keep = len(b) - b.num_padded
                real.extend(b.indices[:keep].tolist())
        assert len(real) == len(set(real))  # no sample on two ranks
        if not drop_last:
            assert sorted(real) == list(range(n))  # and none lost


@pytest.fixture
def messy(tmp_path):
    d = tmp_path / "messy" / "c0"
    d.mkdir(parents=True)
    good = smooth_rgb(80, 100)
    files = {
        "ok_baseline.JPEG": jpeg_bytes(good),
        "ok_progressive.JPEG": jpeg_bytes(good, progressive=True),
        "ok_gray.JPEG": jpeg_bytes(good[:, :, 0]),
        "ok_cmyk.JPEG": cmyk_jpeg_bytes(good),
        "ok_png_named_jpeg.JPEG": png_bytes(good),
        "ok_exif_rotated.JPEG": exif_jpeg_bytes(good, 6),
        "ok_16bit.png": png16_bytes(60, 60),
        "bad_truncated.JPEG": jpeg_bytes(smooth_rgb(160, 160))[:-400],
        "bad_empty.JPEG": b"",
        "bad_text.JPEG": b"not an image, just text with a .JPEG name\n" * 10,
        "bad_bomb.png": png_bytes(np.zeros((400, 400, 3), np.uint8)),
    }
    for name, data in files.items():
        (d / name).write_bytes(data)
    return tmp_path / "messy"


def test_bad_files_skipped_and_reported(messy):
    from dlperf.data.decode import DecodeLimits

    src = open_source(messy)
    cfg = LoaderConfig(batch_size=16, size=32, threads=2, train=False, max_bad_fraction=0.5,
                       limits=DecodeLimits(max_pixels=300 * 300))
    ld = Loader(src, cfg)
    [batch] = list(ld)
    names = [os.path.basename(src.name(int(i))) for i in batch.indices]
    assert sorted(names) == sorted(n for n in os.listdir(messy / "c0") if n.startswith("ok_"))
    assert len(batch) == 7 == batch.images.shape[0]
    reasons = {os.path.basename(n): r for n, r in ld.report.bad}
    assert set(reasons) == {"bad_truncated.JPEG", "bad_empty.JPEG", "bad_text.JPEG",
                            "bad_bomb.png"}
    assert "empty file" in reasons["bad_empty.JPEG"]
    assert "not an image" in reasons["bad_text.JPEG"]
    assert "truncated" in reasons["bad_truncated.JPEG"]
    assert "too many pixels" in reasons["bad_bomb.png"]
    assert "4 bad files skipped" in ld.reports[-1]
    # the rotated image came out upright: a 80x100 image with orientation 6 is 100 tall, 80 wide;
    # eval centre-crops it, and the crop is not the unrotated one
    assert batch.images.dtype == torch.uint8 and batch.images.shape[1:] == (32, 32, 3)


def test_bad_file_policy_raise_and_threshold(messy):
    src = open_source(messy)
    with pytest.raises(DataError, match="bad_"):
        list(Loader(src, LoaderConfig(batch_size=16, size=32, train=False, on_bad_file="raise")))
    with pytest.raises(DataError, match="exceed max_bad_fraction=0.1"):
        list(Loader(src, LoaderConfig(batch_size=16, size=32, train=False,
                                      max_bad_fraction=0.1)))


def test_next_epoch_head_start_is_used_or_discarded(folder):
    src = open_source(folder)
    cfg = LoaderConfig(batch_size=4, size=32, threads=2, seed=5)
    ref = Loader(src, cfg)
    ref.set_epoch(3)
    want3 = _epoch(ref)
    ld = Loader(src, cfg)
    _epoch(ld)  # epoch 0; epoch 1's first batches start decoding in the background
    assert ld._pending
    ld.set_epoch(3)  # not epoch 1: the head start must be discarded, not served
    got3 = _epoch(ld)
    assert torch.equal(got3[0], want3[0]) and np.array_equal(got3[2], want3[2])
    ld.set_epoch(4)
    next(iter(ld))  # an abandoned epoch drains its threads
    assert ld._pending is None
    ld.close()


def test_pad_to_four_channels(folder):
    ld = Loader(open_source(folder), LoaderConfig(batch_size=4, size=32, channels=4, threads=2))
    b = next(iter(ld))
    assert b.images.shape[-1] == 4 and (b.images[..., 3] == 0).all()
    assert b.images[..., :3].float().mean() > 10


def _rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.slow
def test_memory_flat_across_epochs(folder):
    ld = Loader(open_source(folder), LoaderConfig(batch_size=8, size=96, threads=2))
    for _ in range(3):
        _epoch(ld)
    before = _rss_mb()
    for _ in range(12):
        for _ in ld:
            pass
    assert _rss_mb() - before < 15


def test_rank_and_world_from_torchrun_env(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    cfg = LoaderConfig.from_env(batch_size=8)
    assert (cfg.rank, cfg.world_size, cfg.batch_size) == (2, 4, 8)
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(DlperfError, match="rank 4 is not in"):
        LoaderConfig.from_env()


def test_threads_split_between_local_ranks(monkeypatch):
    cpus = len(os.sched_getaffinity(0))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert LoaderConfig().thread_count() == cpus
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(2 * cpus))  # more ranks than CPUs: still one
    assert LoaderConfig().thread_count() == 1
    assert LoaderConfig(threads=3).thread_count() == 3


def test_synthetic_loader_shapes_and_resume():
    ld = SyntheticLoader(batch_size=4, size=16, batches=5)
    it = iter(ld)
    next(it)
    state = ld.state_dict()
    ld2 = SyntheticLoader(batch_size=4, size=16, batches=5)
    ld2.load_state_dict(state)
    assert len(list(ld2)) == 4
    b = next(iter(SyntheticLoader(batch_size=4, size=16, batches=1)))
    assert b.images.shape == (4, 16, 16, 3) and b.images.dtype == torch.uint8
