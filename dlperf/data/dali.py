"""Optional NVIDIA DALI backend behind the dlperf loader interface (``pip install nvidia-dali-*``).

For GPUs where DALI's mixed (nvJPEG) decoder is the fastest option: the same Batch contract
(uint8 [n, H, W, 3] NHWC + int64 labels), set_epoch, state_dict/load_state_dict and rank
sharding, with DALI's own file reader, ROI-decoding random-resized crop, resize and flip.

Differences from dlperf's own loader, on purpose documented rather than hidden:
* crops and shuffling come from DALI's generators, not from (seed, epoch, sample);
* DALI stops on an undecodable file: run ``dlperf data verify`` (shards) or use the dlperf
  loader's skip policy on data you have not checked;
* resuming mid-epoch replays the epoch's batches up to the saved position (DALI cannot seek).
Only file sources (image folders and CSV lists) are supported.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from dlperf.data.loader import Batch, LoaderConfig
from dlperf.data.sources import FileSource
from dlperf.errors import DlperfError


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
        if not isinstance(source, FileSource):
            raise DlperfError("the DALI backend reads image folders and CSV lists, not shards")
        if device == "cuda" and not torch.cuda.is_available():
            raise DlperfError("DALI backend: no CUDA GPU is visible; use device=cpu")
        self.source, self.cfg, self.device = source, cfg, device
        self.epoch = 0
        self._next_batch = 0
        self._iter = None
        self._pipe = self._build()

    def _build(self):
        from nvidia.dali import fn, pipeline_def, types

        cfg, gpu = self.cfg, self.device == "cuda"
        files = [item.path for item in self.source.items]
        labels = [item.label for item in self.source.items]

        @pipeline_def(batch_size=cfg.batch_size, num_threads=cfg.thread_count(),
                      device_id=torch.cuda.current_device() if gpu else None, seed=cfg.seed + 1,
                      prefetch_queue_depth=cfg.prefetch)
        def pipe():
            jpegs, lab = fn.readers.file(files=files, labels=labels, random_shuffle=cfg.is_shuffled,
                                         shard_id=cfg.rank, num_shards=cfg.world_size,
                                         pad_last_batch=True, stick_to_shard=True,
                                         seed=cfg.seed, name="reader")
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
            labels = out[0]["labels"].reshape(-1).to(torch.int64)
            n = images.shape[0]
            first = k * self.cfg.batch_size
            ids = np.arange(first, first + n)  # positions in this rank's DALI order
            self._next_batch = k + 1
            yield Batch(images, labels, ids, max(0, first + n - max(real, first)))
        self.epoch += 1
        self._next_batch = 0
