"""How close is the analyzer to this machine? Predicted vs measured, per kernel, on the CPU.

Issue #11's CPU proof. The model is calibrated only by `dlperf probe --sweep` on this machine
(a quick probe of the peaks, then the generic layers of dlperf/analysis/calibrate.py: never the
models checked here), then each model's training step runs for real with every kernel timed
and predicted. Both the calibrated prediction and the probe-only one (peaks at efficiency 1.0,
what dlperf did before) are saved, so the effect of the sweep is measured side by side.

Each round calibrates afresh and measures every case; the summary is the median over rounds
(default 5), with the range, because this CPU varies 10-30% from run to run.

Run: `make bench-predict` (about 8 minutes on a 2-core machine), or
`python benchmarks/bench_predict_vs_measure.py ROUNDS`.
Writes benchmarks/results/predict-vs-measure-cpu.json.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import torch

from dlperf.analysis.api import AnalysisConfig
from dlperf.analysis.calibrate import cases, fit_sweep, measure_case, sweep, timed_kernels
from dlperf.analysis.measure import MeasureConfig, measure
from dlperf.provenance import save_result
from dlperf.hardware.probe import ProbeConfig, probe

OUT = Path(__file__).resolve().parent / "results"
# (model, input shape, dtype, channels_last): small enough for a 2-core CPU. "gpt" is the
# built-in GPT at the small size below, on token ids.
CASES = [("resnet18", (8, 3, 112, 112), "fp32", False), ("resnet50", (8, 3, 112, 112), "fp32", False),
         ("mobilenet_v3_large", (8, 3, 112, 112), "fp32", False),
         ("vit_b_16", (2, 3, 224, 224), "fp32", False), ("gpt", (4, 256), "fp32", False),
         ("resnet18", (8, 3, 112, 112), "bf16", True)]
GPT = dict(layers=4, d_model=256, heads=4, vocab=8192, seq_len=256)
# Models without some parameters, fitted to the same sweep timings and predicting the same
# measured kernels as the full model: what those parameters buy, free of the host's
# round-to-round noise (each is one measurement predicted twice).
ABLATIONS = {"no per-convolution terms": ("conv_launch_s", "conv_m0", "conv_n0", "conv_k0"),
             "one norm class": ("channel_norm", "channel_norm_backward"),
             "one depthwise backward share": ("depthwise_wgrad_wide",),
             "one pooling class": ("window_backward",),
             "one GELU class": ("gelu_tanh",)}


# Sweep layers timed again beside every model's measurement (before and after it): how much
# faster or slower the host ran then than during the sweep that calibrated the round. A
# diagnostic, not part of the model: it tells the host's drift between the calibration and the
# measurement from the model's own error (this CPU varies 20-50% from round to round).
REFERENCE = ("conv3x3 128@28", "linear 1024->1024", "bn+relu 256@14")


def _reference_s(spec) -> float:
    """The REFERENCE layers' measured seconds now, timed as the sweep times them."""
    return sum(t for case in cases() if case.name in REFERENCE
               for _, t in timed_kernels(measure_case(case, "fp32", spec, "cpu")))


def _summary(m) -> dict:
    t = m.totals()
    return {"predicted_s": t["predicted_s"], "measured_s": t["measured_s"],
            "step_error": t["predicted_s"] / t["measured_s"] - 1,
            "weighted_median_abs_error": t["weighted_median_abs_error"],
            "by_kind": t["by_kind"]}


