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

    def add(self, images: int, wall: float, data_wait: float) -> None:
        self.images += images
        self.wall += wall
        self.data_wait += data_wait

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


def flops_per_image(model_name: str, num_classes: int, image_size: int, dtype: str,
                    channels: int = 3) -> float | None:
    """Training FLOPs (forward + backward) for one image, from dlperf analyze on meta tensors."""
    try:
        from dlperf.analysis.api import AnalysisConfig, analyze_model
        from dlperf.hardware.specs import PRESETS
        from dlperf.train.loop import build_model

        with torch.device("meta"):
            model = build_model(model_name, num_classes, meta=True)
        # batch 2, halved: training-mode BatchNorm refuses one value per channel, which a
        # batch of 1 gives wherever the feature map is down to 1x1 (small images)
        cfg = AnalysisConfig(model=model_name, input_shape=(2, channels, image_size, image_size),
                             dtype=dtype, train=True, device="h100-sxm", optimizer="none")
        return float(analyze_model(model, cfg, PRESETS["h100-sxm"]).totals()["flops"]) / 2
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
