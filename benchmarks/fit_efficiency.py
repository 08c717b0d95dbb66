"""Fit the efficiency model (dlperf/hardware/efficiency.py) to published measurements (issue #11).

Every clean row of benchmarks/validation/published_training.csv is captured once; each kernel's
predicted time is split into the parts each parameter scales (math time by its class, memory
time by its class and the device's achieved bandwidth, NCHW transposes, kernel launches), so
that one evaluation of a parameter set is a few numpy operations over all rows. The fit
minimises the mean squared log error (pred/meas) of the step time over the clean rows with a
bounded Nelder-Mead search; no parameter is per row. A preset that carries its own GEMM or
CUDA-core share (the Hopper parts: hardware/efficiency.py, HOPPER_TENSOR_GEMM, fitted to decoder
runs by fit_attention.py; the V100s) keeps it: its rows' cuBLAS GEMMs are divided by that
share, not the fitted one, as ``dlperf analyze`` predicts them. ``--own-share PRESET,...``
fits one family's two shares (own_tensor_gemm, own_cuda_core) with the rest instead: how the
V100 presets' were fitted (results/efficiency-fit-volta.json).

Held-out errors, the honest number: for each source in the table, the parameters are refitted
without that source's rows, and those rows are predicted with them (leave one source out).

Usage: python benchmarks/fit_efficiency.py [CSV] [OUT.json]
       python benchmarks/fit_efficiency.py CSV OUT.json [--channel-norm] [--fix NAME=VALUE ...]
           [--tf32-nchw SHARE] [--own-share PRESET,...] [--fit-host] [--drop-source NAME]
           [--set COLUMN=VALUE] [--weight row|source|device]
           [--efficiency DEVICE:NAME=VALUE ...]   (experiments;
       --channel-norm: batch and group norm's kernels at a fitted fraction of the streaming
       rate of their own; --fix and --tf32-nchw: ``experiment_flags``; --own-share: above;
       --fit-host: the CPU's time per kernel fitted too, HOST_BOUNDS; --drop-source and --set:
       ``row_flags``; --weight: ``row_weights``; --efficiency: ``device_edits``)
Writes benchmarks/results/efficiency-fit.json (parameters, in-sample and held-out errors per
row, class and source) and prints the parameters to put in dlperf/hardware/efficiency.py.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

from dlperf.analysis.calibrate import nelder_mead, squash
from dlperf.hardware.efficiency import combine_bandwidth

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks/results/efficiency-fit.json"

# The fitted parameters, their bounds, and the classes they divide (the others stay at the
# identity model's values: misaligned GEMMs keep the guide-derived 0.5).
BOUNDS = {"tensor_gemm": (0.3, 1.0), "tensor_conv": (0.3, 1.0), "grouped_conv": (0.05, 1.0),
          "cuda_core": (0.3, 1.0), "memory": (0.5, 1.0), "sm_bytes_per_clock": (2.0, 64.0),
          "depthwise": (0.05, 1.0), "launch_s": (0.5e-6, 20e-6),
          # F(4x4, 3x3) Winograd needs a quarter of the multiplies (Lavin and Gray)
          "winograd": (0.25, 1.0)}
NAMES = tuple(BOUNDS)
# ``--own-share PRESET,...``: those presets' cuBLAS GEMMs and CUDA-core math at shares of their
# own, fitted with the rest (the V100's, 2026-12-05: hardware/efficiency.py, VOLTA_TENSOR_GEMM)
OWN = {"own_tensor_gemm": BOUNDS["tensor_gemm"], "own_cuda_core": BOUNDS["cuda_core"]}
# a preset's own shares that the fit honours (Efficiency fields), and the math classes they set
OWN_FIELDS = ("tensor_gemm", "cuda_core", "cuda_core_conv")
OWN_CLASSES = ("tensor-gemm", "cuda-core", "cuda-core-conv")
# ``--fit-host`` (an experiment): the CPU's time to issue one kernel (Efficiency.host_s, else
# fixed at its estimate) fitted with the rest. Only rows whose step the CPU bounds see it: the
# BERT SQuAD FP32 rows, whose BertAdam issues ~20 kernels a tensor after a .item() (costs.py,
# bertadam_cost), and the for-loop rows behind GradScaler's wait.
HOST_BOUNDS = (1e-6, 20e-6)
# ``--channel-norm`` (an experiment; the shipped model has no such GPU parameter): batch and
# group norm's kernels at their own fraction of the streaming rate, fitted with the rest
CHANNEL_NORM_BOUNDS = (0.1, 1.0)
MATH_CLASSES = ("tensor-gemm", "tensor-conv", "grouped-conv", "cuda-core")
HALF = ("fp16", "bf16")
# ``--kernel-classes`` (an experiment): the memory classes a lent GPU timed per kernel
# (benchmarks/gpu_kernel_classes.py) whose share of the streaming rate is taken from it, by
# precision (16-bit: the fp16 runs where the result has them, the precision of the table's
# mixed-precision rows, else the bf16 ones; 32-bit: the strict FP32 ones) and layout (the row's)
MEASURED_CLASSES = ("channel-norm", "channel-norm-backward", "window", "window-backward")
KERNEL_CLASS_RUNS = {(True, False): ("fp16-nchw", "bf16-nchw"),
                     (True, True): ("fp16-cl", "bf16-cl"),
                     (False, False): ("fp32-nchw",), (False, True): ("fp32-cl",)}


def measured_shares(result: dict) -> dict:
    """{(memory class, 16-bit, channels_last): share of the streaming rate} from a saved
    ``gpu_kernel_classes.py`` result: each class's real traffic (the guide's minimum bytes x
    ``traffic_factor``: batch norm reads its input twice) over its measured time, divided by
    the rate the same run's streaming kernels achieved. On the lent H200 the elementwise kernels
    streamed 4.1 TB/s in every run while batch norm moved 0.7-3.9 TB/s of real traffic,
    depending on precision and layout (results/h200-kernel-classes.json)."""
    from dlperf.hardware.efficiency import TRAFFIC_FACTOR

    factor = {"channel-norm": TRAFFIC_FACTOR["native_batch_norm"],
              "channel-norm-backward": TRAFFIC_FACTOR["native_batch_norm_backward"]}
    shares = {}
    measured = result["results"]["memory_classes"]
    for (half, nhwc), runs in KERNEL_CLASS_RUNS.items():
        classes = measured[next(run for run in runs if run in measured)]
        stream = classes["stream"]["achieved_bytes_per_s"]
        for cls in MEASURED_CLASSES:
            achieved = classes[cls]["achieved_bytes_per_s"] * factor.get(cls, 1.0)
            shares[(cls, half, nhwc)] = achieved / stream
    return shares


def identity():
    """Every fraction 1, no SM term, 1 s per kernel, no host: predictions then hold the
    raw terms (launch_time_s is the kernel count); misaligned GEMMs keep the shipped rate."""
    from dlperf.analysis.calibrate import identity as raw
    from dlperf.hardware.efficiency import FITTED

    return raw(FITTED)


class Terms:
    """Per-kernel raw terms of every row, flattened, with the row each kernel belongs to."""

    def __init__(self, captured, host_s: float, tf32_nchw: float | None = None,
                 shares: dict | None = None, group: tuple[str, ...] = (),
                 edits: dict | None = None):
        from dataclasses import replace

        from dlperf.analysis.api import predict_on
        from dlperf.analysis.roofline import winograd_runs
        from dlperf.hardware.efficiency import sm_cycles_per_s
        from dlperf.provenance import load_sibling

        edited_spec = load_sibling(__file__, "validate_published").edited_spec
        unit = identity()
        if tf32_nchw is not None:  # --tf32-nchw: TF32 NCHW convolutions' layout cost
            unit = replace(unit, tf32_nchw=tf32_nchw)
        self.host_s = host_s  # fixed at its estimate, unless --fit-host (HOST_BOUNDS)
        self.fit_host = False
        math_s, math_cls, mem_s, dw, trans_s, kernels, row_of = [], [], [], [], [], [], []
        channel_norm, class_share = [], []
        wino, syncs, own_share, in_group, own_wino = [], [], [], [], []
        self.rows, self.batch, self.bw, self.sm_rate = [], [], [], []
        for i, (row, cfg, costs, uncounted, seconds) in enumerate(captured):
            spec = edited_spec(row["device"], edits)  # --efficiency: device_edits
            unset = (edits or {}).get("fitted_on", {}).get(spec.name, ())
            if unset:  # --efficiency DEVICE:NAME=fitted: the shared parameter, not its own
                spec = replace(spec, efficiency={k: v for k, v in spec.efficiency.items()
                                                 if k not in unset})
            # the preset's own GEMM and CUDA-core shares, where it has them (NaN: the fitted
            # ones), unless the preset is in ``group`` (--own-share: fitted here, its own)
            own = {} if row["device"] in group else (spec.efficiency or {})
            # Efficiency.math's classes and fallbacks over the preset's own shares alone (NaN
            # where it has none: the fitted one)
            preset = replace(unit, **{"tensor_gemm": math.nan, "cuda_core": math.nan,
                                      "cuda_core_conv": None,
                                      **{f: own[f] for f in OWN_FIELDS
                                         if own.get(f) is not None}})
            analysis = predict_on(costs, uncounted, cfg, spec, seconds, efficiency=unit)
            for p in analysis.predictions:
                math_s.append(p.math_time_s)
                # the table cannot tell FP32 convolutions from FP32 GEMMs: one fraction
                cls = "cuda-core" if p.math_class == "cuda-core-conv" else p.math_class
                own_share.append(preset.math(p.math_class) if p.math_class in OWN_CLASSES
                                 else math.nan)
                in_group.append(row["device"] in group)
                # fused attention has its own fraction, fitted to the decoder rows of the
                # scale-out table (fit_attention.py); this table's models have none
                cls = "tensor-gemm" if cls == "attention" else cls
                math_cls.append(MATH_CLASSES.index(cls) if cls in MATH_CLASSES else -1)
                wino.append(winograd_runs(p.cost, p.math_class))
                own_wino.append(own.get("winograd", math.nan))  # Hopper: 1.0, no net gain
                mem_s.append(p.memory_time_s)
                dw.append(p.memory_class == "depthwise")
                channel_norm.append(p.memory_class in ("channel-norm", "channel-norm-backward"))
                class_share.append((shares or {}).get(
                    (p.memory_class, p.cost.dtype in HALF, row["layout"] == "nhwc"), 1.0))
                trans_s.append(p.transpose_time_s)
                kernels.append(p.launch_time_s)  # launch_s = 1: the kernel count
                syncs.append(p.cost.syncs)
                row_of.append(i)
            self.rows.append(row)
            self.batch.append(cfg.input_shape[0])
            self.bw.append(spec.mem_bandwidth)
            self.sm_rate.append(sm_cycles_per_s(spec) if spec.tensor_cores else math.inf)
        self.math_s, self.mem_s = np.array(math_s), np.array(mem_s)
        self.math_cls, self.dw = np.array(math_cls), np.array(dw)
        self.channel_norm = np.array(channel_norm, dtype=bool)
        self.class_share = np.array(class_share, dtype=float)  # --kernel-classes
        self.winograd = np.array(wino, dtype=bool)
        self.trans_s, self.kernels = np.array(trans_s), np.array(kernels)
        self.row_of = np.array(row_of)
        self.syncs = np.array(syncs, dtype=int)  # Cost.syncs: roofline.step_time's syncs
        self.own_share = np.array(own_share, dtype=float)
        self.in_group = np.array(in_group, dtype=bool)
        self.own_winograd = np.array(own_wino, dtype=float)
        edges = np.searchsorted(self.row_of, np.arange(len(self.rows) + 1))
        self.bounds = list(zip(edges[:-1], edges[1:]))
        self.batch, self.bw = np.array(self.batch, float), np.array(self.bw)
        self.sm_rate = np.array(self.sm_rate)
        self.measured = np.array([r["measured_img_s"] for r in self.rows])

    def step_time(self, params: dict) -> np.ndarray:
        """Predicted step seconds per row: the same arithmetic as roofline.predict."""
        from dlperf.analysis.roofline import step_time as roofline_step_time

        math_eff = np.array([params[n] for n in ("tensor_gemm", "tensor_conv", "grouped_conv",
                                                  "cuda_core")] + [1.0])
        eff = np.where(np.isnan(self.own_share), math_eff[self.math_cls], self.own_share)
        for name in OWN:  # --own-share: the group's kernels of that class at its own share
            if name in params:
                cls = MATH_CLASSES.index(name.removeprefix("own_").replace("_", "-"))
                eff = np.where(self.in_group & (self.math_cls == cls), params[name], eff)
        wino = np.where(np.isnan(self.own_winograd), params["winograd"], self.own_winograd)
        math_t = self.math_s / eff * np.where(self.winograd, wino, 1.0)
        # achieved / datasheet bandwidth per row, then per kernel (depthwise slower)
        ach = combine_bandwidth(params["memory"], params["sm_bytes_per_clock"] * self.sm_rate
                                / self.bw)
        stream = ach[self.row_of]
        mem_t = self.mem_s / (stream * self.class_share
                              * np.where(self.dw, params["depthwise"], 1.0)
                              * np.where(self.channel_norm, params.get("channel_norm") or 1.0,
                                         1.0))
        kernel_t = (np.maximum(math_t, mem_t) + self.trans_s / stream
                    + self.kernels * params["launch_s"])
        # roofline.step_time per row: the CPU issuing each row's kernels, its waits included
        out = np.empty(len(self.rows))
        h = params["host_s"] if self.fit_host else self.host_s  # --fit-host: fitted too
        for i, (a, b) in enumerate(self.bounds):
            out[i] = roofline_step_time(kernel_t[a:b], self.kernels[a:b], h, self.syncs[a:b])
        return out

    def ratios(self, params: dict) -> np.ndarray:
        return (self.batch / self.step_time(params)) / self.measured


def _to_params(z: np.ndarray, bounds: dict = BOUNDS) -> dict:
    """Unbounded search vector -> bounded parameters (log-uniform sigmoid between bounds)."""
    return {name: squash(float(value), *bounds[name]) for value, name in zip(z, bounds)}


def _from_params(params: dict, bounds: dict = BOUNDS) -> np.ndarray:
    z = []
    for name in bounds:
        lo, hi = bounds[name]
        f = (math.log(params[name]) - math.log(lo)) / (math.log(hi) - math.log(lo))
        f = min(max(f, 1e-6), 1 - 1e-6)
        z.append(math.log(f / (1 - f)))
    return np.array(z)


def fit(terms: Terms, mask: np.ndarray, start: dict, bounds: dict = BOUNDS,
        fixed: dict | None = None, weights: np.ndarray | None = None) -> dict:
    """Parameters minimising the (weighted) mean squared log ratio over the rows in ``mask``;
    restarted from the best point until it stops improving (Nelder-Mead stalls in 8
    dimensions). ``fixed``: parameters held at the given values (``--fix``), not searched;
    ``weights``: each row's weight (``row_weights``; None: every row alike)."""
    fixed = fixed or {}
    bounds = {k: v for k, v in bounds.items() if k not in fixed}
    w = np.ones(len(mask)) if weights is None else np.asarray(weights, dtype=float)
    w = w[mask] / w[mask].sum()

    def loss(z):
        r = terms.ratios({**fixed, **_to_params(z, bounds)})[mask]
        return float(np.sum(w * np.log(r) ** 2))

    z = _from_params(start, bounds)
    best = loss(z)
    for _ in range(6):
        z_new = nelder_mead(loss, z)
        new = loss(z_new)
        if new > best - 1e-9:
            break
        z, best = z_new, new
    return {**fixed, **_to_params(z, bounds)}


