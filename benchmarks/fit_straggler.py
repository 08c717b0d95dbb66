"""Fit the spread of one GPU's step time (scaling.STEP_CV) to the published multi-GPU table.

Synchronous data parallel waits every step for its slowest GPU (dlperf/analysis/scaling.py,
"Stragglers"): on N GPUs a step of t lasts t (1 + cv e(N)). One parameter, ``cv``, is chosen
on a grid to minimise the median |error| of the scale-out model's own measures over the clean
rows of benchmarks/validation/published_scaling.csv:

- scaling: N-GPU per-GPU throughput over the same system's one GPU, predicted over measured;
- relative scaling: each GPU count's per-GPU rate over the smallest count's of the same run.

Both are free of the single-GPU model's error (it cancels). Held out by source: for each source
the cv fitted to the other sources scores that source's rows. The flagged rows (assumed
networks, fused stacks, assumed decode rates) are not fitted; their scaling and relative
scaling at the fitted cv are reported beside cv = 0 as an out-of-sample check.

Usage: python benchmarks/fit_straggler.py [OUT.json]
(default benchmarks/results/straggler-fit.json; ~5 minutes: one capture per row, then the
scale-out model at every grid point)
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks/results/straggler-fit.json"
GRID = tuple(round(i * 0.0025, 4) for i in range(17))  # 0 .. 4%


def errors(rows: list[dict], clean: bool) -> list[tuple[str, str, float]]:
    """(source, row id, |error|) of every scaling and relative-scaling figure of the clean (or
    the flagged) rows."""
    out = []
    for r in rows:
        if (r["flag"] == "clean") != clean:
            continue
        for key in ("efficiency_ratio", "relative_ratio"):
            if r.get(key) is not None:
                out.append((r["source"], f"{r['id']}:{key}", abs(r[key] - 1)))
    return out


def best(table: dict[float, list[tuple[str, str, float]]], keep) -> float:
    """The grid's cv with the lowest median |error| over the figures ``keep`` accepts (the
    smallest such cv on a tie)."""
    return min(GRID, key=lambda cv: (statistics.median(e for s, _, e in table[cv] if keep(s)),
                                     cv))


def main(argv: list[str]) -> int:
    from tqdm import tqdm

    from dlperf.provenance import load_sibling, save_result

    vs = load_sibling(__file__, "validate_scaling")

    out = Path(argv[0]) if argv else DEFAULT_OUT
    rows = vs.read_rows(vs.DEFAULT_CSV)
    captured = vs.capture(rows)
    clean, flagged = {}, {}
    for cv in tqdm(GRID, desc="step spread", unit="cv"):
        scored = vs.score(captured, step_cv=cv)
        vs.add_relative_scaling(scored)
        clean[cv], flagged[cv] = errors(scored, True), errors(scored, False)

    fitted = best(clean, lambda s: True)
    sources = sorted({s for s, _, _ in clean[0.0]})
    held = {}
    for source in sources:
        cv = best(clean, lambda s, source=source: s != source)
        held[source] = {"cv": cv, "figures": sum(1 for s, _, _ in clean[cv] if s == source),
                        "median_abs_error": statistics.median(
                            e for s, _, e in clean[cv] if s == source),
                        "median_abs_error_cv0": statistics.median(
                            e for s, _, e in clean[0.0] if s == source)}
    held_errors = [e for source in sources
                   for s, _, e in clean[held[source]["cv"]] if s == source]

    def by_source(table):
        return {s: statistics.median(e for t, _, e in table if t == s)
                for s in sorted({t for t, _, _ in table})}

    result = {
        "grid": [{"cv": cv, "clean_median_abs_error": statistics.median(e for *_, e in clean[cv]),
                  "flagged_median_abs_error": statistics.median(e for *_, e in flagged[cv])}
                 for cv in GRID],
        "fitted_cv": fitted,
        "clean": {"figures": len(clean[fitted]),
                  "median_abs_error_cv0": statistics.median(e for *_, e in clean[0.0]),
                  "median_abs_error": statistics.median(e for *_, e in clean[fitted]),
                  "held_out_by_source": held,
                  "held_out_median_abs_error": statistics.median(held_errors),
                  "by_source_cv0": by_source(clean[0.0]),
                  "by_source": by_source(clean[fitted])},
        "flagged": {"figures": len(flagged[fitted]),
                    "median_abs_error_cv0": statistics.median(e for *_, e in flagged[0.0]),
                    "median_abs_error": statistics.median(e for *_, e in flagged[fitted]),
                    "by_source_cv0": by_source(flagged[0.0]),
                    "by_source": by_source(flagged[fitted])},
    }
    c = result["clean"]
    print(f"fitted cv {fitted:.2%}: clean scaling + relative scaling, {c['figures']} figures, "
          f"median |error| {c['median_abs_error_cv0']:.2%} at cv 0 -> {c['median_abs_error']:.2%}"
          f"; held out by source {c['held_out_median_abs_error']:.2%}")
    for source, h in held.items():
        print(f"  {source:36s} cv {h['cv']:.2%}  {h['figures']:3d} figures  "
              f"{h['median_abs_error_cv0']:.2%} -> {h['median_abs_error']:.2%} (held out)")
    f = result["flagged"]
    print(f"flagged rows (not fitted): {f['figures']} figures, {f['median_abs_error_cv0']:.2%} "
          f"-> {f['median_abs_error']:.2%}")
    for source, e in f["by_source"].items():
        print(f"  {source:36s} {f['by_source_cv0'][source]:.2%} -> {e:.2%}")
    save_result(out, "straggler-fit", {"csv": str(vs.DEFAULT_CSV.relative_to(ROOT)),
                                       "grid": list(GRID)}, result)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
