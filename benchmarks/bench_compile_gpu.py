"""torch.compile's speed-up on a Llama stack, measured beside dlperf's prediction (issue #14).

dlperf predicts a compiled step from the eager capture (analysis/compiled.py, ``--fusion
compile-blocks``); the published pairs it was checked on (benchmarks/README.md) carry their
clusters' other differences. This times the one thing on the GPU it runs on: a Llama-shaped
decoder's forward and backward (bf16 parameters as FSDP's mixed precision holds them, no
autocast; the cross-entropy loss eager, outside the compiled modules; no optimizer step)
eager, then with each block compiled on its own as torchtitan's ``apply_compile`` does, and
saves both medians beside dlperf's prediction of both on the GPU's preset. With ``--fp8`` (on
a GPU with FP8 Tensor Cores, or a CPU) the same stack with torchao's float8 layers as dlperf
models them (models/float8.py: the ops torchao runs), compiled per block too, once with
tensorwise scales and once with the rowwise recipe, beside ``--fp8 tensorwise`` and ``--fp8
rowwise``'s predictions: each recipe's speed-up over the compiled BF16 stack (the rowwise one
also times PyTorch's rowwise CUTLASS GEMM, which dlperf charges at cuBLAS's FP8 rate).

Each stack's step is also profiled once on the GPU (``torch.profiler``) and its kernels' time
summed by class, GEMMs, fused attention, Inductor's fused kernels and the rest, beside the
same classes of the prediction (``kernels_ms``): on the H200 of 2026-12-04 the rowwise stack
ran 19% slower than predicted against the others' speed-ups within 1.5%, and one step's total
could not say whether its GEMMs or its casts took the difference.

Usage: python benchmarks/bench_compile_gpu.py OUT.json [--preset h200] [--device cuda]
       [--layers 4] [--d-model 2048] [--heads 16] [--kv-heads 8] [--ffn 5632] [--vocab 32000]
       [--tokens 4096] [--batch 2] [--rope complex] [--iters 10] [--fp8]
(scripts/device_check.sh step 0d, ~1 minute with the compilation; on a CPU it runs the same
code at any size in fp32, which tests/test_device_scripts.py does with a tiny one.)
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path


def gpt_config(args):
    from dlperf.models.gpt import GPTConfig

    return GPTConfig(layers=args.layers, d_model=args.d_model, heads=args.heads,
                     kv_heads=args.kv_heads, vocab=args.vocab, seq_len=args.tokens,
                     bias=False, tie_embeddings=False, norm="rmsnorm", mlp="swiglu",
                     ffn_hidden=args.ffn, positions="rope", rope=args.rope)


# A CUDA kernel's class by its name (first match): fused attention (FlashAttention, cuDNN's
# and PyTorch's memory-efficient kernels), GEMMs (cuBLAS's sm90_xmma / nvjet kernels, CUTLASS's,
# the rowwise _scaled_mm), Inductor's generated kernels; the rest is ATen's own (elementwise,
# reductions, copies).
KERNEL_CLASSES = (("attention", ("flash", "fmha", "sdpa", "attention", "attn")),
                  ("gemm", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "scaled_mm", "matmul",
                            "wgmma")),
                  ("fused", ("triton",)))


def kernel_class(name: str) -> str:
    lower = name.lower()
    for cls, keys in KERNEL_CLASSES:
        if any(k in lower for k in keys):
            return cls
    return "other"


def predicted_class(op: str) -> str:
    """The class of a predicted kernel (``Cost.op``), as ``kernel_class`` names them (GEMMs:
    the ops the cost rules cost as GEMMs, ``analysis.costs.GEMM_OPS``)."""
    from dlperf.analysis.costs import GEMM_OPS

    if op in GEMM_OPS:
        return "gemm"
    if op.startswith("attention"):
        return "attention"
    return "fused" if op == "compiled" else "other"


def by_class(pairs) -> dict:
    """{class: milliseconds} from (class, seconds) pairs."""
    out: dict = {}
    for cls, seconds in pairs:
        out[cls] = out.get(cls, 0.0) + seconds * 1e3
    return out


def profile_step(model, tokens, targets, sync) -> dict | None:
    """One step's CUDA kernel time by class (ms), after ``measure`` warmed it; None off CUDA;
    {"error": ...} when the profiler fails, so that the timings around it still come back
    (the second lent H200's step 0d, the first with this profile, returned nothing)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if tokens.device.type != "cuda":
        return None
    step = _step(model, tokens, targets)
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            sync()
        return by_class((kernel_class(e.name), e.device_time_total / 1e6)
                        for e in prof.key_averages()
                        if e.device_type == torch.autograd.DeviceType.CUDA)
    except Exception as e:  # noqa: BLE001 (a profiler's failure is a result, not the run's end)
        return {"error": f"{type(e).__name__}: {e}"[:300]}


def predicted(cfg, batch: int, preset: str, dtype: str, attention_kernel: str,
              fp8: bool = False, classes: dict | None = None) -> dict:
    """dlperf's predicted forward + backward (no optimizer) eager and compiled per block, and
    with ``fp8`` compiled per block with torchao's float8 layers ("float8": tensorwise;
    "rowwise"); each one's time by kernel class (ms) into ``classes`` where given. Attention
    at ``attention_kernel`` (``run``: the one the timed torch picks, ``efficiency.sdpa_kernel``;
    until 2026-12-04 the prediction took FlashAttention-2's share where torch 2.11 on the H200
    ran cuDNN's)."""
    import dataclasses

    import torch

    from dlperf.analysis.api import AnalysisConfig, analyze_model
    from dlperf.hardware.specs import get_device
    from dlperf.models.gpt import GPT

    spec = get_device(preset)
    out = {}
    runs = [("none", "none", None), ("compile-blocks", "compile-blocks", None)]
    for name, fusion, recipe in runs + ([("float8", "compile-blocks", "tensorwise"),
                                         ("rowwise", "compile-blocks", "rowwise")]
                                        if fp8 else []):
        with torch.device("meta"):
            model = GPT(dataclasses.replace(cfg, fp8=recipe))
        config = AnalysisConfig(model="llama-stack", input_shape=(batch, cfg.seq_len),
                                dtype=dtype, train=True, tokens=True, optimizer="none",
                                precision="fsdp" if dtype != "fp32" else "mixed",
                                fusion=fusion, device=spec.name, fp8=recipe,
                                attention_kernel=attention_kernel)
        analysis = analyze_model(model, config, spec, torch.long)
        out[name] = analysis.totals()["predicted_time_s"]
        if classes is not None:  # the kernels, and what the step waits on the host beyond them
            classes[name] = by_class([*((predicted_class(p.cost.op), p.time_s)
                                        for p in analysis.predictions),
                                      ("host", out[name] - sum(p.time_s for p
                                                               in analysis.predictions))])
    return out


def _step(model, tokens, targets):
    """One forward and backward (the loss outside the compiled modules), as a function."""
    from torch.nn import functional as F

    def step():
        logits = model(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        loss.backward()
        for p in model.parameters():
            p.grad = None

    return step


def measure(model, tokens, targets, iters: int, sync) -> float:
    """Median seconds of one forward and backward (the loss outside the compiled modules)."""
    step = _step(model, tokens, targets)
    for _ in range(3):  # warm-up (and, compiled, the compilation)
        step()
    sync()
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        step()
        sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def run(args) -> dict:
    import torch

    from dlperf.models.gpt import GPT

    cfg = gpt_config(args)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    # FP8 GEMMs need FP8 Tensor Cores (sm 8.9 and later); a CPU runs _scaled_mm's reference
    fp8 = args.fp8 and (args.device == "cpu" or torch.cuda.get_device_capability() >= (8, 9))

    def build(recipe):
        import dataclasses

        torch.manual_seed(0)  # (the same weights in both stacks)
        model = GPT(dataclasses.replace(cfg, fp8=recipe)).to(device=args.device)
        for t in [*model.parameters(), *model.buffers()]:  # (the rotary tables stay complex64)
            if t.is_floating_point():
                t.data = t.data.to(dtype)
        return model

    def compiled_blocks(model):
        for i, block in enumerate(model.blocks):  # torchtitan's apply_compile: block by block
            model.blocks[i] = torch.compile(block)
        return model

    model = build(None)
    tokens = torch.randint(0, cfg.vocab, (args.batch, cfg.seq_len), device=args.device)
    targets = torch.randint(0, cfg.vocab, (args.batch, cfg.seq_len), device=args.device)
    eager = measure(model, tokens, targets, args.iters, sync)
    kernels = {"none": profile_step(model, tokens, targets, sync)}
    model = compiled_blocks(model)
    start = time.perf_counter()
    compiled = measure(model, tokens, targets, args.iters, sync)
    wall = time.perf_counter() - start
    kernels["compile-blocks"] = profile_step(model, tokens, targets, sync)
    predicted_kernels: dict = {}
    from dlperf.hardware.efficiency import sdpa_kernel
    from dlperf.hardware.specs import get_device

    attention = sdpa_kernel(get_device(args.preset))[0]
    pred = predicted(cfg, args.batch, args.preset,
                     "bf16" if dtype == torch.bfloat16 else "fp32", attention, fp8,
                     predicted_kernels)
    measured_speedup = eager / compiled
    predicted_speedup = pred["none"] / pred["compile-blocks"]
    float8 = {}
    if fp8:
        del model
        for name, recipe in (("float8", "tensorwise"), ("rowwise", "rowwise")):
            f8_model = compiled_blocks(build(recipe))
            f8 = measure(f8_model, tokens, targets, args.iters, sync)
            kernels[name] = profile_step(f8_model, tokens, targets, sync)
            del f8_model
            gain, predicted_gain = compiled / f8, pred["compile-blocks"] / pred[name]
            float8 |= {f"{name}_s": f8, f"predicted_{name}_s": pred[name],
                       f"measured_{name}_speedup": gain,
                       f"predicted_{name}_speedup": predicted_gain,
                       f"{name}_speedup_ratio": predicted_gain / gain,
                       f"{name}_measured_over_predicted": pred[name] / f8}
    elif args.fp8:
        float8 = {"float8_skipped": "no FP8 Tensor Cores on this GPU"}
    return {**float8, "eager_s": eager, "compiled_s": compiled,
            "compile_and_timing_wall_s": wall,
            "measured_speedup": measured_speedup,
            "predicted_eager_s": pred["none"], "predicted_compiled_s": pred["compile-blocks"],
            "predicted_speedup": predicted_speedup,
            "speedup_ratio": predicted_speedup / measured_speedup,
            "eager_measured_over_predicted": pred["none"] / eager,
            "compiled_measured_over_predicted": pred["compile-blocks"] / compiled,
            "dtype": str(dtype).removeprefix("torch."), "preset": args.preset,
            "attention_kernel": attention,
            "kernels_ms": {name: {"measured": kernels.get(name), "predicted": classes}
                           for name, classes in predicted_kernels.items()}}


def main(argv: list[str]) -> int:
    import argparse

    from dlperf.provenance import save_result

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--preset", default="h200", help="the GPU's preset [h200]")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--ffn", type=int, default=5632)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--rope", default="complex", choices=("complex", "half", "matrix"))
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--fp8", action="store_true",
                        help="also the stack with torchao's float8 layers (tensorwise, then "
                             "rowwise), compiled per block")
    args = parser.parse_args(argv)
    result = run(args)
    print(f"eager {result['eager_s'] * 1e3:.2f} ms, compiled per block "
          f"{result['compiled_s'] * 1e3:.2f} ms: {result['measured_speedup']:.3f}x measured, "
          f"{result['predicted_speedup']:.3f}x predicted ({result['speedup_ratio']:.3f})")
    for name in ("float8", "rowwise"):
        if f"{name}_s" in result:
            print(f"{name}, compiled per block {result[f'{name}_s'] * 1e3:.2f} ms: "
                  f"{result[f'measured_{name}_speedup']:.3f}x over BF16 measured, "
                  f"{result[f'predicted_{name}_speedup']:.3f}x predicted "
                  f"({result[f'{name}_speedup_ratio']:.3f})")
    save_result(args.out, "compile-speedup", vars(args) | {"out": str(args.out)}, result)
    print(f"Wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
