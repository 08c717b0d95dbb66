"""The compute beside a hidden collective runs on the SMs NCCL leaves (scaling.contention_s)."""

from __future__ import annotations

import dataclasses

import pytest

from dlperf.analysis.costs import Cost
from dlperf.analysis.gemm import GemmShape
from dlperf.analysis.roofline import predict
from dlperf.analysis.scaling import (BACKWARD, FORWARD_BACKWARD, NCCL_CHANNEL_SM_SHARE,
                                     ScaleConfig, beside_slowdown, collective_sms, contention_s,
                                     held_sms, lent_spec, scale_out)
from dlperf.errors import DlperfError
from dlperf.hardware.efficiency import efficiency_for
from dlperf.hardware.interconnect import PRESETS
from dlperf.hardware.specs import get_device


def test_the_sms_a_collective_holds_and_the_gpu_it_leaves():
    h100 = get_device("h100-sxm")
    # 0.24 x 132 = 31.7 -> 32 SMs: NCCL's 32 collective channels on an NVSwitch node, one SM each
    assert NCCL_CHANNEL_SM_SHARE == 0.24 and collective_sms(h100) == 32
    assert collective_sms(get_device("a100-80gb")) == 26  # 0.24 x 108 = 25.9
    lent = lent_spec(h100, 32)
    assert lent.sm_count == 100
    # the Tensor Cores of 100 SMs of 132: 989.4 TFLOP/s x 100 / 132 = 749.5
    assert lent.peak_flops("bf16") == pytest.approx(989.4e12 * 100 / 132, rel=1e-9)
    assert lent.mem_bandwidth == h100.mem_bandwidth  # the DRAM is the same; its SM side is not
    assert lent_spec(h100, 0) is h100
    with pytest.raises(DlperfError, match="--collective-sms 132: h100-sxm has 132 SMs"):
        lent_spec(h100, 132)
    # a CPU's collectives (gloo) take cores, charged as exposed time: no SMs held, whatever
    # is asked (the flag's range is a GPU's)
    cpu_like = dataclasses.replace(h100, tensor_cores=False)
    assert collective_sms(cpu_like) == 0 and held_sms(cpu_like, 500) == 0
    assert lent_spec(cpu_like, 32) is cpu_like
    assert held_sms(h100, 131) == 131
    with pytest.raises(DlperfError, match="--collective-sms 132: h100-sxm has 132 SMs"):
        held_sms(h100, 132)
    with pytest.raises(DlperfError, match="--collective-sms -1"):
        ScaleConfig(gpus=8, collective_sms=-1)


def test_the_guide_s_one_wave_gemm_beside_a_collective():
    # The guide's A100 example (gemm.py): M=2304, N=1536, K=4096 in 256x128 tiles is 9 x 12 =
    # 108 tiles, one full wave on 108 SMs. With 24 SMs held, 84 are left: 256x128 would take
    # two waves (108/168 = 64%); 128x128 tiles (18 x 12 = 216) take three waves of 84 (216/252
    # = 85.7%) at 0.95 of the big tile's intrinsic rate = 0.814, the best. The math time grows
    # by 108/84 (fewer SMs) / 0.814 = 1.579, where a many-wave GEMM would grow by 108/84 = 1.286:
    # the tail a collective's CTAs leave (NVIDIA's forum: a one-wave GEMM on an H100 ran ~2x
    # longer beside an all-gather's 24 CTAs).
    a100 = get_device("a100-80gb")
    eff = efficiency_for(a100)
    gemm = Cost(module="m", module_type="Linear", op="mm", phase="forward", kind="gemm",
                flops=2 * 2304 * 1536 * 4096, bytes=2 * (2304 * 4096 + 4096 * 1536 + 2304 * 1536),
                dtype="fp16", gemm=GemmShape(2304, 1536, 4096))
    alone = predict(gemm, a100, efficiency=eff)
    beside = predict(gemm, lent_spec(a100, 24), efficiency=eff)
    assert alone.quantization.waves == 1 and alone.quantization.tile == (256, 128)
    assert beside.quantization.tile == (128, 128) and beside.quantization.waves == 3
    assert beside.math_time_s / alone.math_time_s == pytest.approx(
        (108 / 84) / (216 / 252 * 0.95), rel=1e-9)