WEIGHTS = ("row", "source", "device")


def row_weights(rows: list[dict], by: str) -> np.ndarray:
    """``--weight``: each row's weight in the loss. "row" (the shipped fit): every row alike,
    so a source or a card with many rows sets the shared shares (timm's 46 RTX 3090 rows,
    Lambda's 95); "source" or "device": each clean source or GPU preset counts once, its rows
    sharing a weight of 1 (the held-out folds keep those weights)."""
    if by == "row":
        return np.ones(len(rows))
    counts: dict[str, int] = {}
    for r in rows:
        if r["flag"] == "clean":
            counts[r[by]] = counts.get(r[by], 0) + 1
    return np.array([1.0 / counts[r[by]] if r["flag"] == "clean" else 0.0 for r in rows])


def errors(ratios) -> dict:
    err = [abs(r - 1) for r in ratios]
    return {"rows": len(err), "median_abs_error": statistics.median(err),
            "median_ratio": statistics.median(ratios), "max_abs_error": max(err)} if err else None


def _finite(params: dict) -> dict:
    """``params`` for JSON: an infinite value (``--fix sm_bytes_per_clock=inf``) as "inf"."""
    return {k: v if math.isfinite(v) else "inf" for k, v in params.items()}


def experiment_flags(argv: list[str]) -> tuple[list[str], dict, float | None, Path | None]:
    """(the other arguments, ``--fix NAME=VALUE`` parameters held fixed, ``--tf32-nchw
    SHARE``, ``--kernel-classes RESULT.json``): experiments that test a fact measured elsewhere
    (a lent GPU's per-kernel times, benchmarks/gpu_kernel_classes.py) against the published
    table. ``--fix sm_bytes_per_clock=inf`` drops the SM term (the DRAM alone); ``--tf32-nchw``
    costs TF32 NCHW convolutions that share of the fp16 transposes (``Efficiency.tf32_nchw``);
    ``--kernel-classes`` puts batch norm and pooling at the shares of the streaming rate that
    result measured (``measured_shares``)."""
    rest, fixed, tf32_nchw, kernel_classes = [], {}, None, None
    it = iter(argv)
    for a in it:
        if a in ("--fix", "--tf32-nchw", "--kernel-classes"):
            value = next(it, None)
            if value is None:
                raise SystemExit(f"{a} needs a value")
            if a == "--tf32-nchw":
                tf32_nchw = float(value)
                continue
            if a == "--kernel-classes":
                kernel_classes = Path(value)
                continue
            name, _, number = value.partition("=")
            if name not in BOUNDS and name not in OWN:
                raise SystemExit(f"--fix {value}: choose one of {', '.join([*BOUNDS, *OWN])}")
            fixed[name] = float(number)
        else:
            rest.append(a)
    return rest, fixed, tf32_nchw, kernel_classes


