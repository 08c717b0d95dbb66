"""The fused kernels of a Llama block as Megatron-Core runs it on TransformerEngine's layers
(models/gpt.py, ``tp_impl="te"``): each one op to the capture, so dlperf charges one kernel
for it and counts what it keeps for the backward, as the real kernel does.

Why hand-written: eager PyTorch has no such ops off the GPU (``F.rms_norm`` decomposes into
ten elementwise kernels on meta and CPU tensors, there is no fused SwiGLU or rotary
embedding), and what the unfused kernels keep is what made dlperf's count of a Llama 3 405B
block 1.46x Megatron-Core's (0.72 GiB against 0.50 at TP 8, 8,192 tokens). Each op here is a
``torch.library.custom_op`` with a real implementation (so a module built with them trains,
and tests/test_fused_kernels.py checks their gradients against autograd's in float64), a fake
one for meta tensors, and a backward that is itself one op.

* ``te_rms_norm``: TransformerEngine's fused RMSNorm (the normalisation inside
  ``LayerNormLinear`` / ``TELayerNormColumnParallelLinear``, Megatron-Core's
  ``--normalization RMSNorm``): one pass reads x and writes the normalised output and the
  FP32 reciprocal root mean square per token; it keeps x and that (transformer_engine/pytorch/
  module/layernorm_linear.py saves ``inputmat``, ``mu``, ``rsigma``; the normalised output it
  also keeps is the next GEMM's input, kept there). The backward is one pass too.
* ``te_swiglu``: Megatron-Core's ``bias_swiglu_impl`` (megatron/core/fusions/
  fused_bias_swiglu.py, on by default: ``--no-bias-swiglu-fusion`` turns it off): silu(gate)
  x up in one pass, keeping only its input (the first MLP GEMM's output, gate and up); the
  product is the second GEMM's input, kept there.
* ``te_clamped_geglu``: gpt-oss's gated activation as Megatron-Core fuses it
  (megatron/core/fusions/fused_bias_geglu.py, quick-GeGLU with ``activation_func_clamp_value``
  and ``glu_linear_offset``, under ``bias_activation_fusion``): gate clamped to at most 7, up
  to [-7, 7], gate x sigmoid(1.702 gate) x (up + 1) in one pass, keeping only its input, as
  ``te_swiglu`` does.
* ``te_rope``: TransformerEngine's fused rotary embedding (``fused_apply_rotary_pos_emb``;
  Megatron-Core's ``--no-rope-fusion`` turns it off): one pass in the input's dtype, keeping
  only the angle tables (a buffer, not an activation). Pairs are (x[2i], x[2i+1]) as in
  ``gpt.apply_rope``'s complex form (TransformerEngine rotates halves; the same kernel, the
  same traffic).

Registering the ops is torch.library's process-wide registry: done once, at import.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

NAMESPACE = "dlperf"


def _wide(x: Tensor) -> Tensor:
    """x in FP32 (the fused kernels' arithmetic), or as it is if wider (float64 tests)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


# the op names the capture records (func._overloadpacket.__name__): analysis/costs.py charges
# each as one memory-bound kernel
OPS = ("te_rms_norm", "te_rms_norm_backward", "te_swiglu", "te_swiglu_backward", "te_rope",
       "te_rope_backward", "te_weighted_swiglu", "te_weighted_swiglu_backward",
       "te_weighted_clamped_geglu", "te_weighted_clamped_geglu_backward", "moe_permute",
       "moe_unpermute")
# gpt-oss's: the clamp on gate and up, and quick GELU's sigmoid slope
GLU_LIMIT, QUICK_GELU_SLOPE = 7.0, 1.702


@torch.library.custom_op(f"{NAMESPACE}::te_rms_norm", mutates_args=())
def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    xf = _wide(x)
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * rstd).to(x.dtype) * weight, rstd


@_rms_norm.register_fake
def _(x, weight, eps):
    return (x.new_empty(x.shape, dtype=torch.result_type(x, weight)),
            x.new_empty((*x.shape[:-1], 1), dtype=torch.promote_types(x.dtype, torch.float32)))


