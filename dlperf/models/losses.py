"""How a trainer computes the classification loss over its logits: the ``--loss`` forms.

For an image classifier (1,000 classes) the choice is a rounding error; for a language model it
is not: Llama 3's 128,256-wide logits at 16,384 tokens are 4.2 GB in BF16, and the loss's
passes over them and the copies it keeps set the step's memory peak (analysis/liveness.py) and
part of its time: Llama 3 8B on an H100 at 2 x 8,192 tokens holds 51.1 GiB of tensors at the
peak, at the FP32 loss's backward, against 34.8 GiB saved for the backward
(benchmarks/results/predict-llama3-8b-h100-compile-blocks.json), and the fused form made
MosaicML's MPT-125M rows predicted up to 5.8% faster than the BF16 form did (benchmarks/
README.md, fourteenth session). Trainers differ, so the form is a setting, read from each
run's code:

* ``fp32`` (the default): ``F.cross_entropy`` on the logits upcast to FP32. torchtitan
  (``cross_entropy(pred.flatten(0, 1).float(), ...)``, and before 2024-10 ``self.output(h)
  .float()`` in its model), Hugging Face transformers (``logits.float()`` in its causal-LM
  loss), Megatron-LM's vocab-parallel cross-entropy (``vocab_parallel_logits.float()``), apex
  O2 (which casts a model's outputs to FP32) and autocast (cross_entropy is on its FP32 list)
  all do. Eager PyTorch runs it as a cast, a log-softmax and the NLL, and their backwards: at
  the log-softmax's backward three FP32 copies of the logits are alive at once.
* ``half``: ``F.cross_entropy`` on the logits in their own dtype, no upcast (IBM's fms-fsdp
  calls ``CrossEntropyLoss()`` on its BF16 output, KempnerForge's train loop
  ``F.cross_entropy`` on its). Not under autocast, which runs cross_entropy in FP32.
* ``fused``: one kernel each way (``fused_cross_entropy`` below): the forward reads the
  logits once and writes the loss and a log-sum-exp per row, keeping the logits; the backward
  reads them again and writes their gradient in their dtype. flash-attn's cross-entropy
  (llm-foundry's default ``loss_fn: fused_crossentropy``, MosaicML's MPT runs) works so, and
  so does what torch.compile makes of the ``fp32`` form: Inductor's code for it is one
  reduction kernel that keeps the BF16 logits and two FP32 numbers a row, and one backward
  kernel writing a BF16 gradient (checked on this machine's Inductor: tests/test_losses.py).
  torchtitan compiles its loss with the model when it compiles (PR #642 of 2024-10-22; turned
  off from 2024-12-18, "compiling loss function causes CUDA errors", to 2025-04-02, #1033: its
  2024-12 benchmark tables and torchao's float8 README of 2025-03 ran the loss eager, fp32).

The fused op is a ``torch.library.custom_op`` (as models/fused.py's kernels are) so that the
capture records it as the one kernel it is, with a real implementation so a model trains with
it and its gradient can be checked against autograd's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dlperf.models.loss_forms import DEFAULT_LOSS, LOSSES

NAMESPACE = "dlperf"
__all__ = ["DEFAULT_LOSS", "LOSSES", "cross_entropy", "fused_cross_entropy"]
# the op names the capture records: analysis/costs.py charges each as one memory-bound kernel
OPS = ("fused_cross_entropy", "fused_cross_entropy_backward")


@torch.library.custom_op(f"{NAMESPACE}::fused_cross_entropy", mutates_args=())
def _fused(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
    lse = torch.logsumexp(wide, -1)
    loss = (lse - wide.gather(-1, target[:, None]).squeeze(-1)).mean()
    return loss, lse


@_fused.register_fake
def _(logits, target):
    wide = torch.promote_types(logits.dtype, torch.float32)
    return logits.new_empty((), dtype=wide), logits.new_empty(logits.shape[:1], dtype=wide)


@torch.library.custom_op(f"{NAMESPACE}::fused_cross_entropy_backward", mutates_args=())
def _fused_backward(grad: Tensor, logits: Tensor, target: Tensor, lse: Tensor) -> Tensor:
    # d mean(lse - x[t]) / dx = (softmax(x) - onehot(t)) / rows
    wide = logits.to(lse.dtype)
    out = torch.exp(wide - lse[:, None])
    out[torch.arange(out.shape[0], device=out.device), target] -= 1
    return (out * (grad / out.shape[0])).to(logits.dtype)


@_fused_backward.register_fake
def _(grad, logits, target, lse):
    return logits.new_empty(logits.shape)


def _setup(ctx, inputs, output):
    logits, target = inputs
    ctx.save_for_backward(logits, target, output[1])
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)


def _backward(ctx, grad, _grad_lse):
    if grad is None:
        return None, None
    logits, target, lse = ctx.saved_tensors
    return _fused_backward(grad, logits, target, lse), None


_fused.register_autograd(_backward, setup_context=_setup)


def fused_cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """Mean cross-entropy of ``logits`` [N, C] against ``target`` [N] in one kernel each way
    (the ``fused`` form: see the module docstring)."""
    return _fused(logits, target)[0]


def cross_entropy(logits: Tensor, target: Tensor, form: str = DEFAULT_LOSS) -> Tensor:
    """Mean cross-entropy of ``logits`` [N, C] against ``target`` [N] as ``form`` computes it
    (``LOSSES``; see the module docstring)."""
    if form not in LOSSES:
        raise ValueError(f"loss {form!r}: choose {', '.join(LOSSES)}")
    if form == "fused":
        return fused_cross_entropy(logits, target)
    if form == "fp32" and logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return torch.nn.functional.cross_entropy(logits, target)
