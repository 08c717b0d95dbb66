"""GPU input path throughput (issue #3 goal: >= 10,000 img/s on an H200): nvJPEG batch decode
+ one batched per-sample crop/resize/flip, uint8 NHWC on the GPU. Run by scripts/device_check.sh.

Usage: python benchmarks/bench_data_gpu.py CORPUS OUT.json [--batch 256] [--epochs 5] [--repeat 10]

Besides the loader's img/s it records where the time goes, so one run on a lent GPU says what to
change next: the share of the loader's wall time spent inside the batched JPEG decode call, and
the raw decoder alone on the whole corpus as one batch (the ceiling the decoder allows). Measured
on the corpus as it is and again rewritten with restart markers (under "restart_markers"), where
the loader hands the decoder only the part of each file under its crop. Each epoch reads the
corpus ``--repeat`` times (a 320-image epoch lasts ~30 ms at the goal rate). The CPU loader
with every core of the machine is measured on both for comparison.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from dlperf.bench.data import epoch_rate, lossless_copy, repeated_list
from dlperf.provenance import save_result
from dlperf.data.decode import ROI_AVAILABLE
from dlperf.data.gpu import GpuLoader
from dlperf.data.loader import Loader, LoaderConfig
from dlperf.data.sources import open_source


def measure(corpus: str, args) -> dict:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    src = open_source(corpus)
    ld = GpuLoader(src, LoaderConfig(batch_size=args.batch, threads=args.threads, drop_last=False,
                                     pin_memory=False), device=device)
    decode_s = [0.0]
    timed_decode = ld._decode_gpu

    def decode_and_time(datas):  # wall time of the batched decode call, as the loader sees it
        t = time.perf_counter()
        out = timed_decode(datas)
        decode_s[0] += time.perf_counter() - t
        return out

    ld._decode_gpu = decode_and_time
    rates, shares = [], []
    for epoch in range(args.epochs + 1):
        decode_s[0] = 0.0
        t0 = time.perf_counter()
        n = 0
        for b in ld:
            n += len(b)
        if device == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        if epoch:
            rates.append(n / wall)
            shares.append(decode_s[0] / wall)
    # the decoder alone: (up to 1,024 of) the corpus JPEGs, whole, in one batched call, best of 3
    datas = [src.read(i) for i in range(min(len(src), 1024))]
    raw = []
    for _ in range(3):
        t0 = time.perf_counter()
        ld._decode_batch([torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas],
                         ld.device)
        if device == "cuda":
            torch.cuda.synchronize()
        raw.append(len(datas) / (time.perf_counter() - t0))
    return {"img_per_s": statistics.median(rates), "all": rates, "device": device,
            "decode_call_share": statistics.median(shares),
            "raw_decoder_img_per_s": max(raw), "fallbacks": ld.fallbacks,
            "bad": ld.report.bad_count, "jpeg_decoder": ld.jpeg_decoder}


def cpu_loader_rate(corpus: str, args, threads: int) -> float:
    """The CPU loader with every core of the machine, for comparison (median img/s)."""
    src = open_source(corpus)
    ld = Loader(src, LoaderConfig(batch_size=args.batch, threads=threads, drop_last=False,
                                  pin_memory=False))
    rates = [epoch_rate(ld, len(src)) for _ in range(args.epochs + 1)][1:]
    ld.close()
    return statistics.median(rates)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("out")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=10, help="epoch = the corpus this many times")
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        raw = str(repeated_list(args.corpus, args.repeat, Path(tmp) / "raw.csv"))
        result = measure(raw, args)
        result["cpu_loader"] = {"threads": cores, "raw": cpu_loader_rate(raw, args, cores)}
        # The same corpus rewritten losslessly with restart markers (what `dlperf data prepare`
        # stores): each file is cut to its crop before the decoder sees it. Both the rewrite
        # and the cut need the C extension (scripts/device_check.sh carries the one built here).
        result["restart_markers"] = None
        if ROI_AVAILABLE:
            rewritten = lossless_copy(args.corpus, Path(tmp) / "restart")
            restart = str(repeated_list(rewritten, args.repeat, Path(tmp) / "restart.csv"))
            result["restart_markers"] = measure(restart, args)
            result["cpu_loader"]["restart_markers"] = cpu_loader_rate(restart, args, cores)
        else:
            print("restart markers not measured: dlperf's C extension is not importable here")
    save_result(args.out, "data-gpu", {"corpus": args.corpus, "batch": args.batch,
                                       "epochs": args.epochs, "threads": args.threads,
                                       "repeat": args.repeat}, result)
    for name, r in (("raw folder", result), ("restart markers", result["restart_markers"])):
        if r is None:
            continue
        print(f"GPU path on {r['device']}, {name}: {r['img_per_s']:,.0f} img/s (median of "
              f"{args.epochs} epochs); {r['decode_call_share']:.0%} of it inside the decode call; "
              f"the decoder alone {r['raw_decoder_img_per_s']:,.0f} img/s ({r['jpeg_decoder']})")
    print(f"CPU loader, {cores} threads: " + ", ".join(
        f"{k} {v:,.0f} img/s" for k, v in result["cpu_loader"].items() if k != "threads"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
