"""Restart markers: the lossless rewrite keeps every pixel, and the ROI decoder's cut to the
restart intervals under a crop returns exactly what decoding from the top returns (_jpegroi.c)."""

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

NO_CUT = 4  # decode_region's `fast` bit that turns the cut off

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
    """(pixels, output rows cut at the top, output columns cut at the left)"""
    buf = np.empty(h * (w + 64) * 3 + 64, np.uint8)
    row_w, shift, w, h, rows, cols = D._jpegroi.decode_region(data, n, x, y, w, h, fast, buf)
    return buf[:h * row_w * 3].reshape(h, row_w, 3)[:, shift:shift + w].copy(), rows, cols


def _intervals_per_row(data: bytes, width: int, mcu: int) -> int:
    dri = data.index(b"\xff\xdd")
    return -(-width // mcu) // int.from_bytes(data[dri + 4:dri + 6], "big")


def _interval_bytes(data: bytes, index: int) -> tuple[int, int]:
    """Byte range of restart interval ``index`` (0-based) in the entropy data."""
    sos = data.index(b"\xff\xda")
    start = sos + 2 + int.from_bytes(data[sos + 2:sos + 4], "big")
    for k in range(index):
        start = data.index(bytes([0xFF, 0xD0 + k % 8]), start) + 2
    return start, data.index(bytes([0xFF, 0xD0 + index % 8]), start)


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
@pytest.mark.parametrize("column_px", [0, 16, 32])  # whole rows; rows split in 1 / 2+ MCUs
def test_cut_is_bit_identical(kind, fast, column_px):
    data = _jpeg(kind)
    out = lossless_restart(data, column_px)
    h, w = KINDS[kind]["arr"].shape[:2]
    mcu_h = 16 if kind == "420" else 8
    mcu_w = 16 if kind in ("420", "422") else 8
    rng = random.Random(f"{kind}{fast}{column_px}")
    cut_rows = cut_cols = 0
    for n in (1, 2, 4, 8):
        sh, sw = -(-h * n // 8), -(-w * n // 8)
        for _ in range(12):
            y, x = rng.randrange(sh), rng.randrange(sw)
            rh, rw = rng.randrange(1, sh - y + 1), rng.randrange(1, sw - x + 1)
            cut, rows, cols = _region(out, n, x, y, rw, rh, fast)
            top, none, _ = _region(out, n, x, y, rw, rh, fast | NO_CUT)
            orig, _, _ = _region(data, n, x, y, rw, rh, fast)
            assert none == 0 and np.array_equal(cut, top) and np.array_equal(cut, orig), \
                (n, x, y, rw, rh)
            assert rows % (mcu_h * n // 8) == 0 and cols % (mcu_w * n // 8) == 0  # whole MCUs
            cut_rows += rows > 0
            cut_cols += cols > 0
    assert cut_rows > 12  # most regions start below the first MCU rows
    assert (cut_cols > 12) == (column_px > 0)  # and right of the first interval


def test_cut_never_decodes_the_rows_and_columns_around_the_region():
    # Zero one interval above the region and one to its left: decoding from the top trips
    # over them, the cut never reads them and returns the undamaged pixels.
    out = lossless_restart(_jpeg("420"), 16)  # one MCU (16 px) per interval
    per_row = _intervals_per_row(out, 397, 16)
    assert per_row == 25
    bad = bytearray(out)
    for index in (0, 13 * per_row + 2):  # row 0 column 0; row 13 (y 208-223), x 32-47
        start, end = _interval_bytes(out, index)
        bad[start:end] = bytes(end - start)
    bad = bytes(bad)
    good, _, _ = _region(out, 8, 100, 200, 100, 50, 3)
    cut, rows, cols = _region(bad, 8, 100, 200, 100, 50, 3)
    assert (rows, cols) == (192, 96) and np.array_equal(cut, good)  # 200 // 16, 100 // 16
    with pytest.raises(ValueError, match="Corrupt JPEG data"):
        _region(bad, 8, 100, 200, 100, 50, 3 | NO_CUT)


def test_other_encoders_intervals_are_used_where_they_line_up():
    # Any encoder's markers work when the intervals line up with MCU rows; others decode from
    # the top. The image is 397 px wide: 25 MCUs of 16 px per row.
    data = _jpeg("420")
    want = _region(data, 8, 100, 250, 50, 20, 3)[0]
    assert _region(data, 8, 100, 250, 50, 20, 3)[1:] == (0, 0)  # no restart markers at all
    for kwargs, cut in [(dict(restart_marker_blocks=7), (0, 0)),  # 7 does not divide 25
                        (dict(restart_marker_rows=2), (224, 0)),  # even MCU rows only
                        (dict(restart_marker_blocks=5), (240, 80))]:  # 5 intervals per row
        other = _jpeg("420", **kwargs)
        assert b"\xff\xdd" in other
        pixels, rows, cols = _region(other, 8, 100, 250, 50, 20, 3)
        assert (rows, cols) == cut and np.array_equal(pixels, want), kwargs


def test_decode_into_uses_the_cut_and_matches_the_original():
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


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_cut_file_holds_exactly_the_pixels_under_the_crop(kind):
    # What the GPU path hands nvJPEG: a JPEG of its own. Pillow (libjpeg, exact IDCT, fancy
    # upsampling) decodes the cut and the whole file to the same pixels under the crop.
    from dlperf.data.augment import TrainAugment, random_resized_crop, sample_rng
    from dlperf.data.decode import cut_to_plan

    out = lossless_restart(_jpeg(kind))
    full = decode_reference(out)
    h, w = full.shape[:2]
    cuts = 0
    for i in range(16):
        plan = random_resized_crop(h, w, TrainAugment(64), sample_rng(1, 0, i))
        cut = cut_to_plan(out, plan, 1)
        if cut is None:  # the crop starts in the first interval: nothing to cut
            continue
        part, ph, pw, moved = cut
        cuts += 1
        img = decode_reference(part)
        assert img.shape[:2] == (ph, pw) and len(part) < len(out)
        assert (moved.height, moved.width, moved.flip) == (plan.height, plan.width, plan.flip)
        assert np.array_equal(img[moved.top:moved.top + moved.height,
                                  moved.left:moved.left + moved.width],
                              full[plan.top:plan.top + plan.height,
                                   plan.left:plan.left + plan.width]), (i, plan)
    assert cuts >= 10
    assert cut_to_plan(_jpeg(kind), plan, 1) is None  # no markers
    assert cut_to_plan(out, plan, 6) is None  # EXIF-rotated: stored coordinates differ


def test_damaged_files_raise_or_decode_never_crash():
    # The cut parses markers itself: random byte damage (flips, truncation, forged markers)
    # must end in a result or a ValueError, never a crash or a read out of bounds.
    out = lossless_restart(_jpeg("420"), 16)
    rng = random.Random(7)
    for trial in range(300):
        bad = bytearray(out)
        for _ in range(rng.randrange(1, 6)):
            pos = rng.randrange(2, len(bad))
            bad[pos] = rng.choice([0xFF, 0xD0 + rng.randrange(8), 0xD9, 0xDD, 0x00,
                                   rng.randrange(256)])
        if trial % 5 == 0:
            bad = bad[:rng.randrange(20, len(bad))]
        bad = bytes(bad)
        try:
            _region(bad, rng.choice([1, 2, 4, 8]), rng.randrange(300), rng.randrange(280), 60, 40,
                    rng.choice([0, 3]))
        except ValueError:
            pass
        try:
            D._jpegroi.cut_region(bad, rng.randrange(300), rng.randrange(280), 60, 40)
        except ValueError:
            pass


def _spy_region(monkeypatch) -> list:
    """Record the (scale n, fast bits) of every decode_region call."""
    calls, module = [], D._jpegroi

    class Spy:
        def __getattr__(self, name):
            return getattr(module, name)

    def region(data, n, x, y, w, h, fast, buf):
        calls.append((n, fast))
        return module.decode_region(data, n, x, y, w, h, fast, buf)

    spy = Spy()
    spy.decode_region = region
    monkeypatch.setattr(D, "_jpegroi", spy)
    return calls


def test_each_decoder_speedup_can_be_switched_off(monkeypatch):
    """The ladder's switches (DecodeLimits.dct_scaling / region / restart_cut) each turn off
    exactly one speed-up and keep the pixels: the same crop through every combination."""
    from dlperf.data.augment import CropPlan

    data = lossless_restart(_jpeg("420"))
    plan = CropPlan(40, 60, 240, 300)  # >= 2x the 64 px output: a reduced DCT scale
    calls = _spy_region(monkeypatch)
    outs = {}
    for name, limits in {"all": D.DecodeLimits(), "no_cut": D.DecodeLimits(restart_cut=False),
                         "no_scale": D.DecodeLimits(dct_scaling=False),
                         "no_region": D.DecodeLimits(region=False)}.items():
        calls.clear()
        outs[name] = np.empty((64, 64, 3), np.uint8)
        D.decode_into(data, lambda h, w: plan, outs[name], limits)
        outs[name + "_calls"] = list(calls)
    # 64/240 = 0.27 of the crop is needed: 4/8, the smallest power-of-two scale above it
    assert outs["all_calls"] == [(4, 3)]  # ... and cut to the crop's intervals (bit 2 clear)
    assert outs["no_cut_calls"] == [(4, 3 | NO_CUT)]
    assert outs["no_scale_calls"] == [(8, 3)]
    assert outs["no_region_calls"] == []  # the whole image through simplejpeg/Pillow
    assert np.array_equal(outs["all"], outs["no_cut"])  # the cut is bit-exact
    for other in ("no_scale", "no_region"):  # other paths, the same picture within resampling
        diff = np.abs(outs["all"].astype(int) - outs[other].astype(int))
        assert diff.mean() < 3, (other, diff.mean())
