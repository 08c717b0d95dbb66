"""Folder -> tar shards (+ index) and shard verification: `dlperf data prepare | verify`.

Shards use webdataset naming (``KEY.jpg`` then ``KEY.cls`` with the label as text), so
webdataset and DALI's readers take them as they are (both tested); beside each shard, a DALI
index (``shard-N.idx``, the format of DALI's wds2idx) lets ``fn.readers.webdataset`` open it
without scanning, and dlperf's ``index.json`` adds each image's byte offset so any sample is one
pread. With ``max_side`` every image is decoded (EXIF applied),
shrunk so its longer side is at most ``max_side`` and re-encoded at ``quality``: decoding a
256-512 px image is several times cheaper than a full-size photo (FFCV's trick). Without it, JPEGs
keep their pixels exactly (after a full test decode); other formats are re-encoded as JPEG.

Every stored JPEG is then rewritten losslessly (``restart_px``, default 32; same DCT
coefficients, so every decoder returns the same pixels): baseline sequential, optimised Huffman
tables, and restart markers that split every MCU row into intervals at most ``restart_px`` wide.
The ROI decoder then reads only the intervals under a random crop instead of Huffman-decoding
every row above it and every column beside it, most of a training crop's decode cost
(benchmarks/README.md, "Restart markers"). ``restart_px=0`` stores JPEGs byte for byte; without
the C extension they are stored as they are too.

Non-JPEG files are stored losslessly (issue #10): PNGs byte for byte (``KEY.png``), other formats
(BMP, TIFF, GIF, WebP, PPM) as the PNG of the pixels the loader would decode from them, said per
file in the report. ``max_side`` re-encodes everything as JPEG at ``quality``, as asked.

Every stored sample is proven first by the decoder training uses (whole image, with its
refusals), and the index records a CRC-32 per sample and a SHA-256 per shard; `verify` checks
both, decodes every sample the same way and flags files the index does not name.

All or nothing: everything is written into a staging folder beside ``dst`` (``.DST.prepare-PID``,
locked while its prepare runs) and renamed to ``dst`` only when complete, so a crash, kill -9,
Ctrl-C or full disk leaves no shard that a later run or a ``shard-*.tar`` glob could mistake for
part of a dataset; the next prepare removes a dead run's staging folder. ``dst`` must be new or
empty, or hold a complete prepare of the same source with the same settings (then nothing is
redone, and the result says so).

One module of ~550 lines because prepare and verify are two readings of one format (the tar
members, index.json, DALI's .idx, the checksums): kept together, a change to the format cannot
reach one without the other.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import tarfile
import time
import zlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import cv2
import numpy as np

from dlperf.data.decode import (JPEG_MAGIC, ROI_AVAILABLE, BadImage, DecodeLimits,
                                check_decodes, decode_reference, image_header, lossless_restart,
                                use_single_threaded_opencv)
from dlperf.data.sources import INDEX_FORMAT, INDEX_NAME, ShardSource, Source, open_source
from dlperf.errors import DlperfError
from dlperf.files import write_json_atomic, write_text_atomic

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REPORT_NAME = "prepare-report.json"


@dataclass(frozen=True)
class PrepareConfig:
    shard_bytes: int = 1 << 30
    max_side: int | None = None
    quality: int = 90
    threads: int = 0  # 0: every CPU this process may use
    restart_px: int = 32  # lossless rewrite, restart intervals at most this wide; 0: as is
    limits: DecodeLimits = DecodeLimits()

    def __post_init__(self):
        if self.shard_bytes < 1 << 10:
            raise DlperfError(f"--shard-size must be at least 1KB, got {self.shard_bytes}")
        if self.max_side is not None and self.max_side < 16:
            raise DlperfError(f"--max-side must be at least 16, got {self.max_side}")
        if not 1 <= self.quality <= 100:
            raise DlperfError(f"--quality must be in 1..100, got {self.quality}")
        if self.restart_px < 0:
            raise DlperfError(f"--restart-px must be >= 0 (0: store JPEGs as they are), got "
                              f"{self.restart_px}")


def parse_size(text: str) -> int:
    """'1GB', '512MB', '64k', '1000000' -> bytes (binary multiples)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    try:
        if t and t[-1] in mult:
            value = float(t[:-1]) * mult[t[-1]]
            if not value < 1 << 50:  # inf, nan and sizes no disk holds
                raise OverflowError
            return int(value)
        return int(t)
    except (ValueError, OverflowError):
        raise DlperfError(f"--shard-size {text!r}: give a size like 1GB or 512MB (below "
                          "1 PB)") from None


