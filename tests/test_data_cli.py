"""`dlperf data prepare | verify` and `dlperf bench data` end to end on generated data."""

import json
import tarfile

import pytest
import torch

from dlperf.cli import main
from dlperf.data.loader import Loader, LoaderConfig
from dlperf.data.sources import ShardSource, open_source
from imagegen import jpeg_bytes, make_folder, png_bytes, smooth_rgb


@pytest.fixture
def corpus(tmp_path):
    root = make_folder(tmp_path / "src", classes=2, per_class=5, size=(300, 400))
    (root / "class00" / "broken.JPEG").write_bytes(b"\xff\xd8\xff\xe0 garbage")
    (root / "class01" / "actually_png.JPEG").write_bytes(png_bytes(smooth_rgb(50, 60)))
    return root


def test_prepare_then_verify_then_load(corpus, tmp_path, capsys):
    dst = tmp_path / "shards"
    assert main(["data", "prepare", str(corpus), str(dst), "--shard-size", "8KB",
                 "--max-side", "256"]) == 0
    out = capsys.readouterr().out
    assert "skipped" in out and "broken.JPEG" in out
    src = ShardSource(dst)
    assert len(src) == 11 and src.classes == ["class00", "class01"]
    assert len(src.shards) > 1  # 8KB shards force several
    # webdataset naming, readable by plain tar; labels in KEY.cls
    with tarfile.open(dst / src.shards[0]) as tar:
        names = tar.getnames()
        assert names[0].endswith(".jpg") and names[1].endswith(".cls")
        assert tar.extractfile(names[1]).read().decode() in ("0", "1")
    # each shard has DALI's index beside it: "v1.2 N", then jpg/cls offset size name per line
    for shard in src.shards:
        lines = (dst / shard.replace(".tar", ".idx")).read_text().splitlines()
        assert lines[0].split()[0] == "v1.2" and int(lines[0].split()[1]) == len(lines) - 1
        assert lines[1].split()[0::4] == ["jpg", "cls"]
    # re-encoded to max side 256
    from dlperf.data.decode import image_header

    assert max(image_header(src.read(0))[:2]) == 256
    assert main(["data", "verify", str(dst)]) == 0
    assert "OK: 11 samples" in capsys.readouterr().out
    ld = Loader(open_source(dst), LoaderConfig(batch_size=4, size=64, threads=2, drop_last=False))
    total = sum(len(b) for b in ld)
    assert total == 11 and ld.report.bad_count == 0
    # refuse to overwrite
    assert main(["data", "prepare", str(corpus), str(dst)]) == 2
    assert "already holds a prepared dataset" in capsys.readouterr().err


