"""A/B of dlperf's C extension against a git revision of it: does a change to the native
JPEG core cost the loader speed? (issue #10: the memory-safety rework may not.)

The baseline extension is built from ``git show REV:dlperf/data/_jpegroi.c`` (plus jpegroi.c
where that revision has it) and the current one from the working tree, both with the same gcc
command, into a temporary folder, and loaded side by side. Both
then decode the same training crops of the corpus (1 thread; the crop plans the loader would
draw for epoch 0), as it is and rewritten with restart markers (what `dlperf data prepare`
stores), and rewrite the corpus (`prepare`'s transcode); rounds alternate which goes first,
and the result is the median per-image time of each, their ratio, and the ratio of the
fastest rounds (the least disturbed on a shared machine).

Usage: python benchmarks/bench_native_ab.py [REV] [CORPUS] [OUT.json]
"""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

from dlperf.provenance import save_result
from dlperf.data import decode as D
from dlperf.data.augment import TrainAugment, random_resized_crop, sample_rng
from dlperf.data.corpus import default_corpus
from dlperf.data.sources import open_source

ROOT = Path(__file__).resolve().parents[1]


def build(rev: str | None, folder: Path):
    """The extension as it is at ``rev`` (None: the working tree), built with the same
    command for both sides (the installed one may have other compiler flags) and loaded."""
    sources = []
    folder.mkdir()
    for name in ("_jpegroi.c", "jpegroi.c", "jpegroi.h"):
        if rev is None:
            path = ROOT / "dlperf/data" / name
            text = path.read_bytes() if path.exists() else None
        else:
            done = subprocess.run(["git", "show", f"{rev}:dlperf/data/{name}"], cwd=ROOT,
                                  capture_output=True)
            text = done.stdout if done.returncode == 0 else None
        if text is not None:
            (folder / name).write_bytes(text)
            if name.endswith(".c"):
                sources.append(str(folder / name))
    if not sources:
        raise SystemExit(f"{rev}: no dlperf/data/_jpegroi.c at that revision")
    so = folder / "_jpegroi.abi3.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-DPy_LIMITED_API=0x030B0000",
                    f"-I{sysconfig.get_paths()['include']}", f"-I{folder}", *sources, "-o",
                    str(so), "-ljpeg"], check=True)
    spec = importlib.util.spec_from_file_location("_jpegroi", so)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def crop_args(data: bytes, plan, out: int = 224):
    """decode_region's arguments for one training crop, as decode._decode_roi computes them."""
    n = D.dct_scale_eighths(min(1.0, max(out / plan.height, out / plan.width)))
    x0, y0 = plan.left * n // 8, plan.top * n // 8
    x1 = max(x0 + 1, -(-(plan.left + plan.width) * n // 8))
    y1 = max(y0 + 1, -(-(plan.top + plan.height) * n // 8))
    return n, x0, y0, x1 - x0, y1 - y0


def per_image_us(fn, items) -> float:
    t0 = time.perf_counter()
    for item in items:
        fn(item)
    return (time.perf_counter() - t0) / len(items) * 1e6


def main() -> int:
    rev = sys.argv[1] if len(sys.argv) > 1 else "5e0b583"
    corpus = sys.argv[2] if len(sys.argv) > 2 else str(default_corpus())
    out_path = Path(sys.argv[3] if len(sys.argv) > 3 else
                    ROOT / "benchmarks/results/native-ab.json")
    if not D.ROI_AVAILABLE:
        raise SystemExit("the C extension is not built here: nothing to compare")
    src = open_source(corpus)
    datas = [src.read(i) for i in range(len(src))]
    aug = TrainAugment(224)
    plans = [random_resized_crop(*D.image_header(d)[:2], aug, sample_rng(0, 0, i))
             for i, d in enumerate(datas)]
    marked = [D._jpegroi.transcode(d, 32) or d for d in datas]
    buf = np.empty(4 << 20, np.uint8)
    rounds = 15
    with tempfile.TemporaryDirectory() as tmp:
        old, new = build(rev, Path(tmp) / "base"), build(None, Path(tmp) / "new")
        cases = {
            "crop_raw": (datas, lambda m, d, a: m.decode_region(d, *a, 3, buf)),
            "crop_restart_markers": (marked, lambda m, d, a: m.decode_region(d, *a, 3, buf)),
            "transcode": (datas, lambda m, d, a: m.transcode(d, 32)),
        }
        times = {case: {"base": [], "new": []} for case in cases}
        for case, (files, call) in cases.items():
            items = [(d, crop_args(d, p)) for d, p in zip(files, plans)]
            for module in (old, new):  # warm-up, and the same answers from both
                for d, a in items[:20]:
                    assert call(module, d, a) == call(new, d, a)
            for r in range(rounds):
                order = (("base", old), ("new", new)) if r % 2 == 0 else (("new", new), ("base", old))
                for name, module in order:
                    times[case][name].append(per_image_us(lambda it: call(module, *it), items))
    result = {}
    for case, t in times.items():
        base, cur = statistics.median(t["base"]), statistics.median(t["new"])
        # the fastest round of each is the least disturbed by the shared machine's noise
        best = min(t["new"]) / min(t["base"])
        result[case] = {"base_us": base, "new_us": cur, "new_over_base": cur / base,
                        "best_new_over_best_base": best,
                        "base_runs_us": t["base"], "new_runs_us": t["new"]}
        print(f"{case:22s} base {base:8.1f} us  new {cur:8.1f} us  new/base {cur / base:.3f} "
              f"(fastest rounds: {best:.3f})")
    save_result(out_path, "native-ab", {"baseline_rev": rev, "corpus": corpus,
                                        "images": len(datas), "rounds": rounds,
                                        "crop": 224, "restart_px": 32, "threads": 1}, result)
    print(f"Wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
