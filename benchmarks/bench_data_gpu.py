"""GPU input path throughput (issue #3 goal: >= 10,000 img/s on an H200): nvJPEG batch decode
+ one batched per-sample crop/resize/flip, uint8 NHWC on the GPU. Run by scripts/device_check.sh.

Usage: python benchmarks/bench_data_gpu.py CORPUS OUT.json [--batch 256] [--epochs 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from dlperf.bench.results import save_result
from dlperf.data.gpu import GpuLoader
from dlperf.data.loader import LoaderConfig
from dlperf.data.sources import open_source


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("out")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    src = open_source(args.corpus)
    ld = GpuLoader(src, LoaderConfig(batch_size=args.batch, threads=args.threads, drop_last=False,
                                     pin_memory=False), device=device)
    rates = []
    for epoch in range(args.epochs + 1):
        t0 = time.perf_counter()
        n = 0
        for b in ld:
            n += len(b)
        if device == "cuda":
            torch.cuda.synchronize()
        if epoch:
            rates.append(n / (time.perf_counter() - t0))
    result = {"img_per_s": statistics.median(rates), "all": rates, "device": device,
              "fallbacks": ld.fallbacks, "bad": ld.report.bad_count,
              "jpeg_decoder": ld.jpeg_decoder}
    save_result(args.out, "data-gpu", {"corpus": args.corpus, "batch": args.batch,
                                       "epochs": args.epochs, "threads": args.threads}, result)
    print(f"GPU path on {device}: {result['img_per_s']:,.0f} img/s (median of {args.epochs} epochs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