def test_verify_finds_a_corrupted_shard(corpus, tmp_path, capsys):
    dst = tmp_path / "shards"
    assert main(["data", "prepare", str(corpus), str(dst)]) == 0
    src = ShardSource(dst)
    shard, offset, size = src.entry(3)[:3]
    path = dst / src.shards[shard]
    blob = bytearray(path.read_bytes())
    blob[offset + size // 3: offset + size // 3 + 2000] = b"\x00" * 2000  # wipe scan data
    blob[offset + size - 2: offset + size] = b"\x00\x00"  # and the end-of-image marker
    path.write_bytes(bytes(blob))
    capsys.readouterr()
    assert main(["data", "verify", str(dst)]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and src.name(3) in out



def test_verify_reports_a_truncated_shard_the_same_for_any_thread_count(corpus, tmp_path):
    from dlperf.data.prepare import verify

    dst = tmp_path / "shards"
    assert main(["data", "prepare", str(corpus), str(dst), "--shard-size", "8KB"]) == 0
    src = ShardSource(dst)
    last = dst / src.shards[-1]
    last.write_bytes(last.read_bytes()[:700])  # cut inside its first image
    reports = [verify(dst, threads=t)["problems"] for t in (1, 3)]
    assert reports[0] == reports[1] and reports[0]  # found, in the same order
    assert any("unreadable" in reason or "does not match" in reason for _, reason in reports[0])


def test_prepare_copies_jpegs_byte_for_byte_with_restart_px_0(corpus, tmp_path):
    dst = tmp_path / "raw"
    assert main(["data", "prepare", str(corpus), str(dst), "--restart-px", "0"]) == 0
    src = ShardSource(dst)
    originals = {p.read_bytes() for p in corpus.rglob("img*.JPEG")}
    copied = {src.read(i) for i in range(len(src))}
    assert originals <= copied  # every valid JPEG unchanged; the PNG re-encoded as JPEG
    assert len(copied - originals) == 1


def test_prepare_without_a_full_decode_still_refuses_damaged_jpegs(corpus, tmp_path):
    # The default path proves a JPEG by rewriting it (every coefficient entropy-decoded,
    # warnings refused) instead of decoding its pixels: a cut-off or damaged file is skipped.
    from dlperf.data.decode import ROI_AVAILABLE
    from dlperf.data.prepare import PrepareConfig, prepare

    good = jpeg_bytes(smooth_rgb(200, 240, seed=9))
    (corpus / "class00" / "cut.JPEG").write_bytes(good[:len(good) * 2 // 3])
    sos = good.index(b"\xff\xda")
    bad = bytearray(good)
    bad[sos + 100:sos + 300] = bytes(200)  # zeroed entropy data
    (corpus / "class01" / "zeroed.JPEG").write_bytes(bytes(bad))
    summary = prepare(corpus, tmp_path / "s", PrepareConfig())
    reasons = {name.rsplit("/", 1)[-1]: why for name, why in summary["bad"]}
    assert set(reasons) == {"broken.JPEG", "cut.JPEG", "zeroed.JPEG"}
    assert summary["samples"] == 11
    if ROI_AVAILABLE:  # all 10 valid JPEGs (the PNG is stored as it is: lossless)
        assert summary["restart_markers"] == 10


def test_prepare_keeps_every_jpeg_pixel_by_default(corpus, tmp_path):
    # The default lossless rewrite (restart markers) changes bytes, never pixels.
    from dlperf.data.decode import ROI_AVAILABLE, decode_reference

    dst = tmp_path / "lossless"
    assert main(["data", "prepare", str(corpus), str(dst)]) == 0
    src = ShardSource(dst)
    stored = [src.read(i) for i in range(len(src))]
    good = sorted(corpus.rglob("img*.JPEG"))  # the 10 valid JPEGs (+ broken, + a PNG)
    assert len(stored) == len(good) + 1  # + the PNG named .JPEG, stored byte for byte
    assert png_bytes(smooth_rgb(50, 60)) in stored
    decoded = {decode_reference(b).tobytes() for b in stored}
    assert all(decode_reference(p.read_bytes()).tobytes() in decoded for p in good)
    if ROI_AVAILABLE:  # rewritten: each JPEG has a DRI (define restart interval) segment
        assert all(b"\xff\xdd\x00\x04" in b for b in stored if b[:3] == b"\xff\xd8\xff")
        assert not any(b"\xff\xdd" in p.read_bytes() for p in good)


@pytest.mark.parametrize("argv,needle", [
    (["data", "prepare", "/nonexistent/dir", "/tmp/x"], "not a dataset"),
    (["data", "verify", "/nonexistent/dir"], "no shard index"),
    (["data", "prepare", "a", "b", "--shard-size", "lots"], "--shard-size 'lots'"),
    (["data"], "choose an action"),
    (["bench", "data", "/nonexistent/corpus"], "corpus folder not found"),
    # the results folder is checked before minutes of benchmarking, not after
    (["bench", "data", "/nonexistent/corpus", "--out", "/nonexistent/dir/r.json"],
     "folder /nonexistent/dir does not exist"),
])
def test_data_cli_errors_are_one_line(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


@pytest.mark.slow
def test_bench_data_writes_json_and_png(tmp_path, capsys):
    corpus = make_folder(tmp_path / "c", classes=2, per_class=8, size=(200, 260))
    out = tmp_path / "res" / "data.json"
    out.parent.mkdir()
    assert main(["bench", "data", str(corpus), "--rounds", "2", "--batch-size", "8",
                 "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    res = data["results"]
    assert {"torchvision", "dlperf_1_thread", "dlperf_2_threads"} <= set(res["img_per_s"])
    assert all(v > 0 for v in res["img_per_s"].values())
    assert sum(res["decode_paths"]["raw"].values()) == 16  # every file has a decode path
    if "cut" in res["decode_paths"]["prepared"]:  # with the C extension: all cut once prepared
        assert res["decode_paths"]["prepared"] == {"cut": 16}
    assert data["environment"]["torch"] == torch.__version__ and "git_commit" in data["environment"]
    assert out.with_suffix(".png").stat().st_size > 1000


@pytest.mark.slow
def test_bench_data_ladder_adds_one_speedup_per_rung(tmp_path, capsys):
    corpus = make_folder(tmp_path / "c", classes=2, per_class=6, size=(200, 260))
    out = tmp_path / "ladder.json"
    assert main(["bench", "data", str(corpus), "--ladder", "--rounds", "1", "--batch-size", "4",
                 "--out", str(out)]) == 0
    rungs = json.loads(out.read_text())["results"]["rungs"]
    assert len(rungs) == 7 and rungs[0]["vs_baseline"] == 1.0
    sw = [r["decode_switches"] for r in rungs]
    # each rung switches exactly one thing on (or changes the data / thread count)
    assert [(s["fast_idct"], s["dct_scaling"], s["region"]) for s in sw[:4]] == [
        (False, False, False), (True, False, False), (True, True, False), (True, True, True)]
    assert [r["data"] for r in rungs] == ["raw"] * 4 + ["restart", "prepared", "prepared"]
    assert [r["threads"] for r in rungs] == [1] * 6 + [2]
    assert all(r["img_per_s"] > 0 for r in rungs)
    for prev, r in zip(rungs, rungs[1:]):
        assert r["vs_previous"] == pytest.approx(r["img_per_s"] / prev["img_per_s"])
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert "+ region decode" in capsys.readouterr().out  # the table is printed


def test_prepare_output_does_not_depend_on_threads(corpus, tmp_path):
    for threads in ("1", "2"):
        assert main(["data", "prepare", str(corpus), str(tmp_path / threads), "--max-side", "128",
                     "--shard-size", "8KB", "--threads", threads]) == 0
    one, two = ShardSource(tmp_path / "1"), ShardSource(tmp_path / "2")
    assert one.shards == two.shards
    for name in one.shards:
        assert (tmp_path / "1" / name).read_bytes() == (tmp_path / "2" / name).read_bytes()
    assert [one.entry(i) for i in range(len(one))] == [two.entry(i) for i in range(len(two))]


def test_toy_dataset_then_tiny_training(tmp_path, capsys):
    assert main(["data", "toy", str(tmp_path / "toy"), "--per-class", "16"]) == 0
    assert "dlperf train --recipe tiny" in capsys.readouterr().out
    assert len(open_source(tmp_path / "toy" / "train")) == 64
    assert len(open_source(tmp_path / "toy" / "val")) == 16
    assert main(["data", "toy", str(tmp_path / "toy")]) == 2  # refuses a non-empty folder
    assert main(["train", "--recipe", "tiny", "--no-progress", f"data={tmp_path}/toy/train",
                 f"val_data={tmp_path}/toy/val", f"out_dir={tmp_path}/run", "epochs=3",
                 "batch_size=16", "threads=2"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["eval"]["top1"] > 0.9


def test_verify_checks_the_dali_index(corpus, tmp_path, capsys):
    dst = tmp_path / "shards"
    assert main(["data", "prepare", str(corpus), str(dst)]) == 0
    idx = dst / "shard-000000.idx"
    lines = idx.read_text().splitlines()
    parts = lines[1].split()
    parts[1] = str(int(parts[1]) + 512)  # the first image's offset, one tar block off
    idx.write_text("\n".join([lines[0], " ".join(parts), *lines[2:]]) + "\n")
    assert main(["data", "verify", str(dst)]) == 1
    assert "DALI index does not match" in capsys.readouterr().out


def _shard_truth(dst):
    src = ShardSource(dst)
    return {src.entry(i)[4]: (src.read(i), src.label(i)) for i in range(len(src))}


def test_shards_read_by_the_webdataset_library(corpus, tmp_path):
    wds = pytest.importorskip("webdataset")
    dst = tmp_path / "shards"
    assert main(["data", "prepare", str(corpus), str(dst), "--shard-size", "8KB"]) == 0
    truth = _shard_truth(dst)
    urls = [str(p) for p in sorted(dst.glob("shard-*.tar"))]
    seen = {}
    for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        image = sample.get("jpg", sample.get("png"))  # the PNG is stored as KEY.png
        seen[sample["__key__"]] = (image, int(sample["cls"]))
    assert seen == truth
    assert sum("png" in s for s in wds.WebDataset(urls, shardshuffle=False,
                                                     empty_check=False)) == 1


def test_shards_read_by_dali_with_our_index(corpus, tmp_path):
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, pipeline_def

    dst = tmp_path / "shards"
    assert main(["data", "prepare", str(corpus), str(dst), "--shard-size", "8KB"]) == 0
    truth = _shard_truth(dst)
    tars = sorted(dst.glob("shard-*.tar"))

    @pipeline_def(batch_size=len(truth), num_threads=1, device_id=None)
    def pipe():
        jpg, cls = fn.readers.webdataset(paths=[str(t) for t in tars],
                                         index_paths=[str(t.with_suffix(".idx")) for t in tars],
                                         ext=["jpg;png", "cls"], missing_component_behavior="error")
        return jpg, cls

    p = pipe()
    p.build()
    jpgs, labels = p.run()
    got = sorted((bytes(jpgs.at(i)), int(bytes(labels.at(i)).decode()))
                 for i in range(len(truth)))
    assert got == sorted(truth.values())


def test_ffcv_row_reads_every_sample_in_the_loader_layout(tmp_path):
    """bench data's optional FFCV competitor: its own .beton of the corpus, read back as uint8
    NHWC crops, every sample once per epoch (skipped where ffcv is not installed)."""
    pytest.importorskip("ffcv", reason="ffcv is not installed (optional competitor)")
    from dlperf.bench.data import DataBenchConfig, _beton_payload_mb, _ffcv

    corpus = make_folder(tmp_path / "c", classes=2, per_class=5, size=(120, 90))
    cfg = DataBenchConfig(data=str(corpus), batch_size=4, threads=2, size=64)
    beton = tmp_path / "c.beton"
    loader, n = _ffcv(cfg, str(corpus), beton, 64)
    assert n == 10
    batches = list(loader)
    assert sum(len(labels) for _, labels in batches) == 10
    images = batches[0][0]
    assert images.dtype == torch.uint8 and tuple(images.shape[1:]) == (64, 64, 3)
    labels = torch.cat([labels for _, labels in batches])
    assert sorted(labels.tolist()) == [0] * 5 + [1] * 5
    assert 0 < _beton_payload_mb(beton) < beton.stat().st_size / 1e6  # pages are padded


def test_names_with_brackets_print_as_written(tmp_path, capsys):
    # rich reads "[...]" as markup: a folder named "x[" + "/" + "]y" crashed inspect, prepare
    # and bench with a MarkupError ("closing tag '[/]' ... has nothing to close"), and
    # "[exp1]" vanished from printed paths; every console now prints strings literally
    root = make_folder(tmp_path / "runs[/]x", classes=2, per_class=3, size=(120, 160))
    (root / "class00" / "trunc[bold].JPEG").write_bytes(
        (root / "class00" / "img000.JPEG").read_bytes()[:600])
    dst = tmp_path / "[exp1]" / "shards"
    assert main(["data", "inspect", str(root)]) == 0
    assert f"{root}: decode paths" in " ".join(capsys.readouterr().out.split())
    assert main(["data", "prepare", str(root), str(dst)]) == 0
    out = capsys.readouterr().out
    assert f"to {dst}" in " ".join(out.split())  # "[exp1]" kept
    assert "skipped" in out and "trunc[bold].JPEG" in out
    assert main(["data", "verify", str(dst)]) == 0
    assert "OK: 6 samples" in capsys.readouterr().out
    # the benchmark compares pipelines on one set of images: a bad one stops it, named
    code = main(["bench", "data", str(root), "--rounds", "1", "--out", str(tmp_path / "b.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "trunc[bold].JPEG: corrupt JPEG" in err[0]


def test_the_restart_marker_copy_takes_the_images_the_readers_take(tmp_path):
    # bench data's restart-marker copy of a corpus: JPEGs rewritten, other images copied as
    # they are, other files (a README) left out as the folder readers leave them out; a
    # damaged JPEG stops it, named (it raised a BadImage traceback; a README did too)
    from dlperf.bench.data import lossless_copy
    from dlperf.data.decode import image_header
    from dlperf.errors import DlperfError

    root = make_folder(tmp_path / "c", classes=1, per_class=2, size=(64, 80))
    (root / "README.md").write_text("not an image")
    png = png_bytes(smooth_rgb(20, 30))
    (root / "class00" / "x.png").write_bytes(png)
    out = lossless_copy(str(root), tmp_path / "restart")
    assert not (out / "README.md").exists()
    assert (out / "class00" / "x.png").read_bytes() == png
    jpeg = (out / "class00" / "img000.JPEG").read_bytes()
    assert jpeg[:2] == b"\xff\xd8" and image_header(jpeg)[:2] == image_header(
        (root / "class00" / "img000.JPEG").read_bytes())[:2]
    whole = (root / "class00" / "img001.JPEG").read_bytes()
    (root / "class00" / "cut.JPEG").write_bytes(whole[:300])
    with pytest.raises(DlperfError, match="cut.JPEG: .*remove it"):
        lossless_copy(str(root), tmp_path / "restart2")
