"""The training run: data -> model (speed-ups) -> steps (autocast, loss scaling, accumulation,
non-finite skipping) -> evaluation -> checkpoints and logs, resumable at any step.

Exit conditions a caller sees (the CLI maps them to exit codes):
* normal end: returns the summary;
* SIGTERM/SIGUSR1 or a first Ctrl-C: the current step finishes, a checkpoint is written,
  `Preempted` is raised (exit code 75, EX_TEMPFAIL); `--resume auto` (the default) continues
  from it;
* `max_nonfinite_steps` consecutive steps with a non-finite loss or gradient: `NonFinite`
  (exit code 3) with a diagnostic; each skipped step leaves the weights unchanged
  (dlperf/train/guard.py; with nonfinite_check=deferred, detected at the next logging step).
"""

from __future__ import annotations

import io
import json
import math
import random
import signal
import sys
import time
import warnings
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dlperf.errors import DlperfError
from dlperf.report import write_json_atomic
from dlperf.train import checkpoint as ckpt
from dlperf.train import distributed as D
from dlperf.train import speedups
from dlperf.train.graphs import GraphedStep, float_learning_rates
from dlperf.train.guard import EMA, NonFinite, StepGuard, gradient_norm, prepare_deferred  # noqa: F401
from dlperf.train.metrics import RunLog, Throughput, flops_per_image, peak_flops
from dlperf.train.recipes import RESUME_NOTES, TrainConfig, resume_differences
from dlperf.train.runlock import RunLock

EXIT_PREEMPTED = 75
EXIT_NONFINITE = 3
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}


class Preempted(DlperfError):
    """Stopped by a signal after saving a checkpoint."""


# ---------------------------------------------------------------- model, data, optimizer
def build_model(name: str, num_classes: int, meta: bool = False) -> nn.Module:
    if name in ("tiny", "tiny-gn"):
        from dlperf.models.tiny import TinyResNet

        return TinyResNet(num_classes, norm="bn" if name == "tiny" else "gn")
    from dlperf.models.registry import build_model as registry_build

    model, _ = registry_build(name, num_classes=num_classes, real=not meta)
    return model


def _open_checked(path: str, check_checksums: bool, setting: str):
    """open_source, with each sample's CRC-32 checked on read when asked (shards only)."""
    from dlperf.data.sources import ShardSource, open_source

    source = open_source(path)
    if check_checksums:
        if not (isinstance(source, ShardSource) and source.has_checksums):
            raise DlperfError(f"check_checksums=true needs shards with checksums, but {setting}="
                              f"{path} is not (make them with `dlperf data prepare SRC DST`)")
        source.check_checksums = True
    return source


def build_loaders(cfg: TrainConfig, info: D.DistInfo, image_size: int):
    from dlperf.data.loader import Loader, LoaderConfig, SyntheticLoader

    if cfg.batch_size % (info.world_size * cfg.grad_accum):
        raise DlperfError(f"batch_size {cfg.batch_size} must divide by world_size x grad_accum "
                          f"= {info.world_size * cfg.grad_accum}")
    per_rank = cfg.batch_size // info.world_size
    # batch_size is global and per optimizer step: each rank's loader yields micro-batches that
    # grad_accum of them make up (it yielded whole batches, so grad_accum=2 trained on twice
    # the batch the learning rate was scaled for; tests/test_train_reference.py)
    micro = per_rank // cfg.grad_accum
    channels = 4 if cfg.pad_stem_to_4 else 3
    if cfg.data == "synthetic":
        train = SyntheticLoader(micro, image_size, cfg.num_classes,
                                batches=(cfg.steps_per_epoch or 100) * cfg.grad_accum,
                                channels=channels,
                                seed=cfg.seed + info.rank, pin_memory=info.device.type == "cuda")
        return train, None
    common = dict(threads=cfg.threads, prefetch=cfg.prefetch, seed=cfg.seed, rank=info.rank,
                  world_size=info.world_size, on_bad_file=cfg.on_bad_file,
                  max_bad_fraction=cfg.max_bad_fraction, channels=channels)
    source = _open_checked(cfg.data, cfg.check_checksums, "data")
    if len(source.classes) > cfg.num_classes:
        raise DlperfError(f"{cfg.data}: {len(source.classes)} classes but num_classes="
                          f"{cfg.num_classes}; set num_classes={len(source.classes)}")

    def make(src, lcfg):
        if cfg.data_backend == "gpu":  # nvJPEG + batched crops on the training device
            from dlperf.data.gpu import GpuLoader

            return GpuLoader(src, lcfg, device=str(info.device))
        if cfg.data_backend == "dali":
            from dlperf.data.dali import DaliLoader

            return DaliLoader(src, lcfg, device=info.device.type)
        return Loader(src, lcfg)

    train = make(source, LoaderConfig(batch_size=micro, train=True, size=image_size,
                                      scale=(cfg.min_crop_area, 1.0), flip=cfg.flip, **common))
    val = None
    if cfg.val_data:
        val = make(_open_checked(cfg.val_data, cfg.check_checksums, "val_data"), LoaderConfig(
            batch_size=per_rank, train=False, size=cfg.eval_image_size or image_size,
            drop_last=False, **common))
    return train, val


