"""Issue #10: the data path can be trusted. Each defect test names the defect it pins down and
failed on the code before the fix (the reproduction is in the issue); the corpus-wide tests at
the end guard the whole class (mutated files through every reader)."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dlperf.cli import main
from dlperf.data.decode import BadImage, decode_reference, image_header
from dlperf.data.loader import Loader, LoaderConfig
from dlperf.data.prepare import PrepareConfig, prepare, verify
from dlperf.data.sources import ShardSource, open_source
from dlperf.errors import DlperfError
from hostile import category15_gray, mutate, seed_jpegs
from imagegen import jpeg_bytes, make_folder, png_bytes, smooth_rgb

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def folder(tmp_path):
    return make_folder(tmp_path / "src", classes=2, per_class=5, size=(90, 120))


def _prepared(folder: Path, dst: Path, **cfg) -> ShardSource:
    prepare(folder, dst, PrepareConfig(**cfg))
    return ShardSource(dst)


def _flip(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(len(data))
        f.seek(offset)
        f.write(bytes(a ^ b for a, b in zip(old, data)))


# ---- verify: damaged bytes inside a shard --------------------------------------------------

@pytest.mark.parametrize("damage", [bytes([0x5A] * 16), b"\x01"], ids=["16-bytes", "one-bit"])
def test_verify_catches_bytes_changed_inside_a_jpeg(folder, tmp_path, capsys, damage):
    # Before: "OK: 10 samples, 0 problems" after 16 bytes (or one bit) inside a JPEG changed.
    dst = tmp_path / "shards"
    src = _prepared(folder, dst)
    shard, offset, size = src.entry(3)[:3]
    _flip(dst / src.shards[shard], offset + size // 2, damage)
    src.close()
    assert main(["data", "verify", str(dst)]) == 1
    out = capsys.readouterr().out
    assert f"{src.shards[shard]}:{src.entry(3)[4]}: checksum mismatch" in out
    assert "SHA-256 differs" in out
    # the loader checks the CRC only when asked; asked, the sample is skipped and named
    checked = ShardSource(dst, check_checksums=True)
    with pytest.raises(BadImage, match="checksum mismatch"):
        checked.read(3)
    ld = Loader(checked, LoaderConfig(batch_size=5, size=32, threads=2, drop_last=False,
                                      shuffle=False, max_bad_fraction=0.5))
    assert sum(len(b) for b in ld) == 9 and ld.report.bad_count == 1
    assert "checksum mismatch" in ld.report.bad[0][1]
    ShardSource(dst).read(3)  # not asked: no check, no cost


def test_verify_decodes_with_the_training_decoder(folder, tmp_path):
    # A JPEG whose damage Pillow tolerates (it decodes grey with a warning) is still found:
    # verify decodes with the strict decoder training uses. CRCs recomputed, so only decoding
    # can tell.
    dst = tmp_path / "shards"
    src = _prepared(folder, dst, restart_px=0)
    shard, offset, size = src.entry(0)[:3]
    data = bytearray(src.read(0))
    sos = data.index(b"\xff\xda")
    data[sos + 40:sos + 80] = bytes(40)
    with open(dst / src.shards[shard], "r+b") as f:
        f.seek(offset)
        f.write(data)
    index = json.loads((dst / "index.json").read_text())
    index["samples"][0][5] = zlib.crc32(bytes(data))
    index["shard_sha256"][shard] = __import__("hashlib").sha256(
        (dst / src.shards[shard]).read_bytes()).hexdigest()
    (dst / "index.json").write_text(json.dumps(index))
    decode_reference(bytes(data))  # Pillow alone would pass it
    problems = verify(dst)["problems"]
    assert len(problems) == 1 and problems[0][0].endswith(src.entry(0)[4])
    assert "corrupt" in problems[0][1]


# ---- prepare: all or nothing -----------------------------------------------------------------

def test_prepare_killed_then_rerun_with_another_shard_size_leaves_no_stale_shards(folder,
                                                                                   tmp_path):
    # Before: kill -9 mid-prepare, rerun with another --shard-size: 9 stale shards and a temp
    # file stayed, verify said OK, and webdataset globbing shard-*.tar read extra samples.
    dst = tmp_path / "shards"
    code = (f"import os, signal, sys; sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
            "from dlperf.data.prepare import PrepareConfig, prepare\n"
            "n = [0]\n"
            "def progress():\n"
            "    n[0] += 1\n"
            "    if n[0] == 6: os.kill(os.getpid(), signal.SIGKILL)\n"
            f"prepare({str(folder)!r}, {str(dst)!r}, PrepareConfig(shard_bytes=1024), progress)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True)
    assert done.returncode == -9
    assert not dst.exists()  # nothing under the destination's name
    leftovers = list(tmp_path.glob(".shards.prepare-*"))
    assert len(leftovers) == 1 and any(leftovers[0].glob("shard-*.tar"))
    summary = prepare(folder, dst, PrepareConfig(shard_bytes=64 << 10))
    assert not list(tmp_path.glob(".shards.prepare-*"))  # the dead run's staging is gone
    assert summary["samples"] == 10
    tars = sorted(dst.glob("shard-*.tar"))
    members = [m for t in tars for m in tarfile.open(t).getnames() if m.endswith(".jpg")]
    assert len(members) == 10  # what a glob reader sees is exactly the dataset
    assert sorted(p.name for p in dst.iterdir() if not p.name.startswith("shard-")) == [
        "index.json", "prepare-report.json"]
    assert verify(dst)["problems"] == []


def test_prepare_refuses_a_folder_holding_other_files(folder, tmp_path, capsys):
    # Before: prepare into a folder holding a user's shard-000000.tar overwrote it.
    dst = tmp_path / "mine"
    dst.mkdir()
    (dst / "shard-000000.tar").write_bytes(b"my precious data")
    assert main(["data", "prepare", str(folder), str(dst)]) == 2
    err = capsys.readouterr().err
    assert "not empty (shard-000000.tar)" in err and len(err.strip().splitlines()) == 1
    assert (dst / "shard-000000.tar").read_bytes() == b"my precious data"
    assert not list(tmp_path.glob(".mine.prepare-*"))


def test_prepare_again_with_the_same_settings_says_so(folder, tmp_path, capsys):
    dst = tmp_path / "shards"
    assert main(["data", "prepare", str(folder), str(dst)]) == 0
    before = {p.name: p.stat().st_mtime_ns for p in dst.iterdir()}
    capsys.readouterr()
    assert main(["data", "prepare", str(folder), str(dst), "--threads", "1"]) == 0
    assert "already holds this prepare" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in dst.iterdir()} == before
    assert main(["data", "prepare", str(folder), str(dst), "--restart-px", "0"]) == 2
    assert "already holds a prepared dataset" in capsys.readouterr().err


def test_verify_flags_files_the_index_does_not_name(folder, tmp_path):
    dst = tmp_path / "shards"
    _prepared(folder, dst)
    (dst / "shard-000009.tar").write_bytes(bytes(1024))
    (dst / ".shard-000000.tar.tmp").write_bytes(b"x")
    problems = verify(dst)["problems"]
    assert sorted(Path(p).name for p, _ in problems) == [".shard-000000.tar.tmp",
                                                          "shard-000009.tar"]
    assert all("not named by the index" in why for _, why in problems)


def test_disk_full_during_prepare_is_one_line_and_leaves_nothing(folder, tmp_path, capsys,
                                                                 monkeypatch):
    # Before: a traceback and a 3 MB temp file. ENOSPC is raised by the shard writer after
    # a few samples, as a full disk would.
    import errno

    from dlperf.data import prepare as P

    real, calls = P._ShardWriter._member, [0]

    def full(self, name, data):
        calls[0] += 1
        if calls[0] > 6:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, name, data)

    monkeypatch.setattr(P._ShardWriter, "_member", full)
    dst = tmp_path / "shards"
    assert main(["data", "prepare", str(folder), str(dst)]) == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "nothing was kept" in err
    assert len(err.strip().splitlines()) == 1
    assert not dst.exists() and not list(tmp_path.glob(".shards.prepare-*"))


# ---- every reader, the same limits and policy --------------------------------------------------

def _png_bomb(side: int = 30000) -> bytes:
    """A PNG header claiming side x side pixels (more than Pillow's own bomb guard, 2 x 89.5 MP),
    with a tiny, truncated data chunk: Image.open raises DecompressionBombError."""
    def chunk(kind, payload):
        body = kind + payload
        return struct.pack(">I", len(payload)) + body + struct.pack(">I", zlib.crc32(body))
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
            + chunk(b"IEND", b""))


def test_decompression_bomb_is_a_bad_file_everywhere(folder, tmp_path, capsys):
    # Before: PIL.Image.DecompressionBombError escaped image_header: dlperf train, data
    # inspect and val_data= died with a traceback.
    with pytest.raises(Image.DecompressionBombError):
        Image.open(io.BytesIO(_png_bomb())).size  # noqa: B018 - Pillow's own guard fires
    with pytest.raises(BadImage, match="too many pixels"):
        image_header(_png_bomb())
    (folder / "class00" / "bomb.png").write_bytes(_png_bomb())
    ld = Loader(open_source(folder), LoaderConfig(batch_size=4, size=32, threads=2,
                                                  drop_last=False, max_bad_fraction=0.2))
    assert sum(len(b) for b in ld) == 10 and ld.report.bad[0][0].endswith("bomb.png")
    ev = Loader(open_source(folder), LoaderConfig(batch_size=4, size=32, threads=2, train=False,
                                                  drop_last=False, max_bad_fraction=0.2))
    assert sum(len(b) for b in ev) == 10 and ev.report.bad_count == 1
    assert main(["data", "inspect", str(folder)]) == 0
    assert "1 files have no readable header" in capsys.readouterr().out.replace("\n", " ")
    summary = prepare(folder, tmp_path / "s")
    assert [Path(n).name for n, _ in summary["bad"]] == ["bomb.png"]


def test_train_reaches_the_bad_file_policy_from_the_command_line(tmp_path, capsys):
    from dlperf.data.toy import make_toy

    data = make_toy(tmp_path / "toy", per_class=4, classes=2, size=40)
    for i in range(2):
        (data / "c0" / f"bad{i}.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really")
    base = ["train", "--recipe", "tiny", f"data={data}", "num_classes=2", "epochs=1",
            "batch_size=2", f"out_dir={tmp_path / 'run'}", "device=cpu", "eval_every=1000"]
    assert main(base + ["max_bad_fraction=0.1"]) == 2
    err = capsys.readouterr().err
    assert "exceed max_bad_fraction=0.1" in err and "bad0.jpg" in err
    assert main(base + ["on_bad_file=raise", f"out_dir={tmp_path / 'run2'}"]) == 2
    assert "on_bad_file=skip" in capsys.readouterr().err


def test_csv_labels_out_of_range_are_refused_at_prepare(tmp_path, capsys):
    # Before: a negative label was stored and training crashed later with IndexError.
    (tmp_path / "a.jpg").write_bytes(jpeg_bytes(smooth_rgb(40, 40)))
    (tmp_path / "list.csv").write_text("path,label\n# a comment\na.jpg,0\na.jpg,-3\n")
    assert main(["data", "prepare", str(tmp_path / "list.csv"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "list.csv: line 4: label -3 must be in 0.." in err and not (tmp_path / "out").exists()
    (tmp_path / "list.csv").write_text("a.jpg,0\na.jpg,99999999999\n")
    with pytest.raises(DlperfError, match="line 2: label 99999999999"):
        open_source(tmp_path / "list.csv")


@pytest.mark.parametrize("edit, message", [
    (lambda rows: rows[2].__setitem__(0, 7), "sample 2 .*shard 7 is past the"),
    (lambda rows: rows[1].__setitem__(1, "1024"), "sample 1 .*must be integers"),
    (lambda rows: rows[0].pop(), "sample 0 .*needs 7 fields"),
    (lambda rows: rows[3].__setitem__(3, -1), "sample 3 .*label -1 is outside"),
])
def test_a_damaged_index_is_one_line_naming_the_entry(folder, tmp_path, capsys, edit, message):
    dst = tmp_path / "shards"
    _prepared(folder, dst)
    index = json.loads((dst / "index.json").read_text())
    edit(index["samples"])
    (dst / "index.json").write_text(json.dumps(index))
    with pytest.raises(DlperfError, match=message):
        ShardSource(dst)
    assert main(["data", "verify", str(dst)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "re-run `dlperf data prepare`" in err


def test_every_file_bad_names_the_source_and_the_first_reasons(tmp_path, capsys):
    # Before: "<FileSource object at 0x...>: no readable images" and no reasons.
    for c in ("a", "b"):
        (tmp_path / "src" / c).mkdir(parents=True)
        (tmp_path / "src" / c / "x.jpg").write_bytes(b"\xff\xd8\xff garbage")
    assert main(["data", "prepare", str(tmp_path / "src"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "object at 0x" not in err and str(tmp_path / "src") in err
    assert "x.jpg: corrupt JPEG header" in err
    assert not (tmp_path / "out").exists()


def test_non_jpeg_files_are_stored_losslessly_and_said_so(tmp_path):
    # Before: PNGs were re-encoded as JPEG (max pixel difference 119) without a word.
    rng = np.random.default_rng(0)
    noisy = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)  # JPEG would wreck this
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "n.png").write_bytes(png_bytes(noisy))
    buf = io.BytesIO()
    Image.fromarray(noisy).save(buf, format="BMP")
    (tmp_path / "src" / "a" / "n.bmp").write_bytes(buf.getvalue())
    summary = prepare(tmp_path / "src", tmp_path / "out")
    src = ShardSource(tmp_path / "out")
    stored = {src.member(i): src.read(i) for i in range(len(src))}
    assert sorted(stored) == ["00000000.png", "00000001.png"]
    assert png_bytes(noisy) in stored.values()  # byte for byte
    for data in stored.values():
        assert np.array_equal(decode_reference(data), noisy)  # pixel for pixel
    assert [(Path(n).name, why) for n, why in summary["changed"]] == [
        ("n.bmp", "stored as PNG (lossless)")]
    assert verify(tmp_path / "out")["problems"] == []


def test_a_file_baseline_cannot_rewrite_is_stored_as_it_is(tmp_path):
    # The double-free file decodes cleanly; only its rewrite with restart markers fails. It
    # is a good file: stored byte for byte, not refused, and prepare finishes.
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "c15.jpg").write_bytes(category15_gray())
    (tmp_path / "src" / "a" / "ok.jpg").write_bytes(jpeg_bytes(smooth_rgb(64, 64)))
    summary = prepare(tmp_path / "src", tmp_path / "out")
    assert summary["bad"] == [] and summary["samples"] == 2
    assert category15_gray() in [ShardSource(tmp_path / "out").read(i) for i in range(2)]


# ---- the hidden-corpus scenario: mutated JPEGs mixed with good photos -----------------------

def test_mutated_corpus_through_prepare_verify_and_loader(tmp_path):
    """No signal, no traceback; every good photo stored; every bad file named with a reason.
    Run in a child process so a crash (SIGSEGV/SIGABRT) fails the test rather than the run."""
    rng = np.random.default_rng(10)
    good, bad = {}, {}
    (tmp_path / "src" / "good").mkdir(parents=True)
    (tmp_path / "src" / "mixed").mkdir(parents=True)
    for i in range(12):
        data = jpeg_bytes(smooth_rgb(int(rng.integers(60, 200)), int(rng.integers(60, 200)),
                                     seed=i), subsampling=int(rng.integers(0, 3)))
        good[f"good/g{i:02d}.jpg"] = data
    seeds = list(seed_jpegs().values())
    for i in range(60):
        bad[f"mixed/m{i:02d}.jpg"] = mutate(seeds[i % len(seeds)], rng)
    for name, data in {**good, **bad}.items():
        (tmp_path / "src" / name).write_bytes(data)
    code = f"""
import json, sys
sys.path.insert(0, {str(ROOT / 'tests')!r})
from dlperf.data.prepare import prepare, verify
from dlperf.data.loader import Loader, LoaderConfig
from dlperf.data.sources import open_source
src, out = {str(tmp_path / 'src')!r}, {str(tmp_path / 'out')!r}
summary = prepare(src, out)
checked = verify(out)
raw = Loader(open_source(src), LoaderConfig(batch_size=8, size=32, threads=2, drop_last=False,
                                            max_bad_fraction=1.0))
n_raw = sum(len(b) for b in raw)
shards = Loader(open_source(out), LoaderConfig(batch_size=8, size=32, threads=2,
                                               drop_last=False))
n_shards = sum(len(b) for b in shards)
print(json.dumps(dict(samples=summary["samples"], bad=summary["bad"], problems=checked["problems"],
                      n_raw=n_raw, raw_bad=raw.report.bad_count, n_shards=n_shards,
                      shard_bad=shards.report.bad_count)))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    r = json.loads(done.stdout.strip().splitlines()[-1])
    refused = {Path(n).relative_to(tmp_path / "src").as_posix(): why for n, why in r["bad"]}
    assert not set(refused) & set(good)  # every good photo stored
    assert all(why for why in refused.values())  # every refusal has a reason
    assert r["samples"] == 72 - len(refused) and len(refused) >= 20
    assert r["problems"] == []  # what prepare stored verifies
    assert r["n_shards"] == r["samples"] and r["shard_bad"] == 0  # and trains without a skip
    assert r["n_raw"] + r["raw_bad"] == 72  # the raw folder: every file decoded or named


def test_shards_from_before_checksums_still_read_and_verify_with_a_note(folder, tmp_path):
    # An index written by dlperf before issue #10 (format v1: five fields, no digests) keeps
    # working; verify says it cannot check bytes by checksum and still decodes everything.
    dst = tmp_path / "shards"
    _prepared(folder, dst)
    index = json.loads((dst / "index.json").read_text())
    index["format"] = "dlperf-shards-v1"
    index["samples"] = [row[:5] for row in index["samples"]]
    del index["shard_sha256"]
    (dst / "index.json").write_text(json.dumps(index))
    src = ShardSource(dst)
    assert not src.has_checksums and src.crc32(0) is None and src.member(0) == "00000000.jpg"
    result = verify(dst)
    assert result["problems"] == [] and "has no checksums" in result["notes"][0]
    with pytest.raises(DlperfError, match="check_checksums=true needs shards with checksums"):
        from dlperf.train.inputs import open_checked
        open_checked(str(dst), True, "data")


def test_max_side_prepare_does_not_bake_damage_into_a_clean_file(tmp_path):
    # --max-side decodes with Pillow to shrink; Pillow decodes damaged entropy data as grey
    # with only a warning, and the re-encoded result would then verify clean. The strict
    # decoder sees the file first.
    good = jpeg_bytes(smooth_rgb(300, 400, seed=2))
    bad = bytearray(good)
    sos = bad.index(b"\xff\xda")
    bad[sos + 40:sos + 80] = bytes(40)
    decode_reference(bytes(bad))  # Pillow alone accepts it
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "good.jpg").write_bytes(good)
    (tmp_path / "src" / "a" / "damaged.jpg").write_bytes(bytes(bad))
    summary = prepare(tmp_path / "src", tmp_path / "out", PrepareConfig(max_side=128))
    assert [Path(n).name for n, _ in summary["bad"]] == ["damaged.jpg"]
    assert summary["samples"] == 1


