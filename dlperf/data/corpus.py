"""A benchmark JPEG corpus any machine can make: `dlperf data corpus DST`.

Input-pipeline speed depends on what is decoded: image size, JPEG quality and chroma
subsampling, and how much detail the entropy coder has to carry. dlperf's benchmarks need a
corpus with ImageNet's statistics (about 500x400 pixels, baseline 4:2:0, ~100 KB a file) that a
fresh machine can reproduce without downloading anything. The only photograph every dlperf
installation has is the one matplotlib ships (``mpl-data/sample_data/grace_hopper.jpg``,
512x600), so each image is a random crop of it, resized to a random ImageNet-like size, flipped,
tinted per class, with sensor-like noise that gives the entropy coder the detail a real photo
has, encoded at a random quality in 85..95. Deterministic for a seed; written atomically.

Against the corpus this project's saved results used (320 ImageNet-like JPEGs, 10 classes,
mean 104 KB, 518x423, all baseline 4:2:0) the defaults give 320 files, 10 classes, mean 107 KB,
515x449, decoded at 0.99x its rate (benchmarks/bench_setup_costs.py; tests/test_corpus.py
checks the ranges).
"""

from __future__ import annotations

import io
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from dlperf.errors import DlperfError
from dlperf.files import cache_dir, write_atomic, write_json_atomic

# Bumped whenever the generator's output changes: results name the version they ran on.
CORPUS_VERSION = 1
MARKER = "corpus.json"  # written last: its presence means the corpus is complete


@dataclass(frozen=True)
class CorpusConfig:
    images: int = 320
    classes: int = 10
    seed: int = 0
    min_quality: int = 85
    max_quality: int = 95
    noise: float = 13.0  # std of the added noise, in 8-bit levels (sets the file size)

    def __post_init__(self):
        if not 1 <= self.classes <= self.images:
            raise DlperfError(f"--classes must be in 1..{self.images} (the image count), got "
                              f"{self.classes}")
        if not 1 <= self.min_quality <= self.max_quality <= 100:
            raise DlperfError("JPEG qualities must satisfy 1 <= min <= max <= 100")
        if not 0 <= self.noise <= 64:
            raise DlperfError(f"noise must be in 0..64 levels, got {self.noise}")


def source_photo() -> np.ndarray:
    """The photograph matplotlib ships, as an RGB uint8 array (HxWx3)."""
    from PIL import Image
    import matplotlib

    path = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))
    except OSError as exc:
        raise DlperfError(f"{path}: matplotlib's sample photo is missing ({exc}); reinstall "
                          "matplotlib") from None


def _image(photo: np.ndarray, rng: np.random.Generator, tint: np.ndarray, noise: float
           ) -> np.ndarray:
    import cv2

    h, w = photo.shape[:2]
    area = rng.uniform(0.15, 1.0) * h * w
    aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
    ch = int(min(h, round(np.sqrt(area / aspect))))
    cw = int(min(w, round(np.sqrt(area * aspect))))
    y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
    crop = photo[y:y + ch, x:x + cw]
    # ImageNet-like sizes: the longer side 430..670, landscape three times in four
    long_side = int(rng.integers(430, 671))
    ratio = rng.uniform(0.6, 0.9)
    size = (long_side, int(long_side * ratio))
    if rng.random() < 0.25:
        size = size[::-1]
    img = cv2.resize(crop, size, interpolation=cv2.INTER_CUBIC).astype(np.float32)
    if rng.random() < 0.5:
        img = img[:, ::-1]
    img = img * tint + rng.normal(0.0, 1.0, img.shape).astype(np.float32) * rng.uniform(
        0.6, 1.4) * noise
    return np.clip(img, 0, 255).astype(np.uint8)


def make_corpus(dst: str | Path, cfg: CorpusConfig = CorpusConfig(), progress=None) -> dict:
    """Write ``cfg.images`` JPEGs into ``dst/CLASS/NAME.JPEG`` (ImageNet layout); returns a
    summary. Refuses a non-empty ``dst``."""
    from PIL import Image

    dst = Path(dst)
    if dst.exists() and any(dst.iterdir()):
        raise DlperfError(f"{dst}: not empty; choose a new folder")
    try:
        dst.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DlperfError(f"{dst}: cannot write there ({exc.strerror}); choose a folder you "
                          "can write") from None
    photo = source_photo()
    rng = np.random.default_rng(cfg.seed)
    tints = rng.uniform(0.75, 1.15, size=(cfg.classes, 3)).astype(np.float32)
    sizes, dims = [], []
    for i in range(cfg.images):
        label = i % cfg.classes
        folder = dst / f"n{label:08d}"
        folder.mkdir(exist_ok=True)
        img = _image(photo, rng, tints[label], cfg.noise)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", subsampling=2, optimize=False,
                                  quality=int(rng.integers(cfg.min_quality, cfg.max_quality + 1)))
        data = buf.getvalue()
        write_atomic(folder / f"n{label:08d}_{i // cfg.classes:05d}.JPEG",
                     lambda f, data=data: f.write(data), binary=True)
        sizes.append(len(data))
        dims.append(img.shape[:2])
        if progress:
            progress()
    summary = {"images": cfg.images, "classes": cfg.classes, "seed": cfg.seed,
               "version": CORPUS_VERSION,
               "mean_bytes": float(np.mean(sizes)), "median_bytes": float(np.median(sizes)),
               "mean_width": float(np.mean([d[1] for d in dims])),
               "mean_height": float(np.mean([d[0] for d in dims])), "config": asdict(cfg)}
    write_json_atomic(dst / MARKER, summary)  # last: the corpus is complete
    return summary


def default_corpus(progress=None) -> Path:
    """dlperf's own benchmark corpus (the defaults above), made once per machine in the cache
    folder (``DLPERF_CACHE_DIR``, default ``~/.cache/dlperf``): what `dlperf bench data` and the
    decoder benchmarks read when no folder is given."""
    root = cache_dir() / f"corpus-imagenet-like-v{CORPUS_VERSION}"
    if (root / MARKER).exists():
        return root
    tmp = root.with_name(f".{root.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    make_corpus(tmp, CorpusConfig(), progress)
    try:
        tmp.rename(root)
    except OSError:  # made meanwhile by another process: use that one
        shutil.rmtree(tmp, ignore_errors=True)
        if not (root / MARKER).exists():
            raise DlperfError(f"{root}: could not be written; pass a corpus folder") from None
    return root
