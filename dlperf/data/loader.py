"""Threaded batch assembly into preallocated uint8 NHWC buffers, with prefetch, sharding,
resume and a bad-file policy.

Contract (issue #3): batches of uint8 images [n, H, W, C] (NHWC) and int64 labels [n];
normalisation, dtype and channels_last happen on the device (dlperf.data.device).

* Decoding runs in a thread pool: the decoders release the GIL, so threads scale across cores
  without worker processes, pickling or shared-memory copies.
* Buffers: ``prefetch + 1`` batch slots are allocated once (pinned when CUDA is present) and
  reused; memory stays flat across epochs. A yielded batch's tensors are views into a slot and
  stay valid until the next batch is requested: copy them (or move them to the GPU) first.
* Streaming: near the end of an epoch the first batches of the next one (epoch + 1, from batch
  0) are already decoding, as DALI does; a different set_epoch/load_state_dict discards them.
* Order: a permutation from (seed, epoch); crops from (seed, epoch, sample), so results do not
  depend on the thread count. ``state_dict()`` after a batch resumes at the next batch exactly,
  without decoding the batches before it.
* Sharding: the epoch order is padded by wrapping to a multiple of ``world_size`` (as
  torch.utils.data.DistributedSampler does) and rank r takes every world_size-th sample, so every
  rank has the same number of batches and DDP never waits on a rank that ran out. Padded
  (repeated) samples sit at the end of a rank's last batch; ``Batch.num_padded`` counts them.
* Bad files are skipped (never replaced by another sample: the batch is one shorter) and
  reported with path and reason, or raised with ``on_bad_file="raise"``; more than
  ``max_bad_fraction`` of the dataset bad aborts the run with the first reasons.

One module of ~460 lines: the threaded loader and the synthetic one share the batch, sharding,
resume-state and bad-file contract the trainer relies on, and are tested against it together.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from dlperf.data.augment import (EvalAugment, TrainAugment, center_crop_plan,
                                 random_resized_crop, sample_rng)
from dlperf.data.decode import (BadImage, DecodeLimits, Scratch, decode_into,
                                use_single_threaded_opencv)
from dlperf.data.sources import Source
from dlperf.errors import DlperfError

STATE_VERSION = 1


class DataError(DlperfError):
    """The data cannot be loaded as asked (bad file with on_bad_file=raise, too many bad)."""


@dataclass(frozen=True)
class LoaderConfig:
    batch_size: int = 256
    train: bool = True
    size: int = 224
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = True
    crop_fraction: float = 0.875
    threads: int = 0  # 0: every CPU this process may run on
    prefetch: int = 2  # batches decoded ahead of the consumer
    seed: int = 0
    shuffle: bool | None = None  # default: train
    drop_last: bool | None = None  # default: train
    rank: int = 0
    world_size: int = 1
    on_bad_file: str = "skip"  # skip | raise
    max_bad_fraction: float = 0.01
    channels: int = 3  # 4: a zero 4th channel, so the stem conv's C is Tensor Core aligned
    pin_memory: bool | None = None  # default: when CUDA is available
    limits: DecodeLimits = DecodeLimits()

    def __post_init__(self):
        checks = [
            (self.batch_size > 0, f"batch_size must be positive, got {self.batch_size}"),
            (self.prefetch >= 1, f"prefetch must be at least 1, got {self.prefetch}"),
            (self.threads >= 0, f"threads must be >= 0, got {self.threads}"),
            (self.world_size >= 1 and 0 <= self.rank < self.world_size,
             f"rank {self.rank} is not in [0, world_size={self.world_size})"),
            (self.on_bad_file in ("skip", "raise"),
             f"on_bad_file must be skip or raise, got {self.on_bad_file!r}"),
            (0 <= self.max_bad_fraction <= 1,
             f"max_bad_fraction must be in [0, 1], got {self.max_bad_fraction}"),
            (self.channels in (3, 4), f"channels must be 3 or 4, got {self.channels}"),
        ]
        for ok, message in checks:
            if not ok:
                raise DlperfError(message)

    @classmethod
    def from_env(cls, **kwargs) -> "LoaderConfig":
        """rank/world_size from torchrun's RANK and WORLD_SIZE (single process without them)."""
        try:
            rank = int(os.environ.get("RANK", "0"))
            world = int(os.environ.get("WORLD_SIZE", "1"))
        except ValueError:
            raise DlperfError("RANK and WORLD_SIZE must be integers (as torchrun sets them)") from None
        return cls(rank=rank, world_size=world, **kwargs)

    @property
    def is_shuffled(self) -> bool:
        return self.train if self.shuffle is None else self.shuffle

    @property
    def drops_last(self) -> bool:
        return self.train if self.drop_last is None else self.drop_last

    def thread_count(self) -> int:
        """``threads``, or this process's share of the CPUs: under torchrun the node's
        LOCAL_WORLD_SIZE processes split them, so 8 ranks do not each start a thread per core."""
        if self.threads:
            return self.threads
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cpus = os.cpu_count() or 1
        try:
            local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        except ValueError:
            local = 1
        return max(1, cpus // local)


@dataclass
class Batch:
    images: torch.Tensor  # uint8 [n, H, W, C]
    labels: torch.Tensor  # int64 [n]
    indices: np.ndarray  # sample positions in the source
    num_padded: int = 0  # trailing repeated samples (sharding padding), at most the last batch
    slot: object = field(default=None, repr=False)  # the loader buffer the tensors view

    def __len__(self) -> int:
        return self.labels.shape[0]

    def release(self) -> None:
        """Call after the batch has been copied off (e.g. ``.to('cuda', non_blocking=True)``):
        on CUDA an event is recorded on the current stream, and the loader waits for it before
        decoding into this buffer again, so an asynchronous copy from pinned memory is never
        overwritten mid-flight. A no-op without CUDA (copies there are synchronous)."""
        if self.slot is not None and torch.cuda.is_available() and self.images.is_pinned():
            event = torch.cuda.Event()
            event.record()
            self.slot.event = event


@dataclass
class EpochReport:
    epoch: int
    samples: int = 0
    bad_count: int = 0
    bad: list = field(default_factory=list)  # (name, reason), first MAX_REPORTED only

    MAX_REPORTED = 100

    def add_bad(self, name: str, reason: str) -> None:
        self.bad_count += 1
        if len(self.bad) < self.MAX_REPORTED:
            self.bad.append((name, reason))

    def summary(self) -> str:
        if not self.bad_count:
            return f"epoch {self.epoch}: {self.samples:,} samples, no bad files"
        shown = "; ".join(f"{n}: {r}" for n, r in self.bad[:5])
        more = f" (+{self.bad_count - 5} more)" if self.bad_count > 5 else ""
        return (f"epoch {self.epoch}: {self.samples:,} samples, {self.bad_count} bad files "
                f"skipped: {shown}{more}")


class _Slot:
    def __init__(self, cfg: LoaderConfig, pin: bool):
        shape = (cfg.batch_size, cfg.size, cfg.size, cfg.channels)
        self.images = torch.zeros(shape, dtype=torch.uint8, pin_memory=pin)
        self.labels = torch.zeros(cfg.batch_size, dtype=torch.int64, pin_memory=pin)
        self.np_images = self.images.numpy()
        self.np_labels = self.labels.numpy()
        self.event = None  # CUDA event after which the consumer's copy of this slot is done


class Loader:
    """Iterate to get one epoch of Batches; see the module docstring for the contract."""

    def __init__(self, source: Source, cfg: LoaderConfig = LoaderConfig()):
        if len(source) == 0:
            raise DlperfError("the dataset is empty")
        self.source = source
        self.cfg = cfg
        self.epoch = 0
        self._next_batch = 0
        self._pool: ThreadPoolExecutor | None = None
        self._slots: list[_Slot] | None = None
        self._scratch = threading.local()
        self.aug = (TrainAugment(cfg.size, cfg.scale, cfg.ratio, cfg.flip) if cfg.train
                    else EvalAugment(cfg.size, cfg.crop_fraction))
        self.report = EpochReport(0)
        self.reports: list[str] = []  # one summary line per finished epoch
        self._pending: deque | None = None  # next epoch's first batches, already submitted
        self._submitted = 0
        self._orders: dict[int, np.ndarray] = {}

    # ------------------------------------------------------------------ order and sharding
    def _per_rank(self) -> int:
        return math.ceil(len(self.source) / self.cfg.world_size)

    def __len__(self) -> int:
        per_rank, b = self._per_rank(), self.cfg.batch_size
        return per_rank // b if self.cfg.drops_last else math.ceil(per_rank / b)

    def rank_order(self, epoch: int) -> np.ndarray:
        """This rank's sample positions for ``epoch`` (padded by wrapping, see module doc)."""
        n, world = len(self.source), self.cfg.world_size
        if self.cfg.is_shuffled:
            order = np.random.Generator(np.random.Philox(
                np.random.SeedSequence([self.cfg.seed, epoch, 0x5EED]))).permutation(n)
        else:
            order = np.arange(n)
        total = self._per_rank() * world
        if total > n:
            order = np.concatenate([order, np.resize(order, total - n)])
        return order[self.cfg.rank::world]

    def _real_count(self) -> int:
        """Samples of this rank that are not padding."""
        n, world = len(self.source), self.cfg.world_size
        return len(range(self.cfg.rank, n, world))

    # ------------------------------------------------------------------ resume
    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._next_batch = 0

    def state_dict(self) -> dict:
        return {"version": STATE_VERSION, "epoch": self.epoch, "next_batch": self._next_batch,
                "seed": self.cfg.seed, "num_samples": len(self.source),
                "batch_size": self.cfg.batch_size, "world_size": self.cfg.world_size,
                "rank": self.cfg.rank}

    def load_state_dict(self, state: dict) -> None:
        expect = {"seed": self.cfg.seed, "num_samples": len(self.source),
                  "batch_size": self.cfg.batch_size, "world_size": self.cfg.world_size}
        for key, value in expect.items():
            if state.get(key) != value:
                raise DlperfError(f"loader state does not match this loader: {key} was "
                                  f"{state.get(key)!r}, now {value!r}; resume with the same "
                                  "data, seed, batch size and world size")
        self.epoch = int(state["epoch"])
        self._next_batch = int(state["next_batch"])

    # ------------------------------------------------------------------ decoding
    def _plan_for(self, index: int, epoch: int):
        if self.cfg.train:
            rng = sample_rng(self.cfg.seed, epoch, int(index))
            return lambda h, w: random_resized_crop(h, w, self.aug, rng)
        return lambda h, w: center_crop_plan(h, w, self.aug)

    def _load_one(self, index: int, out: np.ndarray, epoch: int) -> str | None:
        """Decode sample ``index`` into ``out``; the reason it is bad, or None."""
        src, limits = self.source, self.cfg.limits
        try:
            data = src.read_limited(index, limits.max_bytes)  # BadImage if over the limit
            target = out
            if self.cfg.channels == 4:  # decode into RGB scratch, then the first 3 channels
                target = getattr(self._scratch, "rgb", None)
                if target is None:
                    target = self._scratch.rgb = np.empty(out.shape[:2] + (3,), np.uint8)
            scratch = getattr(self._scratch, "roi", None)
            if scratch is None:
                scratch = self._scratch.roi = Scratch()
            decode_into(data, self._plan_for(index, epoch), target, limits, scratch)
            if target is not out:
                out[..., :3] = target
        except BadImage as exc:
            return str(exc)
        except OSError as exc:
            return f"unreadable ({exc.strerror or exc})"
        return None

    def _load_chunk(self, slot: _Slot, rows: range, ids: np.ndarray, epoch: int) -> list:
        bad = []
        for row in rows:
            index = int(ids[row])
            reason = self._load_one(index, slot.np_images[row], epoch)
            if reason is None:
                slot.np_labels[row] = self.source.label(index)
            else:
                bad.append((row, index, reason))
        return bad

    # ------------------------------------------------------------------ iteration
    def _ensure_workers(self) -> None:
        if self._pool is None:
            use_single_threaded_opencv()
            self._pool = ThreadPoolExecutor(self.cfg.thread_count(), thread_name_prefix="dlperf-data")
        if self._slots is None:
            pin = self.cfg.pin_memory
            if pin is None:
                pin = torch.cuda.is_available()
            self._slots = [_Slot(self.cfg, pin) for _ in range(self.cfg.prefetch + 1)]

    def _next_position(self, epoch: int, k: int) -> tuple[int, int]:
        return (epoch, k + 1) if k + 1 < len(self) else (epoch + 1, 0)

    def _order(self, epoch: int) -> np.ndarray:
        cached = self._orders.get(epoch)
        if cached is None:
            if len(self._orders) > 2:
                self._orders.clear()
            cached = self._orders[epoch] = self.rank_order(epoch)
        return cached

    def _submit(self, inflight: deque, epoch: int, k: int) -> None:
        cfg = self.cfg
        ids = self._order(epoch)[k * cfg.batch_size:(k + 1) * cfg.batch_size]
        # Slots are used round-robin in submission order: the batch held by the consumer and
        # the ones in flight are consecutive submissions, so they never share a slot.
        slot = self._slots[self._submitted % len(self._slots)]
        self._submitted += 1
        if slot.event is not None:  # the consumer's async copy out of this slot must be done
            slot.event.synchronize()
            slot.event = None
        # Small tasks (a few images) keep both cores busy to the end of every batch.
        step = max(2, math.ceil(len(ids) / (8 * cfg.thread_count())))
        futures = [self._pool.submit(self._load_chunk, slot, range(lo, min(lo + step, len(ids))),
                                     ids, epoch) for lo in range(0, len(ids), step)]
        inflight.append((epoch, k, slot, ids, futures))

    @staticmethod
    def _drain(inflight: deque) -> None:
        """Cancel what has not started and wait for the rest: no thread may still write into a
        slot that is handed out again."""
        for *_, futures in inflight:
            for f in futures:
                f.cancel()
        for *_, futures in inflight:
            for f in futures:
                if not f.cancelled():
                    f.exception()
        inflight.clear()

    def __iter__(self):
        self._ensure_workers()
        cfg = self.cfg
        epoch, start = self.epoch, self._next_batch
        n_batches = len(self)
        if start == 0:
            self.report = EpochReport(epoch)
        real = self._real_count()
        # The previous epoch may have started decoding this one's first batches already.
        inflight: deque = self._pending or deque()
        self._pending = None
        if inflight and inflight[0][:2] != (epoch, start):  # set_epoch/resume elsewhere
            self._drain(inflight)
        finished = False
        try:
            last = inflight[-1][:2] if inflight else None
            for k in range(start, n_batches):
                while len(inflight) < cfg.prefetch + 1:  # this batch + `prefetch` ahead
                    last = (epoch, start) if last is None else self._next_position(*last)
                    self._submit(inflight, *last)
                _, _, slot, ids, futures = inflight.popleft()
                bad = [b for f in futures for b in f.result()]
                batch = self._finish(slot, ids, bad, k, real)
                self._next_batch = k + 1
                yield batch
            finished = True
        finally:
            if finished:  # keep the next epoch's head start (streaming across epochs, as DALI)
                self._pending = inflight
            else:
                self._drain(inflight)
        self.reports.append(self.report.summary())
        self.epoch += 1
        self._next_batch = 0

    def _finish(self, slot: _Slot, ids: np.ndarray, bad: list, k: int, real: int) -> Batch:
        n = len(ids)
        first = k * self.cfg.batch_size
        num_padded = max(0, first + n - max(real, first))
        self.report.samples += n - num_padded
        if bad:
            for _, index, reason in sorted(bad):
                self._note_bad(self.source.name(index), reason)
            keep = sorted(set(range(n)) - {row for row, _, _ in bad})
            for dst, src in enumerate(keep):  # compact: bad rows leave, nothing is substituted
                if dst != src:
                    slot.np_images[dst] = slot.np_images[src]
                    slot.np_labels[dst] = slot.np_labels[src]
            ids = ids[keep]
            num_padded = sum(1 for row in keep if first + row >= real)
            n = len(keep)
        return Batch(slot.images[:n], slot.labels[:n], ids, num_padded, slot)

    def with_size(self, size: int) -> "Loader":
        """A new loader like this one at another crop size (progressive resizing)."""
        return type(self)(self.source, dataclasses.replace(self.cfg, size=size))

    def _note_bad(self, name: str, reason: str) -> None:
        """The bad-file policy: raise, or report and skip, aborting past max_bad_fraction."""
        if self.cfg.on_bad_file == "raise":
            raise DataError(f"{name}: {reason} (use on_bad_file=skip to skip bad files)")
        self.report.add_bad(name, reason)
        if self.report.bad_count > self.cfg.max_bad_fraction * len(self.source):
            shown = "; ".join(f"{nm}: {r}" for nm, r in self.report.bad[:3])
            raise DataError(
                f"{self.report.bad_count} bad files in epoch {self.report.epoch} exceed "
                f"max_bad_fraction={self.cfg.max_bad_fraction} of {len(self.source):,} "
                f"samples; check the dataset (first: {shown})")

    def close(self) -> None:
        if self._pending:
            self._drain(self._pending)
            self._pending = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class SyntheticLoader:
    """Random uint8 batches in the final layout, for benchmarks that exclude the pipeline."""

    def __init__(self, batch_size: int, size: int = 224, num_classes: int = 1000,
                 batches: int = 100, channels: int = 3, seed: int = 0, pin_memory: bool = False):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (batch_size, size, size, channels), generator=g,
                                    dtype=torch.uint8)
        self.labels = torch.randint(0, num_classes, (batch_size,), generator=g)
        if pin_memory:
            self.images, self.labels = self.images.pin_memory(), self.labels.pin_memory()
        self.batches = batches
        self.epoch = 0
        self._next_batch = 0

    def __len__(self) -> int:
        return self.batches

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self._next_batch = epoch, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "next_batch": self._next_batch}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self._next_batch = int(state["epoch"]), int(state["next_batch"])

    def __iter__(self):
        ids = np.arange(len(self.labels))
        for k in range(self._next_batch, self.batches):
            self._next_batch = k + 1
            yield Batch(self.images, self.labels, ids)
        self.epoch += 1
        self._next_batch = 0
