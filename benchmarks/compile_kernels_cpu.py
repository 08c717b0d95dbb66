"""dlperf's model of torch.compile (analysis/compiled.py) against torch.compile itself: the
fused kernels Inductor generates on this CPU (its C++ backend; the scheduler's fusion choices
are the ones it makes for a GPU, the code is C++ rather than Triton), forward and backward,
beside the ones dlperf's capture predicts, for small modules and for a one-block Llama with
each rotary form. Counted from the output code Inductor writes (``run_and_get_code``): each
call of a ``cpp_fused_*`` kernel in a graph's ``call``.

The small modules are the tests' too (tests/test_compiled.py takes them from here).

Usage: python benchmarks/compile_kernels_cpu.py [OUT.json]   (~1 minute on 2 cores)
(default: benchmarks/results/compile-kernels-cpu.json)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks/results/compile-kernels-cpu.json"
N, D, F = 4, 8, 16  # tokens, features, SwiGLU's hidden size: small, fp32


class SwiGLU(nn.Module):
    """Llama's MLP: w2(silu(w1 x) * w3 x)."""

    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(D, F, bias=False)
        self.w3 = nn.Linear(D, F, bias=False)
        self.w2 = nn.Linear(F, D, bias=False)

    def forward(self, x):
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class Norm(nn.Module):
    """RMSNorm without a weight, then a projection."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, D, bias=False)

    def forward(self, x):
        return self.lin(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))


class NormWeight(nn.Module):
    """RMSNorm with its weight (a gradient summed over the tokens), then a projection."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(D))
        self.lin = nn.Linear(D, D, bias=False)

    def forward(self, x):
        return self.lin(self.w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)))


class Cycle(nn.Module):
    """a = relu(x); b = a W; c = (a + b) * 2: the add needs the GEMM, which needs the relu."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, D, bias=False)
        self.out = nn.Linear(D, D, bias=False)

    def forward(self, x):
        a = torch.relu(x)
        return self.out((a + self.lin(a)) * 2)


class Halves(nn.Module):
    """One projection split into two halves of one shape and stride, multiplied."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, 2 * D, bias=False)
        self.out = nn.Linear(D, D, bias=False)

    def forward(self, x):
        a, b = self.lin(x).chunk(2, dim=-1)
        return self.out(a * b)


class TwoSums(nn.Module):
    """Reductions of x over either axis, added (a Triton kernel reduces over one axis; the C++
    backend loops over both in one function)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, D, bias=False)

    def forward(self, x):
        return self.lin(x.sum(0, keepdim=True) + x.sum(1, keepdim=True))


MODULES = (SwiGLU, Norm, NormWeight, Cycle, Halves, TwoSums)


def tiny_llama(rope: str = "complex"):
    from dlperf.models.gpt import GPTConfig

    return GPTConfig(layers=1, d_model=64, heads=4, kv_heads=2, vocab=128, seq_len=32,
                     bias=False, tie_embeddings=False, norm="rmsnorm", mlp="swiglu",
                     ffn_hidden=176, positions="rope", rope=rope)


def inductor_kernels(module: nn.Module, example: torch.Tensor) -> list[int]:
    """[forward, backward]: the fused kernels Inductor's output code calls in each graph of
    ``module`` on ``example`` (the loss, a sum, outside the compiled module)."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    compiled = torch.compile(module)
    _, codes = run_and_get_code(lambda: compiled(example).float().sum().backward())
    return [len(re.findall(r"\n\s+cpp_fused_\w+\(", code[code.index("def call("):]))
            for code in codes]


def dlperf_kernels(module: nn.Module, shape: tuple, tokens: bool = False,
                   fusion: str = "compile") -> list[int]:
    """[forward, backward]: the generated kernels dlperf's capture predicts (fp32, no
    optimizer; the loss eager)."""
    from dlperf.analysis.api import AnalysisConfig, capture_costs
    from dlperf.analysis.compiled import COMPILED_OP

    cfg = AnalysisConfig(model="m", input_shape=shape, dtype="fp32", train=True,
                         optimizer="none", fusion=fusion, tokens=tokens)
    costs = capture_costs(module, cfg, torch.long if tokens else torch.float32)[0]
    return [sum(1 for c in costs if c.op == COMPILED_OP and (c.phase == "forward") == fwd)
            for fwd in (True, False)]


def main(argv: list[str]) -> int:
    from tqdm import tqdm

    from dlperf.models.gpt import GPT
    from dlperf.provenance import save_result

    out = Path(argv[0]) if argv else OUT
    rows = []
    cases = [(m.__name__, m) for m in MODULES] + [(f"llama-1-block rope={r}", r)
                                                   for r in ("complex", "half", "matrix")]
    for name, what in tqdm(cases, desc="torch.compile"):
        torch.manual_seed(0)
        if isinstance(what, str):
            cfg = tiny_llama(what)
            ours = dlperf_kernels(GPT(cfg), (2, cfg.seq_len), tokens=True)
            theirs = inductor_kernels(GPT(cfg), torch.randint(0, cfg.vocab, (2, cfg.seq_len)))
        else:  # (the input takes no gradient, as in dlperf's capture)
            ours = dlperf_kernels(what(), (N, D))
            theirs = inductor_kernels(what(), torch.randn(N, D))
        rows.append({"case": name, "inductor_forward": theirs[0],
                     "inductor_backward": theirs[1], "dlperf_forward": ours[0],
                     "dlperf_backward": ours[1]})
        print(f"{name:28s} Inductor {theirs[0]} + {theirs[1]}   dlperf {ours[0]} + {ours[1]}")
    save_result(out, "compile-kernels-cpu", {"modules": [n for n, _ in cases], "dtype": "fp32",
                                             "fusion": "compile"}, {"rows": rows})
    print(f"Wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
