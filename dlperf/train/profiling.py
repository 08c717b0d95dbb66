"""`profile_steps=N`: N training steps under torch.profiler, after the warm-up, written to
``out_dir/profile/``: a Chrome/Perfetto trace (``trace.json``), the top operators by self time
(``top-ops.txt``, and ``top-ops.json`` for tools), so a measured step sits beside what
``dlperf analyze`` predicts for it. Rank 0 only. Profiling slows the steps it records and they
still count in the run's img/s: leave profile_steps at 0 for throughput runs.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from dlperf.files import write_json_atomic, write_text_atomic

# Steps skipped before recording (the first step compiles / autotunes), then profiler warm-up.
WAIT, WARMUP = 1, 1


class StepProfiler:
    def __init__(self, steps: int, out: Path, device: torch.device, log):
        self.steps, self.out, self.log = steps, out / "profile", log
        self.cuda = device.type == "cuda"
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._prof = torch.profiler.profile(
            activities=activities, record_shapes=True,
            schedule=torch.profiler.schedule(wait=WAIT, warmup=WARMUP, active=steps, repeat=1),
            on_trace_ready=self._write)
        self._left = WAIT + WARMUP + steps
        self._written = False
        self._prof.start()

    def step(self) -> None:
        """Call after every training step; stops the profiler once its window has passed."""
        if self._left <= 0:
            return
        self._left -= 1  # before step(): it may write the trace, which counts the steps
        self._prof.step()
        if self._left == 0:
            self.stop()

    def stop(self) -> None:
        if self._prof is not None:
            self._prof.stop()
            self._prof = None
            if not self._written:
                self.log.event("warning", message=f"profile_steps={self.steps}: the run ended "
                               f"before the profiling window ({WAIT + WARMUP} + {self.steps} "
                               "steps) began; nothing written")

    def _recorded(self) -> int:
        return max(0, WAIT + WARMUP + self.steps - self._left - WAIT - WARMUP)

    def _write(self, prof) -> None:
        self._written = True
        self.out.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".trace.", suffix=".json", dir=self.out)
        os.close(fd)
        try:  # the profiler writes by path: a temporary name, then the atomic rename
            prof.export_chrome_trace(tmp)
            os.replace(tmp, self.out / "trace.json")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        key = "self_device_time_total" if self.cuda else "self_cpu_time_total"
        averages = prof.key_averages()
        write_text_atomic(self.out / "top-ops.txt",
                          averages.table(sort_by=key, row_limit=30) + "\n")
        rows = sorted(averages, key=lambda e: getattr(e, key, 0.0), reverse=True)[:30]
        write_json_atomic(self.out / "top-ops.json", {
            "steps": self._recorded(), "sorted_by": key,
            "ops": [{"name": e.key, "calls": e.count,
                     "self_cpu_us": e.self_cpu_time_total,
                     "self_device_us": getattr(e, "self_device_time_total", 0.0),
                     "cpu_total_us": e.cpu_time_total} for e in rows]})
        self.log.event("profile", steps=self._recorded(), trace=str(self.out / "trace.json"),
                       top_ops=str(self.out / "top-ops.txt"))


def profiler_for(cfg, out: Path, info, log) -> "StepProfiler | None":
    """The profiler a run with ``cfg.profile_steps`` uses (rank 0 only), or None."""
    if not cfg.profile_steps or not info.is_main:
        return None
    return StepProfiler(cfg.profile_steps, out, info.device, log)

