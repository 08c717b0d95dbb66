"""Model-in/model-out speed-ups, applied in one documented order (the model stays plain PyTorch).

Order, and why:
1. backend flags   TF32 for FP32 GEMMs/convs (guide 2.2), cudnn.benchmark (tuned kernels: the
                   blog's specialised convolutions), or deterministic algorithms for exact runs.
2. zero-init       the last BN gamma of each residual block starts at 0 (recipe), before any
                   layout change so it touches plain parameters.
3. pad stem 3->4   a zero 4th input channel on the first 3-channel conv, so its C is Tensor Core
                   friendly; the loader pads the images to match (LoaderConfig.channels=4).
4. channels_last   NHWC end to end (the blog's layout): parameters re-laid-out once.
5. to device       after the layout change, so the copy lands in the final layout.
6. SyncBatchNorm   (data parallel only) converted before DDP wraps the model.
7. torch.compile   last: it traces the model as it will run (fuses BN+ReLU, ADD+ReLU).
Mixed precision (autocast + GradScaler) and the fused optimizer live in the loop; each switch is
a TrainConfig field, so `bench` can turn them on one at a time.
"""

from __future__ import annotations

import torch
from torch import nn

from dlperf.train.recipes import TrainConfig

# The order ``apply`` runs them in (compile is ``maybe_compile``, after DDP wraps the model).
ORDER = ("backend_flags", "zero_init_residual", "pad_stem_to_4", "channels_last", "to_device",
         "sync_bn", "compile")


def backend_flags(cfg: TrainConfig) -> None:
    torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
    torch.backends.cudnn.allow_tf32 = cfg.tf32
    torch.backends.cudnn.benchmark = cfg.cudnn_benchmark and not cfg.deterministic
    if cfg.deterministic:
        torch.backends.cudnn.deterministic = True
        torch.use_deterministic_algorithms(True, warn_only=True)


def zero_init_residual(model: nn.Module) -> nn.Module:
    """Zero the gamma of each residual block's last norm (torchvision's bn3/bn2 naming)."""
    for module in model.modules():
        last = getattr(module, "bn3", None) if hasattr(module, "conv3") else getattr(module, "bn2", None)
        if hasattr(module, "conv2") and isinstance(last, (nn.BatchNorm2d, nn.GroupNorm)):
            if last.weight is not None:
                nn.init.zeros_(last.weight)
    return model


def pad_stem_to_4(model: nn.Module) -> nn.Module:
    """Replace the first Conv2d with 3 input channels by a 4-channel one with zero weights for
    the extra channel: identical outputs for inputs whose 4th channel is 0."""
    for parent in model.modules():
        for name, child in parent.named_children():
            if isinstance(child, nn.Conv2d) and child.in_channels == 3 and child.groups == 1:
                new = nn.Conv2d(4, child.out_channels, child.kernel_size, child.stride,
                                child.padding, child.dilation, 1, child.bias is not None,
                                child.padding_mode, device=child.weight.device,
                                dtype=child.weight.dtype)
                with torch.no_grad():
                    new.weight.zero_()
                    new.weight[:, :3] = child.weight
                    if child.bias is not None:
                        new.bias.copy_(child.bias)
                setattr(parent, name, new)
                return model
    raise ValueError("pad_stem_to_4: the model has no 3-channel Conv2d stem")


def _steps(cfg: TrainConfig, device: torch.device, distributed: bool) -> dict:
    """name -> the model-in/model-out function for each speed-up of ORDER, or None when
    ``cfg`` leaves it off (backend flags set process state and return the model as is)."""
    def flags(m):
        backend_flags(cfg)
        return m

    return {
        "backend_flags": flags,
        "zero_init_residual": zero_init_residual if cfg.zero_init_residual else None,
        "pad_stem_to_4": pad_stem_to_4 if cfg.pad_stem_to_4 else None,
        "channels_last": ((lambda m: m.to(memory_format=torch.channels_last))
                          if cfg.channels_last else None),
        "to_device": lambda m: m.to(device),
        "sync_bn": nn.SyncBatchNorm.convert_sync_batchnorm if distributed and cfg.sync_bn else None,
        "compile": None,  # maybe_compile, after DDP wraps the model
    }


def apply(model: nn.Module, cfg: TrainConfig, device: torch.device, distributed: bool = False
          ) -> nn.Module:
    """Apply the enabled speed-ups in ORDER; returns the model to wrap (DDP) and compile."""
    steps = _steps(cfg, device, distributed)
    for name in ORDER:
        if steps[name] is not None:
            model = steps[name](model)
    return model


def maybe_compile(model: nn.Module, cfg: TrainConfig) -> nn.Module:
    """Last step, after DDP wrapping (DDP-aware compilation); compile time is reported apart."""
    if cfg.compile:
        return torch.compile(model, mode=None if cfg.compile == "default" else cfg.compile)
    return model


def prepare_model(model: nn.Module, cfg: TrainConfig, info) -> tuple[nn.Module, nn.Module,
                                                                      nn.Module]:
    """(model, DDP-wrapped model, what the forward calls): the speed-ups in ORDER, DDP with
    several processes, then torch.compile of the wrapped model."""
    from dlperf.train import distributed

    model = apply(model, cfg, info.device, distributed=info.enabled)
    ddp_model = distributed.wrap(model, info, broadcast_buffers=cfg.broadcast_buffers)
    return model, ddp_model, maybe_compile(ddp_model, cfg)

