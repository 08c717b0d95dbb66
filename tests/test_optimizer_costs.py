"""The parameter update as torch.optim runs it (fused, foreach, for-loop) and GradScaler's host
synchronisation before an unfused fp16 step: counted against torch's own optimizers."""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dlperf.analysis.costs import (OPTIMIZER_IMPLS, UNFUSED_BYTES_PER_PARAM, UNFUSED_OPS,
                                   multi_tensor_kernels, optimizer_cost, scaled_optimizer)
from dlperf.analysis.roofline import step_time
from dlperf.cli import analyze as analyze_cli


class _Ops(TorchDispatchMode):
    """Every aten op torch's optimizer runs on the parameters' tensors, with the distinct
    tensors it reads and writes (the 0-dim step counters of Adam are left out: a CPU scalar)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat = []

        def walk(x):
            if isinstance(x, torch.Tensor):
                flat.append(x)
            elif isinstance(x, (list, tuple)):
                for y in x:
                    walk(y)
        walk(args)
        walk(list((kwargs or {}).values()))
        reads = {id(t): t for t in flat if t.dim() > 0}
        outs = []
        # an in-place _foreach_ op returns nothing: it writes its first list of tensors
        walk_out = (args[0] if out is None and func.__name__.split(".")[0].endswith("_")
                    else out if isinstance(out, (list, tuple)) else [out])
        for o in walk_out:
            if isinstance(o, torch.Tensor) and o.dim() > 0:
                outs.append(o)
            elif isinstance(o, (list, tuple)):
                outs.extend(t for t in o if isinstance(t, torch.Tensor) and t.dim() > 0)
        if reads or outs:
            elements = sum(t.numel() for t in reads.values()) + sum(t.numel() for t in outs)
            self.ops.append((func.__name__, elements))
        return out


def _run(optimizer: str, foreach: bool, sizes=(300, 40, 7)):
    params = [torch.nn.Parameter(torch.randn(n)) for n in sizes]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = (torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4, foreach=foreach)
           if optimizer == "sgd" else
           torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, foreach=foreach))
    opt.step()  # the first step creates the state (SGD clones its momentum buffers)
    with _Ops() as mode:
        opt.step()
    return mode.ops, sum(sizes), len(sizes)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_unfused_optimizers_run_the_ops_and_traffic_dlperf_counts(optimizer):
    # for-loop: UNFUSED_OPS ops per tensor (SGD 4: add, mul_, add_, add_; AdamW 8), and the
    # elements they touch (each op's distinct inputs plus its output) are
    # UNFUSED_BYTES_PER_PARAM / 4 per parameter: SGD 11, AdamW 20
    ops, n, tensors = _run(optimizer, foreach=False)
    assert len(ops) == UNFUSED_OPS[optimizer] * tensors
    assert sum(e for _, e in ops) == UNFUSED_BYTES_PER_PARAM[optimizer] // 4 * n
    # foreach: the same formula, one _foreach_ op per term over all the tensors
    ops, n, tensors = _run(optimizer, foreach=True)
    assert len(ops) == UNFUSED_OPS[optimizer]
    assert all(name.startswith("_foreach_") for name, _ in ops)
    assert sum(e for _, e in ops) == UNFUSED_BYTES_PER_PARAM[optimizer] // 4 * n


def test_optimizer_implementations_kernels_and_bytes():
    # ResNet-50: 25,557,032 parameters in 161 tensors. Launches of one multi-tensor op:
    # ceil(161 / 64) = 3 (25.6 M elements is under 320 x 65,536 = 20,971,520? no: 25,557,032 >
    # 20,971,520, so 2 by elements; 3 by tensors wins).
    n, t = 25_557_032, 161
    assert multi_tensor_kernels(n, t) == 3
    assert multi_tensor_kernels(100_000_000, 10) == 5  # ceil(1e8 / 20,971,520) = 5 by elements
    fused = optimizer_cost(n, t, "sgd")
    assert (fused.kernels, fused.bytes) == (3, 20 * n)
    foreach = optimizer_cost(n, t, "sgd", impl="foreach")
    assert (foreach.kernels, foreach.bytes) == (4 * 3, 44 * n)  # 4 ops x 3 launches
    loop = optimizer_cost(n, t, "sgd", impl="for-loop")
    assert (loop.kernels, loop.bytes) == (4 * 161, 44 * n)
    adamw = optimizer_cost(n, t, "adamw", impl="for-loop", element_bytes=2)
    assert (adamw.kernels, adamw.bytes) == (8 * 161, 40 * n)  # 20 tensors x 2 B
    with pytest.raises(ValueError, match="fused, foreach, for-loop"):
        optimizer_cost(n, t, "sgd", impl="apex")
    # GradScaler before each: one unscale pass (3 launches + the scale update) over the fp32
    # gradients, read and written (8 B per parameter); the CPU waits before an unfused step
    for impl in ("fused", "foreach", "for-loop"):  # (BertAdam's: test_bertadam.py)
        scaler, step = scaled_optimizer(optimizer_cost(n, t, "sgd", impl=impl))
        assert (scaler.kernels, scaler.bytes, scaler.phase) == (4, 8 * n, "optimizer")
        assert step.host_sync is (impl != "fused")
        assert step.kernels == optimizer_cost(n, t, "sgd", impl=impl).kernels


def test_a_host_synchronisation_empties_the_queue():
    # Host 1 us per kernel. A 10 us kernel, then 5 short ones (0.2 us each, 1 us in all):
    # unsynchronised the CPU issues the 5 while the long kernel runs: issued at 1, GPU ends at
    # 11; the 5 are issued by 6, so they run 11 -> 12. Synchronised before the 5, the CPU starts
    # issuing them at 11 and issues the last at 16; it runs 16 -> 16.2.
    assert step_time([10, 1], [1, 5], 1.0) == pytest.approx(12)
    assert step_time([10, 1], [1, 5], 1.0, [False, True]) == pytest.approx(16.2)
    # with no host time the synchronisation costs nothing
    assert step_time([10, 1], [1, 5], 0.0, [False, True]) == 11
    # one kernel per entry: the closed form max over i of (issued by i + GPU time from i on)
    times = [3.0, 0.5, 7.0, 0.2, 0.2, 0.1, 0.1]
    issued, closed = 0.0, sum(times)
    for i in range(len(times)):
        issued += 0.4
        closed = max(closed, issued + sum(times[i:]))
    assert step_time(times, [1] * len(times), 0.4) == pytest.approx(closed)
    # an entry of n kernels is n equal kernels run as issued: 100 kernels of 0.1 us each (10 us
    # in all) at 1 us of host time each end when the last is issued and run, 100 + 0.1 us; as
    # one kernel of 10 us issued at 1 us, 11 us; 4 kernels of 10 us each (40 in all): the GPU
    # is the bottleneck after the first is issued, 1 + 40 = 41 us
    assert step_time([10], [100], 1.0) == pytest.approx(100.1)
    assert step_time([10], [1], 1.0) == pytest.approx(11)
    assert step_time([40], [4], 1.0) == pytest.approx(41)
    # the same 100 kernels in 100 entries, one each: the same end
    assert step_time([0.1] * 100, [1] * 100, 1.0) == pytest.approx(100.1)


def test_an_unfused_fp16_step_waits_for_the_scaler_and_then_issues_every_launch():
    import dlperf

    shape = (256, 3, 224, 224)  # a step long enough that the CPU runs ahead of the GPU
    runs = {(dtype, impl): dlperf.analyze("resnet18", shape, device="a100-80gb", dtype=dtype,
                                          train=True, channels_last=True, optimizer_impl=impl)
            for dtype in ("bf16", "fp16") for impl in ("fused", "for-loop")}
    host_s = runs["fp16", "fused"].host_s
    assert host_s > 0
    tensors = sum(1 for _ in torch.nn.Module.parameters(
        __import__("torchvision").models.resnet18()))  # 62 tensors
    for (dtype, impl), a in runs.items():
        opt = [p for p in a.predictions if p.cost.phase == "optimizer"]
        assert [p.cost.op for p in opt] == (["amp_unscale", "sgd_step"] if dtype == "fp16"
                                            else ["sgd_step"])
        assert opt[-1].cost.host_sync is (dtype == "fp16" and impl == "for-loop")
    # bf16 needs no scaler: the for-loop's 4 x 62 launches are issued while the backward still
    # runs on the GPU, so the step only grows by the update's extra GPU traffic and launches
    bf16_fused = runs["bf16", "fused"].totals()["predicted_time_s"]
    bf16_loop = runs["bf16", "for-loop"].totals()["predicted_time_s"]
    gpu_extra = sum(p.time_s for p in runs["bf16", "for-loop"].predictions) - sum(
        p.time_s for p in runs["bf16", "fused"].predictions)
    assert bf16_loop - bf16_fused == pytest.approx(gpu_extra, rel=1e-6)
    # fp16 for-loop: the CPU issues the 248 launches of the update only once the GPU is done
    # with the backward and the unscale; the GPU runs each as it comes, so the update ends
    # 248 x host_s + one launch's share of its GPU time after that, where the fused update took
    # its GPU time (its launch hidden behind the backward)
    fp16_fused = runs["fp16", "fused"]
    fp16_loop = runs["fp16", "for-loop"]
    fused_step = fp16_fused.predictions[-1].time_s
    loop_step = fp16_loop.predictions[-1].time_s
    assert fp16_loop.totals()["predicted_time_s"] - fp16_fused.totals()["predicted_time_s"] \
        == pytest.approx(4 * tensors * host_s + loop_step / (4 * tensors) - fused_step, rel=1e-6)


def test_scale_out_keeps_the_update_s_host_time_whole_when_fsdp_shards_it():
    import dlperf
    from dlperf.analysis.scaling import ScaleConfig, one_step, scale_out
    from dlperf.hardware.interconnect import get_interconnect

    a = dlperf.analyze("resnet18", (32, 3, 64, 64), device="a100-80gb", dtype="fp16",
                       train=True, channels_last=True, optimizer_impl="for-loop")
    model = __import__("torchvision").models.resnet18()
    params = [(n, p.numel() * 4) for n, p in model.named_parameters()]
    step = one_step(a, params)
    opt_gpu = step.timeline.optimizer_s
    assert step.optimizer_host_s > 0
    # one GPU: the same step as the analysis
    node, net = get_interconnect("nvlink3-a100"), get_interconnect("ib-hdr")
    one = scale_out(a, params, ScaleConfig(gpus=1), node, net, step)
    assert one["per_gpu_samples_per_s"] == pytest.approx(a.totals()["samples_per_s"], rel=1e-9)
    # FSDP on 8 GPUs: each updates 1/8 of every tensor (GPU time / 8) with the same launches
    fsdp = scale_out(a, params, ScaleConfig(gpus=8, strategy="fsdp"), node, net, step)
    assert fsdp["communication"]["optimizer_s"] == pytest.approx(opt_gpu / 8 + step.optimizer_host_s)
    assert fsdp["communication"]["optimizer_host_s"] == step.optimizer_host_s
    assert math.isfinite(fsdp["per_gpu_samples_per_s"])
    # the requested scale's line says so where it is more than 1% of the step
    from dlperf.analysis.report import render_scaling
    from dlperf.term import new_console

    ddp = scale_out(a, params, ScaleConfig(gpus=8), node, net, step)
    assert step.optimizer_host_s > 0.01 * ddp["step_s"]
    console = new_console()
    with console.capture() as out:
        render_scaling(ddp, [ddp], node, net, console)
    assert "the update's launches after GradScaler's wait" in " ".join(out.get().split())


def test_the_cli_s_choices_are_the_cost_model_s():
    # the parser spells the choices out (it is built without importing torch)
    parser = __import__("argparse").ArgumentParser()
    analyze_cli.add_parser(parser.add_subparsers())
    action = next(a for sub in parser._subparsers._group_actions for p in sub.choices.values()
                  for a in p._actions if "--optimizer-impl" in a.option_strings)
    assert tuple(action.choices) == OPTIMIZER_IMPLS


def test_the_fused_update_is_what_the_finding_compares_against():
    import dlperf
    from dlperf.analysis.costs import fused_optimizer

    # the fused equivalent of an unfused update is the fused update itself
    for opt in ("sgd", "adamw"):
        for impl in ("foreach", "for-loop"):
            for eb in (4, 2):
                assert fused_optimizer(optimizer_cost(25_557_032, 161, opt, eb, impl)) == \
                    optimizer_cost(25_557_032, 161, opt, eb)
    # the finding's saving is the predicted step with the update fused, analysed on its own
    shape = (256, 3, 224, 224)
    loop, fused = (dlperf.analyze("resnet18", shape, device="a100-80gb", dtype="fp16",
                                  train=True, channels_last=True, optimizer_impl=impl)
                   for impl in ("for-loop", "fused"))
    [finding] = [f for f in loop.findings if f.rule == "optimizer"]
    assert finding.saving_s == pytest.approx(
        loop.totals()["predicted_time_s"] - fused.totals()["predicted_time_s"], rel=1e-9)
    assert "248 launches" in finding.message and "fused=True" in finding.message
    assert "GradScaler" in finding.message
    assert not [f for f in fused.findings if f.rule == "optimizer"]
