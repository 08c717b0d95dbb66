"""MXNet's device kvstore (scaling.device_kvstore_s, `analyze --kvstore device`): its engine
operations and copies by hand, where it applies, its fit (benchmarks/fit_kvstore.py) and the
record blog's DGX-1 it was held out of."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import load_benchmark

from dlperf.analysis.scaling import (MXNET_KVSTORE_OP_S, ScaleConfig, device_kvstore_ops,
                                     device_kvstore_s, scale_out, scaling_curve)
from dlperf.errors import DlperfError
from dlperf.hardware.interconnect import PRESETS, Interconnect

ROOT = Path(__file__).resolve().parents[1]
NODE = Interconnect("n", "node", 100e9, 1e-6, "node", "test")


def test_engine_operations_and_copies_by_hand():
    # ResNet-50's 161 gradient tensors on 8 GPUs: per key 8 copies in, a sum, the copy back
    # to the stored value and 8 copies out, against one GPU's copy back, copy out and update
    # (the update runs either way): 2 x 8 = 16 more a key, 2,576 a step
    assert device_kvstore_ops(161, 8) == 2576
    assert device_kvstore_ops(161, 4) == 1288
    assert device_kvstore_ops(161, 1) == 0
    # two keys of 1 and 3 MB on 4 GPUs at 100 GB/s and 5 us an operation: 16 operations
    # (80 us) and 2 x 3/4 x 4 MB = 6 MB of copies (60 us) = 140 us, none beside the backward
    d = device_kvstore_s([("a", 1_000_000), ("b", 3_000_000)], 4, NODE, op_s=5e-6)
    assert d["engine_ops"] == 16 and d["keys"] == 2
    assert d["copy_s"] == pytest.approx(60e-6)
    assert d["comm_s"] == d["exposed_s"] == pytest.approx(140e-6)
    assert device_kvstore_s([("a", 1_000_000)], 1, NODE)["comm_s"] == 0.0
    # the shipped cost per operation by default
    assert device_kvstore_s([("a", 8)], 2, NODE)["op_s"] == MXNET_KVSTORE_OP_S


@pytest.mark.parametrize("kwargs", [
    dict(strategy="fsdp"), dict(distributed_optimizer=True), dict(gpus=16),
    dict(tp=2), dict(kvstore="local"), dict(kvstore_op_s=-1.0), dict(bucket_cap_mb=10.0),
    dict(bucket_view=True), dict(overlap=False), dict(nccl_algo="ring"),
    dict(nccl_proto="Simple")])
def test_the_kvstore_is_refused_where_mxnet_does_not_run_it(kwargs):
    base = dict(gpus=8, kvstore="device")
    with pytest.raises(DlperfError, match="kvstore"):
        ScaleConfig(**{**base, **kwargs})


def test_scale_out_under_the_kvstore_exposes_it_and_names_it():
    from test_scaling import _resnet18_on_h100

    analysis, params = _resnet18_on_h100()
    nvlink, ndr = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]
    nccl = scale_out(analysis, params, ScaleConfig(gpus=8, collective_sms=32), nvlink, ndr)
    kv = scale_out(analysis, params, ScaleConfig(gpus=8, kvstore="device", kvstore_op_s=1e-4),
                   nvlink, ndr)
    want = device_kvstore_s(params, 8, nvlink, 1e-4)["exposed_s"]  # 62 keys x 16 x 100 us
    assert kv["exposed_comm_s"] == pytest.approx(want) and want > 0.09
    assert kv["communication"]["kvstore"] == "device" and kv["communication"]["nccl"] is None
    assert kv["limited_by"] == "communication (MXNet's device kvstore)"
    assert kv["per_gpu_samples_per_s"] < nccl["per_gpu_samples_per_s"]
    # the same single-GPU step underneath: one step is longer by the kvstore's time less the
    # NCCL run's exposed all-reduce and bucket copies and its backward slowed beside the
    # hidden all-reduces (the kvstore's copies run on no NCCL SMs; the wait for the slowest
    # GPU alike)
    assert nccl["contention_s"] > 0 and kv["contention_s"] == 0
    assert kv["step_s"] - nccl["step_s"] == pytest.approx(
        want - nccl["exposed_comm_s"] - nccl["contention_s"])
    # one process drives one node: the curve stops at its GPUs
    curve = scaling_curve(analysis, params, ScaleConfig(gpus=8, kvstore="device"), nvlink, ndr)
    assert [r["gpus"] for r in curve] == [1, 2, 4, 8]


def test_least_squares_through_the_origin_by_hand():
    fit = load_benchmark("fit_kvstore")
    # x = [10, 20] operations, y = [1, 2] ms: sum(xy) / sum(x^2) = 50 / 500 = 0.1 ms = 1e-4 s
    assert fit.fit([{"ops": 10, "residual_ms": 1.0}, {"ops": 20, "residual_ms": 2.0}]) == \
        pytest.approx(1e-4)
    with pytest.raises(ValueError, match="more than one GPU"):
        fit.fit([{"ops": 0, "residual_ms": 1.0}])


def test_the_shipped_cost_is_the_saved_fit_and_the_record_is_held_out_within_5_percent():
    saved = json.loads((ROOT / "benchmarks/results/kvstore-fit.json").read_text())["results"]
    assert MXNET_KVSTORE_OP_S == pytest.approx(saved["op_s"], rel=1e-3)
    rows = {r["id"]: r for r in saved["rows"]}
    fitted = [r for r in rows.values() if r["role"] == "fit"]
    assert len(fitted) == 4 and all(r["flag"] == "kvstore-fit" for r in fitted)
    record = rows["record-dgx1-v100-x8"]
    assert record["role"] == "held out"
    # issue #14's proof: the blog's 7,850 img/s on one DGX-1, within 5%, the limit named
    assert record["total_measured"] == pytest.approx(7850)
    assert 0.95 <= record["total_predicted"] / 7850 <= 1.05
    assert record["limited_by"] == "communication (MXNet's device kvstore)"


def test_cli_kvstore(capsys):
    from conftest import run_cli

    code, _, err = run_cli(["analyze", "resnet18", "--train", "--kvstore", "device"], capsys)
    assert code == 2 and "--kvstore reduces the gradients of the scale-out: add --gpus" in err
    code, out, err = run_cli(["analyze", "resnet18", "--train", "--batch-size", "32",
                              "--device", "v100-sxm2", "--dtype", "fp16", "--gpus", "8",
                              "--kvstore", "device", "--top", "1"], capsys)
    assert code == 0, err
    flat = " ".join(out.split())
    assert "MXNet's device kvstore: 62 gradients, 992 engine operations" in flat
    code, _, err = run_cli(["analyze", "resnet18", "--train", "--gpus", "16", "--kvstore",
                            "device"], capsys)
    assert code == 2 and "at most --gpus-per-node (8) GPUs" in err
    code, _, err = run_cli(["analyze", "resnet18", "--train", "--gpus", "8", "--kvstore",
                            "device", "--bucket-cap-mb", "10", "--no-overlap"], capsys)
    assert code == 2 and "--bucket-cap-mb, --no-overlap shape DDP's NCCL all-reduce" in err


def test_the_record_says_what_the_kvstore_was_fitted_to_and_held_out_of(capsys):
    from dlperf.hardware.track_record import build_kvstore, describe_kvstore

    def row(id_, role, gpus, ratio, measured):
        return {"id": id_, "role": role, "gpus": gpus, "per_gpu_ratio": ratio,
                "total_measured": measured, "total_predicted": measured * ratio}

    entry = build_kvstore({"op_s": 5.43e-6, "rows": [
        row("a", "fit", 4, 0.871, 1559), row("b", "fit", 8, 1.034, 10263),
        row("record", "held out", 8, 1.044, 7850)]})
    assert [r["id"] for r in entry["fit"]] == ["a", "b"]
    assert entry["held_out"][0]["predicted_total"] == pytest.approx(8195.4)
    text = describe_kvstore({"kvstore": entry})
    assert "5.43 us an engine operation, fitted to 2 runs" in text
    assert "predicted 0.87-1.03x their rate per GPU" in text
    assert "the record blog's DGX-1 (8 GPUs, 7,850 samples/s measured, 1.044x)" in text
    assert describe_kvstore({}) is None
    # printed under a --kvstore prediction, from the shipped record
    from conftest import run_cli

    code, out, err = run_cli(["analyze", "resnet18", "--train", "--batch-size", "32",
                              "--gpus", "4", "--kvstore", "device", "--top", "1"], capsys)
    assert code == 0, err
    assert "held out, the record blog's DGX-1" in " ".join(out.split())
