"""Generate test images of every awkward kind (the tests make their own data)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image


def smooth_rgb(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A smooth, non-symmetric colour image (gradients + low-frequency waves): resampling
    differences between libraries stay small on it, while crops and flips stay detectable."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    f = rng.uniform(0.5, 2.0, size=3)
    r = 127 + 100 * np.sin(x / w * np.pi * f[0] + y / h)
    g = 255 * (x / max(w - 1, 1)) * 0.7 + 40 * np.cos(y / h * np.pi * f[1])
    b = 255 * (y / max(h - 1, 1)) * 0.8 + 30 * np.sin((x + y) / (w + h) * np.pi * f[2])
    return np.clip(np.stack([r, g, b], axis=2), 0, 255).astype(np.uint8)


def jpeg_bytes(arr: np.ndarray, quality: int = 92, **kwargs) -> bytes:
    buf = io.BytesIO()
    mode = "L" if arr.ndim == 2 else "RGB"
    Image.fromarray(arr, mode).save(buf, format="JPEG", quality=quality, **kwargs)
    return buf.getvalue()


def png_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def cmyk_jpeg_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr, "RGB").convert("CMYK").save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def exif_jpeg_bytes(arr: np.ndarray, orientation: int) -> bytes:
    im = Image.fromarray(arr, "RGB")
    exif = im.getexif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=95, exif=exif)
    return buf.getvalue()


def png16_bytes(h: int, w: int) -> bytes:
    a = (np.linspace(0, 65535, h * w).reshape(h, w)).astype(np.uint16)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")  # uint16 -> mode I;16
    return buf.getvalue()


def make_folder(root: Path, classes: int = 3, per_class: int = 6, size=(120, 160),
                seed: int = 0) -> Path:
    """An ImageNet-layout folder of valid JPEGs of varied sizes."""
    rng = np.random.default_rng(seed)
    for c in range(classes):
        d = root / f"class{c:02d}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            h = int(size[0] + rng.integers(0, 60))
            w = int(size[1] + rng.integers(0, 80))
            (d / f"img{i:03d}.JPEG").write_bytes(jpeg_bytes(smooth_rgb(h, w, seed=c * 100 + i)))
    return root

