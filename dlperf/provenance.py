"""Provenance: what a reader needs beside a number to compare it (machine, library versions,
git commit), and benchmark result files that carry it with their config."""

from __future__ import annotations

import datetime as _dt
import importlib
import os
import platform
import subprocess
import sys
from pathlib import Path

from dlperf.hardware.probe import cpu_name
from dlperf.files import write_json_atomic


def git_commit(cwd: str | Path | None = None) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=cwd, timeout=10)
        # uncommitted changes to what ran, not to result files a benchmark wrote before it
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                ".", ":(top,exclude)benchmarks/results"],
                               capture_output=True, text=True, cwd=cwd, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def environment() -> dict:
    """What a reader needs to compare a number: machine, versions, commit."""
    import torch

    env = {
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "hostname": platform.node(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "git_commit": git_commit(Path(__file__).resolve().parent),
    }
    try:
        import torchvision

        env["torchvision"] = torchvision.__version__
    except ImportError:
        pass
    from importlib import metadata

    env["packages"] = {}
    for dist in ("numpy", "pillow", "simplejpeg", "opencv-python-headless", "nvidia-dali-cuda120",
                 "nvidia-dali-cuda130", "ffcv", "numba", "rich", "matplotlib"):
        try:
            env["packages"][dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    # whether dlperf's own region JPEG decoder (the C extension) was built: input-pipeline
    # figures depend on it
    import importlib

    try:
        importlib.import_module("dlperf.data._jpegroi")
        env["dlperf_roi_decoder"] = True
    except ImportError:
        env["dlperf_roi_decoder"] = False
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()
    return env


def save_result(path: str | Path, name: str, config: dict, results: dict) -> Path:
    """A benchmark's result file: its name, the environment, its config and its results."""
    return write_json_atomic(path, {"benchmark": name, "environment": environment(),
                                    "config": config, "results": results})


def load_sibling(script: str | Path, name: str):
    """The module ``name`` from the folder of ``script`` (a benchmark's own ``__file__``).
    benchmarks/ is a folder of scripts, not a package: a script run as ``python
    benchmarks/x.py``, or loaded by the tests from its path, imports its siblings this way."""
    sys.path.insert(0, str(Path(script).resolve().parent))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)
