"""torch.compile's fusion (analysis/compiled.py, ``--fusion compile`` / ``compile-blocks``): which
kernels fuse and what the fused kernels move, by hand on small fp32 models, and on a small Llama
that the library kernels are untouched."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from conftest import load_benchmark
from dlperf.analysis.api import AnalysisConfig, capture_costs
from dlperf.analysis.compiled import COMPILED_OP, fusible

# the small modules (and the comparison with Inductor's own kernels) of the benchmark
CK = load_benchmark("compile_kernels_cpu")
SwiGLU, Norm, NormWeight, Cycle, Halves, TwoSums = (
    CK.SwiGLU, CK.Norm, CK.NormWeight, CK.Cycle, CK.Halves, CK.TwoSums)
N, D, F = CK.N, CK.D, CK.F  # 4 tokens, 8 features, 16 hidden
ND, NF = N * D * 4, N * F * 4  # one fp32 activation: 4 x 8 x 4 = 128 B; 4 x 16 x 4 = 256 B


class Blocks(nn.Module):
    """Two blocks (``blocks.0``, ``blocks.1``) and, with ``root_tail``, a tanh outside them."""

    def __init__(self, make=SwiGLU, root_tail: bool = False):
        super().__init__()
        self.blocks = nn.ModuleList([make(), make()])
        self.root_tail = root_tail

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return torch.tanh(x) if self.root_tail else x


def _costs(model, fusion, shape=(N, D)):
    cfg = AnalysisConfig(model="m", input_shape=shape, dtype="fp32", train=True,
                         optimizer="none", fusion=fusion)
    return capture_costs(model, cfg)[0]


def _compiled(costs, module, phase="forward"):
    return [c for c in costs if c.op == COMPILED_OP and c.module == module and
            (c.phase == "forward") == (phase == "forward")]


def test_swiglu_forward_is_one_kernel_across_the_gemm_between():
    # eager: silu reads g, writes s (2 x 256 B); mul reads s and u, writes h (3 x 256 B).
    # compiled: one kernel reads g and u, writes h: 3 x 256 = 768 B. The SiLU output is not
    # written: only the backward reads it, which recomputes it from g.
    eager = _costs(Blocks(), "none")
    assert [c.bytes for c in eager if c.module == "blocks.0" and c.phase == "forward"] == [
        2 * NF, 3 * NF]
    costs = _costs(Blocks(), "compile")
    (k,) = _compiled(costs, "blocks.0")
    assert (k.bytes, k.output_bytes, k.kernels, len(k.records)) == (3 * NF, NF, 1, 2)
    # the mul is still listed, with nothing left (a layer shows what became of it)
    mul = next(c for c in costs if c.module == "blocks.0" and c.op == "mul"
               and c.phase == "forward")
    assert (mul.bytes, mul.kernels, mul.variant) == (0, 0, "fused")


def test_swiglu_backward_reads_three_tensors_and_writes_two():
    # eager: d_u = dh * s, d_s = dh * u, dg = silu_backward(d_s, g): 3 x 768 = 2,304 B.
    # compiled: one kernel (the two products read dh: horizontal fusion) reads dh, u and g
    # (s recomputed from g) and writes d_u and dg: 5 x 256 = 1,280 B.
    eager = [c for c in _costs(Blocks(), "none")
             if c.module == "blocks.0" and c.phase != "forward" and c.kind == "memory"]
    assert sum(c.bytes for c in eager) == 9 * NF
    (k,) = _compiled(_costs(Blocks(), "compile"), "blocks.0", "backward")
    assert (k.bytes, k.output_bytes, len(k.records)) == (5 * NF, 2 * NF, 3)


def test_library_kernels_and_flops_unchanged():
    eager, costs = _costs(Blocks(), "none"), _costs(Blocks(), "compile")
    assert [c for c in eager if not fusible(c)] == [c for c in costs if not fusible(c)
                                                    and c.op != COMPILED_OP]
    assert sum(c.flops for c in eager) == sum(c.flops for c in costs)
    assert sum(c.kernels for c in costs) < sum(c.kernels for c in eager)


def test_compile_blocks_leaves_the_root_eager():
    # the tanh outside the blocks: fused by compile (nothing to fuse it with, but a compiled
    # kernel), left as ATen's by compile-blocks; the loss stays eager in both
    whole = _costs(Blocks(root_tail=True), "compile")
    blocks = _costs(Blocks(root_tail=True), "compile-blocks")
    assert [c.op for c in whole if c.module == "" and c.phase == "forward"] == [COMPILED_OP]
    assert [c.op for c in blocks if c.module == "" and c.phase == "forward"] == ["tanh"]
    assert [c.op for c in whole if c.module == "loss"] == [
        c.op for c in _costs(Blocks(root_tail=True), "none") if c.module == "loss"]
    assert _compiled(blocks, "blocks.1") == _compiled(whole, "blocks.1")


def test_no_fusion_through_a_library_kernel():
    costs = _costs(Blocks(Cycle), "compile")
    ks = _compiled(costs, "blocks.1")
    # relu alone (reads x, writes a for the GEMM and the add: 2 x 128 B); add and mul one
    # kernel (reads a and b, writes c: 3 x 128 B)
    assert sorted((len(k.records), k.bytes) for k in ks) == [(1, 2 * ND), (2, 3 * ND)]


def test_reductions_over_other_axes_stay_apart():
    ks = _compiled(_costs(Blocks(TwoSums), "compile"), "blocks.1")
    # sum over the rows with the add: reads x (128 B) and the other sum (N x 1 = 16 B),
    # writes the N x D sum (128 B) = 272 B; the sum over the features: reads x, writes 16 B
    assert sorted((len(k.records), k.bytes) for k in ks) == [(1, ND + 16), (2, 2 * ND + 16)]


def test_views_at_other_offsets_are_other_reads():
    # a and b share storage, shape and stride, not their offset: two reads (2 x 128 B) and
    # the product written (128 B), as eager's mul moves
    (k,) = _compiled(_costs(Blocks(Halves), "compile"), "blocks.1")
    assert k.bytes == 3 * ND


def test_a_reductions_result_is_saved_not_recomputed():
    # forward: one kernel reads x (128 B) and writes the normed x for the GEMM (128 B) and
    # rsqrt's N x 1 result (16 B) for the backward: made from a reduction over x, the
    # partitioner saves it rather than read x again
    (k,) = _compiled(_costs(Blocks(Norm), "compile"), "blocks.1")
    assert (k.bytes, k.output_bytes) == (2 * ND + 16, ND + 16)


def test_small_llama_compiled():
    from dlperf.analysis.api import AnalysisConfig as Config
    from dlperf.models.gpt import GPT, GPTConfig

    cfg = GPTConfig(layers=2, d_model=64, heads=4, kv_heads=2, vocab=128, seq_len=32,
                    bias=False, tie_embeddings=False, norm="rmsnorm", mlp="swiglu",
                    ffn_hidden=176, positions="rope")

    def run(fusion):
        config = Config(model="llama", input_shape=(2, 32), dtype="bf16", train=True,
                        tokens=True, fusion=fusion, optimizer="none")
        with torch.device("meta"):
            model = GPT(cfg)
        return capture_costs(model, config, torch.long)[0]

    eager, blocks, whole = run("none"), run("compile-blocks"), run("compile")
    library = [c for c in eager if c.kind in ("gemm", "fused")]
    for costs in (blocks, whole):
        assert [c for c in costs if c.kind in ("gemm", "fused")] == library
        assert sum(c.flops for c in costs) == sum(c.flops for c in eager)
    moved = [sum(c.bytes for c in costs if c.kind != "gemm" and c.kind != "fused")
             for costs in (eager, blocks, whole)]
    assert moved[0] > 1.5 * moved[1] and moved[1] >= moved[2]
    # a block's forward fuses four kernels of many: the first norm (with autocast's three
    # casts of its output for q, k and v), the rotary embeddings of q and k, the residual add
    # with the second norm, SwiGLU; the rest are single kernels (autocast's weight casts, the
    # key/value repeat, the last residual add)
    fwd = [c for c in blocks if c.op == COMPILED_OP and c.phase == "forward"
           and c.module.startswith("blocks.1") and len(c.records) > 1]
    assert [c.module for c in fwd] == ["blocks.1.ln1", "blocks.1.attn", "blocks.1",
                                       "blocks.1.act"]
    assert sum(len(c.records) for c in fwd) > 20


@pytest.mark.slow
@pytest.mark.parametrize("make", [SwiGLU, Norm, NormWeight, Cycle, Halves])
def test_fused_kernels_are_the_ones_inductor_generates(make):
    # An independent reference: torch.compile itself, on this CPU, counting the fused kernels
    # its output code calls in the forward and in the backward graph. SwiGLU 1 + 1; RMSNorm
    # 1 + 0 without a weight (the input takes no gradient; rstd saved), 1 + 1 with one; the
    # relu apart from the add after the GEMM it feeds, 2 + 1; the product of two halves 1 + 1.
    # (Not TwoSums: Inductor's C++ backend puts loops over other axes in one function, where
    # a Triton kernel reduces over one: dlperf follows the GPU.)
    torch.manual_seed(0)
    try:
        theirs = CK.inductor_kernels(make(), torch.randn(N, D))
    except Exception as exc:  # no C++ toolchain for Inductor here
        pytest.skip(f"torch.compile cannot build on this machine: {type(exc).__name__}")
    assert CK.dlperf_kernels(make(), (N, D)) == theirs


class BnRelu(nn.Module):
    """conv -> batch norm -> ReLU -> conv: torchvision's pattern."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1, bias=False)

    def forward(self, x):
        return self.conv2(torch.relu(self.bn(self.conv1(x))))