def test_every_python_reader_answers_damage_with_bad_image_only():
    """The Python side of the no-traceback promise: on 1,500 damaged files (1-3 mutations of
    every seed layout, PNG included), each reader the loaders, prepare, verify and inspect use
    either succeeds or raises BadImage, which the skip-and-report policy handles; any other
    exception would be a traceback in `dlperf train`. (Development runs: 32k files, none.)"""
    from dlperf.data import decode as D
    from dlperf.data.augment import (EvalAugment, TrainAugment, center_crop_plan,
                                     random_resized_crop, sample_rng)
    from dlperf.data.inspect import decode_path

    seeds = list(seed_jpegs().values()) + [png_bytes(smooth_rgb(30, 40))]
    rng = np.random.default_rng(2)
    out = np.empty((32, 32, 3), np.uint8)
    others = []
    for n in range(1500):
        data = seeds[n % len(seeds)]
        for _ in range(int(rng.integers(1, 4))):
            data = mutate(data, rng)
        calls = {
            "header": lambda: D.image_header(data),
            "train": lambda: D.decode_into(data, lambda h, w: random_resized_crop(
                h, w, TrainAugment(32), sample_rng(0, 0, n)), out),
            "eval": lambda: D.decode_into(data, lambda h, w: center_crop_plan(
                h, w, EvalAugment(32)), out),
            "check": lambda: D.check_decodes(data),
            "inspect": lambda: decode_path(data),
            "rewrite": lambda: D.lossless_restart(data, 16),
        }
        for name, call in calls.items():
            try:
                call()
            except BadImage:
                pass
            except Exception as exc:  # noqa: BLE001 - exactly what this test looks for
                others.append((n, name, repr(exc)[:120]))
    assert others == []


