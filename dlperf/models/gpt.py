"""A decoder-only transformer: GPT-2 style (pre-LayerNorm, learned positions, causal SDPA
attention, 4x GELU MLP) or Llama style (RMSNorm, rotary positions, grouped-query attention,
SwiGLU MLP, an untied output layer), chosen by GPTConfig.

``tp`` > 1 builds one rank of Megatron-style tensor parallelism (Shoeybi et al., arXiv
1909.08053, section 3): each block's attention heads (q, k and v projections column-parallel,
the output projection row-parallel) and MLP hidden units split over ``tp`` GPUs, the embedding
and the output layer split over the vocabulary (vocabulary-parallel, the loss computed on each
rank's slice), with sequence parallelism as torchtitan always runs it and Megatron with
``--sequence-parallel`` (Korthikanti et al., arXiv 2205.05198, section 4.2.2): between the
blocks' split GEMMs the residual stream, its norms and adds hold 1/tp of the tokens on each
rank. The collectives that join the ranks (an all-gather of the tokens before each split
region, a reduce-scatter after it) are stand-ins here that move no data (``_SeqGather``,
``_SeqScatter``: allocations, free in the capture); the scale-out times them
(analysis/scaling.py, ``tensor_parallel_collectives``). So a ``tp`` > 1 module is for analysis:
its collectives carry no values. ``sequence_parallel=False`` is Megatron's original scheme
(Shoeybi et al., section 3; Megatron-LM before 2022, and without ``--sequence-parallel``
since): every rank holds all the tokens between the split regions, so it runs the norms,
dropouts and residual adds of the whole residual stream itself, and the ranks join by an
all-reduce after each split region (forward) and before it (backward), which move nothing
here either: the tensors keep their shape.

``tp_impl`` says whose implementation runs the split layers. ``"torch"``: PyTorch's tensor
parallelism (DTensor, as torchtitan runs it; Megatron-LM before its asynchronous backward of
2021-09): every collective sits between dependent kernels, and autograd keeps what each
column-parallel GEMM read, the gathered [B, T, d] input under sequence parallelism.
``"torch-async"``: the same layers and kept tensors, with PyTorch's async tensor parallelism
(torchtitan's enable_async_tensor_parallel under torch.compile): the scale-out overlaps the
compiled blocks' collectives with the matmuls beside them (analysis/scaling.py).
``"megatron"``: Megatron-LM's column-parallel linear (megatron/mpu/layers.py,
``LinearWithGradAccumulationAndAsyncCommunication``; Korthikanti et al., section 4.2.2): in
the backward the input gradient's all-reduce, or under sequence parallelism its
reduce-scatter, runs beside the weight-gradient GEMM, and under sequence parallelism the layer
keeps only its input's shard and all-gathers it again in the backward, beside the
data-gradient GEMM (``ColumnParallelLinear``). The scale-out times those collectives against
the GEMMs they run beside (analysis/scaling.py). Megatron runs the model in its dtype (bf16
or fp16 parameters, fp32 master weights), so this form takes no autocast. ``"te"``:
Megatron-Core's blocks built from TransformerEngine's layers with --tp-comm-overlap
(userbuffers): the same kernels and kept shard as ``"megatron"`` (TE's LayerNormLinear also
keeps its normalised input's shard and gathers it again for the weight gradient), and the
scale-out overlaps the forward's collectives and the row-parallel layers' backward ones too.

``cp`` > 1 builds one rank of context parallelism (Megatron-Core's --context-parallel-size,
TransformerEngine's attention; Llama 3, arXiv 2407.21783, section 3.3.2): every sequence is
cut into 2 cp chunks and each rank holds two of them (``cp_attention_kernels``), so every
layer but the attention runs on seq_len / cp tokens, and the attention of the rank's queries
against the keys and values of the chunks before them runs as kernels on K and V that come
from the other ranks, by a ring of sends beside the kernels (``cp_comm="p2p"``) or an
all-gather before them (``"allgather"``). Those exchanges are stand-ins that move no data
(``_CPExchange``), timed by the scale-out, so a ``cp`` > 1 module, too, is for analysis. The
ranks hold the same weights: their gradients are reduced over the data-parallel and
context-parallel ranks together.

``attention="math"`` computes attention as Megatron-LM (2019-2021), NVIDIA's BERT and nanoGPT
without flash do: Q Kᵀ as a batched matmul on a scaled Q, the causal mask filled in, softmax,
dropout on the probabilities, times V, each its own kernel over the [B, H, T, T] scores
(``sdpa``: one fused kernel, as F.scaled_dot_product_attention runs on a current GPU).
``dropout`` > 0 adds GPT-2's and Megatron's four dropouts: after the embeddings, on the
attention probabilities, and on each split region's output before its residual add.

Written for analysis: it is ordinary PyTorch, so the same module trains, and dlperf analyze sees
the kernels a language-model user runs (QKV projection, attention, MLP, LM head over the vocab).
The Llama form runs the kernels of torchtitan's Llama (torchtitan/models/llama/model.py, 2024):
RMSNorm computed in FP32 from its elementwise ops, rotary embedding in FP32 (its complex
multiply; ``rope`` picks another stack's kernels: ``apply_rope``), K and V heads repeated to
the query heads before attention, separate q, k, v projections. Under
``tp_impl="te"`` it runs Megatron-Core's fused kernels instead (``GPTConfig.fused_kernels``,
models/fused.py): RMSNorm, SwiGLU and the rotary embedding one kernel each, K and V given to
the attention kernel as they are; with ``fp8`` its blocks' linear layers are TransformerEngine's
FP8 layers (models/fp8.py), q, k and v sharing one cast of their input, as SwiGLU's two do.
With ``fp8="tensorwise"`` or ``"rowwise"`` (``tp_impl="torch"`` or ``"torch-async"``) they are
torchao's float8 layers instead (models/float8.py), as torchtitan converts them; its output
layer stays in the model's dtype either way (torchtitan's float8 converter leaves ``output``
out). Under tensor parallelism with sequence parallelism the tensorwise recipe casts each
split region's input on the rank's shard of the tokens and gathers it in FP8, and casts the
row-parallel layers' output gradient on the shard and gathers that in FP8 (torchao's float8
tensor-parallel styles; ``Block``); the rowwise recipe gathers in BF16 and casts after.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.nn import functional as F

from dlperf.models.float8 import RECIPES as FLOAT8_RECIPES
from dlperf.models.float8 import Float8Cast, Float8GradCast, Float8Linear, scatter_float8
from dlperf.models.fp8 import TE_RECIPES as FP8_RECIPES
from dlperf.models.fp8 import align as fp8_align
from dlperf.models.fp8 import Fp8Linear, call, grouped_fp8, shared_cast
from dlperf.models.banded import banded_attention
from dlperf.models.fused import (ClampedQuickGeGLU, FusedRMSNorm, FusedSwiGLU, WeightedGLU,
                                 fused_rope, moe_permute, moe_unpermute)


# How context parallelism moves K and V (GPTConfig.cp_comm): "p2p", TransformerEngine's ring
# (Megatron-Core's default --cp-comm-type); "allgather", every rank's gathered before the
# attention (Llama 3's; Megatron-Core's all_gather)
CP_COMMS = ("p2p", "allgather")
# The gated MLP's activations (GPTConfig.glu)
GLUS = ("silu", "clamped-quick-gelu")
# The unfused rotary embeddings of the stacks Llama is trained with: one rotation, three sets
# of kernels, and their traffic differs by 2x (``apply_rope``).
ROPE_FORMS = ("complex", "matrix", "half")


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
    # Llama form: "rmsnorm", "swiglu" (hidden size ffn_hidden), "rope", kv_heads < heads (GQA)
    norm: str = "layernorm"  # layernorm | rmsnorm
    mlp: str = "gelu"  # gelu (mlp_ratio x d_model) | swiglu (ffn_hidden)
    ffn_hidden: int | None = None  # swiglu's hidden size
    positions: str = "learned"  # learned | rope
    kv_heads: int | None = None  # None: as heads (multi-head attention)
    rope_theta: float = 10000.0
    # whose unfused rotary-embedding kernels (ROPE_FORMS; ``apply_rope``): "complex"
    # (torchtitan's and Meta's reference Llama), "matrix" (IBM's fms), "half" (Hugging Face
    # transformers' rotate_half); under ``fused_kernels`` one TransformerEngine kernel instead
    rope: str = "complex"
    norm_eps: float = 1e-5
    tp: int = 1  # tensor-parallel ranks: this module is one of them (see the module docstring)
    # tp > 1: the residual stream split over the ranks' tokens between the split regions
    # (True) or whole on every rank (False: Megatron without --sequence-parallel)
    sequence_parallel: bool = True
    # whose tensor parallelism: "torch" (DTensor) | "megatron" | "te" (TransformerEngine's
    # layers under Megatron-LM; see the module docstring)
    tp_impl: str = "torch"
    attention: str = "sdpa"  # sdpa (one fused kernel) | math (matmul, mask, softmax, matmul)
    dropout: float = 0.0  # GPT-2's embedding, attention and residual dropout (training only)
    # context-parallel ranks: this module is one of them and holds seq_len / cp tokens of every
    # sequence (see the module docstring), K and V reaching the other ranks' queries by
    # "p2p" (TransformerEngine's ring, Megatron-Core's default --cp-comm-type) or "allgather"
    # (Llama 3's; Megatron-Core's all_gather)
    cp: int = 1
    cp_comm: str = "p2p"
    # the blocks' linear layers in FP8 as TransformerEngine runs them (models/fp8.py): None
    # (BF16/FP16 GEMMs), "delayed" or "current" (per-tensor) or "mxfp8" (block) scaling, the
    # last on Blackwell only (``fp8_tn_only`` False); the output layer stays in the model's
    # dtype (Megatron-Core's is not a TE layer). Needs tp_impl "te". Or as torchao runs them
    # (models/float8.py, torchtitan's float8 converter): "tensorwise" or "rowwise", with
    # tp_impl "torch" or "torch-async" (PyTorch's tensor parallelism, torchtitan's).
    fp8: str | None = None
    # torchao only: FSDP gathers the float8 layers' weights in FP8, cast before the gather
    # (torchtitan's enable_fsdp_float8_all_gather)
    fp8_all_gather: bool = False
    # whether the GPU's FP8 GEMMs take only "TN" operands (Hopper, Ada: the casts also write
    # transposes) or any layout (Blackwell and later)
    fp8_tn_only: bool = True
    # a mixture of experts in every block in place of the MLP (``MoE``; 0: the dense MLP):
    # ``experts`` routed experts, each token sent to ``top_k`` of them, each expert an MLP of
    # the block's form (SwiGLU or GELU) with ``expert_hidden`` units (None: the dense MLP's)
    experts: int = 0
    top_k: int = 2
    expert_hidden: int | None = None
    # expert-parallel ranks: this module is one of them and holds experts / ep of the experts
    # (Megatron-Core's --expert-model-parallel-size; see ``MoE``)
    ep: int = 1
    # the busiest expert-parallel rank's tokens over the balanced share (>= 1; 1: a perfectly
    # balanced router): the step waits for that rank's experts and its all-to-alls
    expert_load: float = 1.0
    # each head's size where it is not d_model / heads (Qwen3's and gpt-oss's projections
    # widen or narrow the residual stream: gpt-oss-120b has 64 heads of 64 on 2,880)
    head_size: int | None = None
    # sliding-window attention (gpt-oss): each query attends to itself and the window - 1
    # tokens before it (0: all of them), in every block but each ``full_every``-th, counted
    # from 1, which attends to all (0: no block does); Megatron-Core's window_size (w - 1, 0)
    # and window_attn_skip_freq. Runs as one fused kernel (models/banded.py).
    window: int = 0
    full_every: int = 0
    # a learned logit per head in every softmax's denominator (gpt-oss's attention sinks,
    # Megatron-Core's softmax_type "learnable"): one fused kernel too (models/banded.py)
    sinks: bool = False
    # the gated MLP's activation (mlp "swiglu", and the experts'): "silu" (SwiGLU,
    # silu(gate) x up) or "clamped-quick-gelu" (gpt-oss's: gate clamped to at most 7, up to
    # [-7, 7], gate x sigmoid(1.702 gate) x (up + 1); Megatron-Core's quick_gelu with
    # activation_func_clamp_value 7 and glu_linear_offset 1, fused with its bias)
    glu: str = "silu"
    # each head's q and k normalised over its head size before the rotary embedding, with the
    # model's norm (Qwen3's; Megatron-Core's --qk-layernorm): two norms of head-size weights a
    # block, each one kernel under ``fused_kernels``
    qk_norm: bool = False

    def __post_init__(self):
        for name in ("layers", "d_model", "heads", "vocab", "seq_len", "mlp_ratio"):
            if getattr(self, name) <= 0:
                raise ValueError(f"GPT {name} must be positive, got {getattr(self, name)}")
        if self.head_size is not None and self.head_size <= 0:
            raise ValueError(f"GPT head size must be positive, got {self.head_size}")
        if self.head_size is None and self.d_model % self.heads:
            raise ValueError(f"GPT d_model ({self.d_model}) must be divisible by heads "
                             f"({self.heads})")
        for name, allowed in (("norm", ("layernorm", "rmsnorm")), ("mlp", ("gelu", "swiglu")),
                              ("positions", ("learned", "rope")), ("rope", ROPE_FORMS),
                              ("attention", ("sdpa", "math")), ("glu", GLUS),
                              ("tp_impl", ("torch", "torch-async", "megatron", "te")),
                              ("cp_comm", CP_COMMS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"GPT {name} must be one of {', '.join(allowed)}, "
                                 f"got {getattr(self, name)!r}")
        if self.mlp == "swiglu" and not (self.ffn_hidden and self.ffn_hidden > 0):
            raise ValueError("GPT mlp 'swiglu' needs a positive ffn_hidden")
        if self.kv_heads is not None and (self.kv_heads <= 0 or self.heads % self.kv_heads):
            raise ValueError(f"GPT kv_heads ({self.kv_heads}) must divide heads ({self.heads})")
        if self.positions == "rope" and self.head_dim % 2:
            raise ValueError("GPT rotary positions need an even head size")
        if self.tp < 1:
            raise ValueError(f"tensor-parallel ranks must be at least 1, got {self.tp}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPT dropout must be in [0, 1), got {self.dropout}")
        hidden = self.ffn_hidden if self.mlp == "swiglu" else self.mlp_ratio * self.d_model
        for name, value in (("heads", self.heads), ("kv_heads", self.kv_heads or self.heads),
                            ("MLP hidden size", hidden)):
            if value % self.tp:
                raise ValueError(f"tensor parallel over {self.tp} GPUs splits the {name} "
                                 f"({value}): give a tensor-parallel size that divides it")
        if self.fp8 is not None and self.fp8 not in FP8_RECIPES + FLOAT8_RECIPES:
            raise ValueError(f"GPT fp8 must be one of "
                             f"{', '.join(FP8_RECIPES + FLOAT8_RECIPES)}, got {self.fp8!r}")
        if self.fp8 in FP8_RECIPES and self.tp_impl != "te":
            raise ValueError("FP8 layers with delayed, current or MXFP8 scaling are "
                             "TransformerEngine's: tp_impl must be 'te'")
        if self.fp8 in FLOAT8_RECIPES and self.tp_impl not in ("torch", "torch-async"):
            raise ValueError("torchao's float8 layers run on PyTorch's tensor parallelism: "
                             "tp_impl 'torch' or 'torch-async'")
        if self.fp8_all_gather and self.fp8 != "tensorwise":
            raise ValueError("fp8_all_gather is torchao's float8 all-gather: it needs fp8 "
                             "'tensorwise' (the rowwise recipe gathers its weights in BF16)")
        if self.cp < 1:
            raise ValueError(f"context-parallel ranks must be at least 1, got {self.cp}")
        if self.cp > 1 and self.seq_len % (2 * self.cp):
            raise ValueError(f"context parallel over {self.cp} GPUs cuts each sequence into "
                             f"{2 * self.cp} equal chunks (two a rank): give a sequence length "
                             f"that {2 * self.cp} divides, not {self.seq_len}")
        if self.window < 0 or self.full_every < 0:
            raise ValueError(f"attention window and full_every must be 0 (none) or positive, "
                             f"got {self.window} and {self.full_every}")
        if self.glu != "silu" and self.mlp != "swiglu":
            raise ValueError(f"glu {self.glu!r} is a gated MLP's activation: it needs mlp "
                             "'swiglu'")
        if self.full_every and not self.window:
            raise ValueError("full_every (--full-attention-every) picks the blocks a sliding "
                             "window skips: it needs a window")
        if (self.window or self.sinks) and (self.attention != "sdpa" or self.cp > 1
                                            or self.dropout):
            raise ValueError("a sliding window and attention sinks are modelled as one fused "
                             "kernel on one rank's whole sequences, without dropout: use "
                             "attention 'sdpa' without context parallelism or dropout")
        if self.cp > 1 and self.attention != "sdpa":
            raise ValueError("context parallelism splits the fused attention kernel over the "
                             "ranks' chunks: use attention 'sdpa'")
        if self.experts:
            if self.experts < 2 or not 1 <= self.top_k <= self.experts:
                raise ValueError(f"a mixture of experts needs at least 2 experts and a top-k "
                                 f"from 1 to their number, got {self.experts} experts, top-k "
                                 f"{self.top_k}")
            if self.expert_hidden is not None and self.expert_hidden <= 0:
                raise ValueError(f"expert hidden size must be positive, got "
                                 f"{self.expert_hidden}")
            if self.ep < 1 or self.experts % self.ep:
                raise ValueError(f"expert parallel over {self.ep} GPUs splits the "
                                 f"{self.experts} experts: give a size that divides them")
            if self.tp > 1:
                raise ValueError("a mixture of experts is modelled without tensor parallelism "
                                 "(expert tensor parallelism is not): drop --tp")
            if self.fp8 in FLOAT8_RECIPES:
                raise ValueError("a mixture of experts in FP8 is modelled as TransformerEngine "
                                 "runs its grouped GEMMs (Megatron-Core's), not torchao's: use "
                                 "--fp8 delayed or current with --tp-impl te")
            if self.fp8 is not None and (self.d_model % fp8_align(self.fp8)
                                         or self.expert_ffn % fp8_align(self.fp8)):
                raise ValueError(f"FP8 experts need d_model ({self.d_model}) and the expert "
                                 f"hidden size ({self.expert_ffn}) to be multiples of "
                                 f"{fp8_align(self.fp8)} (TransformerEngine's FP8 GEMMs): "
                                 "change them or drop --fp8")
            if not (self.expert_load >= 1.0 and self.expert_load < float("inf")):
                raise ValueError(f"expert load is the busiest rank's tokens over the balanced "
                                 f"share, 1 or more, got {self.expert_load}")
            if self.expert_load != 1.0 and self.ep == 1:
                raise ValueError("expert load is the busiest expert-parallel rank's: with all "
                                 "the experts on one GPU its grouped GEMMs run every token "
                                 "whatever the balance; add expert parallelism (ep > 1)")
        elif self.ep != 1 or self.expert_load != 1.0:
            raise ValueError("expert parallelism and expert load need a mixture of experts "
                             "(experts > 0)")
        if self.sequence_parallel and self.local_seq_len % self.tp:
            raise ValueError(f"tensor parallel over {self.tp} GPUs splits the sequence "
                             f"({self.local_seq_len} tokens"
                             + (f" on each of {self.cp} context-parallel ranks" if self.cp > 1
                                else "") + ") between the blocks: give a tensor-parallel "
                             "size that divides it")

    @property
    def groups(self) -> int:
        """Query heads per K/V head (1: multi-head attention)."""
        return self.heads // (self.kv_heads or self.heads)

    @property
    def fused_kernels(self) -> bool:
        """Whether a Llama block runs Megatron-Core's fused kernels on TransformerEngine
        (``tp_impl="te"``; models/fused.py): RMSNorm, SwiGLU and the rotary embedding each one
        kernel keeping only what it needs, and grouped-query attention without the copy of K
        and V to the query heads (cuDNN's and flash attention's kernels take them as they are).
        The GPT-2 form's LayerNorm and GELU are single kernels already."""
        return self.tp_impl == "te"

    @property
    def token_split(self) -> int:
        """Ranks the residual stream's tokens are split over between the split regions: tp
        with sequence parallelism, 1 (every rank holds them all) without it."""
        return self.tp if self.sequence_parallel else 1

    @property
    def regather(self) -> int:
        """Ranks a column-parallel layer gathers its input's tokens from, when the layer keeps
        only its shard and gathers it again in the backward (Megatron's sequence parallelism);
        1 when the layer is given its input whole (gathered before it, or never split)."""
        return self.token_split if self.tp_impl in ("megatron", "te") else 1

    @property
    def float8_gather(self) -> bool:
        """Whether the split regions gather torchao's FP8 data (the tensorwise recipe under
        sequence parallelism: the module docstring, ``Block``), not the BF16 tokens."""
        return self.fp8 == "tensorwise" and self.token_split > 1

    @property
    def local_seq_len(self) -> int:
        """Tokens of each sequence on one context-parallel rank (all of them without)."""
        return self.seq_len // self.cp

    @property
    def head_dim(self) -> int:
        return self.head_size or self.d_model // self.heads

    def block_window(self, index: int) -> int:
        """The sliding window of block ``index`` (from 0), 0 where it attends to all: every
        ``full_every``-th block counted from 1 does (Megatron-Core's
        ``is_layer_window_attention``: gpt-oss's blocks 0, 2, 4, ... are windowed)."""
        if self.full_every and (index + 1) % self.full_every == 0:
            return 0
        return self.window

    @property
    def local_experts(self) -> int:
        """Experts on one expert-parallel rank."""
        return self.experts // self.ep

    @property
    def expert_ffn(self) -> int:
        """Each expert's hidden units: ``expert_hidden``, else the dense MLP's."""
        return self.expert_hidden or (self.ffn_hidden if self.mlp == "swiglu"
                                      else self.mlp_ratio * self.d_model)

    def expert_rows(self, tokens: int) -> int:
        """Rows the busiest expert-parallel rank's experts run for a micro-batch of ``tokens``
        on each rank: ``top_k`` x tokens (every rank's tokens' assignments to its experts,
        balanced) x ``expert_load``, in equal groups per local expert (``MoE``); in FP8 each
        group padded to a multiple of 16 rows (32 under MXFP8), as TransformerEngine's FP8
        GEMMs need (Megatron-Core's TEGroupedMLP pads each expert's tokens, ``Fp8Padding``,
        to ``get_fp8_align_size``)."""
        group = math.ceil(tokens * self.top_k * self.expert_load / self.local_experts)
        if self.fp8 is not None:
            group = -(-group // fp8_align(self.fp8)) * fp8_align(self.fp8)
        return group * self.local_experts

    @property
    def local_heads(self) -> int:
        """Query heads on one tensor-parallel rank."""
        return self.heads // self.tp

    @property
    def local_vocab(self) -> int:
        """The vocabulary slice of one rank (Megatron pads the vocabulary to a multiple of the
        ranks; the last slice is as wide as the others)."""
        return -(-self.vocab // self.tp)


class RMSNorm(nn.Module):
    """x / rms(x) x weight, computed in FP32 and cast back (torchtitan's ``RMSNorm``: the
    kernels its published Llama runs made, not a fused one)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight


def _norm(cfg: "GPTConfig", dim: int | None = None) -> nn.Module:
    """The model's norm over ``dim`` features (None: the residual stream's, d_model)."""
    dim = dim or cfg.d_model
    if cfg.norm == "rmsnorm":
        return (FusedRMSNorm if cfg.fused_kernels else RMSNorm)(dim, cfg.norm_eps)
    return nn.LayerNorm(dim, bias=cfg.bias)


def rope_tables(head_dim: int, seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [seq_len, head_dim / 2] of the rotary embedding (RoFormer; Llama's
    ``precompute_freqs_cis``, as real tables instead of complex ones)."""
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), freqs)
    return angles.cos(), angles.sin()


