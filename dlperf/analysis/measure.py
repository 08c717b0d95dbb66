"""Measure the analysed kernels on the real device and put the numbers beside the prediction.

The same capture that drives the analysis runs on real tensors with a timer around every aten
kernel, so each measured time lands on exactly the Cost it belongs to (module, op, phase): no
name matching against a profiler trace. Each step runs with gradients reset to None, so every
step launches the same kernel sequence; the first ``warmup`` steps are dropped and the median of
the rest is kept per kernel (warm-up excluded, medians: timing noise stays out).

The optimizer step is not part of the measured step (the analysis can count it: --optimizer).

On CPU the timer is wall time around the kernel (CPU kernels are synchronous). On a GPU it is
the GPU's own time between two CUDA events around the kernel, the GPU kept busy (a sleep kernel)
while the host dispatches the op, so the host's dispatch, launch and synchronisation are not in
it; the step is serialised (a sync before each kernel) so no two kernels overlap. Until
2026-12-04 it was the host's clock between two synchronisations: on the lent H200 that put
25-50 µs under every kernel (113 weight casts predicted at 0.31 ms measured 6.4 ms; weighted
median errors 0.35-0.81; benchmarks/results/device-h200-2026-12-04/).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import torch

from dlperf.analysis.api import DTYPES, HALF_MODEL, Analysis, AnalysisConfig
from dlperf.analysis.capture import capture
from dlperf.analysis.costs import all_costs
from dlperf.analysis.roofline import predict
from dlperf.dtypes import tf32_flags
from dlperf.errors import DlperfError
from dlperf.hardware.specs import DeviceSpec


@dataclass(frozen=True)
class MeasureConfig:
    steps: int = 3
    warmup: int = 1
    seed: int = 0


# GPU cycles the sleep kernel holds the GPU before a timed kernel: ~0.5 ms at 2 GHz, longer
# than the capture's dispatch of one op from Python (tens of µs), so the start event completes
# when the op's first kernel can start, not when the host issued the event.
DISPATCH_COVER_CYCLES = 1_000_000


def kernel_timer(device: torch.device, cuda=torch.cuda):
    """``timer(func, args, kwargs) -> (out, seconds)`` for the capture (``cuda``: the module
    whose synchronize, _sleep and Event it uses; tests pass a stand-in)."""
    if device.type == "cuda":
        def timer(func, args, kwargs):
            cuda.synchronize(device)
            start = cuda.Event(enable_timing=True)
            end = cuda.Event(enable_timing=True)
            cuda._sleep(DISPATCH_COVER_CYCLES)
            start.record()
            out = func(*args, **kwargs)
            end.record()
            end.synchronize()
            return out, start.elapsed_time(end) / 1e3
    else:
        def timer(func, args, kwargs):
            t0 = time.perf_counter()
            out = func(*args, **kwargs)
            return out, time.perf_counter() - t0
    return timer


def _inputs(config: AnalysisConfig, input_dtype: torch.dtype, device, generator):
    shape = config.input_shape
    if input_dtype.is_floating_point:
        x = torch.randn(shape, generator=generator).to(device=device, dtype=input_dtype)
        if config.channels_last and len(shape) == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return (x,)
    return (torch.zeros(shape, dtype=input_dtype, device=device),)  # token 0 exists in any vocab


@dataclass
class Measurement:
    analysis: Analysis  # predictions for the kernels that were measured
    measured_s: list[float]  # per prediction, same order
    free_ops_s: float  # time in ops with no kernel cost (views, detach): dispatch overhead
    steps: int
    device: str
    per_record: list[float] = field(default_factory=list)  # median seconds per captured kernel

    def with_spec(self, spec: DeviceSpec) -> "Measurement":
        """The same measured kernels predicted for another ``spec`` (another calibration of the
        same machine, say): the measured times are the same, shared out again by the new
        predictions. Two models compared this way see one measurement, not two noisy ones."""
        predictions = [predict(p.cost, spec, tf32=self.analysis.config.tf32)
                       for p in self.analysis.predictions]
        analysis = Analysis(device=spec, config=self.analysis.config, predictions=predictions,
                            uncounted=self.analysis.uncounted)
        return Measurement(analysis=analysis, measured_s=_attribute(predictions, self.per_record),
                           free_ops_s=self.free_ops_s, steps=self.steps, device=self.device,
                           per_record=self.per_record)

    def totals(self) -> dict:
        predicted = sum(p.time_s for p in self.analysis.predictions)
        measured = sum(self.measured_s)
        pairs = [(p.time_s, m) for p, m in zip(self.analysis.predictions, self.measured_s)
                 if p.time_s > 0 and m > 0]
        # Time-weighted median of |log(predicted / measured)|: how far off a typical second is.
        errors = sorted((abs(math.log(p / m)), m) for p, m in pairs)
        half, acc, median_log = sum(m for _, m in errors) / 2, 0.0, 0.0
        for err, weight in errors:
            acc += weight
            if acc >= half:
                median_log = err
                break
        by_kind: dict[str, dict] = {}
        by_class: dict[str, dict] = {}
        for p, m in zip(self.analysis.predictions, self.measured_s):
            k = by_kind.setdefault(p.cost.kind, {"predicted_s": 0.0, "measured_s": 0.0})
            k["predicted_s"] += p.time_s
            k["measured_s"] += m
            c = by_class.setdefault(kernel_class(p), {"predicted_s": 0.0, "measured_s": 0.0,
                                                      "kernels": 0, "bytes": 0})
            c["predicted_s"] += p.time_s
            c["measured_s"] += m
            c["kernels"] += 1
            c["bytes"] += p.cost.bytes
        for name, c in by_class.items():
            # memory-bound classes: the bandwidth achieved against the model's (the guide's
            # minimum bytes over each time), what `--efficiency memory=...` calibrates
            bandwidth = name.startswith("memory:") and c["measured_s"] > 0 and c["predicted_s"] > 0
            c["achieved_bytes_per_s"] = c["bytes"] / c["measured_s"] if bandwidth else None
            c["model_bytes_per_s"] = c["bytes"] / c["predicted_s"] if bandwidth else None
        return {"predicted_s": predicted, "measured_s": measured,
                "measured_over_predicted": measured / predicted if predicted else math.inf,
                "free_ops_s": self.free_ops_s,
                "weighted_median_abs_error": math.exp(median_log) - 1,
                "by_kind": by_kind, "by_class": by_class, "steps": self.steps,
                "device": self.device,
                "measured_samples_per_s": (self.analysis.batch_size / (measured + self.free_ops_s)
                                           if measured else math.inf)}

    def to_dict(self) -> dict:
        layers = [{"module": p.cost.module, "op": p.cost.op, "phase": p.cost.phase,
                   "kind": p.cost.kind, "class": kernel_class(p), "bytes": p.cost.bytes,
                   "predicted_time_s": p.time_s, "measured_time_s": m}
                  for p, m in zip(self.analysis.predictions, self.measured_s)]
        return {"totals": self.totals(), "layers": layers}


def measure(model: torch.nn.Module, config: AnalysisConfig, spec: DeviceSpec,
            device: str | torch.device = "cpu", input_dtype: torch.dtype = torch.float32,
            cfg: MeasureConfig = MeasureConfig(), progress=None) -> Measurement:
    """Run ``model`` for real (moved to ``device``) and time every kernel of the analysed step.

    The model is moved and, with ``config.channels_last``, converted in place: pass a model you
    built for this (the CLI builds its own).
    """
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DlperfError("--measure: no CUDA GPU is visible here; use --device cpu")
    gen = torch.Generator().manual_seed(cfg.seed)
    if any(t.is_meta for t in model.parameters()):
        raise DlperfError("--measure needs a model with real weights, not one on the meta device")
    model = model.to(device)
    half = DTYPES[config.dtype] if config.precision in HALF_MODEL else None
    if half is not None:  # --precision half or fsdp: the model computes in half, no autocast
        model = model.to(half)
        input_dtype = half if input_dtype.is_floating_point else input_dtype
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    inputs = _inputs(config, input_dtype, device, gen)
    timer = kernel_timer(device)
    with tf32_flags(config.tf32):  # run what is predicted: strict FP32 unless --tf32
        runs = _timed_steps(model, inputs, config, half, timer, cfg, progress)
    first = runs[0]
    ops = [r.op for r in first.records]
    if any([r.op for r in c.records] != ops for c in runs[1:]):
        raise DlperfError("--measure: the model ran different kernels in different steps "
                          "(data-dependent control flow?); cannot attribute times")
    per_record = [statistics.median(c.records[i].measured_s for c in runs)
                  for i in range(len(ops))]
    costs, uncounted = all_costs(first.records, first.regions)
    predictions = [predict(c, spec, tf32=config.tf32) for c in costs]
    costed = {i for p in predictions for i in p.cost.records}
    free = sum(t for i, t in enumerate(per_record) if i not in costed)
    analysis = Analysis(device=spec, config=config, predictions=predictions, uncounted=uncounted)
    return Measurement(analysis=analysis, measured_s=_attribute(predictions, per_record),
                       free_ops_s=free, steps=cfg.steps, device=str(device),
                       per_record=per_record)


def kernel_class(p) -> str:
    """A prediction's class for the per-class comparison: "math:<class>" for GEMM-shaped
    kernels (tensor-conv, tensor-gemm, attention, cuda-core-conv, ...), "memory:<class>" for
    the memory-bound ones (stream, channel-norm, norm, window, ...: hardware/efficiency.py),
    else the kernel's kind (fill, copy, ...). A model right in total can be wrong by class,
    each error hiding another (benchmarks/README.md, "The second lent GPU")."""
    if p.cost.kind in ("gemm", "fused"):
        return f"math:{p.math_class}"
    if p.cost.kind in ("memory", "copy", "transpose"):
        return f"memory:{p.memory_class}"
    return p.cost.kind


def _timed_steps(model, inputs, config: AnalysisConfig, half, timer, cfg: MeasureConfig,
                 progress) -> list:
    """Capture ``cfg.warmup + cfg.steps`` timed steps; the captures after the warm-up."""
    runs = []
    for step in range(cfg.warmup + cfg.steps):
        model.zero_grad(set_to_none=True)  # same kernels every step (no grad accumulation)
        try:
            cap = capture(model, inputs, train=config.train, timer=timer,
                          autocast_dtype=None if half is not None else DTYPES[config.dtype],
                          loss=config.loss)
        except torch.OutOfMemoryError:
            raise DlperfError(f"--measure: out of memory at batch {config.input_shape[0]}; "
                              "try a smaller --batch-size") from None
        if step >= cfg.warmup:
            runs.append(cap)
        if progress:
            progress()
    return runs


def _attribute(predictions, per_record: list[float]) -> list[float]:
    """Measured seconds per prediction. A record costed as several kernels
    (convolution_backward: dgrad + wgrad) shares its measured time among them in proportion to
    their predicted times."""
    share: dict[int, float] = {}
    for p in predictions:
        for i in p.cost.records:
            share[i] = share.get(i, 0.0) + p.time_s
    measured = []
    for p in predictions:
        total = 0.0
        for i in p.cost.records:
            total += per_record[i] * (p.time_s / share[i] if share[i] else 1 / len(p.cost.records))
        measured.append(total)
    return measured
