"""Where one image's time goes in dlperf's CPU path (1 thread): read, header, crop draw, ROI
decode, resize, flip, and the whole per-sample call; medians over the corpus x repeats. The ROI
decode is measured on the corpus as it is and rewritten with restart markers (what
`dlperf data prepare` stores), with the cut to the crop's intervals switched off ("no_seek") and on.

Usage: python benchmarks/profile_decode.py [CORPUS] [OUT.json]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import cv2
import numpy as np

from dlperf.provenance import save_result
from dlperf.data import decode as D
from dlperf.data.augment import TrainAugment, random_resized_crop, sample_rng
from dlperf.data.corpus import default_corpus
from dlperf.data.loader import Loader, LoaderConfig
from dlperf.data.sources import open_source


def per_image_us(fn, ids, repeats=5) -> float:
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in ids:
            fn(i)
        runs.append((time.perf_counter() - t0) / len(ids) * 1e6)
    return statistics.median(runs)


def main() -> int:
    corpus = sys.argv[1] if len(sys.argv) > 1 else str(default_corpus())
    out_path = Path(sys.argv[2] if len(sys.argv) > 2 else "benchmarks/results/profile-decode.json")
    src = open_source(corpus)
    loader = Loader(src, LoaderConfig(batch_size=64, threads=1))
    out = np.empty((224, 224, 3), np.uint8)
    ids = list(range(len(src)))
    datas = [src.read(i) for i in ids]
    headers = [D.image_header(d) for d in datas]
    aug = TrainAugment(224)
    plans = [random_resized_crop(h[0], h[1], aug, sample_rng(0, 0, i)) for i, h in enumerate(headers)]
    scratch = D.Scratch()
    for i in ids:  # warm up caches and the allocator
        loader._load_one(i, out, 0)
    result = {
        "whole_sample_us": per_image_us(lambda i: loader._load_one(i, out, 0), ids),
        "read_us": per_image_us(lambda i: src.read_limited(i, 1 << 26), ids),
        "header_us": per_image_us(lambda i: D.image_header(datas[i]), ids),
        "crop_draw_us": per_image_us(lambda i: random_resized_crop(
            headers[i][0], headers[i][1], aug, sample_rng(0, 0, i)), ids),
        "flip_us": per_image_us(lambda i: cv2.flip(out, 1, out), ids),
        "roi_available": D.ROI_AVAILABLE,
    }
    if D.ROI_AVAILABLE:
        regions = {}

        def roi(i):
            h, w = headers[i][:2]
            regions[i] = D._decode_roi(datas[i], plans[i], h, w, 224, 224, D.DecodeLimits(), scratch)

        result["roi_decode_us"] = per_image_us(roi, ids)
        raw = list(datas)
        datas[:] = [D.lossless_restart(d) for d in raw]
        result["restart_markers_bytes_ratio"] = sum(map(len, datas)) / sum(map(len, raw))
        result["roi_decode_restart_markers_us"] = per_image_us(roi, ids)
        region = D._jpegroi.decode_region
        D._jpegroi.decode_region = lambda *a: region(*a[:6], a[6] | 4, a[7])  # bit 2: no cut
        try:
            result["roi_decode_restart_markers_no_seek_us"] = per_image_us(roi, ids)
        finally:
            D._jpegroi.decode_region = region
        datas[:] = raw
        result["resize_us"] = per_image_us(lambda i: D._resize(np.ascontiguousarray(regions[i]), out), ids)
        buf = np.empty(40_000_000, np.uint8)
        result["entropy_only_us"] = per_image_us(lambda i: D._jpegroi.decode_region(
            datas[i], 8, 0, headers[i][0] - 2, headers[i][1], 1, 3 | 4, buf), ids)
        result["full_decode_us"] = per_image_us(lambda i: D._jpegroi.decode_region(
            datas[i], 8, 0, 0, headers[i][1], headers[i][0], 3, buf), ids)
    save_result(out_path, "profile-decode", {"corpus": corpus, "threads": 1, "size": 224}, result)
    for k, v in result.items():
        print(f"{k:20s} {v:8.1f}" if isinstance(v, float) else f"{k:20s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