def _source_kind(loader) -> str:
    """'shards' (written by `dlperf data prepare`), 'files' (a folder or list) or 'synthetic'."""
    from dlperf.data.sources import ShardSource

    source = getattr(loader, "source", None)
    if source is None:
        return "synthetic"
    return "shards" if isinstance(source, ShardSource) else "files"


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


def graph_capture_supported(device: torch.device) -> bool:
    """CUDA graphs need CUDA. (Tests patch this to run the graphed step's body eagerly on the
    CPU, which exercises the loop's whole graphed branch except the capture itself.)"""
    return device.type == "cuda"


def host_lr(scheduler) -> float:
    """The current learning rate of the first group, computed on the host: reading the group's
    value would sync when it is a device tensor (CUDA graphs keep it on the device)."""
    return scheduler.base_lrs[0] * scheduler.lr_lambdas[0](scheduler.last_epoch)


def image_size_at(cfg: TrainConfig, epoch: int) -> int:
    """Progressive resizing: min_image_size -> image_size linearly over the first 3/4 of the run
    (multiples of 32), then image_size (fast.ai's low-to-high schedule)."""
    if not cfg.min_image_size or cfg.min_image_size == cfg.image_size:
        return cfg.image_size
    ramp = max(1, int(cfg.epochs * 0.75))
    size = cfg.min_image_size + (cfg.image_size - cfg.min_image_size) * min(1.0, epoch / ramp)
    return min(cfg.image_size, int(round(size / 32) * 32) or 32)


# ---------------------------------------------------------------- RNG and checkpoint state
def rng_state() -> dict:
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": [np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]],
            "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy(), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _unwrap(model: nn.Module) -> nn.Module:
    model = getattr(model, "_orig_mod", model)  # torch.compile
    return getattr(model, "module", model)  # DDP


# ---------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate(model: nn.Module, loader, info: D.DistInfo, dtype, channels_last: bool) -> dict:
    from dlperf.data.device import normalize_nhwc

    model.eval()
    # counts summed on the device and read once at the end (no host sync per batch)
    correct = torch.zeros(2, dtype=torch.int64, device=info.device)
    seen = 0
    for batch in loader:
        keep = len(batch) - batch.num_padded  # sharding padding is not evaluated twice
        x = normalize_nhwc(batch.images[:keep], info.device)
        if not channels_last:
            x = x.contiguous()
        y = batch.labels[:keep].to(info.device, non_blocking=True, copy=True)
        batch.release()
        with torch.autocast(info.device.type, dtype=dtype) if dtype else nullcontext():
            logits = model(x)
        top5 = logits.float().topk(min(5, logits.shape[1]), dim=1).indices
        hits = top5 == y[:, None]
        correct += torch.stack([hits[:, 0].sum(), hits.any(dim=1).sum()])
        seen += keep
    correct1, correct5 = correct.tolist()
    correct1, correct5, seen = D.all_reduce_sum([correct1, correct5, seen], info)
    model.train()
    return {"top1": correct1 / seen if seen else 0.0, "top5": correct5 / seen if seen else 0.0,
            "samples": int(seen)}


