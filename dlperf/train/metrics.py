"""Throughput, data wait, model FLOP utilisation, and the run's logs (JSONL + CSV).

MFU = (training FLOPs per image, counted by dlperf's own analysis of the model, forward +
backward) x images/s / the device's peak for the math unit in use: the datasheet preset for a
GPU, a quick probe for a CPU (achieved FLOP/s reported as a fraction of the ceiling).
"""

from __future__ import annotations

import csv
import json
import os
import time
from pathlib import Path

import torch


# epochs.csv columns, fixed so that rows with and without an evaluation line up (blank cells)
EPOCH_COLUMNS = ("epoch", "step", "loss", "lr", "img_per_s", "data_wait", "image_size",
                 "skipped_steps", "top1", "top5")


class RunLog:
    """Rank 0 writes; other ranks get a no-op log."""

    def __init__(self, folder: Path | None):
        self.folder = folder
        self._jsonl = self._csv = None
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            self._jsonl = open(folder / "log.jsonl", "a", buffering=1)
            new = not (folder / "epochs.csv").exists()
            self._csv_file = open(folder / "epochs.csv", "a", newline="", buffering=1)
            self._csv = csv.DictWriter(self._csv_file, fieldnames=EPOCH_COLUMNS, restval="")
            if new:
                self._csv.writeheader()
        self._tb = None
        if folder is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter  # optional: tensorboard

                self._tb = SummaryWriter(str(folder / "tensorboard"))
            except Exception:  # tensorboard not installed: JSONL/CSV only
                self._tb = None

    def event(self, kind: str, **fields) -> None:
        if self._jsonl is None:
            return
        record = {"kind": kind, "time": time.time(), **fields}
        self._jsonl.write(json.dumps(record, default=float) + "\n")
        if self._tb is not None and "step" in fields:
            for key, value in fields.items():
                if isinstance(value, (int, float)) and key != "step":
                    self._tb.add_scalar(f"{kind}/{key}", value, fields["step"])

    def epoch_row(self, row: dict) -> None:
        if self._csv is None:
            return
        unknown = set(row) - set(EPOCH_COLUMNS)
        if unknown:  # a programming error, not a user one: never drop a value silently
            raise ValueError(f"epochs.csv has no column for {sorted(unknown)}")
        self._csv.writerow(row)

    def close(self) -> None:
        for f in (self._jsonl, getattr(self, "_csv_file", None)):
            if f is not None:
                f.flush()
                os.fsync(f.fileno())
                f.close()
        if self._tb is not None:
            self._tb.close()


class Throughput:
    """Images/s over the run, total and compute-only (excluding time blocked on data)."""

    def __init__(self):
        self.images = 0
        self.wall = 0.0
        self.data_wait = 0.0
        self.laps = 0  # steps in ``wall`` (the first is kept apart)
        self.first_step_s: float | None = None  # warm-up (and compilation), reported apart
        self._last = time.perf_counter()

    def add(self, images: int, wall: float, data_wait: float) -> None:
        self.images += images
        self.wall += wall
        self.data_wait += data_wait
        self.laps += 1

    def start_epoch(self) -> None:
        """Time from here (the time between epochs, evaluation and checkpoints, is not
        training throughput)."""
        self._last = time.perf_counter()

    def lap(self, images: int, data_wait: float) -> None:
        """A step ended: its wall time since the previous one, ``images`` trained in it, of
        which ``data_wait`` seconds blocked on the input. The run's first step is kept apart."""
        now = time.perf_counter()
        if self.first_step_s is None:
            self.first_step_s = now - self._last
        else:
            self.add(images, now - self._last, data_wait)
        self._last = now

    def summary(self) -> dict:
        return {"img_per_s": self.img_per_s, "compute_img_per_s": self.compute_img_per_s,
                "data_wait_share": self.data_wait_share, "first_step_s": self.first_step_s}

    @property
    def img_per_s(self) -> float:
        return self.images / self.wall if self.wall else 0.0

    @property
    def compute_img_per_s(self) -> float:
        compute = self.wall - self.data_wait
        return self.images / compute if compute > 0 else 0.0

    @property
    def data_wait_share(self) -> float:
        return self.data_wait / self.wall if self.wall else 0.0

    def add_wait(self, seconds: float) -> None:
        """Input stall read after its step's lap (``InputStall.take(drain=True)``)."""
        if self.laps:
            self.data_wait += seconds


