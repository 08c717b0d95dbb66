"""The MLPerf ResNet-50 rows of the scale-out table, one change at a time (issue #14).

Each MLPerf row of benchmarks/validation/published_scaling.csv (flag ``fused-stack``) is scored
by validate_scaling.py's own functions under a ladder of settings, each adding one thing the
MLPerf config does:

1. eager:   what dlperf predicted before it had the fused stack: PyTorch eager kernels under
            autocast (fp32 gradients), DDP's overlap, no batch-norm groups, no CUDA graphs;
2. half:    the network in fp16 with fp16 gradients (MXNet's dtype float16, multi-precision
            LARS: dlperf's fp16-o2), CUDA graphs;
3. overlap: + the config's all-reduce after the backward and its batch-norm groups;
4. bn-act:  + batch norm + ReLU and batch norm + add + ReLU one kernel each;
5. config:  the fusion each config runs (conv-bn on one node and on 448 nodes), i.e. the row as
            the table has it.

Usage: python benchmarks/mlperf_fusion_ablation.py [OUT.json]
(default benchmarks/results/mlperf-fusion-ablation.json; ~20 s)
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks/results/mlperf-fusion-ablation.json"


def ladder(row: dict) -> list[tuple[str, dict]]:
    eager = {**row, "precision": "amp", "fusion": "none", "cuda_graphs": False,
             "overlap": True, "bn_group": 1}
    half = {**eager, "precision": row["precision"], "cuda_graphs": row["cuda_graphs"]}
    overlap = {**half, "overlap": row["overlap"], "bn_group": row["bn_group"]}
    bn_act = {**overlap, "fusion": "bn-act" if row["fusion"] != "none" else "none"}
    return [("eager", eager), ("half", half), ("overlap", overlap), ("bn-act", bn_act),
            ("config", row)]


def main(argv: list[str]) -> int:
    from dlperf.provenance import load_sibling, save_result

    vs = load_sibling(__file__, "validate_scaling")

    out = Path(argv[0]) if argv else DEFAULT_OUT
    rows = [r for r in vs.read_rows(vs.DEFAULT_CSV)
            if r["flag"] == "fused-stack" and r["source"].startswith("mlperf-training")]
    steps = [(r, name, variant) for r in rows for name, variant in ladder(r)]
    scored = vs.score(vs.capture([variant for _, _, variant in steps]))
    table: dict[str, dict] = {}
    for (row, name, _), s in zip(steps, scored):
        table.setdefault(row["id"], {"gpus": row["gpus"], "batch": row["batch"],
                                     "measured_per_gpu": row["measured_per_gpu"]})[name] = {
            "predicted_per_gpu": s["predicted_per_gpu"], "per_gpu_ratio": s["per_gpu_ratio"],
            "predicted_efficiency": s["predicted_efficiency"],
            "exposed_comm_s": s["exposed_comm_s"], "limited_by": s["limited_by"]}
    names = [name for name, _ in ladder(rows[0])]
    print(f"{'row':26s} {'GPUs':>5s} {'measured':>9s} " + " ".join(f"{n:>8s}" for n in names))
    for rid, t in table.items():
        print(f"{rid:26s} {t['gpus']:5d} {t['measured_per_gpu']:9,.0f} "
              + " ".join(f"{t[n]['per_gpu_ratio']:8.2f}" for n in names))
    summary = {n: {"median_abs_error": statistics.median(abs(t[n]["per_gpu_ratio"] - 1)
                                                         for t in table.values()),
                   "ratios": [t[n]["per_gpu_ratio"] for t in table.values()]} for n in names}
    for n, v in summary.items():
        print(f"{n:8s} median |error| {v['median_abs_error']:.1%}")
    save_result(out, "mlperf-fusion-ablation", {"csv": str(vs.DEFAULT_CSV.relative_to(ROOT)),
                                                "ladder": names},
                {"rows": table, "summary": summary})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
