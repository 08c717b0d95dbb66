"""Per-sample augmentation parameters, from a random stream seeded by (seed, epoch, index).

The same sample gets the same crop whatever the thread count, worker count or resume point,
because nothing depends on the order samples are processed in (issue #3).

Train: RandomResizedCrop with torchvision's algorithm (scale 0.08-1 of the area, aspect ratio
log-uniform in 3/4-4/3, 10 attempts, then a centre crop clamped to the ratio range) and a
horizontal flip with probability 1/2. Eval: resize the shorter side to size / 0.875, centre crop.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class TrainAugment:
    size: int = 224
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = True

    def __post_init__(self):
        if self.size <= 0:
            raise ValueError(f"crop size must be positive, got {self.size}")
        if not 0 < self.scale[0] <= self.scale[1] <= 1:
            raise ValueError(f"scale must satisfy 0 < min <= max <= 1, got {self.scale}")
        if not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"ratio must satisfy 0 < min <= max, got {self.ratio}")


@dataclass(frozen=True)
class EvalAugment:
    size: int = 224
    crop_fraction: float = 0.875  # resize the shorter side to size / crop_fraction (256 for 224)

    @property
    def resize_to(self) -> int:
        return int(self.size / self.crop_fraction)


@dataclass(frozen=True)
class CropPlan:
    """What to do with one decoded image (in upright, EXIF-applied coordinates)."""

    top: int
    left: int
    height: int
    width: int
    flip: bool = False
    resize_to: tuple[int, int] | None = None  # eval: (h, w) to resize to before the crop


_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def sample_rng(seed: int, epoch: int, index: int) -> random.Random:
    """The random stream of one sample in one epoch: Mersenne Twister seeded by a SplitMix64
    hash of (seed, epoch, index). Python's generator, not numpy's: creating it costs ~3 us
    against ~30 us for a numpy SeedSequence, and it runs under the GIL in every decode thread."""
    return random.Random(_splitmix64(_splitmix64(_splitmix64(seed) ^ epoch) ^ index))


def random_resized_crop(height: int, width: int, aug: TrainAugment,
                        rng: random.Random) -> CropPlan:
    """torchvision.transforms.RandomResizedCrop.get_params, on our per-sample stream."""
    area = height * width
    log_ratio = (math.log(aug.ratio[0]), math.log(aug.ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(aug.scale[0], aug.scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = rng.randrange(0, height - h + 1)
            left = rng.randrange(0, width - w + 1)
            return CropPlan(top, left, h, w, _flip(aug, rng))
    # Fallback: the whole image, clamped to the allowed aspect-ratio range, centred.
    in_ratio = width / height
    if in_ratio < aug.ratio[0]:
        w, h = width, int(round(width / aug.ratio[0]))
    elif in_ratio > aug.ratio[1]:
        h, w = height, int(round(height * aug.ratio[1]))
    else:
        w, h = width, height
    return CropPlan((height - h) // 2, (width - w) // 2, h, w, _flip(aug, rng))


def _flip(aug: TrainAugment, rng: random.Random) -> bool:
    # Always draw, so the stream position does not depend on the flip setting.
    draw = rng.random() < 0.5
    return aug.flip and bool(draw)


def center_crop_plan(height: int, width: int, aug: EvalAugment) -> CropPlan:
    """torchvision Resize(size/0.875) + CenterCrop(size): resize first, then crop."""
    short = aug.resize_to
    if height <= width:
        new_h, new_w = short, int(short * width / height)
    else:
        new_h, new_w = int(short * height / width), short
    top = int(round((new_h - aug.size) / 2.0))
    left = int(round((new_w - aug.size) / 2.0))
    return CropPlan(top, left, aug.size, aug.size, False, (new_h, new_w))
