"""`dlperf data inspect`: each file's decode path from its header alone, and the advice."""

import io
import json

import numpy as np
import pytest
from PIL import Image

from dlperf.cli import main
from dlperf.data import decode as D
from dlperf.data.decode import ROI_AVAILABLE, jpeg_info, lossless_restart
from dlperf.data.inspect import InspectConfig, advice, decode_path, inspect
from dlperf.data.sources import open_source
from imagegen import (cmyk_jpeg_bytes, exif_jpeg_bytes, jpeg_bytes, make_folder, png_bytes,
                      smooth_rgb)

ARR = smooth_rgb(301, 397, seed=5)  # 25 MCUs of 16 px per row at 4:2:0


def _rgb_coded() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(ARR).save(buf, format="JPEG", keep_rgb=True)
    return buf.getvalue()


@pytest.mark.skipif(not D.ROI_AVAILABLE, reason="C extension not built")
def test_each_kind_of_file_gets_the_path_the_loader_takes():
    plain = jpeg_bytes(ARR)
    files = {
        "plain": (plain, "roi"), "rewritten": (lossless_restart(plain), "cut"),
        "progressive": (jpeg_bytes(ARR, progressive=True), "progressive"),
        "rotated": (exif_jpeg_bytes(ARR, 6), "rotated"),
        "cmyk": (cmyk_jpeg_bytes(ARR), "pillow"), "rgb": (_rgb_coded(), "pillow"),
        "png": (png_bytes(ARR), "pillow"), "garbage": (b"\xff\xd8\xff\xe0 junk", "bad"),
        "7 MCUs": (jpeg_bytes(ARR, restart_marker_blocks=7), "roi"),  # 7 does not divide 25
        "5 MCUs": (jpeg_bytes(ARR, restart_marker_blocks=5), "cut"),
        "2 rows": (jpeg_bytes(ARR, restart_marker_rows=2), "cut"),
    }
    for name, (data, want) in files.items():
        assert decode_path(data)[0] == want, name
    assert decode_path(plain)[1:] == (301, 397)
    assert decode_path(files["rotated"][0])[1:] == (397, 301)  # upright


@pytest.mark.skipif(not D.ROI_AVAILABLE, reason="C extension not built")
@pytest.mark.parametrize("kwargs", [dict(), dict(restart_marker_blocks=7),
                                    dict(restart_marker_blocks=5), dict(restart_marker_rows=3),
                                    dict(subsampling=0, restart_marker_blocks=10),
                                    dict(subsampling=1, restart_marker_blocks=25)])
def test_cuttable_agrees_with_the_c_decoder(kwargs):
    # The header reader's verdict against what the C decoder actually does with a region in
    # the bottom-right part of the image.
    data = jpeg_bytes(ARR, **kwargs)
    info = jpeg_info(data)
    assert (info.height, info.width, info.components) == (301, 397, 3)
    buf = np.empty(200 * 264 * 3, np.uint8)
    *_, rows, cols = D._jpegroi.decode_region(data, 8, 250, 200, 100, 90, 3, buf)
    assert info.cuttable == (rows + cols > 0), (info, rows, cols)


def test_inspect_counts_a_folder_and_its_prepared_shards(tmp_path):
    from dlperf.data.prepare import prepare

    root = make_folder(tmp_path / "src", classes=2, per_class=4, size=(120, 160))
    (root / "class00" / "cmyk.JPEG").write_bytes(cmyk_jpeg_bytes(smooth_rgb(60, 80)))
    (root / "class01" / "png.JPEG").write_bytes(png_bytes(smooth_rgb(60, 80)))
    (root / "class01" / "broken.JPEG").write_bytes(b"\xff\xd8\xff\xe0 garbage")
    report = inspect(open_source(root))
    fast = "roi" if D.ROI_AVAILABLE else "whole"
    assert report["samples"] == 11
    assert report["paths"][fast] == 8 and report["paths"]["pillow"] == 2
    assert report["paths"]["bad"] == 1 and report["example"]["bad"].endswith("broken.JPEG")
    assert any("dlperf data prepare SRC DST" in line for line in report["advice"])
    prepare(root, tmp_path / "shards")
    shards = inspect(open_source(tmp_path / "shards"), InspectConfig(limit=5))
    assert shards["samples"] == 5
    if D.ROI_AVAILABLE:  # the 8 JPEGs are now cut; the CMYK and the PNG (lossless) stay
        full = inspect(open_source(tmp_path / "shards"))["paths"]
        assert (full["cut"], full["pillow"], full["roi"]) == (8, 2, 0)


