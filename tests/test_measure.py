"""--measure: the analysed kernels timed for real on this CPU, attributed 1:1 to predictions."""

import json
import math

import pytest
import torch
from torch import nn

from dlperf.analysis.api import AnalysisConfig, analyze_model
from dlperf.analysis.measure import MeasureConfig, measure
from dlperf.cli import main
from dlperf.hardware.specs import DeviceSpec

# A made-up measured CPU spec: the test checks attribution, not the machine's speed.
CPU = DeviceSpec(name="cpu", display_name="test cpu", sm_count=2, mem_bandwidth=20e9,
                 peak={"fp32": 100e9, "bf16": 200e9}, tensor_cores=False, measured=True,
                 launch_overhead_s=2e-6)


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def test_every_measured_kernel_lands_on_its_prediction():
    # --measure times forward + backward kernels; the analysis it is compared with leaves the
    # optimizer step out too
    cfg = AnalysisConfig(model="net", input_shape=(4, 3, 32, 32), dtype="fp32", train=True,
                         device="cpu", optimizer="none")
    m = measure(_net(), cfg, CPU, "cpu", cfg=MeasureConfig(steps=2, warmup=1))
    assert len(m.measured_s) == len(m.analysis.predictions) > 0
    assert all(t > 0 for t, p in zip(m.measured_s, m.analysis.predictions) if p.cost.kernels)
    # The real run costs the same kernels as the meta analysis of the same model.
    meta = analyze_model(_net().to("meta"), cfg, CPU)
    assert sorted((p.cost.module, p.cost.op, p.cost.phase) for p in meta.predictions) == \
        sorted((p.cost.module, p.cost.op, p.cost.phase) for p in m.analysis.predictions)
    t = m.totals()
    assert t["measured_s"] == sum(m.measured_s) and t["predicted_s"] > 0
    # the time-weighted median of |log(pred/meas)| (here against a made-up CPU spec, so its
    # size says nothing): the smallest error whose kernels, with every smaller one, hold half
    # the measured time
    pairs = [(abs(math.log(p.time_s / x)), x) for p, x in zip(m.analysis.predictions,
                                                              m.measured_s)
             if p.time_s > 0 and x > 0]
    half = sum(x for _, x in pairs) / 2
    median = min(e for e, _ in pairs if sum(x for f, x in pairs if f <= e) >= half)
    assert t["weighted_median_abs_error"] == pytest.approx(math.exp(median) - 1, rel=1e-12)
    # convolution_backward's one measured time is shared between dgrad and wgrad
    conv_bwd = [x for x, p in zip(m.measured_s, m.analysis.predictions)
                if p.cost.op == "convolution_backward"]
    assert len(conv_bwd) == 2 and all(x > 0 for x in conv_bwd)


def test_one_measurement_predicted_for_another_spec_keeps_its_times():
    # with_spec: the same measured kernels under a second calibration (here: math 4x slower,
    # memory as before). Each prediction is the other spec's; the measured step is the same
    # seconds; a record costed as two kernels (convolution_backward: dgrad + wgrad) is shared
    # out again in proportion to the new predictions.
    import dataclasses

    from dlperf.analysis.roofline import predict

    cfg = AnalysisConfig(model="net", input_shape=(4, 3, 32, 32), dtype="fp32", train=True,
                         device="cpu", optimizer="none")
    m = measure(_net(), cfg, CPU, "cpu", cfg=MeasureConfig(steps=1, warmup=0))
    slow = dataclasses.replace(CPU, peak={"fp32": 25e9, "bf16": 50e9})
    other = m.with_spec(slow)
    assert [p.time_s for p in other.analysis.predictions] == \
        [predict(p.cost, slow).time_s for p in m.analysis.predictions]
    assert sum(other.measured_s) == pytest.approx(sum(m.measured_s), rel=1e-12)
    bwd = [(p.time_s, x) for p, x in zip(other.analysis.predictions, other.measured_s)
           if p.cost.op == "convolution_backward"]
    (pd, xd), (pw, xw) = bwd
    assert xd / xw == pytest.approx(pd / pw, rel=1e-9)
    # the same spec again gives the same numbers
    assert m.with_spec(CPU).measured_s == pytest.approx(m.measured_s, rel=1e-12)