# ---------------------------------------------------------------- the run
class _Signals:
    """SIGTERM/SIGUSR1, and a first Ctrl-C (SIGINT), set a flag; the loop checkpoints and stops
    at the next step boundary. A second Ctrl-C aborts at once (KeyboardInterrupt), as usual."""

    def __init__(self):
        self.caught: int | None = None
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: signals cannot be caught here
                pass
        return self

    def _handle(self, signum, _frame):
        self.caught = signum
        if signum == signal.SIGINT:
            import sys

            signal.signal(signal.SIGINT, signal.default_int_handler)
            print("dlperf: stopping after this step with a checkpoint; Ctrl-C again to abort",
                  file=sys.stderr)

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def train(cfg: TrainConfig, resume: str | None = "auto", progress: bool = True,
          stop_at_step: int | None = None, mfu: bool = True, console=None) -> dict:
    """Run ``cfg``. ``resume``: "auto" (newest complete checkpoint in out_dir, if any), None
    (start fresh; refuses a folder that already has checkpoints), or a checkpoint path.
    ``stop_at_step``: behave as if preempted after that global step (tests, time limits)."""
    info = D.setup(cfg.device, cfg.collective_timeout_s)
    out = Path(cfg.out_dir)
    ckpt_dir = out / "checkpoints"
    try:
        # The folder is this run's before anything is read or written, and the resume is
        # checked before anything changes on disk (config.json, logs, checkpoints).
        with RunLock(out, enabled=info.is_main):
            notes: list[str] = []
            found = _resume_point(cfg, ckpt_dir, resume, info, notes, console)
            log = RunLog(out if info.is_main else None)
            try:
                for note in notes:
                    log.event("warning", message=note)
                return _train(cfg, info, out, ckpt_dir, log, found, progress, stop_at_step, mfu,
                              console)
            finally:
                log.close()
    except torch.OutOfMemoryError:
        raise DlperfError(f"out of memory at {cfg.batch_size // info.world_size} images per "
                          f"{info.device.type} (batch_size={cfg.batch_size}); try "
                          f"batch_size={max(1, cfg.batch_size // 2)} or grad_accum="
                          f"{cfg.grad_accum * 2}") from None
    finally:
        D.teardown(info)


def _say(console, message: str) -> None:
    """A note for the person at the console (stderr when there is no rich console)."""
    if console is not None:
        console.print(f"dlperf: {message}", highlight=False)
    else:
        print(f"dlperf: {message}", file=sys.stderr)


def _resume_point(cfg, ckpt_dir: Path, resume, info, notes: list, console):
    """(state, CheckpointInfo) to resume from, or None for a fresh start; refuses (DlperfError)
    a fresh start over checkpoints and a resume whose settings differ from the checkpoint's."""
    if resume is None:
        if ckpt.complete(ckpt_dir):
            raise DlperfError(f"{ckpt_dir}: holds checkpoints; resume them (--resume auto) or "
                              "choose another out_dir")
        return None

    def warn(message):
        notes.append(message)
        if info.is_main:
            _say(console, message)

    if resume == "auto":
        found = ckpt.load_latest(ckpt_dir, map_location=info.device, warn=warn,
                                 move_aside=info.is_main)
    else:
        found = ckpt.load_verified(resume, map_location=info.device)
    if found is None:
        return None
    state, where = found
    refused, accepted = resume_differences(state.get("config") or {}, cfg)
    if refused:
        diffs = ", ".join(f"{k} {old!r} -> {new!r}" for k, old, new in refused)
        raise DlperfError(f"resume from {where.path}: this run's settings differ from the "
                          f"checkpoint's ({diffs}); resume with the checkpoint's settings, or "
                          "train into another out_dir (nothing was changed)")
    for key, old, new in accepted:
        if key in RESUME_NOTES:
            warn(f"{key} {old!r} -> {new!r} on resume: {RESUME_NOTES[key]}")
    return found


