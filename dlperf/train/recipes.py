"""Named recipes: functions returning a frozen TrainConfig (presets are code, and the resolved
config is saved with every run).

``resnet50-90ep`` is the standard ImageNet recipe the record blog trains with: SGD momentum 0.9,
lr 0.1 per 256 images scaled linearly with the batch, 5 warm-up epochs, cosine decay, weight decay
5e-5..1e-4 (here 5e-5 for 90 epochs, with no decay on BN and bias), label smoothing 0.1, the last
BN gamma of each residual block zero-initialised, 224 px. ``resnet50-fast`` is the fast.ai-style
short schedule: progressive resizing 128 -> 224 px, evaluation above the final train size,
one-cycle learning rate, label smoothing, EMA of the weights. ``tiny`` trains a small CNN on a
small dataset in seconds on a CPU (demos and tests).
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import typing
from dataclasses import dataclass
from pathlib import Path

from dlperf.errors import DlperfError, close_matches


# the largest global batch a setting may ask for (beyond it every tensor size overflows long
# before memory runs out)
MAX_BATCH = 1 << 24


@dataclass(frozen=True)
class TrainConfig:
    # what
    model: str = "resnet50"  # torchvision name, "tiny", or path/to/file.py:factory
    num_classes: int = 1000
    data: str = "synthetic"  # "synthetic", an image folder / .csv / shard folder
    val_data: str | None = None
    # schedule
    epochs: int = 90
    steps_per_epoch: int | None = None  # cap (synthetic data; quick runs)
    batch_size: int = 256  # global (all ranks, after accumulation)
    grad_accum: int = 1
    lr_per_256: float = 0.1
    warmup_epochs: float = 5.0
    schedule: str = "cosine"  # cosine | step | onecycle | linear
    optimizer: str = "sgd"  # sgd | lars
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 5e-5
    no_decay_bn_bias: bool = True
    label_smoothing: float = 0.1
    zero_init_residual: bool = True
    ema_decay: float | None = None
    max_grad_norm: float | None = None  # clip the global L2 gradient norm (on the device)
    # images
    image_size: int = 224
    min_image_size: int | None = None  # progressive resizing: from this size up to image_size
    eval_image_size: int | None = None  # default: image_size
    min_crop_area: float = 0.08  # random-resized crops cover this..1 of the image's area
    flip: bool = True  # random horizontal flips (off for data where mirroring changes the class)
    # speed-ups (each can be switched off, so bench can measure them one at a time)
    dtype: str = "bf16"  # bf16 | fp16 (GradScaler) | fp32
    tf32: bool = True
    channels_last: bool = True
    pad_stem_to_4: bool = False
    compile: str | None = None  # None | default | reduce-overhead | max-autotune
    cudnn_benchmark: bool = True
    fused_optimizer: bool = True
    cuda_graphs: bool = False  # the whole step replayed as one CUDA graph (train/graphs.py)
    # data pipeline
    data_backend: str = "cpu"  # cpu (dlperf threads) | gpu (nvJPEG + batched crops) | dali
    threads: int = 0
    prefetch: int = 2
    on_bad_file: str = "skip"  # skip (and report) | raise
    max_bad_fraction: float = 0.01  # more bad files than this share of the data stops the run
    check_checksums: bool = False  # shards: check each sample's CRC-32 as it is read
    # run control
    seed: int = 0
    deterministic: bool = False
    out_dir: str = "runs/train"
    checkpoint_every: int = 0  # steps; 0: at every epoch end only
    keep_last: int = 3
    max_nonfinite_steps: int = 10  # consecutive skipped steps before the run stops
    # step: a host sync per step decides; deferred: decided on the device (fused SGD / LARS
    # skip in place), checked at log steps; auto: deferred on CUDA, step elsewhere
    nonfinite_check: str = "auto"
    target_accuracy: float | None = None  # stop when eval top-1 reaches it
    eval_every: int = 1  # epochs
    log_every: int = 10  # steps
    profile_steps: int = 0  # > 0: that many steps under torch.profiler -> out_dir/profile/
    device: str = "auto"  # auto | cpu | cuda
    sync_bn: bool = False
    # DDP's broadcast_buffers (forward_sync_buffers from torch 2.13): true broadcasts the
    # model's buffers (batch norm's running statistics) from rank 0 before every forward,
    # torch's default, a collective whose latency grows with the GPUs (NCCL's ring: `dlperf
    # analyze --gpus` prices it); false (the record recipe's way: MXNet's kvstore broadcast
    # none) keeps them per rank and averages them over the ranks before every evaluation and
    # checkpoint (distributed.average_buffers)
    broadcast_buffers: bool = False
    collective_timeout_s: int = 600

    def __post_init__(self):
        reals = [f.name for f in dataclasses.fields(self)
                 if isinstance(getattr(self, f.name), float)]
        checks = [
            *((math.isfinite(getattr(self, name)),
               f"{name} must be a finite number, got {getattr(self, name)}") for name in reals),
            (self.epochs > 0, "epochs must be positive"),
            (0 < self.batch_size <= MAX_BATCH, f"batch_size must be in 1..{MAX_BATCH:,}"),
            (self.num_classes >= 2, "num_classes must be at least 2"),
            (bool(self.data.strip()), "data must name a folder, .csv or shard folder, or "
                                      "synthetic (it is empty)"),
            (bool(self.out_dir.strip()), "out_dir must name a folder (it is empty; write "
                                         "out_dir=. for the current one)"),
            (self.steps_per_epoch is None or self.steps_per_epoch > 0,
             "steps_per_epoch must be positive (or unset)"),
            (self.steps_per_epoch is None or self.data == "synthetic",
             "steps_per_epoch applies to data=synthetic only (real data runs whole epochs); "
             "drop it, or lower epochs"),
            (8 <= self.image_size <= 4096, "image_size must be in 8..4096 pixels"),
            (self.eval_image_size is None or 8 <= self.eval_image_size <= 4096,
             "eval_image_size must be in 8..4096 pixels (or unset)"),
            (0 <= self.seed < 2**32, "seed must be in 0..4294967295"),
            (self.warmup_epochs >= 0, "warmup_epochs must be >= 0"),
            (0 <= self.momentum < 1, "momentum must be in [0, 1)"),
            (self.weight_decay >= 0, "weight_decay must be >= 0"),
            (self.log_every >= 1, "log_every must be at least 1 (steps)"),
            (self.eval_every >= 1, "eval_every must be at least 1 (epochs)"),
            (self.checkpoint_every >= 0, "checkpoint_every must be >= 0 (steps; 0: at epoch "
                                         "ends only)"),
            (self.keep_last >= 1, "keep_last must be at least 1 (checkpoints kept)"),
            (self.max_nonfinite_steps >= 1, "max_nonfinite_steps must be at least 1"),
            (self.threads >= 0, "threads must be >= 0 (0: one per core)"),
            (self.prefetch >= 1, "prefetch must be at least 1 (batches)"),
            (self.collective_timeout_s > 0, "collective_timeout_s must be positive"),
            (self.target_accuracy is None or 0 < self.target_accuracy <= 1,
             "target_accuracy must be in (0, 1] (or unset)"),
            (self.grad_accum > 0 and self.batch_size % self.grad_accum == 0,
             f"batch_size ({self.batch_size}) must be a multiple of grad_accum ({self.grad_accum})"),
            (self.schedule in ("cosine", "step", "onecycle", "linear"),
             f"schedule must be cosine, step, onecycle or linear, got {self.schedule!r}"),
            (self.optimizer in ("sgd", "lars"), f"optimizer must be sgd or lars, got {self.optimizer!r}"),
            (self.dtype in ("bf16", "fp16", "fp32"), f"dtype must be bf16, fp16 or fp32, got {self.dtype!r}"),
            (self.compile in (None, "default", "reduce-overhead", "max-autotune"),
             f"compile must be default, reduce-overhead or max-autotune, got {self.compile!r}"),
            (0 <= self.label_smoothing < 1, "label_smoothing must be in [0, 1)"),
            (self.ema_decay is None or 0 < self.ema_decay < 1, "ema_decay must be in (0, 1)"),
            (self.max_grad_norm is None or self.max_grad_norm > 0,
             "max_grad_norm must be positive (or unset)"),
            (self.min_image_size is None or 0 < self.min_image_size <= self.image_size,
             "min_image_size must be in (0, image_size]"),
            (self.device in ("auto", "cpu", "cuda"), f"device must be auto, cpu or cuda, got {self.device!r}"),
            (self.data_backend in ("cpu", "gpu", "dali"),
             f"data_backend must be cpu, gpu or dali, got {self.data_backend!r}"),
            (not (self.data_backend == "dali" and self.min_image_size),
             "progressive resizing (min_image_size) is not supported with data_backend=dali"),
            (self.lr_per_256 > 0, "lr_per_256 must be positive"),
            (0 < self.min_crop_area <= 1, "min_crop_area must be in (0, 1]"),
            (not (self.cuda_graphs and self.compile),
             "cuda_graphs and compile are exclusive (compile=reduce-overhead already replays "
             "CUDA graphs); choose one"),
            (not (self.cuda_graphs and self.dtype == "fp16"),
             "cuda_graphs does not support fp16 loss scaling; use dtype=bf16"),
            (not (self.cuda_graphs and self.grad_accum > 1),
             "cuda_graphs needs grad_accum=1 (one captured step per batch)"),
            (not (self.cuda_graphs and self.nonfinite_check == "step"),
             "cuda_graphs needs nonfinite_check=deferred or auto (a per-step host sync cannot "
             "be captured)"),
            (not (self.cuda_graphs and self.optimizer == "sgd" and not self.fused_optimizer),
             "cuda_graphs needs fused_optimizer=true"),
            (self.profile_steps >= 0, "profile_steps must be >= 0"),
            (self.on_bad_file in ("skip", "raise"),
             f"on_bad_file must be skip or raise, got {self.on_bad_file!r}"),
            (0 <= self.max_bad_fraction <= 1,
             f"max_bad_fraction must be in [0, 1], got {self.max_bad_fraction}"),
            (not (self.check_checksums and self.data_backend == "dali"),
             "check_checksums needs data_backend=cpu or gpu (DALI reads the shards itself); "
             "or run `dlperf data verify` before training"),
            (self.nonfinite_check in ("auto", "step", "deferred"),
             f"nonfinite_check must be auto, step or deferred, got {self.nonfinite_check!r}"),
            (not (self.nonfinite_check == "deferred" and self.optimizer == "sgd"
                  and not self.fused_optimizer),
             "nonfinite_check=deferred needs fused_optimizer=true (the fused SGD kernel skips "
             "the update on the device)"),
        ]
        for ok, message in checks:
            if not ok:
                raise DlperfError(f"invalid train config: {message}")

    def out_of_memory_advice(self, world_size: int, device_type: str) -> str:
        """The one line for a run that ran out of device memory: what to change."""
        return (f"out of memory at {self.batch_size // world_size} images per {device_type} "
                f"(batch_size={self.batch_size}); try batch_size="
                f"{max(1, self.batch_size // 2)} or grad_accum={self.grad_accum * 2}")

    @property
    def lr(self) -> float:
        """Linear scaling rule: lr_per_256 x batch / 256."""
        return self.lr_per_256 * self.batch_size / 256

    def nonfinite_mode(self, device_type: str) -> str:
        """``auto`` resolved: deferred (no per-step sync) where the sync costs, on CUDA."""
        if self.nonfinite_check != "auto":
            return self.nonfinite_check
        if self.cuda_graphs:
            return "deferred"
        fused_capable = self.optimizer == "lars" or self.fused_optimizer
        return "deferred" if device_type == "cuda" and fused_capable else "step"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# What a resume may change: how long the run goes, how it is watched, stored, fed and sped up.
# Everything else (model, classes, data, optimizer, learning rate, schedule, precision, batch,
# augmentation, seed) must equal the checkpoint's: otherwise the resumed run trains weights
# from one recipe under another's settings, and config.json would describe neither.
RESUME_MAY_CHANGE = frozenset({
    "epochs", "target_accuracy", "val_data", "eval_every", "eval_image_size", "log_every",
    "checkpoint_every", "keep_last", "max_nonfinite_steps", "nonfinite_check", "profile_steps",
    "out_dir", "device", "collective_timeout_s", "threads", "prefetch", "on_bad_file",
    "max_bad_fraction", "check_checksums", "cudnn_benchmark", "compile", "cuda_graphs"})
# changes a resume accepts but must point out
RESUME_NOTES = {"epochs": "the learning-rate schedule is stretched to the new length from the "
                          "checkpoint's step on"}


def resume_differences(saved: dict, cfg: TrainConfig) -> tuple[list, list]:
    """(refused, accepted) differences between a checkpoint's settings and ``cfg``, each as
    (setting, checkpoint's value, this run's value). Settings the checkpoint does not record
    (written by an older dlperf) are not compared."""
    now = cfg.to_dict()
    refused, accepted = [], []
    for key in now:
        if key in saved and saved[key] != now[key]:
            (accepted if key in RESUME_MAY_CHANGE else refused).append((key, saved[key], now[key]))
    return refused, accepted


def resnet50_90ep() -> TrainConfig:
    return TrainConfig()


def resnet50_fast() -> TrainConfig:
    return TrainConfig(epochs=18, schedule="onecycle", warmup_epochs=2.0, lr_per_256=0.4,
                       weight_decay=5e-5, min_image_size=128, image_size=192,
                       eval_image_size=256, ema_decay=0.9998, label_smoothing=0.1)


def tiny() -> TrainConfig:
    return TrainConfig(model="tiny", num_classes=4, epochs=4, batch_size=32, lr_per_256=0.8,
                       warmup_epochs=0.5, schedule="onecycle", weight_decay=5e-4,
                       image_size=32, dtype="fp32", channels_last=False, label_smoothing=0.0,
                       zero_init_residual=False, log_every=5, out_dir="runs/tiny")


RECIPES = {"resnet50-90ep": resnet50_90ep, "resnet50-fast": resnet50_fast, "tiny": tiny}


def get_recipe(name: str) -> TrainConfig:
    if name not in RECIPES:
        raise DlperfError(f"unknown recipe {name!r}{close_matches(name, list(RECIPES))}; "
                          f"choose one of {', '.join(RECIPES)}")
    return RECIPES[name]()


def _coerce(name: str, text, kind):
    """A value from the command line or TOML to the field's declared type."""
    origin = typing.get_origin(kind)
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if text in (None, "none", "None", "null"):
            return None
        kind = args[0]
    if not isinstance(text, str):
        if kind is float and isinstance(text, int):
            return float(text)
        if isinstance(text, kind):
            return text
        raise DlperfError(f"{name}: expected {kind.__name__}, got {text!r}")
    try:
        if kind is bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        return kind(text)
    except ValueError:
        raise DlperfError(f"{name}={text!r}: expected {kind.__name__}") from None