def test_measure_a_half_model_runs_the_kernels_the_analysis_costs():
    # --precision half: the real run casts the model (no autocast) and feeds bf16 inputs, so
    # its kernels are the ones the meta analysis of the half model costs: none of them a cast
    # but the loss's upcast of the logits to fp32 (capture._default_loss), in both.
    cfg = AnalysisConfig(model="net", input_shape=(4, 3, 32, 32), dtype="bf16", train=True,
                         device="cpu", optimizer="none", precision="half")
    m = measure(_net(), cfg, CPU, "cpu", cfg=MeasureConfig(steps=2, warmup=1))
    meta = analyze_model(_net().to("meta"), cfg, CPU)
    key = lambda a: sorted((p.cost.module, p.cost.op, p.cost.phase, p.cost.dtype)  # noqa: E731
                           for p in a.predictions)
    assert key(meta) == key(m.analysis)
    assert [p.cost.module for p in m.analysis.predictions if p.cost.op == "_to_copy"
            and p.cost.phase == "forward"] == ["loss"]
    assert {p.cost.dtype for p in m.analysis.predictions if p.cost.kind == "gemm"} == {"bf16"}


def test_cli_measure_on_cpu_writes_measurement(tmp_path, capsys):
    path = tmp_path / "m.json"
    code = main(["analyze", "resnet18", "--device", "cpu", "--batch-size", "2", "--input-shape",
                 "3,64,64", "--train", "--measure", "--measure-steps", "1", "--json", str(path)])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "measured/predicted" in out.out
    data = json.loads(path.read_text())
    assert data["measurement"]["totals"]["measured_s"] > 0
    assert len(data["measurement"]["layers"]) > 50
    assert "By class" in out.out and "math:cuda-core-conv" in out.out
    assert {"class", "bytes"} <= set(data["measurement"]["layers"][0])


def test_by_class_sums_each_class_and_gives_memory_classes_their_bandwidth():
    cfg = AnalysisConfig(model="net", input_shape=(4, 3, 32, 32), dtype="fp32", train=True,
                         device="cpu", optimizer="none")
    m = measure(_net(), cfg, CPU, "cpu", cfg=MeasureConfig(steps=1, warmup=1))
    from dlperf.analysis.measure import kernel_class

    t = m.totals()
    by = t["by_class"]
    # every kernel in exactly one class: the class sums are the totals
    assert sum(v["measured_s"] for v in by.values()) == pytest.approx(t["measured_s"])
    assert sum(v["kernels"] for v in by.values()) == len(m.analysis.predictions)
    for name, v in by.items():
        members = [(p, x) for p, x in zip(m.analysis.predictions, m.measured_s)
                   if kernel_class(p) == name]
        assert v["predicted_s"] == pytest.approx(sum(p.time_s for p, _ in members))
        if name.startswith("memory:"):  # minimum bytes over the measured time
            assert v["achieved_bytes_per_s"] == pytest.approx(
                sum(p.cost.bytes for p, _ in members) / sum(x for _, x in members))
        else:
            assert v["achieved_bytes_per_s"] is None
    assert any(k.startswith("math:") for k in by) and any(k.startswith("memory:") for k in by)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cli_measure_needs_the_hardware(capsys):
    code = main(["analyze", "resnet18", "--device", "h100-sxm", "--measure"])
    err = capsys.readouterr().err
    assert code == 2 and "no CUDA GPU is visible" in err and len(err.strip().splitlines()) == 1


def test_predict_vs_measure_summary_separates_host_drift_from_model_error():
    # Two rounds of one case. Round 1: predicted 1.0 s, measured 1.25 s (-20%), while the
    # sweep's reference layers ran 1.25x slower around the measurement than during the sweep:
    # the drift-adjusted error is 1.0 x 1.25 / 1.25 - 1 = 0. Round 2: predicted 1.1, measured
    # 1.0 (+10%), drift 1.0 (adjusted +10%). Medians: step -5%, adjusted +5%, drift 1.125.
    from conftest import load_benchmark

    bench = load_benchmark("bench_predict_vs_measure")

    def case(pred, meas, drift):
        return {"step_error": pred / meas - 1, "probe_only_step_error": -0.5,
                "weighted_median_abs_error": 0.2, "measured_s": meas, "host_drift": drift,
                "drift_adjusted_step_error": pred * drift / meas - 1, "ablations": {}}

    rounds = [{"cases": {"m": case(1.0, 1.25, 1.25)}}, {"cases": {"m": case(1.1, 1.0, 1.0)}}]
    v = bench.summarize(rounds)["cases"]["m"]
    assert v["median_step_error"] == pytest.approx(-0.05)
    assert v["median_drift_adjusted_step_error"] == pytest.approx(0.05)
    assert v["median_host_drift"] == pytest.approx(1.125)
    assert v["host_drift_range"] == pytest.approx([1.0, 1.25])
    assert v["measured_spread"] == pytest.approx(0.25)
    # a third round (drift 0.8, predicted 1.0 for 0.9 measured), pooled over the three:
    # |step errors| 0.2, 0.1, 0.111 (median 0.111)
    rounds.append({"cases": {"m": case(1.0, 0.9, 0.8)}})
    pooled = bench.summarize(rounds)["host_drift"]
    assert pooled["pairs"] == 3
    assert pooled["median_abs_step_error"] == pytest.approx(1 / 0.9 - 1)
    # adjusted: 0, +0.1, 1.0 x 0.8 / 0.9 - 1 = -0.111: median of |.| is 0.1
    assert pooled["median_abs_drift_adjusted_step_error"] == pytest.approx(0.1)
    # slower host (drift > 1) with a too-fast prediction (ratio < 1) and the reverse
    assert pooled["pearson_log_drift_log_ratio"] < 0


