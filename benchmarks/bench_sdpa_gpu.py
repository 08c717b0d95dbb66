"""Fused attention's share of the Tensor Core peak, timed (issue #14).

dlperf times `scaled_dot_product_attention` at its kernel's share of the peak
(hardware/efficiency.py, ATTENTION_KERNELS): FlashAttention-2 at 0.553 on an A100 (fitted to
published Llama runs) and 0.322 on Hopper (the FlashAttention-3 paper's timing of it). This
script measures the share on the GPU it runs on, so a lent GPU checks the shipped figure: the
forward and the forward + backward of causal self-attention in bf16 at a Llama shape (head
size 128, 4,096 tokens), through PyTorch's own choice of kernel and through each backend it
offers (flash, cuDNN, memory-efficient), with FLOPs counted as dlperf counts them
(analysis/costs.py, ``attention_cost``: the causal half of both matmuls forward, 2.5x that
backward), over the preset's dense bf16 peak.

Usage: python benchmarks/bench_sdpa_gpu.py OUT.json [--preset h100-sxm] [--device cuda]
       [--batch 2] [--heads 32] [--tokens 4096] [--head-dim 128] [--iters 20]
(scripts/device_check.sh step 0c, ~20 s; on a CPU it runs the same code at any size, which
tests/test_device_scripts.py does with a tiny one.)
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path


def attention_flops(batch: int, heads: int, tokens: int, head_dim: int) -> dict:
    """dlperf's FLOP count of one causal attention forward and backward (``attention_cost``)."""
    from dlperf.analysis.costs import attention_cost

    shape = (batch, heads, tokens, head_dim)
    info = {"q": shape, "k": shape, "v": shape, "dtype": "bf16", "causal": True, "mask": False}
    return {phase: attention_cost(info, phase, "attn", "Attention").flops
            for phase in ("forward", "dgrad")}


def _backends():
    """(name, context manager factory) for PyTorch's own choice and each backend there is."""
    import contextlib

    out = [("default", contextlib.nullcontext)]
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # (PyTorch < 2.3)
        return out
    for name, attr in (("flash", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION"),
                       ("efficient", "EFFICIENT_ATTENTION")):
        if hasattr(SDPBackend, attr):
            out.append((name, lambda a=attr: sdpa_kernel([getattr(SDPBackend, a)])))
    return out


def time_backend(q, k, v, context, iters: int, sync) -> dict:
    """Median seconds of one forward and of one forward + backward under ``context``."""
    import torch
    from torch.nn import functional as F

    def forward():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def both():
        out = forward()
        out.backward(grad)
        q.grad = k.grad = v.grad = None

    with context():
        grad = torch.ones_like(forward())
        times = {}
        for name, fn in (("forward_s", forward), ("forward_backward_s", both)):
            for _ in range(3):  # warm-up: kernel selection, workspace
                fn()
            sync()
            samples = []
            for _ in range(iters):
                start = time.perf_counter()
                fn()
                sync()
                samples.append(time.perf_counter() - start)
            times[name] = statistics.median(samples)
    return times


def run(batch: int, heads: int, tokens: int, head_dim: int, iters: int, device: str,
        preset: str) -> dict:
    import torch

    from dlperf.hardware.efficiency import ATTENTION_KERNELS, efficiency_for
    from dlperf.hardware.specs import get_device

    spec = get_device(preset)
    peak = spec.peak_flops("bf16")
    flops = attention_flops(batch, heads, tokens, head_dim)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q, k, v = (torch.randn(batch, heads, tokens, head_dim, device=device, dtype=dtype,
                           requires_grad=True) for _ in range(3))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows = []
    for name, context in _backends():
        try:
            times = time_backend(q, k, v, context, iters, sync)
        except RuntimeError as exc:  # a backend this GPU, dtype or shape does not take
            rows.append({"backend": name, "error": str(exc).splitlines()[0][:200]})
            continue
        both = flops["forward"] + flops["dgrad"]
        rows.append({"backend": name, **times,
                     "forward_tflops": flops["forward"] / times["forward_s"] / 1e12,
                     "forward_backward_tflops": both / times["forward_backward_s"] / 1e12,
                     "forward_share": flops["forward"] / times["forward_s"] / peak,
                     "forward_backward_share": both / times["forward_backward_s"] / peak})
    return {"shape": {"batch": batch, "heads": heads, "tokens": tokens, "head_dim": head_dim,
                      "causal": True, "dtype": str(dtype).removeprefix("torch.")},
            "flops": flops, "preset": preset, "peak_bf16_flops": peak,
            "shipped_share": {kernel: efficiency_for(spec, kernel).attention
                              for kernel in ATTENTION_KERNELS},
            "backends": rows}


def main(argv: list[str]) -> int:
    import argparse

    from dlperf.provenance import save_result

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--preset", default="h100-sxm", help="whose bf16 peak [h100-sxm]")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)
    result = run(args.batch, args.heads, args.tokens, args.head_dim, args.iters, args.device,
                 args.preset)
    for r in result["backends"]:
        if "error" in r:
            print(f"{r['backend']:10s} not run: {r['error']}")
            continue
        print(f"{r['backend']:10s} forward {r['forward_tflops']:7.1f} TFLOP/s "
              f"({r['forward_share']:.3f} of the peak), forward + backward "
              f"{r['forward_backward_tflops']:7.1f} ({r['forward_backward_share']:.3f})")
    print(f"shipped shares on {args.preset}: {result['shipped_share']}")
    save_result(args.out, "sdpa-share", vars(args) | {"out": str(args.out)}, result)
    print(f"Wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