def rope_buffers(cfg: GPTConfig) -> dict[str, torch.Tensor]:
    """The rotary tables a model of ``cfg`` keeps, by the form that reads them (FP32, or
    complex64; non-persistent buffers, made once as each stack caches them)."""
    cos, sin = rope_tables(cfg.head_dim, cfg.seq_len, cfg.rope_theta)
    if cfg.fused_kernels:  # TransformerEngine's kernel reads the half-width tables
        return {"rope_cos": cos, "rope_sin": sin}
    if cfg.rope == "complex":  # torchtitan's freqs_cis: torch.polar(1, angles), complex64
        return {"rope_cis": torch.complex(cos, sin)}
    if cfg.rope == "matrix":  # fms's cached_freqs: [[cos, -sin], [sin, cos]] per pair
        return {"rope_rot": torch.stack((cos, -sin, sin, cos), 2).view(*cos.shape, 2, 2)}
    # transformers' LlamaRotaryEmbedding: emb = cat(freqs, freqs), cos and sin of it
    return {"rope_cos": torch.cat((cos, cos), -1), "rope_sin": torch.cat((sin, sin), -1)}


def apply_rope(q: torch.Tensor, k: torch.Tensor, tables: tuple, form: str
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k [B, T, H, D] with each pair of features turned by position t's angle, as the
    stack ``form`` writes it (the tables: ``rope_buffers``, as ``GPT.forward`` hands them);
    the same rotation (tests/test_llama.py checks each form against a float64 complex
    multiply), but not the same kernels:

    * "complex": torchtitan's and Meta's ``apply_rotary_emb`` (torchtitan/models/llama/
      model.py, 2024): the pairs viewed as complex64, one complex multiply by the table, cast
      back. Per element of q: a cast in (2 + 4 B), the multiply (4 + 4 B), a cast out (4 +
      2 B): 20 B, three kernels; its backward the same, plus autograd's copy of the
      non-contiguous gradient before view_as_complex.
    * "matrix": IBM's fms (``RotaryEmbedding.adjusted_qk`` of ibm-fms 0.0.3, 2024-01, which
      fms-fsdp's published runs used): q and k transposed to [B, H, T, D] first, the positions
      gathered from the [T, D/2, 2, 2] rotation matrices, each pair broadcast against its
      matrix ([..., D/2, 2, 2] in FP32: twice q's elements) and summed, cast back and made
      contiguous (already so): 36 B per element, and a gather of the matrices per call.
    * "half": Hugging Face transformers' ``apply_rotary_pos_emb``: q cos + rotate_half(q) sin
      in the tables' dtype (the residual stream's: the model's dtype, or FP32 under autocast,
      where q is promoted), rotate_half a negation and a concatenation of q's halves.
      (It pairs feature i with i + D/2, not 2i with 2i + 1: the checkpoint converters
      permute the q and k weights to match, so the rotation is the same.)"""
    if form == "complex":
        cis = tables[0][:q.shape[1], None, :]  # reshape_for_broadcast: [1, T, 1, D/2]

        def turn(x):
            z = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
            return torch.view_as_real(z * cis).flatten(3).type_as(x)

        return turn(q), turn(k)
    if form == "matrix":
        b, t = q.shape[:2]
        positions = torch.arange(t, device=q.device).repeat(b, 1)
        # [B, 1, T, D/2, 2, 2] (fms also takes the largest start position, a reduction over
        # B elements: not counted)
        rot = tables[0][positions].unsqueeze(1).float()

        def turn(x):  # x [B, T, H, D] -> fms's [B, H, T, D] and back
            xt = x.transpose(1, 2)
            pairs = xt.float().reshape(*xt.shape[:-1], -1, 2)
            out = rot.mul(pairs.unsqueeze(-2)).sum(5).flatten(3)
            return out.type_as(x).contiguous().transpose(1, 2)

        return turn(q), turn(k)
    if form == "half":
        cos, sin = (z[None, :q.shape[1], None, :] for z in tables)

        def turn(x):
            half = x.shape[-1] // 2
            return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin

        return turn(q), turn(k)
    raise ValueError(f"rotary embedding form must be one of {', '.join(ROPE_FORMS)}, "
                     f"got {form!r}")


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: GPTConfig, training: bool,
           mask: torch.Tensor | None = None, window: int = 0,
           sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of q, k, v [B, H, T, D]: one fused kernel (``sdpa``), or ``math``'s
    kernels (module docstring) with ``mask`` [T, T] True above the diagonal (GPT.causal). k
    and v may have fewer heads than q (a divisor) for ``sdpa`` only: the kernel reads each
    K/V head for its group of query heads. A sliding ``window`` or ``sinks`` (gpt-oss's):
    models/banded.py's one kernel (GPTConfig refuses them with ``math``)."""
    if window or sinks is not None:
        return banded_attention(q, k, v, window, sinks)
    p = cfg.dropout if training else 0.0
    if cfg.attention == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True,
                                              enable_gqa=k.shape[1] != q.shape[1])
    t = q.shape[-2]
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)
    probs = F.softmax(scores.masked_fill(mask[:t, :t], float("-inf")), dim=-1)
    return F.dropout(probs, p, training) @ v


