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
    # the Hopper presets say where their own GEMM and attention shares come from
    assert "fitted to MosaicML's FSDP runs on H100s with a 2023 stack" in text
    assert "0.578" in text and "0.187" in text and "FlashAttention-2's (0.262" in text
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


def test_shipped_scale_out_record_is_rebuilt_from_the_saved_results():
    script = load_benchmark("track_record")
    assert json.loads(tr.SCALE_OUT_PATH.read_text()) == script.scale_out_record_from_results(), (
        "dlperf/hardware/scale_out_record.json is stale: run python benchmarks/track_record.py")


def _scaling_row(**kw):
    row = {"device": "v100-sxm2", "gpus": 8, "gpus_per_node": 8, "flag": "clean",
           "source": "lambda-x", "efficiency_ratio": None, "measured_efficiency": None,
           "relative_ratio": None, "limited_by": "compute"}
    return {**row, **kw}


def test_build_scale_out_keeps_one_node_and_across_node_rows_apart():
    scaling = [
        # one node, clean, with a one-GPU figure: ratios 1.02 and 1.10 (measured 0.98, 0.91)
        _scaling_row(efficiency_ratio=1.02, measured_efficiency=0.98),
        _scaling_row(gpus=4, efficiency_ratio=1.10, measured_efficiency=0.91,
                     source="nvidia-rn50-record-blog", device="a100-80gb"),
        # flagged, single GPU or no one-GPU figure: not in the one-node record
        _scaling_row(efficiency_ratio=1.5, measured_efficiency=0.6, flag="decode-rate-assumed"),
        _scaling_row(gpus=1, efficiency_ratio=1.0, measured_efficiency=1.0),
        # across nodes: relative scaling of compute-bound rows, flags named; an input-bound
        # row says nothing about what the network costs
        # (each against the same run at its smallest published scale: 8 GPUs, or 16 for the
        # run published from 16 GPUs up)
        _scaling_row(id="base8", gpus=8, source="llm-foundry-mpt"),
        _scaling_row(id="base16", gpus=16, gpus_per_node=16, source="llm-foundry-mpt"),
        _scaling_row(gpus=64, relative_ratio=1.08, flag="network-assumed",
                     source="llm-foundry-mpt", relative_base="base8"),
        _scaling_row(gpus=512, gpus_per_node=16, relative_ratio=1.02, source="llm-foundry-mpt",
                     relative_base="base16"),
        _scaling_row(gpus=16, relative_ratio=1.3, limited_by="input (host JPEG decode)"),
    ]
    record = tr.build_scale_out(scaling)
    # fewer than four ratios: the "middle half" is their whole range
    assert record["one_node"] == {"rows": 2, "median": 1.06, "low": 1.02, "high": 1.1,
                                  "publishers": ["Lambda", "NVIDIA"], "measured_low": 0.91,
                                  "measured_high": 0.98, "q1": 1.02, "q3": 1.1}
    assert record["by_device"]["v100-sxm2"]["median"] == 1.02
    assert record["across_nodes"] == {"rows": 2, "median": 1.05, "low": 1.02, "high": 1.08,
                                      "publishers": ["MosaicML llm-foundry"], "gpus_low": 64,
                                      "gpus_high": 512, "flags": ["network-assumed"],
                                      "base_gpus_low": 8, "base_gpus_high": 16,
                                      "base_one_node": 2,
                                      "q1": 1.02, "q3": 1.08}
    text, warn = tr.describe_scale_out(PRESETS["v100-sxm2"], record)
    assert text.startswith("Track record, scale-out: on one node, 2 published runs")
    assert "measured 91.0%-98.0% of their one-GPU rate" in text
    assert "NVIDIA V100-SXM2 (32 GB): 1 run, median 1.02x" in text
    assert ("across nodes, 2 runs of 64-512 GPUs against their rate on 8-16 GPUs (one node "
            "for 2 of them)") in text
    assert not warn
    # a record saved before the bases were: 8 GPUs
    legacy = {k: v for k, v in record["across_nodes"].items() if not k.startswith("base")}
    assert "against their rate on 8:" in tr.describe_scale_out(
        PRESETS["v100-sxm2"], {**record, "across_nodes": legacy})[0]
    # this GPU's own record off by more than 8% warns; a measured profile gets no line
    _, warn = tr.describe_scale_out(PRESETS["a100-80gb"], {
        **record, "by_device": {"a100-80gb": {**record["one_node"], "median": 1.1}}})
    assert warn
    measured = DeviceSpec(name="m", display_name="m", sm_count=2, mem_bandwidth=1e10,
                          peak={"fp32": 1e11}, measured=True)
    assert tr.describe_scale_out(measured, record) is None
    assert tr.describe_scale_out(PRESETS["v100-sxm2"], {}) is None


