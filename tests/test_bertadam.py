"""DeepLearningExamples' FP32 BERT fine-tuning update (``--optimizer-impl bertadam``,
costs.bertadam_cost): its launches and traffic counted against the same algorithm run op by op
under a dispatch mode, the per-tensor host synchronisation of torch 1.5-1.9 in the step-time
model, and the analysis and CLI around it."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import load_benchmark
from dlperf.analysis.costs import (BERTADAM_CLIP_OPS, BERTADAM_OPS, BERTADAM_PASSES,
                                   multi_tensor_kernels, optimizer_cost)
from dlperf.analysis.roofline import step_time
from dlperf.errors import DlperfError


class _Every(TorchDispatchMode):
    """Every aten op but views (one kernel each on a GPU), and the elements of the distinct non-scalar
    tensors it reads and writes (0-dim scalars are a few bytes)."""

    def __init__(self):
        super().__init__()
        self.ops, self.elements = [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view:  # an alias (``p.data``'s detach): no kernel, no traffic
            return out
        seen = {}

        def walk(x):
            if isinstance(x, torch.Tensor) and x.dim() > 0:
                seen[id(x)] = x.numel()
            elif isinstance(x, (list, tuple)):
                for y in x:
                    walk(y)
        walk(args)
        walk(list((kwargs or {}).values()))
        reads = sum(seen.values())
        # an in-place op writes its first argument (a _foreach_ op returns nothing)
        written = args[0] if func.__name__.split(".")[0].endswith("_") else out
        outs = {}
        for t in (written if isinstance(written, (list, tuple)) else [written]):
            if isinstance(t, torch.Tensor) and t.dim() > 0:
                outs[id(t)] = t.numel()
        self.ops.append(func.__name__)
        self.elements += reads + sum(outs.values())
        return out


@pytest.mark.parametrize("decay", [True, False])
def test_bertadam_launches_and_traffic_match_the_algorithm_run_op_by_op(decay):
    n = 3000
    p = torch.nn.Parameter(torch.randn(n))
    p.grad = torch.randn(n) * 1e-3
    state = {"m": torch.zeros(n), "v": torch.zeros(n)}
    with _Every() as mode:
        load_benchmark("bench_host_issue_gpu").bertadam_tensor_step(p, state,
                                                                    0.01 if decay else 0.0)
    # torch 1.10 and later: the clip's 8 kernels (norm, stack, norm, + eps, reciprocal, mul,
    # clamp, grad *= clamped coefficient), then Adam's 12 (10 without weight decay)
    assert len(mode.ops) == BERTADAM_CLIP_OPS + BERTADAM_OPS[decay]
    # traffic: the clip reads the gradient and multiplies it in place (3 passes); Adam's 29
    # passes (24); plus the clip's one-element stack, read and written (2 elements)
    assert mode.elements == (3 + BERTADAM_PASSES[decay]) * n + 2
    # the cost of that tensor alone, with run_squad's GradientClipper before it (1 pass more,
    # one multi-tensor launch)
    cost = optimizer_cost(n, 1, "adamw", impl="bertadam", decayed=(1, n) if decay else (0, 0))
    assert cost.bytes == 4 * (mode.elements - 2 + n)
    assert cost.kernels == len(mode.ops) + 1
    assert (cost.host_sync, cost.syncs, cost.tensors) == (True, 1, 1)


@pytest.mark.parametrize("decay", [True, False])
def test_bertadam_with_torch_1_9s_clip_matches_the_sync_costing(decay):
    # bertadam-sync: torch 1.9's clip_grad_norm_ line for line (norm, stack, norm, + eps,
    # reciprocal, mul, clip_coef < 1 and its copy to the host: 8 ops, one read of the
    # gradient), no multiply while the norm is under 1; then Adam's 12 (10)
    n = 3000
    p = torch.nn.Parameter(torch.randn(n))
    p.grad = torch.randn(n) * 1e-4  # a norm of ~0.005: the branch never multiplies
    state = {"m": torch.zeros(n), "v": torch.zeros(n)}
    with _Every() as mode:
        load_benchmark("bench_host_issue_gpu").bertadam_tensor_step(
            p, state, 0.01 if decay else 0.0, sync_clip=True)
    assert "_local_scalar_dense" in mode.ops[7]  # the host reads the comparison: a wait
    assert len(mode.ops) == BERTADAM_CLIP_OPS + BERTADAM_OPS[decay]
    assert mode.elements == (1 + BERTADAM_PASSES[decay]) * n + 2
    cost = optimizer_cost(n, 1, "adamw", impl="bertadam-sync",
                          decayed=(1, n) if decay else (0, 0))
    assert cost.bytes == 4 * (mode.elements - 2 + n) and cost.kernels == len(mode.ops) + 1


def test_bertadam_on_bert_large_by_hand():
    # BERT-large's tensors as run_squad.py trains them: say 200 two-dimensional (decayed,
    # 330 M parameters) and 190 one-dimensional (biases, LayerNorm: 0.5 M)
    n, t, decayed = 330_500_000, 390, (200, 330_000_000)
    cost = optimizer_cost(n, t, "adamw", impl="bertadam", decayed=decayed)
    # launches: 200 x 12 + 190 x 10 + 390 x 8 + the clipper's multi-tensor l2norm
    # (ceil(390 / 64) = 7 by tensors, ceil(330.5 M / 20,971,520) = 16 by elements: 16)
    assert multi_tensor_kernels(n, t) == 16
    assert cost.kernels == 2400 + 1900 + 3120 + 16 == 7436
    # bytes: (29 x 330 M + 24 x 0.5 M + (3 + 1) x 330.5 M) x 4 B
    assert cost.bytes == 4 * (29 * 330_000_000 + 24 * 500_000 + 4 * 330_500_000)
    # against the fused AdamW's 28 B a parameter: 4.7x the traffic
    assert cost.bytes / optimizer_cost(n, t, "adamw").bytes == pytest.approx(4.72, abs=0.01)
    # torch 1.5.1-1.9: the clip's multiply skipped (1 pass less), one synchronisation per
    # tensor and the clipper's: 391 rounds
    sync = optimizer_cost(n, t, "adamw", impl="bertadam-sync", decayed=decayed)
    assert sync.bytes == cost.bytes - 2 * 4 * n
    assert (sync.kernels, sync.syncs) == (cost.kernels, 391)
    with pytest.raises(ValueError, match="FP32 Adam"):
        optimizer_cost(n, t, "sgd", impl="bertadam")
    with pytest.raises(ValueError, match="FP32 Adam"):
        optimizer_cost(n, t, "adamw", element_bytes=2, impl="bertadam")
    with pytest.raises(ValueError, match="at most"):
        optimizer_cost(n, t, "adamw", impl="bertadam", decayed=(t + 1, n))


def test_synchronised_rounds_leave_the_gpu_idle_while_the_cpu_issues_each():
    # Host 1 us a launch. One entry of 4 kernels, 4 us of GPU time, after a wait (1 round):
    # the first kernel is issued at 1 and the GPU is the bottleneck: 1 + 4 = 5
    assert step_time([4], [4], 1.0, [1]) == pytest.approx(5)
    # in 2 rounds of 2 kernels (2 us each), waiting before each: round 1 ends at
    # max(0 + 1 + 2, 0 + 2 + 1) = 3; round 2 starts then: 3 + 3 = 6
    assert step_time([4], [4], 1.0, [2]) == pytest.approx(6)
    # in 4 rounds of 1 kernel (1 us): each 1 + 1, 8 in all
    assert step_time([4], [4], 1.0, [4]) == pytest.approx(8)
    # a long kernel before: without any wait its 10 us hide the 4 launches (10 + ...); with
    # rounds every one of them waits for it: the same 6 us after it
    assert step_time([10, 4], [1, 4], 1.0) == pytest.approx(15)
    assert step_time([10, 4], [1, 4], 1.0, [0, 2]) == pytest.approx(11 + 6)
    # flags still read as one wait (GradScaler's)
    assert step_time([10, 4], [1, 4], 1.0, [False, True]) == step_time([10, 4], [1, 4], 1.0,
                                                                          [0, 1])


def _step_time_loop(kernel_times, kernel_counts, host_s, syncs):
    """roofline.step_time's recurrence entry by entry (and round by round), as first written:
    the reference its unrolled form must equal."""
    issued = gpu = 0.0
    for i, (d, n) in enumerate(zip(kernel_times, kernel_counts)):
        rounds = int(syncs[i])
        if n <= 0:
            if rounds:
                issued = max(issued, gpu)
            gpu = max(gpu, issued) + d
            continue
        k = max(1, min(rounds, n))
        for _ in range(k):
            if rounds:
                issued = max(issued, gpu)
            m, part = n / k, d / k
            gpu = max(gpu + part, issued + host_s + part, issued + m * host_s + part / m)
            issued += m * host_s
    return gpu


def test_the_unrolled_step_time_is_the_recurrence():
    import random

    rng = random.Random(7)
    for _ in range(300):
        size = rng.randint(1, 40)
        times = [rng.choice([0.0, rng.uniform(0, 5), rng.uniform(0, 0.1)]) for _ in range(size)]
        counts = [rng.choice([0, 1, 1, 2, 7, 50]) for _ in range(size)]
        syncs = [rng.choice([0, 0, 0, 0, 1, 3, 60]) for _ in range(size)]
        host = rng.choice([0.01, 0.3, 1.0])
        assert step_time(times, counts, host, syncs) == pytest.approx(
            _step_time_loop(times, counts, host, syncs), rel=1e-9, abs=1e-12)
        assert step_time(times, counts, host) == pytest.approx(
            _step_time_loop(times, counts, host, [0] * size), rel=1e-9, abs=1e-12)


def _bert_like():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(64, 64)
            self.norm = torch.nn.LayerNorm(64)

        def forward(self, x):
            return self.norm(torch.relu(self.fc(x)) + x)

    return torch.nn.Sequential(Block(), Block(), torch.nn.Linear(64, 2))


def test_the_analysis_counts_run_squads_no_decay_list_and_the_wait():
    import dlperf

    model = _bert_like()
    runs = {impl: dlperf.analyze(model, (32, 64), device="a100-80gb", dtype="fp32", tf32=True,
                                 train=True, optimizer="adamw", optimizer_impl=impl)
            for impl in ("fused", "bertadam", "bertadam-sync")}
    steps = {impl: [p for p in a.predictions if p.cost.phase == "optimizer"][-1]
             for impl, a in runs.items()}
    # 10 tensors: 3 weights (decayed: 64 x 64 twice and 2 x 64, 8,320 parameters) and 7
    # biases and LayerNorm vectors (2 x 3 x 64 + 2 = 386): 8,706 parameters in all
    n = sum(p.numel() for p in model.parameters())
    assert n == 8706
    c = steps["bertadam"].cost
    # 3 x 12 + 7 x 10 Adam kernels, 10 x 8 for the clips, 1 for the clipper's l2norm
    assert c.kernels == 187
    assert c.bytes == 4 * (29 * 8320 + 24 * 386 + 4 * n)
    assert steps["bertadam-sync"].cost.syncs == 11
    # a tiny model: the update is all launches, issued with the GPU idle (after the wait),
    # and 12 rounds add no launch but the GPU's time between them
    t = {impl: a.totals()["predicted_time_s"] for impl, a in runs.items()}
    host_s = runs["bertadam"].host_s
    assert t["bertadam"] - t["fused"] >= 0.9 * (c.kernels - 1) * host_s
    assert t["bertadam-sync"] >= t["bertadam"]
    # the finding: the fused update instead, what it saves, and how
    text = " ".join(f.message for f in runs["bertadam"].findings)
    assert "BertAdam" in text and "FusedAdam" in text and "clip_grad_norm_" in text
    with pytest.raises(DlperfError, match="--optimizer-impl bertadam: BertAdam"):
        dlperf.analyze(model, (32, 64), device="a100-80gb", train=True, optimizer="sgd",
                       optimizer_impl="bertadam")


def test_cli_takes_bertadam(capsys):
    from dlperf.cli import main

    assert main(["analyze", "bert-base", "--train", "--batch-size", "2", "--dtype", "fp32",
                 "--tf32", "--device", "a100-80gb", "--optimizer-impl", "bertadam-sync"]) == 0
    out = capsys.readouterr().out
    assert "DeepLearningExamples' BertAdam under torch 1.5-1.9" in out


def test_the_dispatch_timing_runs_the_same_loop():
    b = load_benchmark("bench_host_issue_gpu").bertadam_dispatch(tensors=6, rounds=2, steps=1)
    # 3 tensors with weight decay (8 + 12 ops) and 3 without (8 + 10)
    assert b["ops"] == 3 * 20 + 3 * 18 and b["median_step_s"] > 0
    assert b["s_per_op"] == pytest.approx(b["median_step_s"] / b["ops"])