def cp_attention_kernels(cp: int, rank: int, comm: str
                         ) -> tuple[tuple[tuple[int, ...], tuple[int, ...], bool], ...]:
    """The attention kernels of context-parallel rank ``rank`` of ``cp``, in order, as (query
    chunks, key chunks, causal). Each sequence is cut into 2 cp equal chunks and rank r holds
    chunks r and 2 cp - 1 - r, so that every rank has the same share of the causal work
    (Megatron-Core's and Llama 3's load balancing); a kernel's chunks are concatenated in
    that order, so ``causal`` is the plain causal mask on the concatenation.

    * "p2p" (TransformerEngine's ring, ``AttnFuncWithCPAndKVP2P``): step 0 on the rank's own
      K and V, causal; step s on those of rank (r - s) mod cp, passed on around the ring
      beside the step before: all the rank's queries against that rank's first chunk when it
      precedes this one, else this rank's second chunk against both of its chunks. cp kernels
      of equal work.
    * "allgather" (Llama 3, section 3.3.2; Megatron-Core's all_gather): K and V of every rank
      gathered first, then each of the rank's chunks against the chunks before it (one
      kernel) and against itself (causal): the work of one causal kernel with its mask
      aligned bottom-right, in two kernels here, because PyTorch's is_causal aligns it
      top-left.

    Together the kernels of the cp ranks compute exactly the causal attention of the whole
    sequence (tests/test_context_parallel.py checks it in float64)."""
    if comm not in CP_COMMS:
        raise ValueError(f"context-parallel communication {comm!r}: one of "
                         f"{', '.join(CP_COMMS)}")
    if not 0 <= rank < cp:
        raise ValueError(f"context-parallel rank {rank} of {cp}")
    mine = (rank, 2 * cp - 1 - rank)
    if comm == "allgather":
        return tuple(kernel for q in mine
                     for kernel in ((((q,), tuple(range(q)), False),) if q else ())
                     + (((q,), (q,), True),))
    kernels = [(mine, mine, True)]
    for step in range(1, cp):
        src = (rank - step) % cp
        kernels.append((mine, (src,), False) if src < rank
                       else ((mine[1],), (src, 2 * cp - 1 - src), False))
    return tuple(kernels)