def _encode(img: np.ndarray, quality: int) -> bytes:
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(img, cv2.COLOR_RGB2BGR),
                           [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise BadImage("re-encoding failed")
    return buf.tobytes()


def _encode_png(img: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".png", cv2.cvtColor(img, cv2.COLOR_RGB2BGR),
                           [cv2.IMWRITE_PNG_COMPRESSION, 3])
    if not ok:
        raise BadImage("PNG encoding failed")
    return buf.tobytes()


@dataclass(frozen=True)
class _Prepared:
    data: bytes
    ext: str  # "jpg" | "png": the tar member's extension (webdataset naming)
    marked: bool  # carries restart markers from the lossless rewrite
    note: str | None = None  # what was changed, for the report (None: stored as given)


def _prepare_one(data: bytes, cfg: PrepareConfig) -> _Prepared:
    """The bytes to store for one file, proven decodable by the decoder training uses."""
    is_jpeg = data[:3] == JPEG_MAGIC
    if cfg.max_side:  # re-encode smaller, as asked
        # the strict decoder first: Pillow decodes damaged entropy data as grey with only a
        # warning, and re-encoding would bake that damage into a file that then verifies
        check_decodes(data, cfg.limits)
        img = decode_reference(data, cfg.limits)
        note = None  # shrinking and re-encoding is the change --max-side asked for
        if max(img.shape[:2]) > cfg.max_side:
            s = cfg.max_side / max(img.shape[:2])
            size = (max(1, round(img.shape[1] * s)), max(1, round(img.shape[0] * s)))
            img = cv2.resize(img, size, interpolation=cv2.INTER_AREA)
            data = _encode(img, cfg.quality)
        elif not is_jpeg:
            data, note = _encode(img, cfg.quality), f"re-encoded as JPEG q{cfg.quality} (lossy)"
        out = lossless_restart(data, cfg.restart_px) if cfg.restart_px else data
        return _Prepared(out, "jpg", out is not data, note)
    if is_jpeg:
        image_header(data, cfg.limits)  # the size limits and a readable header first
        if cfg.restart_px:
            # The rewrite entropy-decodes every coefficient and refuses any libjpeg warning:
            # the same proof as a full decode minus the IDCT (which cannot fail).
            out = lossless_restart(data, cfg.restart_px)
            if out is not data:
                return _Prepared(out, "jpg", True)
        # not rewritable (no extension, CMYK, coefficients baseline cannot code): stored as
        # is, once the training decoder has read all of it
        check_decodes(data, cfg.limits)
        return _Prepared(data, "jpg", False)
    check_decodes(data, cfg.limits)
    if data[:8] == PNG_MAGIC:
        return _Prepared(data, "png", False)  # byte for byte: lossless
    img = decode_reference(data, cfg.limits)
    return _Prepared(_encode_png(img), "png", False, "stored as PNG (lossless)")


class _HashingFile:
    """A write-only file that hashes what passes through (a shard's SHA-256, no second read)."""

    def __init__(self, f):
        self.f, self.sha, self.pos = f, hashlib.sha256(), 0

    def write(self, b) -> int:
        self.sha.update(b)
        self.pos += len(b)
        return self.f.write(b)

    def tell(self) -> int:
        return self.pos


class _ShardWriter:
    def __init__(self, root: Path, shard_bytes: int):
        self.root, self.shard_bytes = root, shard_bytes
        self.names: list[str] = []
        self.sha256: list[str] = []
        self._tar = self._file = self._hashing = None
        self._size = 0
        self._idx: list[str] = []  # DALI index lines of the open shard

    def _open(self):
        name = f"shard-{len(self.names):06d}.tar"
        self._file = open(self.root / name, "wb")  # the staging folder is private: no temp name
        self._hashing = _HashingFile(self._file)
        self._tar = tarfile.open(fileobj=self._hashing, mode="w", format=tarfile.USTAR_FORMAT)
        self.names.append(name)
        self._size = 0

    def _close(self):
        if self._tar is not None:
            self._tar.close()
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self.sha256.append(self._hashing.sha.hexdigest())
            write_text_atomic(self.root / dali_index_name(self.names[-1]),
                              f"{DALI_INDEX_VERSION} {len(self._idx)}\n" + "".join(self._idx))
            self._idx = []
            self._tar = None

    def add(self, key: str, image: bytes, ext: str, label: int) -> tuple[int, int, int]:
        if self._tar is None or self._size + len(image) > self.shard_bytes:
            self._close()
            self._open()
        cls = str(label).encode()
        offset = self._member(f"{key}.{ext}", image)
        cls_offset = self._member(f"{key}.cls", cls)
        self._idx.append(f"{ext} {offset} {len(image)} {key}.{ext} cls {cls_offset} {len(cls)} "
                         f"{key}.cls\n")
        self._size += len(image)
        return len(self.names) - 1, offset, len(image)

    def _member(self, name: str, data: bytes) -> int:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mtime = 0  # reproducible shards
        self._tar.addfile(info, io.BytesIO(data))
        # tarfile wrote a 512-byte header then the data, padded to 512: data starts here.
        return self._tar.offset - _padded(len(data))

    def finish(self) -> list[str]:
        self._close()
        return self.names

    def abandon(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.close()


# DALI's webdataset index (what its wds2idx tool writes): "v1.2 N", then a line per sample of
# "EXT DATA_OFFSET SIZE MEMBER_NAME" per component. With it fn.readers.webdataset opens the
# shards directly instead of scanning every tar header first.
DALI_INDEX_VERSION = "v1.2"


def dali_index_name(shard: str) -> str:
    return shard[:-len(".tar")] + ".idx"


def _padded(n: int) -> int:
    return (n + 511) // 512 * 512


def _source_id(src, source: Source) -> str:
    """What the index records as the source: an absolute path where there is one."""
    if isinstance(src, (str, Path)):
        return str(Path(src).resolve())
    return getattr(source, "origin", None) or source.describe()


def _settings(cfg: PrepareConfig) -> dict:
    """The settings that decide the output (threads do not), as JSON would give them back."""
    settings = asdict(cfg)
    settings.pop("threads")
    return json.loads(json.dumps(settings))


def _existing(dst: Path, source_id: str, cfg: PrepareConfig) -> dict | None:
    """The report of a complete prepare of the same source with the same settings in ``dst``;
    None when ``dst`` is new or empty; DlperfError for anything else in it."""
    if not dst.exists():
        return None
    if not dst.is_dir():
        raise DlperfError(f"{dst}: exists and is not a folder; choose a new or empty folder")
    entries = sorted(p.name for p in dst.iterdir())
    if not entries:
        return None
    if INDEX_NAME in entries:
        try:
            index = json.loads((dst / INDEX_NAME).read_text(encoding="utf-8"))
            report = json.loads((dst / REPORT_NAME).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            index, report = {}, None
        if (isinstance(index, dict) and index.get("source") == source_id
                and index.get("settings") == _settings(cfg) and index.get("format") == INDEX_FORMAT
                and isinstance(report, dict)):
            return {**report, "already": True}
        raise DlperfError(f"{dst}: already holds a prepared dataset of {index.get('source', '?')!s} made "
                          "with other settings or another dlperf; choose a new or empty folder "
                          "(or delete that one)")
    shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
    raise DlperfError(f"{dst}: not empty ({shown}); dlperf data prepare writes only into a new "
                      "or empty folder, so nothing of yours is overwritten")


class _Staging:
    """The private folder a prepare writes into, renamed to ``dst`` when complete.

    Beside ``dst`` (same file system, so the rename is atomic), named ``.DST.prepare-PID``, and
    locked (flock) while its prepare runs: a later prepare removes any such folder whose lock
    is free (its run died: kill -9, power cut) and never one whose run is alive."""

    def __init__(self, dst: Path):
        self.dst = dst
        parent = dst.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
            for old in parent.glob(f".{dst.name}.prepare-*"):
                self._remove_if_dead(old)
            self.path = parent / f".{dst.name}.prepare-{os.getpid()}"
            shutil.rmtree(self.path, ignore_errors=True)
            self.path.mkdir()
            self._lock = os.open(self.path / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            raise DlperfError(f"{dst}: cannot write beside it in {parent} ({exc.strerror}); "
                              "choose a folder you can write to") from None

    @staticmethod
    def _remove_if_dead(folder: Path) -> None:
        try:
            fd = os.open(folder / ".lock", os.O_RDWR)
        except OSError:
            fd = None  # no lock file: died before taking it
        try:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: nobody runs there
            shutil.rmtree(folder, ignore_errors=True)
        except OSError:
            pass  # held: another prepare is writing there right now
        finally:
            if fd is not None:
                os.close(fd)

    def commit(self) -> None:
        os.unlink(self.path / ".lock")
        _fsync_dir(self.path)
        if self.dst.exists():
            os.rmdir(self.dst)  # checked empty before the run; refuses if something appeared
        os.rename(self.path, self.dst)
        _fsync_dir(self.dst.parent)
        os.close(self._lock)
        self._lock = None

    def abandon(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def prepare(src: str | Path | Source, dst: str | Path, cfg: PrepareConfig = PrepareConfig(),
            progress=None) -> dict:
    """Write shards + index.json for ``src`` into ``dst``, all or nothing; returns a summary
    with the bad files and their reasons (``already`` is True when ``dst`` already held this
    very prepare and nothing was redone)."""
    source = src if isinstance(src, Source) else open_source(src)
    dst = Path(dst).absolute()  # "." or "out/" name a real folder with a real parent
    source_id = _source_id(src, source)
    done = _existing(dst, source_id, cfg)
    if done is not None:
        return done
    stage = _Staging(dst)
    writer = _ShardWriter(stage.path, cfg.shard_bytes)
    try:
        summary = _write(source, source_id, stage.path, writer, cfg, progress)
        stage.commit()
    except OSError as exc:  # disk full, quota, a folder gone: one line, nothing left behind
        raise DlperfError(f"{dst}: writing failed ({exc.strerror or exc}); nothing was kept "
                          "(the partial output is removed): free space or choose another "
                          "folder, then run again") from None
    finally:
        writer.abandon()
        if stage._lock is not None:
            stage.abandon()
    return summary


def _write(source: Source, source_id: str, root: Path, writer: _ShardWriter,
           cfg: PrepareConfig, progress) -> dict:
    samples, bad, notes = [], [], []
    in_bytes = out_bytes = rewritten = 0
    start = time.perf_counter()

    def work(i: int):
        """(input size, _Prepared) or (None, reason): decoding and re-encoding release the GIL,
        so this runs in threads while the writer keeps the source order."""
        try:
            data = source.read_limited(i, cfg.limits.max_bytes)
            return len(data), _prepare_one(data, cfg)
        except BadImage as exc:
            return None, str(exc)
        except OSError as exc:
            return None, f"unreadable ({exc.strerror or exc})"

    n = len(source)
    window = 4 * (cfg.threads or len(os.sched_getaffinity(0)))
    use_single_threaded_opencv()
    with ThreadPoolExecutor(cfg.threads or None) as pool:
        pending = deque(pool.submit(work, i) for i in range(min(window, n)))
        for i in range(n):
            size_in, result = pending.popleft().result()
            if i + window < n:  # a bounded window: memory stays flat on any dataset size
                pending.append(pool.submit(work, i + window))
            if size_in is None:
                bad.append((source.name(i), result))
            else:
                key = f"{len(samples):08d}"
                rewritten += result.marked
                if result.note:
                    notes.append((source.name(i), result.note))
                shard, offset, length = writer.add(key, result.data, result.ext, source.label(i))
                samples.append([shard, offset, length, source.label(i), key,
                                zlib.crc32(result.data), result.ext])
                in_bytes += size_in
                out_bytes += length
            if progress:
                progress()
    shards = writer.finish()
    if not samples:
        shown = "; ".join(f"{name}: {why}" for name, why in bad[:3])
        raise DlperfError(f"{source_id}: no readable images, nothing written (first reasons: "
                          f"{shown})")
    index = {"format": INDEX_FORMAT, "classes": source.classes, "shards": shards,
             "shard_sha256": writer.sha256, "samples": samples, "source": source_id,
             "settings": _settings(cfg), "config": asdict(cfg),
             "native_jpeg": ROI_AVAILABLE}
    summary = {"samples": len(samples), "shards": len(shards), "bad": bad, "changed": notes,
               "input_bytes": in_bytes, "output_bytes": out_bytes,
               "restart_markers": rewritten, "native_jpeg": ROI_AVAILABLE,
               "seconds": time.perf_counter() - start, "already": False}
    write_json_atomic(root / REPORT_NAME, summary)
    write_json_atomic(root / INDEX_NAME, index)  # the index last: the marker of a whole dataset
    return summary


def _check_dali_indexes(root: Path, source: ShardSource, members: dict) -> list:
    """Each shard's DALI .idx must list exactly its samples, at the tar members' offsets."""
    problems = []
    for s, name in enumerate(source.shards):
        path = root / dali_index_name(name)
        try:
            lines = path.read_text().splitlines()
            version, count = lines[0].split()
            rows = [line.split() for line in lines[1:]]
            ok = (version == DALI_INDEX_VERSION and int(count) == len(rows)
                  and all(len(r) % 4 == 0 for r in rows))
            listed = {(int(r[k + 1]), int(r[k + 2]), r[k + 3]) for r in rows
                      for k in range(0, len(r), 4)} if ok else set()
        except (OSError, ValueError, IndexError):
            problems.append((str(path), "missing or unreadable DALI index (prepare writes it)"))
            continue
        actual = {(off, m.size, m.name) for off, m in members.get(s, {}).items()}
        if not ok or listed != actual:
            problems.append((str(path), "DALI index does not match the shard's members"))
    return problems


def _shard_digest(path: Path) -> str | None:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)  # releases the GIL: shards hash in parallel
    except OSError:
        return None
    return h.hexdigest()


def _unnamed_files(root: Path, source: ShardSource) -> list:
    named = {INDEX_NAME, REPORT_NAME, *source.shards, *map(dali_index_name, source.shards)}
    return [(str(p), "not named by the index (a leftover of another run? readers that glob "
                     "shard-*.tar, such as webdataset, would read it): remove it")
            for p in sorted(root.iterdir()) if p.name not in named]


def verify(root: str | Path, limits: DecodeLimits = DecodeLimits(), progress=None,
           threads: int | None = None) -> dict:
    """Check a prepared dataset: files the index does not name, each shard's SHA-256 and tar
    members, each DALI .idx, then every sample's member, label and CRC-32, and a decode of the
    whole sample by the decoder training uses (in threads: hashing and decoding release the
    GIL; problems are reported in sample order whatever the thread count)."""
    root = Path(root)
    source = ShardSource(root)
    problems = _unnamed_files(root, source)
    notes = []
    if not source.has_checksums:
        notes.append(f"{root / INDEX_NAME}: {source.format} has no checksums (made by an older "
                     "dlperf): bytes are checked only by decoding; re-run `dlperf data prepare` "
                     "to add them")
    members: dict[int, dict[int, tarfile.TarInfo]] = {}
    for s, name in enumerate(source.shards):
        try:
            with tarfile.open(root / name) as tar:
                members[s] = {m.offset_data: m for m in tar.getmembers()}
        except (OSError, tarfile.TarError) as exc:
            problems.append((name, f"unreadable shard ({exc})"))
    problems += _check_dali_indexes(root, source, members)
    workers = threads or len(os.sched_getaffinity(0))
    if source.has_checksums:
        with ThreadPoolExecutor(workers) as pool:
            digests = list(pool.map(_shard_digest, (root / n for n in source.shards)))
        for name, want, got in zip(source.shards, source.shard_sha256, digests):
            if got is not None and got != want:
                problems.append((name, "SHA-256 differs from the index: the shard changed "
                                       "after prepare (its damaged samples are listed below)"))

    def check(i: int) -> str | None:
        shard, offset, size, label, key = source.entry(i)
        member = members.get(shard, {}).get(offset)
        if member is None or member.name != source.member(i) or member.size != size:
            return "index does not match the tar member at that offset"
        try:
            data = source.read(i)
            want = source.crc32(i)
            if want is not None and zlib.crc32(data) != want:
                return ("checksum mismatch: the stored bytes changed after prepare (a damaged "
                        "disk or copy); re-copy the shard or re-run `dlperf data prepare`")
            check_decodes(data, limits)
        except BadImage as exc:
            return str(exc)
        except (OSError, DlperfError) as exc:  # a shard cut short or gone: a finding, no crash
            return f"unreadable ({exc})"
        return None

    n = len(source)
    window = 4 * workers
    with ThreadPoolExecutor(workers) as pool:
        pending = deque(pool.submit(check, i) for i in range(min(window, n)))
        for i in range(n):
            reason = pending.popleft().result()
            if i + window < n:  # a bounded window: memory stays flat on any dataset size
                pending.append(pool.submit(check, i + window))
            if reason is not None:
                problems.append((source.name(i), reason))
            if progress:
                progress()
    source.close()
    return {"samples": len(source), "shards": len(source.shards), "problems": problems,
            "notes": notes}
