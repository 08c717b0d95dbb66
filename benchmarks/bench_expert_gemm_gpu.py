"""Issue #14's gpt-oss lead, measured on one GPU: do a rank's experts run as fast as the one
batched GEMM dlperf times them as?

dlperf predicts Megatron-Bridge's gpt-oss-120b rows 1.32-1.34x too fast on 64 H100s
(benchmarks/README.md, "gpt-oss and a second expert-parallel check"). There a rank holds 16
of the 128 experts and, with the tokens balanced (the recipe forces it), each gets 1,024 of
them a micro-batch: 4,096 tokens x top 4 x 8 ranks / 128. dlperf times the 16 experts' GEMMs
as one batched GEMM whose tiles fill the GPU's waves; a grouped-GEMM library may instead issue
one GEMM per expert (a loop over cuBLAS, on one stream or several) or one grouped kernel. This
script times each form on the experts' forward and backward GEMMs (bf16, FP32 accumulation):

1. ``batched``: one ``torch.bmm`` per GEMM over the experts (what dlperf prices);
2. ``per_expert``: a ``torch.mm`` per expert, one stream;
3. ``per_expert_streams``: the same spread round-robin over ``--streams`` streams;
4. ``grouped``: ``torch._grouped_mm`` (a grouped GEMM kernel; None where this torch or GPU
   has none);

and beside them dlperf's prediction for the batched form and for one GEMM per expert on the
GPU's preset: which the measurement lands near says whether the experts' GEMMs are where the
predicted step is short.

Usage: python benchmarks/bench_expert_gemm_gpu.py OUT.json [--experts 16] [--tokens 1024]
       [--d-model 2880] [--ffn 2880] [--streams 4] [--reps 20] [--preset NAME]
On a machine without a GPU it runs on the CPU in fp32 at the size given (a check of the
script, not a measurement).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


def shapes(tokens: int, d: int, ffn: int) -> list[tuple[str, int, int, int]]:
    """(name, M, N, K) of one expert's GEMMs in a training step: the gated first layer makes
    2 x ffn (gate and up in one weight, as Megatron-Core's experts hold them), the second
    takes ffn back to d; each layer's data and weight gradients."""
    return [("fc1 forward", tokens, 2 * ffn, d), ("fc2 forward", tokens, d, ffn),
            ("fc2 dgrad", tokens, ffn, d), ("fc2 wgrad", ffn, d, tokens),
            ("fc1 dgrad", tokens, d, 2 * ffn), ("fc1 wgrad", d, 2 * ffn, tokens)]


def predicted(preset: str, experts: int, tokens: int, d: int, ffn: int) -> dict:
    """dlperf's seconds for the experts' GEMMs on ``preset`` in bf16: as one batched GEMM of
    ``experts`` (how it prices a MoE layer) and as one GEMM per expert."""
    from dlperf.analysis.costs import Cost
    from dlperf.analysis.gemm import GemmShape
    from dlperf.analysis.roofline import predict
    from dlperf.hardware.specs import get_device

    spec = get_device(preset)

    def seconds(m: int, n: int, k: int, batch: int) -> float:
        cost = Cost(op="bmm" if batch > 1 else "mm", module="experts", module_type="Experts",
                    phase="forward", kind="gemm", dtype="bf16", flops=2 * m * n * k * batch,
                    bytes=2 * batch * (m * k + k * n + m * n),
                    gemm=GemmShape(m, n, k, batch=batch))
        return predict(cost, spec).time_s

    rows = {name: {"batched_s": seconds(m, n, k, experts),
                   "per_expert_s": experts * seconds(m, n, k, 1)}
            for name, m, n, k in shapes(tokens, d, ffn)}
    return {"preset": preset, "gemms": rows,
            "batched_s": sum(r["batched_s"] for r in rows.values()),
            "per_expert_s": sum(r["per_expert_s"] for r in rows.values())}


def run(experts: int, tokens: int, d: int, ffn: int, streams: int, reps: int, device,
        dtype) -> dict:
    import torch

    cuda = device.type == "cuda"
    side = [torch.cuda.Stream(device) for _ in range(streams)] if cuda else []
    grouped_mm = getattr(torch, "_grouped_mm", None) if cuda else None

    def timed(fn) -> float:
        """The median seconds of ``fn`` over ``reps`` runs, after two warm-up runs."""
        for _ in range(2):
            fn()
        times = []
        for _ in range(reps):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    out = {}
    for name, m, n, k in shapes(tokens, d, ffn):
        a = torch.randn(experts, m, k, device=device, dtype=dtype)
        b = torch.randn(experts, k, n, device=device, dtype=dtype)
        c = torch.empty(experts, m, n, device=device, dtype=dtype)

        def loop():
            for e in range(experts):
                torch.mm(a[e], b[e], out=c[e])

        def spread():
            main = torch.cuda.current_stream(device)
            for s in side:
                s.wait_stream(main)
            for e in range(experts):
                with torch.cuda.stream(side[e % streams]):
                    torch.mm(a[e], b[e], out=c[e])
            for s in side:
                main.wait_stream(s)

        row = {"m": m, "n": n, "k": k, "flops": 2 * m * n * k * experts,
               "batched_s": timed(lambda: torch.bmm(a, b, out=c)),
               "per_expert_s": timed(loop),
               "per_expert_streams_s": timed(spread) if side else None,
               "grouped_s": None}
        if grouped_mm is not None:
            # the experts' rows one after another (offsets: each expert's end), as a MoE
            # layer's permuted tokens are laid out
            flat = a.reshape(experts * m, k)
            offs = torch.arange(m, experts * m + 1, m, device=device, dtype=torch.int32)
            try:
                row["grouped_s"] = timed(lambda: grouped_mm(flat, b, offs=offs))
            except (RuntimeError, TypeError) as exc:  # (no kernel for this GPU or dtype)
                row["grouped_error"] = str(exc).splitlines()[0][:200]
        out[name] = row
    forms = ("batched_s", "per_expert_s", "per_expert_streams_s", "grouped_s")
    total = {f: (sum(r[f] for r in out.values())
                 if all(r[f] is not None for r in out.values()) else None) for f in forms}
    return {"gemms": out, "total": total,
            "over_batched": {f: (total[f] / total["batched_s"] if total[f] else None)
                             for f in forms[1:]}}


def main(argv: list[str]) -> int:
    import torch

    from dlperf.provenance import save_result

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--d-model", type=int, default=2880)
    p.add_argument("--ffn", type=int, default=2880)
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--preset", help="the dlperf preset to predict the GEMMs on (default: the "
                   "one the GPU's name matches; none on a CPU)")
    args = p.parse_args(argv)
    if min(args.experts, args.tokens, args.d_model, args.ffn, args.streams, args.reps) < 1:
        raise SystemExit("bench_expert_gemm_gpu.py: --experts, --tokens, --d-model, --ffn, "
                         "--streams and --reps are counts, at least 1 each")
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    res = run(args.experts, args.tokens, args.d_model, args.ffn, args.streams, args.reps,
              device, dtype)
    res["device"] = torch.cuda.get_device_name(0) if cuda else "cpu"
    if not cuda:
        res["note"] = "no GPU: the script ran on the CPU in fp32 (a check, not a measurement)"
    preset = args.preset
    if preset is None and cuda:
        from dlperf.hardware.specs import match_preset

        matched = match_preset(res["device"])
        preset = matched.name if matched else None
    res["predicted"] = (predicted(preset, args.experts, args.tokens, args.d_model, args.ffn)
                        if preset else None)
    if res["predicted"]:
        measured = res["total"]["batched_s"]
        res["batched_over_predicted"] = measured / res["predicted"]["batched_s"]
    save_result(args.out, "expert-gemm-gpu",
                {"experts": args.experts, "tokens": args.tokens, "d_model": args.d_model,
                 "ffn": args.ffn, "streams": args.streams, "reps": args.reps,
                 "dtype": str(dtype), "preset": preset}, res)
    ratios = ", ".join(f"{f.removesuffix('_s')} {r:.2f}x" for f, r in
                       res["over_batched"].items() if r is not None)
    print(f"{res['device']}: the experts' GEMMs against one batched GEMM: {ratios}; batched "
          f"measured/predicted {res.get('batched_over_predicted')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
