"""Decode one image into an upright RGB uint8 crop, or say precisely why it cannot be decoded.

Fast path (JPEG in YCbCr or grayscale): libjpeg-turbo, with the GIL released, decoding straight
to a DCT-scaled size (1/8, 1/4, 1/2 or 1) that is still at least as large as the output needs,
so a small crop of a large photo costs a fraction of a full decode (FFCV's and DALI's trick).
Training crops go through the ROI decoder (_jpegroi.c): only the crop's rows and iMCU columns
are decoded, and decoding stops after the crop's last row (DALI's ROI decoding). Without the C
extension, or for EXIF-rotated images, simplejpeg decodes the whole (scaled) image. The crop is
then resized with OpenCV into the caller's batch buffer.

Reference path (everything else: PNG, CMYK JPEG, 16-bit images, odd modes): Pillow, with EXIF
orientation applied. ``decode_reference`` runs it for any file so tests can hold the fast path
against it (a slow, obvious reference beside each fast path).

Every failure raises :class:`BadImage` with a short reason; nothing is ever substituted.

One module of ~500 lines because the fast paths (region decode, DCT scaling, restart-marker
cuts) and the float64 reference they are tested against must read headers and limits the same
way; split apart, the reference would drift from what it checks.
"""

from __future__ import annotations

import io
import math
import struct
from dataclasses import dataclass, replace

import cv2
import numpy as np
try:  # libjpeg-turbo for Python; without it (e.g. a bare GPU image) Pillow decodes everything
    import simplejpeg
except ImportError:
    simplejpeg = None
from PIL import Image, ImageOps, UnidentifiedImageError

from dlperf.data.augment import CropPlan

try:  # optional C extension (setup.py): region-of-interest decoding against libjpeg-turbo
    from dlperf.data import _jpegroi
except ImportError:  # headers missing at install time: full-image DCT-scaled decoding instead
    _jpegroi = None

ROI_AVAILABLE = _jpegroi is not None

def use_single_threaded_opencv() -> None:
    """Called when dlperf starts its own decode threads (not at import): OpenCV would otherwise
    start a thread pool inside each of them and oversubscribe the cores."""
    cv2.setNumThreads(1)


class BadImage(Exception):
    """A file that is not a decodable image; the message is the reason."""


def too_large(size: int, limit: int) -> BadImage:
    """The one message for a file over the size limit, whoever reads it (a source refusing to
    read it, or the decoder given its bytes)."""
    return BadImage(f"file too large ({size:,} bytes > limit {limit:,}; raise "
                    "DecodeLimits.max_bytes if it is a real image)")


@dataclass(frozen=True)
class DecodeLimits:
    """Memory limits, and the decoder's speed-ups (each can be switched off, so `dlperf bench
    data --ladder` measures them one at a time; they never change which files are accepted)."""

    max_bytes: int = 64 << 20  # larger files are refused before they are read
    max_pixels: int = 50_000_000  # decompression-bomb guard, checked on the header
    fast_idct: bool = True  # libjpeg-turbo's fast integer IDCT/upsampling (~5% faster, ~1 level)
    dct_scaling: bool = True  # decode at 1/2, 1/4, 1/8 scale when the crop is >= 2x the output
    region: bool = True  # decode only the crop's rows and columns (the C extension)
    restart_cut: bool = True  # with restart markers, entropy-decode only the crop's intervals


JPEG_MAGIC = b"\xff\xd8\xff"

# EXIF orientation -> numpy transform of an H x W x C array into upright form (EXIF 2.3 spec;
# equivalent to PIL.ImageOps.exif_transpose, tested against it).
_ORIENT = {
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: np.rot90(a, -1),
    7: lambda a: a[::-1, ::-1].transpose(1, 0, 2),
    8: lambda a: np.rot90(a, 1),
}


