"""Tensor parallelism against published runs: ``dlperf analyze --tp`` beside FSDP on the same
GPUs, model and stack (issue #14; the scaling table, validation/published_scaling.csv, has no
tensor-parallel column).

Source: KempnerInstitute/KempnerForge, benchmarks/mfu_scaling/mfu_scaling_2026-04-05.md and
the script that ran it (benchmarks/mfu_scaling/mfu_bench.sh, commit 9f3f03a0): Llama 3 8B
(its "7B": dlperf's llama3-8b), 4,096 tokens, FSDP2 in bf16 (--precision fsdp), full
activation checkpointing, fused AdamW, torch.compile on, nodes of four H200 141 GB (NVLink
inside, InfiniBand between: ib-ndr assumed), tensor parallel with sequence parallelism inside
a node. The eager model is slow on this compiled 2026 stack in absolute terms (the scaling
table's kempnerforge-h200 rows: 0.59-0.61x), so the measure here is relative: each
tensor-parallel run's tokens/s per GPU over the FSDP run on as many GPUs, measured and
predicted (the stack's error common to both cancels, as far as it is common).

Each row runs the CLI (`dlperf analyze ... --json`); about five minutes.
Usage: python benchmarks/validate_tp.py [OUT.json]
(default: benchmarks/results/tp-kempnerforge-h200.json)
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks/results/tp-kempnerforge-h200.json"
BASE = ["analyze", "llama3-8b", "--device", "h200", "--seq-len", "4096", "--dtype", "bf16",
        "--precision", "fsdp", "--train", "--activation-checkpointing", "full",
        "--optimizer", "adamw", "--gpus-per-node", "4", "--interconnect", "nvlink4-h200,ib-ndr",
        "--top", "1"]
# (run, GPUs, tp, strategy, batch, micro-batches, measured tokens/s over all GPUs), as
# mfu_bench.sh ran them (experiments 02, 03, 04, 05, 06, 07, 10, 12)
RUNS = (
    ("FSDP=2", 2, 1, "fsdp", 2, 4, 18728),
    ("TP=2", 2, 2, "fsdp", 4, 2, 13163),
    ("FSDP=4", 4, 1, "fsdp", 4, 2, 38983),
    ("TP=4", 4, 4, "fsdp", 4, 2, 25135),
    ("TP=2+FSDP=2", 4, 2, "fsdp", 4, 2, 25980),
    ("TP=4+FSDP=2", 8, 4, "fsdp", 4, 2, 44299),
    ("TP=4+FSDP=4", 16, 4, "fsdp", 4, 2, 82988),
    ("TP=4+FSDP=8", 32, 4, "fsdp", 4, 2, 155917),
)


def relative(rows: list[dict]) -> list[dict]:
    """Each tensor-parallel row's tokens/s per GPU over the FSDP row on as many GPUs (when the
    table has one), measured and predicted, and predicted over measured."""
    fsdp = {r["gpus"]: r for r in rows if r["tp"] == 1}
    out = []
    for r in rows:
        base = fsdp.get(r["gpus"])
        if r["tp"] == 1 or base is None:
            continue
        measured = r["measured_per_gpu"] / base["measured_per_gpu"]
        predicted = r["predicted_per_gpu"] / base["predicted_per_gpu"]
        out.append({"run": r["run"], "against": base["run"], "measured": measured,
                    "predicted": predicted, "ratio": predicted / measured})
    return out


def main(argv: list[str]) -> int:
    from contextlib import redirect_stdout
    from io import StringIO

    from tqdm import tqdm

    from dlperf.cli import main as cli
    from dlperf.provenance import save_result

    out = Path(argv[0]) if argv else OUT
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for run, gpus, tp, strategy, batch, accum, measured in tqdm(RUNS, desc="runs"):
            path = Path(tmp) / "r.json"
            args = BASE + ["--gpus", str(gpus), "--tp", str(tp), "--strategy", strategy,
                           "--batch-size", str(batch), "--grad-accum", str(accum),
                           "--json", str(path)]
            with redirect_stdout(StringIO()):
                code = cli(args)
            if code != 0:
                raise SystemExit(f"dlperf {' '.join(args)} exited {code}")
            here = json.loads(path.read_text())["scale_out"]["at_requested_scale"]
            tensor = here["communication"].get("tensor_parallel") or {}
            predicted = here["per_gpu_samples_per_s"] * 4096
            rows.append({"run": run, "gpus": gpus, "tp": tp, "strategy": strategy,
                         "batch": batch, "grad_accum": accum,
                         "measured_per_gpu": measured / gpus, "predicted_per_gpu": predicted,
                         "ratio": predicted / (measured / gpus),
                         "tp_exposed_s": tensor.get("exposed_s", 0.0),
                         "exposed_comm_s": here["exposed_comm_s"], "step_s": here["step_s"]})
    pairs = relative(rows)
    for r in rows:
        print(f"{r['run']:12s} {r['gpus']:3d} GPUs: measured {r['measured_per_gpu']:8,.0f} "
              f"tokens/s per GPU, predicted {r['predicted_per_gpu']:8,.0f} ({r['ratio']:.2f}x)")
    for p in pairs:
        print(f"{p['run']:12s} / {p['against']}: measured {p['measured']:.3f}, predicted "
              f"{p['predicted']:.3f} ({p['ratio']:.2f}x)")
    save_result(out, "validate-tp", {"args": BASE, "runs": [list(r) for r in RUNS]},
                {"rows": rows, "tp_over_fsdp": pairs})
    print(f"Wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
