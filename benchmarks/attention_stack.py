"""Fused attention on a 2024 PyTorch stack: torchtitan's Llama rows against the shipped fit.

The shipped ``attention`` fraction (0.337 of the Tensor Core peak, benchmarks/fit_attention.py)
was fitted to MosaicML's MPT runs of 2023 (flash attention v1 / triton kernels). torchtitan's
Llama rows (validation/published_scaling.csv, source torchtitan-llama-a100: FSDP2 on 64 A100s,
PyTorch's scaled_dot_product_attention, whose CUDA kernel has been FlashAttention-2 since
PyTorch 2.2) ran a newer kernel. This script scores those rows at the shipped fraction, then
finds the fraction that fits them (the same golden-section search as fit_attention.py, every
other parameter as shipped) and, because that is a fit to the rows it is judged on, each row
again with the fraction fitted to the other rows only (leave one row out).

The rows carry the flag network-assumed (the source names no network between nodes); the
H100 rows of the same source (flag hbm2e-500w: a power-limited HBM2e part no preset models)
are left out.

Usage: python benchmarks/attention_stack.py [OUT.json]
(default benchmarks/results/attention-stack.json; about 2 minutes on 2 cores)
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks/results/attention-stack.json"
SOURCE, DEVICE = "torchtitan-llama-a100", "a100-80gb"


def main(argv: list[str]) -> int:
    from dlperf.hardware.efficiency import FITTED
    from dlperf.provenance import load_sibling, save_result

    fa = load_sibling(__file__, "fit_attention")
    vs = load_sibling(__file__, "validate_scaling")
    out_path = Path(argv[0]) if argv else DEFAULT_OUT
    rows = [r for r in vs.read_rows(vs.DEFAULT_CSV)
            if r["source"] == SOURCE and r["device"] == DEVICE]
    captured = vs.capture(rows)
    shipped = vs.score(captured)
    attention, fitted = fa.fit(captured, vs.score, FITTED)
    held_out = []
    for i in range(len(captured)):
        train = captured[:i] + captured[i + 1:]
        a, _ = fa.fit(train, vs.score, FITTED)
        held_out += [{**r, "fold_attention": a}
                     for r in vs.score(captured[i:i + 1], dataclasses.replace(FITTED, attention=a))]
    table = [{"id": s["id"], "model": s["model"], "seq_len": s["image_size"],
              "checkpointing": (s["checkpoint_policy"] if s["activation_checkpointing"]
                                else "none"),
              "measured_tokens_per_s": s["measured_per_gpu"],
              "ratio_shipped": s["per_gpu_ratio"], "ratio_fitted": f["per_gpu_ratio"],
              "ratio_held_out": h["per_gpu_ratio"], "held_out_attention": h["fold_attention"]}
             for s, f, h in zip(shipped, fitted, held_out)]
    summary = {"shipped_attention": FITTED.attention, "fitted_attention": attention,
               "shipped": fa._stats(shipped), "in_sample": fa._stats(fitted),
               "held_out_by_row": fa._stats(held_out),
               "held_out_attention_range": [min(r["fold_attention"] for r in held_out),
                                            max(r["fold_attention"] for r in held_out)]}
    print(f"{'row':30s} {'seq':>6s} {'AC':>12s} {'shipped':>8s} {'fitted':>7s} {'held out':>8s}")
    for r in table:
        print(f"{r['id']:30s} {r['seq_len']:6d} {r['checkpointing']:>12s} "
              f"{r['ratio_shipped']:8.2f} {r['ratio_fitted']:7.2f} {r['ratio_held_out']:8.2f}")
    fa.print_summary(summary, ("shipped", "in_sample", "held_out_by_row"))
    print(f"attention = {attention} of the Tensor Core peak (shipped {FITTED.attention}); "
          f"held-out folds {summary['held_out_attention_range']}")
    save_result(out_path, "attention-stack", {"source": SOURCE, "device": DEVICE,
                                              "bounds": fa.BOUNDS, "tolerance": fa.TOLERANCE},
                {"summary": summary, "rows": table})
    print(f"Wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
