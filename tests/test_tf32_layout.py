"""TF32 and layout: what --measure runs (both TF32 switches as the analysis says), the TF32 NCHW
layout term of the roofline (``Efficiency.tf32_nchw``), the per-kernel-class summary of a lent
GPU's measurements (benchmarks/gpu_kernel_classes.py) and the efficiency fit's experiment flags."""

import dataclasses
import math

import numpy as np
import pytest
import torch
from torch import nn

import dlperf
from dlperf.analysis import measure as measure_mod
from dlperf.analysis.api import AnalysisConfig
from dlperf.analysis.measure import MeasureConfig, measure
from dlperf.dtypes import tf32_flags
from dlperf.errors import DlperfError
from dlperf.hardware.efficiency import FITTED, check_overrides
from dlperf.hardware.specs import DeviceSpec, get_device
from conftest import load_benchmark

CPU = DeviceSpec(name="cpu", display_name="test cpu", sm_count=2, mem_bandwidth=20e9,
                 peak={"fp32": 100e9}, tensor_cores=False, measured=True)


@pytest.fixture
def restore_flags():
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
           torch.backends.cudnn.benchmark)
    yield
    (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
     torch.backends.cudnn.benchmark) = old


@pytest.mark.parametrize("enabled", [False, True])
def test_tf32_flags_sets_both_switches_and_restores_them(enabled, restore_flags):
    # PyTorch's defaults disagree (cuDNN's TF32 on, cuBLAS's off); set the opposite of what
    # the body asks, so that both a set and a restore can be seen
    torch.backends.cuda.matmul.allow_tf32 = not enabled
    torch.backends.cudnn.allow_tf32 = not enabled
    torch.backends.cudnn.benchmark = False
    with tf32_flags(enabled, cudnn_benchmark=True):
        assert torch.backends.cuda.matmul.allow_tf32 is enabled
        assert torch.backends.cudnn.allow_tf32 is enabled
        assert torch.backends.cudnn.benchmark is True
    assert torch.backends.cuda.matmul.allow_tf32 is (not enabled)
    assert torch.backends.cudnn.allow_tf32 is (not enabled)
    assert torch.backends.cudnn.benchmark is False
    with pytest.raises(RuntimeError):  # restored on an exception too
        with tf32_flags(enabled):
            raise RuntimeError("boom")
    assert torch.backends.cudnn.allow_tf32 is (not enabled)


@pytest.mark.parametrize("tf32", [False, True])
def test_measure_runs_the_steps_with_the_tf32_switches_of_the_analysis(tf32, monkeypatch,
                                                                         restore_flags):
    # cuDNN's TF32 switch left at PyTorch's default (on) made an "fp32" measurement run TF32
    # convolutions against a strict-FP32 prediction (the second lent H200's first call)
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = False
    seen = []
    real = measure_mod.capture

    def spy(*args, **kwargs):
        seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
        return real(*args, **kwargs)
    monkeypatch.setattr(measure_mod, "capture", spy)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                        nn.Linear(8 * 8 * 8, 10))
    cfg = AnalysisConfig(model="net", input_shape=(2, 3, 8, 8), dtype="fp32", tf32=tf32,
                         train=True, device="cpu", optimizer="none")
    measure(net, cfg, CPU, "cpu", cfg=MeasureConfig(steps=1, warmup=1))
    assert seen == [(tf32, tf32)] * 2
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (
        False, True)  # the caller's settings back


def _tf32_conv_passes(share):
    """The forward, dgrad and wgrad predictions of a TF32 NCHW 1x1 convolution, 64 -> 256
    channels at 56x56, batch 8, on an A100 with ``tf32_nchw`` = ``share``."""
    from dlperf.analysis.roofline import predict

    model = nn.Sequential(nn.Conv2d(64, 64, 1, bias=False), nn.Conv2d(64, 256, 1, bias=False))
    a = dlperf.analyze(model, (8, 64, 56, 56), device="a100-80gb", dtype="fp32", tf32=True,
                       train=True)
    eff = dataclasses.replace(a.efficiency, tf32_nchw=share)
    spec = get_device("a100-80gb")
    passes = {p.cost.phase: predict(p.cost, spec, tf32=True, efficiency=eff)
              for p in a.predictions if p.cost.op.startswith("convolution")
              and p.cost.kind == "gemm" and p.cost.module == "1"}
    return passes, eff.bandwidth(spec)


