"""Measured training throughput from MLPerf Training result logs (issue #14's MLPerf rows).

MLPerf publishes time-to-train, not images/s; but NVIDIA's MXNet ResNet-50 logs carry the
measured throughput of every epoch (MLLOG ``tracked_stats``: {"throughput": images/s, all
GPUs}). This script reads those logs from a checkout of mlcommons/training_results_vX.Y,
takes each run's steady rate (the median over its epochs after the first two, which include
DALI's cache warm-up and the first evaluation) and the median over the system's runs, and
saves them with the files they came from.

MLPerf v0.5's logs (2018: NVIDIA's MXNet 18.11 on DGX-1 and DGX-2, the record blog's era) log no
rate; each epoch's start is a timestamped ``train_epoch`` line, so an epoch's rate is the
training set (``preproc_num_train_examples``) over the time to the next epoch's start, for the
epochs with no evaluation in between (``parse_log_v05``).

The rows of benchmarks/validation/published_scaling.csv whose source is ``mlperf-training-v3.1``
(or ``-v2.0``, ``-v0.5``) come from this file (per GPU = the median / GPUs); their batch per
GPU, nodes and network from the configs named in SYSTEMS.

Usage: python benchmarks/mlperf_throughput.py GIT_DIR [REPOSITORY] [OUT.json]
(GIT_DIR: a clone of REPOSITORY, mlcommons/training_results_v3.1 (the default), _v2.0 or
_v0.5, bare or not: the logs are read with ``git show``, so no work tree is needed). Writes
benchmarks/results/mlperf-throughput.json (v3.1) or mlperf-throughput-v2.0.json (-v0.5.json).
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks/results/mlperf-throughput.json"
RUNS = 5  # MLPerf's ResNet-50 submissions hold result_0..4
STEADY_FROM = 2  # epochs 1-2: DALI cache fill and the first evaluation's neighbourhood

# repository -> system directory -> (GPUs, config the run used: BATCHSIZE per GPU, DGXNNODES)
SYSTEMS = {
    "mlcommons/training_results_v3.1": {
        "eos_ngc23.09_mxnet": (8, "config_DGXH100.sh"),
        "eos_n8_ngc23.09_mxnet": (64, "config_DGXH100_multi_8x8x50.sh"),
        "coreweave_hgxh100_n448_ngc23.04_mxnet": (3584, "config_DGXH100_multi_448x8x16.sh"),
    },
    "mlcommons/training_results_v2.0": {
        "dgxa100_ngc22.04_mxnet": (8, "config_DGXA100.sh"),
        "dgxa100_n8_ngc22.04_mxnet": (64, "config_DGXA100_multi_8x8x51.sh"),
        "dgxa100_n128_ngc22.04_mxnet": (1024, "config_DGXA100_multi_128x8x35.sh"),
        # not dgxa100_n527 (4,216 GPUs): its config captures the whole run as CUDA graphs
        # (E2E_CUDA_GRAPHS=1), so the host logs an epoch's end before the GPUs reach it: in
        # NVIDIA/results/dgxa100_n527_ngc22.04_mxnet/resnet/result_0.txt an epoch lasts 27-38
        # ms between epoch_start and epoch_stop, and imgs_sec reads 3 to 56 million, not a rate
    },
    "mlcommons/training_results_v0.5": {
        "dgx1_ngc18.11_mxnet": (8, "config_DGX1.sh"),
        "dgx1_multi_ngc18.11_mxnet": (640, "config_DGX1_multi.sh"),
        "dgx2_ngc18.11_mxnet": (16, "config_DGX2.sh"),
        # the DGX-2H's 450 W V100s (higher clocks) have no preset: read for comparison only,
        # not rows of the published table
        "dgx2h_ngc18.11_mxnet": (16, "config_DGX2.sh"),
        "dgx2h_multi_ngc18.11_mxnet": (512, "config_DGX2_multi.sh"),
    },
}
# where a repository keeps NVIDIA's result logs and configs
LAYOUT = {
    "mlcommons/training_results_v0.5": (
        "v0.5.0/nvidia/submission/results/{system}/resnet/result_{i}.txt",
        "v0.5.0/nvidia/submission/code/image_classification/mxnet/{config}"),
}
DEFAULT_LAYOUT = ("NVIDIA/results/{system}/resnet/result_{i}.txt",
                  "NVIDIA/benchmarks/resnet/implementations/mxnet/{config}")
# v3.1's logs name the epoch's rate "throughput", v2.0's "imgs_sec"
_THROUGHPUT = re.compile(
    r'"key": "tracked_stats", "value": \{"(?:throughput|imgs_sec)": ([0-9.eE+]+)\}')
_BATCH = re.compile(r'"key": "global_batch_size", "value": (\d+)')


def parse_log(text: str) -> dict:
    """The epochs' throughputs (images/s, all GPUs) and the global batch of one result log."""
    batch = _BATCH.search(text)
    return {"throughput": [float(x) for x in _THROUGHPUT.findall(text)],
            "global_batch": int(batch.group(1)) if batch else None}


