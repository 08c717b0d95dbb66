"""Restart markers: the lossless rewrite keeps every pixel, and the ROI decoder's seek to the
crop's first MCU row returns exactly what decoding from the top returns (_jpegroi.c)."""

import io
import random

import numpy as np
import pytest
from PIL import Image

from dlperf.data import decode as D
from dlperf.data.decode import BadImage, decode_reference, exif_orientation, lossless_restart
from imagegen import cmyk_jpeg_bytes, exif_jpeg_bytes, jpeg_bytes, smooth_rgb

pytestmark = pytest.mark.skipif(not D.ROI_AVAILABLE,
                                reason="C extension not built (libjpeg headers missing)")

NO_SEEK = 4  # decode_region's `fast` bit that turns the seek off

# Odd sizes, so the last MCU row and column are partial; every common chroma layout.
KINDS = {
    "420": dict(arr=smooth_rgb(301, 397, seed=1), subsampling=2),
    "422": dict(arr=smooth_rgb(257, 333, seed=2), subsampling=1),
    "444": dict(arr=smooth_rgb(190, 211, seed=3), subsampling=0),
    "gray": dict(arr=smooth_rgb(233, 171, seed=4)[..., 1], subsampling=None),
}


def _jpeg(kind: str, **kwargs) -> bytes:
    spec = KINDS[kind]
    extra = {} if spec["subsampling"] is None else {"subsampling": spec["subsampling"]}
    return jpeg_bytes(spec["arr"], quality=90, **extra, **kwargs)


def _region(data: bytes, n: int, x: int, y: int, w: int, h: int, fast: int):
    buf = np.empty(h * (w + 64) * 3 + 64, np.uint8)
    row_w, shift, w, h, seek_rows = D._jpegroi.decode_region(data, n, x, y, w, h, fast, buf)
    return buf[:h * row_w * 3].reshape(h, row_w, 3)[:, shift:shift + w].copy(), seek_rows


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("progressive", [False, True])
def test_rewrite_is_lossless(kind, progressive):
    data = _jpeg(kind, progressive=progressive)
    out = lossless_restart(data)
    assert out != data and b"\xff\xdd\x00\x04" in out  # a DRI segment: restart markers
    assert b"\xff\xd0" in out[out.index(b"\xff\xda"):]  # RST0 in the entropy data
    assert not Image.open(io.BytesIO(out)).info.get("progressive")  # baseline now
    assert np.array_equal(decode_reference(out), decode_reference(data))


def test_rewrite_keeps_exif_and_icc_and_leaves_cmyk_alone():
    data = exif_jpeg_bytes(smooth_rgb(120, 90), 6)
    out = lossless_restart(data)
    assert exif_orientation(out) == 6
    assert np.array_equal(decode_reference(out), decode_reference(data))  # rotated the same
    icc = bytes(range(256)) * 3  # Pillow stores any bytes as the APP2 ICC profile
    data = jpeg_bytes(smooth_rgb(64, 64), icc_profile=icc)
    assert Image.open(io.BytesIO(lossless_restart(data))).info["icc_profile"] == icc
    cmyk = cmyk_jpeg_bytes(smooth_rgb(64, 64))
    assert lossless_restart(cmyk) == cmyk  # not YCbCr/gray: stored as it is
    png = b"\x89PNG\r\n\x1a\n" + bytes(10)
    assert lossless_restart(png) == png


def test_rewrite_refuses_corrupt_data():
    data = bytearray(_jpeg("420"))
    sos = data.index(b"\xff\xda")
    data[sos + 200:sos + 400] = bytes(200)  # zeroed entropy data: libjpeg warns
    data = bytes(data)
    with pytest.raises(BadImage, match="corrupt JPEG data"):
        lossless_restart(data)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("fast", [0, 3])  # exact IDCT + fancy upsampling; fast + plain
def test_seek_is_bit_identical(kind, fast):
    data = _jpeg(kind)
    out = lossless_restart(data)
    h, w = KINDS[kind]["arr"].shape[:2]
    rng = random.Random(kind)
    seeks = 0
    for n in (1, 2, 4, 8):
        sh, sw = -(-h * n // 8), -(-w * n // 8)
        for _ in range(12):
            y, x = rng.randrange(sh), rng.randrange(sw)
            rh, rw = rng.randrange(1, sh - y + 1), rng.randrange(1, sw - x + 1)
            seek, rows = _region(out, n, x, y, rw, rh, fast)
            top, none = _region(out, n, x, y, rw, rh, fast | NO_SEEK)
            orig, _ = _region(data, n, x, y, rw, rh, fast)
            assert none == 0 and np.array_equal(seek, top) and np.array_equal(seek, orig), \
                (n, x, y, rw, rh)
            assert rows % (n * (2 if kind == "420" else 1)) == 0  # whole MCU rows (8 or 16 px)
            seeks += rows > 0
    assert seeks > 12  # most regions start below the first MCU rows


def test_seek_never_decodes_the_rows_above():
    # Zero the first MCU row's entropy data: decoding from the top trips over it, the seek
    # never reads it and still returns the undamaged rows.
    out = lossless_restart(_jpeg("420"))
    sos = out.index(b"\xff\xda")
    start = sos + 2 + int.from_bytes(out[sos + 2:sos + 4], "big")
    first_rst = out.index(b"\xff\xd0", start)
    bad = out[:start] + bytes(first_rst - start) + out[first_rst:]
    good, _ = _region(out, 8, 10, 200, 100, 50, 3)
    seek, rows = _region(bad, 8, 10, 200, 100, 50, 3)
    assert rows == 192 and np.array_equal(seek, good)  # 200 // 16 * 16 rows never decoded
    with pytest.raises(ValueError, match="Corrupt JPEG data"):
        _region(bad, 8, 10, 200, 100, 50, 3 | NO_SEEK)


def test_files_without_markers_or_with_other_intervals_decode_from_the_top():
    data = _jpeg("420")
    assert _region(data, 8, 0, 250, 50, 20, 3)[1] == 0  # no restart markers at all
    # Pillow's restart interval in blocks (here 7 MCUs: not a whole MCU row) cannot be entered
    # at a row; the decoder must notice and decode from the top, with the same pixels.
    odd = _jpeg("420", restart_marker_blocks=7)
    assert b"\xff\xdd" in odd
    pixels, rows = _region(odd, 8, 0, 250, 50, 20, 3)
    assert rows == 0 and np.array_equal(pixels, _region(data, 8, 0, 250, 50, 20, 3)[0])
    # Two MCU rows per interval: entered at even MCU rows only.
    two = _jpeg("420", restart_marker_rows=2)
    pixels, rows = _region(two, 8, 0, 250, 50, 20, 3)
    assert rows == 224 and np.array_equal(pixels, _region(data, 8, 0, 250, 50, 20, 3)[0])


def test_decode_into_uses_the_seek_and_matches_the_original():
    from dlperf.data.augment import TrainAugment, random_resized_crop, sample_rng

    data = _jpeg("420")
    out = lossless_restart(data)
    aug = TrainAugment(64)
    for i in range(20):
        plan = random_resized_crop(301, 397, aug, sample_rng(0, 0, i))
        a, b = np.empty((64, 64, 3), np.uint8), np.empty((64, 64, 3), np.uint8)
        D.decode_into(data, lambda h, w, p=plan: p, a)
        D.decode_into(out, lambda h, w, p=plan: p, b)
        assert np.array_equal(a, b), (i, plan)