def row_flags(argv: list[str]) -> tuple[list[str], set[str], dict[str, str]]:
    """(the other arguments, ``--drop-source NAME`` sources left out, ``--set COLUMN=VALUE``
    columns set on every row): experiments on which rows the fit sees and how they are costed
    (``--drop-source lambda-logs --set optimizer_impl=``: the table as it stood before that
    source came, every update costed fused)."""
    rest, drop, sets = [], set(), {}
    it = iter(argv)
    for a in it:
        if a not in ("--drop-source", "--set"):
            rest.append(a)
            continue
        value = next(it, None)
        if value is None:
            raise SystemExit(f"{a} needs a value")
        if a == "--drop-source":
            drop.add(value)
        else:
            column, eq, setting = value.partition("=")
            if not eq:
                raise SystemExit(f"--set {value}: give COLUMN=VALUE (blank VALUE: none)")
            sets[column] = setting
    return rest, drop, sets


def valued_flag(argv: list[str], flag: str, needs: str) -> tuple[list[str], str | None]:
    """(the other arguments, the value after ``flag``, or None where it is absent)."""
    if flag not in argv:
        return argv, None
    at = argv.index(flag)
    if at + 1 >= len(argv):
        raise SystemExit(f"{flag} needs {needs}")
    return argv[:at] + argv[at + 2:], argv[at + 1]


