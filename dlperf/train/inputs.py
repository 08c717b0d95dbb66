"""The run's inputs: the training and validation loaders (synthetic, CPU, DALI or GPU decode;
micro-batches of the global batch), and the image size of each epoch (progressive resizing)."""

from __future__ import annotations

from dlperf.errors import DlperfError
from dlperf.train import distributed as D
from dlperf.train.recipes import TrainConfig


def open_checked(path: str, check_checksums: bool, setting: str):
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
    source = open_checked(cfg.data, cfg.check_checksums, "data")
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
        val = make(open_checked(cfg.val_data, cfg.check_checksums, "val_data"), LoaderConfig(
            batch_size=per_rank, train=False, size=cfg.eval_image_size or image_size,
            drop_last=False, **common))
    return train, val


def source_kind(loader) -> str:
    """'shards' (written by `dlperf data prepare`), 'files' (a folder or list) or 'synthetic'."""
    from dlperf.data.sources import ShardSource

    source = getattr(loader, "source", None)
    if source is None:
        return "synthetic"
    return "shards" if isinstance(source, ShardSource) else "files"


def image_size_at(cfg: TrainConfig, epoch: int) -> int:
    """Progressive resizing: min_image_size -> image_size linearly over the first 3/4 of the run
    (multiples of 32), then image_size (fast.ai's low-to-high schedule)."""
    if not cfg.min_image_size or cfg.min_image_size == cfg.image_size:
        return cfg.image_size
    ramp = max(1, int(cfg.epochs * 0.75))
    size = cfg.min_image_size + (cfg.image_size - cfg.min_image_size) * min(1.0, epoch / ramp)
    return min(cfg.image_size, int(round(size / 32) * 32) or 32)


def loader_for_epoch(loader, cfg: TrainConfig, epoch: int, size: int):
    """(the loader for ``epoch``, its image size): resized when progressive resizing moves the
    size (real data only), and reshuffled for the epoch unless it resumes mid-epoch."""
    new_size = image_size_at(cfg, epoch)
    if new_size != size and cfg.data != "synthetic":
        loader, size = resized(loader, new_size), new_size
    if loader.state_dict()["next_batch"] == 0:
        loader.set_epoch(epoch)
    return loader, size


def resized(loader, size: int):
    """The same loader at a new crop size (progressive resizing), keeping its position."""
    state = loader.state_dict()
    loader.close()
    new = loader.with_size(size)
    new.load_state_dict(state)
    return new
