"""The `dlperf` command: one parser, one module per command group (`dlperf/cli/NAME.py`, each
with ``add_parser(sub)`` and ``run(args) -> int``).

User mistakes (DlperfError, bad flags) print one line and exit 2; bugs keep their traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from dlperf.cli import analyze, bench, data, devices, probe, train
from dlperf.cli.common import Parser
from dlperf.errors import DlperfError

EXIT_USAGE = 2
# in the order `dlperf --help` lists them
COMMANDS = {"analyze": analyze, "devices": devices, "data": data, "bench": bench,
            "train": train, "probe": probe}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="dlperf",
        description="Make deep-learning training on NVIDIA Tensor Core GPUs fast, and explain why "
                    "it is slow. Start with `dlperf analyze resnet50 --train`.")
    from dlperf import __version__

    parser.add_argument("--version", action="version", version=f"dlperf {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra:
            # `dlperf train --no-progress epochs=2`: KEY=VALUE after an option is still an
            # override (argparse alone only takes positionals before the first option)
            overrides = [e for e in extra if "=" in e and not e.startswith("-")]
            unknown = [e for e in extra if e not in overrides] if args.command == "train" else extra
            if unknown:  # name only what is wrong, not the overrides around it
                prog = " ".join(["dlperf", *([args.command] if args.command else [])])
                raise DlperfError(f"{prog}: unrecognized arguments: {' '.join(unknown)} "
                                  f"(see {prog} --help)")
            args.overrides = [*args.overrides, *overrides]
        if not args.command:
            parser.print_help()
            return EXIT_USAGE
        return COMMANDS[args.command].run(args)
    except DlperfError as exc:
        print(f"dlperf: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("dlperf: interrupted", file=sys.stderr)
        return 130


def entry() -> int:
    """The `dlperf` program (console script and `python -m dlperf`): ``main``, then the exit. A
    process that torchrun started as one of several ends through ``exit_process``, which skips
    the interpreter's finalization: c10d's threads can abort a finalizing process after its
    work is done (``dlperf.train.distributed.exit_process`` says why)."""
    code = main()
    if os.environ.get("WORLD_SIZE", "1").strip() not in ("", "0", "1"):  # torch's only then
        from dlperf.train.distributed import exit_process

        exit_process(code)
    return code


if __name__ == "__main__":
    sys.exit(entry())
