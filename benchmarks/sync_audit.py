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
import warnings
from pathlib import Path

import torch

from dlperf.provenance import save_result
from dlperf.train.loop import train
from dlperf.train.recipes import apply_overrides, get_recipe


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
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                summary = train(cfg, resume=None, progress=False, mfu=False)
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
        for w in caught:
            if "synchroniz" in str(w.message).lower():
                counts[f"{Path(w.filename).name}:{w.lineno}"] += 1
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