def test_a_missing_extension_is_said_not_silent(folder, tmp_path, capsys, monkeypatch):
    # Before: no compiler or libjpeg headers at install gave a 1.4-2x slower pipeline and
    # shards without restart markers, without a word.
    import dlperf.data.native as N

    monkeypatch.setattr(N, "ROI_AVAILABLE", False)
    for argv in (["data", "inspect", str(folder)],
                 ["data", "prepare", str(folder), str(tmp_path / "out")]):
        assert main(argv) == 0
        assert "JPEG extension is not built" in capsys.readouterr().out.replace("\n", " ")
    assert N.main() == 0 and "WARNING: dlperf's JPEG extension is not built" in \
        capsys.readouterr().err
    monkeypatch.setattr(N, "ROI_AVAILABLE", True)
    assert N.main() == 0 and "built" in capsys.readouterr().out


def test_prepare_into_the_current_empty_folder(folder, tmp_path, monkeypatch):
    # "." has no name and is its own parent: the staging folder must go beside the real one
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    assert prepare(folder, ".")["samples"] == 10
    assert sorted(p.name for p in (tmp_path / "here").iterdir() if not p.name.startswith(
        "shard-")) == ["index.json", "prepare-report.json"]
    assert not list(tmp_path.glob(".*prepare-*"))