@torch.library.custom_op(f"{NAMESPACE}::te_rms_norm_backward", mutates_args=())
def _rms_norm_backward(grad: Tensor, x: Tensor, weight: Tensor, rstd: Tensor
                       ) -> tuple[Tensor, Tensor]:
    # y = n * w with n = x * rstd; dx = rstd (g w - n mean(g w n)); dw = sum(g n)
    xf, g = _wide(x), _wide(grad)
    n = xf * rstd
    gw = g * _wide(weight)
    dx = rstd * (gw - n * (gw * n).mean(-1, keepdim=True))
    dw = (g * n).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dw.to(weight.dtype)


@_rms_norm_backward.register_fake
def _(grad, x, weight, rstd):
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def _rms_setup(ctx, inputs, output):
    x, weight, _ = inputs
    ctx.save_for_backward(x, weight, output[1])
    # (rstd is for the backward only: no zeros made for its gradient, as TE makes none)
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)


def _rms_backward(ctx, grad, _grad_rstd):
    if grad is None:  # (the output unused: nothing flows back)
        return None, None, None
    x, weight, rstd = ctx.saved_tensors
    dx, dw = _rms_norm_backward(grad, x, weight, rstd)
    return dx, dw, None


_rms_norm.register_autograd(_rms_backward, setup_context=_rms_setup)


@torch.library.custom_op(f"{NAMESPACE}::te_swiglu", mutates_args=())
def _swiglu(gate: Tensor, up: Tensor) -> Tensor:
    return torch.nn.functional.silu(gate) * up


def _gated_fake(gate, up):
    """A gated activation's output on meta tensors (``te_swiglu``, ``te_clamped_geglu``)."""
    return gate.new_empty(gate.shape, dtype=torch.result_type(gate, up))


def _gated_backward_fake(grad, gate, up):
    """... and its backward's gradients of gate and up."""
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


def _gated_grad(backward):
    """The autograd formula of a gated activation whose ``backward`` op takes (grad, gate, up)
    and which saved (gate, up) (``_swiglu_setup``)."""
    def grad_fn(ctx, grad):
        gate, up = ctx.saved_tensors
        return backward(grad, gate, up)
    return grad_fn


_swiglu.register_fake(_gated_fake)


def _swiglu_grads(g: Tensor, gf: Tensor, uf: Tensor) -> tuple[Tensor, Tensor]:
    """silu(gate) x up's gradients of gate and up (wide tensors in, wide out)."""
    s = torch.sigmoid(gf)
    return g * uf * s * (1 + gf * (1 - s)), g * gf * s


@torch.library.custom_op(f"{NAMESPACE}::te_swiglu_backward", mutates_args=())
def _swiglu_backward(grad: Tensor, gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    dg, du = _swiglu_grads(_wide(grad), _wide(gate), _wide(up))
    return dg.to(gate.dtype), du.to(up.dtype)


_swiglu_backward.register_fake(_gated_backward_fake)


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


_swiglu.register_autograd(_gated_grad(_swiglu_backward), setup_context=_swiglu_setup)


def clamped_quick_geglu(gate: Tensor, up: Tensor) -> Tensor:
    """gpt-oss's gated activation, op by op (the unfused form; ``te_clamped_geglu`` is one
    kernel): gate clamped to at most 7, up to [-7, 7], gate x sigmoid(1.702 gate) x (up + 1)."""
    gate = gate.clamp(max=GLU_LIMIT)
    up = up.clamp(-GLU_LIMIT, GLU_LIMIT)
    return gate * torch.sigmoid(QUICK_GELU_SLOPE * gate) * (up + 1)


@torch.library.custom_op(f"{NAMESPACE}::te_clamped_geglu", mutates_args=())
def _clamped_geglu(gate: Tensor, up: Tensor) -> Tensor:
    return clamped_quick_geglu(_wide(gate), _wide(up)).to(torch.result_type(gate, up))


_clamped_geglu.register_fake(_gated_fake)


def _clamped_geglu_grads(g: Tensor, gf: Tensor, uf: Tensor) -> tuple[Tensor, Tensor]:
    """gpt-oss's gated activation's gradients of gate and up (wide in, wide out); the clamps
    pass the gradient where the input is inside their bounds, ends included."""
    c = gf.clamp(max=GLU_LIMIT)
    s = torch.sigmoid(QUICK_GELU_SLOPE * c)
    act = c * s
    dact = (s + QUICK_GELU_SLOPE * act * (1 - s)) * (gf <= GLU_LIMIT)
    u = uf.clamp(-GLU_LIMIT, GLU_LIMIT)
    return g * (u + 1) * dact, g * act * (uf.abs() <= GLU_LIMIT)


@torch.library.custom_op(f"{NAMESPACE}::te_clamped_geglu_backward", mutates_args=())
def _clamped_geglu_backward(grad: Tensor, gate: Tensor, up: Tensor) -> tuple[Tensor, Tensor]:
    dg, du = _clamped_geglu_grads(_wide(grad), _wide(gate), _wide(up))
    return dg.to(gate.dtype), du.to(up.dtype)


_clamped_geglu_backward.register_fake(_gated_backward_fake)
_clamped_geglu.register_autograd(_gated_grad(_clamped_geglu_backward),
                                 setup_context=_swiglu_setup)


def rotate(x: Tensor, cos: Tensor, sin: Tensor, sign: float = 1.0) -> Tensor:
    """x [B, T, H, D] with each pair (x[2i], x[2i+1]) turned by position t's angle (``sign``
    -1: back), in FP32 (or wider), in x's dtype: the rotary embedding's arithmetic, which
    ``te_rope`` runs as one kernel (gpt.apply_rope runs each stack's own unfused kernels)."""
    t = x.shape[1]
    c, s = cos[:t, None, :], sin[:t, None, :]
    if sign < 0:  # (the forward does no extra kernel on the table)
        s = -s
    x0, x1 = _wide(x).unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), -1).flatten(-2).to(x.dtype)