# the preset's own entries the fit honours (Terms: its math shares and Winograd's gain): what
# ``--efficiency DEVICE:NAME=VALUE`` may set
DEVICE_FIELDS = (*OWN_FIELDS, "winograd")


def device_edits(argv: list[str], vp) -> tuple[list[str], dict | None]:
    """(the other arguments, ``--efficiency DEVICE:NAME=VALUE`` as
    validate_published.efficiency_edits returns it, or None): a preset given shares of its own
    for the fit, as a specs.py edit would give them (the A100-held experiment: the four A100
    presets at the shipped GEMM and CUDA-core shares while the rest are refitted).
    ``DEVICE:NAME=fitted`` takes the preset's own entry away, so that its rows follow the
    fitted shared parameter (the table as it stood before that entry shipped: the GeForce
    GEMM share, 1cfe08d); the edit then lists it under "fitted_on". Only the entries the fit
    honours (DEVICE_FIELDS), and only per preset: a shared parameter is fitted or held with
    ``--fix``."""
    rest, items, unset = [], [], {}
    it = iter(argv)
    for a in it:
        if a != "--efficiency":
            rest.append(a)
            continue
        value = next(it, None)
        if value is None:
            raise SystemExit("--efficiency needs DEVICE:NAME=VALUE, e.g. "
                             "--efficiency a100-40gb:tensor_gemm=0.78")
        head, sep, pair = value.partition(":")
        if not sep or "=" in head:
            raise SystemExit(f"--efficiency {value}: name a preset (DEVICE:NAME=VALUE); a "
                             "shared parameter is fitted, or held with --fix NAME=VALUE")
        name = pair.partition("=")[0].strip()
        if name not in DEVICE_FIELDS:
            raise SystemExit(f"--efficiency {value}: the fit honours a preset's "
                             f"{', '.join(DEVICE_FIELDS)} only")
        if pair.partition("=")[2].strip() == "fitted":
            from dlperf.errors import DlperfError
            from dlperf.hardware.specs import get_device

            try:
                preset = get_device(head.strip())
            except DlperfError as exc:
                raise SystemExit(str(exc)) from None
            if (preset.efficiency or {}).get(name) is None:  # it follows the fitted one already
                raise SystemExit(f"--efficiency {value}: {preset.name} has no {name} of its "
                                 "own to take away")
            unset.setdefault(preset.name, []).append(name)
        else:
            items.append(value)
    edits = vp.efficiency_edits([], items)
    if unset:
        edits = {**(edits or {"fitted": {}, "devices": {}}),
                 "fitted_on": {k: sorted(set(v)) for k, v in sorted(unset.items())}}
    return rest, edits