def saved_efficiency(path) -> float:
    return json.loads(path.read_text())["scale_out"]["at_requested_scale"]["scaling_efficiency"]


def test_analyze_gpus_prints_and_saves_the_scale_out_record(tmp_path, capsys):
    path, page = tmp_path / "s.json", tmp_path / "s.html"
    code, out, err = _run(["analyze", "resnet50", "--device", "v100-sxm2", "--batch-size", "64",
                           "--dtype", "fp16", "--train", "--gpus", "8", "--interconnect",
                           "nvlink2-dgx1", "--json", str(path), "--html", str(page)], capsys)
    assert code == 0, err
    assert "Track record, scale-out: on one node" in " ".join(out.split())
    saved = json.loads(path.read_text())["scale_out"]["track_record"]
    shipped = tr.load_scale_out()
    assert saved["one_node"] == shipped["one_node"]
    assert saved["device"] == shipped["by_device"]["v100-sxm2"]
    assert saved["text"].startswith("Track record, scale-out")
    # the band is the shipped record's: V100's own nine one-node runs
    band = tr.efficiency_band(saved_efficiency(path), 1, "v100-sxm2")
    assert saved["efficiency_band"] == pytest.approx(list(band)) and band[0] < band[1]
    assert "Read through that record" in " ".join(out.split())
    assert "Track record, scale-out" in page.read_text()


def test_efficiency_band_reads_a_prediction_through_the_middle_half_of_the_record():
    # ratios 1.00, 1.02, 1.04, 1.06, 1.20: quartiles (inclusive) 1.02 and 1.06
    rows = [_scaling_row(efficiency_ratio=x, measured_efficiency=0.9)
            for x in (1.0, 1.02, 1.04, 1.06, 1.2)]
    rows += [_scaling_row(gpus=g, relative_ratio=x)
             for g, x in ((16, 1.0), (32, 1.05), (64, 1.10), (128, 1.15))]
    record = tr.build_scale_out(rows)
    assert (record["one_node"]["q1"], record["one_node"]["q3"]) == (1.02, 1.06)
    # across nodes: 1.0, 1.05, 1.10, 1.15 -> 1.0375 and 1.1125
    assert (record["across_nodes"]["q1"], record["across_nodes"]["q3"]) == (1.038, 1.113)
    # one node: 0.99 / 1.06 = 0.934 .. 0.99 / 1.02 = 0.971
    low, high = tr.efficiency_band(0.99, 1, "v100-sxm2", record)
    assert (low, high) == (pytest.approx(0.99 / 1.06), pytest.approx(0.99 / 1.02))
    # across nodes the one-node and across-node quartiles multiply
    low, high = tr.efficiency_band(0.99, 8, "v100-sxm2", record)
    assert (low, high) == (pytest.approx(0.99 / 1.06 / 1.113), pytest.approx(0.99 / 1.02 / 1.038))
    # a GPU with four runs of its own uses them (a100: 1.10 x 4 -> 0.9)
    a100 = [_scaling_row(device="a100-80gb", efficiency_ratio=1.1, measured_efficiency=0.9)] * 4
    record = tr.build_scale_out(rows + a100)
    assert tr.efficiency_band(0.99, 1, "a100-80gb", record)[0] == pytest.approx(0.9)
    assert tr.efficiency_band(0.99, 1, "v100-sxm2", {}) is None