@torch.library.custom_op(f"{NAMESPACE}::te_rope", mutates_args=())
def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return rotate(x, cos, sin)


@_rope.register_fake
def _(x, cos, sin):
    return x.new_empty(x.shape)


@torch.library.custom_op(f"{NAMESPACE}::te_rope_backward", mutates_args=())
def _rope_backward(grad: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return rotate(grad, cos, sin, -1.0)  # a rotation's transpose turns the other way


@_rope_backward.register_fake
def _(grad, cos, sin):
    return grad.new_empty(grad.shape)


def _rope_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1], inputs[2])


def _rope_grad(ctx, grad):
    cos, sin = ctx.saved_tensors
    return _rope_backward(grad, cos, sin), None, None


_rope.register_autograd(_rope_grad, setup_context=_rope_setup)


def _halves(a: Tensor) -> tuple[Tensor, Tensor]:
    """A fused first expert GEMM's output [..., 2F] as (gate, up): Megatron's linear_fc1
    writes them side by side."""
    return a.chunk(2, dim=-1)


def _weighted_glu(name: str, act, grads):
    """The op pair ``te_weighted_<name>`` (a [..., 2F], probs [...]) -> act(gate, up) x probs,
    and its backward (grad, a, probs) -> (grad of a [..., 2F], grad of probs): Megatron-Core's
    weighted gated activation (megatron/core/transformer/moe/experts.py, TEGroupedMLP's
    ``bias_act_func``: ``weighted_bias_swiglu_impl``, ``weighted_bias_quick_geglu_impl``),
    which applies each token copy's router weight inside the activation, so no separate pass
    over the experts' outputs does. It keeps its input and the weights."""
    def forward_impl(a: Tensor, probs: Tensor) -> Tensor:
        gate, up = _halves(_wide(a))
        return (act(gate, up) * _wide(probs).unsqueeze(-1)).to(a.dtype)

    def forward_fake(a, probs):
        return a.new_empty((*a.shape[:-1], a.shape[-1] // 2))

    def backward_impl(grad: Tensor, a: Tensor, probs: Tensor) -> tuple[Tensor, Tensor]:
        gate, up = _halves(_wide(a))
        g, p = _wide(grad), _wide(probs).unsqueeze(-1)
        dg, du = grads(g * p, gate, up)
        return (torch.cat((dg, du), -1).to(a.dtype),
                (g * act(gate, up)).sum(-1).to(probs.dtype))

    def backward_fake(grad, a, probs):
        return a.new_empty(a.shape), probs.new_empty(probs.shape)

    op = torch.library.custom_op(f"{NAMESPACE}::te_weighted_{name}", forward_impl,
                                 mutates_args=())
    op.register_fake(forward_fake)
    back = torch.library.custom_op(f"{NAMESPACE}::te_weighted_{name}_backward", backward_impl,
                                   mutates_args=())
    back.register_fake(backward_fake)

    def grad_fn(ctx, grad):
        a, probs = ctx.saved_tensors
        return back(grad, a, probs)

    op.register_autograd(grad_fn, setup_context=_swiglu_setup)
    return op


def _silu_glu(gate: Tensor, up: Tensor) -> Tensor:
    return torch.nn.functional.silu(gate) * up


WEIGHTED_GLUS = {"silu": _weighted_glu("swiglu", _silu_glu, _swiglu_grads),
                 "clamped-quick-gelu": _weighted_glu("clamped_geglu", clamped_quick_geglu,
                                                     _clamped_geglu_grads)}


@torch.library.custom_op(f"{NAMESPACE}::moe_permute", mutates_args=())
def _permute(x: Tensor, source: Tensor, rows: int) -> Tensor:
    out = x.new_zeros((rows, x.shape[-1]))
    out[:source.numel()] = x.index_select(0, source)
    return out


@_permute.register_fake
def _(x, source, rows):
    return x.new_empty((rows, x.shape[-1]))


@torch.library.custom_op(f"{NAMESPACE}::moe_unpermute", mutates_args=())
def _unpermute(y: Tensor, source: Tensor, tokens: int) -> Tensor:
    return y.new_zeros((tokens, y.shape[-1])).index_add(0, source, y[:source.numel()])


@_unpermute.register_fake
def _(y, source, tokens):
    return y.new_empty((tokens, y.shape[-1]))


def _index_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1])
    ctx.rows = inputs[0].shape[0]


