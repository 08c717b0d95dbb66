"""An experiment: the published FP32/TF32 rows with TF32 NCHW convolutions charged a layout
cost (``Efficiency.tf32_nchw``), every other parameter as shipped.

The second lent H200 measured, per kernel, that NCHW costs a TF32 convolution 0.57 of what it
costs a bf16 one over the same bytes (benchmarks/gpu_kernel_classes.py), where the shipped
model charges TF32 nothing. This script asks the published table what that term does to its
FP32/TF32 rows (every TF32 CNN row in it is NCHW) at shares 0 (shipped), 0.41 (the H200's TF32
extra over the model's bf16 transposes), 0.57 and 1 (as fp16), without refitting anything else.
A refit with the term is ``benchmarks/fit_efficiency.py CSV OUT --tf32-nchw 0.57``.

Usage: python benchmarks/experiment_tf32_nchw.py [OUT.json]
Writes benchmarks/results/experiment-tf32-nchw.json.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks/results/experiment-tf32-nchw.json"
SHARES = (0.0, 0.41, 0.57, 1.0)
CLASSES = ("cnn-fp32-tf32", "transformer-fp32-tf32")


def with_share(share: float):
    """``efficiency_for`` whose every model has ``tf32_nchw`` = ``share`` (the presets'
    other parameters untouched)."""
    from dlperf.hardware import efficiency

    def efficiency_for(*args, **kwargs):
        return dataclasses.replace(efficiency.efficiency_for(*args, **kwargs), tf32_nchw=share)
    return efficiency_for


def main(argv: list[str]) -> int:
    import dlperf.analysis.api as api
    import dlperf.analysis.roofline as roofline
    from dlperf.provenance import load_sibling, save_result

    vp = load_sibling(__file__, "validate_published")
    out_path = Path(argv[0]) if argv else DEFAULT_OUT
    rows = [r for r in vp.read_rows(vp.DEFAULT_CSV) if r["class"] in CLASSES]
    captured = vp.capture_rows(rows)
    ratios = {}
    original = (roofline.efficiency_for, api.efficiency_for)
    try:
        for share in SHARES:
            roofline.efficiency_for = api.efficiency_for = with_share(share)
            ratios[share] = {r["id"]: r["ratio"] for r in vp.predict_rows(rows, captured=captured)}
    finally:
        roofline.efficiency_for, api.efficiency_for = original
    summary = {}
    for cls in CLASSES:
        for share in SHARES:
            values = [ratios[share][r["id"]] for r in rows
                      if r["class"] == cls and r["flag"] == "clean"]
            summary[f"{cls} tf32_nchw={share}"] = {
                "rows": len(values),
                "median_abs_error": statistics.median(abs(v - 1) for v in values),
                "median_ratio": statistics.median(values)}
            s = summary[f"{cls} tf32_nchw={share}"]
            print(f"{cls:24s} tf32_nchw={share:<5} {s['rows']:3d} clean rows: median |error| "
                  f"{s['median_abs_error']:.1%}, predicted/measured {s['median_ratio']:.2f}")
    table = [{"id": r["id"], "device": r["device"], "class": r["class"], "flag": r["flag"],
              "measured_img_s": r["measured_img_s"],
              **{f"ratio_tf32_nchw_{share}": ratios[share][r["id"]] for share in SHARES}}
             for r in rows]
    save_result(out_path, "experiment-tf32-nchw",
                {"csv": str(vp.DEFAULT_CSV.relative_to(ROOT)), "shares": list(SHARES),
                 "classes": list(CLASSES), "other_parameters": "as shipped"},
                {"summary": summary, "rows": table})
    print(f"Wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