def test_a_host_decode_is_read_through_the_runs_that_had_one():
    # Clean runs (synthetic data, DALI): ratios 1.00-1.06. Runs whose host decoded the JPEGs,
    # flagged for their assumed per-core rate: 1.10, 1.15, 1.18, 1.20 (measured 0.82-0.86):
    # quartiles (inclusive) 1.1375 (1.137 once rounded: the float is 1.13749...) and 1.185
    rows = [_scaling_row(efficiency_ratio=x, measured_efficiency=0.97)
            for x in (1.0, 1.02, 1.04, 1.06)]
    rows += [_scaling_row(efficiency_ratio=x, measured_efficiency=m, decode="cpu",
                          flag="decode-rate-assumed", source="dle-convnets")
             for x, m in ((1.10, 0.86), (1.15, 0.85), (1.18, 0.83), (1.20, 0.82))]
    # a run fed by DALI's CPU pipeline (C++ threads, not the DataLoader's worker processes)
    # is not one of them: it stays out of the band
    dali = _scaling_row(efficiency_ratio=1.01, measured_efficiency=0.97, decode="cpu",
                        loader="dali-cpu", flag="decode-rate-assumed", source="dle-convnets")
    record = tr.build_scale_out(rows + [dali])
    assert record["one_node"]["rows"] == 4  # the flagged rows stay out of the clean record
    host = record["host_decode"]
    assert (host["rows"], host["median"], host["q1"], host["q3"]) == (4, 1.165, 1.137, 1.185)
    assert (host["measured_low"], host["measured_high"]) == (0.82, 0.86)
    # a prediction of 0.98 with --decode cpu: 0.98 / 1.185 = 0.827 .. 0.98 / 1.137 = 0.862
    low, high = tr.efficiency_band(0.98, 1, "v100-sxm2", record, host_decode=True)
    assert (low, high) == (pytest.approx(0.98 / 1.185), pytest.approx(0.98 / 1.137))
    # without it, the clean runs' band (1.015 .. 1.045)
    assert tr.efficiency_band(0.98, 1, "v100-sxm2", record)[0] == pytest.approx(0.98 / 1.045)
    text, warn = tr.describe_scale_out(PRESETS["v100-sxm2"], record, host_decode=True)
    assert "with the host's CPU decoding the JPEGs, as here, 4 runs" in text and warn
    assert "host's CPU" not in tr.describe_scale_out(PRESETS["v100-sxm2"], record)[0]


def test_the_shipped_host_decode_record_holds_the_named_amp_run():
    # NVIDIA's PyTorch ResNet-50 AMP on 8 A100s with its CPU loader (issue #14): dlperf predicts
    # ~98% of one GPU; read through the runs whose host decoded (46 since the 20.12 tables came
    # in), the band holds the 84.1% it measured (2,077.6 / 2,470)
    from conftest import ROOT

    saved = json.loads((ROOT / "benchmarks/results/validation-scaling.json").read_text())
    row = {r["id"]: r for r in saved["results"]["rows"]}["nvidia-pt-a100-x8-amp"]
    record = tr.load_scale_out()
    assert record["host_decode"]["rows"] == 46
    low, high = tr.efficiency_band(row["predicted_efficiency"], 1, "a100-80gb", record,
                                   host_decode=True)
    assert row["measured_efficiency"] == pytest.approx(2077.6 / 2470)
    assert low < row["measured_efficiency"] < high


def test_analyze_with_a_host_decode_prints_and_saves_that_record(tmp_path, capsys):
    path = tmp_path / "s.json"
    code, out, err = _run(["analyze", "resnet50", "--device", "a100-80gb", "--batch-size", "64",
                           "--dtype", "fp16", "--train", "--gpus", "8", "--decode", "cpu",
                           "--data-cores", "16", "--decode-rate", "215", "--json", str(path)],
                          capsys)
    assert code == 0, err
    assert "with the host's CPU decoding the JPEGs, as here" in " ".join(out.split())
    saved = json.loads(path.read_text())["scale_out"]["track_record"]
    assert saved["host_decode"] == tr.load_scale_out()["host_decode"]
    band = tr.efficiency_band(saved_efficiency(path), 1, "a100-80gb", host_decode=True)
    assert saved["efficiency_band"] == pytest.approx(list(band))


