"""Skip optimizer steps whose loss or gradients are not finite, with or without a host sync.

A skipped step leaves the weights, the optimizer state and the EMA exactly as they were; the
learning-rate schedule still advances. Consecutive skips that mean the run has diverged (a
non-finite loss, or fp16 loss scaling driven below 1 — plain fp16 overflow is dynamic loss
scaling at work) stop the run after ``max_run`` in a row.

Two modes (TrainConfig.nonfinite_check):

* ``step``: one device->host sync per step decides on the host; every skip is logged with its
  loss and gradient norm. Works with any optimizer.
* ``deferred``: no sync. The decision stays on the device as a ``found_inf`` tensor that the
  fused SGD kernel (and dlperf's LARS) read to skip the update in place, the same mechanism
  GradScaler uses with fused optimizers. The counters live on the device and are read at the
  points that sync anyway (logging steps, checkpoints, epoch ends), so a diverged run stops at
  the first such point after ``max_run`` consecutive skips. A sync per step stalls the CPU
  until the GPU drains, leaving the next step's kernel launches exposed (performance guide,
  "launch overhead"); at thousands of images per second a ResNet-50 step is a few ms, so the
  stall is a visible share of it.
"""

from __future__ import annotations

import torch
from torch.optim.swa_utils import AveragedModel

from dlperf.errors import DlperfError


class NonFinite(DlperfError):
    """Too many consecutive non-finite steps."""


def _message(run: int, step: int, loss: float, grad_norm: float) -> str:
    return (f"stopping: {run} consecutive steps with a non-finite loss or gradient (last loss "
            f"{loss:.4g}, grad norm {grad_norm:.4g}) at step {step}; lower lr_per_256, add "
            "warm-up, or use dtype=bf16")


