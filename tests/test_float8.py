"""models/float8.py (`analyze --fp8 tensorwise`): torchao's float8 linear layers. Their numbers
against a float64 product of the quantized operands, the kernels a layer runs eager and what
torch.compile makes of them (analysis/compiled.py: the amax a split reduction, the cast after
it) against counts by hand, the weights' casts under FSDP's float8 all-gather (api shares,
scaling's gathered bytes), the selective checkpoint policy, the CLI and the record."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from conftest import run_cli
from torch import nn

from dlperf.analysis.api import AnalysisConfig, _meta_forward, _meta_inputs, capture_costs
from dlperf.analysis.capture import OpRecord, TensorMeta, capture
from dlperf.analysis.compiled import COMPILED_OP, SPLIT_REDUCTION_MIN, split_reduction
from dlperf.analysis.costs import share_costs
from dlperf.hardware.track_record import build_float8, describe_float8
from dlperf.models import float8
from dlperf.models.gpt import GPT, GPTConfig

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _dequantized(x: torch.Tensor, fmt) -> torch.Tensor:
    """x as torchao's tensorwise cast quantizes it (scale = the format's largest value over
    the amax, in FP32; x in FP32 times the scale, saturated), back in float64: the operand the
    FP8 GEMM multiplies, computed without _scaled_mm."""
    top = torch.finfo(fmt).max
    scale = torch.tensor(top, dtype=torch.float32) / x.abs().max().float()
    q = (x.float() * scale).clamp(-top, top).to(fmt)
    return q.double() / scale.double()


def test_the_layer_is_the_product_of_its_quantized_operands():
    # forward: E4M3 input and weight; backward: the E5M2 gradient against each of them, FP32
    # accumulation (_scaled_mm's) against float64: agreement to FP32 rounding
    torch.manual_seed(0)
    layer = float8.Float8Linear(32, 48, False)
    x = torch.randn(2, 5, 32, requires_grad=True)
    y = layer(x)
    xd, wd = _dequantized(x.detach(), E4M3), _dequantized(layer.weight.detach(), E4M3)
    assert y.shape == (2, 5, 48)
    assert torch.allclose(y.double(), xd @ wd.t(), rtol=1e-5, atol=1e-5)
    g = torch.randn(2, 5, 48)
    y.backward(g)
    gd = _dequantized(g, E5M2)
    assert torch.allclose(x.grad.double(), gd @ wd, rtol=1e-5, atol=1e-5)
    assert torch.allclose(layer.weight.grad.double(),
                          gd.reshape(-1, 48).t() @ xd.reshape(-1, 32), rtol=1e-5, atol=1e-4)
    # FP8's own error against the exact product stays a few percent (3 mantissa bits)
    exact = x.detach().double() @ layer.weight.detach().double().t()
    assert (y.double() - exact).norm() / exact.norm() < 0.1


def _dequantized_axiswise(x: torch.Tensor, dim: int) -> torch.Tensor:
    """x as torchao's rowwise recipe quantizes it along ``dim`` (E4M3; the scale the format's
    largest value over each row's amax, rounded down to a power of two), back in float64."""
    top = torch.finfo(E4M3).max
    amax = x.abs().amax(dim=dim, keepdim=True).double()
    scale = torch.exp2(torch.floor(torch.log2(top / amax))).float()
    q = (x.float() * scale).clamp(-top, top).to(E4M3)
    return q.double() / scale.double()


def test_the_rowwise_layer_is_the_product_of_its_quantized_operands():
    # forward: x per token, W per output feature; data gradient: g per token, W per input
    # feature; weight gradient: g and x per feature (their amaxes over the tokens); all E4M3
    # on power-of-two scales (exact to divide back out), FP32 accumulation: agreement with
    # float64 to FP32 rounding, the backward's through cuBLAS's unit-scale GEMM and the
    # rescale after it (BF16 output: to BF16 rounding)
    torch.manual_seed(2)
    layer = float8.Float8Linear(32, 48, False, "rowwise")
    x = torch.randn(2, 5, 32, requires_grad=True)
    y = layer(x)
    x2, w = x.detach().reshape(-1, 32), layer.weight.detach()
    assert torch.allclose(y.double().reshape(-1, 48),
                          _dequantized_axiswise(x2, -1) @ _dequantized_axiswise(w, -1).t(),
                          rtol=1e-5, atol=1e-5)
    g = torch.randn(2, 5, 48)
    y.backward(g)
    g2 = g.reshape(-1, 48)
    assert torch.allclose(x.grad.double().reshape(-1, 32),
                          _dequantized_axiswise(g2, -1) @ _dequantized_axiswise(w, 0),
                          rtol=1e-5, atol=1e-5)
    assert torch.allclose(layer.weight.grad.double(),
                          _dequantized_axiswise(g2, 0).t() @ _dequantized_axiswise(x2, 0),
                          rtol=1e-5, atol=1e-4)
    # an outlier token (10^5 times the others) takes one scale for the whole tensor, pushing
    # the other tokens into E4M3's subnormals; a scale per token keeps them: the other
    # tokens' outputs stay within FP8's few percent under rowwise, not under tensorwise
    xo = x.detach().clone()
    xo[0, 0] *= 1e5
    exact = xo.double() @ w.double().t()
    tensorwise = float8.Float8Linear(32, 48, False)
    tensorwise.load_state_dict(layer.state_dict())
    err = {name: ((m(xo)[:, 1:].double() - exact[:, 1:]).norm()
                  / exact[:, 1:].norm()).item()
           for name, m in (("rowwise", layer), ("tensorwise", tensorwise))}
    assert err["rowwise"] < 0.1 < err["tensorwise"]


