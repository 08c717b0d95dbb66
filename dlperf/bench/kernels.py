"""`dlperf bench gemm` and `dlperf bench conv`: the performance guide's figures on this device,
measured, with dlperf's prediction drawn over them (issue #11).

Each sweep varies one parameter the guide names and keeps the rest fixed:

* GEMM K around a multiple of 8 (guide 2.2: Tensor Cores want K, M, N multiples of 16 bytes),
* GEMM N across tile and wave boundaries (guide 2.3 and its matrix-multiplication page: a
  partial tile or a last, partly full wave costs as much as a full one; the guide's A100
  example is M=2304, K=4096, N=1536 against 1537),
* square GEMMs at powers of two against 8 more (guide 2.3: "512 rather than 520 matters more
  than 5120 rather than 5128"),
* the ResNet stem (7x7, stride 2) with 3, 4 and 8 input channels (the record recipe pads 3 to 4
  so NHWC Tensor Core kernels apply), NCHW against NHWC,
* a 3x3 convolution at channel counts around 64, NCHW against NHWC.

Every point is measured (median of repeats, CUDA events on a GPU, a single operator call with
its inputs already on the device) and predicted by the same capture, cost rules and efficiency
model ``dlperf analyze`` uses (a forward pass of the one layer), so the picture shows where the
model is right and where it is not. Sizes are chosen per device: on a CPU the sweeps finish in a
few minutes; ``quick`` sizes (tests) in seconds.
"""

from __future__ import annotations

import math
import statistics
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from dlperf.dtypes import STORAGE, tf32_flags
from dlperf.errors import DlperfError

DTYPES = STORAGE  # --dtype of `dlperf bench gemm|conv`: tf32 included


@dataclass(frozen=True)
class KernelBenchConfig:
    kind: str  # "gemm" | "conv"
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # fp32 | tf32 | bf16 | fp16; auto: fp16 on a GPU (the guide's), fp32 on a CPU
    quick: bool = False  # tiny sizes (tests)
    repeats: int = 7  # rounds over every point; the median of a point's samples is its time
    warmup: int = 2
    min_sample_s: float = 0.02  # a timed sample repeats the call until it lasts at least this


@dataclass(frozen=True)
class Point:
    """One measured shape. gemm: (M, N, K); conv: (batch, C_in, H, W, C_out, kernel, stride)."""

    series: str
    line: str  # the curve within a series: "mm", "NCHW", "NHWC"
    x: int  # the swept value
    shape: tuple[int, ...]

    @property
    def is_conv(self) -> bool:
        return len(self.shape) == 7

    @property
    def nhwc(self) -> bool:
        return self.line == "NHWC"

    @property
    def flops(self) -> int:
        """2 FLOPs per multiply-add, the guide's convention."""
        if not self.is_conv:
            m, n, k = self.shape
            return 2 * m * n * k
        batch, c_in, h, w, c_out, r, s = self.shape
        ho, wo = _out_size(h, r, s), _out_size(w, r, s)
        return 2 * batch * ho * wo * c_out * c_in * r * r


@dataclass(frozen=True)
class Series:
    name: str
    title: str
    x_label: str
    points: tuple[Point, ...]
    # (label, (line, x) of a, (line, x) of b): "a is N x faster than b", as time_b / time_a
    contrasts: tuple[tuple[str, tuple[str, int], tuple[str, int]], ...] = ()
    metric: str = "flops"  # what the picture shows: "flops" (achieved FLOP/s) or "time"