class InputStall:
    """How long the device sat idle waiting for the next batch, step by step.

    The host's wait for a batch is the stall only when the host waits for the GPU every step.
    A step that syncs nothing (deferred non-finite check, a CUDA graph replay, a compiled
    step) returns while its kernels still run, so the host then waits for the loader while the
    GPU is busy: on the H200 run of 2026-12-04 the host waited 52% of a graphed run fed by the
    GPU JPEG path and called the rest "compute-only" at 6,425 img/s, where the same step on
    synthetic data ran 4,958 (benchmarks/results/device-h200-2026-12-04/). On CUDA the stall is
    measured on the GPU's own clock instead: an event after each step's work and one when the
    next step's work is issued (after its batch is in hand) on the same stream; the time
    between them is the GPU's idle gap (zero when the batch came before the GPU was done).
    Events are read when complete (``query``, no sync) or drained where the trainer
    synchronises anyway (an epoch's end). On a CPU, where everything runs as issued, the host's
    wait is the stall.
    """

    def __init__(self, device: torch.device, event=None):
        self.cuda = device.type == "cuda" or event is not None
        self._event = event or (lambda: torch.cuda.Event(enable_timing=True))
        self._end = None  # the event after the previous step's work
        self._gaps: list[tuple] = []  # (previous step's end, this step's start), unread

    def _mark(self):
        event = self._event()
        event.record()
        return event

    def reset(self) -> None:
        """An epoch starts: the gap across evaluation and checkpoints is not an input stall."""
        self._end = None

    def step_start(self) -> None:
        if self.cuda and self._end is not None:
            self._gaps.append((self._end, self._mark()))

    def step_end(self) -> None:
        if self.cuda:
            self._end = self._mark()

    def take(self, host_wait: float, drain: bool = False) -> float:
        """Seconds of stall to count now: on a CPU ``host_wait``; on CUDA the gaps whose events
        have completed (all of them, waiting, with ``drain``)."""
        if not self.cuda:
            return host_wait
        if drain and self._gaps:  # one stream: the last event done, every earlier one is
            self._gaps[-1][1].synchronize()
        seconds = 0.0
        while self._gaps and self._gaps[0][1].query():
            end, start = self._gaps.pop(0)
            seconds += max(0.0, end.elapsed_time(start)) / 1e3
        return seconds


def flops_per_image(model_name: str, num_classes: int, image_size: int, dtype: str,
                    channels: int = 3) -> float | None:
    """Training FLOPs (forward + backward) for one image, from dlperf's capture on meta
    tensors: the same count `dlperf analyze` reports (FLOPs do not depend on the device)."""
    try:
        from dlperf.analysis.api import AnalysisConfig, capture_costs
        from dlperf.models.registry import build_classifier

        with torch.device("meta"):
            model = build_classifier(model_name, num_classes, meta=True)
        # batch 2, halved: training-mode BatchNorm refuses one value per channel, which a
        # batch of 1 gives wherever the feature map is down to 1x1 (small images)
        cfg = AnalysisConfig(model=model_name, input_shape=(2, channels, image_size, image_size),
                             dtype=dtype, train=True, optimizer="none")
        costs = capture_costs(model, cfg)[0]
        return float(sum(c.flops for c in costs)) / 2
    except Exception:  # a model the analyzer cannot capture: no MFU, never a failed run
        return None


def device_spec(device: torch.device):
    """(DeviceSpec for the training device, where it came from): the datasheet preset of a
    CUDA GPU (None if dlperf has no preset for it), or this CPU probed (quick, once per machine
    and environment: hardware.probe.cached_cpu_probe)."""
    if device.type == "cuda":
        from dlperf.hardware.specs import match_preset

        spec = match_preset(torch.cuda.get_device_name(device))
        return (spec, f"{spec.name} datasheet") if spec else (None, "no preset for this GPU")
    from dlperf.hardware.probe import cached_cpu_probe

    return cached_cpu_probe(quick=True)