def test_a_dali_cpu_decode_is_read_through_the_runs_of_that_pipeline(tmp_path, capsys):
    # DALI's CPU pipeline lost 1-13% from one GPU to eight on NVIDIA's 20.06 systems where
    # torch's DataLoader lost 13-22% on the same ones: `--loader dali-cpu` reads through its
    # own runs. Three DALI runs at 1.00, 1.02, 1.04 and one at 1.10: quartiles (inclusive)
    # 1.015 and 1.055; a prediction of 0.98: 0.98 / 1.055 .. 0.98 / 1.015
    rows = [_scaling_row(efficiency_ratio=x, measured_efficiency=0.95, decode="cpu",
                         loader="dali-cpu", flag="decode-rate-assumed", source="dle-convnets")
            for x in (1.0, 1.02, 1.04, 1.10)]
    rows += [_scaling_row(efficiency_ratio=1.2, measured_efficiency=0.8, decode="cpu",
                          flag="decode-rate-assumed", source="dle-convnets")] * 4
    record = tr.build_scale_out(rows)
    assert record["host_decode"]["rows"] == 4 and record["host_decode_dali"]["rows"] == 4
    low, high = tr.efficiency_band(0.98, 1, "v100-sxm2", record, host_decode=True,
                                   loader="dali-cpu")
    assert (low, high) == (pytest.approx(0.98 / 1.055), pytest.approx(0.98 / 1.015))
    text, _ = tr.describe_scale_out(PRESETS["v100-sxm2"], record, host_decode=True,
                                    loader="dali-cpu")
    assert "decoding the JPEGs in DALI's CPU pipeline, as here, 4 runs" in text
    # through the CLI, with the shipped record; and the flag alone is refused in one line
    path = tmp_path / "s.json"
    code, out, err = _run(["analyze", "resnet50", "--device", "a100-40gb", "--batch-size", "64",
                           "--dtype", "fp16", "--train", "--gpus", "8", "--decode", "cpu",
                           "--data-cores", "16", "--decode-rate", "215", "--loader",
                           "dali-cpu", "--json", str(path)], capsys)
    assert code == 0, err
    saved = json.loads(path.read_text())["scale_out"]["track_record"]
    assert saved["loader"] == "dali-cpu"
    assert saved["host_decode"] == tr.load_scale_out()["host_decode_dali"]
    assert saved["host_decode"]["rows"] == 18
    code, out, err = _run(["analyze", "resnet50", "--loader", "dali-cpu"], capsys)
    assert code == 2 and "--loader names the pipeline" in err and "Traceback" not in err