def test_depthwise_bench_reads_onednn_verbose_lines():
    # Lines as oneDNN 3.x prints them (ONEDNN_VERBOSE=1): the implementation and pass of each
    # depthwise backward convolution, keyed by the problem it describes; reorders and forward
    # convolutions are not backward passes.
    from conftest import load_benchmark

    bench = load_benchmark("bench_depthwise_cpu")
    problem = "g96mb8_ic96oc96_ih14oh14kh5sh1dh0ph2_iw14ow14kw5sw1dw0pw2"
    log = "\n".join([
        "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:blk,undef,src:f32::blocked:abcd::f0 "
        "dst:f32::blocked:aBcd8b::f0,attr-scratchpad:user,,8x96x14x14,0.02",
        f"onednn_verbose,v1,primitive,exec,cpu,convolution,jit_dw:avx2,forward_training,src:f32,"
        f"attr-scratchpad:user,alg:convolution_direct,{problem},0.05",
        f"onednn_verbose,v1,primitive,exec,cpu,convolution,jit_dw:avx2,backward_data,src:f32,"
        f"attr-scratchpad:user,alg:convolution_direct,{problem},0.35",
        f"onednn_verbose,v1,primitive,exec,cpu,convolution,x64:gemm:jit,backward_weights,"
        f"src:f32,attr-scratchpad:user,alg:convolution_direct,{problem},2.6",
        "---unrelated line"])
    assert bench.parse_verbose(log) == {"5x1x14x96x8": {"dgrad": "jit_dw:avx2",
                                                        "wgrad": "x64:gemm:jit"}}


def test_the_gpu_timer_reads_the_gpus_clock_not_the_hosts():
    # A stand-in CUDA module with a host clock and a GPU timeline: dispatching the op costs the
    # host 40 µs, its kernel runs 10 µs. The H200 run's timer (host clock between two syncs)
    # read ~50 µs for such a kernel; the GPU's events read its 10 µs, the sleep kernel having
    # kept the GPU busy through the dispatch.
    from dlperf.analysis import measure as M

    class Cuda:
        host = 0.0
        gpu = 0.0  # when the GPU finishes what has been issued
        calls: list = []

        @classmethod
        def synchronize(cls, device=None):
            cls.calls.append("sync")
            cls.host = max(cls.host, cls.gpu)

        @classmethod
        def _sleep(cls, cycles):
            cls.calls.append("sleep")
            cls.gpu = max(cls.gpu, cls.host) + cycles / 2e9  # at 2 GHz

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing
                self.at = None

            def record(self):
                Cuda.calls.append("record")
                self.at = max(Cuda.gpu, Cuda.host)

            def synchronize(self):
                Cuda.calls.append("event sync")
                Cuda.host = max(Cuda.host, self.at)

            def elapsed_time(self, other):
                return (other.at - self.at) * 1e3

    def op(x):
        Cuda.calls.append("op")
        Cuda.host += 40e-6  # the host dispatching it
        Cuda.gpu = max(Cuda.gpu, Cuda.host) + 10e-6  # its kernel
        return x + 1

    timer = M.kernel_timer(torch.device("cuda"), cuda=Cuda)
    out, seconds = timer(op, (1,), {})
    assert out == 2 and seconds == pytest.approx(10e-6)
    assert Cuda.calls == ["sync", "sleep", "record", "op", "record", "event sync"]
    # without the sleep the start event would complete at once and the GPU would sit idle
    # through the dispatch: 50 µs, what the old timer read
    assert M.DISPATCH_COVER_CYCLES / 2e9 > 40e-6
