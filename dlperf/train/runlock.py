"""One `dlperf train` per run folder: an advisory lock on ``out_dir/.dlperf-train.lock``.

Two runs writing checkpoints into the same folder would interleave them (each with a valid
checksum) and a later resume would continue the other run's weights. The lock is
``fcntl.flock``: the kernel drops it when the holding process exits for any reason (kill -9,
a crash, a lost node), so a dead run never leaves the folder locked; the file itself stays
and says who held it last. Under torchrun only rank 0 writes the folder, so only rank 0 locks.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import socket
from pathlib import Path

from dlperf.errors import DlperfError

LOCK_NAME = ".dlperf-train.lock"


class RunLock:
    """``with RunLock(out_dir):`` holds the folder for this process, or raises DlperfError
    naming the run that holds it."""

    def __init__(self, folder: str | Path, enabled: bool = True):
        self.folder = Path(folder)
        self.enabled = enabled
        self._fd: int | None = None

    def __enter__(self) -> "RunLock":
        if not self.enabled:
            return self
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise DlperfError(f"out_dir={self.folder}: cannot write there ({exc.strerror}); "
                              "choose a folder you can write") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_holder(fd)
            os.close(fd)
            raise DlperfError(f"out_dir={self.folder} is in use by another dlperf train "
                              f"({holder}); wait for it to finish, or choose another "
                              "out_dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "started": _dt.datetime.now(_dt.timezone.utc).isoformat(
                                     timespec="seconds")}).encode())
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _read_holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        info = json.loads(os.read(fd, 4096).decode() or "{}")
        return f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"