def test_tensor_parallel_record_reads_validate_tps_pairs():
    from dlperf.hardware.track_record import build_tensor_parallel, describe_tensor_parallel

    # TP / FSDP per GPU: measured 0.70 and 0.65 (TP costs 30% and 35%), predicted 0.95 and
    # 0.85 (5% and 15%); predicted over measured 0.95 / 0.70 = 1.357 and 0.85 / 0.65 = 1.308
    pairs = [{"measured": 0.70, "predicted": 0.95, "ratio": 0.95 / 0.70},
             {"measured": 0.65, "predicted": 0.85, "ratio": 0.85 / 0.65}]
    entry = build_tensor_parallel({"tp_over_fsdp": pairs})
    assert entry["runs"] == 2
    assert entry["measured_loss_low"] == pytest.approx(0.30)
    assert entry["measured_loss_high"] == pytest.approx(0.35)
    assert entry["predicted_loss_high"] == pytest.approx(0.15)
    assert entry["ratio_high"] == pytest.approx(1.357, abs=1e-3)
    text = describe_tensor_parallel({"tensor_parallel": entry})
    assert "TP cost 30%-35%" in text and "predicts 5%-15%" in text
    assert "up to 1.4x optimistic" in text
    assert describe_tensor_parallel({}) is None  # no record: nothing printed
    # with Megatron's weak scaling: TP=N over TP=1 predicted over measured, e.g. 0.952 / 0.913
    # = 1.043 and 0.777 / 0.730 = 1.064
    megatron = {"tp_over_tp1": [{"ratio": 0.952 / 0.913}, {"ratio": 0.777 / 0.730}]}
    entry = build_tensor_parallel({"tp_over_fsdp": pairs}, megatron)
    assert entry["megatron"]["runs"] == 2
    assert entry["megatron"]["ratio_low"] == pytest.approx(1.043, abs=1e-3)
    assert entry["megatron"]["ratio_high"] == pytest.approx(1.064, abs=1e-3)
    text = describe_tensor_parallel({"tensor_parallel": entry})
    assert "two published sources" in text and "predicted 1.04-1.06x what was measured" in text
    assert "TP cost 30%-35%" in text and "up to 1.4x optimistic" in text
    # and Megatron's 22B-1T: the paper's method over full recompute, measured and predicted
    # (1.42 / 1.10 = 1.291 and 18.13 / 13.75 = 1.319), and the pipelined iterations' measured
    # rate over dlperf's (iteration predicted over measured: 1 / 0.86 = 1.16, 1 / 0.97 = 1.03;
    # the one-stage 22B row not among them)
    entry = build_tensor_parallel(
        {"tp_over_fsdp": pairs}, megatron,
        {"speedups": [{"measured": 1.42 / 1.10, "predicted": 1.38},
                      {"measured": 18.13 / 13.75, "predicted": 1.40}],
         "iterations": [{"pp": 1, "ratio": 0.5, "gpus": 8}, {"pp": 8, "ratio": 0.86, "gpus": 64},
                        {"pp": 35, "ratio": 0.97, "gpus": 280}]})
    text = describe_tensor_parallel({"tensor_parallel": entry})
    assert "three published sources" in text and "(run as --tp-impl megatron --fusion megatron)" in text
    assert ("ran 1.29-1.32x as fast as full recompute without it, and dlperf predicts "
            "1.38-1.40x. 2 pipelined Megatron-LM runs (--pp; 64-280 GPUs) ran at 1.03-1.16x "
            "dlperf's rate" in text)
    # Narayanan et al.'s runs join the pipelined ones: predicted over measured 0.89 more
    entry = build_tensor_parallel({"tp_over_fsdp": pairs}, megatron, None,
                                  {"rows": [{"ratio": 0.89, "gpus": 1536}]})
    text = describe_tensor_parallel({"tensor_parallel": entry})
    assert "three published sources" in text and "(--pp; 1,536-1,536 GPUs) ran at 1.12-1.12x" \
        in text
    # torchtitan's async TP over vanilla TP: measured 652.4 / 597.3 = 1.092 and 4,809.4 /
    # 4,378 = 1.099, predicted 1.169 and 1.144
    entry = build_tensor_parallel({"tp_over_fsdp": pairs}, megatron, None, None, None, None,
                                  {"async_over_vanilla": [
                                      {"measured": 652.4 / 597.3, "predicted": 1.169},
                                      {"measured": 4809.4 / 4378, "predicted": 1.144}]})
    assert entry["sources"] == 3 and entry["async"]["runs"] == 2
    text = " ".join(describe_tensor_parallel({"tensor_parallel": entry}).split())
    assert ("async TP (--tp-impl torch-async) ran 1.09-1.10x as fast as vanilla TP where dlperf "
            "predicts 1.14-1.17x" in text)
    assert "float8" not in text
    # with the table's float8 rows: async's gain by recipe apart from BF16's, and each
    # recipe's predicted over measured rates (e.g. tensorwise 1.11 and 1.30, rowwise 1.35)
    gains = [{"measured": 1.092, "predicted": 1.162}, {"measured": 1.099, "predicted": 1.132},
             {"measured": 1.164, "predicted": 1.129, "fp8": "tensorwise"},
             {"measured": 1.097, "predicted": 1.103, "fp8": "tensorwise"},
             {"measured": 1.042, "predicted": 1.045, "fp8": "rowwise"}]
    rows = [{"ratio": 1.08}, {"ratio": 1.23}, {"ratio": 1.11, "fp8": "tensorwise"},
            {"ratio": 1.30, "fp8": "tensorwise"}, {"ratio": 1.35, "fp8": "rowwise"}]
    entry = build_tensor_parallel({"tp_over_fsdp": pairs}, megatron, None, None, None, None,
                                  {"async_over_vanilla": gains, "rows": rows})
    assert entry["async"]["runs"] == 2 and entry["async"]["measured_high"] == 1.099
    assert list(entry["async"]["float8"]) == ["tensorwise", "rowwise"]
    assert entry["async"]["float8"]["tensorwise"]["predicted_low"] == 1.103
    text = " ".join(describe_tensor_parallel({"tensor_parallel": entry}).split())
    assert ("async TP gained tensorwise 1.10-1.16x, predicted 1.10-1.13x; rowwise 1.04-1.04x, "
            "predicted 1.04-1.04x; dlperf's rates with float8 are tensorwise 1.11-1.30x, "
            "rowwise 1.35-1.35x the measured ones (BF16: 1.08-1.23x" in text)
    assert "torchtitan#1207" in text
    # Megatron-Core's 2024 table: the consistent reading's predicted over measured, e.g. 0.91,
    # 0.98 and 1.04 on 768, 1,536 and 48 GPUs (median 0.98)
    core = {"consistent": [{"ratio": 0.91, "gpus": 768}, {"ratio": 1.04, "gpus": 48},
                           {"ratio": 0.98, "gpus": 1536}]}
    entry = build_tensor_parallel({"tp_over_fsdp": pairs}, megatron, None, None, core)
    assert entry["megatron_core"] == {
        "runs": 3, "ratio_low": 0.91, "ratio_high": 1.04, "median": 0.98, "gpus_low": 48,
        "gpus_high": 1536, "source": "Megatron-Core's 1.7B-462B GPTs on H100s (2024)"}
    text = " ".join(describe_tensor_parallel({"tensor_parallel": entry}).split())
    assert "three published sources" in text
    assert ("(3 runs, 48-1,536 GPUs; run as --tp-impl te --distributed-optimizer, interleaved "
            "pipelines with --pp-overlap-p2p), dlperf predicted 0.91-1.04x the measured rate "
            "(median 0.98x)") in text


