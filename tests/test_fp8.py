"""models/fp8.py (`analyze --fp8`): TransformerEngine's FP8 linear layers. Their numbers against
a float64 product of the quantized operands, the kernels a layer runs under each recipe and
each tensor-parallel form against a count by hand, what they keep, the weights' casts spread
over a step's micro-batches, the tensor-parallel all-gathers in FP8, and the CLI."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import run_cli

from dlperf.analysis.api import AnalysisConfig, capture_costs, memory_footprint, predict_on
from dlperf.analysis.api import _meta_forward, _meta_inputs
from dlperf.analysis.capture import capture
from dlperf.analysis.costs import spread_costs
from dlperf.analysis.scaling import tensor_parallel_collectives
from dlperf.hardware.specs import get_device
from dlperf.hardware.track_record import build_fp8, describe_fp8, load_scale_out
from dlperf.models import fp8
from dlperf.models.gpt import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[1]


def _dequantized(x: torch.Tensor, fmt) -> torch.Tensor:
    """x cast as a per-tensor scaled FP8 cast does it, back in float64: the operand the FP8
    GEMM multiplies (a float64 reference independent of _scaled_mm)."""
    top = 448.0 if fmt is torch.float8_e4m3fn else 57344.0
    scale = top / x.abs().amax().double()
    q = (x.double() * scale).clamp(-top, top).to(torch.float32).to(fmt)
    return q.double() / scale


@pytest.mark.parametrize("tn_only", (True, False))
@pytest.mark.parametrize("recipe", fp8.RECIPES)
def test_the_layer_is_the_product_of_its_quantized_operands(recipe, tn_only):
    # forward: E4M3 input and weight; backward: the E5M2 gradient against each of them, FP32
    # accumulation (_scaled_mm's) against float64: agreement to FP32 rounding. Hopper's TN
    # GEMMs on the transposed copies and Blackwell's any-layout ones on the row-wise data
    # compute the same
    torch.manual_seed(0)
    layer = fp8.Fp8Linear(32, 48, False, recipe, tn_only=tn_only)
    x = torch.randn(2, 5, 32, requires_grad=True)
    y = layer(x)
    xd, wd = _dequantized(x.detach(), torch.float8_e4m3fn), _dequantized(
        layer.weight.detach(), torch.float8_e4m3fn)
    assert y.shape == (2, 5, 48)
    assert torch.allclose(y.double(), xd @ wd.t(), rtol=1e-5, atol=1e-5)
    g = torch.randn(2, 5, 48)
    y.backward(g)
    gd = _dequantized(g, torch.float8_e5m2)
    assert torch.allclose(x.grad.double(), gd @ wd, rtol=1e-5, atol=1e-5)
    assert torch.allclose(layer.weight.grad.double(),
                          gd.reshape(-1, 48).t() @ xd.reshape(-1, 32), rtol=1e-5, atol=1e-4)
    # and FP8's own error against the exact product: E4M3 keeps 3 mantissa bits, an
    # element's error under 2^-4; summed over 32 products it stays a few percent
    exact = x.detach().double() @ layer.weight.detach().double().t()
    assert (y.double() - exact).norm() / exact.norm() < 0.1


def test_the_sequence_parallel_forms_gather_and_scatter_the_tokens():
    # column: this rank's 5 tokens of each sequence gathered from 2 ranks before the GEMM, the
    # input gradient reduce-scattered back to 5; row: 10 tokens in, 5 out, the gradient's 5
    # gathered back to 10 (the collectives are allocations: shapes only)
    col = fp8.Fp8Linear(32, 48, False, "current", gather=2)
    x = torch.randn(3, 5, 32, requires_grad=True)
    y = col(x)
    assert y.shape == (3, 10, 48)
    y.sum().backward()
    assert x.grad.shape == x.shape and col.weight.grad.shape == (48, 32)
    row = fp8.Fp8Linear(32, 48, False, "delayed", scatter=2)
    x = torch.randn(3, 10, 32, requires_grad=True)
    y = row(x)
    assert y.shape == (3, 5, 48)
    y.sum().backward()
    assert x.grad.shape == x.shape


def test_layer_sizes_and_stack_are_checked():
    with pytest.raises(ValueError, match="multiples of 16"):
        fp8.Fp8Linear(24, 48, False, "current")
    with pytest.raises(ValueError, match="recipe"):
        fp8.Fp8Linear(32, 48, False, "nvfp4")
    with pytest.raises(ValueError, match="tp_impl must be 'te'"):
        GPTConfig(layers=1, d_model=64, heads=4, fp8="current")


def _llama(tp=1, fp8_recipe=None, **kw):
    return GPTConfig(layers=2, d_model=64, heads=4, kv_heads=2, vocab=96, seq_len=32,
                     tie_embeddings=False, norm="rmsnorm", mlp="swiglu", ffn_hidden=128,
                     positions="rope", tp=tp, tp_impl="te", fp8=fp8_recipe, **kw)


def _capture(cfg, batch=3, seq=32):
    model = GPT(cfg)
    inputs = _meta_inputs((batch, seq), torch.long, False)
    forward, params = _meta_forward(model, False, torch.bfloat16)
    return capture(model, inputs, train=True, autocast_dtype=None, forward=forward,
                   params=params)


def _counts(cap):
    return Counter((r.op, r.phase) for r in cap.records
                   if r.op.startswith("fp8") or r.op in ("_scaled_mm", "mm"))


@pytest.mark.parametrize("tp", (1, 2))
@pytest.mark.parametrize("recipe", fp8.RECIPES)
def test_the_kernels_of_each_block_by_hand(tp, recipe):
    # A Llama block's 7 linear layers in 4 groups by input (q, k, v share theirs, as
    # Megatron-Core's linear_qkv; fc and gate theirs, linear_fc1; wo; out), 2 blocks:
    # forward: 4 input casts and 7 weight casts a block, 7 FP8 GEMMs; backward: 7 gradient
    # casts, 7 data- and 7 weight-gradient FP8 GEMMs. The current recipe adds an amax pass
    # before each cast. Under sequence parallelism (tp 2) the two column groups transpose
    # their re-gathered input and the two row layers their gathered gradient: 4 transposes
    # a block. The output layer stays a BF16 mm (forward, dgrad, wgrad).
    c = _counts(_capture(_llama(tp, recipe)))
    blocks = 2
    expected = {("fp8_quantize", "forward"): 4 * blocks,
                ("fp8_weight_quantize", "forward"): 7 * blocks,
                ("_scaled_mm", "forward"): 7 * blocks,
                ("fp8_quantize", "dgrad"): 7 * blocks,
                ("_scaled_mm", "dgrad"): 7 * blocks, ("_scaled_mm", "wgrad"): 7 * blocks,
                ("mm", "forward"): 1, ("mm", "dgrad"): 1, ("mm", "wgrad"): 1}
    if recipe == "current":
        expected.update({("fp8_amax", "forward"): 4 * blocks,
                         ("fp8_weight_amax", "forward"): 7 * blocks,
                         ("fp8_amax", "dgrad"): 7 * blocks})
    if tp > 1:
        expected[("fp8_transpose", "dgrad")] = 4 * blocks
    assert dict(c) == expected


@pytest.mark.parametrize("tp", (1, 2))
def test_blackwell_makes_no_transposes(tp):
    # FP8 GEMMs of any layout (Blackwell): the same casts, each writing the row-wise data
    # only, no transpose kernels even under sequence parallelism, the gradient GEMMs read
    # the row-wise data (fp8_gemm), one FP8 copy of each weight
    cfg = _llama(tp, "current", fp8_tn_only=False)
    c = _counts(_capture(cfg))
    assert ("fp8_transpose", "dgrad") not in c
    assert c[("fp8_gemm", "dgrad")] == c[("fp8_gemm", "wgrad")] == 14
    assert c[("_scaled_mm", "forward")] == 14 and ("_scaled_mm", "dgrad") not in c
    assert c[("fp8_quantize", "forward")] == 8 and c[("fp8_quantize", "dgrad")] == 14
    per_block = 2 * 64 * 64 + 2 * 32 * 64 + 3 * 128 * 64
    assert fp8.fp8_weight_bytes(GPT(cfg)) == 2 * per_block // tp
    # and the costs: each gradient GEMM's shape is the TN one's, on the FP8 units
    spec = get_device("b200")
    acfg = AnalysisConfig(model="llama", input_shape=(3, 32), dtype="bf16", precision="fsdp",
                          optimizer="adamw", tokens=True)
    costs, unc, s, mem = capture_costs(GPT(cfg), acfg, torch.long)
    assert not unc
    hopper, _, _, _ = capture_costs(GPT(_llama(tp, "current")), acfg, torch.long)
    def shapes(cs, ops):
        return Counter((c.phase, c.gemm.m, c.gemm.n, c.gemm.k) for c in cs if c.op in ops)

    assert shapes(costs, ("_scaled_mm", "fp8_gemm")) == shapes(hopper, ("_scaled_mm",))
    analysis = predict_on(costs, unc, acfg, spec, s, memory=mem)
    assert {p.unit for p in analysis.predictions if p.cost.op == "fp8_gemm"} == {"fp8"}


def test_gradient_gemms_are_told_apart_when_tokens_equal_the_width():
    # 2 x 32 tokens = d_model 64: wo's input gradient [64, 64] has wo's weight's shape; it
    # reads the FP8 weight copy, which the capture counts as the weight (WEIGHT_COPY_OPS):
    # still 7 data-gradient and 7 weight-gradient GEMMs a block
    c = _counts(_capture(_llama(1, "delayed"), batch=2))
    assert c[("_scaled_mm", "dgrad")] == c[("_scaled_mm", "wgrad")] == 14


def test_what_a_block_keeps_by_hand():
    # M = 3 x 32 = 96 tokens, d 64, hidden 128, at TP 1. A BF16 block's linear layers keep
    # their inputs (the norms' outputs, read by the qkv and fc1 groups: 2 B x M x d each; wo's
    # is the attention output the attention kernel keeps anyway; out's the SwiGLU product,
    # 2 B x M x hidden); the FP8 block keeps each group's column-wise FP8 copy, 1 B an
    # element, and its FP32 scale (4 B), wo's included: qkv 6,148, wo 6,148, fc1 6,148,
    # out 12,292 against qkv 12,288, fc1 12,288, out 24,576.
    m, d, h = 96, 64, 128
    bf16 = _capture(_llama(1, None)).saved_by_module
    f8 = _capture(_llama(1, "current")).saved_by_module
    assert bf16["blocks.0.attn.wq"] == 2 * m * d and bf16["blocks.0.fc"] == 2 * m * d
    assert bf16["blocks.0.out"] == 2 * m * h
    assert "blocks.0.attn.wo" not in bf16
    assert f8["blocks.0.attn.wq"] == m * d + 4 and f8["blocks.0.attn.wo"] == m * d + 4
    assert f8["blocks.0.fc"] == m * d + 4 and f8["blocks.0.out"] == m * h + 4
    # the rest of the block keeps the same
    for module in ("blocks.0.ln1", "blocks.0.ln2", "blocks.0.attn", "blocks.0.act"):
        assert f8[module] == bf16[module]


def test_the_weights_are_cast_once_a_step_and_their_copies_held():
    cfg = _llama(1, "delayed")
    model = GPT(cfg)
    one = AnalysisConfig(model="llama", input_shape=(2, 32), dtype="bf16", precision="fsdp",
                         optimizer="adamw", tokens=True)
    costs, _, _, memory = capture_costs(model, one, torch.long)
    spread, _, _, _ = capture_costs(model, AnalysisConfig(**{**one.__dict__,
                                                             "fp8_weight_reuse": 4}),
                                    torch.long)
    for a, b in zip(costs, spread):
        if a.op in fp8.WEIGHT_OPS:
            assert b.bytes == a.bytes // 4 and b.flops == a.flops // 4 and b.kernels == 1
        else:
            assert b == a
    # 7 weights a block of 64 x 64 (q, wo), 32 x 64 (k, v: 2 of 4 heads' width), 128 x 64
    # (fc, gate) and 64 x 128 (out), 2 blocks, 2 FP8 bytes an element
    per_block = 2 * 64 * 64 + 2 * 32 * 64 + 3 * 128 * 64
    assert fp8.fp8_weight_bytes(model) == 2 * 2 * per_block
    plain = memory_footprint(GPT(_llama(1, None)), one, 0)
    assert memory["weights_bytes"] - plain["weights_bytes"] == 4 * per_block
    with pytest.raises(ValueError):
        spread_costs(costs, fp8.WEIGHT_OPS, 0)


def test_fp8_gemms_run_on_the_fp8_units_and_speed_up_a_block():
    spec = get_device("h100-sxm")
    cfg = AnalysisConfig(model="llama", input_shape=(2, 32), dtype="bf16", precision="fsdp",
                         optimizer="adamw", tokens=True)
    costs, unc, s, mem = capture_costs(GPT(_llama(1, "current")), cfg, torch.long)
    assert not unc  # every FP8 kernel has a cost rule
    analysis = predict_on(costs, unc, cfg, spec, s, memory=mem)
    units = {p.unit for p in analysis.predictions if p.cost.op == "_scaled_mm"}
    assert units == {"fp8"}
    classes = {p.cost.op: p.memory_class for p in analysis.predictions
               if p.cost.op.startswith("fp8")}
    assert classes["fp8_amax"] == "reduction" and classes["fp8_quantize"] == "stream"


def test_tensor_parallel_all_gathers_in_fp8_by_hand():
    # 10 blocks, 4,096 tokens of width 1,024 in BF16: 8 MiB a collective, 4 MiB gathered in
    # FP8. The blocks' 20 forward gathers, 20 row-gradient gathers and 20 re-gathers are FP8;
    # the output layer's re-gather, the two gathers between dependent kernels and every
    # reduce-scatter stay BF16
    bf16, f8 = 4096 * 1024 * 2, 4096 * 1024
    got = tensor_parallel_collectives(10, 4096, 1024, 2, False, impl="te", fp8=True)
    assert got == (("allgather", 2, bf16, None), ("reducescatter", 1, bf16, None),
                   ("allgather", 20, f8, "fprop"), ("reducescatter", 20, bf16, "row-fprop"),
                   ("allgather", 20, f8, "row-dgrad"), ("allgather", 20, f8, "dgrad"),
                   ("allgather", 1, bf16, "dgrad"), ("reducescatter", 21, bf16, "wgrad"))
    moved = sum(n * b for _, n, b, _ in got)
    plain = sum(n * b for _, n, b, _ in tensor_parallel_collectives(10, 4096, 1024, 2, False,
                                                                    impl="te"))
    assert plain - moved == 60 * (bf16 - f8)
    with pytest.raises(ValueError, match="impl must be 'te'"):
        tensor_parallel_collectives(10, 4096, 1024, 2, False, impl="megatron", fp8=True)


LLAMA = ["analyze", "gpt", "--layers", "2", "--d-model", "256", "--heads", "4",
         "--seq-len", "256", "--train", "--dtype", "bf16", "--precision", "fsdp",
         "--batch-size", "2", "--top", "1"]


def test_cli_fp8(capsys, tmp_path):
    code, _, err = run_cli(LLAMA + ["--fp8", "current"], capsys)
    assert code == 2 and "--tp-impl te" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(LLAMA + ["--fp8", "current", "--tp-impl", "te", "--device",
                                    "a100-80gb"], capsys)
    assert code == 2 and "a100-80gb has no FP8" in err
    code, _, err = run_cli(LLAMA + ["--fp8", "current", "--tp-impl", "te", "--device",
                                    "h100-sxm,b200"], capsys)
    assert code == 2 and "compare Blackwell GPUs with Blackwell GPUs" in err
    code, _, err = run_cli(["analyze", "resnet18", "--train", "--fp8", "current",
                            "--tp-impl", "te", "--precision", "fsdp"], capsys)
    assert code == 2 and "--fp8" in err and "only for gpt" in err
    # FP8 pays where the GEMMs are large: at width 2,048 and 4,096 tokens the step is faster;
    # at width 256 and 512 tokens the casts (memory-bound) cost more than the GEMMs save
    rates = {}
    for width, seq in ((256, 256), (2048, 2048)):
        for flags in ([], ["--fp8", "delayed"]):
            out = tmp_path / f"r{width}{len(flags)}.json"
            argv = (LLAMA + ["--tp-impl", "te", "--device", "h100-sxm", "--json", str(out),
                             "--d-model", str(width), "--seq-len", str(seq)] + flags)
            code, text, err = run_cli(argv, capsys)
            assert code == 0, err
            rates[width, bool(flags)] = json.loads(out.read_text())["totals"]["tokens_per_s"]
            if flags:
                assert "FP8 linear layers (delayed scaling)" in text
                # and what the published FP8 runs say of it (the scale-out record)
                assert "FP8 (--fp8) is checked against two published sources" in " ".join(
                    text.split())
    assert rates[256, True] < rates[256, False]
    assert rates[2048, True] > rates[2048, False]


def test_cli_fp8_recast_weights_casts_them_in_every_micro_batch(capsys, tmp_path):
    # Megatron-Core tells TransformerEngine the step's first micro-batch, so with --grad-accum
    # 4 a micro-batch carries a quarter of the weight casts; Composer (llm-foundry's fc_type
    # te) does not, and every micro-batch casts them again. The gpt preset's 2 blocks hold
    # 4 x 256^2 + 2 x 256 x 1,024 = 786,432 weights each, 1,572,864 in all; a cast reads 2
    # bytes and writes 1 plus 1 for the transpose: 6,291,456 bytes, of which a micro-batch
    # moves a quarter with reuse, all of it with --fp8-recast-weights: 3/4 x 6,291,456 =
    # 4,718,592 bytes more (and 3/4 of the casts' few bytes of scales)
    moved = {}
    for flags in ([], ["--fp8-recast-weights"]):
        out = tmp_path / f"r{len(flags)}.json"
        code, _, err = run_cli(LLAMA + ["--tp-impl", "te", "--device", "h100-sxm", "--fp8",
                                        "delayed", "--grad-accum", "4", "--gpus", "8",
                                        "--strategy", "fsdp", "--json", str(out)] + flags,
                               capsys)
        assert code == 0, err
        moved[bool(flags)] = json.loads(out.read_text())["totals"]["bytes"]
    assert moved[True] - moved[False] == pytest.approx(3 / 4 * 6291456, abs=64)
    code, _, err = run_cli(LLAMA + ["--fp8", "tensorwise", "--fp8-recast-weights"], capsys)
    assert code == 2 and "needs --fp8 delayed, current or mxfp8" in err


def test_the_record_says_what_fp8_was_checked_against():
    def row(model, gpus, ratio, gain):
        return {"row": model, "model": model, "gpus": gpus,
                "measured_tokens_per_s_per_gpu": 1000.0, "measured": [{"container": "25.11"}],
                "fp8_mcore": {"ratio": ratio}, "fp8_cudnn": {"ratio": ratio + 0.1},
                "predicted_fp8_gain": gain}

    blackwell = {**row("big", 128, 0.9, 1.7), "device": "b200"}
    del blackwell["fp8_cudnn"]
    entry = build_fp8({"rows": [row("big", 1024, 1.02, 1.64), row("big", 1024, 0.93, 1.60),
                                row("small", 64, 0.85, 1.46), blackwell],
                       "cudnn_attention": 0.5})
    text = describe_fp8({"fp8": entry})
    assert ("big on 1,024 H100s 1.02x and 0.93x; small on 64 H100s 0.85x; big on 128 B200s "
            "0.90x the measured rate") in text
    assert "the H100 rows 0.95-1.12x with the attention kernel at cuDNN's own speed " \
           "(--efficiency attention=0.5)" in text
    assert "1.46-1.70x" in text
    assert "checked against one published source." in text and "te.Linear" not in text
    # with validate_scaling's TransformerEngine rows (MosaicML's te.Linear runs) and a pair
    scaling = {"rows": [{"id": "m-fp8", "model": "mpt-1b", "fp8": "delayed", "source": "s",
                         "device": "h100-sxm", "gpus": 8, "measured_per_gpu": 10.0,
                         "per_gpu_ratio": 0.92},
                        {"id": "t-float8", "model": "llama3-8b", "fp8": "tensorwise",
                         "source": "s", "device": "h100-sxm", "gpus": 8,
                         "measured_per_gpu": 10.0, "per_gpu_ratio": 1.1},
                        {"id": "m", "model": "mpt-1b", "fp8": None, "source": "s",
                         "device": "h100-sxm", "gpus": 8, "measured_per_gpu": 8.0,
                         "per_gpu_ratio": 0.95}],
               "float8_pairs": [{"float8": "m-fp8", "bf16": "m", "recipe": "delayed",
                                 "measured_speedup": 1.25, "predicted_speedup": 1.3,
                                 "ratio": 1.04},
                                {"float8": "t-float8", "bf16": "t-compile",
                                 "recipe": "tensorwise", "measured_speedup": 1.2,
                                 "predicted_speedup": 1.2, "ratio": 1.0}]}
    text = describe_fp8({"fp8": build_fp8({"rows": [row("big", 1024, 1.02, 1.64)],
                                           "cudnn_attention": 0.5}, scaling)})
    assert "checked against two published sources." in text
    assert (" s: mpt-1b on 8 H100s (1 run), dlperf predicted 0.92x the measured rate, and "
            "FP8's speed-up over the same BF16 run (the same micro-batches; 1 pair) measured "
            "1.25x, predicted 1.30x (1.04x the measured gain).") in text
    assert "t-float8" not in text and "1.10x" not in text  # torchao's: describe_float8
    assert describe_fp8({}) is None
    # the shipped record holds the saved validation's rows
    assert [r["ratio"] for r in load_scale_out()["fp8"]["rows"]] == [
        r["fp8_mcore"]["ratio"] for r in json.loads(
            (ROOT / "benchmarks/results/tp-megatron-bridge-fp8.json").read_text())[
                "results"]["rows"]]
