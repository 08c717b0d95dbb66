"""Optional NVIDIA DALI backend behind the dlperf loader interface (``pip install nvidia-dali-*``).

For GPUs where DALI's mixed (nvJPEG) decoder is the fastest option: the same Batch contract
(uint8 [n, H, W, 3] NHWC + int64 labels), set_epoch, state_dict/load_state_dict and rank
sharding, with DALI's own file reader, ROI-decoding random-resized crop, resize and flip.

Differences from dlperf's own loader, on purpose documented rather than hidden:
* crops and shuffling come from DALI's generators, not from (seed, epoch, sample);
* DALI stops on an undecodable file: run ``dlperf data verify`` (shards) or use the dlperf
  loader's skip policy on data you have not checked;
* resuming mid-epoch replays the epoch's batches up to the saved position (DALI cannot seek).
Sources: image folders and CSV lists (DALI's file reader), and dlperf shards (DALI's webdataset
reader with the ``.idx`` files ``dlperf data prepare`` writes; each label is the text of
``KEY.cls``, padded inside the pipeline and parsed on the host as one vectorised op).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from dlperf.data.loader import Batch, LoaderConfig
from dlperf.data.sources import FileSource, ShardSource
from dlperf.errors import DlperfError


LABEL_BYTES = 12  # room for any int64-sized class count written as text


def parse_text_labels(raw: torch.Tensor) -> torch.Tensor:
    """[n, LABEL_BYTES] uint8 ASCII digits, zero-padded on the right -> int64 [n]."""
    d = raw.to(torch.int64)
    is_digit = (d >= 48) & (d <= 57)
    digit_after_gap = is_digit[:, 1:] & ~is_digit[:, :-1]
    if (not bool((is_digit | (d == 0)).all()) or bool(digit_after_gap.any())
            or not bool(is_digit[:, 0].all())):
        raise DlperfError("a shard label (KEY.cls) is not a decimal number; run dlperf data "
                          "verify on the shards")
    length = is_digit.sum(dim=1, keepdim=True)
    power = (length - 1 - torch.arange(d.shape[1])).clamp(min=0)
    return torch.where(is_digit, (d - 48) * torch.pow(10, power), 0).sum(dim=1)


def dali_available() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


class DaliLoader:
    def __init__(self, source: FileSource, cfg: LoaderConfig = LoaderConfig(), device: str = "cpu"):
        if not dali_available():
            raise DlperfError("the DALI backend needs nvidia-dali (pip install nvidia-dali-cuda120)")
        if not isinstance(source, (FileSource, ShardSource)):
            raise DlperfError("the DALI backend reads image folders, CSV lists and dlperf shards")
        if isinstance(source, ShardSource):
            from dlperf.data.prepare import dali_index_name

            missing = [s for s in source.shards
                       if not (source.root / dali_index_name(s)).exists()]
            if missing:
                raise DlperfError(f"{source.root}: no DALI index for {missing[0]} (shards from an "
                                  "older dlperf); prepare them again")
        if device == "cuda" and not torch.cuda.is_available():
            raise DlperfError("DALI backend: no CUDA GPU is visible; use device=cpu")
        self.source, self.cfg, self.device = source, cfg, device
        self.epoch = 0
        self._next_batch = 0
        self._iter = None
        self._pipe = self._build()

    def _read(self):
        """(encoded images, labels) from DALI's reader for this source."""
        from nvidia.dali import fn

        cfg = self.cfg
        common = dict(random_shuffle=cfg.is_shuffled, shard_id=cfg.rank, num_shards=cfg.world_size,
                      pad_last_batch=True, stick_to_shard=True, seed=cfg.seed, name="reader")
        if isinstance(self.source, FileSource):
            return fn.readers.file(files=[item.path for item in self.source.items],
                                   labels=[item.label for item in self.source.items], **common)
        from dlperf.data.prepare import dali_index_name

        root = self.source.root
        jpegs, cls = fn.readers.webdataset(
            paths=[str(root / s) for s in self.source.shards],
            index_paths=[str(root / dali_index_name(s)) for s in self.source.shards],
            ext=["jpg;png", "cls"], missing_component_behavior="error", **common)
        # ASCII digits of different lengths: zero-padded to a fixed width, parsed on the host
        return jpegs, fn.pad(cls, axes=(0,), shape=(LABEL_BYTES,), fill_value=0)

    def _build(self):
        from nvidia.dali import fn, pipeline_def, types

        cfg, gpu = self.cfg, self.device == "cuda"

        @pipeline_def(batch_size=cfg.batch_size, num_threads=cfg.thread_count(),
                      device_id=torch.cuda.current_device() if gpu else None, seed=cfg.seed + 1,
                      prefetch_queue_depth=cfg.prefetch)
        def pipe():
            jpegs, lab = self._read()
            where = "mixed" if gpu else "cpu"
            if cfg.train:
                images = fn.decoders.image_random_crop(
                    jpegs, device=where, output_type=types.RGB, random_area=list(cfg.scale),
                    random_aspect_ratio=list(cfg.ratio), num_attempts=10)
                images = fn.resize(images, resize_x=cfg.size, resize_y=cfg.size)
                if cfg.flip:
                    images = fn.flip(images, horizontal=fn.random.coin_flip())
            else:
                images = fn.decoders.image(jpegs, device=where, output_type=types.RGB)
                images = fn.resize(images, resize_shorter=int(cfg.size / cfg.crop_fraction))
                images = fn.crop(images, crop=(cfg.size, cfg.size))
            return images, lab

        p = pipe()
        p.build()
        return p

    def __len__(self) -> int:
        per_rank = math.ceil(len(self.source) / self.cfg.world_size)
        b = self.cfg.batch_size
        return per_rank // b if self.cfg.drops_last else math.ceil(per_rank / b)

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self._next_batch = epoch, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "next_batch": self._next_batch, "backend": "dali",
                "batch_size": self.cfg.batch_size, "world_size": self.cfg.world_size}

    def load_state_dict(self, state: dict) -> None:
        if state.get("backend") != "dali" or state.get("batch_size") != self.cfg.batch_size:
            raise DlperfError("loader state is not from a DALI loader with this batch size")
        self.epoch, self._next_batch = int(state["epoch"]), int(state["next_batch"])

    def __iter__(self):
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        if self._iter is None:
            self._iter = DALIGenericIterator(
                [self._pipe], ["images", "labels"], reader_name="reader", auto_reset=True,
                last_batch_policy=LastBatchPolicy.DROP if self.cfg.drops_last
                else LastBatchPolicy.PARTIAL)
        real = len(range(self.cfg.rank, len(self.source), self.cfg.world_size))
        for k, out in enumerate(self._iter):
            if k >= len(self):
                continue  # drain the rest of DALI's epoch
            if k < self._next_batch:
                continue  # resume: replay up to the saved position
            images = out[0]["images"]
            labels = out[0]["labels"]
            labels = (parse_text_labels(labels) if isinstance(self.source, ShardSource)
                      else labels.reshape(-1).to(torch.int64))
            n = images.shape[0]
            first = k * self.cfg.batch_size
            ids = np.arange(first, first + n)  # positions in this rank's DALI order
            self._next_batch = k + 1
            yield Batch(images, labels, ids, max(0, first + n - max(real, first)))
        self.epoch += 1
        self._next_batch = 0
