"""`dlperf data corpus`: an ImageNet-like benchmark corpus any machine can make."""

import hashlib

import pytest
from PIL import Image, JpegImagePlugin

from dlperf.data.corpus import CorpusConfig, make_corpus
from dlperf.errors import DlperfError


def _digest(folder):
    h = hashlib.sha256()
    for f in sorted(folder.rglob("*.JPEG")):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def test_layout_format_and_determinism(tmp_path):
    cfg = CorpusConfig(images=12, classes=4, seed=3)
    summary = make_corpus(tmp_path / "a", cfg)
    files = sorted((tmp_path / "a").rglob("*.JPEG"))
    assert len(files) == 12 and len({f.parent for f in files}) == 4 and summary["images"] == 12
    for f in files:
        with Image.open(f) as im:  # baseline, 4:2:0, RGB: what the loader's fast path reads
            assert im.format == "JPEG" and im.mode == "RGB" and not im.info.get("progressive")
            assert JpegImagePlugin.get_sampling(im) == 2
            assert 430 * 0.6 <= min(im.size) and max(im.size) <= 670
    make_corpus(tmp_path / "b", cfg)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")  # same seed, same bytes
    make_corpus(tmp_path / "c", CorpusConfig(images=12, classes=4, seed=4))
    assert _digest(tmp_path / "a") != _digest(tmp_path / "c")
    with pytest.raises(DlperfError, match="not empty"):
        make_corpus(tmp_path / "a", cfg)


@pytest.mark.slow
def test_default_corpus_has_imagenet_like_statistics(tmp_path):
    # the corpus the saved results used: 320 files, 10 classes, mean 104 KB, 518x423
    s = make_corpus(tmp_path / "corpus")
    assert s["images"] == 320 and s["classes"] == 10
    assert 90e3 <= s["mean_bytes"] <= 120e3
    assert 480 <= s["mean_width"] <= 560 and 400 <= s["mean_height"] <= 470


def test_cli_corpus_is_what_the_loader_and_torchvision_read(tmp_path, capsys):
    import torchvision

    from dlperf.cli import main
    from dlperf.data.sources import FileSource

    dst = tmp_path / "corpus"
    assert main(["data", "corpus", str(dst), "--images", "8", "--classes", "2"]) == 0
    assert "Wrote 8 JPEGs in 2 classes" in capsys.readouterr().out
    assert len(FileSource.from_folder(dst)) == 8  # corpus.json at the root is not a sample
    assert len(torchvision.datasets.ImageFolder(str(dst))) == 8
    assert main(["data", "corpus", str(dst)]) == 2  # not empty: refused in one line
    assert "not empty" in capsys.readouterr().err


def test_default_corpus_is_made_once(tmp_path, monkeypatch):
    from dlperf.data import corpus as C

    monkeypatch.setenv("DLPERF_CACHE_DIR", str(tmp_path))
    calls = []
    real = C.make_corpus
    monkeypatch.setattr(C, "make_corpus",
                        lambda dst, cfg, progress=None: calls.append(1) or real(
                            dst, CorpusConfig(images=4, classes=2), progress))
    first = C.default_corpus()
    assert C.default_corpus() == first and len(calls) == 1
    assert (first / C.MARKER).exists() and not list(tmp_path.glob(".*.tmp"))
