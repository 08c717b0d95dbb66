"""A plain GPT-2-style decoder (pre-LayerNorm, causal SDPA attention, 4x GELU MLP).

Written for analysis: it is ordinary PyTorch, so the same module trains, and dlperf analyze sees
the kernels a language-model user runs (QKV projection, attention, MLP, LM head over the vocab).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class GPTConfig:
    layers: int = 12
    d_model: int = 768
    heads: int = 12
    vocab: int = 50257
    seq_len: int = 1024
    mlp_ratio: int = 4
    bias: bool = False
    tie_embeddings: bool = True

    def __post_init__(self):
        for name in ("layers", "d_model", "heads", "vocab", "seq_len", "mlp_ratio"):
            if getattr(self, name) <= 0:
                raise ValueError(f"GPT {name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.heads:
            raise ValueError(f"GPT d_model ({self.d_model}) must be divisible by heads "
                             f"({self.heads})")


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        # [B, T, 3C] -> 3 x [B, H, T, C/H]
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        hidden = cfg.mlp_ratio * cfg.d_model
        self.fc = nn.Linear(cfg.d_model, hidden, bias=cfg.bias)
        self.act = nn.GELU(approximate="tanh")
        self.out = nn.Linear(hidden, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(self.act(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))  # [B, T, vocab] logits


# Named configurations of published decoders that this module reproduces exactly (same
# parameter count, same GEMM shapes), so their published training throughputs can be checked
# against dlperf's predictions (benchmarks/validation/).
# * gpt2 .. gpt2-xl: Radford et al. 2019, Table 2 (layers, d_model; heads as in the released
#   checkpoints), vocabulary 50,257, 1,024 positions, biases, tied embeddings: 124 M for gpt2.
# * mpt-125m .. mpt-70b: MosaicML llm-foundry, scripts/train/yamls/pretrain/mpt-*.yaml (d_model,
#   n_heads, n_layers, expansion 4, vocabulary 50,368), as its throughput tables
#   (scripts/train/benchmarking/README.md) ran them: with biases and learned positions, which
#   is what makes this module's count equal the tables' NumParams to the parameter (e.g.
#   6,658,859,008 for mpt-7b at 2,048 tokens).
def _gpt2(layers, d_model, heads):
    return GPTConfig(layers=layers, d_model=d_model, heads=heads, vocab=50257, seq_len=1024,
                     bias=True)


def _mpt(layers, d_model, heads):
    return GPTConfig(layers=layers, d_model=d_model, heads=heads, vocab=50368, seq_len=2048,
                     bias=True)


PRESETS = {
    "gpt": GPTConfig(),
    "gpt2": _gpt2(12, 768, 12), "gpt2-medium": _gpt2(24, 1024, 16),
    "gpt2-large": _gpt2(36, 1280, 20), "gpt2-xl": _gpt2(48, 1600, 25),
    "mpt-125m": _mpt(12, 768, 12), "mpt-350m": _mpt(24, 1024, 16),
    "mpt-760m": _mpt(24, 1536, 12), "mpt-1b": _mpt(24, 2048, 16),
    "mpt-3b": _mpt(32, 2560, 20), "mpt-7b": _mpt(32, 4096, 32),
    "mpt-13b": _mpt(40, 5120, 40), "mpt-30b": _mpt(48, 7168, 56),
    "mpt-70b": _mpt(80, 8192, 64),
}


def gpt_config(name: str, **overrides) -> GPTConfig:
    """The preset ``name`` with the given fields replaced (None: keep the preset's)."""
    from dataclasses import replace

    return replace(PRESETS[name], **{k: v for k, v in overrides.items() if v is not None})