def test_tf32_nchw_costs_a_share_of_the_16_bit_transposes_inside_the_kernel():
    # x = 8 x 64 x 56 x 56 fp32 = 6,422,528 B; y = dy = 8 x 256 x 56 x 56 fp32 = 25,690,112 B.
    # The fp16 rule on Ampere (tests/test_rules.py): forward transposes x, dgrad dy, wgrad dy
    # and x, each read and written once; TF32 pays 0.57 of that and launches nothing more.
    passes, bw = _tf32_conv_passes(0.57)
    expected = {"forward": 6_422_528, "dgrad": 25_690_112, "wgrad": 25_690_112 + 6_422_528}
    for phase, moved in expected.items():
        p = passes[phase]
        assert p.unit == "tf32"
        assert p.transpose_time_s == pytest.approx(0.57 * 2 * moved / bw, rel=1e-9)
        assert p.kernels == p.cost.kernels
    # the shipped share is 0: no layout cost, as every published TF32 NCHW row fits
    assert FITTED.tf32_nchw == 0
    shipped, _ = _tf32_conv_passes(FITTED.tf32_nchw)
    assert all(p.transpose_time_s == 0 for p in shipped.values())


def test_tf32_nchw_is_an_override_a_user_can_set_and_zero_is_allowed():
    assert check_overrides({"tf32_nchw": 0.57}, "--efficiency") == {"tf32_nchw": 0.57}
    assert check_overrides({"tf32_nchw": 0}, "--efficiency") == {"tf32_nchw": 0}
    with pytest.raises(DlperfError, match="tf32_nchw"):
        check_overrides({"tf32_nchw": -0.1}, "--efficiency")
    # through the analysis: channels_last removes exactly the term it adds
    shape = (8, 3, 112, 112)
    h200 = get_device("h200")
    spec = dataclasses.replace(h200, efficiency={**(h200.efficiency or {}), "tf32_nchw": 0.57})
    nchw = dlperf.analyze("resnet18", shape, device=spec, dtype="fp32", tf32=True)
    cl = dlperf.analyze("resnet18", shape, device=spec, dtype="fp32", tf32=True,
                        channels_last=True)
    extra = nchw.totals()["nchw_transpose_time_s"]
    assert extra > 0 and cl.totals()["nchw_transpose_time_s"] == 0
    def convs(a):
        return sum(p.time_s for p in a.predictions if p.cost.op.startswith("convolution"))
    assert convs(nchw) - convs(cl) == pytest.approx(extra, rel=1e-6)


def _result(layers):
    """A minimal `dlperf analyze --measure --json` result: (module, op, phase, kind,
    memory_class, bytes, measured_s, predicted_s) per kernel."""
    analysed = [{"module": m, "op": op, "phase": ph, "kind": k, "memory_class": mc,
                 "bytes": b, "transpose_time_s": 0.0, "predicted_time_s": p}
                for m, op, ph, k, mc, b, _, p in layers]
    measured = [{"module": m, "op": op, "phase": ph, "kind": k, "measured_time_s": t,
                 "predicted_time_s": p} for m, op, ph, k, _, _, t, p in layers]
    return {"config": {"dtype": "fp32", "tf32": True, "channels_last": False,
                       "input_shape": [128, 3, 224, 224]},
            "layers": analysed,
            "measurement": {"layers": measured,
                            "totals": {"measured_s": sum(x[6] for x in layers),
                                       "predicted_s": sum(x[7] for x in layers)}}}


