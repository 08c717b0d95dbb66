"""Why the CPU decoder only uses DCT scales 1/8, 1/4, 1/2 and 1 (benchmarks/README.md).

On the input-pipeline corpus, one thread, saved with hardware and versions:
1. whole-image decode time at every scale n/8 through dlperf's ROI decoder;
2. train crops (random-resized crop to 224, two epochs of per-sample crops): ROI decode + resize
   with the former policy (smallest n/8 >= the output) against the power-of-two policy, runs
   interleaved, medians; and each policy's mean absolute difference from torchvision's
   reference (Pillow's antialiased bilinear resize of the crop box, float64);
3. the same files through other decoders (simplejpeg, Pillow) and the crop's resize through
   other resizers (torch uint8 antialiased, Pillow), for context.

Usage: python benchmarks/bench_dct_scale.py [CORPUS] [OUT.json]
"""

from __future__ import annotations

import io
import math
import statistics
import sys
import time
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from dlperf.provenance import save_result
from dlperf.data import decode as D
from dlperf.data.augment import TrainAugment, random_resized_crop, sample_rng
from dlperf.data.corpus import default_corpus
from dlperf.data.sources import open_source

SIZE = 224
REPEATS = 5


def _median_us(fn, n_items: int, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) / n_items * 1e6)
    return statistics.median(times)


def _crop(data, plan, n, buf):
    x0, y0 = plan.left * n // 8, plan.top * n // 8
    x1 = max(x0 + 1, -(-(plan.left + plan.width) * n // 8))
    y1 = max(y0 + 1, -(-(plan.top + plan.height) * n // 8))
    row_w, shift, w, h, _, _ = D._jpegroi.decode_region(data, n, x0, y0, x1 - x0, y1 - y0, 3, buf)
    return buf[:h * row_w * 3].reshape(h, row_w, 3)[:, shift:shift + w]


def main(argv: list[str]) -> int:
    corpus = argv[0] if argv else str(default_corpus())
    out = Path(argv[1]) if len(argv) > 1 else Path("benchmarks/results/dct-scale.json")
    if not D.ROI_AVAILABLE:
        print("the ROI decoder (C extension) is not built here")
        return 1
    D.use_single_threaded_opencv()
    src = open_source(corpus)
    datas = [src.read(i) for i in range(len(src))]
    headers = [D.image_header(d)[:2] for d in datas]
    buf = np.empty(4000 * 4000 * 3, np.uint8)

    # 1. whole images at every scale
    per_scale = {}
    for n in range(1, 9):
        def whole(n=n):
            for d, (h, w) in zip(datas, headers):
                D._jpegroi.decode_region(d, n, 0, 0, -(-w * n // 8), -(-h * n // 8), 3, buf)
        per_scale[f"{n}/8"] = _median_us(whole, len(datas), 3)

    # 2. train crops, both policies
    aug = TrainAugment(SIZE)
    plans = [(i, random_resized_crop(*headers[i], aug, sample_rng(0, e, i)))
             for e in range(2) for i in range(len(datas))]
    out_img = np.empty((SIZE, SIZE, 3), np.uint8)

    def need(plan):
        return max(out_img.shape[0] / plan.height, out_img.shape[1] / plan.width)

    policies = {"smallest n/8 (former)": lambda r: min(8, max(1, math.ceil(8 * min(1.0, r)))),
                "power of two (now)": lambda r: D.dct_scale_eighths(min(1.0, r))}

    def run(policy):
        for i, plan in plans:
            D._resize(_crop(datas[i], plan, policy(need(plan)), buf), out_img)

    times = {name: [] for name in policies}
    for _ in range(REPEATS):  # interleaved, so machine noise hits both alike
        for name, policy in policies.items():
            times[name].append(_median_us(lambda p=policy: run(p), len(plans), 1))
    quality = {}
    for name, policy in policies.items():
        errors = []
        for i, plan in plans[:200]:
            D._resize(_crop(datas[i], plan, policy(need(plan)), buf), out_img)
            box = (plan.left, plan.top, plan.left + plan.width, plan.top + plan.height)
            ref = Image.open(io.BytesIO(datas[i])).convert("RGB").resize((SIZE, SIZE),
                                                                          Image.BILINEAR, box=box)
            errors.append(np.abs(out_img.astype(np.float64) - np.asarray(ref, np.float64)).mean())
        quality[name] = float(np.mean(errors))
    scales_used = {name: sorted({policy(need(p)) for _, p in plans}) for name, policy in
                   policies.items()}

    # 3. context: other decoders on whole images, other resizers on a typical crop
    decoders = {"dlperf ROI decoder, full image": lambda: [
        D._jpegroi.decode_region(d, 8, 0, 0, w, h, 3, buf) for d, (h, w) in zip(datas, headers)],
        "Pillow": lambda: [Image.open(io.BytesIO(d)).load() for d in datas]}
    if D.simplejpeg is not None:
        decoders["simplejpeg (fastdct, fastupsample)"] = lambda: [
            D.simplejpeg.decode_jpeg(d, fastdct=True, fastupsample=True) for d in datas]
    decoder_us = {name: _median_us(fn, len(datas), 3) for name, fn in decoders.items()}
    crop = np.ascontiguousarray(np.random.default_rng(0).integers(0, 255, (330, 360, 3),
                                                                    np.uint8))
    import torch

    torch.set_num_threads(1)
    t = torch.from_numpy(crop).permute(2, 0, 1)[None]
    pil = Image.fromarray(crop)
    resizers = {
        "OpenCV bilinear": lambda: cv2.resize(crop, (SIZE, SIZE), dst=out_img,
                                              interpolation=cv2.INTER_LINEAR),
        "OpenCV area": lambda: cv2.resize(crop, (SIZE, SIZE), dst=out_img,
                                          interpolation=cv2.INTER_AREA),
        "torch uint8 bilinear antialiased": lambda: torch.nn.functional.interpolate(
            t, size=(SIZE, SIZE), mode="bilinear", antialias=True),
        "Pillow bilinear (antialiased)": lambda: pil.resize((SIZE, SIZE), Image.BILINEAR)}
    resize_us = {name: _median_us(lambda f=fn: [f() for _ in range(200)], 200, 3)
                 for name, fn in resizers.items()}

    results = {
        "whole_image_decode_us_by_scale": per_scale,
        "train_crop_decode_resize_us": {k: statistics.median(v) for k, v in times.items()},
        "train_crop_decode_resize_us_runs": times,
        "mean_abs_diff_vs_antialiased_reference": quality, "scales_used": scales_used,
        "decoder_whole_image_us": decoder_us,
        "resize_330x360_to_224_us": resize_us}
    save_result(out, "dct-scale", {"corpus": corpus, "size": SIZE, "repeats": REPEATS,
                                   "crops": len(plans), "threads": 1}, results)
    for key, value in results.items():
        if not key.endswith("_runs"):
            print(key, value)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