class _CPExchange(torch.autograd.Function):
    """Context parallelism's exchange of K or V [B, H, T, D] between the ranks: the ring's
    receipt of a neighbour's chunks (``factor`` 1; its backward, their gradient sent on) or
    the all-gather of every rank's (``factor`` cp; its backward, a reduce-scatter). A stand-in
    as ``_SeqGather``: allocated, no kernel; the scale-out times the transfers
    (analysis/scaling.py, ``context_parallel_s``)."""

    @staticmethod
    def forward(ctx, x, factor: int):
        ctx.shape = x.shape
        return x.new_empty((*x.shape[:2], x.shape[2] * factor, x.shape[3]))

    @staticmethod
    def backward(ctx, grad):
        return grad.new_empty(ctx.shape), None


def _repeat_heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    """K or V [B, Hkv, T, D] repeated to the query heads (a copy, as Llama's ``repeat_kv``)."""
    if groups == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, groups, t, d).reshape(b, h * groups, t, d)


def cp_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: GPTConfig,
              training: bool) -> torch.Tensor:
    """One context-parallel rank's causal attention (``cp_attention_kernels``, for the last
    rank, whose two chunks both have chunks before them: the most kernels): q [B, H, 2c, D]
    the queries of its two chunks, k and v [B, Hkv, 2c, D] their keys and values (before any
    repeat to the query heads). The other ranks' K and V are stand-ins (``_CPExchange``), so
    this is for analysis, as a ``tp`` > 1 module is. Each kernel's output is merged into its
    chunks' by one elementwise pass, in place of the merge by log-sum-exp that
    TransformerEngine runs (about the same traffic), and the two chunks' outputs are joined
    once at the end. TransformerEngine's ring keeps only the rank's own K and V and passes
    them around again in the backward; here each kernel keeps what it read (the memory of
    cp - 1 more K and V a layer, small under grouped-query attention)."""
    cp, c = cfg.cp, q.shape[-2] // 2
    rank = cp - 1
    mine = (rank, 2 * cp - 1 - rank)
    groups = q.shape[1] // k.shape[1]
    p = cfg.dropout if training else 0.0
    if cfg.cp_comm == "allgather":  # every rank's chunks, in sequence order
        every = (_CPExchange.apply(k, cp), _CPExchange.apply(v, cp))
    halves: list[torch.Tensor | None] = [None, None]  # the outputs of the two chunks
    received, source = None, None
    for qs, ks, causal in cp_attention_kernels(cp, rank, cfg.cp_comm):
        if cfg.cp_comm == "allgather":
            keys, values = (x[:, :, ks[0] * c:(ks[-1] + 1) * c] for x in every)
        elif ks == mine:
            keys, values = k, v
        else:
            src = min(ks)
            if src != source:  # the next step's K and V, from around the ring
                received, source = (_CPExchange.apply(k, 1), _CPExchange.apply(v, 1)), src
            keys, values = (x if len(ks) == 2 else x[:, :, :c] for x in received)
        query = q if qs == mine else q[:, :, :c] if qs == (mine[0],) else q[:, :, c:]
        if not cfg.fused_kernels:  # (TransformerEngine's kernels take K and V as they are)
            keys, values = _repeat_heads(keys, groups), _repeat_heads(values, groups)
        out = F.scaled_dot_product_attention(query, keys, values, dropout_p=p,
                                             is_causal=causal,
                                             enable_gqa=keys.shape[1] != query.shape[1])
        parts = (out[:, :, :c], out[:, :, c:]) if qs == mine else (out,)
        for chunk, part in zip(qs, parts):
            i = mine.index(chunk)
            halves[i] = part if halves[i] is None else halves[i] + part
    return torch.cat(halves, 2)