def test_llama3_record_and_the_context_parallel_sentence():
    from dlperf.hardware.track_record import (build_tensor_parallel, describe_context_parallel,
                                              describe_tensor_parallel)

    pairs = [{"measured": 0.70, "predicted": 0.95, "ratio": 0.95 / 0.70}]
    megatron = {"tp_over_tp1": [{"ratio": 1.04}]}

    def row(label, cp, stack, micro, causal, full, gpus=16384, memory=90 * 2**30):
        return {"row": label, "cp": cp, "seq": 131072 if cp > 1 else 8192, "gpus": gpus,
                "stack": stack, "micro_batch": micro, "ratio_causal": causal,
                "ratio_full": full, "memory_per_gpu_bytes": memory,
                "gradient_bytes_per_gpu": 11.9 * 2**30}

    # the overlapped stack's 8K rows at micro-batch 1 span 0.96 (causal) to 1.01 (full);
    # the rows of micro-batch 2 and the eager stack's 8K rows are not read; the memory is the
    # row on the fewest GPUs' (8,192)
    rows = [row("8K a", 1, "overlapped", 1, 0.96, 0.99, gpus=8192, memory=85.0 * 2**30),
            row("8K b", 1, "overlapped", 1, 0.97, 1.01),
            row("8K a", 1, "overlapped", 2, 0.50, 0.50), row("8K a", 1, "eager", 1, 0.8, 0.8),
            row("CP", 16, "overlapped", 1, 0.75, 1.06), row("CP", 16, "overlapped", 2, 0.7, 0.9),
            row("CP", 16, "eager", 1, 0.54, 0.76), row("CP", 16, "eager", 2, 0.50, 0.69)]
    relative = [{"stack": "overlapped", "micro_batch": 1, "count": "causal",
                 "measure": "16,384 over 8,192 GPUs at 8K", "measured": 0.930,
                 "predicted": 0.943}]
    entry = build_tensor_parallel({"tp_over_fsdp": pairs}, megatron,
                                  llama3={"rows": rows, "relative": relative})
    m = entry["llama3"]
    assert (m["rate_low"], m["rate_high"]) == (0.96, 1.01)
    assert (m["cp_causal"], m["cp_full"]) == (0.75, 1.06)
    # the eager stack's CP rows at micro-batch 1 only: 0.54 causal to 0.76 full
    assert (m["cp_eager_low"], m["cp_eager_high"]) == (0.54, 0.76)
    assert entry["sources"] == 3
    text = describe_tensor_parallel({"tensor_parallel": entry})
    assert "three published sources" in text
    assert "0.96-1.01x the 8K rows' rate and a fall to 0.943 of it" in text
    assert "where 0.930 was measured" in text
    assert ("it puts 85 GiB on each GPU of a run that fit in 80 GB without recompute, 12 GiB "
            "of it the stage's FP32 gradients held whole through the micro-batches") in text
    cp = describe_context_parallel({"tensor_parallel": entry})
    assert "Llama 3 405B at 128K tokens with CP 16 (all-gather) on 16,384 H100s" in cp
    assert "0.75x its rate counting the causal half" in cp and "1.06x counting the whole" in cp
    assert "0.54-0.76x with PyTorch's collectives exposed" in cp
    # no such record: says that nothing has checked it
    assert "not yet checked against a published run" in describe_context_parallel({})