def apply_overrides(cfg: TrainConfig, overrides: dict) -> TrainConfig:
    """Replace fields by name (``key=value`` strings or TOML values), with type checks."""
    hints = typing.get_type_hints(TrainConfig)
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    values = {}
    for key, value in overrides.items():
        key = key.replace("-", "_")
        if key not in fields:
            # "lr" is too short for difflib to find lr_per_256: names that extend it count too
            longer = sorted(f for f in fields if f.startswith(key + "_"))
            near = close_matches(key, sorted(fields)) or (
                f" (did you mean: {', '.join(longer)}?)" if longer else "")
            raise DlperfError(f"unknown setting {key!r}{near}; `dlperf train --show-config` "
                              "lists every setting with its value")
        values[key] = _coerce(key, value, hints[key])
    return dataclasses.replace(cfg, **values)


def parse_overrides(items: list[str]) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise DlperfError(f"override {item!r}: write key=value (e.g. epochs=2)")
        key, value = item.split("=", 1)
        out[key.strip()] = value.strip()
    return out


def load_config_file(path: str | Path) -> TrainConfig:
    """A TOML file: optional ``recipe = "name"`` to start from, then any TrainConfig fields."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DlperfError(f"{path}: cannot read config ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise DlperfError(f"{path}: not UTF-8 text; save the config as UTF-8 TOML") from None
    except tomllib.TOMLDecodeError as exc:
        raise DlperfError(f"{path}: invalid TOML ({exc})") from None
    recipe = data.pop("recipe", None)
    if recipe is not None and not isinstance(recipe, str):
        raise DlperfError(f"{path}: recipe = {recipe!r}: give a recipe name in quotes, one of "
                          f"{', '.join(RECIPES)}")
    base = get_recipe(recipe) if recipe is not None else TrainConfig()
    try:
        return apply_overrides(base, data)
    except DlperfError as exc:
        raise DlperfError(f"{path}: {exc}") from None