def test_contention_is_the_work_left_over_after_the_collective():
    # 0.3 s of collectives beside compute that runs 1.25x slower: 1/1.25 = 80% of the work gets
    # done while they run, the other 20% (0.06 s) after them
    assert contention_s(0.3, 1.25) == pytest.approx(0.06)
    assert contention_s(0.3, 1.0) == 0.0 and contention_s(-0.1, 1.25) == 0.0


def _resnet18():
    from test_scaling import _resnet18_on_h100

    return _resnet18_on_h100()


def test_ddp_and_fsdp_charge_the_compute_beside_their_hidden_collectives():
    analysis, params = _resnet18()
    node, net = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]
    backward = beside_slowdown(analysis, 32, BACKWARD)
    both = beside_slowdown(analysis, 32, FORWARD_BACKWARD)
    # fewer SMs: slower, but never by more than a one-wave kernel's worst case (2 waves)
    assert 1.0 < backward < 2.0 and 1.0 < both < 2.0
    assert beside_slowdown(analysis, 0, BACKWARD) == 1.0
    # DDP on 16 GPUs (two nodes): the buckets' all-reduces beside the backward; by default
    # nothing is charged (the published runs disagree: benchmarks/README.md)
    free = scale_out(analysis, params, ScaleConfig(gpus=16, step_cv=0.0), node, net)
    held = scale_out(analysis, params, ScaleConfig(gpus=16, step_cv=0.0, collective_sms=32),
                     node, net)
    comm = held["communication"]
    assert comm["contention"]["sms"] == 32 and free["contention_s"] == 0.0
    hidden = comm["comm_s"] - comm["exposed_s"]
    assert hidden > 0
    assert held["contention_s"] == pytest.approx(hidden * (1 - 1 / backward))
    assert held["exposed_comm_s"] == pytest.approx(free["exposed_comm_s"])
    assert held["step_s"] == pytest.approx(free["step_s"] + held["contention_s"])
    # FSDP, 2 micro-batches: its gathers and reduce-scatters beside the forward and backward,
    # on every micro-batch
    cfg = dict(gpus=16, strategy="fsdp", grad_accum=2, step_cv=0.0)
    free = scale_out(analysis, params, ScaleConfig(**cfg, collective_sms=0), node, net)
    held = scale_out(analysis, params, ScaleConfig(**cfg, collective_sms=20), node, net)
    comm = held["communication"]
    hidden = comm["comm_s"] - comm["exposed_s"] / 2  # a micro-batch's
    assert 0 < hidden
    assert held["contention_s"] == pytest.approx(
        2 * hidden * (1 - 1 / beside_slowdown(analysis, 20, FORWARD_BACKWARD)))
    assert held["step_s"] == pytest.approx(free["step_s"] + held["contention_s"])
    # one GPU: nothing to hide, nothing held
    one = scale_out(analysis, params, ScaleConfig(gpus=1), node, net)
    assert one["contention_s"] == 0.0
    # (a CPU's gloo collectives take cores, exposed: none held whatever is asked)
    cpu = dataclasses.replace(analysis, device=dataclasses.replace(analysis.device,
                                                                   tensor_cores=False))
    assert scale_out(cpu, params, ScaleConfig(gpus=16, collective_sms=32), node,
                     net)["contention_s"] == 0.0
    with pytest.raises(DlperfError, match="--collective-sms 500"):
        scale_out(analysis, params, ScaleConfig(gpus=16, collective_sms=500), node, net)


def test_the_report_says_what_the_collectives_take_from_the_compute():
    from rich.console import Console

    from dlperf.analysis.report import render_scaling

    analysis, params = _resnet18()
    node, net = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]
    held = scale_out(analysis, params, ScaleConfig(gpus=16, collective_sms=32), node, net)
    console = Console(width=600, markup=False)
    with console.capture() as captured:
        render_scaling(held, [held], node, net, console)
    assert "of compute slowed beside the hidden rest (32 SMs held by NCCL)" in captured.get()
    free = scale_out(analysis, params, ScaleConfig(gpus=16), node, net)
    with console.capture() as captured:
        render_scaling(free, [free], node, net, console)
    assert "SMs held" not in captured.get()
