"""How close is the roofline to this machine? Predicted vs measured, per kernel, on the CPU.

Probes this CPU's ceilings (full probe), then runs a ResNet-50 training step (batch 16, 128 px,
small enough for a 2-core CPU) for real with every kernel timed, for fp32 NCHW and bf16 channels_last, and saves
predicted and measured times side by side. Run: `make bench-predict`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torchvision

from dlperf.analysis.api import AnalysisConfig
from dlperf.analysis.measure import MeasureConfig, measure
from dlperf.bench.results import save_result
from dlperf.hardware.probe import ProbeConfig, probe

OUT = Path(__file__).resolve().parent / "results"
CASES = [("fp32", False), ("bf16", True)]


def main() -> int:
    spec, probe_ms = probe(ProbeConfig(device="cpu"))
    print("probe:", {u: f"{v / 1e9:.0f} GFLOP/s" for u, v in spec.peak.items()},
          f"copy {spec.mem_bandwidth / 1e9:.1f} GB/s")
    results = {"probe": {"spec": spec.to_dict(), "measurements": [m.to_dict() for m in probe_ms]}}
    mcfg = MeasureConfig(steps=3, warmup=2)
    for dtype, channels_last in CASES:
        cfg = AnalysisConfig(model="resnet50", input_shape=(16, 3, 128, 128), dtype=dtype,
                             train=True, channels_last=channels_last, device="cpu")
        m = measure(torchvision.models.resnet50(), cfg, spec, "cpu", cfg=mcfg)
        t = m.totals()
        key = f"{dtype}-{'channels_last' if channels_last else 'nchw'}"
        results[key] = m.to_dict()
        print(f"{key}: measured {t['measured_s'] * 1e3:.0f} ms vs predicted "
              f"{t['predicted_s'] * 1e3:.0f} ms ({t['measured_over_predicted']:.2f}x), "
              f"{t['measured_samples_per_s']:.1f} img/s; by kind "
              + ", ".join(f"{k} {v['measured_s'] / v['predicted_s']:.2f}x"
                          for k, v in t["by_kind"].items() if v["predicted_s"]))
    path = OUT / "predict-vs-measure-cpu.json"
    save_result(path, "predict-vs-measure-cpu",
                {"model": "resnet50", "batch": 16, "input": [3, 128, 128], "train": True,
                 "cases": CASES, "steps": mcfg.steps, "warmup": mcfg.warmup}, results)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