def main(argv: list[str]) -> int:
    from dlperf.provenance import load_sibling

    vp = load_sibling(__file__, "validate_published")
    argv, fixed, tf32_nchw, kernel_classes = experiment_flags(argv)
    argv, drop, sets = row_flags(argv)
    argv, own = valued_flag(argv, "--own-share", "presets, e.g. --own-share v100-sxm2,v100-pcie")
    group: tuple[str, ...] = ()
    if own is not None:
        group = tuple(d.strip() for d in own.split(","))
        from dlperf.hardware.specs import PRESETS

        unknown = [d for d in group if d not in PRESETS]
        if unknown:
            raise SystemExit(f"--own-share: unknown preset(s) {', '.join(unknown)} "
                             "(`dlperf devices` lists them)")
    if not group and any(name in OWN for name in fixed):
        raise SystemExit("--fix own_...: the presets' own shares exist only with --own-share")
    argv, edits = device_edits(argv, vp)
    argv, weight_by = valued_flag(argv, "--weight", f"one of {', '.join(WEIGHTS)}")
    weight_by = weight_by or "row"
    if weight_by not in WEIGHTS:
        raise SystemExit(f"--weight {weight_by}: choose one of {', '.join(WEIGHTS)}")
    experiment = "--channel-norm" in argv
    fit_host = "--fit-host" in argv
    argv = [a for a in argv if a not in ("--channel-norm", "--fit-host")]
    if (experiment or fit_host or fixed or tf32_nchw is not None or kernel_classes or group
            or drop or sets or weight_by != "row" or edits) and len(argv) < 2:
        raise SystemExit("--channel-norm, --fit-host, --fix, --tf32-nchw, --kernel-classes, "
                         "--own-share, --drop-source, --set, --weight and --efficiency are "
                         "experiments: give "
                         "CSV and OUT.json (the default OUT is the shipped fit's)")
    shares = None
    if kernel_classes:
        shares = measured_shares(json.loads(kernel_classes.read_text()))
    bounds = {**BOUNDS, "channel_norm": CHANNEL_NORM_BOUNDS} if experiment else BOUNDS
    if group:
        bounds = {**bounds, **OWN}
    if fit_host:
        bounds = {**bounds, "host_s": HOST_BOUNDS}
    csv_path = Path(argv[0]) if argv else vp.DEFAULT_CSV
    out_path = Path(argv[1]) if len(argv) > 1 else DEFAULT_OUT
    rows = vp.set_columns([r for r in vp.read_rows(csv_path) if r["source"] not in drop],
                          sets)
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task(f"capturing {len(rows)} published rows", total=len(rows))
        captured = vp.capture_rows(rows, progress=lambda: bar.advance(task))
    from dlperf.hardware.efficiency import FITTED

    terms = Terms(captured, FITTED.host_s, tf32_nchw, shares, group, edits)
    terms.fit_host = fit_host
    clean = np.array([r["flag"] == "clean" for r in terms.rows])
    from dlperf.hardware.efficiency import Efficiency

    default = Efficiency()
    start = {n: getattr(default, n) if getattr(default, n) is not None else 8.0 for n in NAMES}
    start["winograd"] = 0.6  # its default, 1.0, is its bound, where the squashed search stalls
    if experiment:
        start["channel_norm"] = 0.6
    if fit_host:
        start["host_s"] = FITTED.host_s
    for name in OWN if group else ():
        start[name] = start[name.removeprefix("own_")]
    weights = row_weights(terms.rows, weight_by)
    params = fit(terms, clean, start, bounds, fixed, weights)
    in_sample = terms.ratios(params)
    held_out = np.full(len(rows), np.nan)
    sources = sorted({r["source"] for r in terms.rows if r["flag"] == "clean"})
    folds = {}
    for source in sources:
        mine = np.array([r["source"] == source for r in terms.rows])
        fold = fit(terms, clean & ~mine, params, bounds, fixed, weights)
        held_out[mine] = terms.ratios(fold)[mine]
        folds[source] = fold
    before = terms.ratios({**Efficiency().to_dict(), "sm_bytes_per_clock": math.inf})

    def summary(ratios):
        out = {"clean": errors([float(x) for x, c in zip(ratios, clean) if c])}
        for field in ("class", "source", "device"):
            for value in sorted({r[field] for r in terms.rows}):
                out[f"clean {field}={value}"] = errors(
                    [float(x) for x, r, c in zip(ratios, terms.rows, clean)
                     if c and r[field] == value])
        return out

    result = {
        "parameters": _finite(params),
        "bounds": bounds,
        "fixed": _finite(fixed), "tf32_nchw": tf32_nchw, "own_share_presets": list(group),
        "dropped_sources": sorted(drop), "set_columns": sets, "efficiency_edits": edits,
        "kernel_classes": None if shares is None else {
            "result": str(kernel_classes), "shares": {
                f"{cls} {'16-bit' if half else '32-bit'} {'nhwc' if nhwc else 'nchw'}": share
                for (cls, half, nhwc), share in sorted(shares.items())}},
        "objective": "mean squared log(predicted / measured) over the clean rows",
        "weight": weight_by,
        "summary_in_sample": summary(in_sample),
        "summary_held_out_by_source": summary(held_out),
        "summary_constants_0.8_0.85_two_pass": summary(before),
        "folds": {k: _finite(v) for k, v in folds.items()},
        "rows": [{"id": r["id"], "source": r["source"], "class": r["class"],
                  "device": r["device"], "flag": r["flag"], "measured_img_s": r["measured_img_s"],
                  "ratio_in_sample": float(a), "ratio_held_out": float(h),
                  "ratio_before": float(b)}
                 for r, a, h, b in zip(terms.rows, in_sample, held_out, before)],
    }
    for name, block in (("before (0.80 / 0.85 constants)", result["summary_constants_0.8_0.85_two_pass"]),
                        ("in-sample", result["summary_in_sample"]),
                        ("held out (leave one source out)", result["summary_held_out_by_source"])):
        print(f"\n{name}")
        for key, s in block.items():
            if s:
                print(f"  {key:62s} rows {s['rows']:3d}  median |error| "
                      f"{s['median_abs_error']:6.1%}  pred/meas {s['median_ratio']:.2f}  "
                      f"worst {s['max_abs_error']:6.1%}")
    print("\nparameters:")
    for k, v in params.items():
        print(f"  {k} = {v:.4g}")
    from dlperf.provenance import save_result

    save_result(out_path, "efficiency-fit",
                {"csv": str(csv_path.relative_to(ROOT) if csv_path.is_relative_to(ROOT)
                            else csv_path)}, result)
    print(f"Wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
