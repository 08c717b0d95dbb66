"""dlperf's memory per GPU against the peaks published multi-GPU runs logged (issue #14).

For each row of validation/published_memory.csv: its run (the row of published_scaling.csv
with that id) analysed and scaled out as validate_scaling.py does, and ``scale_out``'s
``memory_per_gpu`` (the sharded weights, gradients and optimizer state, FSDP's gathered units,
the activations at the step's peak: dlperf/analysis/liveness.py) beside the peak the source
logged, and the same at rest (the activations autograd keeps at the end of the forward). A
logged peak is PyTorch's caching allocator's reservation at the step's worst moment: the
tensors alive then (which the peak follows: the loss's logits in FP32 and their gradient, a
checkpointed block's recompute) plus what dlperf does not count (the allocator's cached,
not yet reused blocks and fragmentation, FSDP's unsharded gradient buffers beside the
reduce-scatter, workspaces, the CUDA context). The ratio says how far dlperf's number is from
that peak, and the differences between rows (8 against 128 GPUs: the sharded state; eager
against compiled; BF16 against float8) say what each part is worth, measured and predicted.

Usage: python benchmarks/validate_memory.py [OUT.json]
(default benchmarks/results/validation-memory.json; about a minute on 2 cores)
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEMORY_CSV = ROOT / "benchmarks/validation/published_memory.csv"
SCALING_CSV = ROOT / "benchmarks/validation/published_scaling.csv"
DEFAULT_OUT = ROOT / "benchmarks/results/validation-memory.json"
GIB = 2 ** 30
KINDS = ("reserved",)


def read_measured(path: Path) -> dict[str, dict]:
    """id -> {measured_gib, kind}, checked."""
    from dlperf.provenance import load_sibling

    out = {}
    for row in load_sibling(__file__, "validate_published").commented_csv(path):
        if row["kind"] not in KINDS:
            raise SystemExit(f"{path}: {row['id']}: kind must be one of {', '.join(KINDS)}")
        out[row["id"]] = {"measured_gib": float(row["measured_gib"]), "kind": row["kind"]}
    return out


def differences(rows: list[dict]) -> list[dict]:
    """Each pair of rows of one source that differ in one setting (GPUs, compile, float8):
    the measured and predicted change of the peak, in GiB."""
    by_id = {r["id"]: r for r in rows}
    pairs = []
    for a_id, b_id, what in (
            ("tt-llama3-8b-h100-x8", "tt-llama3-8b-h100-x128", "8 -> 128 GPUs (eager)"),
            ("tt-llama3-8b-h100-x8-compile", "tt-llama3-8b-h100-x128-compile",
             "8 -> 128 GPUs (compiled)"),
            ("tt-llama3-8b-h100-x8", "tt-llama3-8b-h100-x8-compile", "eager -> compiled"),
            ("tt-llama3-8b-h100-x8-compile", "tt-llama3-8b-h100-x8-float8",
             "BF16 -> float8 (compiled)"),
            ("tao-llama3-8b-h100-x8-compile", "tao-llama3-8b-h100-x8-rowwise",
             "BF16 -> rowwise float8")):
        if a_id in by_id and b_id in by_id:
            a, b = by_id[a_id], by_id[b_id]
            pairs.append({"from": a_id, "to": b_id, "what": what,
                          "measured_gib": b["measured_gib"] - a["measured_gib"],
                          "predicted_gib": b["predicted_gib"] - a["predicted_gib"]})
    return pairs


def main(argv: list[str]) -> int:
    from dlperf.provenance import load_sibling, save_result

    out_path = Path(argv[0]) if argv else DEFAULT_OUT
    vs = load_sibling(__file__, "validate_scaling")
    measured = read_measured(MEMORY_CSV)
    rows = [r for r in vs.read_rows(SCALING_CSV) if r["id"] in measured]
    missing = set(measured) - {r["id"] for r in rows}
    if missing:
        raise SystemExit(f"{MEMORY_CSV}: no row of {SCALING_CSV.name} has id "
                         f"{', '.join(sorted(missing))}")
    results = []
    for r in vs.score(vs.capture(rows)):
        mem = r["memory_per_gpu"]
        parts = {k.removesuffix("_bytes") + "_gib": v / GIB for k, v in mem.items()
                 if k.endswith("_bytes") and k not in ("total_bytes", "sharded_state_bytes",
                                                       "peak_bytes")}
        got = measured[r["id"]]["measured_gib"]
        # at the step's peak (liveness.with_peak), and at rest (the end of the forward)
        peak, rest = mem.get("peak_bytes", mem["total_bytes"]) / GIB, mem["total_bytes"] / GIB
        results.append({"id": r["id"], "source": r["source"], "gpus": r["gpus"],
                        # tokens a GPU's step processes (the transients grow with them)
                        "tokens": r["batch"] * r["image_size"] * r["grad_accum"],
                        **measured[r["id"]], "predicted_gib": peak, "ratio": peak / got,
                        "missing_gib": got - peak, "peak_at": mem.get("peak_at"),
                        "at_rest_gib": rest, "at_rest_ratio": rest / got, "parts": parts})
    pairs = differences(results)
    print(f"{'id':34s} GPUs  measured  predicted  ratio  missing   at rest  ratio   (GiB)")
    for r in results:
        print(f"{r['id']:34s} {r['gpus']:4d}  {r['measured_gib']:8.1f}  {r['predicted_gib']:9.1f}"
              f"  {r['ratio']:5.2f}  {r['missing_gib']:7.1f}  {r['at_rest_gib']:8.1f}"
              f"  {r['at_rest_ratio']:5.2f}")
    ratios = [r["ratio"] for r in results]
    summary = {"rows": len(results), "median_ratio": statistics.median(ratios),
               "min_ratio": min(ratios), "max_ratio": max(ratios),
               "median_missing_gib": statistics.median(r["missing_gib"] for r in results),
               "median_missing_mb_per_token": statistics.median(
                   r["missing_gib"] * GIB / 1e6 / r["tokens"] for r in results),
               "median_at_rest_ratio": statistics.median(r["at_rest_ratio"] for r in results)}
    print(f"predicted peak / measured peak: median {summary['median_ratio']:.2f} "
          f"({summary['min_ratio']:.2f}-{summary['max_ratio']:.2f}), median "
          f"{summary['median_missing_gib']:.1f} GiB ({summary['median_missing_mb_per_token']:.2f}"
          f" MB a token) not predicted; at rest {summary['median_at_rest_ratio']:.2f}")
    print("differences between runs (GiB), measured and predicted:")
    for p in pairs:
        print(f"  {p['what']:28s} measured {p['measured_gib']:+6.1f}  predicted "
              f"{p['predicted_gib']:+6.1f}")
    save_result(out_path, "validation-memory",
                {"memory_csv": str(MEMORY_CSV.relative_to(ROOT)),
                 "scaling_csv": str(SCALING_CSV.relative_to(ROOT))},
                {"rows": results, "summary": summary, "differences": pairs})
    print(f"Wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