def gradient_norm(model: torch.nn.Module, max_norm: float | None = None) -> torch.Tensor:
    """The total L2 norm of the gradients (the guard's input), and with ``max_norm`` the
    gradients scaled down to it; both on the device, no host sync. Only the norm is computed
    when there is no limit (clip_grad_norm_ with an infinite limit still rescales by 1.0)."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if max_norm is not None:  # takes the parameters, and scales their .grad
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


def prepare_deferred(optimizer: torch.optim.Optimizer) -> None:
    """Create SGD momentum buffers as zeros before the first step.

    The fused SGD kernel allocates a missing buffer with torch.empty and then, when found_inf
    skips that first step, leaves it uninitialised for the next one. A zero buffer gives
    exactly the first-step result (0 * momentum + grad = grad with dampening 0) and is safe to
    skip.
    """
    for group in optimizer.param_groups:
        if not group.get("momentum"):
            continue
        for p in group["params"]:
            state = optimizer.state[p]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)


class EMA(AveragedModel):
    """Exponential moving average of the weights and buffers (torch's get_ema_multi_avg_fn
    arithmetic, AveragedModel's state_dict), without host syncs: the stock update reads its
    ``n_averaged`` counter, a device tensor, every step. The update weight can be scaled by a
    device tensor ``keep`` (0: leave the average unchanged), so a skipped step is a no-op
    without the host knowing it was skipped."""

    def __init__(self, model: torch.nn.Module, decay: float):
        super().__init__(model, use_buffers=True)
        self.decay = decay
        self.keep: torch.Tensor | None = None
        self._host_n: int | None = None  # n_averaged mirrored on the host

    def load_state_dict(self, *args, **kwargs):
        result = super().load_state_dict(*args, **kwargs)
        self._host_n = None
        return result

    @torch.no_grad()
    def update_parameters(self, model: torch.nn.Module) -> None:
        if self._host_n is None:
            self._host_n = int(self.n_averaged)  # once per run (or resume): one sync
        ema = [t.detach() for t in (*self.module.parameters(), *self.module.buffers())]
        cur = [t.detach() for t in (*model.parameters(), *model.buffers())]
        if self._host_n == 0:
            for e, c in zip(ema, cur, strict=True):
                e.copy_(c)
        else:
            groups: dict = {}
            for e, c in zip(ema, cur, strict=True):
                pair = groups.setdefault(e.dtype, ([], []))
                pair[0].append(e)
                pair[1].append(c)
            for e_list, c_list in groups.values():
                self._average(e_list, c_list)
        self.n_averaged += 1
        self._host_n += 1

    def _average(self, ema_list, current_list) -> None:
        w = 1.0 - self.decay
        if torch.is_floating_point(ema_list[0]) or torch.is_complex(ema_list[0]):
            if self.keep is None:
                torch._foreach_lerp_(ema_list, current_list, w)
            else:  # bit-identical to the scalar weight when keep == 1 (tested)
                torch._foreach_lerp_(ema_list, current_list, [self.keep * w] * len(ema_list))
            return
        for e, c in zip(ema_list, current_list):  # integer buffers (num_batches_tracked)
            new = (e * self.decay + c * w).to(e.dtype)
            e.copy_(new if self.keep is None else torch.where(self.keep > 0, new, e))


class StepGuard:
    def __init__(self, mode: str, max_run: int, scaler: torch.amp.GradScaler,
                 device: torch.device, log, agree=None):
        """``agree``: makes a 0-dim bool flag true on every rank when it is true on any
        (distributed.any_rank_on_device); gradients are all-reduced, but the loss is each
        rank's own, and a rank that skipped alone would leave its weights behind."""
        if mode not in ("step", "deferred"):
            raise ValueError(f"nonfinite_check must be step or deferred, got {mode!r}")
        self.mode, self.max_run, self.scaler, self.log = mode, max_run, scaler, log
        self.agree = agree
        self.skipped = 0  # host view, exact after every check()
        self._run = 0
        if mode == "deferred":
            zero = torch.zeros((), device=device)
            self._d_skipped = zero.clone()
            self._d_run = zero.clone()
            self._d_max_run = zero.clone()
            self._d_last = torch.zeros(2, device=device)  # loss, grad norm of the last bad step
            self._reported = 0

    def step(self, optimizer, model, ema: "EMA | None", loss_sum: torch.Tensor,
             grad_norm: torch.Tensor, step: int) -> torch.Tensor | bool:
        """Apply the optimizer step (and the EMA update) unless the step is non-finite.

        Returns whether the step was applied: a bool in ``step`` mode, a 0-dim bool tensor on
        the device in ``deferred`` mode.
        """
        bad = ~(torch.isfinite(loss_sum) & torch.isfinite(grad_norm))
        if self.agree is not None:
            bad = self.agree(bad)
        if self.mode == "step":
            if not bool(bad.item()):  # the one device->host sync of a step
                self.scaler.step(optimizer)
                if ema is not None:
                    ema.update_parameters(model)
                self._run = 0
                return True
            self.skipped += 1
            self._run = self._run + 1 if bool(self._diverged(bad, loss_sum).item()) else 0
            self.log.event("nonfinite", step=step, loss=float(loss_sum),
                           grad_norm=float(grad_norm))
            if self._run >= self.max_run:
                raise NonFinite(_message(self._run, step + 1, float(loss_sum), float(grad_norm)))
            return False
        # deferred: gradients were unscaled already (GradScaler.unscale_), so the optimizer is
        # stepped directly with the device-side decision, as GradScaler.step does for fused
        # optimizers; GradScaler.update() still sees its own overflow flags.
        found = bad.to(torch.float32)
        optimizer.grad_scale, optimizer.found_inf = None, found
        try:
            optimizer.step()
        finally:
            del optimizer.grad_scale, optimizer.found_inf
        if ema is not None:
            ema.keep = 1.0 - found
            try:
                ema.update_parameters(model)
            finally:
                ema.keep = None
        self._d_skipped += found
        self._d_run.add_(1).mul_(self._diverged(bad, loss_sum).to(torch.float32))
        torch.maximum(self._d_max_run, self._d_run, out=self._d_max_run)
        self._d_last.copy_(torch.where(bad, torch.stack([loss_sum.float(), grad_norm.float()]),
                                       self._d_last))
        return ~bad

    def _diverged(self, bad: torch.Tensor, loss_sum: torch.Tensor) -> torch.Tensor:
        """fp16: overflowing scaled gradients are dynamic loss scaling at work (GradScaler
        halves the scale); only a non-finite loss, or a scale driven below 1, means the run
        itself has diverged."""
        if not self.scaler.is_enabled():
            return bad
        return bad & (~torch.isfinite(loss_sum) | (self.scaler._get_scale_async() < 1.0))

    def check(self, step: int) -> None:
        """Deferred mode: bring the counters to the host (a sync) and stop a diverged run."""
        if self.mode != "deferred":
            return
        skipped, max_run = int(self._d_skipped.item()), int(self._d_max_run.item())
        self.skipped = skipped
        if skipped > self._reported:
            loss, grad_norm = self._d_last.tolist()
            self.log.event("nonfinite", step=step, skipped_since_last=skipped - self._reported,
                           loss=loss, grad_norm=grad_norm)
            self._reported = skipped
        if max_run >= self.max_run:
            loss, grad_norm = self._d_last.tolist()
            raise NonFinite(_message(max_run, step, loss, grad_norm))
