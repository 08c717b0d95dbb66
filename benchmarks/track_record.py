"""Write dlperf/hardware/track_record.json and scale_out_record.json from the saved validation
results (issues #11 and #14).

Reads benchmarks/results/validation-published.json, validation-scaling.json,
validation-memory.json,
tp-kempnerforge-h200.json, tp-{megatron-2020,megatron-2022,narayanan-2021,
megatron-core-2024,llama3-405b,megatron-bridge-fp8,torchtitan-async,megatron-deepspeed,
megatron-moe}.json,
kvstore-fit.json, a lent GPU's
device-*/analyses.json (step 0d's float8 speed-ups) and h200-kernel-classes.json (its
per-kernel times by class) (rerun the others first: validate_published.py,
validate_scaling.py, validate_tp.py, fit_kvstore.py, gpu_kernel_classes.py) and condenses
them per device and class of workload (dlperf/hardware/track_record.py), the record `dlperf
analyze` prints beside every prediction on a preset.

Usage: python benchmarks/track_record.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks/results"
# the lent GPU's run whose float8 speed-ups the record quotes (scripts/device_check.sh, step 0d)
DEVICE_RUN = "device-h200-2026-12-04"
# a lent GPU's per-kernel times by class (benchmarks/gpu_kernel_classes.py)
KERNEL_CLASSES = "h200-kernel-classes.json"


def record_from_results(results: Path = RESULTS) -> dict:
    from dlperf.hardware.track_record import build

    published = json.loads((results / "validation-published.json").read_text())
    scaling = json.loads((results / "validation-scaling.json").read_text())
    return build(published["results"]["rows"], scaling["results"]["rows"])


def scale_out_record_from_results(results: Path = RESULTS) -> dict:
    from dlperf.hardware.specs import get_device
    from dlperf.hardware.track_record import (build_expert_parallel, build_float8,
                                              build_fp8, build_kernels,
                                              build_kvstore, build_memory,
                                              build_memory_pressure,
                                              build_scale_out, build_tensor_parallel)

    scaling = json.loads((results / "validation-scaling.json").read_text())
    record = build_scale_out(scaling["results"]["rows"])
    if scaling["results"].get("float8_pairs"):  # torchao's float8 rows (--fp8 tensorwise)
        device = results / DEVICE_RUN / "analyses.json"  # a lent GPU's step 0d
        record["float8"] = build_float8(
            scaling["results"],
            json.loads(device.read_text())["compile_speedup"] if device.exists() else None)
    tp = results / "tp-kempnerforge-h200.json"  # benchmarks/validate_tp.py
    megatron = [results / f"tp-{name}.json"
                for name in ("megatron-2020", "megatron-2022", "narayanan-2021",
                             "megatron-core-2024", "llama3-405b")]
    async_tp = results / "tp-torchtitan-async.json"  # benchmarks/validate_tp.py
    deepspeed = results / "tp-megatron-deepspeed.json"  # benchmarks/validate_tp.py
    fp8 = results / "tp-megatron-bridge-fp8.json"  # benchmarks/validate_tp.py
    mxfp8 = results / "tp-megatron-bridge-mxfp8.json"  # benchmarks/validate_tp.py
    if fp8.exists():
        record["fp8"] = build_fp8(json.loads(fp8.read_text())["results"], scaling["results"],
                                  json.loads(mxfp8.read_text())["results"]
                                  if mxfp8.exists() else None)
    moe = results / "tp-megatron-moe.json"  # benchmarks/validate_tp.py
    bridge_moe = results / "tp-megatron-bridge-moe.json"  # benchmarks/validate_tp.py
    qwen3 = results / "tp-megatron-bridge-qwen3.json"  # benchmarks/validate_tp.py
    if moe.exists():
        record["expert_parallel"] = build_expert_parallel(
            json.loads(moe.read_text())["results"],
            json.loads(bridge_moe.read_text())["results"] if bridge_moe.exists() else None,
            json.loads(qwen3.read_text())["results"] if qwen3.exists() else None)
    memory = results / "validation-memory.json"  # benchmarks/validate_memory.py
    if memory.exists():
        record["memory"] = build_memory(json.loads(memory.read_text())["results"])
        # the runs that filled their GPUs (dlperf's peaks read through the memory record)
        record["memory_pressure"] = build_memory_pressure(
            scaling["results"]["rows"], record["memory"]["summary"]["median_ratio"],
            lambda device: get_device(device).memory_bytes)
    kernels = results / KERNEL_CLASSES  # benchmarks/gpu_kernel_classes.py
    if kernels.exists():
        record["kernels"] = build_kernels(json.loads(kernels.read_text()),
                                          f"benchmarks/results/{KERNEL_CLASSES}")
    kvstore = results / "kvstore-fit.json"  # benchmarks/fit_kvstore.py
    if kvstore.exists():
        record["kvstore"] = build_kvstore(json.loads(kvstore.read_text())["results"])
    if tp.exists():
        record["tensor_parallel"] = build_tensor_parallel(
            json.loads(tp.read_text())["results"],
            *(json.loads(m.read_text())["results"] if m.exists() else None for m in megatron),
            json.loads(async_tp.read_text())["results"] if async_tp.exists() else None,
            json.loads(deepspeed.read_text())["results"] if deepspeed.exists() else None)
    return record


def main(argv: list[str]) -> int:
    from dlperf.files import write_json_atomic
    from dlperf.hardware.track_record import PATH, SCALE_OUT_PATH

    record = record_from_results()
    write_json_atomic(PATH, record)
    scale_out = scale_out_record_from_results()
    write_json_atomic(SCALE_OUT_PATH, scale_out)
    for key in ("one_node", "across_nodes"):
        if key in scale_out:
            s = scale_out[key]
            print(f"scale-out, {key.replace('_', ' '):12s} {s['rows']:4d} rows  median "
                  f"{s['median']:.2f}x  ({s['low']:.2f}-{s['high']:.2f})")
    for device, entry in record.items():
        s = entry.get("all") or entry["classes"].get("decoder")
        print(f"{device:16s} {s['rows']:4d} rows  median {s['median']:.2f}x  "
              f"({s['low']:.2f}-{s['high']:.2f})")
    print(f"Wrote {PATH.relative_to(ROOT)} and {SCALE_OUT_PATH.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