def test_a_bias_and_the_gathered_weight_compute_the_same():
    # the FSDP-gathered form casts its weight with the opaque ops (the same scale), and a
    # bias adds after the GEMM, its gradient the gradient's sum over the tokens
    torch.manual_seed(1)
    plain = float8.Float8Linear(32, 16, True)
    gathered = float8.Float8Linear(32, 16, True, gathered=True)
    gathered.load_state_dict(plain.state_dict())
    x = torch.randn(6, 32)
    ya, yb = plain(x), gathered(x)
    assert torch.equal(ya, yb)
    ya.sum().backward()
    yb.sum().backward()
    assert torch.equal(plain.weight.grad, gathered.weight.grad)
    assert torch.allclose(plain.bias.grad, torch.full((16,), 6.0))


def test_layer_sizes_recipe_and_stack_are_checked():
    with pytest.raises(ValueError, match="multiples of 16"):
        float8.Float8Linear(24, 48, False)
    with pytest.raises(ValueError, match="recipe"):
        float8.Float8Linear(32, 48, False, "blockwise")
    with pytest.raises(ValueError, match="tensorwise only"):
        float8.Float8Linear(32, 48, False, "rowwise", gathered=True)
    with pytest.raises(ValueError, match="rowwise recipe gathers"):
        GPTConfig(layers=1, d_model=64, heads=4, fp8="rowwise", fp8_all_gather=True)
    with pytest.raises(ValueError, match="tp_impl 'torch' or 'torch-async'"):
        GPTConfig(layers=1, d_model=64, heads=4, fp8="tensorwise", tp_impl="te")
    with pytest.raises(ValueError, match="gradient before the gather"):
        float8.Float8Linear(32, 48, False, "rowwise")(torch.ones(2, 32), None,
                                                      float8.Float8GradCast())
    with pytest.raises(ValueError, match="tensorwise recipe only"):
        float8.Float8Cast(torch.ones(1, 4, 32), "rowwise").gather(2)
    with pytest.raises(ValueError, match="fp8_all_gather"):
        GPTConfig(layers=1, d_model=64, heads=4, fp8_all_gather=True)


M, K, N = 256, 64, 96  # tokens, input and output features of one layer


class One(nn.Module):
    """One float8 layer as the only block (``blocks.0``), bf16."""

    def __init__(self, gathered: bool = False, recipe: str = "tensorwise"):
        super().__init__()
        self.blocks = nn.ModuleList([float8.Float8Linear(K, N, False, recipe,
                                                         gathered=gathered)])

    def forward(self, x):
        return self.blocks[0](x)


def _costs(fusion: str, gathered: bool = False, recipe: str = "tensorwise", **kw):
    cfg = AnalysisConfig(model="m", input_shape=(M, K), dtype="bf16", precision="half",
                         train=True, optimizer="none", fusion=fusion, **kw)
    return capture_costs(One(gathered, recipe).bfloat16(), cfg)[0]


def _layer(costs, phase=None):
    return [c for c in costs if c.module.startswith("blocks.0") and c.kernels
            and (phase is None or (c.phase == "forward") == (phase == "forward"))]


