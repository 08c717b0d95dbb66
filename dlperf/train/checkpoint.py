"""Atomic checkpoints with a commit marker, keep-last-N + best, integrity checks, safe loading.

Layout of a run folder's ``checkpoints/``::

    step-00001200.pt        torch.save of the state (tensors and plain containers only)
    step-00001200.json      the manifest: sha256 + size of the .pt, step, epoch, metric

The .pt is written to a temporary name, fsynced and renamed; the manifest is written the same
way *after* it, so a manifest exists only for a complete checkpoint (a SIGKILL at any moment
leaves at worst an orphan .pt or temp file, which is ignored). Loading checks size and sha256
and uses ``torch.load(weights_only=True)``, so a checkpoint that carries pickled code is refused;
every load is checked, a path given by hand included (``load_verified``). A checkpoint that
fails its check is reported, moved aside (``*.corrupt``, so it no longer counts toward
keep_last) and the previous complete one is used instead.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from dlperf.errors import DlperfError
from dlperf.files import write_atomic, write_json_atomic


class CheckpointError(DlperfError):
    pass


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    manifest: Path
    step: int
    epoch: int
    metric: float | None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save(folder: str | Path, state: dict, step: int, epoch: int, metric: float | None = None,
         keep_last: int = 3, keep_best: bool = True, higher_is_better: bool = True) -> CheckpointInfo:
    """Write ``state`` atomically as checkpoint ``step``; prune old ones (keep last N + best)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"step-{step:08d}"
    final = write_atomic(folder / f"{stem}.pt", lambda f: torch.save(state, f), binary=True)
    manifest = write_json_atomic(folder / f"{stem}.json", {
        "file": final.name, "bytes": final.stat().st_size, "sha256": _sha256(final),
        "step": step, "epoch": epoch, "metric": metric, "format": "dlperf-checkpoint-v1"})
    info = CheckpointInfo(final, manifest, step, epoch, metric)
    _prune(folder, keep_last, keep_best, higher_is_better)
    return info


def complete(folder: str | Path) -> list[CheckpointInfo]:
    """Checkpoints with a manifest (i.e. fully written), oldest first."""
    folder = Path(folder)
    out = []
    for manifest in sorted(folder.glob("step-*.json")):
        try:
            m = json.loads(manifest.read_text())
            out.append(CheckpointInfo(folder / m["file"], manifest, int(m["step"]),
                                      int(m["epoch"]), m.get("metric")))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a damaged manifest: that checkpoint does not count
    return sorted(out, key=lambda c: c.step)


def _prune(folder: Path, keep_last: int, keep_best: bool, higher_is_better: bool) -> None:
    infos = complete(folder)
    keep = {c.step for c in infos[-keep_last:]} if keep_last > 0 else set()
    scored = [c for c in infos if c.metric is not None]
    if keep_best and scored:
        best = (max if higher_is_better else min)(scored, key=lambda c: c.metric)
        keep.add(best.step)
    for c in infos:
        if c.step not in keep:
            c.manifest.unlink(missing_ok=True)  # manifest first: never a manifest without data
            c.path.unlink(missing_ok=True)
    for tmp in folder.glob(".step-*.tmp"):  # leftovers of an interrupted save (write_atomic)
        tmp.unlink(missing_ok=True)


def verify(info: CheckpointInfo) -> None:
    m = json.loads(info.manifest.read_text())
    if not info.path.exists():
        raise CheckpointError(f"{info.path}: missing checkpoint data")
    size = info.path.stat().st_size
    if size != m["bytes"]:
        raise CheckpointError(f"{info.path}: size {size} differs from its manifest ({m['bytes']})")
    if _sha256(info.path) != m["sha256"]:
        raise CheckpointError(f"{info.path}: checksum mismatch (corrupt or modified)")


def load(path: str | Path, map_location="cpu") -> dict:
    """Load one checkpoint file safely (weights_only: tensors and plain containers only)."""
    path = Path(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint") from None
    except Exception as exc:  # pickle.UnpicklingError for code, RuntimeError for damage
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: refused to load ({first[:200]})") from None


def load_verified(path: str | Path, map_location="cpu") -> tuple[dict, CheckpointInfo]:
    """Load the checkpoint at ``path`` after checking it against its manifest (size and
    sha256): every load is checked, a path given by hand included."""
    path = Path(path)
    manifest = path.with_suffix(".json")
    try:
        m = json.loads(manifest.read_text())
        info = CheckpointInfo(path, manifest, int(m["step"]), int(m["epoch"]), m.get("metric"))
        if m["file"] != path.name:
            raise CheckpointError(f"{path}: its manifest {manifest.name} describes {m['file']}")
    except FileNotFoundError:
        what = "no such checkpoint" if not path.exists() else (
            f"no manifest ({manifest.name}) beside it, so it cannot be checked: not a complete "
            "dlperf checkpoint (pass a step-N.pt from a run's checkpoints/ folder)")
        raise CheckpointError(f"{path}: {what}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: unreadable manifest {manifest.name} ({exc})") from None
    verify(info)
    return load(path, map_location), info


def quarantine(info: CheckpointInfo) -> Path:
    """Move a checkpoint that failed its check aside (``*.corrupt``): it no longer counts as
    complete, so it is never picked again and never takes a good one's place in keep_last."""
    for p in (info.manifest, info.path):  # manifest first: never a manifest without data
        if p.exists():
            p.replace(p.with_name(p.name + ".corrupt"))
    return info.path.with_name(info.path.name + ".corrupt")


def load_latest(folder: str | Path, map_location="cpu", warn=print, move_aside: bool = False
                ) -> tuple[dict, CheckpointInfo] | None:
    """The newest checkpoint that passes its integrity check and loads; older ones as fallback.
    ``move_aside``: quarantine each one that fails (the run folder's owner, rank 0)."""
    for info in reversed(complete(folder)):
        try:
            verify(info)
            return load(info.path, map_location), info
        except CheckpointError as exc:
            note = ""
            if move_aside:
                try:
                    note = f"; moved aside to {quarantine(info).name}"
                except OSError:
                    pass
            warn(f"skipping checkpoint: {exc}{note}")
    return None
