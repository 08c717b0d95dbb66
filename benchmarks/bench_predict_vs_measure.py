"""How close is the analyzer to this machine? Predicted vs measured, per kernel, on the CPU.

Issue #11's CPU proof. The model is calibrated only by `dlperf probe --sweep` on this machine
(a quick probe of the peaks, then the generic layers of dlperf/analysis/calibrate.py: never the
models checked here), then each model's training step runs for real with every kernel timed
and predicted. Both the calibrated prediction and the probe-only one (peaks at efficiency 1.0,
what dlperf did before) are saved, so the effect of the sweep is measured side by side.

Run: `make bench-predict` (about 10 minutes on a 2-core machine).
Writes benchmarks/results/predict-vs-measure-cpu.json.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

from dlperf.analysis.api import AnalysisConfig
from dlperf.analysis.calibrate import sweep
from dlperf.analysis.measure import MeasureConfig, measure
from dlperf.bench.results import save_result
from dlperf.hardware.probe import ProbeConfig, probe

OUT = Path(__file__).resolve().parent / "results"
# (model, input shape, dtype, channels_last): small enough for a 2-core CPU. "gpt" is the
# built-in GPT at the small size below, on token ids.
CASES = [("resnet18", (8, 3, 112, 112), "fp32", False), ("resnet50", (8, 3, 112, 112), "fp32", False),
         ("mobilenet_v3_large", (8, 3, 112, 112), "fp32", False),
         ("vit_b_16", (2, 3, 224, 224), "fp32", False), ("gpt", (4, 256), "fp32", False),
         ("resnet18", (8, 3, 112, 112), "bf16", True)]
GPT = dict(layers=4, d_model=256, heads=4, vocab=8192, seq_len=256)


def _summary(m) -> dict:
    t = m.totals()
    return {"predicted_s": t["predicted_s"], "measured_s": t["measured_s"],
            "step_error": t["predicted_s"] / t["measured_s"] - 1,
            "weighted_median_abs_error": t["weighted_median_abs_error"],
            "by_kind": t["by_kind"]}


def main() -> int:
    spec, probe_ms = probe(ProbeConfig(device="cpu", quick=True))
    overrides, rows, fitted = sweep(spec, "cpu")
    calibrated = dataclasses.replace(spec, efficiency=overrides)
    print("probe:", {u: f"{v / 1e9:.0f} GFLOP/s" for u, v in spec.peak.items()},
          f"copy {spec.mem_bandwidth / 1e9:.1f} GB/s; sweep:",
          {k: round(v, 4) for k, v in fitted.items()})
    results = {"probe": {"spec": spec.to_dict(), "measurements": [m.to_dict() for m in probe_ms]},
               "sweep": {"fit": fitted, "overrides": overrides, "kernels": rows}, "cases": {}}
    mcfg = MeasureConfig(steps=3, warmup=1)
    from dlperf.models.gpt import GPTConfig
    from dlperf.models.registry import build_model

    for model, shape, dtype, channels_last in CASES:
        key = f"{model}-{dtype}-{'channels_last' if channels_last else 'nchw'}"
        cfg = AnalysisConfig(model=model, input_shape=shape, dtype=dtype, train=True,
                             channels_last=channels_last, device="cpu", optimizer="none",
                             tokens=model == "gpt")
        torch.manual_seed(0)
        net, model_input = build_model(model, gpt=GPTConfig(**GPT), real=True)
        m = measure(net, cfg, calibrated, "cpu", input_dtype=model_input.dtype, cfg=mcfg)
        # the same measured kernels, predicted from the probe's peaks alone
        from dlperf.analysis.roofline import predict

        before = sum(predict(p.cost, spec, tf32=False).time_s for p in m.analysis.predictions)
        s = _summary(m)
        s["probe_only_predicted_s"] = before
        s["probe_only_step_error"] = before / s["measured_s"] - 1
        results["cases"][key] = {**s, "layers": m.to_dict()["layers"]}
        print(f"{key}: measured {s['measured_s'] * 1e3:.0f} ms, predicted "
              f"{s['predicted_s'] * 1e3:.0f} ms ({s['step_error']:+.0%}; probe only "
              f"{s['probe_only_step_error']:+.0%}), per-kernel weighted median |error| "
              f"{s['weighted_median_abs_error']:.0%}", flush=True)
    path = OUT / "predict-vs-measure-cpu.json"
    save_result(path, "predict-vs-measure-cpu",
                {"cases": CASES, "gpt": GPT, "steps": mcfg.steps, "warmup": mcfg.warmup,
                 "calibration": "dlperf probe --quick + sweep (dlperf/analysis/calibrate.py)"},
                results)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