def test_advice_for_big_images_and_a_clean_dataset():
    base = {"samples": 100, "paths": {p: 0 for p in ("cut", "roi", "whole", "progressive",
                                                     "rotated", "pillow", "bad")},
            "example": {}, "crop_size": 224, "median_short_side": 375,
            "median_megapixels": 0.19}
    base["paths"]["cut"] = 100
    assert advice(base) == []
    big = dict(base, median_short_side=2000, median_megapixels=6.0)
    # 6 MP against a 448 px long side at 4:3 (448 x 336 = 0.15 MP): ~40x fewer pixels
    assert any("--max-side 448" in line and "40x" in line for line in advice(big))


def test_cli_inspect_writes_json(tmp_path, capsys):
    root = make_folder(tmp_path / "src", classes=2, per_class=3)
    out = tmp_path / "report.json"
    assert main(["data", "inspect", str(root), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["samples"] == 6 and sum(report["paths"].values()) == 6
    assert "decode paths of 6 samples" in capsys.readouterr().out
    assert main(["data", "inspect", str(tmp_path / "nothing")]) == 2


def test_header_reader_survives_damaged_headers():
    # Random damage to the first bytes (where the markers are) ends in a JpegInfo or BadImage,
    # never another exception or a hang.
    import random

    from dlperf.data.decode import BadImage, JpegInfo

    good = exif_jpeg_bytes(ARR, 6)[:2048]
    rng = random.Random(3)
    for _ in range(3000):
        bad = bytearray(good)
        for _ in range(rng.randrange(1, 8)):
            bad[rng.randrange(2, len(bad))] = rng.choice([0xFF, 0x00, 0xC0, 0xDD, 0xDA,
                                                          rng.randrange(256)])
        try:
            assert isinstance(jpeg_info(bytes(bad[:rng.randrange(4, len(bad))])), JpegInfo)
        except BadImage:
            pass


def _big_endian_exif_jpeg(orientation: int) -> bytes:
    """A JPEG whose EXIF block is Motorola (MM) byte order, with two IFD entries."""
    import struct

    ifd = struct.pack(">H", 2) + struct.pack(">HHIHH", 0x010F, 2, 4, 0x4142, 0) + struct.pack(
        ">HHIHH", 0x0112, 3, 1, orientation, 0) + struct.pack(">I", 0)
    tiff = b"MM\x00\x2a" + struct.pack(">I", 8) + ifd
    app1 = b"Exif\x00\x00" + tiff
    data = jpeg_bytes(ARR)
    return data[:2] + b"\xff\xe1" + struct.pack(">H", len(app1) + 2) + app1 + data[2:]


@pytest.mark.skipif(not ROI_AVAILABLE, reason="C extension not built")
def test_c_header_reader_agrees_with_the_python_reference():
    """The C jpeg_info (the loader's hot path) against _jpeg_info_py on the file kinds and on
    thousands of damaged headers: the same JpegInfo, or both refuse with the same reason."""
    import random

    from dlperf.data import decode as D

    def both(data):
        try:
            c = D.jpeg_info(data)
        except D.BadImage as exc:
            c = str(exc)
        try:
            py = D._jpeg_info_py(data)
        except D.BadImage as exc:
            py = str(exc)
        assert c == py, (c, py, bytes(data[:64]))
        return c

    kinds = [jpeg_bytes(ARR), jpeg_bytes(ARR, progressive=True), jpeg_bytes(ARR[..., 0]),
             jpeg_bytes(ARR, subsampling=0), exif_jpeg_bytes(ARR, 6), cmyk_jpeg_bytes(ARR),
             lossless_restart(jpeg_bytes(ARR)), _big_endian_exif_jpeg(8)]
    infos = [both(k) for k in kinds]
    assert infos[-1].orientation == 8 and infos[4].orientation == 6  # MM and II EXIF
    assert infos[6].restart_interval > 0 and not infos[5].ycc_or_gray
    rng = random.Random(11)
    for _ in range(4000):
        bad = bytearray(rng.choice(kinds)[:1500])
        for _ in range(rng.randrange(1, 8)):
            bad[rng.randrange(2, len(bad))] = rng.choice(
                [0xFF, 0x00, 0x01, 0xC0, 0xC2, 0xC3, 0xDD, 0xDA, 0xE0, 0xE1, 0xEE, 0x12,
                 rng.randrange(256)])
        both(bytes(bad[:rng.randrange(2, len(bad))]))
