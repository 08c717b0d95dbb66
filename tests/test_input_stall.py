"""The input stall of a training run: the GPU's idle time between steps, not the host's wait.

A simulated stream stands in for CUDA: the host issues work and events at host instants, the
GPU runs them in order, each starting when both the host has issued it and the GPU has
finished what came before (what a CUDA stream does). Events report completion against the
host's clock, as ``Event.query`` does.
"""

from __future__ import annotations

import pytest
import torch

from dlperf.train.metrics import InputStall, Throughput


class Stream:
    def __init__(self):
        self.host = 0.0  # the host's clock (s)
        self.gpu = 0.0  # when the GPU finishes what has been issued so far

    def issue(self, seconds: float) -> None:
        """Kernels of ``seconds`` GPU time, issued now (returns at once: asynchronous)."""
        self.gpu = max(self.gpu, self.host) + seconds

    def event(self):
        return Event(self)


class Event:
    def __init__(self, stream: Stream):
        self.stream, self.at = stream, None

    def record(self) -> None:
        self.at = max(self.stream.gpu, self.stream.host)  # reached when the GPU gets to it

    def query(self) -> bool:
        return self.stream.host >= self.at

    def synchronize(self) -> None:
        self.stream.host = max(self.stream.host, self.at)

    def elapsed_time(self, other: "Event") -> float:
        assert self.query() and other.query(), "elapsed_time on an incomplete event"
        return (other.at - self.at) * 1e3  # ms, as CUDA's


def run(batch_ready_after: list[float], step_s: float):
    """A loop as the trainer's: wait for the batch (host), issue the step, lap. Returns the
    Throughput with InputStall's figures and the host's total wait."""
    stream = Stream()
    stall, tput = InputStall(torch.device("cpu"), event=stream.event), Throughput()
    tput.laps = 1  # (past the first step, which Throughput keeps apart)
    host_wait = 0.0
    for wait in batch_ready_after:
        stream.host += wait  # blocked on the loader
        host_wait += wait
        stall.step_start()
        stream.issue(step_s)
        stall.step_end()
        tput.data_wait += stall.take(wait)
    tput.add_wait(stall.take(0.0, drain=True))
    return tput, host_wait, stream


def test_a_batch_that_comes_while_the_gpu_still_runs_is_no_stall():
    # Steps of 10 ms issued asynchronously; each batch comes 4 ms after the host issued the
    # step before it. The host waited 4 ms a step (3 gaps counted from the second step),
    # the GPU never: 0 ms stall.
    tput, host_wait, _ = run([0.004] * 4, 0.010)
    assert host_wait == pytest.approx(0.016)
    assert tput.data_wait == pytest.approx(0.0)


def test_a_batch_later_than_the_step_is_the_difference():
    # Batches 15 ms apart, steps of 10 ms: the GPU idles 5 ms between steps. Four steps, three
    # gaps (the first step has no step before it): 15 ms of stall, where the host waited 60.
    tput, host_wait, stream = run([0.015] * 4, 0.010)
    assert host_wait == pytest.approx(0.060)
    assert tput.data_wait == pytest.approx(0.015)
    # the compute-only rate: 60 ms of wall (four batches 15 ms apart) less 15 ms of stall =
    # 45 ms (the first batch's wait has no step before it; the trainer keeps that step apart),
    # where the host's wait would have left 0 ms and no rate at all
    tput.wall, tput.images = 0.060, 4
    assert tput.compute_img_per_s == pytest.approx(4 / 0.045)


def test_gaps_are_read_only_once_complete_and_all_of_them_by_the_drain():
    stream = Stream()
    stall = InputStall(torch.device("cpu"), event=stream.event)
    stall.step_start()  # no step before: nothing to measure
    stream.issue(0.010)
    stall.step_end()
    stream.host += 0.020  # the batch comes 20 ms later: the GPU idled 10 ms
    stall.step_start()
    stream.issue(0.010)
    stall.step_end()
    # the second step's start event is recorded at host 20 ms, reached at once: complete
    assert stall.take(0.020) == pytest.approx(0.010)
    stream.host += 0.001  # the next batch is ready while the GPU still has 9 ms to run
    stall.step_start()
    stream.issue(0.010)
    stall.step_end()
    assert stall.take(0.001) == 0.0  # its start event is not reached yet: not read
    assert stall.take(0.0, drain=True) == pytest.approx(0.0)  # read by the drain: no gap
    assert stream.host == pytest.approx(0.030)  # the drain waited for that event
    stall.reset()  # a new epoch: the gap across evaluation is not counted
    stream.host += 1.0
    stall.step_start()
    assert stall.take(0.0, drain=True) == 0.0


def test_on_a_cpu_the_hosts_wait_is_the_stall():
    stall = InputStall(torch.device("cpu"))
    stall.step_start()
    stall.step_end()
    assert stall.take(0.25) == 0.25 and stall.take(0.0, drain=True) == 0.0


def test_a_stall_read_before_any_lap_is_not_counted():
    tput = Throughput()
    tput.add_wait(1.0)  # the run's first step is kept apart: so is its stall
    assert tput.data_wait == 0.0
