"""Shared output helpers: human units, atomic JSON writes."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from dlperf.errors import DlperfError


def si(value: float, unit: str = "", digits: int = 3) -> str:
    """1.23e12 -> '1.23 T' + unit."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g} {prefix}{unit}"
    return f"{value:.{digits}g} {unit}".rstrip()


def seconds(value: float) -> str:
    if value >= 1:
        return f"{value:.3g} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.3g} µs"


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write via temp file + fsync + rename, so readers never see a half-written file."""
    path = Path(path)
    if not path.parent.exists():
        raise DlperfError(f"{path}: folder {path.parent} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise DlperfError(f"{path}: cannot write ({exc.strerror})") from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; results are for everyone to read
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_json_atomic(path: str | Path, data) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=1, default=str) + "\n")
