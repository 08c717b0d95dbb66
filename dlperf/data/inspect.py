"""`dlperf data inspect`: what each file of a dataset costs the input pipeline, and why.

Reads only headers (a few microseconds per file) and sorts every sample into the decode path
dlperf's CPU loader takes for a training crop, cheapest first:

- ``cut``: a YCbCr/gray JPEG whose restart intervals line up with MCU rows (what
  `dlperf data prepare` writes): only the intervals under the crop are entropy-decoded;
- ``roi``: a baseline JPEG without usable restart markers: the crop's region is decoded, but the
  Huffman stream of every row above it and the full width of its rows is still read;
- ``whole``: either of those when dlperf's C extension is missing (no libjpeg headers at install
  time): the whole image is decoded, DCT-scaled;
- ``progressive``: all scans of the whole image are entropy-decoded before any region;
- ``rotated``: EXIF orientation other than 1: the whole image is decoded (DCT-scaled), then
  rotated;
- ``pillow``: CMYK, RGB-coded, 12-bit, arithmetic-coded or lossless JPEGs and other formats
  (PNG, ...): Pillow decodes the whole image;
- ``bad``: no readable header, or over the size limits: skipped by the loader.

The report counts them, measures image sizes against the training crop, and turns both into
advice with the command that fixes each finding.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from dlperf.data.decode import (JPEG_MAGIC, ROI_AVAILABLE, BadImage, DecodeLimits, image_header,
                                jpeg_info)
from dlperf.data.sources import Source

PATHS = ("cut", "roi", "whole", "progressive", "rotated", "pillow", "bad")
MEANING = {
    "cut": "only the restart intervals under each crop are decoded",
    "roi": "crop region decoded; rows above it still entropy-decoded",
    "whole": "no C extension: whole image decoded (DCT-scaled), then cropped",
    "progressive": "every scan of the whole image entropy-decoded",
    "rotated": "EXIF-rotated: whole image decoded, then turned",
    "pillow": "not a YCbCr/gray 8-bit JPEG: Pillow decodes it whole",
    "bad": "unreadable header or over the limits: skipped",
}
# Worth a word when at least this share of the samples takes a path dearer than `cut`.
NOTABLE = 0.02


@dataclass(frozen=True)
class InspectConfig:
    size: int = 224  # the training crop the images feed
    limit: int | None = None  # inspect only the first N samples (None: all)
    limits: DecodeLimits = DecodeLimits()


def decode_path(data: bytes, limits: DecodeLimits = DecodeLimits()) -> tuple[str, int, int]:
    """(path, upright height, upright width) of one file; the size is (0, 0) for ``bad``."""
    try:
        height, width, orientation, fast = image_header(data, limits)
    except BadImage:
        return "bad", 0, 0
    if data[:3] != JPEG_MAGIC or not fast:
        return "pillow", height, width
    if orientation != 1:
        return "rotated", height, width
    try:
        info = jpeg_info(data)
    except BadImage:  # simplejpeg read a header that dlperf's reader does not: no markers known
        return ("roi" if ROI_AVAILABLE else "whole"), height, width
    if info.sof == 0xC2:
        return "progressive", height, width
    if not ROI_AVAILABLE:
        return "whole", height, width
    return ("cut" if info.cuttable else "roi"), height, width


def inspect(source: Source, cfg: InspectConfig = InspectConfig(), progress=None) -> dict:
    """Counts, bytes and pixel sizes per decode path, and the advice they lead to."""
    n = len(source) if cfg.limit is None else min(cfg.limit, len(source))
    counts = {p: 0 for p in PATHS}
    sizes = {p: 0 for p in PATHS}
    short_sides, pixels, examples = [], [], {}
    for i in range(n):
        try:
            data = source.read_limited(i, cfg.limits.max_bytes)
        except (OSError, BadImage):
            data = None
        path, height, width = ("bad", 0, 0) if data is None else decode_path(data, cfg.limits)
        counts[path] += 1
        sizes[path] += len(data or b"")
        examples.setdefault(path, source.name(i))
        if height:
            short_sides.append(min(height, width))
            pixels.append(height * width)
        if progress:
            progress()
    report = {"samples": n, "paths": counts,
              "mean_kb": {p: sizes[p] / counts[p] / 1024 for p in PATHS if counts[p]},
              "example": examples, "crop_size": cfg.size,
              "median_short_side": statistics.median(short_sides) if short_sides else None,
              "median_megapixels": statistics.median(pixels) / 1e6 if pixels else None,
              "native_jpeg": ROI_AVAILABLE}
    report["advice"] = advice(report)
    return report


def advice(report: dict) -> list[str]:
    """What to do about a report's findings, most costly first (pure function)."""
    n, paths, lines = report["samples"], report["paths"], []
    if not n:
        return lines
    share = {p: paths[p] / n for p in PATHS}
    slow = share["roi"] + share["progressive"]
    if slow >= NOTABLE:
        lines.append(
            f"{slow:.0%} of the files make every training crop entropy-decode more than the "
            f"crop ({paths['roi']:,} without restart markers, {paths['progressive']:,} "
            "progressive): `dlperf data prepare SRC DST` rewrites them losslessly (the same "
            "pixels) as baseline JPEGs with restart markers; training crops then decode "
            "1.3-1.4x faster on ImageNet-like photos (benchmarks/README.md).")
    if paths["whole"]:  # any at all: the extension is missing, which costs every JPEG
        lines.append(
            f"{share['whole']:.0%} of the files are decoded whole because dlperf's JPEG "
            "extension is not built (1.4-2x slower, and `prepare` cannot add restart markers): "
            "install gcc and libjpeg-turbo's headers (Debian: libjpeg62-turbo-dev) and "
            "reinstall dlperf.")
    if share["rotated"] >= NOTABLE:
        lines.append(
            f"{share['rotated']:.0%} of the files are EXIF-rotated and decoded whole: "
            "`dlperf data prepare SRC DST --max-side M` stores them upright (re-encoded).")
    if share["pillow"] >= NOTABLE:
        lines.append(
            f"{share['pillow']:.0%} of the files take Pillow's full decode (e.g. "
            f"{report['example'].get('pillow')}): `dlperf data prepare` keeps non-JPEG files "
            "lossless (PNG), still Pillow's; `--max-side M` re-encodes them as JPEG (lossy). "
            "CMYK and RGB-coded JPEGs stay on this path.")
    if paths["bad"]:
        lines.append(
            f"{paths['bad']:,} files have no readable header or break the size limits (e.g. "
            f"{report['example'].get('bad')}); the loader skips and reports them, `dlperf data "
            "prepare` lists them all.")
    side, size, mp = report["median_short_side"], report["crop_size"], report["median_megapixels"]
    if side and side >= 3 * size:
        max_side = 2 * size  # a 4:3 photo keeps a short side of 1.5x the crop
        lines.append(
            f"the median image's short side is {side:,.0f} px for {size} px crops: `dlperf data "
            f"prepare SRC DST --max-side {max_side}` (lossy re-encode) leaves about "
            f"{mp * 1e6 / (0.75 * max_side ** 2):.0f}x fewer pixels to decode per image.")
    return lines