def _round(mcfg) -> dict:
    """One calibration and measurement of every case: a fresh quick probe, the sweep, then each
    model's step measured and predicted."""
    spec, probe_ms = probe(ProbeConfig(device="cpu", quick=True))
    overrides, rows, fitted = sweep(spec, "cpu")
    calibrated = dataclasses.replace(spec, efficiency=overrides)
    ablated = {name: dataclasses.replace(spec, efficiency=fit_sweep(rows, spec, drop)[0])
               for name, drop in ABLATIONS.items()}
    print("probe:", {u: f"{v / 1e9:.0f} GFLOP/s" for u, v in spec.peak.items()},
          f"copy {spec.mem_bandwidth / 1e9:.1f} GB/s; sweep:",
          {k: round(v, 4) if isinstance(v, float) else v for k, v in fitted.items()})
    out = {"probe": {"spec": spec.to_dict(), "measurements": [m.to_dict() for m in probe_ms]},
           "sweep": {"fit": fitted, "overrides": overrides, "kernels": rows}, "cases": {}}
    sweep_ref = sum(r["measured_s"] for r in rows
                    if r["case"] in REFERENCE and r["pass"] == "main")
    from dlperf.models.gpt import GPTConfig
    from dlperf.models.registry import build_model

    for model, shape, dtype, channels_last in CASES:
        key = f"{model}-{dtype}-{'channels_last' if channels_last else 'nchw'}"
        cfg = AnalysisConfig(model=model, input_shape=shape, dtype=dtype, train=True,
                             channels_last=channels_last, device="cpu", optimizer="none",
                             tokens=model == "gpt")
        ref_before = _reference_s(spec)
        torch.manual_seed(0)
        net, model_input = build_model(model, gpt=GPTConfig(**GPT), real=True)
        m = measure(net, cfg, calibrated, "cpu", input_dtype=model_input.dtype, cfg=mcfg)
        s = _summary(m)
        # the host's speed around this measurement against the sweep's (> 1: slower now)
        s["host_drift"] = (ref_before + _reference_s(spec)) / 2 / sweep_ref
        s["drift_adjusted_step_error"] = s["predicted_s"] * s["host_drift"] / s["measured_s"] - 1
        # the same measured kernels, predicted from the probe's peaks alone
        before = _summary(m.with_spec(spec))
        s["probe_only_predicted_s"] = before["predicted_s"]
        s["probe_only_step_error"] = before["step_error"]
        s["ablations"] = {name: {k: v for k, v in _summary(m.with_spec(a)).items()
                                 if k in ("predicted_s", "step_error",
                                          "weighted_median_abs_error")}
                          for name, a in ablated.items()}
        out["cases"][key] = {**s, "layers": m.to_dict()["layers"]}
        print(f"{key}: measured {s['measured_s'] * 1e3:.0f} ms, predicted "
              f"{s['predicted_s'] * 1e3:.0f} ms ({s['step_error']:+.0%}; probe only "
              f"{s['probe_only_step_error']:+.0%}), per-kernel weighted median |error| "
              f"{s['weighted_median_abs_error']:.0%}; host {s['host_drift']:.2f}x the sweep's "
              f"time (drift-adjusted step {s['drift_adjusted_step_error']:+.0%}); "
              + "; ".join(f"{n}: {a['step_error']:+.0%}, per kernel "
                          f"{a['weighted_median_abs_error']:.0%}"
                          for n, a in s["ablations"].items()), flush=True)
    return out