def test_kernel_classes_sum_by_class_and_report_the_elementwise_bandwidth():
    kc = load_benchmark("gpu_kernel_classes")
    run = kc.classes(_result([
        ("c1", "convolution", "forward", "gemm", "stream", 100, 3e-3, 2e-3),
        ("c1", "convolution_backward", "dgrad", "gemm", "stream", 100, 1e-3, 1e-3),
        ("c1", "convolution_backward", "wgrad", "gemm", "stream", 100, 2e-3, 1e-3),
        ("bn", "cudnn_batch_norm", "forward", "memory", "channel-norm", 400, 1e-3, 2e-3),
        ("r", "relu", "forward", "memory", "stream", 4e9, 1e-3, 2e-3),
        ("r", "threshold_backward", "dgrad", "memory", "stream", 6e9, 1.5e-3, 3e-3),
    ]))
    by = run["by_class"]
    assert by["conv forward"]["measured_s"] == 3e-3 and by["conv wgrad"]["kernels"] == 1
    assert by["conv forward"]["predicted_over_measured"] == pytest.approx(2 / 3)
    assert by["batch norm forward"]["predicted_over_measured"] == pytest.approx(2.0)
    # elementwise: 10 GB in 2.5 ms measured = 4 TB/s; 5 ms predicted = 2 TB/s
    assert run["stream_achieved_bytes_per_s"] == pytest.approx(4e12)
    assert run["stream_model_bytes_per_s"] == pytest.approx(2e12)
    assert run["unmatched_kernels"] == 0 and run["config"]["batch"] == 128


def test_kernel_classes_score_a_measurement_against_the_model_given():
    # a measurement taken with an older model, scored against the current one: the measured
    # times stay, the predictions are the given analysis's (matched by module, phase, kind)
    kc = load_benchmark("gpu_kernel_classes")
    result = _result([("c1", "convolution", "forward", "gemm", "stream", 100, 3e-3, 1e-3)])
    now = [{**result["layers"][0], "predicted_time_s": 2.5e-3}]
    run = kc.classes(result, now)
    assert run["measured_s"] == 3e-3 and run["predicted_s"] == 2.5e-3
    assert kc.classes(result)["predicted_s"] == 1e-3  # as measured


def test_memory_classes_give_each_class_its_achieved_and_modelled_bandwidth():
    kc = load_benchmark("gpu_kernel_classes")
    out = kc.memory_classes(_result([
        ("c1", "convolution", "forward", "gemm", "stream", 100, 3e-3, 2e-3),  # not memory
        ("bn", "cudnn_batch_norm", "forward", "memory", "channel-norm", 2e9, 2e-3, 1e-3),
        ("r", "relu", "forward", "memory", "stream", 4e9, 1e-3, 2e-3),
        ("r", "add", "forward", "memory", "stream", 4e9, 1e-3, 2e-3),
    ]))
    assert set(out) == {"channel-norm", "stream"}
    # stream: 8 GB in 2 ms measured = 4 TB/s, in 4 ms predicted = 2 TB/s
    assert out["stream"]["kernels"] == 2
    assert out["stream"]["achieved_bytes_per_s"] == pytest.approx(4e12)
    assert out["stream"]["model_bytes_per_s"] == pytest.approx(2e12)
    # batch norm: 2 GB in 2 ms = 1 TB/s measured, 2 TB/s in the model
    assert out["channel-norm"]["achieved_bytes_per_s"] == pytest.approx(1e12)


def test_kernel_classes_layout_contrast_is_nchw_minus_channels_last_per_pass():
    kc = load_benchmark("gpu_kernel_classes")
    nchw = kc.classes(_result([("c", "convolution", "forward", "gemm", "stream", 1, 8e-3, 5e-3)]))
    cl = kc.classes(_result([("c", "convolution", "forward", "gemm", "stream", 1, 5e-3, 5e-3)]))
    rows = kc.layout_contrasts({"tf32-nchw": nchw, "tf32-cl": cl})
    fwd = next(r for r in rows if r["pass"] == "conv forward")
    assert fwd["precision"] == "tf32"
    assert fwd["measured_extra_s"] == pytest.approx(3e-3) and fwd["predicted_extra_s"] == 0
    assert len(rows) == 3  # one per pass; bf16 and fp32 pairs absent