def _train(cfg, info, out, ckpt_dir, log, found, progress, stop_at_step, mfu, console):
    from dlperf.data.device import DevicePrefetcher

    seed_everything(cfg.seed)
    dtype = DTYPES[cfg.dtype]
    if cfg.dtype == "bf16" and info.device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise DlperfError("this GPU has no bf16; use dtype=fp16")
    image_size = image_size_at(cfg, 0)
    train_loader, val_loader = build_loaders(cfg, info, image_size)
    model = build_model(cfg.model, cfg.num_classes)
    model = speedups.apply(model, cfg, info.device, distributed=info.enabled)
    ddp_model = D.wrap(model, info)
    t0 = time.perf_counter()
    run_model = speedups.maybe_compile(ddp_model, cfg)
    optimizer = build_optimizer(model, cfg, info.device)
    steps_per_epoch = len(train_loader) // cfg.grad_accum  # optimizer steps
    if steps_per_epoch == 0:
        raise DlperfError(f"{cfg.data}: fewer samples than one batch of {cfg.batch_size}")
    total_steps = steps_per_epoch * cfg.epochs
    warmup = int(cfg.warmup_epochs * steps_per_epoch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, total_steps, warmup, cfg.schedule, steps_per_epoch))
    scaler = torch.amp.GradScaler(info.device.type, enabled=cfg.dtype == "fp16")
    ema = EMA(model, cfg.ema_decay) if cfg.ema_decay else None
    guard = StepGuard(cfg.nonfinite_mode(info.device.type), cfg.max_nonfinite_steps, scaler,
                      info.device, log,
                      agree=(lambda flag: D.any_rank_on_device(flag, info)) if info.enabled
                      else None)
    if guard.mode == "deferred":
        prepare_deferred(optimizer)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
    graphed = None
    if cfg.cuda_graphs:
        if not graph_capture_supported(info.device):
            raise DlperfError("cuda_graphs=true needs a CUDA GPU (this run is on "
                              f"{info.device.type}); drop it")
        if info.enabled:
            raise DlperfError("cuda_graphs=true is single-process for now (DDP's collectives "
                              "are not captured); drop it or run one process")
        graphed = GraphedStep(model, run_model, loss_fn, optimizer, guard, ema, dtype,
                              info.device, capture=info.device.type == "cuda",
                              max_grad_norm=cfg.max_grad_norm)

    step, start_epoch, best = 0, 0, None
    resumed_from, resumed_stats = None, None
    live: dict = {}  # what a checkpoint records of the epoch in progress
    if found:
        state, where = found
        try:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            scaler.load_state_dict(state["scaler"])
            if ema is not None and state.get("ema") is not None:
                ema.load_state_dict(state["ema"])
            train_loader.load_state_dict(state["loader"])
            set_rng_state(state["rng"][min(info.rank, len(state["rng"]) - 1)])
        except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise DlperfError(f"resume from {where.path}: it does not fit this run's model, "
                              f"optimizer or data ({first}); resume with the settings it was "
                              "trained with, or train into another out_dir") from None
        step, start_epoch, best = state["step"], train_loader.epoch, state.get("best")
        resumed_stats = state.get("epoch_stats")
        resumed_from = str(where.path)
        if step >= total_steps and start_epoch >= cfg.epochs:
            return _finished(out, step, resumed_from, console if info.is_main else None)
        log.event("resume", step=step, epoch=start_epoch, checkpoint=resumed_from)
    if info.is_main:  # the settings this folder's weights are trained with from here on
        write_json_atomic(out / "config.json", {"config": cfg.to_dict(),
                                                 "world_size": info.world_size,
                                                 "device": str(info.device)})

    it = None  # the epoch's DevicePrefetcher: one batch ahead of the steps

    def save(metric=None, reason="epoch"):
        guard.check(step)  # never checkpoint a run that has diverged
        rng = [rng_state()]
        if info.enabled:  # every rank's RNG, gathered to rank 0 (as bytes: gathering tensor
            buf = io.BytesIO()  # objects directly fails in some torch versions)
            torch.save(rng[0], buf)
            gathered = [None] * info.world_size
            torch.distributed.all_gather_object(gathered, buf.getvalue())
            rng = [torch.load(io.BytesIO(b), weights_only=True) for b in gathered]
        if not info.is_main:
            return None
        state = {"model": model.state_dict(),
                 "optimizer": float_learning_rates(optimizer.state_dict()),
                 "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
                 "ema": ema.state_dict() if ema is not None else None,
                 "loader": it.loader_state() if it is not None else train_loader.state_dict(),
                 "rng": rng, "step": step,
                 "best": best, "config": cfg.to_dict()}
        if "epoch_stats" in live:  # the loss sum so far this epoch (one sync, at checkpoints)
            stats = live["epoch_stats"]
            state["epoch_stats"] = {"loss": float(stats["loss"]), "n": int(stats["n"])}
        try:
            saved = ckpt.save(ckpt_dir, state, step, train_loader.epoch, metric, cfg.keep_last)
        except OSError as exc:  # disk full, quota, a folder gone: stop cleanly, lose nothing
            raise DlperfError(f"{ckpt_dir}: could not write the checkpoint of step {step} "
                              f"({exc.strerror or exc}); the checkpoints before it are intact: "
                              "free space and run the same command again to resume from the "
                              "newest") from None
        log.event("checkpoint", step=step, path=str(saved.path), reason=reason)
        return saved

    tput = Throughput()
    profiler = None
    if cfg.profile_steps and info.is_main:
        from dlperf.train.profiling import StepProfiler

        profiler = StepProfiler(cfg.profile_steps, out, info.device, log)
    last_eval: dict = {}
    compile_s = 0.0
    first_step_s = None
    time_to_target = None
    run_start = time.perf_counter()
    bar = _Progress(progress and info.is_main, console)
    try:
        with _Signals() as signals:
            for epoch in range(start_epoch, cfg.epochs):
                size = image_size_at(cfg, epoch)
                if size != image_size and cfg.data != "synthetic":  # progressive resizing
                    image_size = size
                    train_loader = _resized(train_loader, size)
                if train_loader.state_dict()["next_batch"] == 0:
                    train_loader.set_epoch(epoch)
                epoch_stats = {"loss": 0.0, "n": 0}  # mean loss over the finite steps
                if resumed_stats and train_loader.state_dict()["next_batch"] > 0:
                    # resumed mid-epoch: the row averages the steps before the stop too
                    epoch_stats.update(resumed_stats)
                resumed_stats = None
                live["epoch_stats"] = epoch_stats
                last_loss = float("nan")
                bar.start(epoch, steps_per_epoch)
                t_prev = time.perf_counter()
                # Batches on the device one step ahead (a side CUDA stream copies batch k+1
                # while k trains); it also keeps the loader position a checkpoint must record.
                it = DevicePrefetcher(train_loader, info.device, cfg.channels_last)
                carried_wait = it.last_wait  # the epoch's first fetch
                while True:
                    inputs, wait = [], carried_wait
                    carried_wait = 0.0
                    for _ in range(cfg.grad_accum):
                        got = next(it, None)
                        if got is None:
                            break
                        wait += it.last_wait
                        inputs.append(got)
                    if len(inputs) < cfg.grad_accum:
                        break
                    if graphed is not None:  # forward .. optimizer, one graph replay
                        x, y, n_img = inputs[0]
                        loss_sum, grad_norm, finite = graphed(x, y)
                    else:
                        loss_sum, n_img = 0.0, 0
                        for i, (x, y, n) in enumerate(inputs):
                            sync = (ddp_model.no_sync() if info.enabled and i < len(inputs) - 1
                                    else nullcontext())
                            with sync, (torch.autocast(info.device.type, dtype=dtype) if dtype
                                        else nullcontext()):
                                loss = loss_fn(run_model(x), y) / cfg.grad_accum
                            scaler.scale(loss).backward()
                            loss_sum += loss.detach().float()
                            n_img += n
                        if step == 0 and cfg.compile:
                            compile_s = time.perf_counter() - t0
                        scaler.unscale_(optimizer)
                        grad_norm = gradient_norm(model, cfg.max_grad_norm)
                        finite = guard.step(optimizer, model, ema, loss_sum, grad_norm, step)
                        optimizer.zero_grad(set_to_none=True)
                    scaler.update()
                    with warnings.catch_warnings():  # a skipped step still advances the schedule
                        warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step")
                        scheduler.step()
                    if graphed is not None:
                        graphed.after_scheduler_step()
                    step += 1
                    if profiler is not None:
                        profiler.step()
                    now = time.perf_counter()
                    n_img *= info.world_size
                    if first_step_s is None:  # warm-up (and compilation): reported apart
                        first_step_s = now - t_prev
                    else:
                        tput.add(n_img, now - t_prev, wait)
                    t_prev = now
                    # the mean loss over the applied steps, summed on the device
                    if isinstance(finite, bool):
                        if finite:
                            epoch_stats["loss"] = epoch_stats["loss"] + loss_sum
                            epoch_stats["n"] += 1
                    else:  # deferred: a device flag, no sync
                        epoch_stats["loss"] = epoch_stats["loss"] + torch.where(finite, loss_sum,
                                                                                0.0)
                        epoch_stats["n"] = epoch_stats["n"] + finite
                    lr_now = host_lr(scheduler)
                    if step % cfg.log_every == 0:
                        guard.check(step)  # deferred mode: counters read where we sync anyway
                        last_loss = float(loss_sum)
                        log.event("step", step=step, epoch=epoch, loss=last_loss, lr=lr_now,
                                  grad_norm=float(grad_norm),
                                  img_per_s=tput.img_per_s, data_wait=tput.data_wait_share,
                                  skipped=guard.skipped)
                    bar.advance(last_loss, lr_now, tput)
                    if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                        save(reason="interval")
                    at_stop_step = stop_at_step is not None and step >= stop_at_step
                    caught = signals.caught is not None
                    if info.enabled and not at_stop_step:
                        # Every rank must agree to stop on a signal any of them caught; that is
                        # a collective and a host sync, so it runs at logging steps (the same
                        # steps on every rank), not every step.
                        caught = step % cfg.log_every == 0 and D.any_rank(caught, info)
                    if at_stop_step or caught:
                        saved = save(reason="preempted")
                        D.barrier(info)
                        raise Preempted(f"stopped at step {step} (signal {signals.caught or '-'}); "
                                        f"checkpoint {saved.path if saved else 'on rank 0'}; "
                                        "run the same command again to resume")
                bar.stop()
                guard.check(step)
                row = {"epoch": epoch, "step": step,
                       "loss": float(epoch_stats["loss"]) / max(1, int(epoch_stats["n"])),
                       "lr": host_lr(scheduler), "img_per_s": tput.img_per_s,
                       "data_wait": tput.data_wait_share, "image_size": image_size,
                       "skipped_steps": guard.skipped}
                if val_loader is not None and (epoch + 1) % cfg.eval_every == 0:
                    last_eval = evaluate(ema.module if ema is not None else model, val_loader,
                                         info, dtype, cfg.channels_last)
                    row.update(top1=last_eval["top1"], top5=last_eval["top5"])
                    best = max(best or 0.0, last_eval["top1"])
                if hasattr(train_loader, "reports") and train_loader.reports:
                    log.event("data", epoch=epoch, report=train_loader.reports[-1])
                log.event("epoch", **row)
                log.epoch_row(row)
                if info.is_main:
                    _draw_curves(out, cfg, log)
                bar.epoch_line(row)
                save(metric=last_eval.get("top1"))
                if (cfg.target_accuracy is not None and last_eval
                        and last_eval["top1"] >= cfg.target_accuracy):
                    time_to_target = time.perf_counter() - run_start
                    break
    finally:
        bar.stop()
        if profiler is not None:
            profiler.stop()  # a run shorter than the profiling window
    summary = {"steps": step, "epochs": cfg.epochs, "img_per_s": tput.img_per_s,
               "compute_img_per_s": tput.compute_img_per_s, "data_wait_share": tput.data_wait_share,
               "skipped_steps": guard.skipped, "compile_s": compile_s, "first_step_s": first_step_s,
               "nonfinite_check": guard.mode,
               "cuda_graphs": graphed.captures if graphed is not None else None,
               "resumed_from": resumed_from, "data_source": _source_kind(train_loader),
               "eval": last_eval, "best_top1": best, "time_to_target_s": time_to_target,
               "wall_s": time.perf_counter() - run_start}
    if info.is_main:  # on disk before the ceiling is looked up (a first run probes this CPU)
        write_json_atomic(out / "summary.json", summary)
    if mfu and tput.img_per_s:
        fpi = flops_per_image(cfg.model, cfg.num_classes, image_size, cfg.dtype,
                              4 if cfg.pad_stem_to_4 else 3)
        peak, source = peak_flops(info.device, cfg.dtype)
        if fpi and peak:
            summary.update(flops_per_image=fpi, peak_flops=peak, peak_source=source,
                           mfu=fpi * tput.compute_img_per_s / info.world_size / peak)
    from dlperf.train.advice import advice

    summary["advice"] = advice(summary, cfg, info.device.type)
    if info.is_main:
        write_json_atomic(out / "summary.json", summary)
        log.event("summary", **{k: v for k, v in summary.items()
                                 if not isinstance(v, (dict, list))})
    return summary


