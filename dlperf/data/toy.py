"""A small learnable image dataset, written as JPEG folders (`dlperf data toy DST`).

Class c has a dominant colour channel (c < 3) or horizontal stripes (c = 3), on noise: a tiny CNN
separates the classes in a few epochs on a CPU, so `dlperf train --recipe tiny` can be tried
without downloading anything.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image


def make_toy(root: str | Path, per_class: int = 40, classes: int = 4, size: int = 40,
             seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    root = Path(root)
    for c in range(classes):
        d = root / f"c{c}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            img = rng.integers(0, 60, (size, size, 3)).astype(np.uint8)
            if c % 4 < 3:
                img[..., c % 4] += 150
            else:
                img[::4] = 255
            buf = io.BytesIO()
            Image.fromarray(img, "RGB").save(buf, format="JPEG", quality=92)
            (d / f"{i:03d}.jpg").write_bytes(buf.getvalue())
    return root


def make_toy_split(root: str | Path, per_class: int = 40, classes: int = 4) -> tuple[Path, Path]:
    """train/ and val/ folders (val: a quarter as many images, another seed)."""
    root = Path(root)
    return (make_toy(root / "train", per_class, classes, seed=0),
            make_toy(root / "val", max(1, per_class // 4), classes, seed=1))