def test_batch_norm_keeps_its_second_pass():
    # the batch norm's statistics over batch and pixels, then the normalise + ReLU: x read
    # twice (as eager's 1.5 x (x + y) charges it), y written once; the ReLU's own read and
    # write of y gone. One activation: 2 x 4 x 8 x 8 x 4 B = 2,048 B; the running statistics
    # and the saved mean and rstd (4 channels) are small.
    act = 2 * 4 * 8 * 8 * 4
    costs = _costs(Blocks(BnRelu), "compile", shape=(2, 4, 8, 8))
    # (beside it, the 16 B kernel that counts the batches, num_batches_tracked += 1)
    k = max(_compiled(costs, "blocks.1.bn"), key=lambda c: c.bytes)
    assert len(k.records) == 2 and 3 * act <= k.bytes < 3 * act + 256
    eager = _costs(Blocks(BnRelu), "none", shape=(2, 4, 8, 8))
    bn, relu = (next(c for c in eager if c.module.startswith("blocks.1") and c.op == op
                     and c.phase == "forward") for op in ("native_batch_norm", "relu"))
    assert k.bytes < 1.5 * bn.bytes + relu.bytes


def test_compiled_step_keeps_fewer_activations():
    # eager autograd keeps, per SwiGLU block, its input x (for both GEMMs' weight gradients,
    # 128 B), g (the SiLU's input, 256 B), s = silu(g) and u (the product's inputs, 256 B
    # each) and h (w2's input, 256 B); compiled, s is recomputed from g in the backward and
    # not kept: 256 B less per block, 512 B for the two
    cfg = AnalysisConfig(model="m", input_shape=(N, D), dtype="fp32", train=True,
                         optimizer="none", fusion="none")
    eager = capture_costs(Blocks(), cfg)[3]["activations_bytes"]
    compiled = capture_costs(Blocks(), dataclasses.replace(cfg, fusion="compile"))[3][
        "activations_bytes"]
    assert eager - compiled == 2 * NF


class Dropout(nn.Module):
    """relu, then dropout (training), then a projection."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, D, bias=False)
        self.out = nn.Linear(D, D, bias=False)

    def forward(self, x):
        return self.out(nn.functional.dropout(torch.relu(self.lin(x)), 0.1, training=True))


def test_a_dropout_mask_is_saved_not_recomputed():
    # forward: one kernel reads the GEMM's output (128 B) and writes the dropped activation for
    # the next GEMM (128 B) and the boolean mask for the backward (4 x 8 x 1 = 32 B): random
    # numbers cannot be drawn again in the backward
    (k,) = _compiled(_costs(Blocks(Dropout), "compile"), "blocks.1")
    assert (k.bytes, k.output_bytes) == (2 * ND + N * D, ND + N * D)