def _finished(out: Path, step: int, checkpoint: str, console) -> dict:
    """A rerun of a finished run: nothing to train and nothing rewritten; its summary as it was."""
    summary_path = out / "summary.json"
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, ValueError):
        summary = {"steps": step, "resumed_from": checkpoint}
    summary["already_finished"] = True
    if console is not None:
        _say(console, f"{out} already finished at step {step} ({checkpoint}); nothing to "
                      "train (raise epochs= to train on, or choose another out_dir)")
    return summary


def _resized(loader, size: int):
    """The same loader at a new crop size (progressive resizing), keeping its position."""
    state = loader.state_dict()
    loader.close()
    new = loader.with_size(size)
    new.load_state_dict(state)
    return new


def _draw_curves(out: Path, cfg: TrainConfig, log) -> None:
    """out_dir/curves.png from epochs.csv (the whole history, resumed runs included); a
    plotting problem is a warning, never the end of a run."""
    from dlperf.plots import read_epochs_csv, training_curves

    try:
        training_curves(read_epochs_csv(out / "epochs.csv"), out / "curves.png",
                        title=f"{cfg.model}, batch {cfg.batch_size}, {cfg.dtype}")
    except Exception as exc:  # noqa: BLE001 - a picture must not stop training
        log.event("warning", message=f"curves.png not drawn: {exc}")


