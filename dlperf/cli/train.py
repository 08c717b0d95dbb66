"""`dlperf train`: train a classifier with the record ResNet-50 recipe (one process, or many
under torchrun)."""

from __future__ import annotations

import os
import sys

from dlperf.cli.common import new_console, output_file, write_result
from dlperf.errors import DlperfError


def add_parser(sub) -> None:
    """`dlperf train`."""
    t = sub.add_parser("train", help="train a classifier with the record ResNet-50 recipe",
                       description="Train with mixed precision, NHWC, the dlperf input pipeline "
                                   "and data parallelism (torchrun --nproc_per_node N -m dlperf "
                                   "train ...). Start from a recipe or a TOML file and override "
                                   "any setting as key=value. Checkpoints are atomic; the same "
                                   "command resumes from the newest one. Exit codes: 0 done, "
                                   "2 bad input, 3 too many non-finite steps, 75 stopped by "
                                   "SIGTERM/SIGUSR1 after checkpointing.")
    t.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="settings to change, e.g. epochs=2 data=path/to/folder batch_size=64")
    src = t.add_mutually_exclusive_group()
    src.add_argument("--recipe", default="resnet50-90ep",
                     help="resnet50-90ep, resnet50-fast or tiny [resnet50-90ep]")
    src.add_argument("--config", help="TOML file (optional recipe = \"name\" plus settings)")
    t.add_argument("--resume", default="auto",
                   help="auto (newest complete checkpoint in out_dir), never, or a .pt path [auto]")
    t.add_argument("--show-config", action="store_true", help="print the resolved config and exit")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--json", metavar="PATH", default=None,
                   help="also write the run's summary to this JSON file (it is always in "
                        "out_dir/summary.json)")
    t.add_argument("--no-mfu", action="store_true",
                   help="skip the model FLOP utilisation figure (on a CPU its ceiling comes from "
                        "a probe of this machine, ~10 s once, then cached)")


def run(args) -> int:
    import json

    from dlperf.train.recipes import apply_overrides, get_recipe, load_config_file, parse_overrides

    cfg = load_config_file(args.config) if args.config else get_recipe(args.recipe)
    cfg = apply_overrides(cfg, parse_overrides(args.overrides))
    if args.show_config:
        print(json.dumps(cfg.to_dict(), indent=1))
        return 0
    output_file(args.json, "--json")
    if cfg.data != "synthetic":
        from pathlib import Path

        if not Path(cfg.data).exists():
            raise DlperfError(f"data={cfg.data}: not found (an image folder, .csv or shard "
                              "folder, or data=synthetic)")
    from dlperf.train.loop import EXIT_NONFINITE, EXIT_PREEMPTED, NonFinite, Preempted, train

    console = new_console()
    resume = None if args.resume == "never" else args.resume
    try:
        summary = train(cfg, resume=resume, progress=not args.no_progress, console=console,
                        mfu=not args.no_mfu)
    except Preempted as exc:
        print(f"dlperf: {exc}", file=sys.stderr)
        return EXIT_PREEMPTED
    except NonFinite as exc:
        print(f"dlperf: error: {exc}", file=sys.stderr)
        return EXIT_NONFINITE
    if os.environ.get("RANK", "0") != "0":
        return 0  # under torchrun, rank 0 reports
    write_result(args.json, summary, console)
    if summary.get("already_finished"):
        return 0  # said so already
    parts = [f"{summary['img_per_s']:,.1f} img/s ({summary['compute_img_per_s']:,.1f} compute-only)",
             f"data wait {summary['data_wait_share']:.0%}"]
    if summary.get("mfu") is not None:
        parts.append(f"MFU {summary['mfu']:.0%} of {summary['peak_source']}")
    elif summary.get("mfu_note"):
        parts.append(summary["mfu_note"])
    if summary.get("comm_steps_measured"):
        parts.append(f"exposed all-reduce {summary['comm_exposed_ms_median']:.1f} ms per step "
                     f"(median of {summary['comm_steps_measured']} logged steps; "
                     "`dlperf analyze --gpus N` predicts it)")
        if summary.get("step_cv_measured") is not None:
            parts.append(f"of which {summary['comm_wait_ms_median']:.1f} ms waiting for the "
                         f"slowest rank; the ranks' steps spread "
                         f"{summary['step_cv_measured']:.1%} (`--step-cv` for `dlperf analyze`)")
    if summary["eval"]:
        parts.append(f"top-1 {summary['eval']['top1']:.2%}, top-5 {summary['eval']['top5']:.2%}")
    if summary["skipped_steps"]:
        parts.append(f"{summary['skipped_steps']} non-finite steps skipped")
    if summary["time_to_target_s"] is not None:
        parts.append(f"target reached in {summary['time_to_target_s']:.1f} s")
    console.print(f"Done: {summary['steps']} steps; " + "; ".join(parts) +
                  f". Logs and checkpoints in {cfg.out_dir}")
    for line in summary.get("advice", []):
        console.print(f"  next: {line}", highlight=False)
    return 0