def _segments(data: bytes):
    """(marker, payload) of each JPEG marker segment before the first scan, then (0xDA, b"")
    for the start of scan or (0xD9, b"") for an end of image if one comes first. Raises BadImage
    where a marker should start and none does."""
    pos, n = 2, len(data)
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            raise BadImage("corrupt JPEG header (no marker where one belongs)")
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no payload
            pos += 2
            continue
        if marker in (0xDA, 0xD9):  # start of scan / end of image: no more metadata
            yield marker, b""
            return
        length = int.from_bytes(data[pos + 2:pos + 4], "big")
        yield marker, data[pos + 4:pos + 2 + length]
        pos += 2 + length


def exif_orientation(data: bytes) -> int:
    """The EXIF orientation tag of a JPEG (1 when absent or unreadable), from the APP1 segment."""
    try:
        for marker, seg in _segments(data):
            if marker == 0xE1 and seg[:6] == b"Exif\x00\x00":
                return _tiff_orientation(seg[6:])
    except BadImage:
        pass
    return 1


def _tiff_orientation(tiff: bytes) -> int:
    try:
        endian = {b"II": "<", b"MM": ">"}[tiff[:2]]
        ifd = struct.unpack(endian + "I", tiff[4:8])[0]
        count = struct.unpack(endian + "H", tiff[ifd:ifd + 2])[0]
        for i in range(count):
            entry = tiff[ifd + 2 + 12 * i: ifd + 14 + 12 * i]
            tag, typ = struct.unpack(endian + "HH", entry[:4])
            if tag == 0x0112 and typ == 3:
                value = struct.unpack(endian + "H", entry[8:10])[0]
                return value if 1 <= value <= 8 else 1
    except (KeyError, struct.error, IndexError):
        pass
    return 1


# Frame headers: baseline, extended and progressive Huffman (what libjpeg-turbo's fast paths and
# nvJPEG take), then every other kind (lossless, arithmetic-coded, hierarchical).
_SOF_FAST = frozenset((0xC0, 0xC1, 0xC2))
_SOF_OTHER = frozenset((0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF))


