"""How much of the compiled stacks' gap a fusion model could close: bounds, not a model.

The scaling table's flagged `compiled` (KempnerForge, torch.compile, H200) and `jit-fused`
(NVIDIA's BERT pre-training, NVFuser) rows run kernels the eager capture counts one by one, and
are predicted 0.59-0.94x. Before building a model of torch.compile's fusion, this bounds what
one could buy, per row, from one GPU's predicted micro-batch (the sum of its kernels' times):

* ``producer``: every memory-bound elementwise kernel folded into the kernel before it (what
  the `[fusion]` finding estimates: its intermediate neither written nor read back);
* ``pointwise``: every memory-bound elementwise kernel gone (an upper bound for pointwise
  fusion: chains fused into the GEMMs' epilogues and prologues);
* ``math``: every memory-bound kernel gone (norms, softmax, casts too): no fusion can beat it.

Each scales the row's predicted per-GPU rate by the micro-batch's old time over its new one
(the scale-out losses kept as they are), with the shipped efficiency and, on Hopper, with the
A100's GEMM and attention shares (``tensor_gemm`` 0.779, ``attention`` 0.313) as a newer stack's
stand-in. A bound below the measured rate says fusion alone cannot close the gap.

Usage: python benchmarks/experiment_compile_bounds.py [OUT.json]
(default benchmarks/results/experiment-compile-bounds.json; ~2 minutes)
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks/results/experiment-compile-bounds.json"
FLAGS = ("compiled", "jit-fused")


def bounds(predictions, repredict, fusible: frozenset) -> dict:
    """One micro-batch's kernel time (s) as predicted and under each bound (module
    docstring); ``repredict(cost)`` re-times a cost (rules._repredict)."""
    from dlperf.analysis.rules import fused_into_producer

    total = sum(p.time_s for p in predictions)
    producer = pointwise = memory = 0.0
    for p in predictions:
        if p.bound != "memory" or not p.cost.kernels:
            continue
        memory += p.time_s
        if p.cost.op in fusible:
            pointwise += p.time_s
            producer += p.time_s - repredict(fused_into_producer(p.cost)).time_s
    return {"predicted": total, "producer": total - producer,
            "pointwise": total - pointwise, "math": total - memory}


def main(argv: list[str]) -> int:
    from tqdm import tqdm

    from dlperf.analysis.api import predict_on
    from dlperf.analysis.roofline import predict
    from dlperf.analysis.rules import FUSIBLE_POINTWISE
    from dlperf.hardware.efficiency import FITTED, efficiency_for
    from dlperf.hardware.specs import get_device
    from dlperf.provenance import load_sibling, save_result

    vs = load_sibling(__file__, "validate_scaling")
    out = Path(argv[0]) if argv else OUT
    rows = [r for r in vs.read_rows(vs.DEFAULT_CSV) if r["flag"] in FLAGS]
    captured = vs.capture(rows)
    results = []
    for (row, cfg, costs, uncounted, seconds, params) in tqdm(captured, desc="rows"):
        spec = get_device(row["device"])
        shipped = efficiency_for(spec)
        variants = {"shipped": shipped}
        if shipped.tensor_gemm != FITTED.tensor_gemm:  # a preset with its own (Hopper) shares
            variants["a100-shares"] = dataclasses.replace(
                shipped, tensor_gemm=FITTED.tensor_gemm, attention=FITTED.attention)
        scored = {}
        for name, eff in variants.items():
            analysis = predict_on(costs, uncounted, cfg, spec, seconds, efficiency=eff)
            per_gpu = vs.score([(row, cfg, costs, uncounted, seconds, params)],
                               efficiency=eff)[0]["predicted_per_gpu"]
            b = bounds(analysis.predictions,
                       lambda c: predict(c, spec, tf32=cfg.tf32, efficiency=eff),
                       FUSIBLE_POINTWISE)
            scored[name] = {k: per_gpu * b["predicted"] / t / row["measured_per_gpu"]
                            for k, t in b.items()}
            scored[name]["micro_batch_s"] = b
        results.append({"id": row["id"], "flag": row["flag"], "device": row["device"],
                        "precision": row["precision"],
                        "measured_per_gpu": row["measured_per_gpu"],
                        "predicted_over_measured": scored})
        line = "  ".join(f"{n}: " + " / ".join(f"{s[k]:.2f}" for k in
                                                ("predicted", "producer", "pointwise", "math"))
                         for n, s in scored.items())
        print(f"{row['id']:38s} {line}")
    save_result(out, "experiment-compile-bounds",
                {"flags": list(FLAGS), "bounds": ["predicted", "producer", "pointwise", "math"]},
                {"rows": results})
    print(f"Wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
