"""Fused batch-norm stacks (analysis/fusion.py, issue #14): which kernels each level removes and
what the fused kernels move, by hand on a small block, and the counts on ResNet-50."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dlperf.analysis.api import AnalysisConfig, capture_costs
from dlperf.analysis.fusion import FINALIZE_BYTES_PER_CHANNEL, fuse_costs
from dlperf.errors import DlperfError

N, C, H = 2, 8, 4
T = N * C * H * H * 4  # one fp32 activation of the block: 2 x 8 x 4 x 4 x 4 B = 1,024 B


class Block(nn.Module):
    """torchvision's bottleneck pattern, small: conv-BN-ReLU, conv-BN, += shortcut, ReLU; the
    shortcut a strided-free 1x1 conv + BN when ``downsample``, else the block's input."""

    def __init__(self, downsample: bool = False):
        super().__init__()
        self.conv1 = nn.Conv2d(C, C, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(C)
        self.conv2 = nn.Conv2d(C, C, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(C)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = (nn.Sequential(nn.Conv2d(C, C, 1, bias=False), nn.BatchNorm2d(C))
                           if downsample else None)

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class Stem(nn.Module):
    """conv-BN-ReLU into a max pool (not a convolution): the apply cannot hide in a prologue."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(C, C, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(C)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x):
        return self.pool(self.relu(self.bn(self.conv(x))))


def _costs(model, fusion):
    cfg = AnalysisConfig(model="block", input_shape=(N, C, H, H), dtype="fp32", train=True,
                         optimizer="none", fusion=fusion)
    return capture_costs(model, cfg)[0]


def _ops(costs, phase=None):
    return [(c.op, c.module) for c in costs if c.kernels and (phase is None or c.phase == phase)]


def test_eager_costs_are_untouched_by_fusion_none():
    torch.manual_seed(0)
    model = Block()
    none = _costs(model, "none")
    # conv, BN, ReLU, conv, BN, add, ReLU (each BN after its num_batches_tracked += 1), the loss
    assert _ops(none, "forward") == [
        ("convolution", "conv1"), ("add_", "bn1"), ("native_batch_norm", "bn1"),
        ("relu_", "relu"), ("convolution", "conv2"), ("add_", "bn2"),
        ("native_batch_norm", "bn2"), ("add_", ""), ("relu_", "relu"), ("sum", "loss")]
    assert [op for op, _ in _ops(none, "dgrad")].count("threshold_backward") == 2
    assert fuse_costs(none, [], "none") == none


def test_bn_act_folds_relu_and_the_residual_add_into_batch_norm():
    model = Block()
    none, fused = _costs(model, "none"), _costs(model, "bn-act")
    assert len(none) == len(fused)  # dropped kernels keep their place, with no bytes
    # forward: both ReLUs are gone, the add is one read of the addend (the block's input, T)
    assert [op for op, _ in _ops(fused, "forward")].count("relu_") == 0
    adds = [c for c in fused if c.op == "add_" and c.module == "" and c.phase == "forward"]
    assert len(adds) == 1 and adds[0].bytes == T and adds[0].kernels == 0
    # the batch norms still make two passes: their costs are eager's (read x, write y = 2 T)
    bns = [c for c in fused if c.op == "native_batch_norm"]
    assert [c.bytes for c in bns] == [c.bytes for c in none if c.op == "native_batch_norm"]
    assert all(c.bytes >= 2 * T for c in bns)
    # backward: the inner ReLU's gradient is inside bn1's backward (gone); the block end's is
    # the fork, one write of the addend's gradient (T), inside bn2's backward kernel
    tb = [c for c in fused if c.op == "threshold_backward"]
    assert sorted(c.bytes for c in tb) == [0, T] and all(c.kernels == 0 for c in tb)
    eager_tb = [c for c in none if c.op == "threshold_backward"]
    assert all(c.bytes == 3 * T for c in eager_tb)  # read grad, read output, write: 3 T
    kernels = lambda cs: sum(c.kernels for c in cs)
    assert kernels(none) - kernels(fused) == 5  # 2 ReLU, 1 add, 2 threshold_backward


def test_conv_bn_moves_statistics_and_apply_into_the_convolutions():
    model = Block()
    fused = _costs(model, "conv-bn")
    by_module = {(c.module, c.op): c for c in fused if c.phase == "forward"}
    # bn1: fed by conv1 and read only by conv2 (after the ReLU): a finalize kernel of 16 B per
    # channel (sums in from conv1's epilogue, scale and bias out) = 8 x 16 = 128 B
    fin = by_module["bn1", "bn_finalize"]
    assert fin.bytes == FINALIZE_BYTES_PER_CHANNEL * C == 128 and fin.kernels == 1
    # bn2 + add + ReLU: one streaming pass, read conv2's output and the addend, write y: 3 T
    bar = by_module["bn2", "bn_add_relu"]
    assert bar.bytes == 3 * T and bar.kernels == 1
    # (no two-pass traffic factor: the statistics came from conv2's epilogue)
    from dlperf.hardware.efficiency import memory_class_of, traffic_factor

    assert memory_class_of("bn_add_relu") == "stream" and traffic_factor("bn_add_relu") == 1.0
    # the backward is bn-act's: batch norm's backward kernels stay
    assert [c.op for c in fused if c.op == "native_batch_norm_backward"] == [
        "native_batch_norm_backward"] * 2


def test_conv_bn_applies_the_shortcut_batch_norm_in_the_dual_pass():
    model = Block(downsample=True)
    fused = _costs(model, "conv-bn")
    forward = {(c.module, c.op): c for c in fused if c.phase == "forward"}
    # the shortcut's BN (downsample.1) is read only by the add: both batch norms are applied in
    # the one pass, reading conv2's and the shortcut conv's outputs and writing y: 3 T
    assert forward["downsample.1", "bn_finalize"].bytes == FINALIZE_BYTES_PER_CHANNEL * C
    assert forward["bn2", "bn_add_relu"].bytes == 3 * T
    # at bn-act the shortcut keeps its own two-pass batch norm, and bn2's kernel reads it
    act = {(c.module, c.op): c for c in _costs(model, "bn-act") if c.phase == "forward"}
    assert ("downsample.1", "native_batch_norm") in act


def test_a_relu_read_by_a_pool_keeps_a_streaming_apply():
    fused = _costs(Stem(), "conv-bn")
    forward = {(c.module, c.op): c for c in fused if c.phase == "forward"}
    # statistics from the conv's epilogue, then one pass: read x, write y = 2 T
    assert forward["bn", "bn_relu"].bytes == 2 * T
    assert ("bn", "native_batch_norm") not in forward


def test_the_forks_gradients_accumulate_in_the_convolution():
    # two blocks in a row: the second's input feeds its conv1 and its identity shortcut, so the
    # backward sums two gradients of T bytes into one: eager PyTorch with an add kernel (2 T
    # read, T written), NVIDIA's MXNet stack in the convolution's output (beta = 1, ADDTO: one
    # read of the other gradient, T, no kernel of its own); the same for a downsampling block,
    # whose two gradients are both convolutions'
    def backward_adds(costs):
        return [(c.bytes, c.kernels) for c in costs if c.op in ("add", "add_")
                and c.phase != "forward"]

    for second in (Block(), Block(downsample=True)):
        model = nn.Sequential(Block(), second)
        assert backward_adds(_costs(model, "none")) == [(3 * T, 1)]
        assert backward_adds(_costs(model, "bn-act")) == [(T, 0)]
        assert backward_adds(_costs(model, "conv-bn")) == [(T, 0)]


def test_resnet50_sites_and_a_faster_step():
    from dlperf.analysis.api import analyze

    steps = {}
    for level in ("none", "bn-act", "conv-bn"):
        a = analyze("resnet50", (32, 3, 224, 224), device="a100-80gb", dtype="fp16",
                    channels_last=True, fusion=level)
        ops = [p.cost.op for p in a.predictions if p.cost.kernels]
        steps[level] = a.totals()["predicted_time_s"]
        if level == "conv-bn":
            # 16 bottlenecks: bn1 and bn2 in the next conv's prologue (32), the 4 shortcut BNs
            # in the dual pass, 16 dual/plain block-end passes, the stem's apply before the pool
            assert ops.count("bn_finalize") == 36 and ops.count("bn_add_relu") == 16
            assert ops.count("bn_relu") == 1 and "native_batch_norm" not in ops
        backward_adds = [p for p in a.predictions if p.cost.op in ("add", "add_")
                         and p.cost.phase != "forward" and p.cost.kernels]
        # 16 forks: every bottleneck's input feeds its conv1 and its shortcut
        assert len(backward_adds) == (16 if level == "none" else 0)
        if level != "none":
            assert "relu_" not in ops and "threshold_backward" not in ops
        assert ops.count("native_batch_norm_backward") == 53  # every level keeps them
    assert steps["none"] > steps["bn-act"] > steps["conv-bn"]


def test_unknown_fusion_is_refused():
    with pytest.raises(DlperfError, match="--fusion 'xla'"):
        fuse_costs([], [], "xla")
    with pytest.raises(DlperfError, match="--fusion"):
        _costs(Block(), "xla")


def test_analyze_cli_fuses_and_refuses_measuring_a_stack_it_does_not_run(tmp_path, capsys):
    from dlperf.cli import main

    out = tmp_path / "r.json"
    assert main(["analyze", "resnet18", "--device", "a100-80gb", "--batch-size", "8",
                 "--train", "--fusion", "bn-act", "--cuda-graphs", "--json", str(out)]) == 0
    import json

    data = json.loads(out.read_text())
    assert data["config"]["fusion"] == "bn-act" and data["config"]["cuda_graphs"] is True
    assert not any(l["op"] == "relu_" and l["kernels"] for l in data["layers"])
    code = main(["analyze", "resnet18", "--device", "cpu", "--train", "--measure",
                 "--fusion", "conv-bn"])
    assert code != 0 and "--measure times the eager" in capsys.readouterr().err


def _decoder_costs(fusion: str, tp: int = 2):
    from dlperf.models.gpt import GPT, GPTConfig

    # one block of d 64, 4 heads over 16 tokens, batch 2, explicit attention, dropout, bf16
    cfg = GPTConfig(layers=1, d_model=64, heads=4, vocab=128, seq_len=16, tp=tp, bias=True,
                    attention="math", dropout=0.1, tp_impl="megatron")
    with torch.device("meta"):
        model = GPT(cfg)
    acfg = AnalysisConfig(model="gpt", input_shape=(2, 16), dtype="bf16", train=True,
                          device="a100-80gb", tokens=True, optimizer="adamw",
                          precision="fsdp", fusion=fusion)
    costs, uncounted, _, memory = capture_costs(model, acfg, torch.long)
    assert not uncounted
    return costs, memory


def test_megatron_fuses_the_scale_the_mask_and_bias_dropout_add():
    eager, eager_memory = _decoder_costs("none")
    fused, memory = _decoder_costs("megatron")
    assert len(fused) == len(eager)  # every kernel keeps its place
    changed = [(a.module, a.op, a.phase, b.op, b.bytes, b.kernels)
               for a, b in zip(eager, fused) if a != b]
    # on one rank of 2: 2 heads of 16 x 16 scores (2 x 2 x 16 x 16 bf16 = 2,048 bytes), the
    # residual stream 2 x 8 tokens x 64 (2,048 bytes in bf16, the dropout's mask 1,024)
    assert changed == [
        # Q's scale: the scores GEMM's alpha
        ("blocks.0.attn", "mul", "forward", "mul", 0, 0),
        # the causal mask inside the fused softmax
        ("blocks.0.attn", "masked_fill", "forward", "masked_fill", 0, 0),
        # each split region's dropout and residual add: one kernel reading the region's
        # output and the residual, writing the sum and the mask: 3 x 2,048 + 1,024
        ("blocks.0.drop", "native_dropout", "forward", "native_dropout", 0, 0),
        ("blocks.0", "add", "forward", "bias_dropout_add", 7168, 1),
        ("blocks.0.drop", "native_dropout", "forward", "native_dropout", 0, 0),
        ("blocks.0", "add", "forward", "bias_dropout_add", 7168, 1),
        # the backward: the mask's and the scale's, inside the fused softmax's and the GEMM's
        ("blocks.0.attn", "masked_fill", "dgrad", "masked_fill", 0, 0),
        ("blocks.0.attn", "mul", "dgrad", "mul", 0, 0)]
    # what went: the dropouts' 2,048-byte output written and read again (twice), the mask
    # pass over the scores and its gradient (2,048 in, 2,048 out and the 16 x 16 bool mask,
    # each way), the scale of Q and of its gradient (2 x 2,048 bytes each)
    saved = sum(a.bytes for a in eager) - sum(b.bytes for b in fused)
    assert saved == 2 * 2 * 2048 + 2 * (2 * 2048 + 256) + 2 * (2 * 2048)
    # the attention dropout (read by the GEMM with V) and the embedding's (read by the norm
    # and the residual) are Megatron's plain dropouts: kept
    kept = [c for c in fused if c.op == "native_dropout" and c.kernels]
    assert [c.module for c in kept] == ["drop", "blocks.0.attn"]
    assert memory == eager_memory  # the same tensors are kept for the backward


def test_megatron_fusion_leaves_a_convolutional_network_alone():
    from dlperf.analysis.api import analyze

    none, megatron = (analyze("resnet18", (8, 3, 64, 64), device="a100-80gb", dtype="bf16",
                              fusion=level) for level in ("none", "megatron"))
    assert [p.cost for p in none.predictions] == [p.cost for p in megatron.predictions]


def test_the_cli_offers_every_fusion_level_and_no_other():
    # the parser names them itself (building it imports no torch); this keeps the two lists one
    from dlperf.analysis.fusion import FUSIONS
    from dlperf.cli import build_parser

    analyze = build_parser()._subparsers._group_actions[0].choices["analyze"]
    fusion = next(a for a in analyze._actions if "--fusion" in a.option_strings)
    strategy = next(a for a in analyze._actions if "--strategy" in a.option_strings)
    impl = next(a for a in analyze._actions if "--tp-impl" in a.option_strings)
    from dlperf.analysis.scaling import STRATEGIES, TP_IMPLS

    assert tuple(fusion.choices) == FUSIONS and tuple(strategy.choices) == STRATEGIES
    assert tuple(impl.choices) == TP_IMPLS
