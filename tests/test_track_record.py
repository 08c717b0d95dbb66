"""dlperf's track record per GPU (issue #11): built from the saved validation results, shown
beside every prediction on a preset."""

from __future__ import annotations

import json

import pytest
from conftest import load_benchmark
from conftest import run_cli as _run

from dlperf.analysis.api import AnalysisConfig
from dlperf.errors import DlperfError
from dlperf.hardware import track_record as tr
from dlperf.hardware.specs import PRESETS, DeviceSpec


def _config(model="resnet50", dtype="fp16", tokens=False):
    return AnalysisConfig(model=model, input_shape=(8, 3, 224, 224), dtype=dtype, tokens=tokens)


def test_shipped_record_is_rebuilt_from_the_saved_results_not_typed_in():
    script = load_benchmark("track_record")
    assert json.loads(tr.PATH.read_text()) == script.record_from_results(), (
        "dlperf/hardware/track_record.json is stale: run python benchmarks/track_record.py")


def test_build_condenses_clean_rows_per_device_and_class():
    published = [
        {"device": "a10", "class": "cnn-amp", "ratio": 0.9, "source": "lambda-x", "flag": "clean"},
        {"device": "a10", "class": "cnn-amp", "ratio": 1.5, "source": "lambda-x", "flag": "clean"},
        {"device": "a10", "class": "transformer-amp", "ratio": 1.3, "source": "dle-bert",
         "flag": "clean"},
        {"device": "a10", "class": "cnn-amp", "ratio": 9.0, "source": "x", "flag": "suspect: y"},
    ]
    scaling = [{"device": "h100-sxm", "model": "mpt-7b", "per_gpu_ratio": 1.2,
                "source": "llm-foundry-mpt", "flag": "clean"},
               {"device": "h100-sxm", "model": "resnet50", "per_gpu_ratio": 0.5,
                "source": "lambda", "flag": "clean"}]
    record = tr.build(published, scaling)
    # a10: the suspect row is left out; median of (0.9, 1.5, 1.3) = 1.3
    assert record["a10"]["all"] == {"rows": 3, "median": 1.3, "low": 0.9, "high": 1.5,
                                    "publishers": ["Lambda", "NVIDIA DeepLearningExamples"]}
    assert record["a10"]["classes"]["cnn-amp"]["median"] == pytest.approx(1.2)
    # decoders come from the scale-out table, per GPU; image rows there are not a class
    assert "all" not in record["h100-sxm"]
    assert record["h100-sxm"]["classes"] == {"decoder": {
        "rows": 1, "median": 1.2, "low": 1.2, "high": 1.2,
        "publishers": ["MosaicML llm-foundry"]}}


def test_describe_warns_on_a_systematic_record_and_names_the_workload():
    record = {"a10": {"all": {"rows": 6, "median": 1.32, "low": 0.93, "high": 1.49,
                              "publishers": ["Lambda"]},
                      "classes": {"cnn-amp": {"rows": 1, "median": 0.93, "low": 0.93,
                                              "high": 0.93, "publishers": ["Lambda"]}}},
              "h100-sxm": {"all": {"rows": 12, "median": 1.03, "low": 0.89, "high": 1.1,
                                   "publishers": ["Lambda"]}, "classes": {}}}
    text, warn = tr.describe(PRESETS["a10"], _config(), record)
    assert warn and "6 published runs (Lambda) predicted at 0.93-1.49x, median 1.32x" in text
    assert "CNNs in mixed precision: 1 run, median 0.93x" in text
    assert "150 W" in text  # the preset's caveat says why
    text, warn = tr.describe(PRESETS["h100-sxm"], _config(), record)
    assert not warn and "median 1.03x" in text
    # a preset no published row covers says so; a measured profile is this machine: no line
    text, _ = tr.describe(PRESETS["b200"], _config(), {})
    assert text.startswith("No published training run on")
    measured = DeviceSpec(name="m", display_name="m", sm_count=2, mem_bandwidth=1e10,
                          peak={"fp32": 1e11}, measured=True)
    assert tr.describe(measured, _config(), record) is None


@pytest.mark.parametrize("model,dtype,tokens,cls", [
    ("resnet50", "fp16", False, "cnn-amp"), ("resnet50", "fp32", False, "cnn-fp32-tf32"),
    ("bert-large", "fp16", True, "transformer-amp"), ("vit_b_16", "bf16", False,
                                                      "transformer-amp"),
    ("mpt-7b", "bf16", True, "decoder"), ("gpt", "fp32", True, "decoder"),
])
def test_workload_class(model, dtype, tokens, cls):
    assert tr.workload_class(_config(model, dtype, tokens)) == cls


def test_analyze_prints_the_record_and_saves_it(tmp_path, capsys):
    path = tmp_path / "r.json"
    code, out, err = _run(["analyze", "resnet18", "--device", "a10", "--batch-size", "8",
                           "--dtype", "fp16", "--json", str(path)], capsys)
    assert code == 0, err
    assert "Track record on NVIDIA A10" in " ".join(out.split())
    saved = json.loads(path.read_text())["track_record"]
    assert saved["workload_class"] == "cnn-amp" and saved["device"]["rows"] >= 6
    assert saved["systematic"] is True  # the 150 W A10's record is 1.3x optimistic


def test_a_spec_file_caveat_must_be_text():
    with pytest.raises(DlperfError, match="caveat must be a string"):
        DeviceSpec.from_dict({"name": "g", "sm_count": 1, "mem_bandwidth": 1e9,
                              "peak": {"fp32": 1e12}, "caveat": 3})