def _sinks(cfg: GPTConfig) -> nn.Parameter | None:
    """A rank's heads' attention sinks (``GPTConfig.sinks``), None without."""
    return nn.Parameter(torch.zeros(cfg.local_heads)) if cfg.sinks else None


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig, window: int = 0):
        super().__init__()
        self.cfg, self.window, self.sinks = cfg, window, _sinks(cfg)
        self.heads, self.head_dim = cfg.local_heads, cfg.head_dim  # this rank's heads
        width = self.heads * self.head_dim  # (d_model / tp, unless cfg.head_size)
        self.qkv = _column(cfg, cfg.d_model, 3 * width, cfg.bias)
        self.proj = _row(cfg, width, cfg.d_model, cfg.bias)

    def forward(self, x: torch.Tensor, rope=None, mask=None, cast=None,
                grad_cast=None) -> torch.Tensor:
        # (x: this rank's shard of the tokens when the projection gathers; cast, grad_cast:
        # torchao's float8 tensor parallelism, ``Block``)
        qkv = call(self.qkv, x, cast)
        b, t, _ = qkv.shape
        # [B, T, 3 H D] -> 3 x [B, H, T, D]
        q, k, v = qkv.view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        y = (cp_attend(q, k, v, self.cfg, self.training) if self.cfg.cp > 1
             else attend(q, k, v, self.cfg, self.training, mask, self.window, self.sinks))
        return call_row(self.proj, y.transpose(1, 2).reshape(b, t, self.heads * self.head_dim),
                        grad_cast)


class GQAttention(nn.Module):
    """Llama's attention: q, k, v projections (k and v with kv_heads heads), under
    ``qk_norm`` each head's q and k normalised (Qwen3's), rotary positions on q and k, k and v
    repeated to the query heads (a copy, as ``repeat_kv``; not under ``fused_kernels`` with
    SDPA, whose kernel reads them per group), causal SDPA."""

    def __init__(self, cfg: GPTConfig, window: int = 0):
        super().__init__()
        self.cfg, self.window, self.sinks = cfg, window, _sinks(cfg)
        # this rank's query and K/V heads
        self.heads, self.kv_heads = cfg.local_heads, (cfg.kv_heads or cfg.heads) // cfg.tp
        self.head_dim = cfg.head_dim
        self.wq = _column(cfg, cfg.d_model, self.heads * self.head_dim, cfg.bias)
        self.wk = _column(cfg, cfg.d_model, self.kv_heads * self.head_dim, cfg.bias)
        self.wv = _column(cfg, cfg.d_model, self.kv_heads * self.head_dim, cfg.bias)
        self.wo = _row(cfg, self.heads * self.head_dim, cfg.d_model, cfg.bias)
        # (Megatron-Core's q_layernorm and k_layernorm: one norm over each head's features)
        self.q_norm, self.k_norm = ((_norm(cfg, self.head_dim), _norm(cfg, self.head_dim))
                                    if cfg.qk_norm else (None, None))

    def forward(self, x: torch.Tensor, rope=None, mask=None, cast=None,
                grad_cast=None) -> torch.Tensor:
        # FP8: x cast once for the three (Megatron's linear_qkv), or before its gather (cast
        # given: torchao's float8 tensor parallelism, ``Block``)
        cast = cast or shared_cast(self.wq, x)
        q = call(self.wq, x, cast)  # (x: this rank's shard of the tokens when they gather)
        b, t, _ = q.shape
        q = q.view(b, t, self.heads, self.head_dim)
        k = call(self.wk, x, cast).view(b, t, self.kv_heads, self.head_dim)
        v = call(self.wv, x, cast).view(b, t, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None and self.cfg.fused_kernels:
            q, k = fused_rope(q, *rope), fused_rope(k, *rope)
        elif rope is not None:
            q, k = apply_rope(q, k, rope, self.cfg.rope)
        groups = self.heads // self.kv_heads
        if self.cfg.cp > 1:  # K and V cross the ranks before their repeat to the query heads
            y = cp_attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), self.cfg,
                          self.training)
            return call_row(self.wo, y.transpose(1, 2).reshape(b, t, self.heads * self.head_dim),
                            grad_cast)
        # (no copy where the kernel reads each K/V head per group: TE's, and models/banded.py's)
        banded = self.window or self.sinks is not None
        if groups > 1 and not (self.cfg.fused_kernels and self.cfg.attention == "sdpa"
                               or banded):
            k, v = (z[:, :, :, None].expand(b, t, self.kv_heads, groups, self.head_dim)
                    .reshape(b, t, self.heads, self.head_dim) for z in (k, v))
        y = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), self.cfg,
                   self.training, mask, self.window, self.sinks)
        return call_row(self.wo, y.transpose(1, 2).reshape(b, t, self.heads * self.head_dim),
                        grad_cast)


class _SeqGather(torch.autograd.Function):
    """Sequence parallelism's all-gather of the tokens before a split region (its backward, a
    reduce-scatter): the full-length tensor, allocated (no kernel); the scale-out times the
    collective itself. ``shape_only``: what is gathered is the FP8 cast of x (torchao's float8
    tensor parallelism, ``Block``), which the region's layers read instead, so this carries
    only the shape and the gradient's path: one element, expanded."""

    @staticmethod
    def forward(ctx, x, tp: int, shape_only: bool = False):
        ctx.tokens = x.shape[1]
        shape = (x.shape[0], x.shape[1] * tp, *x.shape[2:])
        return (x.new_empty((1,) * x.dim()).expand(shape) if shape_only
                else x.new_empty(shape))

    @staticmethod
    def backward(ctx, grad):
        return grad.new_empty((grad.shape[0], ctx.tokens, *grad.shape[2:])), None, None