def peak_flops(device: torch.device, dtype: str, spec_and_source=None
               ) -> tuple[float | None, str]:
    """(peak FLOP/s for the dtype's math unit, where it came from); ``spec_and_source``: a
    device_spec() result to reuse instead of probing again."""
    unit = {"bf16": "bf16", "fp16": "fp16"}.get(dtype, "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32")
    spec, source = spec_and_source or device_spec(device)
    if spec is None:
        return None, source
    if device.type != "cuda":
        unit = unit if unit in spec.peak else "fp32"
    return spec.peak_flops(unit), f"{source} ({unit})"


def utilisation(achieved: float, device: torch.device, dtype: str, spec_and_source=None
                ) -> dict:
    """{"peak_flops", "peak_source", "mfu"} of a run doing ``achieved`` FLOP/s (empty without a
    ceiling). On a CPU whose cached ceiling the run outpaces (a probe made beside other work
    on a shared machine), the CPU is probed again and the larger figure kept
    (hardware.probe.cached_cpu_probe); if the run still outpaces it, "mfu" is None and
    "mfu_note" says why: a utilisation above 1 is none at all."""
    peak, source = peak_flops(device, dtype, spec_and_source)
    if peak and achieved > peak and device.type != "cuda":
        from dlperf.hardware.probe import cached_cpu_probe

        peak, source = peak_flops(device, dtype, cached_cpu_probe(quick=True, refresh=True))
    if not peak:
        return {}
    if achieved > peak:
        return {"peak_flops": peak, "peak_source": source, "mfu": None,
                "mfu_note": f"this run's {achieved / 1e9:.3g} GFLOP/s exceed the measured "
                            f"ceiling ({peak / 1e9:.3g}): no MFU against it"}
    return {"peak_flops": peak, "peak_source": source, "mfu": achieved / peak}


def finish_summary(summary: dict, cfg, info, image_size: int, out, log, mfu: bool) -> dict:
    """Write the run's summary with its environment (dlperf.provenance), then add the model
    FLOP utilisation (dlperf's FLOP count of a step at the last image size over this device's
    ceiling: a first run on a CPU probes it, so the summary is on disk before) and the advice,
    and write it again."""
    from dlperf.files import write_json_atomic
    from dlperf.provenance import environment
    from dlperf.train.advice import advice

    # the machine, versions and commit beside the figures (the device run's train summaries
    # of 2026-12-04 carried none: which GPU and torch they came from was only known from the
    # files beside them)
    summary["environment"] = environment()
    if info.is_main:
        write_json_atomic(out / "summary.json", summary)
    if mfu and summary["img_per_s"]:
        fpi = flops_per_image(cfg.model, cfg.num_classes, image_size, cfg.dtype,
                              4 if cfg.pad_stem_to_4 else 3)
        if fpi:
            summary.update(flops_per_image=fpi, **utilisation(
                fpi * summary["compute_img_per_s"] / info.world_size, info.device, cfg.dtype))
    summary["advice"] = advice(summary, cfg, info.device.type)
    if info.is_main:
        write_json_atomic(out / "summary.json", summary)
        log.event("summary", **{k: v for k, v in summary.items()
                                if not isinstance(v, (dict, list))})
    return summary


def add_step_loss(stats: dict, loss_sum, applied) -> None:
    """Add an applied step's loss to an epoch's sums (``{"loss", "n"}``): host values when
    ``applied`` is a bool, device tensors (no sync) when it is a deferred-mode device flag."""
    if isinstance(applied, bool):
        if applied:
            stats["loss"] = stats["loss"] + loss_sum
            stats["n"] += 1
    else:
        stats["loss"] = stats["loss"] + torch.where(applied, loss_sum, 0.0)
        stats["n"] = stats["n"] + applied

