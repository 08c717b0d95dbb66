"""Fit the efficiency of fused attention kernels to published decoder training runs (issue #11).

The single-GPU table (published_training.csv) has no fused attention: its transformers are
BERT's and timm's explicit softmax attention. The decoder rows of the scale-out table
(validation/published_scaling.csv, MosaicML's MPT-125M to 30B on 8 A100s at 512 to 65,536
tokens) do, and their error grows with the sequence length, which is where attention's share
of the step grows (quadratic in it, against the linear GEMMs). This script fits the one
parameter the shipped model lacks for them, ``attention`` (hardware/efficiency.py: flash
attention's fraction of the Tensor Core peak), with every other parameter as shipped, by
minimising the squared log error of per-GPU tokens/s over those rows; and reports the honest
number too: each model size predicted by a fit that never saw it (leave one model out).

The same stack reaches a different fraction of the peak on another architecture (its kernels
are written for Ampere's Tensor Core instructions, which a Hopper GPU runs at a fraction of its
own peak), so each architecture gets its own fit from that table's rows on it: ``--device
h100-sxm`` fits the H100 rows, whose value the Hopper presets carry (hardware/specs.py).

``--with-gemm`` fits cuBLAS's share too (``tensor_gemm``), jointly with attention. The shipped
``tensor_gemm`` comes from the single-GPU table, whose rows on Hopper parts are memory-bound
(BERT, ResNet-50: 70-77% of the H100's step in memory-bound kernels), so nothing there pins a
Hopper GEMM; the MPT rows are GEMM-bound at 512-2,048 tokens and attention-bound at 8,192 and
more, so the two parameters separate. On the A100 the joint fit is the check: its GEMM share
should come out near the single-GPU table's.

Usage: python benchmarks/fit_attention.py [--device NAME] [--table CSV] [--with-gemm] [OUT.json]
(default: a100-80gb -> benchmarks/results/attention-fit.json; another device NAME ->
benchmarks/results/attention-fit-NAME.json; ``--with-gemm`` adds -gemm to the name; about 6
minutes on 2 cores, 40 with ``--with-gemm``)
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE, DEVICE = "llm-foundry-mpt", "a100-80gb"


def default_out(device: str, with_gemm: bool = False) -> Path:
    suffix = ("" if device == DEVICE else f"-{device}") + ("-gemm" if with_gemm else "")
    return ROOT / f"benchmarks/results/attention-fit{suffix}.json"


BOUNDS, TOLERANCE = (0.10, 0.95), 0.002  # fraction of the Tensor Core peak
# tensor_gemm: its bracket, tolerance, and the window the attention search keeps around the
# last best attention while the GEMM share moves (widened when the best lands on its edge)
GEMM_BOUNDS, GEMM_TOLERANCE, WINDOW = (0.40, 0.95), 0.005, 0.03
# the held-out folds search within this of the full fit's GEMM share, at twice the tolerances
# (they only score the held-out model; about 50 scorings each instead of 130)
FOLD_GEMM_WINDOW = 0.04


def _loss(scored: list[dict]) -> float:
    return statistics.fmean(math.log(r["per_gpu_ratio"]) ** 2 for r in scored)


def golden(loss, lo: float, hi: float, tolerance: float) -> tuple[float, float]:
    """The x in [lo, hi] with the least ``loss`` (golden-section search: the loss has one
    minimum, the step time being monotone in each parameter) and that loss."""
    ratio = (math.sqrt(5) - 1) / 2
    x1, x2 = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    f1, f2 = loss(x1), loss(x2)
    while hi - lo > tolerance:
        if f1 <= f2:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - ratio * (hi - lo)
            f1 = loss(x1)
        else:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + ratio * (hi - lo)
            f2 = loss(x2)
    return (x1, f1) if f1 <= f2 else (x2, f2)


def fit(captured: list[tuple], score, base) -> tuple[float, list[dict]]:
    """The ``attention`` in BOUNDS with the least loss over ``captured``, and its rows."""
    def loss(a):
        return _loss(score(captured, dataclasses.replace(base, attention=a)))

    best = round(golden(loss, *BOUNDS, TOLERANCE)[0], 3)
    return best, score(captured, dataclasses.replace(base, attention=best))


def fit_with_gemm(captured: list[tuple], score, base, gemm_bounds=GEMM_BOUNDS,
                  start: float = 0.3, coarse: int = 1) -> tuple[float, float, list[dict]]:
    """``tensor_gemm`` and ``attention`` together: a golden-section search over the GEMM share
    whose loss is the least over attention (its own search, in a window around the last best:
    the two trade against each other along a valley, so one parameter at a time would zigzag).
    ``coarse`` multiplies both tolerances. Returns (tensor_gemm, attention, rows)."""
    centre, found = start, {}  # the last best attention, and the best at each GEMM share

    def profile(g):
        nonlocal centre

        def loss(a):
            return _loss(score(captured, dataclasses.replace(base, tensor_gemm=g, attention=a)))

        while True:
            lo, hi = max(BOUNDS[0], centre - WINDOW), min(BOUNDS[1], centre + WINDOW)
            a, value = golden(loss, lo, hi, TOLERANCE * coarse)
            centre = a
            at_edge = (a - lo < 2 * TOLERANCE * coarse and lo > BOUNDS[0]) or (
                hi - a < 2 * TOLERANCE * coarse and hi < BOUNDS[1])
            if not at_edge:
                found[g] = a
                return value

    g, _ = golden(profile, *gemm_bounds, GEMM_TOLERANCE * coarse)
    g = round(g, 3)
    profile(g)
    attention = round(found[g], 3)
    return g, attention, score(captured, dataclasses.replace(base, tensor_gemm=g,
                                                             attention=attention))


def print_summary(summary: dict, names: tuple[str, ...]) -> None:
    """One line per named block of ``summary`` (each a ``_stats`` dict)."""
    for name in names:
        s = summary[name]
        print(f"{name:18s} {s['rows']} rows: median |error| {s['median_abs_error']:.1%} "
              f"(pred/meas {s['median_ratio']:.2f}), worst {s['max_abs_error']:.1%}")


def _stats(rows: list[dict], key: str = "per_gpu_ratio") -> dict:
    errors = [abs(r[key] - 1) for r in rows]
    return {"rows": len(rows), "median_abs_error": statistics.median(errors),
            "median_ratio": statistics.median(r[key] for r in rows),
            "max_abs_error": max(errors)}


def main(argv: list[str]) -> int:
    from rich.progress import Progress

    from dlperf.hardware.efficiency import FITTED
    from dlperf.provenance import save_result

    import argparse

    parser = argparse.ArgumentParser(description="Fit fused attention's efficiency to the "
                                     "MPT rows of one device.")
    parser.add_argument("--device", default=DEVICE, help="the rows' device preset "
                        f"(default {DEVICE})")
    parser.add_argument("--table", type=Path, default=None,
                        help="the rows' table (default: validation/published_scaling.csv)")
    parser.add_argument("--with-gemm", action="store_true",
                        help="fit tensor_gemm jointly with attention")
    parser.add_argument("out", nargs="?", type=Path, help="result JSON")
    args = parser.parse_args(argv)
    device = args.device
    out_path = args.out or default_out(device, args.with_gemm)
    from dlperf.provenance import load_sibling

    vs = load_sibling(__file__, "validate_scaling")
    source_csv = args.table or vs.DEFAULT_CSV
    rows = [r for r in vs.read_rows(source_csv)
            if r["source"] == SOURCE and r["device"] == device]
    if not rows:
        raise SystemExit(f"--device {device}: no {SOURCE} rows on that device in "
                         f"{source_csv.name}")
    with Progress(transient=True) as bar:
        task = bar.add_task(f"capturing {len(rows)} decoder rows", total=None)
        captured = vs.capture(rows)
        bar.update(task, completed=1)
    # every parameter as shipped but the one fitted (a preset's own attention is not applied:
    # score() runs the base given here)
    base = dataclasses.replace(FITTED, attention=None)
    before = vs.score(captured, base)  # attention as a GEMM (the shipped model until now)
    gemm = FITTED.tensor_gemm
    if args.with_gemm:
        gemm, attention, fitted = fit_with_gemm(captured, vs.score, base)
    else:
        attention, fitted = fit(captured, vs.score, base)
    held_out = []
    models = sorted({r["model"] for r in rows})
    for model in models:
        train = [c for c in captured if c[0]["model"] != model]
        test = [c for c in captured if c[0]["model"] == model]
        g = gemm
        if args.with_gemm:  # each fold searches near the full fit (a window, for time)
            g, a, _ = fit_with_gemm(train, vs.score, base, start=attention, coarse=2,
                                    gemm_bounds=(max(GEMM_BOUNDS[0], gemm - FOLD_GEMM_WINDOW),
                                                 min(GEMM_BOUNDS[1], gemm + FOLD_GEMM_WINDOW)))
        else:
            a, _ = fit(train, vs.score, base)
        held_out += [{**r, "fold_attention": a, "fold_tensor_gemm": g}
                     for r in vs.score(test, dataclasses.replace(base, tensor_gemm=g,
                                                                 attention=a))]
    by_id = {r["id"]: r for r in held_out}
    table = []
    for b, f in zip(before, fitted):
        h = by_id[b["id"]]
        table.append({"id": b["id"], "model": b["model"], "seq_len": b["image_size"],
                      "activation_checkpointing": b["activation_checkpointing"],
                      "measured_tokens_per_s": b["measured_per_gpu"],
                      "ratio_attention_as_gemm": b["per_gpu_ratio"],
                      "ratio_fitted": f["per_gpu_ratio"], "ratio_held_out": h["per_gpu_ratio"],
                      "held_out_attention": h["fold_attention"],
                      "held_out_tensor_gemm": h["fold_tensor_gemm"]})
    summary = {"attention": attention, "attention_as_gemm": FITTED.tensor_gemm,
               "tensor_gemm": gemm, "tensor_gemm_fitted": args.with_gemm,
               "held_out_tensor_gemm_range": [min(r["fold_tensor_gemm"] for r in held_out),
                                              max(r["fold_tensor_gemm"] for r in held_out)],
               "before": _stats(before), "in_sample": _stats(fitted),
               "held_out_by_model": _stats(held_out),
               "held_out_attention_range": [min(r["fold_attention"] for r in held_out),
                                            max(r["fold_attention"] for r in held_out)]}
    long_ids = {r["id"] for r in table if r["seq_len"] >= 8192}
    summary["seq_8192_and_longer"] = {
        "before": _stats([r for r in before if r["id"] in long_ids]),
        "held_out_by_model": _stats([r for r in held_out if r["id"] in long_ids])}
    print(f"{'row':28s} {'seq':>6s} {'AC':>3s} {'as GEMM':>8s} {'fitted':>7s} {'held out':>8s}")
    for r in table:
        print(f"{r['id']:28s} {r['seq_len']:6d} {'yes' if r['activation_checkpointing'] else '':>3s}"
              f" {r['ratio_attention_as_gemm']:8.2f} {r['ratio_fitted']:7.2f}"
              f" {r['ratio_held_out']:8.2f}")
    print_summary(summary, ("before", "in_sample", "held_out_by_model"))
    print(f"attention = {attention} of the Tensor Core peak (as a GEMM: {FITTED.tensor_gemm}); "
          f"held-out folds {summary['held_out_attention_range']}")
    if args.with_gemm:
        print(f"tensor_gemm = {gemm} (the single-GPU table's: {FITTED.tensor_gemm}); held-out "
              f"folds {summary['held_out_tensor_gemm_range']}")
    save_result(out_path, "attention-fit", {"source": SOURCE, "device": device,
                                            "with_gemm": args.with_gemm,
                                            "gemm_bounds": GEMM_BOUNDS,
                                            "gemm_tolerance": GEMM_TOLERANCE,
                                            "table": str(source_csv.relative_to(ROOT)
                                                         if source_csv.is_relative_to(ROOT)
                                                         else source_csv),
                                            "bounds": BOUNDS, "tolerance": TOLERANCE},
                {"summary": summary, "rows": table})
    print(f"Wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