def test_memory_pressure_splits_the_runs_at_the_share_of_a_full_gpu():
    # 100 GiB cards, the allocator's share read as a reserved / predicted ratio of 0.8: a
    # 72 GiB peak counts as 90 GiB (0.9, full), a 71 GiB one as 88.75 (0.8875, not)
    gib = 2 ** 30

    def row(id_, peak_gib, ratio, flag="clean"):
        return {"id": id_, "device": "d", "flag": flag, "per_gpu_ratio": ratio,
                "memory_per_gpu": {"peak_bytes": peak_gib * gib}}

    rows = [row("a", 72, 1.20), row("b", 80, 1.00), row("c", 71, 1.30), row("d", 10, 0.95),
            row("e", 90, 1.50, flag="suspect: x"), {"id": "f", "device": "d",
                                                    "flag": "clean", "per_gpu_ratio": 1.0}]
    p = tr.build_memory_pressure(rows, 0.8, lambda device: 100 * gib)
    assert p["full"]["rows"] == 2 and p["full"]["missed"] == 1  # a (1.20 > 1.15), b
    assert p["full"]["missed_ids"] == ["a"] and p["full"]["median"] == pytest.approx(1.1)
    assert p["rest"]["rows"] == 2 and p["rest"]["missed_ids"] == ["c"]  # c, d; e flagged
    record = {"memory_pressure": p}
    # a 75 GiB peak on the same card: 75 / 0.8 / 100 = 94%
    text = tr.describe_memory_pressure({"peak_bytes": 75 * gib, "capacity_bytes": 100 * gib},
                                       record)
    assert "fills ~94% of each GPU's memory" in text
    assert "Of the 2 published runs predicted at 90% or more, dlperf predicted 1 more than " \
           "15% too fast (median predicted / measured 1.10), against 1 of the 2 below" in text
    assert tr.describe_memory_pressure({"peak_bytes": 70 * gib, "capacity_bytes": 100 * gib},
                                       record) is None  # 87.5%
    assert tr.describe_memory_pressure({"peak_bytes": 75 * gib}, record) is None
    assert tr.describe_memory_pressure({"peak_bytes": 120 * gib, "capacity_bytes": 100 * gib,
                                        "fits": False}, record) is None  # "does not fit"
    assert tr.describe_memory_pressure({"peak_bytes": 75 * gib,
                                        "capacity_bytes": 100 * gib}, {}) is None
    # the shipped record: MosaicML's 13B on 8 A100 40GB and 30B on 8 A100 80GB among the
    # full runs that were predicted too fast
    shipped = tr.load_scale_out()["memory_pressure"]
    assert "lf2305-mpt-13b-a100-40gb-x8-s2048" in shipped["full"]["missed_ids"]
    assert shipped["full"]["missed"] / shipped["full"]["rows"] > \
        shipped["rest"]["missed"] / shipped["rest"]["rows"]


def test_cli_warns_when_the_scale_out_fills_the_gpus(capsys, tmp_path):
    # the same small FSDP run on an A100 80GB and on a copy of it with just enough memory for
    # its peak to fill 95% of the card once the allocator's share is counted
    import dataclasses

    argv = ["analyze", "gpt", "--layers", "2", "--d-model", "256", "--heads", "4",
            "--seq-len", "256", "--train", "--dtype", "bf16", "--precision", "fsdp",
            "--batch-size", "8", "--gpus", "8", "--strategy", "fsdp", "--top", "1"]
    out = tmp_path / "roomy.json"
    code, text, err = _run(argv + ["--device", "a100-80gb", "--json", str(out)], capsys)
    assert code == 0, err
    assert "Counting the allocator's share" not in text
    peak = json.loads(out.read_text())["scale_out"]["at_requested_scale"]["memory_per_gpu"][
        "peak_bytes"]
    reserved = tr.load_scale_out()["memory_pressure"]["reserved_ratio"]
    spec = dataclasses.asdict(PRESETS["a100-80gb"])
    spec.update(name="small-a100", memory_bytes=int(peak / reserved / 0.95))
    path = tmp_path / "small.json"
    path.write_text(json.dumps(spec))
    page = tmp_path / "small.html"
    code, text, err = _run(argv + ["--device", str(path), "--interconnect", "nvlink3-a100,ib-hdr",
                                   "--html", str(page)], capsys)
    assert code == 0, err
    assert "this run fills ~95% of each GPU's memory" in " ".join(text.split())
    assert "this run fills ~95% of each GPU&#x27;s memory" in page.read_text()  # and the page


