"""Fit MXNet's device-kvstore cost per engine operation (analysis/scaling.py,
``MXNET_KVSTORE_OP_S``) to the published runs that used it, and check it on the one held out.

The rows: benchmarks/validation/published_scaling.csv's ``kvstore`` column. Fitted on the
rows flagged ``kvstore-fit`` (NVIDIA's MXNet ResNet-50 README, first version, mxnet-18.12 on
a DGX-1: 4 and 8 V100s, fp16 at batch 208 and FP32 at batch 96, each against the same
README's one-GPU rate); held out: the record blog's DGX-1 (7,850 img/s on 8 V100s against
1,075 on one), the run issue #14 asks dlperf to predict within 5%.

What going from one GPU to n adds to a step, in ms (validate_scaling.added_ms), is measured
for each row; dlperf predicts it with the kvstore's operations at no cost (its copies at the
node's bandwidth, the wait for the slowest GPU): the rest is operations x cost, fitted by
least squares through the origin over the fit rows (one parameter).

Usage: python benchmarks/fit_kvstore.py [OUT.json]
(default: benchmarks/results/kvstore-fit.json; ~1 minute)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks/results/kvstore-fit.json"
FIT_FLAG = "kvstore-fit"


def fit(rows: list[dict]) -> float:
    """The cost per operation (s) that least-squares fits ``rows`` ({"ops", "residual_ms"}):
    sum(x y) / sum(x^2), x the operations, y the added ms the rest of the model leaves."""
    sxx = sum(r["ops"] ** 2 for r in rows)
    if not sxx:
        raise ValueError("no kvstore operations to fit: give rows on more than one GPU")
    return sum(r["ops"] * r["residual_ms"] for r in rows) / sxx / 1e3


def main(argv: list[str]) -> int:
    from dlperf.analysis.scaling import MXNET_KVSTORE_OP_S
    from dlperf.provenance import load_sibling, save_result

    vs = load_sibling(__file__, "validate_scaling")
    rows = [r for r in vs.read_rows(vs.DEFAULT_CSV) if r["kvstore"] == "device"]
    captured = vs.capture(rows)
    free = vs.score(captured, kvstore_op_s=0.0)
    table = []
    for r in free:
        if r["measured_added_ms"] is None:
            continue
        table.append({"id": r["id"], "flag": r["flag"], "gpus": r["gpus"], "batch": r["batch"],
                      "precision": r["precision"], "ops": r["kvstore_ops"],
                      "measured_added_ms": r["measured_added_ms"],
                      "predicted_added_without_ops_ms": r["predicted_added_ms"],
                      "residual_ms": r["measured_added_ms"] - r["predicted_added_ms"]})
    train = [t for t in table if t["flag"] == FIT_FLAG]
    op_s = fit(train)
    scored = {r["id"]: r for r in vs.score(captured, kvstore_op_s=op_s)}
    for t in table:
        r = scored[t["id"]]
        t.update(role="fit" if t["flag"] == FIT_FLAG else "held out",
                 predicted_added_ms=r["predicted_added_ms"],
                 measured_efficiency=r["measured_efficiency"],
                 predicted_efficiency=r["predicted_efficiency"],
                 measured_per_gpu=r["measured_per_gpu"], predicted_per_gpu=r["predicted_per_gpu"],
                 per_gpu_ratio=r["per_gpu_ratio"],
                 total_measured=r["measured_per_gpu"] * r["gpus"],
                 total_predicted=r["predicted_per_gpu"] * r["gpus"],
                 limited_by=r["limited_by"])
    others = [{"id": r["id"], "gpus": r["gpus"], "per_gpu_ratio": r["per_gpu_ratio"],
               "limited_by": r["limited_by"], "flag": r["flag"]}
              for r in scored.values() if r["measured_added_ms"] is None]
    print(f"fitted: {op_s * 1e6:.2f} us an engine operation (shipped: "
          f"{MXNET_KVSTORE_OP_S * 1e6:.2f})")
    for t in table:
        print(f"{t['id']:34s} {t['role']:8s} {t['gpus']} GPUs: added measured "
              f"{t['measured_added_ms']:5.1f} ms, predicted {t['predicted_added_ms']:5.1f}; "
              f"{t['total_predicted']:,.0f} img/s predicted, {t['total_measured']:,.0f} measured "
              f"({t['per_gpu_ratio']:.3f}x); limited by {t['limited_by']}")
    for o in others:
        print(f"{o['id']:34s} no one-GPU figure: per GPU {o['per_gpu_ratio']:.3f}x "
              f"({o['flag']}); limited by {o['limited_by']}")
    out = Path(argv[0]) if argv else DEFAULT_OUT
    save_result(out, "fit-kvstore", {"csv": str(vs.DEFAULT_CSV.relative_to(ROOT)),
                                     "fit_flag": FIT_FLAG},
                {"op_s": op_s, "rows": table, "no_single_gpu_figure": others})
    print(f"Wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
