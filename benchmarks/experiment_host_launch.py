"""An experiment: would a busier host's cost per kernel launch explain what NVIDIA's PyTorch
ConvNets runs lose from one GPU to eight (issue #14)?

Those runs feed every GPU from the host's JPEG decode (16 loader workers a GPU on a DGX A100, 8
on a DGX-1). On one GPU the host is mostly idle; on eight its cores decode for all of them, and
the eight training processes issue their kernels beside that work. The runs lose 3-9% (FP32/TF32)
and 13-22% (AMP) of their one-GPU rate where dlperf predicts ~2% (benchmarks/README.md). One
candidate is the host's cost of issuing a kernel (``Efficiency.host_s``, 10 us on an idle host:
roofline.step_time), grown on the busy host. This script asks the model what it would take:
for each 8-GPU row of those tables it predicts the 8-GPU step with ``host_s`` raised (the
one-GPU step keeps the shipped 10 us) and finds the ``host_s`` at which the step added from one
GPU to eight equals the measured one, where any value up to ``MAX_HOST_S`` does.

If one busier-host cost explained the loss, the rows would agree on it. Nothing is fitted or
shipped from this.

Usage: python benchmarks/experiment_host_launch.py [OUT.json]
Writes benchmarks/results/experiment-host-launch.json (about 3 minutes on 2 cores).
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks/results/experiment-host-launch.json"
SOURCES = ("nvidia-pytorch-rn50-a100", "dle-convnets", "dle-convnets-2012", "dle-efficientnet")
GRID_S = (10e-6, 20e-6, 40e-6, 80e-6, 120e-6)  # the shipped 10 us first
MAX_HOST_S, TOLERANCE_S = 200e-6, 0.5e-6


def shipped_efficiency(captured):
    from dlperf.hardware.efficiency import efficiency_for
    from dlperf.hardware.specs import get_device

    return efficiency_for(get_device(captured[0]["device"]), captured[1].attention_kernel)


def added_ms(vs, captured, shipped: dict, host_s: float) -> float:
    """The 8-GPU step less the one-GPU step (ms), the 8-GPU step's kernels issued at
    ``host_s`` each, the one-GPU step's at the shipped cost (``shipped``: the row scored as
    shipped)."""
    single_rate = shipped["predicted_per_gpu"] / shipped["predicted_efficiency"]
    eff = dataclasses.replace(shipped_efficiency(captured), host_s=host_s)
    rate = vs.score([captured], efficiency=eff)[0]["predicted_per_gpu"]
    return 1e3 * captured[0]["batch"] * (1 / rate - 1 / single_rate)


def solve(vs, captured, shipped: dict, target_ms: float) -> float | None:
    """The host_s in [shipped, MAX_HOST_S] at which the added step equals ``target_ms``
    (bisection: the step grows with host_s), None where even MAX_HOST_S adds less or the
    shipped cost already adds more (an input-bound row predicted to lose more than it did)."""
    lo, hi = shipped_efficiency(captured).host_s, MAX_HOST_S
    # (at the shipped cost the added step is the shipped prediction's)
    if (shipped["predicted_added_ms"] >= target_ms
            or added_ms(vs, captured, shipped, hi) < target_ms):
        return None
    while hi - lo > TOLERANCE_S:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if added_ms(vs, captured, shipped, mid) < target_ms else (lo, mid)
    return (lo + hi) / 2


def main(argv: list[str]) -> int:
    from rich.progress import track

    from dlperf.provenance import load_sibling, save_result

    out_path = Path(argv[0]) if argv else DEFAULT_OUT
    vs = load_sibling(__file__, "validate_scaling")
    rows = [r for r in vs.read_rows(vs.DEFAULT_CSV)
            if r["source"] in SOURCES and r["gpus"] == 8 and r["measured_single"]]
    captured = vs.capture(rows)
    table = []
    for c in track(captured, description="8-GPU rows", transient=True):
        row = c[0]
        shipped = vs.score([c])[0]
        measured = shipped["measured_added_ms"]
        needed = solve(vs, c, shipped, measured)
        table.append({"id": row["id"], "source": row["source"], "model": row["model"],
                      "device": row["device"], "precision": row["precision"],
                      "batch": row["batch"], "measured_added_ms": measured,
                      "predicted_added_ms": shipped["predicted_added_ms"],
                      "limited_by": shipped["limited_by"],
                      "shipped_host_s": shipped_efficiency(c).host_s,
                      "added_ms_at_host_s": {f"{h * 1e6:.0f}us": added_ms(vs, c, shipped, h)
                                             for h in GRID_S},
                      "host_s_that_matches": needed,
                      "over_at_shipped": shipped["predicted_added_ms"] >= measured})
    summary = {}
    for name, keep in (("amp", lambda r: r["precision"] == "amp"),
                       ("fp32_tf32", lambda r: r["precision"] != "amp")):
        group = [r for r in table if keep(r)]
        solved = [r["host_s_that_matches"] for r in group if r["host_s_that_matches"]]
        summary[name] = {"rows": len(group), "solved": len(solved),
                         "over_at_shipped": sum(r["over_at_shipped"] for r in group),
                         "host_s_min": min(solved) if solved else None,
                         "host_s_median": statistics.median(solved) if solved else None,
                         "host_s_max": max(solved) if solved else None}
    print(f"{'row':34s} {'added':>6s} {'pred':>5s}  host_s that matches")
    for r in table:
        h = r["host_s_that_matches"]
        what = (f"{h * 1e6:.0f} us" if h else "none: more already at the shipped cost"
                if r["over_at_shipped"] else f"none up to {MAX_HOST_S * 1e6:.0f} us")
        print(f"{r['id']:34s} {r['measured_added_ms']:6.1f} {r['predicted_added_ms']:5.1f}  {what}")
    for name, s in summary.items():
        span = (f"{s['host_s_min'] * 1e6:.0f}-{s['host_s_max'] * 1e6:.0f} us, median "
                f"{s['host_s_median'] * 1e6:.0f}" if s["solved"] else "-")
        print(f"{name}: {s['solved']} of {s['rows']} rows matched at some host_s ({span})")
    save_result(out_path, "experiment-host-launch",
                {"sources": SOURCES, "grid_s": GRID_S, "max_host_s": MAX_HOST_S,
                 "tolerance_s": TOLERANCE_S},
                {"summary": summary, "rows": table})
    print(f"Wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
