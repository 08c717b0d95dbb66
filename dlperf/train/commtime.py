"""Measured communication of a DDP step, so `dlperf analyze --gpus N` can be checked on a cluster.

DDP all-reduces its gradient buckets while the backward still runs; what the step pays is the
part left after the backward has produced its last gradient (the exposed time,
``analysis/scaling.py``'s ``ddp_exposed_s``). This module measures exactly that, from inside
DDP: a communication hook that does what DDP's built-in one does (divide by the world size,
all-reduce; torch's ``default_hooks.allreduce_hook``) and marks two instants per bucket, when
the bucket is ready (the backward has written all its gradients) and when its all-reduce has
completed. Per step:

* exposed = last completion - last ready (never below 0): the wait the step pays;
* busy = the union of [ready, completed] intervals: how long the network was in use.

Across ranks (``across_ranks``, on the logged steps): the last all-reduce ends at about the same
instant on every rank, so a rank whose backward finished earlier exposes more. The least
exposed rank's figure is the communication alone (the slowest rank's: what ``dlperf analyze
--gpus`` predicts as exposed), each rank's excess over it is its wait for the slowest
(``analysis/scaling.py``'s ``straggler_s``), and the spread of the ranks' exposed times is the
spread of their steps: over the compute step, the ``--step-cv`` a user can pass back.

On a GPU the instants are CUDA events on the current stream (the completion callback runs with
that stream synchronised to NCCL's, so its event completes after the all-reduce); they are read
only where the trainer synchronises anyway (its logging steps), never adding a sync. On a CPU
(gloo) they are host clocks. With gradient accumulation DDP skips the all-reduce of the earlier
micro-batches (no_sync), so one step has one set of buckets, as the model assumes.
"""

from __future__ import annotations

import statistics
import time

import torch


class CommTimer:
    """Registered on a DDP module by ``attach``; ``take()`` after a step returns its figures."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple] = []  # (ready, done, bytes) of the current step
        self.exposed_ms: list[float] = []  # every read step, for the summary
        self.wait_ms: list[float] = []  # this rank's wait for the slowest, per read step
        self.alone_ms: list[float] = []  # the least exposed rank's exposed time
        self.spread_ms: list[float] = []  # the sample spread of the ranks' exposed times

    def _mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _elapsed_ms(self, start, end) -> float:
        return start.elapsed_time(end) if self.cuda else (end - start) * 1e3

    def hook(self, process_group, bucket):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        ready = self._mark()
        nbytes = bucket.buffer().numel() * bucket.buffer().element_size()

        def done(fut):
            self.marks.append((ready, self._mark(), nbytes))
            return fut.value()[0] if isinstance(fut.value(), list) else fut.value()

        return allreduce_hook(process_group, bucket).then(done)

    def attach(self, ddp_model) -> "CommTimer":
        ddp_model.register_comm_hook(None, self.hook)
        return self

    def take(self) -> dict | None:
        """The figures of the step just run (the device synchronised by the caller), or None
        when it all-reduced nothing; clears them for the next step."""
        marks, self.marks = self.marks, []
        if not marks:
            return None
        first = marks[0][0]
        spans = sorted((self._elapsed_ms(first, r), self._elapsed_ms(first, d))
                       for r, d, _ in marks)
        last_ready = max(s for s, _ in spans)
        exposed = max(0.0, max(e for _, e in spans) - last_ready)
        busy, end = 0.0, float("-inf")
        for start, stop in spans:  # union of the intervals
            busy += max(0.0, stop - max(start, end))
            end = max(end, stop)
        self.exposed_ms.append(exposed)
        return {"comm_exposed_ms": exposed, "comm_busy_ms": busy, "comm_buckets": len(marks),
                "comm_bytes": sum(b for _, _, b in marks)}

    def across_ranks(self, figures: dict, exposed_by_rank: list[float]) -> dict:
        """``figures`` (``take``'s) with what every rank's exposed time says (module
        docstring)."""
        alone = min(exposed_by_rank)
        spread = statistics.stdev(exposed_by_rank) if len(exposed_by_rank) > 1 else 0.0
        wait = figures["comm_exposed_ms"] - alone
        self.wait_ms.append(wait)
        self.alone_ms.append(alone)
        self.spread_ms.append(spread)
        return {**figures, "comm_exposed_min_ms": alone, "comm_wait_ms": wait,
                "rank_spread_ms": spread}

    def discard(self) -> None:
        """Forget the current step's marks (a step not read: they are not synchronised)."""
        self.marks = []

    def summary(self) -> dict:
        if not self.exposed_ms:
            return {}
        out = {"comm_exposed_ms_median": statistics.median(self.exposed_ms),
               "comm_steps_measured": len(self.exposed_ms)}
        if self.spread_ms:
            out.update(comm_exposed_min_ms_median=statistics.median(self.alone_ms),
                       comm_wait_ms_median=statistics.median(self.wait_ms),
                       rank_spread_ms_median=statistics.median(self.spread_ms))
        return out
