"""The training run, put together from the modules named for each job (docs/design.md):
set-up, then per optimizer step the batch, ``step.train_step`` (what a CUDA graph captures and
`dlperf bench train` times) and the bookkeeping, per epoch evaluation and a checkpoint.

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

import time
from pathlib import Path

import torch

from dlperf.errors import DlperfError
from dlperf.models.registry import build_classifier
from dlperf.train import distributed as D
from dlperf.train import speedups
from dlperf.train.commtime import CommTimer
from dlperf.train.console import Progress, Signals, draw_curves
from dlperf.train.evaluate import evaluate
from dlperf.train.graphs import graphed_step_for
from dlperf.train.guard import NonFinite
from dlperf.train.inputs import build_loaders, image_size_at, loader_for_epoch, source_kind
from dlperf.train.metrics import (InputStall, RunLog, Throughput, add_step_loss,
                                  finish_summary)
from dlperf.train.optim import build_optimizer, build_scheduler, host_lr, step_schedule
from dlperf.train.profiling import profiler_for
from dlperf.train.recipes import TrainConfig
from dlperf.train.runlock import RunLock
from dlperf.train.state import RunState, finished, resume_point, seed_everything
from dlperf.train.step import build_parts, train_step

__all__ = ["EXIT_NONFINITE", "EXIT_PREEMPTED", "NonFinite", "Preempted", "train"]
EXIT_PREEMPTED = 75
EXIT_NONFINITE = 3


class Preempted(DlperfError):
    """Stopped by a signal after saving a checkpoint."""


def train(cfg: TrainConfig, resume: str | None = "auto", progress: bool = True,
          stop_at_step: int | None = None, mfu: bool = True, console=None) -> dict:
    """Run ``cfg``. ``resume``: "auto" (newest complete checkpoint in out_dir, if any), None
    (start fresh; refuses a folder that already has checkpoints), or a checkpoint path.
    ``stop_at_step``: behave as if preempted after that global step (tests, time limits)."""
    info = D.setup(cfg.device, cfg.collective_timeout_s)
    out = Path(cfg.out_dir)
    try:
        # The folder is this run's before anything is read or written, and the resume is
        # checked before anything changes on disk (config.json, logs, checkpoints).
        with RunLock(out, enabled=info.is_main):
            notes: list[str] = []
            found = resume_point(cfg, out / "checkpoints", resume, info, notes, console)
            log = RunLog(out if info.is_main else None)
            try:
                for note in notes:
                    log.event("warning", message=note)
                trainer = Trainer(cfg, info, out, log, console, progress, stop_at_step)
                summary = trainer.run(found, mfu)
                # every rank finished before any tears its process group down: a gloo peer
                # that closes while another still works can abort that one at exit
                D.barrier(info)
                return summary
            finally:
                log.close()
    except torch.OutOfMemoryError:
        raise DlperfError(cfg.out_of_memory_advice(info.world_size, info.device.type)) from None
    finally:
        D.teardown(info)


class Trainer:
    """One run's objects and counters; ``run`` trains it to the end (or to a stop)."""

    def __init__(self, cfg: TrainConfig, info, out: Path, log, console, progress: bool,
                 stop_at_step: int | None):
        self.cfg, self.info, self.out, self.log, self.console = cfg, info, out, log, console
        self.stop_at_step = stop_at_step
        seed_everything(cfg.seed)
        if cfg.dtype == "bf16" and info.device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise DlperfError("this GPU has no bf16; use dtype=fp16")
        self.image_size = image_size_at(cfg, 0)
        loader, self.val_loader = build_loaders(cfg, info, self.image_size)
        self.t0 = time.perf_counter()  # compile time: from here to the end of the first step
        model, ddp_model, run_model = speedups.prepare_model(
            build_classifier(cfg.model, cfg.num_classes), cfg, info)
        optimizer = build_optimizer(model, cfg, info.device)
        self.steps_per_epoch = len(loader) // cfg.grad_accum  # optimizer steps
        if self.steps_per_epoch == 0:
            raise DlperfError(f"{cfg.data}: fewer samples than one batch of {cfg.batch_size}")
        parts = self.parts = build_parts(
            cfg, model, run_model, optimizer, info.device, log,
            ddp=ddp_model if info.enabled else None,
            agree=(lambda flag: D.any_rank_on_device(flag, info)) if info.enabled else None)
        self.graphed = graphed_step_for(parts, cfg, info.enabled)
        # DDP's exposed all-reduce per step, measured (what `analyze --gpus` predicts)
        self.comm = CommTimer(info.device).attach(ddp_model) if info.enabled else None
        self.state = RunState(cfg, info, out / "checkpoints", log, model=model,
                              optimizer=optimizer, scheduler=build_scheduler(
                                  optimizer, cfg, self.steps_per_epoch),
                              scaler=parts.scaler, ema=parts.ema, loader=loader,
                              guard=parts.guard)
        self.tput = Throughput()
        self.stall = InputStall(self.info.device)
        self.bar = Progress(progress and info.is_main, console)
        self.profiler = profiler_for(cfg, out, info, log)
        self.compile_s, self.time_to_target = 0.0, None
        self.last_eval: dict = {}

    def run(self, found, mfu: bool) -> dict:
        cfg, state = self.cfg, self.state
        start_epoch = 0
        if found:
            state.restore(found)
            start_epoch = state.loader.epoch
            if state.step >= self.steps_per_epoch * cfg.epochs and start_epoch >= cfg.epochs:
                return finished(self.out, state.step, state.resumed_from,
                                self.console if self.info.is_main else None)
            self.log.event("resume", step=state.step, epoch=start_epoch,
                           checkpoint=state.resumed_from)
        state.record_config(self.out)
        self.run_start = time.perf_counter()
        try:
            with Signals() as signals:
                for epoch in range(start_epoch, cfg.epochs):
                    self._epoch(epoch, signals)
                    if self._end_epoch(epoch):
                        break
        finally:
            self.bar.stop()
            if self.profiler is not None:
                self.profiler.stop()  # a run shorter than the profiling window
        return self._summary(mfu)

    def _start_epoch(self, epoch: int):
        """The epoch's loader (resized, reshuffled), loss sums and prefetcher."""
        from dlperf.data.device import DevicePrefetcher

        cfg, state = self.cfg, self.state
        state.loader, self.image_size = loader_for_epoch(state.loader, cfg, epoch,
                                                         self.image_size)
        state.start_epoch_stats()
        self.bar.start(epoch, self.steps_per_epoch)
        # Batches on the device one step ahead (a side CUDA stream copies batch k+1 while k
        # trains); it also keeps the loader position a checkpoint must record.
        state.prefetcher = DevicePrefetcher(state.loader, self.info.device, cfg.channels_last)
        return state.prefetcher

    def _epoch(self, epoch: int, signals) -> None:
        it = self._start_epoch(epoch)
        wait, last_loss = it.last_wait, float("nan")  # the epoch's first fetch
        self.tput.start_epoch()
        self.stall.reset()
        while True:
            batches = []
            for _ in range(self.cfg.grad_accum):
                got = next(it, None)
                if got is None:
                    self.tput.add_wait(self.stall.take(0.0, drain=True))
                    return
                wait += it.last_wait
                batches.append(got)
            self.stall.step_start()
            loss_sum, grad_norm, applied, images = self._step(batches)
            self.stall.step_end()
            self.tput.lap(images * self.info.world_size, self.stall.take(wait))
            wait = 0.0
            last_loss = self._account(epoch, loss_sum, grad_norm, applied, last_loss)
            self._maybe_stop(signals)

    def _step(self, batches: list):
        """The optimizer step (eager or one graph replay), then the scaler and schedule."""
        state = self.state
        if self.graphed is not None:  # forward .. optimizer, one graph replay
            x, y, images = batches[0]
            loss_sum, grad_norm, applied = self.graphed(x, y)
        else:
            loss_sum, grad_norm, applied = train_step(
                self.parts, [(x, y) for x, y, _ in batches], state.step)
            images = sum(n for _, _, n in batches)
            if state.step == 0 and self.cfg.compile:
                self.compile_s = time.perf_counter() - self.t0
        state.scaler.update()
        step_schedule(state.scheduler)  # a skipped step advances it too
        if self.graphed is not None:
            self.graphed.after_scheduler_step()
        state.step += 1
        if self.profiler is not None:
            self.profiler.step()
        return loss_sum, grad_norm, applied, images

    def _account(self, epoch: int, loss_sum, grad_norm, applied, last_loss: float) -> float:
        """The epoch's loss sums, the log line, the bar and interval checkpoints."""
        state, cfg = self.state, self.cfg
        add_step_loss(state.epoch_stats, loss_sum, applied)
        lr_now = host_lr(state.scheduler)
        if state.step % cfg.log_every == 0:
            state.guard.check(state.step)  # deferred mode: counters read where we sync anyway
            last_loss = float(loss_sum)
            comm = (self.comm.take() if self.comm is not None else None) or {}
            if comm:  # every rank logs the same steps, so every rank gathers here
                exposed = D.all_gather_floats([comm["comm_exposed_ms"]], self.info)
                comm = self.comm.across_ranks(comm, [e[0] for e in exposed])
            self.log.event("step", step=state.step, epoch=epoch, loss=last_loss, lr=lr_now,
                           grad_norm=float(grad_norm), img_per_s=self.tput.img_per_s,
                           data_wait=self.tput.data_wait_share, skipped=state.guard.skipped,
                           **comm)
        elif self.comm is not None:
            self.comm.discard()
        self.bar.advance(last_loss, lr_now, self.tput)
        if cfg.checkpoint_every and state.step % cfg.checkpoint_every == 0:
            state.save(reason="interval")
        return last_loss

    def _maybe_stop(self, signals) -> None:
        """Checkpoint and raise Preempted on a signal (any rank's) or at ``stop_at_step``."""
        step, info = self.state.step, self.info
        at_stop_step = self.stop_at_step is not None and step >= self.stop_at_step
        caught = not at_stop_step and D.stop_agreed(signals.caught is not None, step,
                                                    self.cfg.log_every, info)
        if at_stop_step or caught:
            saved = self.state.save(reason="preempted")
            D.barrier(info)
            raise Preempted(f"stopped at step {step} (signal {signals.caught or '-'}); "
                            f"checkpoint {saved.path if saved else 'on rank 0'}; "
                            "run the same command again to resume")

    def _end_epoch(self, epoch: int) -> bool:
        """Evaluate, log, draw and checkpoint; True when the target accuracy is reached."""
        state, cfg = self.state, self.cfg
        self.bar.stop()
        state.guard.check(state.step)
        stats = state.epoch_stats
        row = {"epoch": epoch, "step": state.step,
               "loss": float(stats["loss"]) / max(1, int(stats["n"])),
               "lr": host_lr(state.scheduler), "img_per_s": self.tput.img_per_s,
               "data_wait": self.tput.data_wait_share, "image_size": self.image_size,
               "skipped_steps": state.guard.skipped}
        if self.val_loader is not None and (epoch + 1) % cfg.eval_every == 0:
            state.sync_buffers()  # (one set of batch-norm statistics to evaluate)
            self.last_eval = evaluate(state.ema.module if state.ema is not None else state.model,
                                      self.val_loader, self.info, self.parts.dtype,
                                      cfg.channels_last)
            row.update(top1=self.last_eval["top1"], top5=self.last_eval["top5"])
            state.best = max(state.best or 0.0, self.last_eval["top1"])
        if getattr(state.loader, "reports", None):
            self.log.event("data", epoch=epoch, report=state.loader.reports[-1])
        self.log.event("epoch", **row)
        self.log.epoch_row(row)
        if self.info.is_main:
            draw_curves(self.out, cfg, self.log)
        self.bar.epoch_line(row)
        state.save(metric=self.last_eval.get("top1"))
        if (cfg.target_accuracy is not None and self.last_eval
                and self.last_eval["top1"] >= cfg.target_accuracy):
            self.time_to_target = time.perf_counter() - self.run_start
            return True
        return False

    def _comm_summary(self) -> dict:
        """The measured communication's medians and, from the ranks' spread over the mean
        compute step (its wall time less the data wait and the exposed all-reduce), the
        step spread that `dlperf analyze --gpus N --step-cv` takes."""
        out = self.comm.summary() if self.comm is not None else {}
        tput = self.tput
        if "rank_spread_ms_median" in out and tput.laps:
            compute_ms = (1e3 * (tput.wall - tput.data_wait) / tput.laps
                          - out["comm_exposed_ms_median"])
            out["step_cv_measured"] = (out["rank_spread_ms_median"] / compute_ms
                                       if compute_ms > 0 else None)
        return out

    def _summary(self, mfu: bool) -> dict:
        cfg, state, tput = self.cfg, self.state, self.tput
        summary = {"steps": state.step, "epochs": cfg.epochs, **tput.summary(),
                   "skipped_steps": state.guard.skipped, "compile_s": self.compile_s,
                   "nonfinite_check": state.guard.mode,
                   "cuda_graphs": self.graphed.captures if self.graphed is not None else None,
                   "resumed_from": state.resumed_from, "data_source": source_kind(state.loader),
                   "eval": self.last_eval, "best_top1": state.best,
                   "time_to_target_s": self.time_to_target,
                   **self._comm_summary(),
                   "wall_s": time.perf_counter() - self.run_start}
        return finish_summary(summary, cfg, self.info, self.image_size, self.out, self.log, mfu)
