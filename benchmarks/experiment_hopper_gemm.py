"""An experiment: the Hopper presets' GEMM share (0.578 of the Tensor Core peak, fitted to
MosaicML's 2023 FSDP runs on H100s) against what the lent H200 sustained alone (0.699, torch
2.11: scripts/device_check.sh step 0b), scored on every published Hopper row, single-GPU and
multi-GPU, source by source (every other parameter as shipped; the shares in between too).

Why: the runs on stacks newer than MosaicML's are predicted too slow on Hopper (Lambda's
BERT-large on one H100 or H200, the H200 FSDP runs of Trainy and KempnerForge), where the
2023-2024 multi-GPU runs on H100s fit 0.578. A share keyed to the software stack would need
the sources to split by stack and not by something else (the GPU's power limit, collectives
beside the GEMMs); this script lays the rows out so that can be read.

Usage: python benchmarks/experiment_hopper_gemm.py [OUT.json]  (about 10 minutes on 2 cores)
Writes benchmarks/results/experiment-hopper-gemm.json.

The same scoring for another family of presets and another share: ``--devices v100-sxm2,...
--shares 0.779,0.70 [--parameter cuda_core] OUT.json`` (the first share should be the
shipped one; results/experiment-volta-gemm.json is the V100's, 2026-12-05).
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks/results/experiment-hopper-gemm.json"
HOPPER = ("h100-sxm", "h100-pcie", "h200", "gh200")
SHARES = (0.578, 0.64, 0.699)  # shipped, between, the lent H200 alone


def with_gemm(original: dict, share: float, devices=HOPPER,
              parameter: str = "tensor_gemm") -> dict:
    """``devices``' presets with ``parameter`` (cuBLAS's Tensor Core GEMMs by default) at
    ``share`` (the rest of each untouched)."""
    return {name: dataclasses.replace(original[name],
                                      efficiency={**original[name].efficiency,
                                                  parameter: share})
            for name in devices}


def main(argv: list[str]) -> int:
    import argparse

    from dlperf.hardware import specs
    from dlperf.hardware.track_record import workload_class
    from dlperf.provenance import load_sibling, save_result

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", type=Path, default=DEFAULT_OUT)
    p.add_argument("--devices", default=",".join(HOPPER),
                   help="comma-separated presets whose share moves [the Hopper ones]")
    p.add_argument("--shares", default=",".join(map(str, SHARES)),
                   help="comma-separated shares, the shipped one first [0.578,0.64,0.699]")
    p.add_argument("--parameter", default="tensor_gemm", choices=("tensor_gemm", "cuda_core"),
                   help="the efficiency parameter that moves [tensor_gemm]")
    args = p.parse_args(argv)
    devices = tuple(d.strip() for d in args.devices.split(","))
    shares = tuple(float(x) for x in args.shares.split(","))
    unknown = [d for d in devices if d not in specs.PRESETS]
    if unknown:
        p.error(f"--devices: unknown preset(s) {', '.join(unknown)} (dlperf devices)")
    vs = load_sibling(__file__, "validate_scaling")
    vp = load_sibling(__file__, "validate_published")
    out_path = args.out
    multi = [r for r in vs.read_rows(vs.DEFAULT_CSV) if r["device"] in devices]
    single = [r for r in vp.read_rows(vp.DEFAULT_CSV) if r["device"] in devices]
    multi_captured = vs.capture(multi)
    single_captured = vp.capture_rows(single)
    original = dict(specs.PRESETS)
    ratios: dict[float, dict[str, float]] = {}
    try:
        for share in shares:
            specs.PRESETS.update(with_gemm(original, share, devices, args.parameter))
            got = {r["id"]: r["per_gpu_ratio"] for r in vs.score(multi_captured)}
            got.update({r["id"]: r["ratio"]
                        for r in vp.predict_rows(single, captured=single_captured)})
            ratios[share] = got
    finally:
        specs.PRESETS.clear()
        specs.PRESETS.update(original)
    # the track record's workload classes (the shares move GEMMs: most of a transformer's
    # step, little of a CNN's, whose convolutions have their own share)
    rows = ([{"id": r["id"], "table": "scaling", "source": r["source"], "device": r["device"],
              "gpus": r["gpus"], "flag": r["flag"], "class": workload_class(cfg)}
             for r, cfg, *_ in multi_captured]
            + [{"id": r["id"], "table": "single", "source": r["source"], "device": r["device"],
                "gpus": 1, "flag": r["flag"], "class": workload_class(cfg)}
               for r, cfg, *_ in single_captured])
    for r in rows:
        r.update({f"ratio_{s}": ratios[s][r["id"]] for s in shares})
    by_source: dict[str, dict] = {}
    for key in sorted({(r["table"], r["source"]) for r in rows}):
        members = [r for r in rows if (r["table"], r["source"]) == key]
        by_source[f"{key[0]} {key[1]}"] = {
            "rows": len(members), "devices": sorted({r["device"] for r in members}),
            "flags": sorted({r["flag"] for r in members}),
            **{f"median_ratio_{s}": statistics.median(r[f"ratio_{s}"] for r in members)
               for s in shares},
            **{f"median_abs_error_{s}": statistics.median(abs(r[f"ratio_{s}"] - 1)
                                                          for r in members)
               for s in shares}}
    print(f"{'source':52s} {'rows':>4s}  " + "  ".join(f"{s:>13}" for s in shares))
    for name, g in by_source.items():
        print(f"{name[:52]:52s} {g['rows']:4d}  " + "  ".join(
            f"{g[f'median_ratio_{s}']:.3f} ({g[f'median_abs_error_{s}']:.1%})" for s in shares))
    summary = {}
    groups = [("all", lambda r: True), ("clean", lambda r: r["flag"] == "clean")]
    groups += [(f"class {c}", lambda r, c=c: r["class"] == c)
               for c in sorted({r["class"] for r in rows})]
    for group, pick in groups:
        members = [r for r in rows if pick(r)]
        summary[group] = {"rows": len(members), **{
            f"median_abs_error_{s}": statistics.median(abs(r[f"ratio_{s}"] - 1)
                                                       for r in members) for s in shares}}
        print(f"{group}: {len(members)} rows, median |error| " + ", ".join(
            f"{s}: {summary[group][f'median_abs_error_{s}']:.1%}" for s in shares))
    save_result(out_path, out_path.stem,
                {"shares": list(shares), "devices": list(devices), "parameter": args.parameter,
                 "tables": [str(vs.DEFAULT_CSV.relative_to(ROOT)),
                            str(vp.DEFAULT_CSV.relative_to(ROOT))]},
                {"by_source": by_source, "summary": summary, "rows": rows})
    print(f"Wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
