"""Which lines of a training run make the host wait for the GPU, and how often.

Runs `dlperf train` on synthetic data with torch.cuda.set_sync_debug_mode("warn"), which warns
at every synchronising CUDA call (.item(), copies from pageable memory, ...), and counts the
warnings by the Python line that caused them. A line counted once per step is a per-step sync
(the CPU stops running ahead of the GPU, so kernel launches are exposed); lines counted once
per logging step, checkpoint or epoch are expected.

Usage: python benchmarks/sync_audit.py OUT.json [--steps 40] [--log-every 20] [key=value ...]
(needs CUDA; on a CPU-only machine it runs the same training and reports that nothing was
audited).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

import torch

from dlperf.provenance import save_result
from dlperf.train.loop import train
from dlperf.train.recipes import apply_overrides, get_recipe


def blame(stack: list, library_line: str, package: Path | None = None) -> str:
    """The innermost frame of ``stack`` (``traceback.extract_stack()``, outermost first) in
    dlperf's own package (``package``: its folder), as "dlperf/…/file.py:line", with
    ``library_line`` (the warning's own line) beside it; ``library_line`` alone when no dlperf
    frame is on the stack."""
    import dlperf

    package = package or Path(dlperf.__file__).resolve().parent
    for frame in reversed(stack):
        path = Path(frame.filename).resolve()
        if path.is_relative_to(package):
            where = f"dlperf/{path.relative_to(package).as_posix()}:{frame.lineno}"
            return where if path.name + f":{frame.lineno}" == library_line else (
                f"{where} (via {library_line})")
    return library_line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--recipe", default="resnet50-90ep")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("overrides", nargs="*", help="TrainConfig key=value")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as tmp:
        overrides = dict(data="synthetic", epochs=1, steps_per_epoch=args.steps,
                         log_every=args.log_every, batch_size=64, out_dir=tmp)
        overrides.update(kv.split("=", 1) for kv in args.overrides)
        cfg = apply_overrides(get_recipe(args.recipe), overrides)
        counts: collections.Counter = collections.Counter()

        def record(message, category, filename, lineno, file=None, line=None):
            # called while the synchronising call's frames are still on the stack
            if "synchroniz" in str(message).lower():
                counts[blame(traceback.extract_stack()[:-1],
                             f"{Path(filename).name}:{lineno}")] += 1

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                summary = train(cfg, resume=None, progress=False, mfu=False)
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
    steps = summary["steps"]
    per_step = {line: n for line, n in counts.items() if n >= steps}
    results = {"audited": cuda, "steps": steps, "syncs_by_line": dict(counts),
               "lines_syncing_every_step": per_step, "total_syncs": sum(counts.values()),
               "img_per_s": summary.get("img_per_s")}
    save_result(args.out, "sync-audit", {**vars(args), "train": cfg.to_dict()}, results)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