def test_eager_kernels_by_hand():
    # Eager, one cast is torchao's ops one kernel each: abs, max (the amax), the scale
    # (amax to FP32, clamp, the format's max over it: a reciprocal and a multiply on one
    # value), x in FP32, times the scale, clamped, to FP8, and the inverse scale the GEMM
    # takes. The input x [256, 64] BF16 (32 KiB): abs reads and writes it (2 x 32 KiB), max
    # reads it, the copy to FP32 reads 32 KiB and writes 64 KiB, the multiply and the clamp
    # read and write 64 KiB each, the cast to FP8 reads 64 KiB and writes 16 KiB.
    costs = _costs("none")
    fwd = _layer(costs, "forward")
    x = M * K * 2
    big = [(c.op, c.bytes) for c in fwd if c.bytes >= x]
    assert big[:6] == [("abs", 2 * x), ("max", x + 2), ("_to_copy", 3 * x),
                       ("mul", 4 * x + 4), ("clamp", 4 * x), ("_to_copy", 2 * x + x // 2)]
    ops = Counter(c.op for c in costs if c.kernels)
    # three casts (input and weight forward, the gradient backward), three FP8 GEMMs; the
    # backward's three FP8 copies (W's, the gradient's and x's transposes) are clones
    assert ops["max"] == 3 and ops["_scaled_mm"] == 3 and ops["clone"] == 3
    assert {c.dtype for c in costs if c.op == "_scaled_mm"} == {"fp8"}


def test_compiled_casts_by_hand():
    # Under torch.compile a cast is two generated kernels: the amax (abs and max: one read of
    # x, split in two launches: a reduction to one value of 16,384 elements) and the cast
    # (x read again with the amax, the scale computed inline, FP8 written: 32 KiB + 16 KiB).
    # The weight (96 x 64 = 6,144 elements, not split) is one kernel: read 12 KiB, write 6.
    # Backward: the gradient g [256, 96] (48 KiB): its amax, then one kernel writing its FP8
    # data and the transposed copy the weight-gradient GEMM reads (48 + 2 x 24 KiB); the
    # input's and the weight's transposed FP8 copies a kernel each (read and write 16 KiB,
    # 6 KiB).
    costs = _costs("compile")
    fwd = [c for c in _layer(costs, "forward") if c.op == COMPILED_OP]
    x, w, g = M * K * 2, N * K * 2, M * N * 2
    assert [(c.bytes // 1024, c.kernels) for c in fwd] == [
        (x // 1024, 2), ((x + x // 2) // 1024, 1), ((w + w // 2) // 1024, 1)]
    assert fwd[0].output_bytes == 2  # the amax
    back = [c for c in _layer(costs, "backward") if c.op == COMPILED_OP]
    assert sorted((c.bytes // 1024, c.kernels) for c in back) == sorted(
        [(g // 1024, 2), (2 * g // 1024, 1), (x // 1024, 1), (w // 1024, 1)])
    # the GEMMs are untouched
    assert [c.op for c in costs if c.kind == "gemm"] == ["_scaled_mm"] * 3


def test_rowwise_kernels_by_hand():
    # Eager: six casts (x and W forward; g twice, W and x again backward), each an amax over
    # its axis; three FP8 GEMMs, the forward's on the per-row scales, the backward's at unit
    # scales with the output rescaled after them
    costs = _costs("none", recipe="rowwise")
    ops = Counter(c.op for c in _layer(costs) if c.kernels)
    assert ops["amax"] == 6 and ops["_scaled_mm"] == 3 and ops["mul_"] == 2
    # Compiled, each cast is one kernel: a reduction along the rows (or the columns) and the
    # cast of the same elements, reading the tensor once and writing its FP8 data (in the
    # layout its GEMM takes) and an FP32 inverse scale per row. Forward: x [256, 64]: 32 KiB
    # read, 16 KiB + 256 x 4 written; W [96, 64]: 12 KiB read, 6 KiB + 96 x 4 written
    costs = _costs("compile", recipe="rowwise")
    fwd = [c for c in _layer(costs, "forward") if c.op == COMPILED_OP]
    x, w, g = M * K * 2, N * K * 2, M * N * 2
    assert [(c.bytes, c.output_bytes, c.kernels) for c in fwd] == [
        (x + x // 2 + M * 4, x // 2 + M * 4, 1), (w + w // 2 + N * 4, w // 2 + N * 4, 1)]
    # Backward: g [256, 96] per token (48 KiB read, 24 KiB + 256 x 4 written, and the unit
    # scale, 4 bytes) and per feature (the same, 96 x 4 of scales); W per input feature with
    # the one row of g its fake dependency reads (12 KiB + 192 B read, 6 KiB + 64 x 4
    # written); x per feature (32 KiB read, 16 KiB + 64 x 4 written); the rescales read and
    # write dx [256, 64] and dW [96, 64] in BF16 with their two scale vectors. The casts per
    # feature (and W's per input feature, down W's rows) are outer reductions: their amax is
    # known after the last row, so the cast reads the rows again: g, x and W (with g's row)
    # read twice
    back = sorted((c.bytes, c.kernels) for c in _layer(costs, "backward")
                  if c.op == COMPILED_OP)
    assert back == sorted([
        (g + g // 2 + M * 4 + 4, 1), (2 * g + g // 2 + N * 4 + 4, 1),
        (2 * (w + N * 2) + w // 2 + K * 4, 1), (2 * x + x // 2 + K * 4, 1),
        (2 * x + M * 4 + K * 4, 1), (2 * w + N * 4 + K * 4, 1)])
    gemms = [c for c in costs if c.kind == "gemm"]
    assert [c.op for c in gemms] == ["_scaled_mm"] * 3


def test_split_reduction_rule():
    def rec(out_numel, in_numel):
        return OpRecord(index=0, op="max", module="m", module_type="M", phase="forward",
                        inputs=(TensorMeta((in_numel,), "bf16", (1,), 1),),
                        outputs=(TensorMeta((out_numel,) if out_numel > 1 else (), "bf16",
                                            (1,) if out_numel > 1 else (), 2),))

    assert split_reduction(rec(1, SPLIT_REDUCTION_MIN + 1))
    assert not split_reduction(rec(1, SPLIT_REDUCTION_MIN))  # one kernel: Inductor's rule
    assert not split_reduction(rec(256, 1 << 20))  # rows: a norm's reduction


def test_outer_reduction_rule():
    # down the rows of a row-major tensor (a column's amax) is outer; along them (a token's
    # amax) is not; a transposed view's reduction is judged by its memory order (W.t()'s
    # amax over its first dimension runs along W's rows); a fill is no reduction
    def rec(shape, stride, out, op="amax"):
        numel = 1
        for n in out:
            numel *= n
        return OpRecord(index=0, op=op, module="m", module_type="M", phase="forward",
                        inputs=(TensorMeta(shape, "bf16", stride, 1),),
                        outputs=(TensorMeta(out, "bf16", (out[1], 1), 2),))

    from dlperf.analysis.compiled import outer_reduction

    assert outer_reduction(rec((256, 64), (64, 1), (1, 64)))
    assert not outer_reduction(rec((256, 64), (64, 1), (256, 1)))
    assert not outer_reduction(rec((64, 96), (1, 64), (1, 96)))  # W [96, 64] transposed
    assert outer_reduction(rec((64, 96), (1, 64), (64, 1)))
    assert not outer_reduction(rec((256, 64), (64, 1), (1, 1), op="new_ones"))
    assert not outer_reduction(rec((256, 64), (64, 1), (100, 64), op="embedding_backward"))


def test_a_small_tensors_cast_is_one_kernel():
    # a cast of at most 8,192 elements: the amax and the cast in one kernel (Inductor does
    # not split it): x [64, 64] read once, FP8 written with the inverse scale (4 bytes) the
    # GEMM reads
    cfg = AnalysisConfig(model="m", input_shape=(64, K), dtype="bf16", precision="half",
                         train=True, optimizer="none", fusion="compile")
    costs = capture_costs(One().bfloat16(), cfg)[0]
    fwd = [c for c in _layer(costs, "forward") if c.op == COMPILED_OP]
    assert fwd[0].kernels == 1 and fwd[0].bytes == 64 * K * 2 + 64 * K + 4


def test_gathered_weights_are_cast_on_the_shard():
    # FSDP's float8 all-gather: the weight cast is the opaque pre-gather ops (not fused),
    # charged at the shares gather_shares gives: on 8 GPUs, the amax 4/2/8 = 0.25 of a full
    # BF16 amax, the cast 2 x 5/3/8 = 0.4167 of a full BF16 cast (12 KiB + 6 KiB)
    shares = float8.gather_shares(8)
    assert shares == {"fp8_weight_amax_share": 0.25,
                      "fp8_weight_cast_share": pytest.approx(10 / 24)}
    costs = _costs("compile", gathered=True, **shares)
    by_op = {c.op: c for c in costs if c.op.startswith("fp8_weight")}
    w = N * K * 2
    assert by_op["fp8_weight_amax"].bytes == round((w + 4) * 0.25)  # (+ the FP32 amax)
    assert by_op["fp8_weight_quantize"].bytes == pytest.approx(
        (w + w // 2 + 8) * 10 / 24, abs=1)  # (+ the amax read, the inverse scale written)
    # the weight's forward cast kernel is gone from the compiled ones
    assert len([c for c in _layer(costs, "forward") if c.op == COMPILED_OP]) == 2
    with pytest.raises(ValueError):
        float8.gather_shares(0)
    with pytest.raises(ValueError):
        share_costs(costs, ("x",), -1.0)


def _llama(**kw):
    return GPTConfig(layers=2, d_model=64, heads=4, kv_heads=2, vocab=96, seq_len=32,
                     tie_embeddings=False, norm="rmsnorm", mlp="swiglu", ffn_hidden=128,
                     positions="rope", fp8="tensorwise", **kw)


def _captured(batch: int):
    """(the small float8 Llama, its capture at ``batch`` x 32 tokens in BF16)."""
    model = GPT(_llama())
    inputs = _meta_inputs((batch, 32), torch.long, False)
    forward, params = _meta_forward(model, False, torch.bfloat16)
    return model, capture(model, inputs, train=True, autocast_dtype=None, forward=forward,
                          params=params)


def test_a_llama_block_by_hand():
    # 7 float8 layers a block, 4 inputs (q, k, v share h's cast, as torch.compile's CSE
    # computes the three identical casts once; fc and gate share theirs): forward 4 input
    # amaxes + 7 weight amaxes and 7 FP8 GEMMs; backward 7 gradient amaxes, 14 FP8 GEMMs,
    # 7 + 7 + 4 transposed copies (weights, gradients, inputs); the output layer a BF16 mm
    model, cap = _captured(batch=3)
    c = Counter((r.op, r.phase == "forward") for r in cap.records
                if r.module.startswith("blocks.") and r.op in ("max", "_scaled_mm", "clone")
                and (r.op != "clone" or r.outputs[0].dtype == "fp8"))  # (rope's own clones)
    blocks = 2
    assert c[("max", True)] == (4 + 7) * blocks and c[("max", False)] == 7 * blocks
    assert c[("_scaled_mm", True)] == 7 * blocks and c[("_scaled_mm", False)] == 14 * blocks
    assert c[("clone", False)] == (7 + 7 + 4) * blocks
    assert isinstance(model.head, nn.Linear) and not isinstance(model.head,
                                                                float8.Float8Linear)
    assert len(float8.float8_parameters(model)) == 0  # not gathered in FP8
    gathered = GPT(_llama(fp8_all_gather=True))
    names = float8.float8_parameters(gathered)
    assert len(names) == 7 * blocks and "blocks.0.attn.wq.weight" in names
    assert "head.weight" not in names


def test_selective_checkpointing_counts_the_float8_gemms_as_mm():
    # torchao calls torch.mm on its Float8Tensors, which torchtitan's op-level policy sees as
    # aten.mm (its dispatch mode comes before the subclass): a float8 block keeps and
    # recomputes the GEMMs a BF16 block does, recomputing 3 of its 7 (k, o, w3). TE's FP8
    # layers run their own GEMM ops, which the policy never saves: 6 recomputed (all but the
    # last, w2, which the backward does not need)
    def recomputed_gemms(fp8, tp_impl="torch"):
        cfg = GPTConfig(**{**_llama().__dict__, "fp8": fp8, "tp_impl": tp_impl})
        model = GPT(cfg)
        a = AnalysisConfig(model="gpt", input_shape=(2, 32), dtype="bf16", precision="fsdp",
                           train=True, tokens=True, optimizer="none",
                           activation_checkpointing=True, checkpoint_policy="selective-op")
        costs = capture_costs(model, a, torch.long)[0]
        return sum(c.phase == "recompute" and c.kind == "gemm" for c in costs)

    assert recomputed_gemms(None) == 3 * 2
    assert recomputed_gemms("tensorwise") == 3 * 2
    assert recomputed_gemms("current", "te") == 6 * 2


def test_selective_checkpointing_keeps_the_amaxes_and_gemm_outputs_by_hand():
    # torchtitan's policy saves max: each cast's amax stays through the step, not the |x|
    # before it (abs left its list in 2025-02). A block of the small Llama at 2 x 32 = 64
    # tokens keeps the outputs of its odd-numbered GEMMs, q (width 64), v (32), w1 (128) and
    # w2 (64): 64 x 288 x 2 = 36,864 bytes in BF16, and 11 amaxes (4 inputs, 7 weights) of 2
    # bytes: 36,886 bytes a block; beside them the fused attention's outputs. Compiled, the
    # amax kernel reads |x| inside itself: the same bytes kept, and the kernel not replayed
    from dlperf.analysis.api import kept_bytes, kept_by_policy, policy_ops
    from dlperf.analysis.costs import all_costs
    from dlperf.analysis.fusion import fuse_costs

    _, cap = _captured(batch=2)
    costs, _ = all_costs(cap.records, cap.regions)
    ops = {r.index: r.op for r in cap.records}
    out_bytes = {r.index: sum(t.nbytes for t in r.outputs) for r in cap.records}
    attention = sum(c.output_bytes for c in costs if c.kind == "fused"
                    and c.phase == "forward" and c.module.startswith("blocks."))
    assert kept_bytes(costs, cap.blocks, "selective-op", ops, out_bytes) == (
        attention + 2 * 36_886)
    compiled = fuse_costs(costs, cap.records, "compile-blocks", cap.blocks, {})
    outer = policy_ops(cap.records, compiled, "compile-blocks")
    dropped = {ops[i] for i in ops.keys() - outer.keys()}
    assert dropped == {"abs"}  # every cast's |x|; every max stays
    assert kept_bytes(compiled, cap.blocks, "selective-op", outer, out_bytes) == (
        attention + 2 * 36_886)
    # at 5 x 32 tokens an input's amax over more than 8,192 elements is a split reduction,
    # a kernel of its own where nothing fuses into it (the attention output's, before wo):
    # kept, not replayed
    _, cap = _captured(batch=5)
    costs, _ = all_costs(cap.records, cap.regions)
    compiled = fuse_costs(costs, cap.records, "compile-blocks", cap.blocks, {})
    outer = policy_ops(cap.records, compiled, "compile-blocks")
    block = [c for c in compiled if c.phase == "forward" and c.module.startswith("blocks.0.")
             and c.kernels]
    kept = kept_by_policy(block, "selective-op", outer)
    amax_only = [k for c, k in zip(block, kept) if c.op == COMPILED_OP
                 and {outer[i] for i in c.records if i in outer} == {"max"}]
    assert amax_only and all(amax_only)


def test_fsdp_gathers_float8_weights_in_one_byte():
    # FSDP on 4 GPUs of a small float8 Llama: the gathered bytes are the BF16 parameters' 2
    # bytes an element, less 1 byte for each float8 weight (their FP8 all-gather)
    from dlperf.analysis.api import analyze_model
    from dlperf.analysis.scaling import ScaleConfig, scale_out
    from dlperf.hardware.interconnect import get_interconnect
    from dlperf.hardware.specs import get_device

    model = GPT(_llama(fp8_all_gather=True))
    cfg = AnalysisConfig(model="gpt", input_shape=(2, 32), dtype="bf16", precision="fsdp",
                         train=True, tokens=True, optimizer="adamw", device="h100-sxm")
    analysis = analyze_model(model, cfg, get_device("h100-sxm"), input_dtype=torch.long)
    params = [(n, p.numel() * 4) for n, p in model.named_parameters()]
    node, net = get_interconnect("nvlink4-h100"), get_interconnect("ib-ndr")
    names = float8.float8_parameters(model)
    fp8_numel = sum(p.numel() for n, p in model.named_parameters() if n in names)
    total = sum(p.numel() for p in model.parameters())
    out = {}
    for gathered in (frozenset(), names):
        r = scale_out(analysis, params, ScaleConfig(gpus=4, gpus_per_node=8, strategy="fsdp",
                                                    fp8_gathered=gathered), node, net)
        out[bool(gathered)] = r["communication"]["all_gather_bytes"]
    # fsdp_traffic: two gathers of (n-1)/n of the bytes
    assert out[False] == pytest.approx(2 * 2 * total * 3 / 4)
    assert out[True] == pytest.approx(2 * (2 * total - fp8_numel) * 3 / 4)


LLAMA = ["analyze", "gpt", "--layers", "2", "--d-model", "256", "--heads", "4",
         "--seq-len", "256", "--train", "--dtype", "bf16", "--precision", "fsdp",
         "--batch-size", "2", "--top", "1"]


def test_cli_float8(capsys, tmp_path):
    code, _, err = run_cli(LLAMA + ["--fp8", "tensorwise", "--tp-impl", "te"], capsys)
    assert code == 2 and "--tp-impl torch or torch-async" in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = run_cli(LLAMA + ["--fp8", "tensorwise", "--fp8-all-gather"], capsys)
    assert code == 2 and "--strategy fsdp" in err
    code, _, err = run_cli(LLAMA + ["--fp8-all-gather", "--gpus", "8", "--strategy", "fsdp"],
                           capsys)
    assert code == 2 and "--fp8 tensorwise" in err
    code, _, err = run_cli(LLAMA + ["--fp8", "delayed"], capsys)
    assert code == 2 and "--tp-impl te" in err and "--fp8 tensorwise" in err
    code, _, err = run_cli(LLAMA + ["--fp8", "rowwise", "--fp8-all-gather", "--gpus", "8",
                                    "--strategy", "fsdp"], capsys)
    assert code == 2 and "rowwise recipe gathers in BF16" in err
    code, _, err = run_cli(LLAMA + ["--fp8", "rowwise", "--tp-impl", "te"], capsys)
    assert code == 2 and "--fp8 rowwise" in err and "PyTorch's tensor parallelism" in err
    # the FP8-gathered parameters are saved as a list of names (not a Python set's repr)
    out = tmp_path / "gathered.json"
    code, _, err = run_cli(LLAMA + ["--fp8", "tensorwise", "--fp8-all-gather", "--gpus", "8",
                                    "--strategy", "fsdp", "--json", str(out)], capsys)
    assert code == 0, err
    gathered = json.loads(out.read_text())["scale_out"]["config"]["fp8_gathered"]
    assert isinstance(gathered, list) and gathered == sorted(gathered)
    assert gathered and all(name.endswith(".weight") for name in gathered)
    # compiled, float8 pays where the GEMMs are large (width 2,048 at 2,048 tokens) and not
    # where they are small (width 256 at 256 tokens: the casts cost more than the GEMMs save);
    # eager, its unfused casts cost more than the GEMMs save at both. The rowwise recipe's
    # six casts and two rescales a layer cost more than tensorwise's three casts and copies
    rates = {}
    for width, fusion, recipe in [(w, f, r) for w in (256, 2048)
                                  for f in ("none", "compile-blocks")
                                  for r in (None, "tensorwise")] + [
                                      (2048, "compile-blocks", "rowwise")]:
        out = tmp_path / f"r{width}{fusion}{recipe}.json"
        argv = (LLAMA + ["--device", "h100-sxm", "--json", str(out), "--fusion", fusion,
                         "--d-model", str(width), "--seq-len", str(width)]
                + (["--fp8", recipe] if recipe else []))
        code, text, err = run_cli(argv, capsys)
        assert code == 0, err
        rates[width, fusion, recipe] = json.loads(out.read_text())["totals"]["tokens_per_s"]
        if recipe:
            assert f"torchao float8 linear layers ({recipe} scaling)" in text
    assert rates[2048, "compile-blocks", "tensorwise"] > rates[2048, "compile-blocks", None]
    assert rates[256, "compile-blocks", "tensorwise"] < rates[256, "compile-blocks", None]
    assert rates[2048, "none", "tensorwise"] < rates[2048, "none", None]
    assert (rates[2048, "compile-blocks", None] < rates[2048, "compile-blocks", "rowwise"]
            < rates[2048, "compile-blocks", "tensorwise"])


def test_the_record_says_what_float8_was_checked_against():
    h100 = {"device": "h100-sxm", "flag": "hbm2e-500w", "image_size": 8192}
    result = {"rows": [{"id": "a-float8", "source": "s1", "gpus": 8, **h100,
                        "measured_per_gpu": 8000.0, "per_gpu_ratio": 1.06,
                        "fp8": "tensorwise"},
                       {"id": "b-float8", "source": "s2", "gpus": 128, **h100,
                        "measured_per_gpu": 7000.0, "per_gpu_ratio": 1.14,
                        "fp8": "tensorwise"},
                       # a stock GPU's run is told apart from the power-limited parts'
                       {"id": "c-float8", "source": "s3", "gpus": 32, "device": "h200",
                        "flag": "clean", "image_size": 8192, "measured_per_gpu": 10000.0,
                        "per_gpu_ratio": 0.92, "fp8": "tensorwise"},
                       {"id": "a-rowwise", "source": "s1", "gpus": 8, **h100,
                        "measured_per_gpu": 6600.0, "per_gpu_ratio": 1.3,
                        "fp8": "rowwise"},
                       {"id": "a-compile", "source": "s1", "gpus": 8, **h100,
                        "measured_per_gpu": 6000.0, "per_gpu_ratio": 1.1,
                        "fp8": None}],
              "float8_pairs": [{"float8": "a-float8", "bf16": "a-compile",
                                "recipe": "tensorwise", "measured_speedup": 1.28, "predicted_speedup": 1.23,
                                "ratio": 0.96},
                               {"float8": "a-rowwise", "bf16": "a-compile",
                                "recipe": "rowwise", "measured_speedup": 1.10, "predicted_speedup": 1.25,
                                "ratio": 1.14}]}
    entry = build_float8(result)
    assert [r["id"] for r in entry["rows"]] == ["a-float8", "b-float8", "c-float8",
                                                "a-rowwise"]
    assert [p["recipe"] for p in entry["pairs"]] == ["tensorwise", "rowwise"]
    text = describe_float8({"float8": entry})
    assert "--fp8 tensorwise" in text and "3 published" in text and "runs" in text
    assert ("1.06-1.14x the measured rate of the 2 on power-limited HBM2e H100s (s1, s2) and "
            "0.92x of the 1 on H200s (s3)" in text)
    assert "measured 1.28x, predicted 1.23x" in text
    text = describe_float8({"float8": entry}, recipe="rowwise")
    assert "--fp8 rowwise" in text and "1 published Llama 3 8B run:" in text
    assert "predicted 1.30x the measured rate" in text and "measured 1.10x, predicted 1.25x" in text
    assert "lent to dlperf" not in text
    # a lent GPU's own step-0d speed-ups (bench_compile_gpu.py --fp8) join each recipe's line
    device_run = {"environment": {"gpu": "NVIDIA H200"},
                  "results": {"preset": "h200", "measured_float8_speedup": 1.112,
                              "predicted_float8_speedup": 1.127,
                              "measured_rowwise_speedup": 0.893,
                              "predicted_rowwise_speedup": 1.064}}
    entry = build_float8(result, device_run)
    assert entry["device_pairs"] == [
        {"recipe": "tensorwise", "gpu": "NVIDIA H200", "preset": "h200",
         "measured_speedup": 1.112, "predicted_speedup": 1.127},
        {"recipe": "rowwise", "gpu": "NVIDIA H200", "preset": "h200",
         "measured_speedup": 0.893, "predicted_speedup": 1.064}]
    assert ("; on the NVIDIA H200 lent to dlperf (a 4-block Llama stack compiled per block), "
            "measured 1.11x, predicted 1.13x." in describe_float8({"float8": entry}))
    assert "measured 0.89x, predicted 1.06x (dlperf charges" in describe_float8(
        {"float8": entry}, recipe="rowwise")
    assert describe_float8({}) is None
    assert describe_float8({"float8": {"rows": entry["rows"][:3], "pairs": []}},
                           recipe="rowwise") is None


def _abs_inputs(cfg: GPTConfig, batch: int) -> Counter:
    """(forward?, shape) of every |x| a float8 cast takes (its amax's first op) in a
    training step of GPT(cfg) on ``batch`` x seq_len tokens."""
    model = GPT(cfg)
    inputs = _meta_inputs((batch, cfg.seq_len), torch.long, False)
    forward, params = _meta_forward(model, False, torch.bfloat16)
    cap = capture(model, inputs, train=True, autocast_dtype=None, forward=forward, params=params)
    return Counter((r.phase == "forward", tuple(r.inputs[0].shape)) for r in cap.records
                   if r.op == "abs" and r.module.startswith("blocks."))


def test_tensor_parallel_tensorwise_casts_on_the_token_shard_by_hand():
    # torchao's float8 styles under sequence parallelism over 2 ranks, 2 x 32 = 64 tokens of
    # width 64: each split region's input is cast on the rank's 32 tokens before its FP8
    # all-gather (attention's, MLP's: 2 a block); the row layers' inputs (wo [64, 32], w2
    # [64, 64]) on all 64 tokens (their features split, their tokens whole); the weights on
    # one rank: q [32, 64], k and v [16, 64], o [64, 32], w1 and w3 [64, 64], w2 [64, 64].
    # Backward: the row layers' output gradients [32, 64] on the token shard (before their
    # FP8 gather), the column layers' [64, 32] (q), [64, 16] (k, v), [64, 64] (w1, w3)
    cfg = _llama(tp=2)
    assert cfg.float8_gather
    c = _abs_inputs(cfg, batch=2)
    blocks = 2
    assert c[(True, (32, 64))] == (2 + 1) * blocks  # 2 region inputs on the shard; q's weight
    assert c[(True, (64, 32))] == 2 * blocks  # wo's input and weight
    assert c[(True, (64, 64))] == (1 + 3) * blocks  # w2's input; w1, w3, w2 weights
    assert c[(False, (32, 64))] == 2 * blocks  # the row layers' output gradients, on the shard
    assert c[(False, (64, 64))] == 2 * blocks and c[(False, (64, 16))] == 2 * blocks
    assert sum(c.values()) == (4 + 7 + 7) * blocks
    # without sequence parallelism every rank holds all 64 tokens: the region inputs and the
    # row layers' gradients are cast whole, as on one GPU
    assert not _llama(tp=2, sequence_parallel=False).float8_gather
    whole = _abs_inputs(_llama(tp=2, sequence_parallel=False), batch=2)
    assert whole[(True, (32, 64))] == 1 * blocks and whole[(False, (32, 64))] == 0
    assert whole[(True, (64, 64))] == (2 + 1 + 3) * blocks
    assert whole[(False, (64, 64))] == (2 + 2) * blocks
    # the rowwise recipe runs the plain styles: it casts the gathered tokens, with sequence
    # parallelism or without
    rowwise = GPTConfig(**{**_llama(tp=2).__dict__, "fp8": "rowwise"})
    assert not rowwise.float8_gather
    assert _abs_inputs(rowwise, batch=2) == _abs_inputs(
        GPTConfig(**{**rowwise.__dict__, "sequence_parallel": False}), batch=2)


def test_tensor_parallel_tensorwise_layers_train_and_keep_the_gathered_fp8():
    # the stand-ins carry shapes and gradients: every weight gets a gradient of its shape, and
    # what a split region's layers keep for the backward is the gathered FP8 input, 1 byte a
    # token feature of all 2 x 64 tokens (not the rank's 64, not 2 bytes)
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**_llama(tp=2).__dict__, "seq_len": 64}))
    idx = torch.randint(0, 48, (2, 64))
    model(idx).float().sum().backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())
    block = model.blocks[0]
    h = torch.randn(2, 32, 64)  # one rank's tokens
    cast = block._shard_cast(h)
    assert cast.data.dtype == torch.float8_e4m3fn and cast.data.shape == (2 * 32 * 2, 64)
    assert cast.shape == (2, 64, 64)


def test_tensor_parallel_collectives_of_torchao_float8_by_hand():
    from dlperf.analysis.scaling import float8_tp_reductions, tensor_parallel_collectives

    # 2 blocks, 1,000 tokens of width 64 in BF16: the whole tensor 128,000 bytes, in FP8
    # 64,000. PyTorch's TP with torchao's tensorwise styles: the blocks' all-gathers in FP8,
    # forward 2 a block and backward 2 (the row layers' output gradients): 8; the output
    # layer's and the embedding's backward in BF16: 2; the reduce-scatters all BF16, 2 (2 L + 1)
    got = tensor_parallel_collectives(2, 1000, 64, 2, recompute=False, float8="tensorwise")
    assert got == (("allgather", 2, 128_000, None), ("allgather", 8, 64_000, None),
                   ("reducescatter", 10, 128_000, None))
    # a full checkpoint replays the forward's 4 gathers (FP8) and 4 reduce-scatters
    got = tensor_parallel_collectives(2, 1000, 64, 2, recompute=True, float8="tensorwise")
    assert got[1] == ("allgather", 12, 64_000, None) and got[2][1] == 14
    # the rowwise recipe gathers in BF16: as without float8
    assert (tensor_parallel_collectives(2, 1000, 64, 2, recompute=False, float8="rowwise")
            == tensor_parallel_collectives(2, 1000, 64, 2, recompute=False))
    # async: tensorwise fuses its FP8 gathers as BF16 ones are fused; rowwise casts after its
    # gathers, so none is fused, only the forward's reduce-scatters
    bf16 = tensor_parallel_collectives(2, 1000, 64, 2, False, impl="torch-async")
    fp8 = tensor_parallel_collectives(2, 1000, 64, 2, False, impl="torch-async",
                                      float8="tensorwise")
    assert [c[3] for c in fp8] == [c[3] for c in bf16]
    assert [c[2] for c in fp8 if c[0] == "allgather" and c[3]] == [64_000, 64_000]
    rowwise = tensor_parallel_collectives(2, 1000, 64, 2, False, impl="torch-async",
                                          float8="rowwise")
    assert [c[3] for c in rowwise] == [None, None, None, "row-fprop-ring", None, None]
    with pytest.raises(ValueError, match="PyTorch's tensor parallelism"):
        tensor_parallel_collectives(2, 1000, 64, 2, False, impl="megatron", float8="tensorwise")
    # amaxes over split tensors, Llama (5 column, 2 row layers a block), 32 blocks:
    # tensorwise a forward 2 region inputs + 2 row inputs + 7 weights, a backward 7 gradients:
    # 32 x 18 = 576 FP32 values all-reduced; a full checkpoint 32 x 11 more
    assert float8_tp_reductions("tensorwise", 32, 5, 2, 1000, 64) == (
        ("allreduce", 576, 4, None),)
    assert float8_tp_reductions("tensorwise", 32, 5, 2, 1000, 64, recompute_layers=32)[0][1] \
        == 576 + 32 * 11
    # without sequence parallelism the region inputs are whole on every rank: 32 x 16
    assert float8_tp_reductions("tensorwise", 32, 5, 2, 1000, 64,
                                sequence_parallel=False)[0][1] == 32 * 16
    # rowwise: a forward's 2 row inputs per token (1,000 values) and 2 row weights per output
    # feature (64), a backward's 5 column gradients per token and 5 column weights per input
    # feature: 32 x 7 of each
    assert float8_tp_reductions("rowwise", 32, 5, 2, 1000, 64) == (
        ("allreduce", 224, 4000, None), ("allreduce", 224, 256, None))
    with pytest.raises(ValueError, match="tensorwise or rowwise"):
        float8_tp_reductions("mxfp8", 32, 5, 2, 1000, 64)


def test_cli_float8_with_tensor_parallelism(capsys, tmp_path):
    # the small GPT (2 blocks of 2 column layers, qkv and fc, and 2 row layers) on 2 ranks
    # with sequence parallelism: collectives a micro-batch 10 all-gathers + 10 reduce-scatters
    # (as BF16) and 2 x (2 + 2 + 4 + 4) = 24 amax all-reduces (a forward's 2 region inputs, 2
    # row inputs, 4 weights; a backward's 4 gradients); async TP needs compile, as without
    # float8
    argv = LLAMA + ["--device", "h100-sxm", "--gpus", "2", "--tp", "2", "--fp8", "tensorwise",
                    "--fusion", "compile-blocks"]
    out = {}
    for impl in ("torch", "torch-async"):
        path = tmp_path / f"{impl}.json"
        code, _, err = run_cli(argv + ["--tp-impl", impl, "--json", str(path)], capsys)
        assert code == 0, err
        out[impl] = json.loads(path.read_text())["scale_out"]["at_requested_scale"][
            "communication"]["tensor_parallel"]
    assert out["torch"]["collectives_per_micro_batch"] == 10 + 10 + 24
    assert out["torch"]["sequence_parallel"]
    assert out["torch-async"]["exposed_s"] < out["torch"]["exposed_s"]
    code, _, err = run_cli(LLAMA + ["--gpus", "2", "--tp", "2", "--fp8", "rowwise",
                                    "--tp-impl", "torch-async"], capsys)
    assert code == 2 and "--fusion compile-blocks" in err
