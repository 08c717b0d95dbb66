"""The run's state and its checkpoints: what a checkpoint records, how a run is restored from
one, which checkpoint a run resumes from, and the random number generators.

``RunState`` holds every object a checkpoint records (model, optimizer, schedule, loss scaler,
EMA, the loader's position, every process's RNG, the step, the best accuracy, and the loss sum
of the epoch in progress) with an explicit ``save`` and ``restore``, so a resumed run continues
bit-exactly from where the checkpoint was written (tests/test_train_state.py).
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import numpy as np
import torch

from dlperf.errors import DlperfError
from dlperf.files import write_json_atomic
from dlperf.train import checkpoint as ckpt
from dlperf.train import distributed as D
from dlperf.train.console import say
from dlperf.train.graphs import float_learning_rates
from dlperf.train.recipes import RESUME_NOTES, TrainConfig, resume_differences


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


def _gathered_rng(info) -> list:
    """Every rank's RNG state, gathered to every rank (as bytes: gathering tensor objects
    directly fails in some torch versions)."""
    rng = [rng_state()]
    if not info.enabled:
        return rng
    buf = io.BytesIO()
    torch.save(rng[0], buf)
    gathered = [None] * info.world_size
    torch.distributed.all_gather_object(gathered, buf.getvalue())
    return [torch.load(io.BytesIO(b), weights_only=True) for b in gathered]


class RunState:
    """The objects a checkpoint records, and the counters the loop advances."""

    def __init__(self, cfg: TrainConfig, info, ckpt_dir: Path, log, *, model, optimizer,
                 scheduler, scaler, ema, loader, guard):
        self.cfg, self.info, self.ckpt_dir, self.log = cfg, info, ckpt_dir, log
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.scaler, self.ema, self.loader, self.guard = scaler, ema, loader, guard
        self.step, self.best = 0, None
        self.prefetcher = None  # the epoch's DevicePrefetcher: it knows the loader position
        self.epoch_stats: dict | None = None  # loss sum and count of the epoch in progress
        self.resumed_stats: dict | None = None  # the same, as the checkpoint recorded it
        self.resumed_from: str | None = None

    def restore(self, found) -> None:
        """Load a checkpoint (``(state, CheckpointInfo)`` from ``resume_point``) into the run;
        a checkpoint that does not fit the model, optimizer or data is one line."""
        state, where = found
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            self.scaler.load_state_dict(state["scaler"])
            if self.ema is not None and state.get("ema") is not None:
                self.ema.load_state_dict(state["ema"])
            self.loader.load_state_dict(state["loader"])
            rngs = state["rng"]
            set_rng_state(rngs[min(self.info.rank, len(rngs) - 1)])
        except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise DlperfError(f"resume from {where.path}: it does not fit this run's model, "
                              f"optimizer or data ({first}); resume with the settings it was "
                              "trained with, or train into another out_dir") from None
        self.step, self.best = state["step"], state.get("best")
        self.resumed_stats = state.get("epoch_stats")
        self.resumed_from = str(where.path)

    def start_epoch_stats(self) -> None:
        """The epoch's loss sums from zero, or, resumed mid-epoch, from the checkpoint's (so
        the epoch's row averages the steps before the stop too)."""
        self.epoch_stats = {"loss": 0.0, "n": 0}
        if self.resumed_stats and self.loader.state_dict()["next_batch"] > 0:
            self.epoch_stats.update(self.resumed_stats)
        self.resumed_stats = None

    def record_config(self, out: Path) -> None:
        """out_dir/config.json: the settings this folder's weights are trained with from here
        on (rank 0)."""
        if self.info.is_main:
            write_json_atomic(out / "config.json", {"config": self.cfg.to_dict(),
                                                     "world_size": self.info.world_size,
                                                     "device": str(self.info.device)})

    def sync_buffers(self) -> None:
        """Where DDP does not broadcast the buffers (broadcast_buffers=False), average the
        model's and its EMA's over the ranks (every rank calls it: before an evaluation and
        in every checkpoint), so both see and save one set of batch-norm statistics."""
        if not self.cfg.broadcast_buffers:
            D.average_buffers([m for m in (self.model, self.ema) if m is not None], self.info)

    def save(self, metric=None, reason: str = "epoch"):
        """Write a checkpoint (rank 0; every rank takes part in gathering the RNGs); returns
        its CheckpointInfo, or None on other ranks. A full disk is one line, and the
        checkpoints before it stay intact."""
        self.guard.check(self.step)  # never checkpoint a run that has diverged
        self.sync_buffers()
        rng = _gathered_rng(self.info)
        if not self.info.is_main:
            return None
        state = {"model": self.model.state_dict(),
                 "optimizer": float_learning_rates(self.optimizer.state_dict()),
                 "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
                 "ema": self.ema.state_dict() if self.ema is not None else None,
                 "loader": (self.prefetcher.loader_state() if self.prefetcher is not None
                            else self.loader.state_dict()),
                 "rng": rng, "step": self.step, "best": self.best, "config": self.cfg.to_dict()}
        if self.epoch_stats is not None:  # the loss sum so far (one sync, at checkpoints)
            state["epoch_stats"] = {"loss": float(self.epoch_stats["loss"]),
                                    "n": int(self.epoch_stats["n"])}
        try:
            saved = ckpt.save(self.ckpt_dir, state, self.step, self.loader.epoch, metric,
                              self.cfg.keep_last)
        except OSError as exc:  # disk full, quota, a folder gone: stop cleanly, lose nothing
            raise DlperfError(f"{self.ckpt_dir}: could not write the checkpoint of step "
                              f"{self.step} ({exc.strerror or exc}); the checkpoints before it "
                              "are intact: free space and run the same command again to "
                              "resume from the newest") from None
        self.log.event("checkpoint", step=self.step, path=str(saved.path), reason=reason)
        return saved


def resume_point(cfg: TrainConfig, ckpt_dir: Path, resume, info, notes: list, console):
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
            say(console, message)

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


def finished(out: Path, step: int, checkpoint: str, console) -> dict:
    """A rerun of a finished run: nothing to train and nothing rewritten; its summary as it was."""
    summary_path = out / "summary.json"
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, ValueError):
        summary = {"steps": step, "resumed_from": checkpoint}
    summary["already_finished"] = True
    if console is not None:
        say(console, f"{out} already finished at step {step} ({checkpoint}); nothing to "
                     "train (raise epochs= to train on, or choose another out_dir)")
    return summary
