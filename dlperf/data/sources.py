"""Where samples come from: an ImageNet-layout folder, a CSV file list, or indexed tar shards.

A source answers, by sample position: the encoded bytes, the label, a name for reports, and the
byte size (so oversized files are refused before they are read). Reads are thread-safe: shards
use os.pread on one descriptor per shard, folders open each file.

Every reader (prepare, verify, inspect, the CPU and GPU loaders) takes a sample's bytes through
``read_limited``: one size limit, one message, and for shards the sample's checksum when asked
(issue #10). A bad sample raises :class:`~dlperf.data.decode.BadImage`, which each caller's
skip-and-report policy handles; a damaged index raises a one-line DlperfError naming the entry.
"""

from __future__ import annotations

import abc
import csv
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlperf.data.decode import BadImage, too_large
from dlperf.errors import DlperfError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif", ".ppm")
INDEX_NAME = "index.json"
# v2 rows: [shard, offset, size, label, key, crc32, ext] and a sha256 per shard; v1 rows
# (dlperf before issue #10): [shard, offset, size, label, key], no checksums, every ext "jpg".
INDEX_FORMAT = "dlperf-shards-v2"
INDEX_FORMATS = ("dlperf-shards-v1", INDEX_FORMAT)
MAX_CLASSES = 1 << 20  # integer labels above this are a mistake (and a list of that many names)


class Source(abc.ABC):
    """Samples by position; implementations must allow concurrent reads from several threads."""

    classes: list[str]

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def read(self, index: int) -> bytes:
        """The encoded image bytes."""

    @abc.abstractmethod
    def label(self, index: int) -> int: ...

    @abc.abstractmethod
    def name(self, index: int) -> str:
        """Path or shard:key, for reports."""

    @abc.abstractmethod
    def size(self, index: int) -> int:
        """Encoded size in bytes, known before reading."""

    def describe(self) -> str:
        return f"{type(self).__name__}: {len(self):,} samples, {len(self.classes)} classes"

    def read_limited(self, index: int, limit: int) -> bytes:
        """The bytes; BadImage when the sample is larger than ``limit`` (never read whole)."""
        size = self.size(index)
        if size > limit:
            raise too_large(size, limit)
        return self.read(index)


@dataclass(frozen=True)
class _Item:
    path: str
    label: int