def test_fit_experiment_flags_and_fixed_parameters_stay_put():
    fe = load_benchmark("fit_efficiency")
    rest, fixed, share, classes = fe.experiment_flags(
        ["a.csv", "--fix", "memory=0.86", "out.json", "--fix", "sm_bytes_per_clock=inf",
         "--tf32-nchw", "0.57", "--kernel-classes", "k.json"])
    assert rest == ["a.csv", "out.json"] and share == 0.57 and classes.name == "k.json"
    assert fixed == {"memory": 0.86, "sm_bytes_per_clock": math.inf}
    assert fe._finite(fixed) == {"memory": 0.86, "sm_bytes_per_clock": "inf"}
    with pytest.raises(SystemExit, match="choose one of"):
        fe.experiment_flags(["--fix", "nonsense=1"])

    class Terms:  # ratio = memory / 0.5: the loss is smallest at memory = 0.5, if it were free
        def ratios(self, params):
            assert params["sm_bytes_per_clock"] == math.inf
            return np.array([params["memory"] / 0.5])
    start = {n: 0.6 if n != "sm_bytes_per_clock" else 8.0 for n in fe.BOUNDS}
    free = fe.fit(Terms(), np.array([True]), start, fixed={"sm_bytes_per_clock": math.inf})
    assert free["memory"] == pytest.approx(0.5, rel=1e-3)
    held = fe.fit(Terms(), np.array([True]), start,
                  fixed={"sm_bytes_per_clock": math.inf, "memory": 0.86})
    assert held["memory"] == 0.86


def test_tf32_nchw_experiment_sets_the_share_and_keeps_each_presets_own_values():
    exp = load_benchmark("experiment_tf32_nchw")
    h100 = get_device("h100-sxm")
    from dlperf.hardware.efficiency import efficiency_for

    eff = exp.with_share(0.57)(h100)
    assert eff.tf32_nchw == 0.57
    assert eff.tensor_gemm == efficiency_for(h100).tensor_gemm != FITTED.tensor_gemm


def test_flash2_experiment_reads_the_lent_gpus_shares_and_patches_only_flash2():
    exp = load_benchmark("experiment_flash2_hopper")
    # two lent H200s timed FlashAttention-2's forward and backward at 0.262 of the peak
    shares = exp.measured_shares()
    assert len(shares) == 2 and all(0.25 < s < 0.27 for s in shares)
    assert exp.PAPER_SHARE == 0.322  # 319 / 989.4 TFLOP/s, forward only
    patched = exp.with_flash2(0.322)
    h100 = get_device("h100-sxm")
    assert patched["h100-sxm"].efficiency["by_attention"]["flash2"] == 0.322
    assert (patched["h100-sxm"].efficiency["by_attention"]["cudnn"]
            == h100.efficiency["by_attention"]["cudnn"])
    assert h100.efficiency["by_attention"]["flash2"] == 0.262  # the preset itself untouched
    rows = [{"device": "h100-sxm", "model": "llama3-8b", "source": "torchtitan"},
            {"device": "h100-sxm", "model": "llama3-8b", "source": "x", "attention_kernel": "cudnn"},
            {"device": "a100-80gb", "model": "llama3-8b", "source": "torchtitan"},
            {"device": "h100-sxm", "model": "mpt-7b", "source": "llm-foundry-mpt"}]
    assert exp.flash2_rows(rows) == rows[:1]


def test_measured_shares_are_real_traffic_over_the_same_runs_streaming_rate():
    import json
    from pathlib import Path

    fe = load_benchmark("fit_efficiency")
    saved = json.loads((Path(__file__).resolve().parents[1]
                        / "benchmarks/results/h200-kernel-classes.json").read_text())
    shares = fe.measured_shares(saved)
    assert len(shares) == 4 * 4  # 4 classes x (16/32-bit) x (NCHW/channels_last)
    run = saved["results"]["memory_classes"]["bf16-nchw"]
    # bf16 NCHW batch norm forward: 1.1381e10 minimum bytes in 23.78 ms = 0.479 TB/s, x 1.5
    # (it reads its input twice) = 0.718 TB/s of real traffic, over the 3.97 TB/s the same
    # run's elementwise kernels streamed: 0.181
    bn = run["channel-norm"]
    by_hand = bn["bytes"] / bn["measured_s"] * 1.5 / run["stream"]["achieved_bytes_per_s"]
    assert shares[("channel-norm", True, False)] == pytest.approx(by_hand)
    assert 0.17 < by_hand < 0.19
    # pooling has no second pass: its share is its own minimum-byte rate over the stream's
    cl = saved["results"]["memory_classes"]["fp32-cl"]
    assert shares[("window", False, True)] == pytest.approx(
        cl["window"]["achieved_bytes_per_s"] / cl["stream"]["achieved_bytes_per_s"])
    # every class ran slower than the elementwise stream, on every layout and precision
    assert all(0 < s < 1 for s in shares.values())
    # where the result has fp16 runs (the table's mixed precision), the 16-bit shares are theirs
    fp16 = json.loads(json.dumps(saved))
    fp16["results"]["memory_classes"]["fp16-nchw"] = {
        cls: {"achieved_bytes_per_s": 2e12 if cls == "stream" else 1e12}
        for cls in ("stream", *fe.MEASURED_CLASSES)}
    with_fp16 = fe.measured_shares(fp16)
    assert with_fp16[("window", True, False)] == pytest.approx(0.5)  # 1e12 / 2e12
    assert with_fp16[("channel-norm", True, False)] == pytest.approx(0.75)  # x 1.5, two passes
    assert with_fp16[("window", True, True)] == shares[("window", True, True)]  # bf16 still