def _kernel_classes_result():
    """A gpu_kernel_classes.py result: TF32 NCHW and channels_last, one class each worth
    checking by hand."""
    def run(conv_meas, conv_pred, bn_meas, bn_pred, stream_meas, stream_pred):
        by = {c: {"measured_s": 0.0, "predicted_s": 0.0} for c in (
            "conv forward", "conv dgrad", "conv wgrad", "batch norm forward",
            "batch norm backward")}
        by["conv forward"] = {"measured_s": conv_meas, "predicted_s": conv_pred}
        by["batch norm backward"] = {"measured_s": bn_meas, "predicted_s": bn_pred}
        return {"config": {"batch": 128}, "by_class": by,
                "measured_s": conv_meas + bn_meas + stream_meas,
                "predicted_s": conv_pred + bn_pred + stream_pred,
                "stream_achieved_bytes_per_s": 4.14e12, "stream_model_bytes_per_s": 2.11e12}
    return {"config": {"measured_on": {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130",
                                       "cudnn": 91900}},
            "results": {
                # NCHW: 27 ms of convolutions predicted 17; all kernels 60 measured, 59 predicted
                "runs": {"tf32-nchw": run(0.027, 0.017, 0.023, 0.022, 0.010, 0.020),
                         # channels_last: 18 ms of convolutions; 42 measured, 59 predicted
                         "tf32-cl": run(0.018, 0.017, 0.014, 0.022, 0.010, 0.020)},
                "layout_contrasts": [
                    {"precision": "tf32", "pass": "conv forward", "nchw_measured_s": 0.027,
                     "cl_measured_s": 0.018}],
                "ladder_tf32_channels_last": {"measured_gain": 1.433, "predicted_gain": 1.0}}}


def test_kernel_record_condenses_a_lent_gpus_classes():
    k = tr.build_kernels(_kernel_classes_result(), "benchmarks/results/x.json")
    assert k["gpu"] == "NVIDIA H200" and k["stack"] == "torch 2.11.0, cuDNN 9.19"
    # predicted over measured: all kernels 0.059 / 0.060; convolutions 0.017 / 0.027
    nchw = k["runs"]["tf32-nchw"]
    assert nchw["kernels"] == round(0.059 / 0.060, 3) and nchw["convolutions"] == 0.63
    assert k["runs"]["tf32-cl"]["kernels"] == round(0.059 / 0.042, 3)
    assert nchw["stream_tb_s"] == 4.14 and nchw["model_stream_tb_s"] == 2.11
    assert k["nchw_over_cl_convolutions"] == {"tf32": 1.5}  # 27 / 18 ms
    assert k["ladder_tf32_channels_last"] == {"measured": 1.433, "predicted": 1.0}


def test_describe_kernels_names_the_layout_gain_and_the_misses_it_measured():
    from dlperf.hardware.specs import get_device

    record = {"kernels": tr.build_kernels(_kernel_classes_result(), "benchmarks/results/x.json")}
    h200 = get_device("h200")

    def cfg(**kw):
        return AnalysisConfig(model="resnet50", input_shape=(128, 3, 224, 224),
                              **{"dtype": "fp32", "tf32": True, **kw})
    nchw = tr.describe_kernels(h200, cfg(), record)
    # within 2% overall, but channels_last gained 1.43x where dlperf says 1.00x
    assert "as fast as dlperf predicted" in nchw and "1.50x the time" in nchw
    assert "1.43x faster, where dlperf's shipped model predicts 1.00x" in nchw
    assert "use channels_last" in nchw
    cl = tr.describe_kernels(h200, cfg(channels_last=True), record)
    assert "1.41x faster than dlperf predicted" in cl  # 59 / 42 ms = 1.405 (stored 3 places)
    assert "4.1 TB/s against the model's 2.1" in cl and "use channels_last" not in cl
    # no record for this precision (strict FP32 here), a GPU without TF32, fp16, a measured
    # profile or a transformer: nothing to say
    assert tr.describe_kernels(h200, cfg(tf32=False), record) is None
    assert tr.describe_kernels(get_device("v100-sxm2"), cfg(), record) is None
    assert tr.describe_kernels(h200, cfg(tf32=False, dtype="fp16"), record) is None
    gpt = AnalysisConfig(model="gpt", input_shape=(8, 1024), dtype="fp32", tf32=True,
                         tokens=True)
    assert tr.describe_kernels(h200, gpt, record) is None
    assert tr.describe_kernels(h200, cfg(), {}) is None


def test_the_shipped_kernel_record_is_printed_beside_a_tf32_nchw_cnn():
    # the shipped record (results/h200-kernel-classes.json) reaches the track record line
    from dlperf.hardware.specs import get_device

    text, warn = tr.describe(get_device("h100-sxm"), AnalysisConfig(
        model="resnet50", input_shape=(128, 3, 224, 224), dtype="fp32", tf32=True))
    assert warn and "On a lent NVIDIA H200" in text and "use channels_last" in text