def _permute_grad(ctx, grad):
    (source,) = ctx.saved_tensors
    return _unpermute(grad, source, ctx.rows), None, None


def _unpermute_grad(ctx, grad):
    (source,) = ctx.saved_tensors
    return _permute(grad, source, ctx.rows), None, None


_permute.register_autograd(_permute_grad, setup_context=_index_setup)
_unpermute.register_autograd(_unpermute_grad, setup_context=_index_setup)


def moe_permute(x: Tensor, source: Tensor, rows: int) -> Tensor:
    """x's rows gathered into expert order (row i is x[source[i]]), zero rows after them up
    to ``rows``: TransformerEngine's fused permute (``moe_permute_with_probs``; the padded
    form, ``fused_permute_and_pad_with_probs``), one kernel; its backward is the unpermute."""
    return _permute(x, source, rows)


def moe_unpermute(y: Tensor, source: Tensor, tokens: int) -> Tensor:
    """Each token's copies (y's first ``source.numel()`` rows; row i belongs to token
    source[i]) summed back into ``tokens`` rows: TE's fused unpermute, one kernel (the router
    weights were applied in the activation: ``_weighted_glu``); its backward is the
    permute."""
    return _unpermute(y, source, tokens)


class FusedRMSNorm(nn.Module):
    """RMSNorm as one kernel (``te_rms_norm`` above): the same parameter as gpt.RMSNorm's."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return _rms_norm(x, self.weight, self.eps)[0]


class FusedSwiGLU(nn.Module):
    """silu(gate) x up as one kernel (``te_swiglu`` above). A module, so the capture names its
    kernels after it (its output marks the autograd nodes it owns)."""

    gated = True  # called with (gate, up)

    def forward(self, gate: Tensor, up: Tensor) -> Tensor:
        return _swiglu(gate, up)


class WeightedGLU(nn.Module):
    """A mixture of experts' gated activation with the router's weights applied inside it,
    on the fused first GEMM's output [..., 2F] (``_weighted_glu``): ``glu`` "silu" (SwiGLU)
    or "clamped-quick-gelu" (gpt-oss's)."""

    weighted = True  # called with (a, probs)

    def __init__(self, glu: str):
        super().__init__()
        self.op = WEIGHTED_GLUS[glu]

    def forward(self, a: Tensor, probs: Tensor) -> Tensor:
        return self.op(a, probs)


class ClampedQuickGeGLU(nn.Module):
    """gpt-oss's gated activation on (gate, up): one kernel (``te_clamped_geglu``) when
    ``fused``, else op by op (``clamped_quick_geglu``)."""

    gated = True

    def __init__(self, fused: bool):
        super().__init__()
        self.fused = fused

    def forward(self, gate: Tensor, up: Tensor) -> Tensor:
        return _clamped_geglu(gate, up) if self.fused else clamped_quick_geglu(gate, up)


def fused_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, T, H, D] rotated as ``gpt.apply_rope`` does (its complex form), in one kernel."""
    return _rope(x, cos, sin)