class _SeqScatter(torch.autograd.Function):
    """Sequence parallelism's reduce-scatter after a split region (its backward, an
    all-gather): this rank's 1/tp of the tokens, allocated (no kernel)."""

    @staticmethod
    def forward(ctx, x, tp: int):
        ctx.tokens = x.shape[1]
        return x.new_empty((x.shape[0], x.shape[1] // tp, *x.shape[2:]))

    @staticmethod
    def backward(ctx, grad):
        return grad.new_empty((grad.shape[0], ctx.tokens, *grad.shape[2:])), None


class _MegatronColumn(torch.autograd.Function):
    """Megatron-LM's column-parallel linear under sequence parallelism (megatron/mpu/layers.py,
    ``LinearWithGradAccumulationAndAsyncCommunication``, 2022-03): the forward all-gathers the
    tokens and runs the GEMM on them, but keeps only this rank's shard of its input; the
    backward gathers it again (issued before the data-gradient GEMM, which it runs beside),
    computes the input gradient, reduce-scatters it (issued before the weight-gradient GEMM and
    the bias gradient, which it runs beside) and computes the weight gradient from the gathered
    input. The collectives are stand-ins as in ``_SeqGather``: allocations; the scale-out times
    them (analysis/scaling.py, ``tensor_parallel_collectives``). With ``tp`` = 1 they are the
    identity, and this is nn.Linear's math exactly (tests/test_tensor_parallel.py checks the
    gradients against autograd's in float64)."""

    @staticmethod
    def forward(ctx, x, weight, bias, tp: int):
        ctx.save_for_backward(x, weight)  # the shard: 1/tp of what autograd would keep
        ctx.tp, ctx.has_bias = tp, bias is not None
        return F.linear(_gathered(x, tp), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        total = _gathered(x, ctx.tp)  # the backward's all-gather
        grad_total = grad.matmul(weight)  # the input gradient [B, T, in], to be reduce-scattered
        flat = grad.reshape(-1, grad.shape[-1])
        grad_weight = flat.t().matmul(total.reshape(-1, total.shape[-1]))
        grad_bias = flat.sum(0) if ctx.has_bias else None
        grad_x = grad_total if ctx.tp == 1 else x.new_empty(x.shape)  # the reduce-scatter
        return grad_x, grad_weight, grad_bias, None


def _gathered(x: torch.Tensor, tp: int) -> torch.Tensor:
    """The all-gather's stand-in: the tokens of ``tp`` ranks, allocated (x itself for one)."""
    return x if tp == 1 else x.new_empty((x.shape[0], x.shape[1] * tp, *x.shape[2:]))


class ColumnParallelLinear(nn.Linear):
    """A column-parallel layer that gathers its input's tokens itself, Megatron's way
    (``_MegatronColumn``): called with this rank's shard of the tokens. Llama's separate q, k
    and v projections (and SwiGLU's two input layers) are one layer each here, where Megatron
    fuses them into one; the scale-out counts one gather and one reduce-scatter per region,
    as Megatron runs them, and the capture's sum of their input gradients is on the shard."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: int):
        super().__init__(in_features, out_features, bias=bias)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _MegatronColumn.apply(x, self.weight, self.bias, self.tp)


def _column(cfg: GPTConfig, d_in: int, d_out: int, bias: bool, fp8: bool = True) -> nn.Linear:
    """A column-parallel layer: plain (its input gathered before it, or whole) or Megatron's
    (``cfg.regather`` > 1: it gathers its input itself and keeps the shard); in FP8 under
    ``cfg.fp8`` unless ``fp8`` is False (the output layer)."""
    if cfg.fp8 in FLOAT8_RECIPES and fp8:
        return Float8Linear(d_in, d_out, bias, cfg.fp8, gathered=cfg.fp8_all_gather)
    if cfg.fp8 is not None and fp8:
        return Fp8Linear(d_in, d_out, bias, cfg.fp8, gather=cfg.regather,
                         tn_only=cfg.fp8_tn_only)
    if cfg.regather > 1:
        return ColumnParallelLinear(d_in, d_out, bias, cfg.regather)
    return nn.Linear(d_in, d_out, bias=bias)


def _row(cfg: GPTConfig, d_in: int, d_out: int, bias: bool) -> nn.Linear:
    """A row-parallel layer: plain (the block reduce-scatters its output after it), or in FP8
    under ``cfg.fp8``, reduce-scattering its output itself as TE's row-parallel layer does
    (and all-gathering its FP8 output gradient in the backward)."""
    if cfg.fp8 in FLOAT8_RECIPES:
        return Float8Linear(d_in, d_out, bias, cfg.fp8, gathered=cfg.fp8_all_gather)
    if cfg.fp8 is not None:
        return Fp8Linear(d_in, d_out, bias, cfg.fp8, scatter=cfg.token_split,
                         tn_only=cfg.fp8_tn_only)
    return nn.Linear(d_in, d_out, bias=bias)


def _row_split(cfg: GPTConfig) -> int:
    """Ranks the block reduce-scatters a row-parallel layer's output over: none where the
    layer does it itself (TransformerEngine's FP8 layers)."""
    return 1 if cfg.fp8 in FP8_RECIPES else cfg.token_split


def _gather(x: torch.Tensor, tp: int, cast=None) -> torch.Tensor:
    """x's tokens gathered over ``tp`` ranks; a shape-only stand-in when the region's layers
    read ``cast``, x's FP8 cast gathered instead (``Block``)."""
    return x if tp == 1 else _SeqGather.apply(x, tp, cast is not None)


def _scatter(x: torch.Tensor, tp: int, grad_cast=None) -> torch.Tensor:
    """x reduce-scattered over ``tp`` ranks; its gradient cast to FP8 on the shard and
    gathered in FP8 into ``grad_cast`` for the layer that made x (``Block``)."""
    if tp == 1:
        return x
    return _SeqScatter.apply(x, tp) if grad_cast is None else scatter_float8(x, tp, grad_cast)


def call_row(layer: nn.Module, x: torch.Tensor, grad_cast) -> torch.Tensor:
    """A row-parallel layer on x, handed its output gradient's FP8 cast when there is one."""
    return layer(x) if grad_cast is None else layer(x, None, grad_cast)


class MoE(nn.Module):
    """A mixture of experts in place of a block's MLP, as Megatron-Core's MoE layer runs it
    with its all-to-all token dispatcher and grouped GEMMs (Megatron-LM
    megatron/core/transformer/moe/: router, token_dispatcher, experts; Mixtral, arXiv
    2401.04088, section 2): a router (a linear layer to one logit an expert, softmax, top-k,
    the chosen weights renormalised) picks ``top_k`` experts for each token; the token's
    copies are permuted into expert order (a sort of the choices, a gather), sent to the
    ranks holding their experts (all-to-all), run through each local expert's MLP as one
    batched GEMM per layer, sent back (all-to-all) and summed into their tokens weighted by
    the router (a scatter-add).

    One expert-parallel rank (``cfg.ep``): it holds ``experts / ep`` experts and, with a
    balanced router, receives as many token copies as it sent, ``top_k`` x its tokens, in
    equal groups per local expert (``GPTConfig.expert_rows``; ``expert_load`` > 1 pads the
    groups to the busiest rank's share). The all-to-alls move nothing here: the scale-out
    times them (analysis/scaling.py, ``expert_parallel_s``). The groups are the balanced
    shapes, not the router's choices (a grouped GEMM's time follows its rows, not which
    token is in which group), so this module is for analysis, like the tensor-parallel one:
    it runs and has gradients, but a token's copy need not reach the expert it chose.

    Under ``cfg.fused_kernels`` (Megatron-Core on TransformerEngine) gated experts run as
    Megatron-Core's TEGroupedMLP with --moe-permute-fusion does: the permute one kernel
    (models/fused.py ``moe_permute``), w1 and w3 one grouped GEMM (``linear_fc1``: ``w1``
    holds both, [local, d, 2 x hidden], gate then up; ``w3`` is None), the router's weight of
    each copy applied inside the activation (``WeightedGLU``), the unpermute one kernel that
    sums each token's copies (``moe_unpermute``); nothing else is kept than the GEMMs' and the
    activation's inputs. Otherwise the routing runs op by op as above.

    Under ``cfg.fp8`` "delayed", "current" or "mxfp8" the experts' GEMMs run in FP8 as
    TransformerEngine's GroupedLinear runs them (models/fp8.py, ``grouped_fp8``): the permuted
    rows cast once for the fused w1 and w3, the activation cast for w2, each expert's weights
    cast once a step; the router stays in BF16 (Megatron-Core's router is a plain linear layer)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.top_k, self.local = cfg.top_k, cfg.local_experts
        self.swiglu = cfg.mlp == "swiglu"
        self.cfg = cfg
        d, hidden = cfg.d_model, cfg.expert_ffn
        self.router = nn.Linear(d, cfg.experts, bias=cfg.bias)  # whole on every rank
        # Megatron-Core's fused path (see the class docstring): gate and up in one GEMM
        self.fused = cfg.fused_kernels and self.swiglu
        # [experts, in, out]: the grouped GEMM's weights (Megatron's TEGroupedMLP), and with
        # ``bias`` each expert's biases [experts, 1, out] (gpt-oss's)
        self.w1 = nn.Parameter(torch.empty(self.local, d, 2 * hidden if self.fused else hidden))
        self.w3 = (nn.Parameter(torch.empty(self.local, d, hidden))
                   if self.swiglu and not self.fused else None)
        self.w2 = nn.Parameter(torch.empty(self.local, hidden, d))
        for w in (self.w1, self.w3, self.w2):
            if w is not None:
                nn.init.normal_(w, std=0.02)
        self.b1, self.b3, self.b2 = (
            (nn.Parameter(torch.zeros(self.local, 1, w.shape[-1])) if cfg.bias and w is not None
             else None) for w in (self.w1, self.w3, self.w2))
        # (Megatron-Core's experts on TransformerEngine fuse the gated activation as its dense
        # MLP does: --bias-swiglu-fusion, its default; with the router's weights in it)
        self.act = WeightedGLU(cfg.glu) if self.fused else _activation(cfg)
        self.fp8 = cfg.fp8 if cfg.fp8 in FP8_RECIPES else None
        self.tn_only = cfg.fp8_tn_only

    def fp8_weights(self) -> list[torch.Tensor]:
        """The expert weights TE keeps FP8 copies of through a step (none in BF16):
        models/fp8.py ``fp8_weight_bytes``."""
        return [w for w in (self.w1, self.w3, self.w2) if w is not None] if self.fp8 else []

    def _gemm(self, h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """One grouped layer: in FP8 or in h's dtype."""
        if self.fp8 is None:
            return _grouped(h, w, b)
        # (then a view, no kernel: the capture gives an autograd node to the module of the
        # next torch call, and an autograd Function's apply is none, so without it the
        # GEMMs' backward would be named after the activation that reads their output)
        y = grouped_fp8(h, w, b, self.fp8, self.tn_only)
        return y.view(y.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        n, k = tokens.shape[0], self.top_k
        # the router's softmax in FP32 (Hugging Face's Mixtral; Megatron-Core's
        # --moe-router-dtype fp32), the top-k's weights renormalised to sum to one (Mixtral's)
        probs = self.router(tokens).float().softmax(-1)
        weights, chosen = probs.topk(k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        order = chosen.flatten().argsort()  # the token copies in expert order
        source = order // k  # each copy's token
        rows = self.cfg.expert_rows(n)
        if self.fused:
            return self._fused(tokens, source, weights.flatten().index_select(0, order),
                               rows).view(x.shape)
        h = tokens.index_select(0, source)  # permute
        if rows != n * k:  # the busiest rank's share (or groups rounded up): padded rows
            h = F.pad(h, (0, 0, 0, rows - n * k))
        h = h.view(self.local, rows // self.local, -1)
        # (FP8 needs TE's layers, whose gated experts take the fused path: none reach here)
        a = self._gemm(h, self.w1, self.b1)
        if getattr(self.act, "gated", False):
            a = self.act(a, self._gemm(h, self.w3, self.b3))
        else:
            a = (self.act(a) * self._gemm(h, self.w3, self.b3) if self.swiglu
                 else self.act(a))
        out = self._gemm(a, self.w2, self.b2).reshape(rows, -1)[:n * k]
        out = out * weights.flatten().index_select(0, order).unsqueeze(-1).to(out.dtype)
        # unpermute: each copy added into its token
        return out.new_zeros(n, out.shape[-1]).index_add(0, source, out).view(x.shape)

    def _fused(self, tokens: torch.Tensor, source: torch.Tensor, probs: torch.Tensor,
               rows: int) -> torch.Tensor:
        """Megatron-Core's fused routing (the class docstring): ``probs`` each copy's router
        weight in expert order, ``rows`` the copies padded as ``expert_rows`` says."""
        h = moe_permute(tokens, source, rows).view(self.local, rows // self.local, -1)
        if rows != probs.numel():  # (padded rows: weight 0)
            probs = F.pad(probs, (0, rows - probs.numel()))
        a = self.act(self._gemm(h, self.w1, self.b1), probs.view(self.local, -1))
        out = self._gemm(a, self.w2, self.b2).reshape(rows, -1)
        return moe_unpermute(out, source, tokens.shape[0])


def _grouped(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """Each local expert's rows times its weight (one batched GEMM), plus its bias if any."""
    return torch.bmm(h, w) if b is None else torch.baddbmm(b, h, w)


def _activation(cfg: GPTConfig) -> nn.Module:
    """The MLP's (and the experts') activation: GELU, or for a gated MLP ``cfg.glu``'s, one
    fused kernel under ``fused_kernels`` (a gated one is called on (gate, up): ``gated``)."""
    if cfg.mlp != "swiglu":
        return nn.GELU(approximate="tanh")
    if cfg.glu == "clamped-quick-gelu":
        return ClampedQuickGeGLU(cfg.fused_kernels)
    return FusedSwiGLU() if cfg.fused_kernels else nn.SiLU()


def expert_parameters(model: nn.Module) -> frozenset:
    """The names of ``model``'s experts' weights (every ``MoE``'s w1, w3 and w2, not its
    router): what expert parallelism splits and reduces over its own replicas."""
    return frozenset(f"{path}.{name}" for path, m in model.named_modules()
                     if isinstance(m, MoE) for name, _ in m.named_parameters()
                     if not name.startswith("router."))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, index: int = 0):
        super().__init__()
        self.split = cfg.token_split  # the ranks the residual stream's tokens are split over
        self.scatter = _row_split(cfg)  # the ranks the block reduce-scatters a region over
        # the ranks the split regions gather their input from here (1: the layers gather it
        # themselves, Megatron's way, or it is whole)
        self.gather = 1 if cfg.regather > 1 else self.split
        self.float8_gather = cfg.float8_gather  # torchao's float8 styles: ``_shard_cast``
        self.ln1 = _norm(cfg)
        window = cfg.block_window(index)  # (block ``index`` of the model, from 0)
        self.attn = (GQAttention(cfg, window)
                     if cfg.positions == "rope" or cfg.groups > 1 or cfg.qk_norm
                     else Attention(cfg, window))
        self.ln2 = _norm(cfg)
        self.drop = nn.Dropout(cfg.dropout) if cfg.dropout else nn.Identity()
        self.moe = MoE(cfg) if cfg.experts else None
        if self.moe is not None:  # (tensor parallelism is refused with experts)
            return
        self.swiglu = cfg.mlp == "swiglu"
        hidden = (cfg.ffn_hidden if self.swiglu else cfg.mlp_ratio * cfg.d_model) // cfg.tp
        self.fc = _column(cfg, cfg.d_model, hidden, cfg.bias)
        if self.swiglu:  # Llama's w1 (fc), w3 (gate) and w2 (out): out(silu(fc(x)) * gate(x))
            self.gate = _column(cfg, cfg.d_model, hidden, cfg.bias)
        # (the fused SwiGLU takes both GEMMs' outputs: one kernel, keeping only them)
        self.act = _activation(cfg)
        self.out = _row(cfg, hidden, cfg.d_model, cfg.bias)

    def _shard_cast(self, h: torch.Tensor):
        """torchao's float8 tensor parallelism (``GPTConfig.float8_gather``): h's cast on
        this rank's shard of the tokens, gathered in FP8 (``PrepareFloat8ModuleInput``); None
        otherwise."""
        return Float8Cast(h).gather(self.gather) if self.float8_gather else None

    def _grad_cast(self):
        """torchao's ``Float8RowwiseParallel``: the holder of a row-parallel layer's output
        gradient, cast on the shard and gathered in FP8; None otherwise."""
        return Float8GradCast() if self.float8_gather else None

    def forward(self, x: torch.Tensor, rope=None, mask=None) -> torch.Tensor:
        # x: this rank's tokens of the residual stream (all of them when tp is 1 or without
        # sequence parallelism)
        h = self.ln1(x)
        cast, back = self._shard_cast(h), self._grad_cast()
        a = self.attn(_gather(h, self.gather, cast), rope, mask, cast, back)
        x = x + self.drop(_scatter(a, self.scatter, back))
        if self.moe is not None:
            return x + self.drop(self.moe(self.ln2(x)))
        h = self.ln2(x)
        cast, back = self._shard_cast(h), self._grad_cast()
        h = _gather(h, self.gather, cast)
        # FP8: Megatron's linear_fc1 (torchao: both layers' casts of h, computed once)
        cast = cast or (shared_cast(self.fc, h) if self.swiglu else None)
        if getattr(self.act, "gated", False):
            h = self.act(call(self.fc, h, cast), call(self.gate, h, cast))
        else:
            h = (self.act(call(self.fc, h, cast)) * call(self.gate, h, cast) if self.swiglu
                 else self.act(call(self.fc, h, cast)))
        return x + self.drop(_scatter(call_row(self.out, h, back), self.scatter, back))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.local_vocab, cfg.d_model)
        if cfg.positions == "learned":
            self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        else:  # rotary tables: buffers, not parameters (Llama's freqs_cis)
            for name, table in rope_buffers(cfg).items():
                self.register_buffer(name, table, persistent=False)
        if cfg.attention == "math":  # the causal mask, made once (Megatron's ltor mask)
            self.register_buffer("causal", torch.ones(cfg.seq_len, cfg.seq_len,
                                                      dtype=torch.bool).triu(1),
                                 persistent=False)
        self.drop = nn.Dropout(cfg.dropout) if cfg.dropout else nn.Identity()
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.layers))
        self.ln_f = _norm(cfg)
        self.head = _column(cfg, cfg.d_model, cfg.local_vocab, False, fp8=False)
        if cfg.tie_embeddings:
            self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t, split = idx.shape[1], self.cfg.token_split
        # the vocabulary-parallel lookup's partial sums, reduce-scattered to this rank's tokens
        # (all-reduced, without sequence parallelism)
        x = _scatter(self.tok(idx), split)
        if self.cfg.positions == "learned":
            x, rope = x + self.pos(torch.arange(t // split, device=idx.device)), None
        else:
            rope = self._rope_tables(x.dtype)
        x = self.drop(x)
        mask = self.causal if self.cfg.attention == "math" else None
        for block in self.blocks:
            x = block(x, rope, mask)
        # [B, T, vocab / tp] logits (the loss runs vocabulary-parallel on them)
        return self.head(_gather(self.ln_f(x), 1 if self.cfg.regather > 1 else split))

    def _rope_tables(self, dtype: torch.dtype) -> tuple:
        """The rotary tables as the blocks read them (``apply_rope``): transformers casts its
        cos and sin to the residual stream's ``dtype`` once a forward; the others read theirs
        as kept."""
        if self.cfg.fused_kernels:
            return self.rope_cos, self.rope_sin
        if self.cfg.rope == "complex":
            return (self.rope_cis,)
        if self.cfg.rope == "matrix":
            return (self.rope_rot,)
        return self.rope_cos.to(dtype), self.rope_sin.to(dtype)


def row_parallel_regions(cfg: GPTConfig) -> tuple[tuple[str, ...], ...]:
    """Each block's row-parallel layers, as module paths of ``GPT(cfg)``: the attention output
    projection and the MLP's output layer, whose forward output is reduce-scattered (all-reduced
    without sequence parallelism). TransformerEngine's overlap runs that reduce-scatter, and the
    backward's all-gather of their output gradient, beside these layers' GEMMs."""
    proj = "wo" if cfg.positions == "rope" or cfg.groups > 1 else "proj"
    return tuple(r for i in range(cfg.layers)
                 for r in ((f"blocks.{i}.attn.{proj}",), (f"blocks.{i}.out",)))


def column_parallel_regions(cfg: GPTConfig) -> tuple[tuple[str, ...], ...]:
    """Each split region's column-parallel layers, as module paths of ``GPT(cfg)``: a block's
    attention input projections, its MLP's input layer(s), and the output layer. Under
    Megatron's implementation a region's backward collectives run beside these layers'
    gradient GEMMs (analysis/scaling.py)."""
    attn = (("wq", "wk", "wv") if cfg.positions == "rope" or cfg.groups > 1 else ("qkv",))
    mlp = ("fc", "gate") if cfg.mlp == "swiglu" else ("fc",)
    blocks = ((tuple(f"blocks.{i}.attn.{n}" for n in attn), tuple(f"blocks.{i}.{n}" for n in mlp))
              for i in range(cfg.layers))
    return (*(r for pair in blocks for r in pair), ("head",))


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
# * llama2-7b .. llama3-70b: Meta's Llama 2 (Touvron et al. 2023, Table 1 and the released
#   params.json: dim, n_layers, n_heads, n_kv_heads, vocabulary 32,000, SwiGLU hidden
#   multiple_of 256 / ffn_dim_multiplier) and Llama 3 / 3.1 (dim 4096/8192, 32/80 layers, 8 KV
#   heads, vocabulary 128,256, hidden 14,336/28,672, rope theta 500,000; Llama 3.1 405B: dim
#   16,384, 126 layers, 128 heads, multiplier 1.2, hidden 53,248) as torchtitan's
#   ModelArgs builds them (llama2-34b: the paper's unreleased 34B, 48 layers of 8,192 with 8
#   KV heads and hidden 22,016, as Code Llama 34B and fms-fsdp's "34b" build it): no biases, untied output layer; 6,738,415,616 parameters for
#   llama2-7b and 8,030,261,248 for llama3-8b (tests/test_gpt.py derives both by hand).
def _llama_hidden(d_model: int, multiple_of: int, multiplier: float | None) -> int:
    """Llama's SwiGLU hidden size: 2/3 of 4 x d_model, times the multiplier, rounded up to a
    multiple of ``multiple_of`` (torchtitan's FeedForward)."""
    hidden = int(2 * 4 * d_model / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def _llama(layers, d_model, heads, kv_heads, vocab, seq_len, multiple_of, multiplier, theta):
    return GPTConfig(layers=layers, d_model=d_model, heads=heads, kv_heads=kv_heads, vocab=vocab,
                     seq_len=seq_len, bias=False, tie_embeddings=False, norm="rmsnorm",
                     mlp="swiglu", ffn_hidden=_llama_hidden(d_model, multiple_of, multiplier),
                     positions="rope", rope_theta=theta)


def _mixtral(layers, d_model, heads, vocab, multiplier):
    """Mistral's Mixtral (arXiv 2401.04088, Table 1; the released config.json): a Llama-form
    decoder of 8 KV heads, rope theta 1,000,000, whose every MLP is 8 SwiGLU experts, 2 a
    token; 4,096 tokens, the sequence Megatron-LM's Mixtral example trains on."""
    return replace(_llama(layers, d_model, heads, 8, vocab, 4096, 1024, multiplier, 1e6),
                   experts=8, top_k=2)


def _gpt_oss(layers, experts):
    """OpenAI's gpt-oss (its model card, arXiv 2508.10925, section 2.1 and Table 1; the
    released config.json): blocks of 2,880 with 64 query heads of 64 and 8 K/V heads, biases
    on the attention projections, the router and the experts, a sink per head, a window of
    128 tokens in every other block (the 1st, 3rd, ...; Megatron-Core's window_size (127, 0),
    window_attn_skip_freq 2), rotary positions (YaRN scales the angles: the same kernels),
    RMSNorm, untied output layer, vocabulary 201,088; ``experts`` experts of 2,880 hidden
    units, 4 a token, with gpt-oss's clamped gated activation. 4,096 tokens, the sequence
    Megatron-Bridge's pretraining recipes train it on."""
    return GPTConfig(layers=layers, d_model=2880, heads=64, kv_heads=8, head_size=64,
                     vocab=201088, seq_len=4096, bias=True, tie_embeddings=False,
                     norm="rmsnorm", mlp="swiglu", ffn_hidden=2880, positions="rope",
                     rope_theta=150000.0, experts=experts, top_k=4, window=128, full_every=2,
                     sinks=True, glu="clamped-quick-gelu")


def _qwen3_moe(layers, d_model, heads, ffn_hidden, expert_hidden):
    """Alibaba's Qwen3 mixtures of experts (arXiv 2505.09388, Table 2; the released
    config.json, as Megatron-Bridge's Qwen3MoEModelProvider and the Megatron-LM arguments
    of slime's scripts/models/qwen3-*.sh give it): blocks of ``d_model`` with ``heads`` query
    heads of 128 and 4 K/V heads, q and k RMS-normalised per head (--qk-layernorm), no
    biases, rotary positions (theta 1,000,000), RMSNorm (eps 1e-6), untied output layer,
    vocabulary 151,936; every block's MLP is 128 SwiGLU experts of ``expert_hidden`` units, 8
    a token, the router's top-8 weights renormalised (norm_topk_prob); ``ffn_hidden`` is the
    config's dense intermediate size, which no block uses. 4,096 tokens, the sequence
    Megatron-Bridge's performance recipes train it on."""
    return GPTConfig(layers=layers, d_model=d_model, heads=heads, kv_heads=4, head_size=128,
                     vocab=151936, seq_len=4096, bias=False, tie_embeddings=False,
                     norm="rmsnorm", norm_eps=1e-6, mlp="swiglu", ffn_hidden=ffn_hidden,
                     positions="rope", rope_theta=1e6, experts=128, top_k=8,
                     expert_hidden=expert_hidden, qk_norm=True)


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
    "llama2-7b": _llama(32, 4096, 32, None, 32000, 4096, 256, None, 10000.0),
    "llama2-13b": _llama(40, 5120, 40, None, 32000, 4096, 256, None, 10000.0),
    "llama2-34b": _llama(48, 8192, 64, 8, 32000, 4096, 256, None, 10000.0),
    "llama2-70b": _llama(80, 8192, 64, 8, 32000, 4096, 4096, 1.3, 10000.0),
    "llama3-8b": _llama(32, 4096, 32, 8, 128256, 8192, 1024, 1.3, 500000.0),
    "llama3-70b": _llama(80, 8192, 64, 8, 128256, 8192, 4096, 1.3, 500000.0),
    "llama3-405b": _llama(126, 16384, 128, 8, 128256, 8192, 4096, 1.2, 500000.0),
    "mixtral-8x7b": _mixtral(32, 4096, 32, 32000, 1.3),
    "mixtral-8x22b": _mixtral(56, 6144, 48, 32768, None),
    "gpt-oss-20b": _gpt_oss(24, 32), "gpt-oss-120b": _gpt_oss(36, 128),
    "qwen3-30b-a3b": _qwen3_moe(48, 2048, 32, 6144, 768),
    "qwen3-235b-a22b": _qwen3_moe(94, 4096, 64, 12288, 1536),
}


# The fused attention kernel each preset's published runs used, where it is not PyTorch's
# scaled_dot_product_attention (FlashAttention-2 since PyTorch 2.2, cuDNN's on Hopper from
# 2.11: hardware/efficiency.py ATTENTION_KERNELS, sdpa_kernel): MosaicML's MPT throughput
# tables ran llm-foundry's Triton flash kernel (attn_impl triton,
# scripts/train/benchmarking/submit_benchmarks.py), so
# the MPT presets, which reproduce those runs, time their attention at its share
# (``default_attention_kernel``).
PRESET_ATTENTION_KERNELS = {name: "triton-2023" for name in PRESETS if name.startswith("mpt-")}
# And the loss they computed, where it is not dlperf's default (models/losses.py): the same
# runs used llm-foundry's default loss_fn, fused_crossentropy (flash-attn's one-kernel
# cross-entropy; llmfoundry/models/mpt/modeling_mpt.py ComposerMPTCausalLM) (``default_loss``).
PRESET_LOSSES = {name: "fused" for name in PRESETS if name.startswith("mpt-")}
# And the train metrics their trainer computed on every micro-batch's logits (AnalysisConfig.
# train_metrics): llm-foundry's ComposerMPTCausalLM gives Composer two, LanguageCrossEntropy and
# LanguagePerplexity (use_train_metrics defaults to true; its benchmark script leaves it), and
# Composer 0.16 evaluates them after each micro-batch's backward (``default_train_metrics``).
PRESET_TRAIN_METRICS = {name: 2 for name in PRESETS if name.startswith("mpt-")}


def default_attention_kernel(name: str, spec=None) -> str:
    """The attention kernel to time model ``name`` with when none is given: its preset's
    published one; else, on device ``spec``, the one the PyTorch installed here would pick
    there (``efficiency.sdpa_kernel``: cuDNN's on Hopper and B200 with torch 2.11 and later);
    without a device, FlashAttention-2 (``DEFAULT_ATTENTION_KERNEL``: the stack of a
    validation row that does not say)."""
    from dlperf.hardware.efficiency import DEFAULT_ATTENTION_KERNEL, sdpa_kernel

    if name in PRESET_ATTENTION_KERNELS:
        return PRESET_ATTENTION_KERNELS[name]
    return sdpa_kernel(spec)[0] if spec is not None else DEFAULT_ATTENTION_KERNEL


def default_loss(name: str) -> str:
    """How model ``name``'s loss computes cross-entropy when not given: its preset's published
    runs' form, else dlperf's default (models/losses.py ``DEFAULT_LOSS``, the FP32 upcast)."""
    from dlperf.models.loss_forms import DEFAULT_LOSS

    return PRESET_LOSSES.get(name, DEFAULT_LOSS)


def default_train_metrics(name: str) -> int:
    """The cross-entropy train metrics model ``name``'s trainer computes on each micro-batch's
    logits when not given: its preset's published runs' (``PRESET_TRAIN_METRICS``), else 0."""
    return PRESET_TRAIN_METRICS.get(name, 0)


def gpt_config(name: str, **overrides) -> GPTConfig:
    """The preset ``name`` with the given fields replaced (None: keep the preset's)."""
    from dataclasses import replace

    return replace(PRESETS[name], **{k: v for k, v in overrides.items() if v is not None})