class FileSource(Source):
    """Files on disk with labels: an image folder (one sub-folder per class) or a CSV list."""

    def __init__(self, items: list[_Item], classes: list[str], origin: str | None = None):
        self.items = items
        self.classes = classes
        self.origin = origin  # the folder or .csv it came from (absolute), for reports

    @classmethod
    def from_folder(cls, root: str | Path, extensions=IMAGE_EXTENSIONS) -> "FileSource":
        root = Path(root)
        if not root.is_dir():
            raise DlperfError(f"{root}: not a folder (expected one sub-folder per class)")
        classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
        if not classes:
            raise DlperfError(f"{root}: no class sub-folders (ImageNet layout: ROOT/CLASS/IMAGE)")
        items = []
        for label, name in enumerate(classes):
            for path in sorted((root / name).rglob("*")):
                if path.is_file() and path.suffix.lower() in extensions:
                    items.append(_Item(str(path), label))
        if not items:
            raise DlperfError(f"{root}: no image files ({', '.join(extensions)}) in the class "
                              "folders")
        return cls(items, classes, str(root.resolve()))

    @classmethod
    def from_csv(cls, csv_path: str | Path, root: str | Path | None = None) -> "FileSource":
        """Lines ``path,label``; the label is an integer or a class name; paths relative to
        ``root`` (default: the CSV's folder)."""
        csv_path = Path(csv_path)
        base = Path(root) if root else csv_path.parent
        try:
            with csv_path.open(newline="", encoding="utf-8") as f:
                reader = csv.reader(f)
                rows = [(reader.line_num, r) for r in reader]  # file line numbers for messages
        except OSError as exc:
            raise DlperfError(f"{csv_path}: cannot read file list ({exc.strerror})") from None
        except (UnicodeDecodeError, csv.Error) as exc:
            raise DlperfError(f"{csv_path}: not a UTF-8 path,label list ({exc})") from None
        rows = [(n, r) for n, r in rows if r and not r[0].startswith("#")]
        if rows and rows[0][1][:2] == ["path", "label"]:
            rows = rows[1:]
        raw, lines = [], []
        for line, row in rows:
            if len(row) < 2:
                raise DlperfError(f"{csv_path}: line {line} needs 'path,label', got {row!r}")
            raw.append((row[0].strip(), row[1].strip()))
            lines.append(line)
        if not raw:
            raise DlperfError(f"{csv_path}: no samples")
        if all(lab.lstrip("-").isdigit() for _, lab in raw):
            labels = [int(lab) for _, lab in raw]
            for line, lab in zip(lines, labels):
                # a negative label would index the logits from the end (or crash the loss);
                # a huge one would make that many classes: refuse both here, not mid-training
                if not 0 <= lab < MAX_CLASSES:
                    raise DlperfError(f"{csv_path}: line {line}: label {lab} must be in 0.."
                                      f"{MAX_CLASSES - 1} (integer labels are class numbers "
                                      "from 0; or use class names)")
            classes = [str(i) for i in range(max(labels) + 1)]
        else:
            classes = sorted({lab for _, lab in raw})
            lookup = {c: i for i, c in enumerate(classes)}
            labels = [lookup[lab] for _, lab in raw]
        items = [_Item(str(base / p), lab) for (p, _), lab in zip(raw, labels)]
        return cls(items, classes, str(csv_path.resolve()))

    def __len__(self) -> int:
        return len(self.items)

    def read(self, index: int) -> bytes:
        with open(self.items[index].path, "rb") as f:
            return f.read()

    def read_limited(self, index: int, limit: int) -> bytes:
        # fstat on the open file, not a separate stat of the path; never read(limit + 1), which
        # would allocate a limit-sized buffer for every image.
        with open(self.items[index].path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise too_large(size, limit)
            return f.readall()

    def describe(self) -> str:
        where = self.origin or (os.path.commonpath([it.path for it in self.items])
                                if self.items else "?")
        return f"{where} ({len(self):,} files, {len(self.classes)} classes)"

    def label(self, index: int) -> int:
        return self.items[index].label

    def name(self, index: int) -> str:
        return self.items[index].path

    def size(self, index: int) -> int:
        return os.stat(self.items[index].path).st_size


class ShardSource(Source):
    """Tar shards in webdataset naming (``key.jpg`` + ``key.cls``) with dlperf's index.json.

    The index stores each sample's shard, byte offset and size, so any sample is one pread.
    The shards stay ordinary tar files that webdataset and DALI read too.
    """

    def __init__(self, root: str | Path, check_checksums: bool = False):
        self.root = Path(root)
        self.origin = str(self.root.resolve())
        index_path = self.root / INDEX_NAME
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise DlperfError(f"{index_path}: no shard index (make one with `dlperf data "
                              "prepare SRC DST`)") from None
        except (OSError, ValueError) as exc:
            raise DlperfError(f"{index_path}: unreadable shard index ({exc})") from None
        if not isinstance(index, dict) or index.get("format") not in INDEX_FORMATS:
            raise DlperfError(f"{index_path}: not a dlperf shard index ({' or '.join(INDEX_FORMATS)})")
        self.format = index["format"]
        self.classes, self.shards = index.get("classes"), index.get("shards")
        rows = index.pop("samples", None)
        self.shard_sha256 = index.get("shard_sha256")
        self._check_header(index_path, rows)
        # samples: [shard, offset, size, label, key(, crc32, ext)] in the file; kept as compact
        # columns (ImageNet's 1.28 M samples: ~40 MB instead of ~300 MB of Python lists/rank).
        cols = self._check_rows(index_path, rows)  # the [shard, offset, size, label] columns
        self._shard, self._offset, self._size, self._label = (cols[:, j].copy() for j in range(4))
        self._keys = [row[4] for row in rows]
        self.has_checksums = self.format == INDEX_FORMAT
        self._crc = (np.array([row[5] for row in rows], dtype=np.uint32) if self.has_checksums
                     else None)
        self._exts = [row[6] for row in rows] if self.has_checksums else None
        self.check_checksums = check_checksums and self.has_checksums
        del rows, cols
        self._fds: dict[int, int] = {}

    def _check_header(self, index_path: Path, rows) -> None:
        fix = "the index is damaged: re-run `dlperf data prepare`"
        if not (isinstance(self.classes, list) and all(isinstance(c, str) for c in self.classes)):
            raise DlperfError(f"{index_path}: 'classes' must be a list of names; {fix}")
        if not (isinstance(self.shards, list) and all(isinstance(n, str) and "/" not in n
                                                      and n.endswith(".tar") for n in self.shards)):
            raise DlperfError(f"{index_path}: 'shards' must be a list of .tar names in its "
                              f"folder; {fix}")
        if not isinstance(rows, list):
            raise DlperfError(f"{index_path}: 'samples' missing or not a list; {fix}")
        if self.format == INDEX_FORMAT and not (
                isinstance(self.shard_sha256, list) and len(self.shard_sha256) == len(self.shards)):
            raise DlperfError(f"{index_path}: 'shard_sha256' must give one digest per shard; {fix}")

    def _check_rows(self, index_path: Path, rows: list) -> np.ndarray:
        """Every entry well formed before any is used: a bad one is named, never a traceback.
        Returns the rows' first four fields as an int64 array."""
        width = 7 if self.format == INDEX_FORMAT else 5
        n_shards, n_classes = len(self.shards), len(self.classes)

        def problem(row) -> str | None:
            if not isinstance(row, list) or len(row) != width:
                return f"needs {width} fields"
            shard, offset, size, label, key = row[:5]
            if not all(type(v) is int for v in (shard, offset, size, label)):
                return "shard, offset, size and label must be integers"
            if not 0 <= shard < n_shards:
                return f"shard {shard} is past the {n_shards} shards"
            if offset < 0 or size < 0 or offset % 512:
                return f"offset {offset} / size {size} cannot be a tar member's data"
            if not 0 <= label < n_classes:
                return f"label {label} is outside the {n_classes} classes"
            if not isinstance(key, str) or not key or "/" in key:
                return f"key {key!r} must be a file name"
            if width == 7 and not (type(row[5]) is int and 0 <= row[5] < 1 << 32
                                   and row[6] in ("jpg", "png")):
                return "checksum must be a 32-bit integer and ext jpg or png"
            return None

        def fail(i: int) -> None:
            raise DlperfError(f"{index_path}: sample {i} {str(rows[i])[:80]}: {problem(rows[i])}; "
                              "the index is damaged: re-run `dlperf data prepare`")

        # Fast pass first (ImageNet's 1.28 M rows: one tight loop for the types, numpy for the
        # ranges), the readable per-row diagnosis only for the first row that fails.
        bad = next((i for i, r in enumerate(rows)
                    if type(r) is not list or len(r) != width or type(r[0]) is not int
                    or type(r[1]) is not int or type(r[2]) is not int or type(r[3]) is not int
                    or type(r[4]) is not str or not r[4] or "/" in r[4]
                    or (width == 7 and (type(r[5]) is not int or not 0 <= r[5] < 1 << 32
                                        or r[6] not in ("jpg", "png")))), None)
        if bad is not None:
            fail(bad)
        if rows:
            cols = np.array([r[:4] for r in rows], dtype=np.int64)
            ok = ((cols[:, 0] >= 0) & (cols[:, 0] < n_shards) & (cols[:, 1] >= 0)
                  & (cols[:, 1] % 512 == 0) & (cols[:, 2] >= 0) & (cols[:, 3] >= 0)
                  & (cols[:, 3] < n_classes))
            if not ok.all():
                fail(int(np.argmin(ok)))
        return cols if rows else np.zeros((0, 4), np.int64)

    def member(self, index: int) -> str:
        """The sample's image member in its tar (webdataset naming: KEY.jpg or KEY.png)."""
        return f"{self._keys[index]}.{self._exts[index] if self._exts else 'jpg'}"

    def crc32(self, index: int) -> int | None:
        return int(self._crc[index]) if self._crc is not None else None

    def _fd(self, shard: int) -> int:
        fd = self._fds.get(shard)
        if fd is None:
            path = self.root / self.shards[shard]
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as exc:
                raise DlperfError(f"{path}: cannot open shard ({exc.strerror})") from None
            kept = self._fds.setdefault(shard, fd)
            if kept != fd:  # another thread won the race: keep its descriptor, close ours
                os.close(fd)
            fd = kept
        return fd

    def __len__(self) -> int:
        return len(self._label)

    def entry(self, index: int) -> tuple[int, int, int, int, str]:
        """(shard, byte offset, size, label, key) of one sample, as the index records it."""
        return (int(self._shard[index]), int(self._offset[index]), int(self._size[index]),
                int(self._label[index]), self._keys[index])

    def read(self, index: int) -> bytes:
        shard, offset, size = int(self._shard[index]), int(self._offset[index]), int(self._size[index])
        data = os.pread(self._fd(shard), size, offset)
        if len(data) != size:
            raise OSError(f"short read from {self.shards[shard]} at {offset}")
        if self.check_checksums and zlib.crc32(data) != self._crc[index]:
            raise BadImage("checksum mismatch: the stored bytes changed after `dlperf data "
                           "prepare` (a damaged disk or copy); re-copy or re-prepare the shard")
        return data

    def label(self, index: int) -> int:
        return int(self._label[index])

    def name(self, index: int) -> str:
        return f"{self.shards[int(self._shard[index])]}:{self._keys[index]}"

    def size(self, index: int) -> int:
        return int(self._size[index])

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def open_source(path: str | Path) -> Source:
    """A folder of class folders, a folder of shards (index.json), or a .csv file list."""
    path = Path(path)
    if path.is_dir() and (path / INDEX_NAME).exists():
        return ShardSource(path)
    if path.suffix.lower() == ".csv":
        return FileSource.from_csv(path)
    if path.is_dir():
        return FileSource.from_folder(path)
    raise DlperfError(f"{path}: not a dataset (an image folder, a shard folder with "
                      f"{INDEX_NAME}, or a .csv list)")
