"""Hostile inputs for the data path (issue #10): crafted JPEGs that once crashed dlperf, and a
corpus of mutated files mixed with good photos. Tests build them; nothing is downloaded."""

from __future__ import annotations

import struct

import numpy as np

from imagegen import cmyk_jpeg_bytes, exif_jpeg_bytes, jpeg_bytes, smooth_rgb


def segment(marker: int, payload: bytes) -> bytes:
    return b"\xff" + bytes([marker]) + struct.pack(">H", len(payload) + 2) + payload


def category15_gray(app_bytes: int = 8192) -> bytes:
    """The file that aborted `dlperf data prepare` with "double free or corruption".

    A baseline 8x8 grayscale JPEG, hand-assembled: quantisation table all ones; a DC Huffman
    table with a single 1-bit code ("0") for symbol 15, i.e. a DC difference of category 15,
    more than the 11 that 8-bit baseline allows; an AC table whose single 1-bit code is EOB.
    Scan bits: "0" (DC code), "100000000000000" (15 bits: +16384), "0" (EOB), then "1111111"
    padding = bytes 0x40 0x00 0x7F. libjpeg decodes it without a warning, but re-encoding it
    as baseline fails ("DCT coefficient out of range"). Behind an APP2 segment of 8 KB the
    re-encoder's output outgrows jpeg_mem_dest's first 4 KB buffer before the failure, which is
    what made the old error path free a freed pointer.
    """
    dqt = segment(0xDB, b"\x00" + b"\x01" * 64)
    sof = segment(0xC0, b"\x08" + struct.pack(">HH", 8, 8) + b"\x01" + b"\x01\x11\x00")
    dc = segment(0xC4, b"\x00" + bytes([1] + [0] * 15) + b"\x0f")
    ac = segment(0xC4, b"\x10" + bytes([1] + [0] * 15) + b"\x00")
    sos = segment(0xDA, b"\x01\x01\x00\x00\x3f\x00")
    app = segment(0xE2, b"ICC_PROFILE\x00" + bytes(app_bytes - 12)) if app_bytes else b""
    return b"\xff\xd8" + app + dqt + sof + dc + ac + sos + b"\x40\x00\x7f" + b"\xff\xd9"


def seed_jpegs() -> dict[str, bytes]:
    """Good JPEGs of every layout the decoder meets: the fuzzer's seeds."""
    a = smooth_rgb(77, 101, seed=3)
    seeds = {
        "420.jpg": jpeg_bytes(a, subsampling=2),
        "422.jpg": jpeg_bytes(a, subsampling=1),
        "444.jpg": jpeg_bytes(a, subsampling=0, quality=97),
        "gray.jpg": jpeg_bytes(a[:, :, 0]),
        "progressive.jpg": jpeg_bytes(a, progressive=True),
        "optimized.jpg": jpeg_bytes(smooth_rgb(33, 250, seed=4), optimize=True),
        "tiny.jpg": jpeg_bytes(smooth_rgb(1, 1)),
        "exif6.jpg": exif_jpeg_bytes(smooth_rgb(40, 64, seed=5), 6),
        "cmyk.jpg": cmyk_jpeg_bytes(smooth_rgb(24, 40, seed=6)),
        "category15.jpg": category15_gray(),
    }
    try:  # the same files with restart markers, as `dlperf data prepare` writes them
        from dlperf.data import _jpegroi
        for name in ("420.jpg", "422.jpg", "gray.jpg", "exif6.jpg"):
            seeds["rst-" + name] = _jpegroi.transcode(seeds[name], 16)
    except ImportError:
        pass
    return seeds


def mutate(data: bytes, rng: np.random.Generator) -> bytes:
    """One damaged copy: bit flips in the scan, a truncation, a wrong header field, or bytes
    overwritten (the Python side's corpus; the C fuzzer has the full set of mutators)."""
    b = bytearray(data)
    kind = int(rng.integers(0, 5))
    scan = data.find(b"\xff\xda")
    if kind == 0 and 0 < scan < len(b) - 20:  # flip bits inside the entropy-coded data
        for _ in range(int(rng.integers(1, 17))):
            i = int(rng.integers(scan + 14, len(b) - 2))
            b[i] ^= 1 << int(rng.integers(0, 8))
    elif kind == 1 and len(b) > 3:  # truncated
        b = b[:int(rng.integers(2, len(b) - 1))]
    elif kind == 2:  # a frame dimension edited
        sof = max(data.find(b"\xff\xc0"), data.find(b"\xff\xc2"))
        if 0 < sof and sof + 8 < len(b):
            b[sof + 5 + 2 * int(rng.integers(0, 2))] = int(rng.integers(0, 256))
    elif kind == 3 and len(b) > 3:  # 16 bytes overwritten inside one JPEG
        i = int(rng.integers(2, max(3, len(b) - 16)))
        b[i:i + 16] = rng.integers(0, 256, 16, dtype=np.uint8).tobytes()
    else:  # a large APP segment in front
        b[2:2] = segment(0xE0 + int(rng.integers(0, 16)), bytes(int(rng.integers(100, 60000))))
    return bytes(b)