def test_kernel_class_variants_pick_the_subsets_they_name():
    exp = load_benchmark("experiment_kernel_classes")
    shares = {(c, half, nhwc): 0.5 for c in ("channel-norm", "channel-norm-backward", "window",
                                             "window-backward")
              for half in (True, False) for nhwc in (True, False)}
    v = exp.variants(shares)
    assert v["none (the shipped model's form)"] == {} and v["all measured classes"] == shares
    bn, pool = v["batch norm only"], v["pooling only"]
    assert len(bn) == len(pool) == 8 and not set(bn) & set(pool)  # a partition of the 16
    assert set(bn) | set(pool) == set(shares)
    assert all(not half for _, half, _ in v["32-bit kernels only"]) and len(
        v["32-bit kernels only"]) == 8
    assert set(v["16-bit channels_last only"]) == {k for k in shares if k[1] and k[2]}
    # the pinned variant: the H200's elementwise rate, 4.13-4.15 TB/s of 4.8, no SM term
    assert exp.PINNED_STREAM["memory"] == pytest.approx(4.14 / 4.8, abs=0.005)
    assert exp.PINNED_STREAM["sm_bytes_per_clock"] == math.inf


def test_stream_ops_split_the_streaming_class_by_op_and_leave_the_other_classes_out():
    kc = load_benchmark("gpu_kernel_classes")
    result = _result([
        ("r", "relu", "forward", "memory", "stream", 4e9, 1e-3, 2e-3),
        ("r2", "relu", "forward", "memory", "stream", 4e9, 1e-3, 2e-3),
        ("w", "_to_copy", "forward", "copy", "stream", 3e9, 1.5e-3, 1.5e-3),
        ("bn", "cudnn_batch_norm", "forward", "memory", "channel-norm", 400, 1e-3, 2e-3),
        ("c", "convolution", "forward", "gemm", "stream", 100, 3e-3, 2e-3),
    ])
    ops = kc.stream_ops(result)
    assert set(ops) == {"relu", "_to_copy"}  # batch norm and the convolution are not streams
    # two ReLUs: 8e9 bytes in 2 ms measured = 4 TB/s; the model's 4 ms = 2 TB/s
    assert ops["relu"]["kernels"] == 2
    assert ops["relu"]["achieved_bytes_per_s"] == pytest.approx(4e12)
    assert ops["relu"]["model_bytes_per_s"] == pytest.approx(2e12)
    assert ops["_to_copy"]["achieved_bytes_per_s"] == pytest.approx(2e12)  # 3e9 / 1.5 ms
    # the classes view of the same kernels still sums the streams together
    stream = kc.memory_classes(result)["stream"]
    assert stream["bytes"] == 11e9 and stream["kernels"] == 3


def test_saved_kernel_class_experiment_says_what_the_readmes_quote():
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    saved = json.loads((root / "benchmarks/results/experiment-kernel-classes.json").read_text())
    v = saved["results"]["variants"]

    def clean(name, cls="clean"):
        return v[name]["in_sample"][cls]

    shipped = clean("none (the shipped model's form)")["median_abs_error"]
    bn = clean("batch norm only")
    # benchmarks/README.md: 6.7% without, 16.0% with batch norm at the H200's shares, the
    # mixed-precision CNN rows at 0.79x; pooling alone neutral (6.9%)
    assert shipped == pytest.approx(0.067, abs=0.0005)
    assert bn["median_abs_error"] == pytest.approx(0.160, abs=0.0005)
    assert clean("batch norm only", "cnn-amp")["median_ratio"] == pytest.approx(0.79, abs=0.005)
    assert abs(clean("pooling only")["median_abs_error"] - shipped) < 0.005
    # with batch norm slowed the fit streams at its bounds (the DRAM term at 1.0)
    assert v["batch norm only"]["parameters"]["memory"] == pytest.approx(1.0, abs=1e-6)
    held = json.loads((root / "benchmarks/results/efficiency-fit-experiment-kernel-classes.json")
                      .read_text())["results"]
    assert held["summary_held_out_by_source"]["clean"]["median_abs_error"] == pytest.approx(
        0.216, abs=0.0005)
    assert set(held["kernel_classes"]["shares"]) == set(saved["results"]["shares"])


