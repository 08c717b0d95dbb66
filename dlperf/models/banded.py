"""Causal attention with a sliding window and/or attention sinks as one fused kernel: the
attention of OpenAI's gpt-oss (its model card, arXiv 2508.10925, section 2.1: "bandwidth of
128 tokens" in every other layer, "a learned bias in the denominator of the softmax" per head)
as Megatron-Core runs it on TransformerEngine (``window_size=(w - 1, 0)``,
``softmax_type="learnable"``: cuDNN's fused attention) and FlashAttention runs a window
(``window_size``).

Why hand-written: PyTorch's ``scaled_dot_product_attention`` has neither a window nor sinks.
Given a mask it leaves the flash kernels, and on meta tensors its math path would make the
capture keep the B x H x T x T scores. The kernels the published runs used compute only the
key tiles the window reaches and keep what flash attention keeps (q, k, v, the output and the
row log-sum-exp). So this is one ``torch.library.custom_op``:
- a real implementation in FP32 (so a model built with it trains, and
  tests/test_banded_attention.py checks it and its gradients against autograd's in float64);
- a fake one for meta tensors;
- a backward that is itself one op.
analysis/costs.py charges each as one fused attention kernel, with the FLOPs of the tiles the
window reaches (``costs.window_fraction``). A sink only adds one logit to each row's softmax: it
costs the kernel nothing measurable, and its gradient is one more sum in the backward.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from dlperf.models.fused import NAMESPACE, _wide


def _probabilities(q: Tensor, k: Tensor, window: int, sinks: Optional[Tensor], scale: float
                   ) -> tuple[Tensor, Tensor]:
    """The attention probabilities [B, H, Tq, Tk] (FP32, zero outside the causal band) and the
    row log-sum-exp [B, H, Tq], a row's sink (one logit per head) in its denominator."""
    groups = q.shape[1] // k.shape[1]
    scores = _wide(q) @ _wide(k).repeat_interleave(groups, 1).transpose(-2, -1) * scale
    tq, tk = q.shape[-2], k.shape[-2]
    i = torch.arange(tq, device=q.device)[:, None] + (tk - tq)
    j = torch.arange(tk, device=q.device)[None, :]
    allowed = (j <= i) & ((i - j < window) if window > 0 else True)
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        sink = _wide(sinks).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        lse = torch.logsumexp(torch.cat((scores, sink), -1), -1)
    else:
        lse = torch.logsumexp(scores, -1)
    return torch.exp(scores - lse[..., None]), lse


def _group_sum(x: Tensor, kv_heads: int) -> Tensor:
    """[B, H, T, D] summed over each K/V head's group of query heads: [B, kv_heads, T, D]."""
    b, h, t, d = x.shape
    return x.view(b, kv_heads, h // kv_heads, t, d).sum(2)


@torch.library.custom_op(f"{NAMESPACE}::banded_attention", mutates_args=())
def _banded(q: Tensor, k: Tensor, v: Tensor, window: int, sinks: Optional[Tensor],
            scale: float) -> tuple[Tensor, Tensor]:
    p, lse = _probabilities(q, k, window, sinks, scale)
    out = p @ _wide(v).repeat_interleave(q.shape[1] // v.shape[1], 1)
    return out.to(q.dtype), lse  # (FP32, or wider for float64 tests)


@_banded.register_fake
def _(q, k, v, window, sinks, scale):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1],
                                             dtype=torch.promote_types(q.dtype, torch.float32))


@torch.library.custom_op(f"{NAMESPACE}::banded_attention_backward", mutates_args=())
def _banded_backward(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                     window: int, sinks: Optional[Tensor], scale: float
                     ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    # flash attention's backward: P again from the kept log-sum-exp, then
    # dV = Pᵀ dO, dP = dO Vᵀ, dS = P (dP - rowsum(dO O)), dQ = dS K, dK = dSᵀ Q (each K/V
    # head's gradient summed over its query heads); a sink's, -sum P_sink rowsum(dO O)
    groups = q.shape[1] // k.shape[1]
    p, _ = _probabilities(q, k, window, sinks, scale)  # (recomputed, as the kernel does)
    g, o = _wide(grad), _wide(out)
    row = (g * o).sum(-1)
    dv = _group_sum(p.transpose(-2, -1) @ g, k.shape[1])
    dp = g @ _wide(v).repeat_interleave(groups, 1).transpose(-2, -1)
    ds = p * (dp - row[..., None])
    dq = ds @ _wide(k).repeat_interleave(groups, 1) * scale
    dk = _group_sum(ds.transpose(-2, -1) @ _wide(q), k.shape[1]) * scale
    if sinks is not None:
        p_sink = torch.exp(_wide(sinks).view(1, -1, 1) - _wide(lse))
        dsinks = -(p_sink * row).sum((0, 2)).to(sinks.dtype)
    else:
        dsinks = q.new_zeros(0)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dsinks


@_banded_backward.register_fake
def _(grad, q, k, v, out, lse, window, sinks, scale):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            sinks.new_empty(sinks.shape) if sinks is not None else q.new_empty(0))


def _banded_setup(ctx, inputs, output):
    q, k, v, window, sinks, scale = inputs
    ctx.window, ctx.scale, ctx.has_sinks = window, scale, sinks is not None
    ctx.save_for_backward(q, k, v, output[0], output[1],
                          *((sinks,) if sinks is not None else ()))


def _banded_grad(ctx, grad, _grad_lse):
    q, k, v, out, lse, *sinks = ctx.saved_tensors
    sinks = sinks[0] if ctx.has_sinks else None
    dq, dk, dv, dsinks = _banded_backward(grad, q, k, v, out, lse, ctx.window, sinks,
                                          ctx.scale)
    return dq, dk, dv, None, dsinks if ctx.has_sinks else None, None


_banded.register_autograd(_banded_grad, setup_context=_banded_setup)


def banded_attention(q: Tensor, k: Tensor, v: Tensor, window: int = 0,
                     sinks: Optional[Tensor] = None) -> Tensor:
    """Causal attention of q [B, H, T, D] over k, v [B, H_kv, T, D] (H_kv dividing H: each K/V
    head read by its group of query heads, as the fused kernels do), each query attending to
    itself and the ``window`` - 1 keys before it (0: every earlier key), a head's sink (one
    learned logit, ``sinks`` [H]) added to each row's softmax denominator. One kernel."""
    if window < 0:
        raise ValueError(f"attention window must be 0 (none) or positive, got {window}")
    return _banded(q, k, v, int(window), sinks, 1.0 / math.sqrt(q.shape[-1]))[0]
