"""Real-data sanity for `dlperf train` (issue #4): ResNet-18 on handwritten digits.

The bar (measured earlier on this kind of machine): a plain PyTorch ResNet-18 (bf16 autocast, channels_last, one-cycle LR, label
smoothing 0.1) reaches ~98% validation accuracy on a small real 10-class dataset of 64x64 JPEGs
(1,437 training images) in 5 epochs, ~40 s on a 2-core machine; a good recipe should do at
least as well. The data: scikit-learn's copy of the UCI handwritten digits (1,797 8x8 scans, no
download), split 80/20 per class with a fixed seed, upscaled to 64x64 and written as JPEG
folders, so the whole dlperf path runs: JPEG decode, random-resized crops, the training loop,
evaluation. Needs scikit-learn (`make bench-digits` installs it).

Three seeds (training order, crops, initialisation; the split stays fixed); the goal applies to
the median. Crops keep at least 60% of the image: with 35% the same 5 epochs gave 96.9%, with
torchvision's 8% 95.3% (seed 0; digits are small and centred, small crops cut them apart).

Usage: python benchmarks/bench_digits.py [OUT.json] [key=value ...]   (TrainConfig overrides)
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from dlperf.provenance import save_result
from dlperf.train.loop import train
from dlperf.train.recipes import TrainConfig, apply_overrides, parse_overrides

GOAL_TOP1 = 0.98  # the plain-PyTorch bar above
SEEDS = (0, 1, 2)


def write_digits(root: Path, seed: int = 0, size: int = 64) -> tuple[Path, Path, int, int]:
    """train/ and val/ JPEG folders of the digits, 80/20 per class."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(seed)
    counts = [0, 0]
    for label in range(10):
        idx = rng.permutation(np.flatnonzero(digits.target == label))
        cut = int(round(0.8 * len(idx)))
        for part, chosen in (("train", idx[:cut]), ("val", idx[cut:])):
            folder = root / part / f"digit{label}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in chosen:
                gray = np.clip(digits.images[i] * 16, 0, 255).astype(np.uint8)  # 0..16 levels
                img = Image.fromarray(gray).resize((size, size), Image.BICUBIC).convert("RGB")
                img.save(folder / f"{i:04d}.jpg", quality=95)
            counts[part == "val"] += len(chosen)
    return root / "train", root / "val", counts[0], counts[1]


def config(train_dir: Path, val_dir: Path, out_dir: Path) -> TrainConfig:
    # ResNet-18, the recipe's speed-ups (bf16, channels_last), one-cycle, label smoothing 0.1;
    # digits are small, centred and upright: milder crops, no flips (a mirrored 2 is not a 2)
    return TrainConfig(model="resnet18", num_classes=10, data=str(train_dir), val_data=str(val_dir),
                       epochs=5, batch_size=64, lr_per_256=0.8, warmup_epochs=1.0,
                       schedule="onecycle", weight_decay=5e-4, label_smoothing=0.1,
                       image_size=64, min_crop_area=0.6, flip=False, dtype="bf16",
                       channels_last=True, threads=2, log_every=10, out_dir=str(out_dir))


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv and "=" not in argv[0] else Path(
        "benchmarks/results/digits-resnet18.json")
    overrides = parse_overrides([a for a in argv if "=" in a])
    runs = []
    with tempfile.TemporaryDirectory(prefix="dlperf-digits-") as tmp:
        train_dir, val_dir, n_train, n_val = write_digits(Path(tmp) / "data")
        for seed in SEEDS:
            cfg = apply_overrides(config(train_dir, val_dir, Path(tmp) / f"run{seed}"),
                                  {"seed": str(seed), **overrides})
            t0 = time.perf_counter()
            summary = train(cfg, resume=None, progress=True, mfu=True)
            runs.append({"seed": cfg.seed, "top1": summary["eval"]["top1"],
                         "top5": summary["eval"]["top5"], "wall_s": time.perf_counter() - t0,
                         "img_per_s": summary["img_per_s"], "mfu": summary.get("mfu"),
                         "summary": summary})
    top1 = statistics.median(r["top1"] for r in runs)
    results = {"top1_median": top1, "top1_by_seed": [r["top1"] for r in runs],
               "goal_top1": GOAL_TOP1, "met": top1 >= GOAL_TOP1, "train_images": n_train,
               "val_images": n_val, "runs": runs}
    config_dict = {**cfg.to_dict(), "seeds": list(SEEDS)}
    config_dict.pop("seed")
    save_result(out, "digits-resnet18", config_dict, results)
    print(f"ResNet-18 on digits ({n_train} train / {n_val} val JPEGs, {cfg.epochs} epochs, seeds "
          f"{list(SEEDS)}): top-1 " + ", ".join(f"{r['top1']:.2%}" for r in runs) +
          f"; median {top1:.2%} (goal {GOAL_TOP1:.0%}), {statistics.median(r['wall_s'] for r in runs):.0f} s "
          f"per run; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
