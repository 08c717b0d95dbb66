"""What every command shares: the one-line-error parser, argument types, the console, and
the conventions for output files (`--json PATH`, `--out`, results in benchmarks/results/)."""

from __future__ import annotations

import argparse
import math

from dlperf.errors import DlperfError
from dlperf.term import new_console, styled  # noqa: F401  (the commands' console)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # bad input gets one clear line, not a usage dump
        raise DlperfError(f"{self.prog}: {message} (see {self.prog} --help)")


def int_at_least(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
    return value


def positive_int(text: str) -> int:
    return int_at_least(text, 1, "a positive integer")


def batch_size_arg(text: str) -> int:
    value = int_at_least(text, 1, "a positive integer")
    if value > 1 << 24:  # tensor sizes overflow long before; no GPU holds such a batch
        raise argparse.ArgumentTypeError(f"expected at most {1 << 24:,}, got {value:,}")
    return value


def positive_float(text: str) -> float:
    """A finite number above 0 (a rate, a core count): float() alone lets nan, inf and
    negatives through, and each of them turns a prediction into nonsense without an error."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def nonnegative_int(text: str) -> int:
    return int_at_least(text, 0, "an integer >= 0")


def write_result(path: str | None, result: dict, console) -> None:
    """The `--json PATH` convention: every command that has a result writes it there."""
    if path is None:
        return
    from dlperf.files import write_json_atomic

    write_json_atomic(path, result)
    console.print(f"Wrote {path}")


def output_file(path: str | None, flag: str) -> None:
    """Refuse an output path that cannot be written, before minutes of work are spent."""
    if path is None:
        return
    if path == "-":  # only `dlperf devices --json -` prints JSON alone; elsewhere a file named "-"
        raise DlperfError(f"{flag} -: this command prints its report on the terminal, so its "
                          f"output goes to a file; give a file name (e.g. {flag} result.json)")
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        raise DlperfError(f"{flag} {path}: is a folder; give a file name")
    if not p.parent.exists():
        raise DlperfError(f"{flag} {path}: folder {p.parent} does not exist")


def probe_device(spec) -> str:
    """The torch device a probe's spec was measured on."""
    return "cpu" if spec.name == "cpu" else "cuda"


def warn_native(console) -> None:
    from dlperf.data.native import warning

    line = warning()
    if line:
        console.print(styled("[yellow]warning:[/] {}", line))


def default_corpus():
    """dlperf's own benchmark corpus, made (once) with a status line."""
    from dlperf.data.corpus import default_corpus

    with new_console().status("making dlperf's benchmark corpus (once per machine)..."):
        return default_corpus()


def result_path(out: str | None, name: str):
    """--out, checked before minutes of benchmarking; by default the checkout's
    benchmarks/results/NAME when run from one, else NAME in the current folder."""
    from pathlib import Path

    if out is None:
        results = Path("benchmarks") / "results"
        return results / name if results.is_dir() else Path(name)
    path = Path(out)
    if not path.parent.exists():
        raise DlperfError(f"{path}: folder {path.parent} does not exist")
    return path
