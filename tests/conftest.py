import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark(name: str):
    """A script of benchmarks/ (not a package) imported as a module, for its functions."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_cli(argv, capsys):
    """`dlperf ARGV` in this process: (exit code, stdout, stderr)."""
    from dlperf.cli import main

    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Probe caches (hardware.probe.cached_cpu_probe) in a folder of this test session, never
    in the user's home."""
    import os

    old = os.environ.get("DLPERF_CACHE_DIR")
    os.environ["DLPERF_CACHE_DIR"] = str(tmp_path_factory.mktemp("dlperf-cache"))
    yield
    if old is None:
        os.environ.pop("DLPERF_CACHE_DIR", None)
    else:
        os.environ["DLPERF_CACHE_DIR"] = old


@pytest.fixture(autouse=True)
def _deterministic_threads():
    torch.manual_seed(0)
    yield
