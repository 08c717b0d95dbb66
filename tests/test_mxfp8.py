"""models/fp8.py under MXFP8 (`analyze --fp8 mxfp8`): TransformerEngine's block scaling on
Blackwell. The block scales by hand, a layer's and a grouped layer's numbers against float64
products of operands quantized here independently, the kernels a Llama block runs and what
it keeps counted by hand, the weights' copies, the experts' padding, the GEMMs' rate, and
the CLI's refusals."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from test_fp8 import _capture, _counts, _llama

from dlperf.analysis.api import AnalysisConfig, capture_costs, predict_on
from dlperf.analysis.roofline import MX_GEMM_SHARE
from dlperf.analysis.scaling import tensor_parallel_collectives
from dlperf.hardware.specs import get_device
from dlperf.models import fp8
from dlperf.models.gpt import GPT, GPTConfig


def _blocked(x: torch.Tensor, dim: int) -> torch.Tensor:
    """x as MXFP8 holds it, in float64, blocks of 32 along ``dim``: each block divided by
    2^ceil(log2(amax / 448)), rounded to E4M3, multiplied back (an independent reference)."""
    x = x.double().movedim(dim, -1)
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, torch.exp2(torch.ceil(torch.log2(amax / 448))),
                        torch.ones_like(amax))
    q = (blocks / scale).to(torch.float32).to(torch.float8_e4m3fn).double() * scale
    return q.reshape(x.shape).movedim(-1, dim)


def test_the_block_scales_by_hand():
    # block 0: amax 448 x 8 = 3,584, so the scale is 2^3 (E8M0 130) and 3,584 is 448 in
    # E4M3; block 1: all zeros, scale 2^-127 (E8M0 0), data zeros; block 2: amax 1.0, scale
    # 2^ceil(log2(1/448)) = 2^-8 (E8M0 119), 1.0 stored as 256
    x = torch.zeros(1, 96)
    x[0, 0], x[0, 1] = 3584.0, -8.0
    x[0, 64], x[0, 65] = 1.0, 0.5
    row, row_scale, col, col_scale = fp8._mx_quantize_impl(x, True, False)
    assert row_scale.tolist() == [[130, 0, 119]] and row_scale.dtype == torch.uint8
    assert row[0, 0].float() == 448.0 and row[0, 1].float() == -1.0
    assert row[0, 32:64].float().abs().sum() == 0
    assert row[0, 64].float() == 256.0 and row[0, 65].float() == 128.0
    assert col.numel() == col_scale.numel() == 0
    back = fp8._mx_dequantized(row, row_scale)
    assert torch.equal(back, x)  # these values are exact in E4M3 at their block's scale


def test_the_layer_is_the_product_of_its_block_quantized_operands():
    # forward X W^T on X and W blocked along K; the data gradient G W on G blocked along N
    # (its rows) and W blocked along N (down its columns); the weight gradient G^T X on both
    # blocked along the M tokens: each against float64 products of operands quantized by
    # ``_blocked``, to FP32 accumulation
    torch.manual_seed(0)
    layer = fp8.Fp8Linear(64, 96, False, "mxfp8", tn_only=False)
    x = torch.randn(2, 16, 64, requires_grad=True)
    y = layer(x)
    w = layer.weight.detach()
    x2 = x.detach().reshape(-1, 64)
    assert y.shape == (2, 16, 96)
    assert torch.allclose(y.reshape(-1, 96).double(), _blocked(x2, 1) @ _blocked(w, 1).t(),
                          rtol=1e-5, atol=1e-5)
    g = torch.randn(2, 16, 96)
    y.backward(g)
    g2 = g.reshape(-1, 96)
    assert torch.allclose(x.grad.reshape(-1, 64).double(), _blocked(g2, 1) @ _blocked(w, 0),
                          rtol=1e-5, atol=1e-5)
    assert torch.allclose(layer.weight.grad.double(), _blocked(g2, 0).t() @ _blocked(x2, 0),
                          rtol=1e-5, atol=1e-4)
    # block scaling's own error against the exact product stays a few percent
    exact = x2.double() @ w.double().t()
    assert (y.reshape(-1, 96).double() - exact).norm() / exact.norm() < 0.06


def test_the_grouped_layer_scales_each_expert_by_blocks():
    # h [G, R, K] @ w [G, K, N]: each expert's forward and weight gradient against float64;
    # one expert's rows 1,000x larger leave the others' precision alone (block scales)
    torch.manual_seed(1)
    h = torch.randn(3, 32, 64)
    h[1] *= 1000
    h.requires_grad_(True)
    w = torch.randn(3, 64, 96, requires_grad=True)
    y = fp8.grouped_fp8(h, w, None, "mxfp8", False)
    g = torch.randn_like(y)
    y.backward(g)
    for e in range(3):
        hd, wd = h.detach()[e], w.detach()[e]
        assert torch.allclose(y[e].double(), _blocked(hd, 1) @ _blocked(wd, 0),
                              rtol=1e-5, atol=1e-3 * hd.abs().max().item())
        assert torch.allclose(w.grad[e].double(), _blocked(hd, 0).t() @ _blocked(g[e], 0),
                              rtol=1e-5, atol=1e-3 * hd.abs().max().item())
        assert torch.allclose(h.grad[e].double(), _blocked(g[e], 1) @ _blocked(wd, 1).t(),
                              rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="multiples of 32"):
        fp8.grouped_fp8(torch.randn(3, 16, 64), w, None, "mxfp8", False)
    with pytest.raises(ValueError, match="Blackwell"):
        fp8.grouped_fp8(h, w, None, "mxfp8", True)


def test_the_kernels_and_what_a_block_keeps_by_hand():
    # A Llama block's 7 linear layers in 4 groups by input, 2 blocks: forward 4 input casts
    # and 7 weight casts a block, each one kernel writing both copies (no amax pass, no
    # transpose), 7 block-scaled GEMMs; backward 7 gradient casts, 7 data- and 7 weight-
    # gradient GEMMs. The output layer stays a BF16 mm.
    cfg = _llama(1, "mxfp8", fp8_tn_only=False)
    c = _counts(_capture(cfg))
    blocks = 2
    assert dict(c) == {("fp8_mx_quantize", "forward"): 4 * blocks,
                       ("fp8_mx_weight_quantize", "forward"): 7 * blocks,
                       ("fp8_mx_gemm", "forward"): 7 * blocks,
                       ("fp8_mx_quantize", "dgrad"): 7 * blocks,
                       ("fp8_mx_gemm", "dgrad"): 7 * blocks,
                       ("fp8_mx_gemm", "wgrad"): 7 * blocks,
                       ("mm", "forward"): 1, ("mm", "dgrad"): 1, ("mm", "wgrad"): 1}
    # kept: each group's column-wise copy, 1 byte an element and a scale byte for each 32
    # (M = 3 x 32 = 96 tokens: qkv, wo and fc1 96 x 64 + 96 x 2 = 6,336; out 96 x 128 +
    # 96 x 4 = 12,672), where current scaling keeps the copy and a 4-byte scale
    kept = _capture(cfg).saved_by_module
    m, d, h = 96, 64, 128
    for module in ("blocks.0.attn.wq", "blocks.0.attn.wo", "blocks.0.fc"):
        assert kept[module] == m * d + m * d // 32
    assert kept["blocks.0.out"] == m * h + m * h // 32
    # the weights' copies: two a weight (row- and column-wise) and their scales
    per_block = 2 * 64 * 64 + 2 * 32 * 64 + 3 * 128 * 64
    assert fp8.fp8_weight_bytes(GPT(cfg)) == 2 * per_block * 2 * 33 // 32


def test_the_gemms_run_at_the_fp8_rate_less_the_block_scales_share():
    # the same shapes as current scaling's any-layout GEMMs, on the FP8 units, each taking
    # 7.161 / 6.812 of the time (TE's B300 table); the casts: MXFP8 reads each input once
    # (no amax pass) where current scaling reads it twice
    acfg = AnalysisConfig(model="llama", input_shape=(3, 32), dtype="bf16", precision="fsdp",
                          optimizer="adamw", tokens=True)
    spec = get_device("b200")
    runs = {}
    for recipe in ("current", "mxfp8"):
        costs, unc, s, mem = capture_costs(GPT(_llama(1, recipe, fp8_tn_only=False)), acfg,
                                           torch.long)
        assert not unc
        runs[recipe] = predict_on(costs, unc, acfg, spec, s, memory=mem).predictions

    def gemms(preds, op):
        return sorted((p.cost.phase, p.cost.gemm.m, p.cost.gemm.n, p.cost.gemm.k,
                       p.math_time_s) for p in preds if p.cost.op == op)

    cur, mx = gemms(runs["current"], "fp8_gemm"), gemms(runs["mxfp8"], "fp8_mx_gemm")
    # (the forward ones are _scaled_mm under current scaling)
    cur += gemms(runs["current"], "_scaled_mm")
    assert sorted(c[:4] for c in cur) == sorted(x[:4] for x in mx)
    assert {p.unit for p in runs["mxfp8"] if p.cost.op == "fp8_mx_gemm"} == {"fp8"}
    by_shape = {c[:4]: c[4] for c in cur}
    for x in mx:
        assert x[4] == pytest.approx(by_shape[x[:4]] / MX_GEMM_SHARE)
    assert MX_GEMM_SHARE == pytest.approx(0.951, abs=1e-3)

    def cast_reads(preds, ops):
        return sum(p.cost.bytes for p in preds if p.cost.op in ops and p.cost.phase != "wgrad")
    # current: amax (reads x) + cast (reads x, writes 1 B); MXFP8: one kernel reading x
    # and writing 2 B + 2/32 B: fewer bytes over all the input and gradient casts
    assert cast_reads(runs["mxfp8"], ("fp8_mx_quantize",)) < cast_reads(
        runs["current"], ("fp8_amax", "fp8_quantize"))


def test_the_experts_pad_to_32_rows():
    # 2 x 32 tokens x top-2 over 4 experts = 32 rows each: a multiple of 32 already; 3
    # sequences: 48 rows, padded to 64 under MXFP8 (to 48 under current scaling, 16's)
    base = dict(layers=1, d_model=64, heads=4, kv_heads=2, vocab=96, seq_len=32,
                tie_embeddings=False, norm="rmsnorm", mlp="swiglu", ffn_hidden=128,
                positions="rope", tp_impl="te", experts=4, top_k=2, expert_hidden=64)
    mx = GPTConfig(**base, fp8="mxfp8", fp8_tn_only=False)
    cur = GPTConfig(**base, fp8="current")
    assert mx.expert_rows(64) == 4 * 32 and mx.expert_rows(96) == 4 * 64
    assert cur.expert_rows(96) == 4 * 48
    with pytest.raises(ValueError, match="multiples of 32"):
        GPTConfig(**{**base, "expert_hidden": 48}, fp8="mxfp8")
    model = GPT(mx)
    assert model(torch.randint(0, 96, (3, 32))).shape == (3, 32, 96)
    # the FP8 copies: q, k, v, o (64 x 64, 32 x 64, 32 x 64, 64 x 64) and 4 experts' w1, w3
    # and w2 (64 x 64 each): 12,288 + 49,152 elements, 2 x 33/32 bytes each
    assert fp8.fp8_weight_bytes(model) == (12288 + 49152) * 2 * 33 // 32


def test_cli_mxfp8(tmp_path, capsys):
    from dlperf.cli import main

    args = ["analyze", "llama3-8b", "--layers", "2", "--train", "--dtype", "bf16",
            "--precision", "fsdp", "--tp-impl", "te", "--fp8", "mxfp8", "--batch-size", "1"]
    path = tmp_path / "mx.json"
    assert main([*args, "--device", "b200", "--json", str(path), "--top", "1"]) == 0
    result = json.loads(path.read_text())
    assert result["config"]["fp8"] == "mxfp8"
    ops = Counter(layer["op"] for layer in result["layers"])
    assert ops["fp8_mx_gemm"] == 3 * 7 * 2 and "fp8_amax" not in ops
    capsys.readouterr()
    assert main([*args, "--device", "h100-sxm"]) == 2
    err = capsys.readouterr().err
    assert "--fp8 mxfp8" in err and "h100-sxm" in err and len(err.strip().splitlines()) == 1
    # under tensor parallelism: the same GEMMs, the all-gathers at 33/32 bytes an element
    path = tmp_path / "mx-tp.json"
    assert main([*args, "--device", "b200", "--tp", "2", "--gpus", "2", "--json", str(path),
                 "--top", "1"]) == 0
    result = json.loads(path.read_text())
    ops = Counter(layer["op"] for layer in result["layers"])
    assert ops["fp8_mx_gemm"] == 3 * 7 * 2 and "fp8_transpose" not in ops


def test_the_sequence_parallel_forms_gather_and_scatter_the_tokens():
    # column: this rank's 32 tokens of each sequence cast both ways, the row-wise copy gathered
    # from 2 ranks (64 rows) for the GEMM; the shard's column-wise copy kept and gathered again
    # for the weight gradient; the input gradient reduce-scattered back to 32. Row: 64 tokens
    # in, 32 out, the gradient's 32 cast both ways and both copies gathered back to 64 (the
    # collectives are allocations: shapes only)
    col = fp8.Fp8Linear(64, 96, False, "mxfp8", gather=2, tn_only=False)
    x = torch.randn(3, 32, 64, requires_grad=True)
    y = col(x)
    assert y.shape == (3, 64, 96)
    cast = col.cast(x)
    assert cast.total[0].shape == (192, 64) and cast.total[1].shape == (192, 2)
    assert cast.keep[0].shape == (64, 96) and cast.keep[1].shape == (64, 3)
    assert [t.shape for t in cast.wgrad_operand()] == [(64, 192), (64, 6)]
    y.sum().backward()
    assert x.grad.shape == x.shape and col.weight.grad.shape == (96, 64)
    row = fp8.Fp8Linear(64, 96, False, "mxfp8", scatter=2, tn_only=False)
    x = torch.randn(3, 64, 64, requires_grad=True)
    y = row(x)
    assert y.shape == (3, 32, 96)
    y.sum().backward()
    assert x.grad.shape == x.shape and row.weight.grad.shape == (96, 64)
    with pytest.raises(ValueError, match="Blackwell"):
        fp8.Fp8Linear(64, 96, False, "mxfp8", gather=2)


def test_a_tensor_parallel_block_runs_the_same_kernels_and_keeps_its_shards():
    # tp 2 (sequence parallel), 4 KV heads (k and v 64 x 64, 32 a rank: MXFP8 needs 32s):
    # the same kernels as one GPU's (no transposes: the copies are already blocked the way
    # each GEMM reduces). M = 6 x 32 = 192 tokens, 96 a rank (TE's MXFP8 casts take rows in
    # 32s). Kept: the column groups (qkv, fc1) the column-wise copy of their shard of the
    # tokens, 64 features x 96 tokens + 64 x 3 scales = 6,336 bytes; the row layers their
    # whole input's, split over the features: wo 32 x 192 + 32 x 6 = 6,336, out 64 x 192 +
    # 64 x 6 = 12,672
    def llama(tp):
        return GPTConfig(layers=2, d_model=64, heads=4, kv_heads=4, vocab=96, seq_len=32,
                         tie_embeddings=False, norm="rmsnorm", mlp="swiglu", ffn_hidden=128,
                         positions="rope", tp=tp, tp_impl="te", fp8="mxfp8",
                         fp8_tn_only=False)
    one = _counts(_capture(llama(1), batch=6))
    cfg = llama(2)
    assert _counts(_capture(cfg, batch=6)) == one
    kept = _capture(cfg, batch=6).saved_by_module
    for module in ("blocks.0.attn.wq", "blocks.0.fc"):
        assert kept[module] == 64 * 96 + 64 * 3
    assert kept["blocks.0.attn.wo"] == 32 * 192 + 32 * 6
    assert kept["blocks.0.out"] == 64 * 192 + 64 * 6


def test_tensor_parallel_all_gathers_in_mxfp8_by_hand():
    # 10 blocks, 4,096 tokens of width 1,024: 8 MiB a collective in BF16; an MXFP8 copy is
    # 4 MiB of data and 128 KiB of scales (one byte a 32). The blocks' 20 forward gathers and
    # 20 re-gathers move one copy, their 20 row-gradient gathers two; the output layer's,
    # the embedding's and every reduce-scatter stay BF16
    bf16, mx = 4096 * 1024 * 2, 4096 * 1024 + 4096 * 1024 // 32
    got = tensor_parallel_collectives(10, 4096, 1024, 2, False, impl="te", fp8=True,
                                      mxfp8=True)
    assert got == (("allgather", 2, bf16, None), ("reducescatter", 1, bf16, None),
                   ("allgather", 20, mx, "fprop"), ("reducescatter", 20, bf16, "row-fprop"),
                   ("allgather", 20, 2 * mx, "row-dgrad"), ("allgather", 20, mx, "dgrad"),
                   ("allgather", 1, bf16, "dgrad"), ("reducescatter", 21, bf16, "wgrad"))
    per_tensor = tensor_parallel_collectives(10, 4096, 1024, 2, False, impl="te", fp8=True)
    moved = sum(n * b for _, n, b, _ in got) - sum(n * b for _, n, b, _ in per_tensor)
    # against per-tensor FP8: 60 gathers of 1/32 more, 20 of a second copy
    assert moved == 60 * (mx - 4096 * 1024) + 20 * mx
    with pytest.raises(ValueError, match="needs fp8"):
        tensor_parallel_collectives(10, 4096, 1024, 2, False, impl="te", mxfp8=True)


def test_the_record_says_what_mxfp8_was_checked_against():
    import pathlib

    from dlperf.hardware.track_record import build_fp8, describe_fp8, load_scale_out

    def row(device, tp, ratio, current):
        return {"row": f"r-{device}-{tp}", "model": "m", "gpus": 64, "device": device,
                "tp": tp, "measured_tokens_per_s_per_gpu": 1000.0,
                "measured": [{"container": "26.02"}], "mxfp8": {"ratio": ratio},
                "fp8_current": {"ratio": current}, "predicted_mx_over_current": ratio / current}

    dense = {"rows": [{"row": "d", "model": "d", "gpus": 8, "device": "b200",
                       "measured_tokens_per_s_per_gpu": 1.0, "measured": [{"container": "x"}],
                       "fp8_mcore": {"ratio": 1.0}, "predicted_fp8_gain": 1.2}]}
    mx = {"rows": [row("gb300", 1, 0.9, 0.92), row("gb200", 2, 1.1, 1.12),
                   row("gb200", 4, 1.2, 1.25)]}
    text = describe_fp8({"fp8": build_fp8(dense, None, mx)})
    # per device, GB300s first; 1.1 / 1.12 = 0.98, 1.2 / 1.25 = 0.96, 0.9 / 0.92 = 0.98
    assert ("at tensor parallelism 1-4: dlperf predicted GB300s 0.90x; GB200s 1.10-1.20x the "
            "measured rate (3 rows; per-tensor FP8 on the same layouts 0.92-1.25x), and MXFP8 "
            "0.96-0.98x as fast as per-tensor FP8 there") in text
    assert "MXFP8" not in describe_fp8({"fp8": build_fp8(dense)})
    # the shipped record holds the saved validation's rows
    saved = json.loads((pathlib.Path(__file__).resolve().parents[1] / "benchmarks/results/"
                        "tp-megatron-bridge-mxfp8.json").read_text())["results"]["rows"]
    assert [r["ratio"] for r in load_scale_out()["fp8"]["mxfp8"]["rows"]] == [
        r["mxfp8"]["ratio"] for r in saved]
