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

Writes are atomic: each shard is written to a temporary name, fsynced and renamed, and the index,
written last, is the commit marker: a folder without index.json is not a dataset.
"""

from __future__ import annotations

import io
import os
import tarfile
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import cv2
import numpy as np

from dlperf.data.decode import (JPEG_MAGIC, BadImage, DecodeLimits, decode_reference,
                                image_header, lossless_restart, use_single_threaded_opencv)
from dlperf.data.sources import INDEX_FORMAT, INDEX_NAME, ShardSource, Source, open_source
from dlperf.errors import DlperfError
from dlperf.report import write_json_atomic, write_text_atomic


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
            return int(float(t[:-1]) * mult[t[-1]])
        return int(t)
    except ValueError:
        raise DlperfError(f"--shard-size {text!r}: give a size like 1GB or 512MB") from None


def _encode(img: np.ndarray, quality: int) -> bytes:
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(img, cv2.COLOR_RGB2BGR),
                           [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise BadImage("re-encoding failed")
    return buf.tobytes()


def _prepare_one(data: bytes, cfg: PrepareConfig) -> tuple[bytes, bool]:
    """(the bytes to store, whether they carry restart markers from the lossless rewrite)"""
    if cfg.restart_px and not cfg.max_side and data[:3] == JPEG_MAGIC:
        image_header(data, cfg.limits)  # the size limits and a readable header first
        # The rewrite entropy-decodes every coefficient and refuses any libjpeg warning, the
        # same proof as a full decode minus the IDCT (which cannot fail), without a second pass.
        out = lossless_restart(data, cfg.restart_px)
        if out is not data:
            return out, True
    img = decode_reference(data, cfg.limits)  # full decode: proves the file is good
    if cfg.max_side and max(img.shape[:2]) > cfg.max_side:
        s = cfg.max_side / max(img.shape[:2])
        size = (max(1, round(img.shape[1] * s)), max(1, round(img.shape[0] * s)))
        img = cv2.resize(img, size, interpolation=cv2.INTER_AREA)
        data = _encode(img, cfg.quality)
    elif cfg.max_side or data[:3] != JPEG_MAGIC:
        data = _encode(img, cfg.quality)
    out = lossless_restart(data, cfg.restart_px) if cfg.restart_px else data
    return out, out is not data


class _ShardWriter:
    def __init__(self, root: Path, shard_bytes: int):
        self.root, self.shard_bytes = root, shard_bytes
        self.names: list[str] = []
        self._tar = self._file = self._tmp = None
        self._size = 0
        self._idx: list[str] = []  # DALI index lines of the open shard

    def _open(self):
        name = f"shard-{len(self.names):06d}.tar"
        self._tmp = self.root / f".{name}.tmp"
        self._file = open(self._tmp, "wb")
        self._tar = tarfile.open(fileobj=self._file, mode="w", format=tarfile.USTAR_FORMAT)
        self.names.append(name)
        self._size = 0

    def _close(self):
        if self._tar is not None:
            self._tar.close()
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.replace(self._tmp, self.root / self.names[-1])
            write_text_atomic(self.root / dali_index_name(self.names[-1]),
                              f"{DALI_INDEX_VERSION} {len(self._idx)}\n" + "".join(self._idx))
            self._idx = []
            self._tar = None

    def add(self, key: str, image: bytes, label: int) -> tuple[int, int, int]:
        if self._tar is None or self._size + len(image) > self.shard_bytes:
            self._close()
            self._open()
        cls = str(label).encode()
        offset = self._member(f"{key}.jpg", image)
        cls_offset = self._member(f"{key}.cls", cls)
        self._idx.append(f"jpg {offset} {len(image)} {key}.jpg cls {cls_offset} {len(cls)} "
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


# DALI's webdataset index (what its wds2idx tool writes): "v1.2 N", then a line per sample of
# "EXT DATA_OFFSET SIZE MEMBER_NAME" per component. With it fn.readers.webdataset opens the
# shards directly instead of scanning every tar header first.
DALI_INDEX_VERSION = "v1.2"


def dali_index_name(shard: str) -> str:
    return shard[:-len(".tar")] + ".idx"


def _padded(n: int) -> int:
    return (n + 511) // 512 * 512


def prepare(src: str | Path | Source, dst: str | Path, cfg: PrepareConfig = PrepareConfig(),
            progress=None) -> dict:
    """Write shards + index.json for ``src`` into ``dst``; returns a summary with bad files."""
    source = src if isinstance(src, Source) else open_source(src)
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    if (dst / INDEX_NAME).exists():
        raise DlperfError(f"{dst}: already holds a prepared dataset ({INDEX_NAME}); choose an "
                          "empty folder")
    writer = _ShardWriter(dst, cfg.shard_bytes)
    samples, bad = [], []
    in_bytes = out_bytes = rewritten = 0
    start = time.perf_counter()

    def work(i: int):
        """(input size, (output bytes, rewritten)) or (None, reason): decoding and
        re-encoding release the GIL, so this runs in threads while the writer keeps the source
        order."""
        try:
            data = source.read_limited(i, cfg.limits.max_bytes)
            if data is None:
                raise BadImage(f"file too large (> limit {cfg.limits.max_bytes:,} bytes)")
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
                result, marked = result
                rewritten += marked
                shard, offset, length = writer.add(key, result, source.label(i))
                samples.append([shard, offset, length, source.label(i), key])
                in_bytes += size_in
                out_bytes += length
            if progress:
                progress()
    shards = writer.finish()
    if not samples:
        raise DlperfError(f"{src}: no readable images; nothing written")
    index = {"format": INDEX_FORMAT, "classes": source.classes, "shards": shards,
             "samples": samples, "source": str(src), "config": asdict(cfg)}
    write_json_atomic(dst / INDEX_NAME, index)  # commit marker, written last
    summary = {"samples": len(samples), "shards": len(shards), "bad": bad,
               "input_bytes": in_bytes, "output_bytes": out_bytes,
               "restart_markers": rewritten, "seconds": time.perf_counter() - start}
    write_json_atomic(dst / "prepare-report.json", summary)
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


def verify(root: str | Path, limits: DecodeLimits = DecodeLimits(), progress=None,
           threads: int | None = None) -> dict:
    """Check the index against the tar headers and decode every sample (in threads: the
    decoders release the GIL; problems are reported in sample order whatever the count)."""
    root = Path(root)
    source = ShardSource(root)
    problems = []
    members: dict[int, dict[int, tarfile.TarInfo]] = {}
    for s, name in enumerate(source.shards):
        try:
            with tarfile.open(root / name) as tar:
                members[s] = {m.offset_data: m for m in tar.getmembers()}
        except (OSError, tarfile.TarError) as exc:
            problems.append((name, f"unreadable shard ({exc})"))
    problems += _check_dali_indexes(root, source, members)

    def check(i: int) -> str | None:
        shard, offset, size, label, key = source.entry(i)
        member = members.get(shard, {}).get(offset)
        if member is None or member.name != f"{key}.jpg" or member.size != size:
            return "index does not match the tar member at that offset"
        if not 0 <= label < len(source.classes):
            return f"label {label} outside the {len(source.classes)} classes"
        try:
            decode_reference(source.read(i), limits)
        except BadImage as exc:
            return str(exc)
        except (OSError, DlperfError) as exc:  # a shard cut short or gone: a finding, no crash
            return f"unreadable ({exc})"
        return None

    n = len(source)
    window = 4 * (threads or len(os.sched_getaffinity(0)))
    with ThreadPoolExecutor(threads or None) as pool:
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
    return {"samples": len(source), "shards": len(source.shards), "problems": problems}
