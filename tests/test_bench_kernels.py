"""`dlperf bench gemm|conv`: the guide's figures measured, with the prediction drawn over them."""

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from dlperf.bench import kernels
from dlperf.bench.kernels import KernelBenchConfig, Point, predict_point
from conftest import run_cli as _run
from dlperf.errors import DlperfError
from dlperf.hardware.specs import DeviceSpec, get_device

# A made-up measured CPU spec: these tests check the benchmark's plumbing, not the machine.
CPU = DeviceSpec(name="cpu", display_name="test cpu", sm_count=2, mem_bandwidth=20e9,
                 peak={"fp32": 100e9, "bf16": 200e9}, tensor_cores=False, measured=True,
                 launch_overhead_s=2e-6)


def test_point_flops_by_hand_and_against_torch_flop_counter():
    gemm = Point("gemm-k", "mm", 32, (64, 96, 32))
    assert gemm.flops == 2 * 64 * 96 * 32 == 393_216
    # stem 7x7/2 on 32 px, padding 3: (32 + 6 - 7) // 2 + 1 = 16 output pixels a side;
    # 2 x batch 2 x 16 x 16 x 64 filters x 4 channels x 49 taps = 12,845,056
    stem = Point("conv-stem", "NHWC", 4, (2, 4, 32, 32, 64, 7, 2))
    assert stem.flops == 12_845_056
    a, b = torch.randn(64, 32), torch.randn(32, 96)
    x, w = torch.randn(2, 4, 32, 32), torch.randn(64, 4, 7, 7)
    with FlopCounterMode(display=False) as counter:
        torch.mm(a, b)
    assert counter.get_total_flops() == gemm.flops
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.conv2d(x, w, None, 2, 3)
    assert counter.get_total_flops() == stem.flops


@pytest.mark.parametrize("gpu", [False, True])
def test_every_point_is_captured_with_its_own_flops(gpu):
    """The prediction costs exactly the operator the benchmark times (one forward layer)."""
    spec = get_device("h100-sxm") if gpu else CPU
    for kind in ("gemm", "conv"):
        for series in kernels.series_for(KernelBenchConfig(kind, quick=True), gpu):
            for point in series.points:
                pred = predict_point(point, spec, "fp16" if gpu else "fp32")
                assert pred["captured_flops"] == point.flops, point
                assert pred["predicted_s"] > 0


def test_full_sizes_hold_the_guides_examples():
    gpu = {s.name: s for s in kernels.gemm_series(gpu=True)}
    # the guide's wave example (A100: M=2304, K=4096, N=1536 vs 1537) is a contrast
    shapes = {p.shape for p in gpu["gemm-n"].points}
    assert {(2304, 1536, 4096), (2304, 1537, 4096)} <= shapes
    assert any(label == "512^3 vs 520^3 per FLOP" for label, _, _ in gpu["gemm-size"].contrasts)
    assert any(label == "5120^3 vs 5128^3 per FLOP" for label, _, _ in gpu["gemm-size"].contrasts)
    stem = kernels.conv_series(gpu=True)[0]
    assert {p.x for p in stem.points} == {3, 4, 8} and {p.line for p in stem.points} == {
        "NCHW", "NHWC"}
    for series in kernels.gemm_series(gpu=False) + kernels.conv_series(gpu=False):
        for _, a, b in series.contrasts:  # every contrast names two measured points
            keys = {(p.line, p.x) for p in series.points}
            assert a in keys and b in keys, (series.name, a, b)