# v0.5: ":::MLPv0.5.0 resnet <unix seconds> (<file:line>) <key>[: <value>]"
_V05 = re.compile(r"^:::MLPv0\.5\.0 \S+ ([0-9.]+) \([^)]*\) (\w+)(?:: (.*))?$")


def parse_log_v05(text: str, gpus: int) -> dict:
    """A v0.5 log's epoch rates (images/s, all GPUs; epochs followed by an evaluation left out,
    since their span holds it) and its global batch (``input_batch_size`` is per GPU)."""
    events = [(float(m.group(1)), m.group(2), m.group(3)) for m in map(_V05.match,
                                                                       text.splitlines()) if m]
    values = {key: value for _, key, value in events if value is not None}
    if "preproc_num_train_examples" not in values or "input_batch_size" not in values:
        raise ValueError("no preproc_num_train_examples or input_batch_size: not a v0.5 "
                         "ResNet-50 log")
    images = int(values["preproc_num_train_examples"])
    marks = [(t, key) for t, key, _ in events if key in ("train_epoch", "eval_start", "run_stop")]
    rates = [images / (b - a) for (a, ka), (b, kb) in zip(marks, marks[1:])
             if ka == kb == "train_epoch" and b > a]
    return {"throughput": rates, "global_batch": int(values["input_batch_size"]) * gpus}


def steady_rate(throughput: list[float]) -> float:
    """The median epoch rate after the first ``STEADY_FROM`` epochs."""
    if len(throughput) <= STEADY_FROM:
        raise ValueError(f"{len(throughput)} epochs logged: too few for a steady rate")
    return statistics.median(throughput[STEADY_FROM:])


def step_ms(rates: list[float], global_batch: int) -> dict:
    """Epochs' mean step times in ms from their rates (an epoch of E images at R images/s
    runs E / global batch steps in E / R seconds: global batch / R a step, whatever the
    epoch's length): the fastest, the 10th percentile, the median and the slowest. Their
    spread is how much the slowest rank's wait varies from epoch to epoch."""
    steps = sorted(1e3 * global_batch / r for r in rates)
    return {"min": steps[0], "p10": steps[len(steps) // 10],
            "median": statistics.median(steps), "max": steps[-1]}


def _show(git_dir: Path, path: str) -> str | None:
    out = subprocess.run(["git", "--git-dir", str(git_dir), "show", f"HEAD:{path}"],
                         capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


def collect(git_dir: Path, repository: str) -> dict:
    commit = subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", "HEAD"],
                            capture_output=True, text=True, check=True).stdout.strip()
    systems = {}
    results, configs = LAYOUT.get(repository, DEFAULT_LAYOUT)
    for system, (gpus, config) in SYSTEMS[repository].items():
        runs = []
        for i in range(RUNS):
            path = results.format(system=system, i=i)
            text = _show(git_dir, path)
            if text is None:
                continue
            log = parse_log_v05(text, gpus) if repository.endswith("v0.5") else parse_log(text)
            runs.append({"file": path, "global_batch": log["global_batch"],
                         "epochs": len(log["throughput"]),
                         "steady_img_s": steady_rate(log["throughput"]),
                         "throughput": log["throughput"]})
        rate = statistics.median(r["steady_img_s"] for r in runs)
        # every steady epoch of every run, pooled
        pooled = [x for r in runs for x in r["throughput"][STEADY_FROM:]]
        systems[system] = {"gpus": gpus, "config": configs.format(config=config),
                           "global_batch": runs[0]["global_batch"],
                           "batch_per_gpu": runs[0]["global_batch"] // gpus,
                           "img_s": rate, "img_s_per_gpu": rate / gpus,
                           "step_ms": step_ms(pooled, runs[0]["global_batch"]),
                           "runs": [{k: v for k, v in r.items() if k != "throughput"}
                                    for r in runs]}
    return {"repository": repository, "commit": commit, "systems": systems}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-3])
        return 2
    from dlperf.provenance import save_result

    repository = argv[1] if len(argv) > 1 else "mlcommons/training_results_v3.1"
    if repository not in SYSTEMS:
        print(f"{repository}: not one of {', '.join(SYSTEMS)}", file=sys.stderr)
        return 2
    out = (Path(argv[2]) if len(argv) > 2 else DEFAULT_OUT if repository.endswith("v3.1")
           else DEFAULT_OUT.with_name(f"mlperf-throughput-{repository.rsplit('_', 1)[1]}.json"))
    data = collect(Path(argv[0]), repository)
    for system, s in data["systems"].items():
        print(f"{system:42s} {s['gpus']:5d} GPUs  batch {s['batch_per_gpu']:4d}/GPU  "
              f"{s['img_s']:12,.0f} img/s  {s['img_s_per_gpu']:7,.0f} per GPU  "
              f"({len(s['runs'])} runs)")
    save_result(out, "mlperf-throughput", {"steady_from_epoch": STEADY_FROM + 1,
                                           "systems": SYSTEMS[repository]}, data)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
