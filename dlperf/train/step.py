"""One training step: the only place dlperf runs forward, loss, backward and the optimizer.

The trainer (``train/loop.py``), the CUDA-graph capture (``train/graphs.py``, which captures
this function) and the speed-up ladder (``bench/ladder.py``, which times it) all call
``train_step``, so what the ladder measures and what a graph replays is the step the trainer
runs. As in gpt-fast, the step is a small function of its parts and its inputs and the compile
or graph boundary is this function; nothing in it talks to the console, the disk or the clock.

Per optimizer step: ``grad_accum`` micro-batches (DDP synchronises gradients only on the last),
each forward under autocast (mixed precision, guide "mixed precision training"), the loss scaled
for fp16, then unscaling, the gradient norm (with clipping), and the guarded optimizer update
(``guard.StepGuard``: non-finite steps are skipped, the EMA follows applied steps).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from dlperf.dtypes import autocast_dtype
from dlperf.train.guard import EMA, StepGuard, gradient_norm, prepare_deferred


@dataclass
class StepParts:
    """What one step touches. ``run_model`` is what the forward calls (the compiled or
    DDP-wrapped module); ``model`` the module whose parameters the optimizer updates;
    ``ddp`` the DDP wrapper when gradients are synchronised across processes (its ``no_sync``
    skips the all-reduce on all but the last micro-batch)."""

    model: nn.Module
    run_model: nn.Module
    loss_fn: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    guard: object  # guard.StepGuard
    ema: object | None
    dtype: torch.dtype | None  # autocast dtype; None: fp32
    device: torch.device
    max_grad_norm: float | None = None
    ddp: nn.Module | None = None


def build_parts(cfg, model: nn.Module, run_model: nn.Module, optimizer, device: torch.device,
                log, ddp: nn.Module | None = None, agree=None) -> StepParts:
    """The step's parts for ``cfg`` (a TrainConfig): the loss with label smoothing, the fp16
    loss scaler, the EMA, and the non-finite guard in the mode ``cfg`` asks for on ``device``
    (always deferred with CUDA graphs: nothing in a captured step may wait for the host).
    ``agree``:
    how ranks agree on a skipped step (distributed runs)."""
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.dtype == "fp16")
    mode = cfg.nonfinite_mode(device.type)  # deferred with CUDA graphs
    guard = StepGuard(mode, cfg.max_nonfinite_steps, scaler, device, log, agree=agree)
    if mode == "deferred":
        prepare_deferred(optimizer)
    return StepParts(model, run_model, nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing),
                     optimizer, scaler, guard, EMA(model, cfg.ema_decay) if cfg.ema_decay else None,
                     autocast_dtype(cfg.dtype), device, cfg.max_grad_norm, ddp)


def autocast(parts: StepParts, cache: bool = True):
    """Autocast to the step's dtype, or nothing for fp32. ``cache=False`` for CUDA-graph
    capture: cached weight casts would outlive the capture."""
    if parts.dtype is None:
        return nullcontext()
    return torch.autocast(parts.device.type, dtype=parts.dtype, cache_enabled=cache)


def train_step(parts: StepParts, micro_batches, step: int, *, zero_grad: bool = True,
               autocast_cache: bool = True):
    """One optimizer step over ``micro_batches`` [(x, y), ...]; returns (loss, grad_norm,
    applied): the summed loss of the micro-batches (each divided by their count, so the sum is
    the mean loss) as a device tensor, the gradient norm, and whether the update was applied
    (a bool, or a device flag in deferred mode). ``zero_grad=False`` keeps the gradient tensors
    (a CUDA graph rewrites them in place every replay)."""
    n = len(micro_batches)
    loss_sum = 0.0
    for i, (x, y) in enumerate(micro_batches):
        sync = parts.ddp.no_sync() if parts.ddp is not None and i < n - 1 else nullcontext()
        with sync:
            with autocast(parts, autocast_cache):
                loss = parts.loss_fn(parts.run_model(x), y)
                if n > 1:
                    loss = loss / n
            parts.scaler.scale(loss).backward()
        loss_sum = loss_sum + loss.detach().float()
    parts.scaler.unscale_(parts.optimizer)
    grad_norm = gradient_norm(parts.model, parts.max_grad_norm)
    applied = parts.guard.step(parts.optimizer, parts.model, parts.ema, loss_sum, grad_norm, step)
    if zero_grad:
        parts.optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm, applied
