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


def toy_split(tmp_path_factory, per_class: int, val_per_class: int):
    """(train, val) folders of the toy JPEG dataset (tests/imagegen.py), for a module fixture."""
    from dlperf.data.toy import make_toy

    base = tmp_path_factory.mktemp("toy")
    return (make_toy(base / "train", per_class=per_class),
            make_toy(base / "val", per_class=val_per_class, seed=1))


def tiny_config(toy, out, epochs: int, batch_size: int, **overrides):
    """The tiny recipe on a toy split into ``out``, two loader threads, with ``overrides``."""
    from dlperf.train.recipes import apply_overrides, tiny

    return apply_overrides(tiny(), {"data": str(toy[0]), "val_data": str(toy[1]),
                                    "out_dir": str(out), "threads": 2, "epochs": epochs,
                                    "batch_size": batch_size, **overrides})


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
