"""What the person at the console sees and does during a run: signals that stop it with a
checkpoint, the progress bar, one-line notes, and the curves picture after each epoch."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from dlperf.train.recipes import TrainConfig


class Signals:
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
            signal.signal(signal.SIGINT, signal.default_int_handler)
            print("dlperf: stopping after this step with a checkpoint; Ctrl-C again to abort",
                  file=sys.stderr)

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def say(console, message: str) -> None:
    """A note for the person at the console (stderr when there is no rich console)."""
    if console is not None:
        console.print(f"dlperf: {message}", highlight=False)
    else:
        print(f"dlperf: {message}", file=sys.stderr)


def draw_curves(out: Path, cfg: TrainConfig, log) -> None:
    """out_dir/curves.png from epochs.csv (the whole history, resumed runs included); a
    plotting problem is a warning, never the end of a run."""
    from dlperf.plots import read_epochs_csv, training_curves

    try:
        training_curves(read_epochs_csv(out / "epochs.csv"), out / "curves.png",
                        title=f"{cfg.model}, batch {cfg.batch_size}, {cfg.dtype}")
    except Exception as exc:  # noqa: BLE001 - a picture must not stop training
        log.event("warning", message=f"curves.png not drawn: {exc}")


class Progress:
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
        from dlperf.term import new_console

        acc = (f"  top-1 {row['top1']:.2%}  top-5 {row['top5']:.2%}" if "top1" in row else "")
        (self.console or new_console()).print(
            f"epoch {row['epoch']}: loss {row['loss']:.4f}{acc}  {row['img_per_s']:,.0f} img/s  "
            f"data wait {row['data_wait']:.0%}  size {row['image_size']}")
