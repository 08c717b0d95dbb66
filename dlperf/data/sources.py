"""Where samples come from: an ImageNet-layout folder, a CSV file list, or indexed tar shards.

A source answers, by sample position: the encoded bytes, the label, a name for reports, and the
byte size (so oversized files are refused before they are read). Reads are thread-safe: shards
use os.pread on one descriptor per shard, folders open each file.
"""

from __future__ import annotations

import abc
import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlperf.errors import DlperfError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif", ".ppm")
INDEX_NAME = "index.json"
INDEX_FORMAT = "dlperf-shards-v1"


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

    def read_limited(self, index: int, limit: int) -> bytes | None:
        """The bytes, or None when the sample is larger than ``limit`` (never read whole)."""
        return None if self.size(index) > limit else self.read(index)


@dataclass(frozen=True)
class _Item:
    path: str
    label: int


class FileSource(Source):
    """Files on disk with labels: an image folder (one sub-folder per class) or a CSV list."""

    def __init__(self, items: list[_Item], classes: list[str]):
        self.items = items
        self.classes = classes

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
        return cls(items, classes)

    @classmethod
    def from_csv(cls, csv_path: str | Path, root: str | Path | None = None) -> "FileSource":
        """Lines ``path,label``; the label is an integer or a class name; paths relative to
        ``root`` (default: the CSV's folder)."""
        csv_path = Path(csv_path)
        base = Path(root) if root else csv_path.parent
        try:
            rows = list(csv.reader(csv_path.open(newline="")))
        except OSError as exc:
            raise DlperfError(f"{csv_path}: cannot read file list ({exc.strerror})") from None
        rows = [r for r in rows if r and not r[0].startswith("#")]
        if rows and rows[0][:2] == ["path", "label"]:
            rows = rows[1:]
        raw = []
        for line, row in enumerate(rows, 1):
            if len(row) < 2:
                raise DlperfError(f"{csv_path}: row {line} needs 'path,label', got {row!r}")
            raw.append((row[0].strip(), row[1].strip()))
        if not raw:
            raise DlperfError(f"{csv_path}: no samples")
        if all(lab.lstrip("-").isdigit() for _, lab in raw):
            labels = [int(lab) for _, lab in raw]
            classes = [str(i) for i in range(max(labels) + 1)]
        else:
            classes = sorted({lab for _, lab in raw})
            lookup = {c: i for i, c in enumerate(classes)}
            labels = [lookup[lab] for _, lab in raw]
        items = [_Item(str(base / p), lab) for (p, _), lab in zip(raw, labels)]
        return cls(items, classes)

    def __len__(self) -> int:
        return len(self.items)

    def read(self, index: int) -> bytes:
        with open(self.items[index].path, "rb") as f:
            return f.read()

    def read_limited(self, index: int, limit: int) -> bytes | None:
        # fstat on the open file, not a separate stat of the path; never read(limit + 1), which
        # would allocate a limit-sized buffer for every image.
        with open(self.items[index].path, "rb", buffering=0) as f:
            if os.fstat(f.fileno()).st_size > limit:
                return None
            return f.readall()

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

    def __init__(self, root: str | Path):
        self.root = Path(root)
        index_path = self.root / INDEX_NAME
        try:
            index = json.loads(index_path.read_text())
        except FileNotFoundError:
            raise DlperfError(f"{index_path}: no shard index (make one with `dlperf data "
                              "prepare SRC DST`)") from None
        except (OSError, ValueError) as exc:
            raise DlperfError(f"{index_path}: unreadable shard index ({exc})") from None
        if index.get("format") != INDEX_FORMAT:
            raise DlperfError(f"{index_path}: not a {INDEX_FORMAT} index")
        self.classes = index["classes"]
        self.shards = index["shards"]
        # samples: [shard, offset, size, label, key] in the file; kept as compact columns
        # (ImageNet's 1.28 M samples: ~40 MB instead of ~300 MB of Python lists per rank).
        rows = index.pop("samples")
        cols = np.array([row[:4] for row in rows], dtype=np.int64).reshape(-1, 4)
        self._shard, self._offset, self._size, self._label = (cols[:, j].copy() for j in range(4))
        self._keys = [row[4] for row in rows]
        del rows, cols
        self._fds: dict[int, int] = {}

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