@dataclass(frozen=True)
class JpegInfo:
    """What a JPEG's markers say, read in Python (no decoder needed)."""

    height: int  # as stored (before EXIF orientation)
    width: int
    orientation: int  # EXIF, 1 when absent
    sof: int  # frame marker: 0xC0 baseline, 0xC1 extended, 0xC2 progressive, ...
    precision: int
    components: int
    ycc_or_gray: bool  # libjpeg's colour-space guess: YCbCr or grayscale (not RGB/CMYK/YCCK)
    max_h: int  # sampling factors: an MCU is 8 * max_h by 8 * max_v pixels (8 x 8 for gray)
    max_v: int
    restart_interval: int  # MCUs per restart interval, 0 without markers

    @property
    def fast(self) -> bool:
        """An 8-bit Huffman-coded YCbCr or grayscale image: what the ROI decoder, simplejpeg and
        nvJPEG decode directly (simplejpeg's own verdict, tested against it)."""
        return self.sof in _SOF_FAST and self.precision == 8 and self.ycc_or_gray

    @property
    def cuttable(self) -> bool:
        """Restart intervals that line up with MCU rows (k whole rows, or an even split of each
        row) in a single-scan file: the ROI decoder reads only the intervals under a crop."""
        if not self.restart_interval or self.sof == 0xC2:
            return False
        mcu_w = 8 * self.max_h if self.components > 1 else 8
        per_row = -(-self.width // mcu_w)
        return self.restart_interval % per_row == 0 or per_row % self.restart_interval == 0


def jpeg_info(data: bytes) -> JpegInfo:
    """Read a JPEG's marker segments up to its first scan. For three components the colour
    space is libjpeg's own guess: a JFIF marker means YCbCr, else the Adobe transform flag, else
    the component ids ('R', 'G', 'B' means RGB). Raises BadImage when no frame header is found.

    In C when the extension is built (~1 us; the loader reads every sample's header under the
    GIL), else in Python (~10 us): the same rules, compared on mutated files in the tests."""
    if ROI_AVAILABLE:
        try:
            return JpegInfo(*_jpegroi.jpeg_info(data))
        except ValueError as exc:
            raise BadImage(f"corrupt JPEG header ({exc})") from None
    return _jpeg_info_py(data)


def _jpeg_info_py(data: bytes) -> JpegInfo:
    """jpeg_info in Python: the reference the C reader is tested against."""
    orientation, adobe, jfif, restart, frame, scan = 1, None, False, 0, None, False
    for marker, seg in _segments(data):  # every segment up to the scan: DRI follows the frame
        if marker == 0xDA:
            scan = True
        elif marker == 0xE0 and seg[:5] == b"JFIF\x00":
            jfif = True
        elif marker == 0xE1 and seg[:6] == b"Exif\x00\x00":
            orientation = _tiff_orientation(seg[6:])
        elif marker == 0xEE and seg[:5] == b"Adobe" and len(seg) >= 12:
            adobe = seg[11]
        elif marker == 0xDD and len(seg) >= 2:
            restart = int.from_bytes(seg[:2], "big")
        elif marker in _SOF_FAST or marker in _SOF_OTHER:
            if len(seg) < 6:
                raise BadImage("corrupt JPEG header (short frame header)")
            frame = (marker, seg)
    if frame is None:
        raise BadImage("corrupt JPEG header (no frame header)")
    if not scan:  # cut off inside its header, or an end-of-image marker before any scan
        raise BadImage("corrupt JPEG header (no scan: truncated)")
    marker, seg = frame
    comps = seg[5]
    specs = [seg[6 + 3 * i:9 + 3 * i] for i in range(comps) if len(seg) >= 9 + 3 * i]
    ids = bytes(c[0] for c in specs)
    if comps == 1:
        ycc_or_gray = True
    elif comps == 3:
        ycc_or_gray = jfif or (adobe != 0 if adobe is not None else ids != b"RGB")
    else:
        ycc_or_gray = False
    return JpegInfo(int.from_bytes(seg[1:3], "big"), int.from_bytes(seg[3:5], "big"),
                    orientation, marker, seg[0], comps, ycc_or_gray,
                    max((c[1] >> 4 for c in specs), default=1),
                    max((c[1] & 15 for c in specs), default=1), restart)


def _check_size(data: bytes, limits: DecodeLimits) -> None:
    if not data:
        raise BadImage("empty file")
    if len(data) > limits.max_bytes:
        raise too_large(len(data), limits.max_bytes)


def _check_pixels(height: int, width: int, limits: DecodeLimits) -> None:
    if height <= 0 or width <= 0:
        raise BadImage(f"invalid image size {width}x{height}")
    if height * width > limits.max_pixels:
        raise BadImage(f"too many pixels ({width}x{height} > limit {limits.max_pixels:,}); "
                       "a decompression bomb or a huge scan")


def _to_rgb8(im: Image.Image) -> np.ndarray:
    """Any Pillow mode -> H x W x 3 uint8 (16-bit data scaled, not clipped)."""
    if im.mode in ("I;16", "I;16B", "I;16L", "I;16N"):
        a = np.asarray(im).astype(np.uint16) >> 8
        return np.repeat(a.astype(np.uint8)[:, :, None], 3, axis=2)
    if im.mode == "I":  # 32-bit integer: 16-bit PNGs arrive so in some Pillow versions
        a = np.asarray(im, dtype=np.int64)
        a = (a >> 8) if a.max(initial=0) > 255 else a
        return np.repeat(np.clip(a, 0, 255).astype(np.uint8)[:, :, None], 3, axis=2)
    if im.mode == "F":
        a = np.asarray(im, dtype=np.float32)
        return np.repeat(np.clip(a, 0, 255).astype(np.uint8)[:, :, None], 3, axis=2)
    if im.mode != "RGB":
        im = im.convert("RGB")
    return np.asarray(im)


def _pillow_decode(data: bytes, limits: DecodeLimits, min_size: tuple[int, int] | None = None
                   ) -> np.ndarray:
    try:
        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size
            _check_pixels(h, w, limits)
            if min_size and im.format == "JPEG":
                im.draft("RGB", (min_size[1], min_size[0]))  # DCT scaling, >= requested size
            im = ImageOps.exif_transpose(im)
            return np.ascontiguousarray(_to_rgb8(im))
    except BadImage:
        raise
    except Exception as exc:  # Pillow's plugins raise many types; every one means a bad file
        raise _pillow_failure(exc, "data") from None


def _pillow_failure(exc: Exception, part: str) -> BadImage:
    """One reason per kind of Pillow failure, for the header reader and the decoder alike.
    A decompression bomb (more pixels than Pillow's own guard, which fires before dlperf's
    DecodeLimits.max_pixels can look at the size) is a bad file, not a crash (issue #10)."""
    if isinstance(exc, Image.DecompressionBombError):
        return BadImage(f"too many pixels ({exc}); a decompression bomb or a huge scan")
    if isinstance(exc, UnidentifiedImageError):
        return BadImage("not an image (unrecognised format)")
    if isinstance(exc, MemoryError):
        return BadImage("too large to decode (out of memory)")
    return BadImage(f"corrupt or truncated image {part} ({type(exc).__name__}: {exc})")


def decode_reference(data: bytes, limits: DecodeLimits = DecodeLimits()) -> np.ndarray:
    """The slow, obvious decoder: Pillow, EXIF orientation applied, full size, RGB uint8."""
    _check_size(data, limits)
    return _pillow_decode(data, limits)


def image_header(data: bytes, limits: DecodeLimits = DecodeLimits()):
    """(upright height, upright width, orientation, fast) without decoding the pixels.

    ``fast`` is True for a YCbCr/gray baseline or progressive JPEG, which the ROI decoder,
    simplejpeg and nvJPEG decode directly; otherwise Pillow decodes it. The header is read by
    jpeg_info (in C with the extension), else by simplejpeg: the same answers (tested).
    """
    _check_size(data, limits)
    if data[:3] == JPEG_MAGIC:
        if simplejpeg is not None and not ROI_AVAILABLE:
            try:
                h, w, colorspace, _ = simplejpeg.decode_jpeg_header(data)
            except ValueError as exc:
                raise BadImage(f"corrupt JPEG header ({exc})") from None
            orientation, fast = exif_orientation(data), colorspace in ("YCbCr", "Gray")
        else:
            info = jpeg_info(data)
            h, w, orientation, fast = info.height, info.width, info.orientation, info.fast
        _check_pixels(h, w, limits)
        if orientation >= 5:
            h, w = w, h
        return h, w, orientation, fast
    try:
        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size
            _check_pixels(h, w, limits)
            orientation = im.getexif().get(0x0112, 1) if hasattr(im, "getexif") else 1
    except BadImage:
        raise
    except Exception as exc:  # Pillow's plugins raise many types; every one means a bad file
        raise _pillow_failure(exc, "header") from None
    if orientation in (5, 6, 7, 8):
        h, w = w, h
    return h, w, orientation, False


def dct_scale_eighths(ratio: float) -> int:
    """The DCT scale n/8 (n in 1, 2, 4, 8) to decode at so the image is >= ``ratio`` x its size.

    Only powers of two: libjpeg-turbo has SIMD IDCTs for 8x8 and the reduced 4x4/2x2/1x1 sizes,
    while 3/8, 5/8, 6/8 and 7/8 go through generic C IDCTs (and scaled chroma): 5/8-7/8 cost
    more than decoding at full size, 3/8 more than 4/8 (whole corpus images, one thread: 8/8
    1,202 us, 7/8 1,703, 6/8 1,484, 5/8 1,331, 4/8 1,075, 3/8 1,110; results/dct-scale.json).
    Decoding a bit larger and letting
    the resize shrink by up to 2x is also closer to an antialiased float reference
    (benchmarks/README.md, "DCT scale choice").
    """
    need = math.ceil(8 * ratio - 1e-9)
    for n in (1, 2, 4):
        if need <= n:
            return n
    return 8


def _decode_upright(data: bytes, height: int, width: int, orientation: int, fast: bool,
                    scale: float, limits: DecodeLimits) -> np.ndarray:
    """Decode at a DCT scale >= ``scale`` of the upright ``height`` x ``width``; upright RGB."""
    n = dct_scale_eighths(scale)
    min_h, min_w = max(1, -(-height * n // 8)), max(1, -(-width * n // 8))
    if orientation >= 5:  # stored transposed
        min_h, min_w = min_w, min_h
    if fast and simplejpeg is not None:
        try:
            img = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=limits.fast_idct,
                                         fastupsample=limits.fast_idct, min_height=min_h,
                                         min_width=min_w, strict=True)
        except ValueError as exc:
            raise BadImage(f"corrupt or truncated JPEG ({exc})") from None
        transform = _ORIENT.get(orientation)
        return transform(img) if transform else img
    return _pillow_decode(data, limits, (min_h, min_w))


def _has_eoi(data: bytes) -> bool:
    """An end-of-image marker near the end: the ROI decoder stops early and would not notice a
    truncated tail, so files without one take the full, strict decode instead."""
    return data.rfind(b"\xff\xd9", max(0, len(data) - 64)) >= 0


class Scratch:
    """Per-thread reusable buffer for the ROI decoder's rows (callers keep one per thread)."""

    def __init__(self):
        self.buf = np.empty(0, np.uint8)

    def get(self, nbytes: int) -> np.ndarray:
        if self.buf.size < nbytes:
            self.buf = np.empty(int(nbytes * 1.25), np.uint8)
        return self.buf


def lossless_restart(data: bytes, column_px: int = 32) -> bytes:
    """``data`` rewritten losslessly (same pixels) with restart markers that split every MCU row
    into intervals at most ``column_px`` wide, so the ROI decoder reads only the intervals under
    a crop (_jpegroi.c); unchanged where that does not apply: no C extension, not a JPEG, or not
    YCbCr/grayscale. Raises BadImage for corrupt data the rewrite would carry over."""
    if not ROI_AVAILABLE or data[:3] != JPEG_MAGIC:
        return data
    try:
        out = _jpegroi.transcode(data, column_px)
    except ValueError as exc:
        raise BadImage(f"corrupt JPEG data ({exc})") from None
    return data if out is None else out


def cut_to_plan(data: bytes, plan: CropPlan, orientation: int
                ) -> tuple[bytes, int, int, CropPlan] | None:
    """For decoders that cannot crop (nvJPEG): the part of ``data`` under a training crop as a
    JPEG of its own, cut in the compressed domain along restart intervals (_jpegroi.c), with its
    (height, width) and the plan moved into it; None where the file cannot be cut (no usable
    restart markers, EXIF-rotated, an eval plan, no C extension). Decoding the cut gives exactly
    the pixels of the full decode under it (tests/test_data_restart.py)."""
    if not ROI_AVAILABLE or orientation != 1 or plan.resize_to is not None:
        return None
    cut = _jpegroi.cut_region(data, plan.left, plan.top, plan.width, plan.height)
    if cut is None:
        return None
    part, rows, cols, height, width = cut
    return part, height, width, replace(plan, top=plan.top - rows, left=plan.left - cols)


def _decode_roi(data: bytes, plan: CropPlan, height: int, width: int, out_h: int, out_w: int,
                limits: DecodeLimits, scratch: Scratch) -> np.ndarray | None:
    """The crop at the DCT scale n/8 of dct_scale_eighths that keeps it >= the output (or at
    full size when the crop is smaller than the output); None for CMYK."""
    n = (dct_scale_eighths(min(1.0, max(out_h / plan.height, out_w / plan.width)))
         if limits.dct_scaling else 8)
    x0, y0 = plan.left * n // 8, plan.top * n // 8
    x1 = max(x0 + 1, -(-(plan.left + plan.width) * n // 8))
    y1 = max(y0 + 1, -(-(plan.top + plan.height) * n // 8))
    w, h = x1 - x0, y1 - y0
    buf = scratch.get(h * (w + 64) * 3)
    try:
        fast = 3 if limits.fast_idct else 0  # fast integer IDCT + plain chroma upsampling
        fast |= 0 if limits.restart_cut else 4  # bit 2: decode from the top, markers or not
        row_w, shift, w, h, _, _ = _jpegroi.decode_region(data, n, x0, y0, w, h, fast, buf)
    except ValueError as exc:
        if str(exc) == "cmyk":
            return None
        raise BadImage(f"corrupt or truncated JPEG ({exc})") from None
    return buf[:h * row_w * 3].reshape(h, row_w, 3)[:, shift:shift + w]


def decode_into(data: bytes, plan_for, out: np.ndarray, limits: DecodeLimits = DecodeLimits(),
                scratch: Scratch | None = None) -> CropPlan:
    """Decode ``data``, crop and resize per ``plan_for(height, width)`` into ``out`` (H x W x 3).

    Returns the plan used. Raises BadImage for any file that cannot be decoded.
    """
    height, width, orientation, fast = image_header(data, limits)
    plan = plan_for(height, width)
    out_h, out_w = out.shape[:2]
    if (ROI_AVAILABLE and limits.region and fast and orientation == 1
            and plan.resize_to is None and _has_eoi(data)):
        region = _decode_roi(data, plan, height, width, out_h, out_w, limits,
                             scratch or Scratch())
        if region is not None:
            _resize(region, out)
            if plan.flip:
                cv2.flip(out, 1, out)
            return plan
    if plan.resize_to is None:  # train: crop, then resize the crop to the output size
        scale = min(1.0, max(out_h / plan.height, out_w / plan.width))
    else:  # eval: resize the whole image, then crop
        scale = min(1.0, plan.resize_to[0] / height)
    if not limits.dct_scaling:
        scale = 1.0
    img = _decode_upright(data, height, width, orientation, fast, scale, limits)
    sy, sx = img.shape[0] / height, img.shape[1] / width
    if plan.resize_to is None:
        top, left = round(plan.top * sy), round(plan.left * sx)
        bottom = max(top + 1, round((plan.top + plan.height) * sy))
        right = max(left + 1, round((plan.left + plan.width) * sx))
        _resize(img[top:bottom, left:right], out)
    else:
        rh, rw = plan.resize_to
        resized = cv2.resize(img, (rw, rh), interpolation=_interp(img.shape[0] / rh))
        out[...] = resized[plan.top:plan.top + out_h, plan.left:plan.left + out_w]
    if plan.flip:
        cv2.flip(out, 1, out)
    return plan


def check_decodes(data: bytes, limits: DecodeLimits = DecodeLimits()) -> None:
    """Raise BadImage unless the whole of ``data`` decodes through the decoder training uses,
    with its refusals (`dlperf data verify` and `prepare` call it). The crop is the whole image
    and the output an eighth of its size, so JPEGs decode at DCT scale 1/8: every coefficient
    is entropy-decoded (where corruption shows) while the IDCT and resize cost little."""
    height, width, _, _ = image_header(data, limits)
    out = np.empty((max(1, height // 8), max(1, width // 8), 3), np.uint8)
    decode_into(data, lambda h, w: CropPlan(0, 0, h, w), out, limits)


def _interp(factor: float) -> int:
    # Shrinking by 2x or more needs area averaging against aliasing; after DCT scaling the
    # remaining factor is under 2, where bilinear stays within ~2 levels of an antialiased
    # reference (tests/test_data_decode.py) and is ~5x cheaper than INTER_AREA.
    return cv2.INTER_AREA if factor >= 2.0 else cv2.INTER_LINEAR


def _resize(src: np.ndarray, out: np.ndarray) -> None:
    h, w = out.shape[:2]
    if src.shape[0] == h and src.shape[1] == w:
        out[...] = src
        return
    factor = max(src.shape[0] / h, src.shape[1] / w)
    if not src.flags.c_contiguous and src.strides[1] < 0:  # negative strides: OpenCV copies
        src = np.ascontiguousarray(src)
    cv2.resize(src, (w, h), dst=out, interpolation=_interp(factor))