def _out_size(size: int, kernel: int, stride: int) -> int:
    return (size + 2 * (kernel // 2) - kernel) // stride + 1


def gemm_series(gpu: bool, quick: bool = False) -> list[Series]:
    """The guide's GEMM figures at sizes for this device."""
    if quick:
        s, wm, wk, ns, sizes = 64, 64, 64, range(16, 129, 16), (64, 72, 128, 136)
    elif gpu:
        s, wm, wk, ns = 4096, 2304, 4096, range(128, 4097, 64)
        sizes = (512, 520, 1024, 1032, 2048, 2056, 4096, 4104, 5120, 5128, 8192, 8200)
    else:
        s, wm, wk, ns = 512, 384, 384, range(32, 1025, 32)
        sizes = (256, 264, 512, 520, 1024, 1032, 2048, 2056)
    ks = range(s - 8, s + 9)
    wave_a = 1536 if gpu and not quick else ns[len(ns) // 2]  # the guide's A100 example
    wave_b = wave_a + 1  # one more column of tiles
    n_values = sorted(set(ns) | {wave_b})
    pairs = [(a, b) for a, b in zip(sizes[::2], sizes[1::2])]
    return [
        Series("gemm-k", f"K around {s} (M = N = {s}): Tensor Core alignment (guide 2.2)", "K",
               tuple(Point("gemm-k", "mm", k, (s, s, k)) for k in ks),
               ((f"K={s} vs K={s + 1}", ("mm", s), ("mm", s + 1)),)),
        Series("gemm-n", f"N from {ns[0]} to {ns[-1]} (M = {wm}, K = {wk}): tile and wave "
               "quantization (guide 2.3)", "N",
               tuple(Point("gemm-n", "mm", n, (wm, n, wk)) for n in n_values),
               ((f"N={wave_a} vs N={wave_b}", ("mm", wave_a), ("mm", wave_b)),)),
        Series("gemm-size", "square GEMMs: a power of two vs 8 more (guide 2.3)", "M = N = K",
               tuple(Point("gemm-size", "mm", n, (n, n, n)) for n in sizes),
               tuple((f"{a}^3 vs {b}^3 per FLOP", ("mm", a), ("mm", b)) for a, b in pairs)),
    ]


def conv_series(gpu: bool, quick: bool = False) -> list[Series]:
    """The record recipe's convolution figures: the padded stem, channels around 64, NHWC."""
    if quick:
        stem_b, stem_px, b, px, channels = 2, 32, 2, 8, (60, 63, 64, 65)
    elif gpu:
        stem_b, stem_px, b, px, channels = 256, 224, 256, 56, tuple(range(56, 73))
    else:
        stem_b, stem_px, b, px, channels = 8, 112, 4, 56, tuple(range(56, 73, 2)) + (63, 65)
    channels = tuple(sorted(set(channels)))
    layouts = ("NCHW", "NHWC")
    stem = tuple(Point("conv-stem", line, c, (stem_b, c, stem_px, stem_px, 64, 7, 2))
                 for line in layouts for c in (3, 4, 8))
    body = tuple(Point("conv-channels", line, c, (b, c, px, px, c, 3, 1))
                 for line in layouts for c in channels)
    return [
        Series("conv-stem", f"7x7/2 stem, 64 filters, batch {stem_b} at {stem_px} px: input "
               "channels padded 3 -> 4 -> 8 (record recipe)", "input channels", stem,
               (("NHWC: 4 channels vs 3", ("NHWC", 4), ("NHWC", 3)),
                ("NHWC: 8 channels vs 3", ("NHWC", 8), ("NHWC", 3)),
                ("3 channels: NHWC vs NCHW", ("NHWC", 3), ("NCHW", 3))), metric="time"),
        Series("conv-channels", f"3x3 convolution C -> C, batch {b} at {px} px: channel counts "
               "around 64, NCHW vs NHWC (guide 2.2)", "channels C", body,
               (("NHWC: C=64 vs 63", ("NHWC", 64), ("NHWC", 63)),
                ("NHWC: C=64 vs 65", ("NHWC", 64), ("NHWC", 65)),
                ("C=64: NHWC vs NCHW", ("NHWC", 64), ("NCHW", 64)))),
    ]


def series_for(cfg: KernelBenchConfig, gpu: bool) -> list[Series]:
    if cfg.kind == "gemm":
        return gemm_series(gpu, cfg.quick)
    if cfg.kind == "conv":
        return conv_series(gpu, cfg.quick)
    raise DlperfError(f"dlperf bench {cfg.kind}: choose gemm or conv")


def resolve_dtype(cfg: KernelBenchConfig, gpu: bool) -> str:
    dtype = cfg.dtype if cfg.dtype != "auto" else ("fp16" if gpu else "fp32")
    if dtype not in DTYPES:
        raise DlperfError(f"--dtype {dtype!r}: choose fp32, tf32, bf16 or fp16")
    if dtype == "tf32" and not gpu:
        raise DlperfError("--dtype tf32 needs a CUDA GPU (TF32 is a Tensor Core mode); use fp32 "
                          "on a CPU")
    return dtype


class _MatMul(nn.Module):
    """x @ W: one GEMM with M = rows of x, K = in, N = out (no transpose, no bias)."""

    def __init__(self, k: int, n: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(k, n, device="meta"))

    def forward(self, x):
        return x @ self.weight


def _layer(point: Point) -> tuple[nn.Module, tuple[int, ...]]:
    if point.is_conv:
        batch, c_in, h, w, c_out, r, s = point.shape
        return (nn.Conv2d(c_in, c_out, r, s, r // 2, bias=False, device="meta"),
                (batch, c_in, h, w))
    m, n, k = point.shape
    return _MatMul(k, n), (m, k)


def predict_point(point: Point, spec, dtype: str) -> dict:
    """dlperf's prediction for one point: the forward pass of the one layer, captured and
    costed as `dlperf analyze` does, on ``spec`` (its efficiency model included)."""
    from dlperf.analysis.api import AnalysisConfig, capture_costs
    from dlperf.analysis.roofline import predict

    module, shape = _layer(point)
    half = dtype in ("fp16", "bf16")
    cfg = AnalysisConfig(model=point.series, input_shape=shape,
                         dtype=dtype if half else "fp32", precision="half" if half else "mixed",
                         tf32=dtype == "tf32", train=False, channels_last=point.nhwc,
                         device=spec.name, optimizer="none")
    costs = capture_costs(module, cfg)[0]
    preds = [predict(c, spec, tf32=cfg.tf32) for c in costs]
    main = max(preds, key=lambda p: p.cost.flops)
    q = main.quantization
    return {"predicted_s": sum(p.time_s for p in preds), "captured_flops": sum(
                c.flops for c in costs), "math_unit": main.unit,
            "math_class": main.math_class, "limited_by": main.limited_by,
            "aligned": main.aligned, "tile": None if q is None else list(q.tile),
            "waves": None if q is None else q.waves,
            "quantization_efficiency": main.quantization_efficiency,
            "transpose_s": sum(p.transpose_time_s for p in preds)}


def _backend_flags(dtype: str, device: torch.device):
    """TF32 on for --dtype tf32 only; cuDNN autotuning on (the record recipe's tuned kernels);
    the caller's settings restored afterwards."""
    if device.type != "cuda":
        return nullcontext()
    return tf32_flags(dtype == "tf32", cudnn_benchmark=True)


def _operator(point: Point, dtype: str, device: torch.device):
    """The real operator call for ``point``, inputs made once on ``device``."""
    dt = DTYPES[dtype]
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape, fmt=torch.contiguous_format):
        return torch.randn(*shape, generator=gen, device=device).to(dtype=dt, memory_format=fmt)

    if not point.is_conv:
        m, n, k = point.shape
        a, b = randn(m, k), randn(k, n)
        return lambda: torch.mm(a, b)
    batch, c_in, h, w, c_out, r, s = point.shape
    fmt = torch.channels_last if point.nhwc else torch.contiguous_format
    x, weight = randn(batch, c_in, h, w, fmt=fmt), randn(c_out, c_in, r, r, fmt=fmt)
    return lambda: torch.nn.functional.conv2d(x, weight, None, s, r // 2)


def calibrate(fn, device: torch.device, warmup: int, min_sample_s: float) -> int:
    """How many calls one timed sample makes: enough to last ``min_sample_s`` (a single call of
    a small kernel is below the timer's resolution), after ``warmup`` calls."""
    from dlperf.hardware.probe import _timer

    with torch.no_grad():
        first = _timer(device)(fn, 1, warmup)[0]
    return max(1, min(1000, math.ceil(min_sample_s / max(first, 1e-9))))


def sample(fn, device: torch.device, calls: int) -> float:
    """Seconds per call over ``calls`` back-to-back calls (CUDA events on a GPU)."""
    from dlperf.hardware.probe import _timer

    def many():
        for _ in range(calls):
            fn()

    with torch.no_grad():
        return _timer(device)(many, 1, 0)[0] / calls


def contrasts(series: Series, rows: list[dict]) -> list[dict]:
    """Each contrast's speed-up of a over b (time_b / time_a; per FLOP for different sizes),
    measured and predicted."""
    by_key = {(r["line"], r["x"]): r for r in rows if r["series"] == series.name}
    out = []
    for label, a, b in series.contrasts:
        ra, rb = by_key.get(a), by_key.get(b)
        if ra is None or rb is None:
            continue
        per_flop = series.name == "gemm-size"
        scale = ra["flops"] / rb["flops"] if per_flop else 1.0
        out.append({"series": series.name, "contrast": label,
                    "measured_speedup": rb["measured_s"] * scale / ra["measured_s"],
                    "predicted_speedup": rb["predicted_s"] * scale / ra["predicted_s"]})
    return out


def run(cfg: KernelBenchConfig, spec, progress=None) -> dict:
    """Measure and predict every point of the ``cfg.kind`` sweeps; ``spec`` is what the
    predictions use (the device's preset, or a `dlperf probe` spec)."""
    from dlperf.hardware.probe import resolve_device

    device = resolve_device(cfg.device)
    gpu = device.type == "cuda"
    dtype = resolve_dtype(cfg, gpu)
    all_series = series_for(cfg, gpu)
    unit = "tf32" if dtype == "tf32" else dtype
    if spec.peak_flops(unit) is None and unit not in ("fp32", "tf32"):
        raise DlperfError(f"{spec.name} has no {unit} peak to predict with: use --dtype fp32 or "
                          "a spec that has it")
    points = [p for series in all_series for p in series.points]
    samples: list[list[float]] = [[] for _ in points]
    with _backend_flags(dtype, device):
        ops = [_operator(p, dtype, device) for p in points]
        # a cold start (thread pool, clocks, allocator) would land on the first point only
        calibrate(ops[0], device, 1, 0.3)
        calls = [calibrate(fn, device, cfg.warmup, cfg.min_sample_s) for fn in ops]
        # rounds over every point, so a slow spell of a shared machine hits all points alike
        for _ in range(cfg.repeats):
            for i, fn in enumerate(ops):
                samples[i].append(sample(fn, device, calls[i]))
                if progress:
                    progress()
    del ops
    rows = []
    for point, times in zip(points, samples):
        measured = statistics.median(times)
        pred = predict_point(point, spec, dtype)
        rows.append({"series": point.series, "line": point.line, "x": point.x,
                     "shape": list(point.shape), "flops": point.flops,
                     "measured_s": measured, "times_s": times,
                     "measured_flops_per_s": point.flops / measured,
                     "predicted_flops_per_s": point.flops / pred["predicted_s"],
                     "predicted_over_measured": pred["predicted_s"] / measured, **pred})
    summary = []
    for series in all_series:
        errs = [abs(r["predicted_over_measured"] - 1) for r in rows if r["series"] == series.name]
        summary.append({"series": series.name, "title": series.title, "points": len(errs),
                        "median_abs_error": statistics.median(errs),
                        "max_abs_error": max(errs)})
    errs = [abs(r["predicted_over_measured"] - 1) for r in rows]
    name = device_name(device)
    return {"kind": cfg.kind, "device": name, "dtype": dtype, "spec": spec.name,
            "spec_source": spec.source, "series": summary,
            "contrasts": [c for s in all_series for c in contrasts(s, rows)],
            "median_abs_error": statistics.median(errs), "points": rows,
            "config": {"kind": cfg.kind, "device": str(device), "dtype": dtype,
                       "quick": cfg.quick, "repeats": cfg.repeats, "warmup": cfg.warmup,
                       "min_sample_s": cfg.min_sample_s, "spec": spec.to_dict()},
            "x_labels": {s.name: s.x_label for s in all_series},
            "metrics": {s.name: s.metric for s in all_series}}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from dlperf.hardware.probe import cpu_name

    return f"CPU {cpu_name()}, {torch.get_num_threads()} threads"


def point_count(cfg: KernelBenchConfig, gpu: bool) -> int:
    """Timed samples a run takes (every point once per round): the progress bar's total."""
    return cfg.repeats * sum(len(s.points) for s in series_for(cfg, gpu))


def plot(result: dict, path) -> object:
    """One panel per sweep: measured (solid, markers) and predicted (dashed), per line."""
    from dlperf.plots import pyplot, save_figure

    plt = pyplot()
    if plt is None:
        return None
    names = [s["series"] for s in result["series"]]
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 3.0 * len(names)), dpi=110,
                             squeeze=False)
    colours = {"mm": "#1f77b4", "NCHW": "#d62728", "NHWC": "#1f77b4"}
    for ax, s in zip(axes[:, 0], result["series"]):
        rows = [r for r in result["points"] if r["series"] == s["series"]]
        time_metric = result["metrics"][s["series"]] == "time"
        for line in sorted({r["line"] for r in rows}):
            pts = sorted((r for r in rows if r["line"] == line), key=lambda r: r["x"])
            xs = [r["x"] for r in pts]
            if time_metric:
                meas = [r["measured_s"] * 1e3 for r in pts]
                pred = [r["predicted_s"] * 1e3 for r in pts]
            else:
                meas = [r["measured_flops_per_s"] / 1e12 for r in pts]
                pred = [r["predicted_flops_per_s"] / 1e12 for r in pts]
            colour = colours.get(line, None)
            ax.plot(xs, meas, marker="o", ms=3, color=colour, label=f"{line} measured")
            ax.plot(xs, pred, linestyle="--", color=colour, alpha=0.8,
                    label=f"{line} predicted")
        ax.set_title(f"{s['title']} — median |pred/meas - 1| {s['median_abs_error']:.0%}",
                     fontsize=8)
        ax.set_xlabel(result["x_labels"][s["series"]], fontsize=8)
        ax.set_ylabel("ms per call" if time_metric else "TFLOP/s", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.suptitle(f"dlperf bench {result['kind']}: {result['device']}, {result['dtype']} "
                 f"(prediction: {result['spec']})", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    from pathlib import Path

    return Path(path)
