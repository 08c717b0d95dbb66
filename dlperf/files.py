"""Files dlperf writes: atomically (temp file, fsync, rename), and where it caches what it
makes once per machine."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from dlperf.errors import DlperfError


def cache_dir() -> Path:
    """Where dlperf keeps what it makes once per machine (CPU probes, the benchmark corpus):
    $DLPERF_CACHE_DIR, else ~/.cache/dlperf."""
    env = os.environ.get("DLPERF_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "dlperf"


def write_atomic(path: str | Path, write, binary: bool = False) -> Path:
    """Call ``write(file)`` on a temp file beside ``path``, fsync it, then rename it over
    ``path`` and fsync the folder: readers see the old file or the whole new one, never a part,
    whatever happens (kill -9 included)."""
    path = Path(path)
    if not path.parent.exists():
        raise DlperfError(f"{path}: folder {path.parent} does not exist")
    if path.is_dir():
        raise DlperfError(f"{path}: is a folder; give a file name (e.g. {path / 'result.json'})")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise DlperfError(f"{path}: cannot write ({exc.strerror})") from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; results are for everyone to read
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself survives a power cut
        finally:
            os.close(dir_fd)
    except OSError:
        pass
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    return write_atomic(path, lambda f: f.write(text))


def _json_default(value):
    """What json cannot write itself: a set as its sorted members (str() would write Python's
    repr, "frozenset({...})", into the file), anything else as its string."""
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    return str(value)


def write_json_atomic(path: str | Path, data) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=1, default=_json_default) + "\n")