def summarize(rounds: list[dict]) -> dict:
    """Per case over the rounds: the median step error (and its range), the median per-kernel
    error; the issue's goal is judged on the medians (this CPU varies 10-30% run to run)."""
    import numpy as np

    out = {}
    for key in rounds[0]["cases"]:
        errs = [r["cases"][key]["step_error"] for r in rounds]
        before = [r["cases"][key]["probe_only_step_error"] for r in rounds]
        kernel = [r["cases"][key]["weighted_median_abs_error"] for r in rounds]
        measured = [r["cases"][key]["measured_s"] for r in rounds]
        drift = [r["cases"][key]["host_drift"] for r in rounds]
        adjusted = [r["cases"][key]["drift_adjusted_step_error"] for r in rounds]
        ablations = {name: {
            "median_step_error": float(np.median(
                [r["cases"][key]["ablations"][name]["step_error"] for r in rounds])),
            "median_weighted_kernel_error": float(np.median(
                [r["cases"][key]["ablations"][name]["weighted_median_abs_error"]
                 for r in rounds]))} for name in rounds[0]["cases"][key].get("ablations", {})}
        out[key] = {"median_step_error": float(np.median(errs)),
                    "min_step_error": float(min(errs)), "max_step_error": float(max(errs)),
                    "median_probe_only_step_error": float(np.median(before)),
                    "median_weighted_kernel_error": float(np.median(kernel)),
                    "median_measured_s": float(np.median(measured)),
                    "measured_spread": float(max(measured) / min(measured) - 1),
                    "median_host_drift": float(np.median(drift)),
                    "host_drift_range": [float(min(drift)), float(max(drift))],
                    "median_drift_adjusted_step_error": float(np.median(adjusted)),
                    "ablations": ablations}
    worst = max(abs(v["median_step_error"]) for v in out.values())
    # over every (round, case): how much of the step error the host's drift accounts for
    pairs = [(math.log(c["host_drift"]), math.log1p(c["step_error"]),
              abs(c["step_error"]), abs(c["drift_adjusted_step_error"]))
             for r in rounds for c in r["cases"].values() if "host_drift" in c]
    drift = None
    if len(pairs) > 2:
        x, y, raw, adjusted = (np.array(v) for v in zip(*pairs))
        drift = {"pairs": len(pairs),
                 "pearson_log_drift_log_ratio": float(np.corrcoef(x, y)[0, 1])
                 if x.std() > 0 and y.std() > 0 else None,
                 "median_abs_step_error": float(np.median(raw)),
                 "median_abs_drift_adjusted_step_error": float(np.median(adjusted))}
    return {"cases": out, "worst_median_step_error": worst, "host_drift": drift,
            "goal_step_within_15pct": worst <= 0.15,
            "goal_kernel_median_within_25pct": all(
                v["median_weighted_kernel_error"] <= 0.25 for v in out.values())}


def main(argv: list[str]) -> int:
    rounds_n = int(argv[0]) if argv else 5
    mcfg = MeasureConfig(steps=3, warmup=1)
    rounds = []
    for i in range(rounds_n):
        print(f"round {i + 1}/{rounds_n}", flush=True)
        rounds.append(_round(mcfg))
    summary = summarize(rounds)
    for key, v in summary["cases"].items():
        print(f"{key}: median step error {v['median_step_error']:+.0%} "
              f"(range {v['min_step_error']:+.0%}..{v['max_step_error']:+.0%}; probe only "
              f"{v['median_probe_only_step_error']:+.0%}), per-kernel "
              f"{v['median_weighted_kernel_error']:.0%}; measured varied "
              f"{v['measured_spread']:.0%}; host drift {v['median_host_drift']:.2f}x "
              f"({v['host_drift_range'][0]:.2f}-{v['host_drift_range'][1]:.2f}), "
              f"drift-adjusted step {v['median_drift_adjusted_step_error']:+.0%}"
              + "".join(f"; {n}: {a['median_step_error']:+.0%}, per kernel "
                        f"{a['median_weighted_kernel_error']:.0%}"
                        for n, a in v["ablations"].items()))
    # every round's summaries; the per-kernel rows of the last round only (size)
    for r in rounds[:-1]:
        for case in r["cases"].values():
            case.pop("layers")
        r["sweep"].pop("kernels")
    path = OUT / "predict-vs-measure-cpu.json"
    save_result(path, "predict-vs-measure-cpu",
                {"cases": CASES, "gpt": GPT, "steps": mcfg.steps, "warmup": mcfg.warmup,
                 "rounds": rounds_n, "ablations": ABLATIONS, "drift_reference": REFERENCE,
                 "calibration": "each round: dlperf probe --quick + sweep "
                                "(dlperf/analysis/calibrate.py), then every case"},
                {"summary": summary, "rounds": rounds})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