def test_predictions_on_a_gpu_preset_show_the_guides_effects():
    """No GPU needed: the predicted curves on an A100 show what the guide describes."""
    a100 = get_device("a100-80gb")
    # Wave quantization: N=1537 adds a column of tiles and (nearly) a wave -> slower
    p1536 = predict_point(Point("gemm-n", "mm", 1536, (2304, 1536, 4096)), a100, "fp16")
    p1537 = predict_point(Point("gemm-n", "mm", 1537, (2304, 1537, 4096)), a100, "fp16")
    assert p1537["waves"] > p1536["waves"] and p1537["predicted_s"] > 1.2 * p1536["predicted_s"]
    # Alignment (guide 2.2): K=4097 in fp16 is not a multiple of 8
    k4096 = predict_point(Point("gemm-k", "mm", 4096, (4096, 4096, 4096)), a100, "fp16")
    k4097 = predict_point(Point("gemm-k", "mm", 4097, (4096, 4096, 4097)), a100, "fp16")
    assert k4096["aligned"] is True and k4097["aligned"] is False
    assert k4097["predicted_s"] > 1.5 * k4096["predicted_s"]
    # NCHW fp16 convolutions pay the transposes NHWC avoids (record recipe)
    shape = (256, 64, 56, 56, 64, 3, 1)
    nchw = predict_point(Point("conv-channels", "NCHW", 64, shape), a100, "fp16")
    nhwc = predict_point(Point("conv-channels", "NHWC", 64, shape), a100, "fp16")
    assert nchw["transpose_s"] > 0 == nhwc["transpose_s"]


def test_quick_run_on_cpu_measures_predicts_and_plots(tmp_path):
    result = kernels.run(KernelBenchConfig("conv", device="cpu", quick=True, repeats=2,
                                           min_sample_s=1e-3), CPU)
    points = result["points"]
    assert len(points) == sum(s["points"] for s in result["series"]) == 6 + 8
    for r in points:
        assert len(r["times_s"]) == 2 and r["measured_s"] > 0 and r["predicted_s"] > 0
        assert r["measured_flops_per_s"] == pytest.approx(r["flops"] / r["measured_s"])
        assert r["predicted_over_measured"] == pytest.approx(r["predicted_s"] / r["measured_s"])
    contrast = {c["contrast"]: c for c in result["contrasts"]}
    c = contrast["NHWC: C=64 vs 63"]
    by = {(r["line"], r["x"]): r for r in points}
    assert c["measured_speedup"] == pytest.approx(by["NHWC", 63]["measured_s"]
                                                  / by["NHWC", 64]["measured_s"])
    json.dumps(result)  # saved as is
    png = kernels.plot(result, tmp_path / "conv.png")
    assert png is None or png.stat().st_size > 1000


def test_bad_settings_are_refused_in_one_line():
    with pytest.raises(DlperfError, match="tf32 needs a CUDA GPU"):
        kernels.resolve_dtype(KernelBenchConfig("gemm", dtype="tf32"), gpu=False)
    with pytest.raises(DlperfError, match="choose gemm or conv"):
        kernels.series_for(KernelBenchConfig("fft"), gpu=False)
    no_fp16 = DeviceSpec(name="cpu", display_name="c", sm_count=2, mem_bandwidth=1e9,
                         peak={"fp32": 1e9}, measured=True)
    with pytest.raises(DlperfError, match="no fp16 peak"):
        kernels.run(KernelBenchConfig("gemm", device="cpu", dtype="fp16", quick=True), no_fp16)


def test_cli_bench_gemm_quick_writes_json_and_png(tmp_path, capsys):
    spec = tmp_path / "cpu.json"
    spec.write_text(json.dumps({"spec": CPU.to_dict()}))
    out = tmp_path / "gemm.json"
    code, text, err = _run(["bench", "gemm", "--quick", "--repeats", "2", "--spec", str(spec),
                            "--out", str(out)], capsys)
    assert code == 0, err
    assert "K=64 vs K=65" in text and "median |pred/meas-1|" in text
    data = json.loads(out.read_text())
    assert data["benchmark"] == "bench-gemm" and data["environment"]["torch"] == torch.__version__
    assert data["config"]["spec"]["name"] == "cpu" and data["results"]["dtype"] == "fp32"
    assert {s["series"] for s in data["results"]["series"]} == {"gemm-k", "gemm-n", "gemm-size"}


REFUSALS = [
    (["bench", "conv", "--dtype", "tf32", "--device", "cpu"], "tf32 needs a CUDA GPU"),
    (["bench", "gemm", "--device", "cpu", "--out", "/nonexistent/dir/g.json"], "does not exist"),
] + ([] if torch.cuda.is_available() else [(["bench", "gemm", "--device", "cuda"], "no CUDA GPU")])


@pytest.mark.parametrize("argv, message", REFUSALS)
def test_cli_refuses_before_measuring(argv, message, capsys):
    code, _, err = _run(argv, capsys)
    assert code == 2 and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
