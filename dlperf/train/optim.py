"""The optimizer and its schedule: SGD (fused where it can be) or LARS, with the recipe's
parameter groups (no weight decay on BN parameters and biases) and a linear warm-up followed by
cosine, one-cycle/linear or step decay."""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn

from dlperf.train.recipes import TrainConfig


def param_groups(model: nn.Module, cfg: TrainConfig) -> list[dict]:
    """No weight decay on BN parameters and biases (1-D tensors), as the recipe says."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if cfg.no_decay_bn_bias and p.ndim <= 1 else decay).append(p)
    return [{"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0, "lars_exclude": True}]


class LARS(torch.optim.Optimizer):
    """SGD with momentum and layer-wise adaptive rate scaling (You et al.) for large batches:
    each layer's step is scaled by trust * ||w|| / (||g|| + wd ||w||); BN and bias excluded."""

    def __init__(self, params, lr, momentum=0.9, weight_decay=0.0, trust=0.001):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      trust=trust, lars_exclude=False))

    @torch.no_grad()
    def step(self, closure=None):
        # ``found_inf`` (a 0-dim device tensor, set by StepGuard in deferred mode, as
        # GradScaler sets it for fused optimizers): 1 skips this step on the device.
        found = getattr(self, "found_inf", None)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                wd = group["weight_decay"]
                if not group["lars_exclude"]:
                    # the paper's local rate: trust x ||w|| / (||grad|| + wd x ||w||), from the
                    # raw gradient's norm (not the norm of grad + wd x w)
                    w_norm, g_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(g)
                    ratio = torch.where((w_norm > 0) & (g_norm > 0),
                                        group["trust"] * w_norm / (g_norm + wd * w_norm),
                                        torch.ones_like(w_norm))
                    g = (g.add(p, alpha=wd) if wd else g) * ratio
                elif wd:
                    g = g.add(p, alpha=wd)
                buf = self.state[p].get("momentum_buffer")
                if found is None:
                    if buf is None:
                        buf = self.state[p]["momentum_buffer"] = g.clone()
                    else:
                        buf.mul_(group["momentum"]).add_(g)
                    p.add_(buf, alpha=-group["lr"])
                    continue
                skip = found > 0
                if buf is None:  # same values as the first-step clone when not skipped
                    buf = self.state[p]["momentum_buffer"] = torch.zeros_like(p)
                buf.copy_(torch.where(skip, buf, buf * group["momentum"] + g))
                update = torch.where(skip, torch.zeros_like(buf), buf)
                lr = group["lr"]
                if isinstance(lr, torch.Tensor):  # CUDA graphs: read from device memory
                    p.sub_(update * lr)
                else:
                    p.add_(update, alpha=-lr)


def build_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device):
    groups = param_groups(model, cfg)
    if cfg.optimizer == "lars":
        return LARS(groups, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    for g in groups:
        g.pop("lars_exclude", None)
    # Fused SGD on CUDA; on the CPU too for deferred non-finite checks, which need the fused
    # kernel's on-device skip (found_inf).
    fused = cfg.fused_optimizer and (device.type == "cuda"
                                     or cfg.nonfinite_mode(device.type) == "deferred")
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
                           fused=fused or None, foreach=None if fused else cfg.fused_optimizer)


def lr_factor(step: int, total: int, warmup: int, schedule: str, steps_per_epoch: int) -> float:
    """Multiplier of the peak lr at an optimizer step (linear warm-up, then the schedule)."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    if schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    if schedule in ("onecycle", "linear"):
        return max(0.0, 1.0 - progress)
    epoch = step / steps_per_epoch  # step decay at 30/60/80 of 90 epochs, scaled
    total_epochs = total / steps_per_epoch
    return 0.1 ** sum(epoch >= total_epochs * m for m in (1 / 3, 2 / 3, 8 / 9))


def build_scheduler(optimizer, cfg: TrainConfig, steps_per_epoch: int):
    """LambdaLR over the run's optimizer steps: warm-up, then ``cfg.schedule``."""
    total = steps_per_epoch * cfg.epochs
    warmup = int(cfg.warmup_epochs * steps_per_epoch)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, total, warmup, cfg.schedule, steps_per_epoch))


def step_schedule(scheduler) -> None:
    """Advance the schedule one optimizer step, also after a skipped (non-finite) step, whose
    optimizer.step() never ran: PyTorch's warning about that order is expected here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step")
        scheduler.step()


def host_lr(scheduler) -> float:
    """The current learning rate of the first group, computed on the host: reading the group's
    value would sync when it is a device tensor (CUDA graphs keep it on the device)."""
    return scheduler.base_lrs[0] * scheduler.lr_lambdas[0](scheduler.last_epoch)
