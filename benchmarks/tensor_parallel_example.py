"""What tensor parallelism buys and costs, as ``dlperf analyze --tp`` predicts it (the README's
figures), saved with the environment (no GPU: these are dlperf's predictions, not measurements).

Llama 3 70B, 8,192 tokens, batch 1 per replica, bf16 in FSDP's mixed precision (--precision
fsdp: bf16 parameters without autocast, fp32 master weights), full activation checkpointing,
on 64 H100 SXM (8 nodes, NVLink 4 inside, InfiniBand NDR between), FSDP over the replicas,
with 1-, 2-, 4- and 8-way tensor parallelism inside each node: per GPU tokens/s, the step, the
tensor-parallel collectives (sequence parallel: all-gathers and reduce-scatters) and their
exposed time, FSDP's exposed time, memory per GPU and whether it fits, and one rank's time by
op (what splits and what does not). Each runs the CLI (`dlperf analyze ... --json`) and keeps
its scale-out.
Usage: python benchmarks/tensor_parallel_example.py [OUT.json]
(default: benchmarks/results/tensor-parallel-llama3-70b-h100.json; about a minute)
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks/results/tensor-parallel-llama3-70b-h100.json"
ARGS = ["analyze", "llama3-70b", "--device", "h100-sxm", "--batch-size", "1", "--seq-len",
        "8192", "--dtype", "bf16", "--precision", "fsdp", "--train",
        "--activation-checkpointing", "full", "--gpus", "64", "--strategy", "fsdp",
        "--interconnect", "nvlink4-h100,ib-ndr", "--top", "1",
        # the saved figures' kernel (FlashAttention-2), whatever the torch installed here
        # would pick on an H100 (cuDNN's from torch 2.11: efficiency.sdpa_kernel)
        "--attention-kernel", "flash2"]
TP = (1, 2, 4, 8)


def main(argv: list[str]) -> int:
    from contextlib import redirect_stdout
    from io import StringIO

    from dlperf.cli import main as cli
    from dlperf.provenance import save_result

    out = Path(argv[0]) if argv else OUT
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for tp in TP:
            path = Path(tmp) / f"tp{tp}.json"
            with redirect_stdout(StringIO()):
                code = cli(ARGS + ["--tp", str(tp), "--json", str(path)])
            if code != 0:
                raise SystemExit(f"dlperf {' '.join(ARGS)} --tp {tp} exited {code}")
            result = json.loads(path.read_text())
            here = result["scale_out"]["at_requested_scale"]
            # one rank's predicted time by (op, phase): what splits and what does not
            by_op: dict[str, float] = {}
            for layer in result["layers"]:
                key = f"{layer['op']} {layer['phase']}"
                by_op[key] = by_op.get(key, 0.0) + layer["predicted_time_s"]
            comm = here["communication"]
            tensor = comm.get("tensor_parallel") or {}
            memory = here["memory_per_gpu"] or {}
            rows.append({"tp": tp, "replicas": 64 // tp,
                         "tokens_per_s_per_gpu": here["per_gpu_samples_per_s"] * 8192,
                         "step_s": here["step_s"],
                         "tp_collectives_per_micro_batch": tensor.get(
                             "collectives_per_micro_batch", 0),
                         "tp_bytes_each": tensor.get("bytes_each", 0),
                         "tp_exposed_s": tensor.get("exposed_s", 0.0),
                         "exposed_comm_s": here["exposed_comm_s"],
                         "fsdp_comm_s": comm["comm_s"],
                         "memory_per_gpu_bytes": memory.get("total_bytes"),
                         "fits": memory.get("fits"),
                         "limited_by": here["limited_by"],
                         "rank_step_s": result["totals"]["predicted_time_s"],
                         "rank_time_by_op_s": dict(sorted(by_op.items(),
                                                          key=lambda kv: -kv[1])[:20])})
            r = rows[-1]
            print(f"tp {tp}: {r['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, step "
                  f"{r['step_s']:.2f} s, TP collectives {r['tp_collectives_per_micro_batch']} "
                  f"({r['tp_exposed_s'] * 1e3:.0f} ms), exposed {r['exposed_comm_s'] * 1e3:.0f} "
                  f"ms, memory {r['memory_per_gpu_bytes'] / 2**30:.0f} GiB"
                  f"{'' if r['fits'] else ' (does not fit)'}")
    save_result(out, "tensor-parallel-example", {"args": ARGS, "tp": list(TP)}, {"rows": rows})
    print(f"Wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