def test_a_bf16_batch_norm_share_alone_would_trade_one_error_for_another():
    # benchmarks/README.md: set to what the H200's bf16 batch norm took, ResNet-50 bf16 NCHW
    # would go from 0.77 to 1.13 (predicted/measured) and bf16 channels_last from 1.09 to 1.15
    import json
    from pathlib import Path

    runs = json.loads((Path(__file__).resolve().parents[1]
                       / "benchmarks/results/h200-kernel-classes.json").read_text())[
        "results"]["runs"]
    moved = {}
    for name in ("bf16-nchw", "bf16-cl"):
        run = runs[name]
        bn = [run["by_class"][c] for c in ("batch norm forward", "batch norm backward")]
        extra = sum(c["measured_s"] - c["predicted_s"] for c in bn)
        moved[name] = (run["predicted_s"] / run["measured_s"],
                       (run["predicted_s"] + extra) / run["measured_s"])
    assert moved["bf16-nchw"] == pytest.approx((0.77, 1.13), abs=0.005)
    assert moved["bf16-cl"] == pytest.approx((1.09, 1.15), abs=0.006)


def test_fit_row_flags_drop_sources_and_set_columns():
    fe = load_benchmark("fit_efficiency")
    rest, drop, sets = fe.row_flags(["a.csv", "--drop-source", "lambda-logs", "out.json",
                                     "--set", "optimizer_impl=", "--drop-source", "x"])
    assert rest == ["a.csv", "out.json"]
    assert drop == {"lambda-logs", "x"} and sets == {"optimizer_impl": ""}
    with pytest.raises(SystemExit, match="COLUMN=VALUE"):
        fe.row_flags(["--set", "optimizer_impl"])
    with pytest.raises(SystemExit, match="needs a value"):
        fe.row_flags(["--drop-source"])


def test_fit_weights_let_each_source_or_gpu_count_once():
    # --weight: source "a" has 3 clean rows (1/3 each), "b" one (1) and a flagged row (0)
    fe = load_benchmark("fit_efficiency")
    rows = [dict(source="a", device="x", flag="clean")] * 3 + [
        dict(source="b", device="x", flag="clean"), dict(source="b", device="y", flag="suspect")]
    assert fe.row_weights(rows, "row").tolist() == [1, 1, 1, 1, 1]
    assert fe.row_weights(rows, "source") == pytest.approx([1 / 3] * 3 + [1, 0])
    assert fe.row_weights(rows, "device") == pytest.approx([0.25] * 4 + [0])

    class Terms:  # rows that want memory 0.5 (three of them) and 0.8 (one): ratio = memory / want
        want = np.array([0.5, 0.5, 0.5, 0.8])

        def ratios(self, params):
            return params["memory"] / self.want
    start = {n: 0.6 if n != "sm_bytes_per_clock" else 8.0 for n in fe.BOUNDS}
    fixed = {n: start[n] for n in fe.BOUNDS if n != "memory"}
    mask = np.array([True] * 4)
    # least squares in log: alike, log m = (3 log 0.5 + log 0.8) / 4 -> m = 0.562; each source
    # once (weights 1/3 x 3 and 1), the geometric mean of 0.5 and 0.8 -> 0.632
    alike = fe.fit(Terms(), mask, start, fixed=fixed)
    once = fe.fit(Terms(), mask, start, fixed=fixed, weights=fe.row_weights(rows[:4], "source"))
    assert alike["memory"] == pytest.approx(0.5 ** 0.75 * 0.8 ** 0.25, rel=1e-3)
    assert once["memory"] == pytest.approx((0.5 * 0.8) ** 0.5, rel=1e-3)