class _Progress:
    """A rich progress bar per epoch with loss, lr, img/s and data-wait %."""

    def __init__(self, enabled: bool, console=None):
        self.enabled = enabled
        self.console = console
        self._bar = None

    def start(self, epoch: int, total: int) -> None:
        if not self.enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._bar = Progress(TextColumn("epoch {task.fields[epoch]}"), BarColumn(),
                             MofNCompleteColumn(), TextColumn("{task.fields[stats]}"),
                             TimeRemainingColumn(), console=self.console, transient=True)
        self._bar.start()
        self._task = self._bar.add_task("train", total=total, epoch=epoch, stats="")

    def advance(self, loss, lr, tput) -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=1, stats=(
                f"loss {loss:.3f}  lr {lr:.3g}  {tput.img_per_s:,.0f} img/s  "
                f"data wait {tput.data_wait_share:.0%}"))

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def epoch_line(self, row: dict) -> None:
        if not self.enabled:
            return
        from rich.console import Console

        acc = (f"  top-1 {row['top1']:.2%}  top-5 {row['top5']:.2%}" if "top1" in row else "")
        (self.console or Console()).print(
            f"epoch {row['epoch']}: loss {row['loss']:.4f}{acc}  {row['img_per_s']:,.0f} img/s  "
            f"data wait {row['data_wait']:.0%}  size {row['image_size']}")
