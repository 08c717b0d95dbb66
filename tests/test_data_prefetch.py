"""DevicePrefetcher: batches one step ahead, and the loader position a checkpoint must record."""

import torch

from dlperf.data.device import DevicePrefetcher, normalize_nhwc
from dlperf.data.loader import SyntheticLoader


def test_prefetcher_hands_out_every_batch_in_order_and_reports_the_handed_out_position():
    loader = SyntheticLoader(4, size=8, num_classes=10, batches=3, seed=1)
    expected = [(normalize_nhwc(b.images.clone()), b.labels.clone()) for b in loader]
    loader.set_epoch(0)
    it = DevicePrefetcher(loader, torch.device("cpu"), channels_last=True)
    # one batch taken from the loader, none handed out: a checkpoint now must say batch 0
    assert loader.state_dict()["next_batch"] == 1 and it.loader_state()["next_batch"] == 0
    got = []
    for k, (x, y, n) in enumerate(it):
        got.append((x, y))
        assert n == 4 and x.is_contiguous(memory_format=torch.channels_last)
        if k < 2:  # the loader is one ahead of what the steps have seen
            assert it.loader_state()["next_batch"] == k + 1
    assert len(got) == 3
    for (x, y), (ex, ey) in zip(got, expected):
        assert torch.equal(x, ex) and torch.equal(y, ey)
    # after the last batch the loader's epoch has ended, and nothing is held back
    assert it.loader_state() == loader.state_dict() and loader.state_dict()["next_batch"] == 0


def test_prefetcher_nchw_when_channels_last_is_off_and_waits_are_measured():
    loader = SyntheticLoader(2, size=8, batches=2)
    it = DevicePrefetcher(loader, torch.device("cpu"), channels_last=False)
    x, _, _ = next(it)
    assert x.is_contiguous() and it.last_wait >= 0.0
