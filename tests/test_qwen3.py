"""Qwen3's mixtures of experts (models/gpt.py presets, --qk-norm), a mixture of experts in FP8
(models/fp8.py ``grouped_fp8``: TransformerEngine's grouped GEMMs) and the node-deduplicating
dispatchers (analysis/scaling.py ``node_deduplicated_alltoall_s``: DeepEP, HybridEP)."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
import torch

from dlperf.analysis.api import AnalysisConfig, capture_costs
from dlperf.analysis.scaling import alltoall_s, node_deduplicated_alltoall_s
from dlperf.hardware.interconnect import PRESETS
from dlperf.models import fp8
from dlperf.models.gpt import GPT, GPTConfig, gpt_config


def test_qwen3_presets_have_the_released_parameter_counts():
    # Qwen3-30B-A3B (the model card: 30.5B, 3.3B activated): embedding and untied output
    # layer 2 x 151,936 x 2,048 = 622,329,856; a block: q 2,048 x 4,096 (32 heads of 128),
    # k and v 2,048 x 512 each, o 4,096 x 2,048 = 18,874,368; q and k norms 2 x 128; two
    # norms 2 x 2,048; router 2,048 x 128 = 262,144; 128 experts of 3 x 2,048 x 768 =
    # 603,979,776; 623,120,640 a block, x 48 = 29,909,790,720; + 622,329,856 + the final
    # norm's 2,048 = 30,532,122,624
    with torch.device("meta"):
        small = GPT(gpt_config("qwen3-30b-a3b"))
    assert sum(p.numel() for p in small.parameters()) == 30_532_122_624
    # activated: 8 of the 128 experts, 8 x 4,718,592 = 37,748,736 a block: 56,889,600 a
    # block, x 48 + 622,331,904 = 3,353,032,704 (3.3B)
    assert 48 * (18_874_368 + 256 + 4_096 + 262_144 + 8 * 3 * 2048 * 768) + 622_331_904 \
        == 3_353_032_704
    # Qwen3-235B-A22B (235B, 22B activated): embeddings 2 x 151,936 x 4,096 =
    # 1,244,659,712; a block: q 4,096 x 8,192 and o back, k and v 4,096 x 512 each =
    # 71,303,168; norms 256 + 8,192; router 524,288; 128 experts of 3 x 4,096 x 1,536 =
    # 2,415,919,104; 2,487,755,008 a block, x 94 = 233,848,970,752; + 1,244,659,712 + 4,096
    with torch.device("meta"):
        large = GPT(gpt_config("qwen3-235b-a22b"))
    assert sum(p.numel() for p in large.parameters()) == 235_093_634_560
    cfg = large.cfg
    assert (cfg.qk_norm, cfg.experts, cfg.top_k, cfg.kv_heads, cfg.head_dim) == (
        True, 128, 8, 4, 128)


def _tiny(**kw) -> GPTConfig:
    return GPTConfig(**{**dict(layers=2, d_model=64, heads=4, kv_heads=2, head_size=32,
                               vocab=96, seq_len=16, norm="rmsnorm", mlp="swiglu",
                               ffn_hidden=128, positions="rope", tie_embeddings=False,
                               qk_norm=True), **kw})


def test_qk_norm_normalises_each_heads_q_and_k_before_the_rotary_embedding():
    # against float64 by hand: q = x Wq^T per head, divided by its RMS over the head's 32
    # features (plus the eps, 1e-5) and scaled by the norm's weight (1 here): each head's q
    # has a mean square of 1 at every position, to the eps
    torch.manual_seed(0)
    model = GPT(_tiny()).double()
    attn = model.blocks[0].attn
    with torch.no_grad():
        attn.q_norm.weight.fill_(1.0)
        attn.k_norm.weight.uniform_(0.5, 1.5)
    seen = {}
    attn.q_norm.register_forward_hook(lambda m, i, o: seen.update(q_in=i[0], q=o))
    model(torch.randint(0, 96, (2, 16)))
    q_in, q = seen["q_in"], seen["q"]
    assert q.shape == (2, 16, 4, 32)
    ref = q_in / torch.sqrt(q_in.pow(2).mean(-1, keepdim=True) + 1e-5)
    assert torch.allclose(q, ref, atol=1e-12)
    assert torch.allclose(q.pow(2).mean(-1), torch.ones(2, 16, 4, dtype=torch.float64),
                          atol=1e-3)
    # two norms of head-size weights a block, none without the flag
    names = [n for n, _ in model.named_parameters() if "_norm" in n]
    assert names == ["blocks.0.attn.q_norm.weight", "blocks.0.attn.k_norm.weight",
                     "blocks.1.attn.q_norm.weight", "blocks.1.attn.k_norm.weight"]
    assert not [n for n, _ in GPT(_tiny(qk_norm=False)).named_parameters() if "_norm" in n]


def _dequantized(x: torch.Tensor, fmt) -> torch.Tensor:
    """Each expert's matrix x[g] cast with its own per-tensor scale, back in float64."""
    top = 448.0 if fmt is torch.float8_e4m3fn else 57344.0
    scale = top / x.abs().amax(dim=(-2, -1), keepdim=True).double()
    return (x.double() * scale).clamp(-top, top).float().to(fmt).double() / scale


@pytest.mark.parametrize("tn_only", (True, False))
@pytest.mark.parametrize("recipe", fp8.RECIPES)
def test_the_grouped_fp8_layer_is_each_expert_s_product_of_quantized_operands(recipe,
                                                                              tn_only):
    # 3 experts, 16 rows of 32 into 48 each, the experts' scales their own (one expert's
    # values 100x another's would flush the small one to zero under one shared scale):
    # forward and both gradients against float64 products of the dequantized operands
    torch.manual_seed(0)
    h = (torch.randn(3, 16, 32) * torch.tensor([1.0, 100.0, 0.01])[:, None, None])
    h.requires_grad_(True)
    w = torch.randn(3, 32, 48, requires_grad=True)
    b = torch.randn(3, 1, 48, requires_grad=True)
    y = fp8.grouped_fp8(h, w, b, recipe, tn_only)
    hd, wd = (_dequantized(t.detach(), torch.float8_e4m3fn) for t in (h, w))
    assert y.shape == (3, 16, 48)
    assert torch.allclose(y.double(), hd @ wd + b.detach().double(), rtol=1e-5, atol=1e-4)
    g = torch.randn(3, 16, 48)
    y.backward(g)
    gd = _dequantized(g, torch.float8_e5m2)
    assert torch.allclose(h.grad.double(), gd @ wd.transpose(1, 2), rtol=1e-5, atol=1e-4)
    assert torch.allclose(w.grad.double(), hd.transpose(1, 2) @ gd, rtol=1e-5, atol=1e-3)
    assert torch.allclose(b.grad, g.sum(1, keepdim=True))
    # the small expert kept its precision: a few percent of its exact product
    exact = h.detach()[2].double() @ w.detach()[2].double()
    assert (y[2].double() - b.detach()[2].double() - exact).norm() / exact.norm() < 0.1
    with pytest.raises(ValueError, match="multiples of 16"):
        fp8.grouped_fp8(torch.randn(3, 12, 32), w, None, recipe, tn_only)


def _moe(fp8_recipe=None, tn_only=True, **kw) -> GPTConfig:
    return _tiny(**{**dict(qk_norm=False, experts=4, top_k=2, expert_hidden=64, tp_impl="te",
                           fp8=fp8_recipe, fp8_tn_only=tn_only), **kw})


def _costs(cfg: GPTConfig, batch: int = 2, types=("MoE",)):
    with torch.device("meta"):
        model = GPT(cfg)
    # (BF16 weights and activations, FP32 master weights: Megatron-Core's, --precision fsdp)
    acfg = AnalysisConfig(model="gpt", input_shape=(batch, cfg.seq_len), dtype="bf16",
                          precision="fsdp", train=True, device="h100-sxm", tokens=True,
                          optimizer="adamw")
    costs, uncounted, _, _ = capture_costs(model, acfg, torch.long)
    assert not uncounted
    return model, [c for c in costs if c.module_type in types]


@pytest.mark.parametrize("tn_only", (True, False))
@pytest.mark.parametrize("recipe", fp8.RECIPES)
def test_the_fp8_experts_kernels_by_hand(recipe, tn_only):
    # A block's experts, 2 blocks: forward, 2 input casts (the permuted rows, once for w1
    # and w3, which Megatron's linear_fc1 runs as one GEMM; the activation for w2), 2 weight
    # casts (fc1's and w2's), 2 grouped FP8 GEMMs; backward, 2 gradient casts, 2 data- and 2
    # weight-gradient grouped GEMMs; the current recipe an amax before each cast; no
    # transposes (the casts write them on TN GPUs). 2 sequences of 16 tokens, top-2 of 4
    # experts: 64 copies, 16 rows an expert; fc1 2 x 64 x 128 x 64 = 1,048,576 FLOPs, w2
    # 524,288, 3 times each a block: 9,437,184 for two blocks, as many as the BF16 experts'
    # batched GEMMs, now in FP8
    _, costs = _costs(_moe(recipe, tn_only))
    count = Counter((c.op, c.phase) for c in costs if c.op.startswith("fp8"))
    blocks = 2
    expected = {("fp8_quantize", "forward"): 2 * blocks,
                ("fp8_weight_quantize", "forward"): 2 * blocks,
                ("fp8_gemm", "forward"): 2 * blocks, ("fp8_quantize", "dgrad"): 2 * blocks,
                ("fp8_gemm", "dgrad"): 2 * blocks, ("fp8_gemm", "wgrad"): 2 * blocks}
    if recipe == "current":
        expected.update({("fp8_amax", "forward"): 2 * blocks,
                         ("fp8_weight_amax", "forward"): 2 * blocks,
                         ("fp8_amax", "dgrad"): 2 * blocks})
    assert dict(count) == expected
    gemms = [c for c in costs if c.op == "fp8_gemm"]
    assert all(c.dtype == "fp8" and c.gemm.batch == 4 for c in gemms)
    assert sum(c.flops for c in gemms) == 9_437_184
    _, bf16 = _costs(_moe())
    assert sum(c.flops for c in bf16 if c.op == "bmm") == 9_437_184
    # the cast of the permuted rows, 64 rows of 64: BF16 in, one FP8 byte out per copy
    # written (row-wise, and column-wise on TN GPUs), the 4 experts' FP32 inverse scales out
    # and, under the current recipe, their amaxes in
    cast = next(c for c in costs if c.op == "fp8_quantize" and c.phase == "forward")
    assert cast.bytes == (64 * 64 * 2 + 64 * 64 * (2 if tn_only else 1)
                          + 4 * 4 * (2 if recipe == "current" else 1))


def test_fp8_experts_pad_their_rows_and_hold_their_weight_copies():
    # 20 tokens top-2 over 4 experts: 10 rows an expert, padded to 16 in FP8 (Megatron's
    # Fp8Padding, TE's multiple of 16); as many as they are in BF16
    assert _moe("current").expert_rows(20) == 64
    assert _moe().expert_rows(20) == 40
    # TE's FP8 copies of the experts' weights: 2 blocks x 3 x 4 x 64 x 64 = 98,304 elements,
    # both layouts on TN GPUs (2 bytes), the row-wise one elsewhere; plus the attention's four
    # layers (q 64 x 128, k and v 64 x 64, o 128 x 64: 24,576 a block, 49,152) alike
    model = GPT(_moe("delayed"))
    assert fp8.fp8_weight_bytes(model) == 2 * (98_304 + 49_152)
    assert fp8.fp8_weight_bytes(GPT(_moe("delayed", tn_only=False))) == 98_304 + 49_152
    assert fp8.fp8_weight_bytes(GPT(_moe())) == 0


def test_what_fp8_experts_refuse():
    with pytest.raises(ValueError, match="not torchao's"):
        _tiny(qk_norm=False, experts=4, top_k=2, fp8="tensorwise")
    with pytest.raises(ValueError, match="multiples of 16"):
        _moe("current", expert_hidden=72)


def test_the_node_deduplicated_dispatch_by_hand():
    node, net = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]
    nbytes = 4096 * 8 * 2048 * 2  # a rank's 4,096 tokens, 8 copies each of 2,048 in BF16
    # Qwen3-30B-A3B over 2 nodes of 8 (EP 16, 64 experts a node, 8 a GPU): a token misses
    # the other node with probability C(64, 8) / C(128, 8) = 0.0031, so crosses the network
    # 0.9969 times, 1/8 of nbytes, where the plain all-to-all sends half its copies (4 of 8);
    # a GPU holds none of its experts with probability C(120, 8) / C(128, 8) = 0.588, so it
    # reaches 16 x 0.412 = 6.6 GPUs, 7/8 of them over NVLink (the plain all-to-all: 7/8 of 8
    # copies); the slower of the two links: the NIC's
    miss = math.comb(64, 8) / math.comb(128, 8)
    assert miss == pytest.approx(0.0031, abs=1e-4)
    gpu_miss = math.comb(120, 8) / math.comb(128, 8)
    assert gpu_miss == pytest.approx(0.588, abs=1e-3)
    t_net = nbytes / 8 * (1 - miss) / net.bus_bandwidth + net.latency_s
    t_node = nbytes / 8 * 16 * (1 - gpu_miss) * 7 / 8 / node.bus_bandwidth + node.latency_s
    t = node_deduplicated_alltoall_s(nbytes, 16, 8, node, net, 128, 8)
    assert t_net > t_node and t == pytest.approx(t_net)
    plain = alltoall_s(nbytes, 16, 8, node, net)
    assert plain / t == pytest.approx((nbytes / 2 / net.bus_bandwidth + net.latency_s)
                                      / t_net)
    assert 3.5 < plain / t < 4.1  # about the 4 copies a token sends the other node
    # top-1: nothing to deduplicate, the network's share is the plain all-to-all's (half)
    one = node_deduplicated_alltoall_s(nbytes, 16, 8, node, net, 128, 1)
    assert one == pytest.approx(alltoall_s(nbytes, 16, 8, node, net))
    # inside one node (EP 8, 16 experts a GPU): a GPU holds none of a token's 8 with
    # probability C(112, 8) / C(128, 8) = 0.333, so the token reaches 7 x 0.667 = 4.67 other
    # GPUs where the plain all-to-all sends 7 of its 8 copies: 2/3 of its time
    gpu_miss = math.comb(112, 8) / math.comb(128, 8)
    assert gpu_miss == pytest.approx(0.333, abs=1e-3)
    inside = node_deduplicated_alltoall_s(nbytes, 8, 8, node, net, 128, 8)
    assert inside == pytest.approx(nbytes / 8 * 7 * (1 - gpu_miss) / node.bus_bandwidth
                                   + node.latency_s)
    # (each plus one latency)
    assert inside / alltoall_s(nbytes, 8, 8, node, net) == pytest.approx(0.667, abs=5e-3)
    # one expert a GPU (Mixtral's 8 over EP 8, top 2): the plain all-to-all
    assert node_deduplicated_alltoall_s(nbytes, 8, 8, node, net, 8, 2) == pytest.approx(
        alltoall_s(nbytes, 8, 8, node, net))


def _analyze_args(*extra: str) -> list[str]:
    return ["analyze", "qwen3-30b-a3b", "--layers", "2", "--device", "h100-sxm", "--train",
            "--dtype", "bf16", "--precision", "fsdp", "--tp-impl", "te", "--batch-size", "1",
            "--gpus", "16",
            "--ep", "16", "--interconnect", "nvlink4-h100,ib-ndr", "--top", "1", *extra]


def test_cli_qwen3_in_fp8_with_hybridep_across_two_nodes(tmp_path, capsys):
    from dlperf.cli import main

    times = {}
    for dispatcher in ("alltoall", "hybridep"):
        path = tmp_path / f"{dispatcher}.json"
        assert main(_analyze_args("--fp8", "current", "--ep-dispatcher", dispatcher,
                                  "--json", str(path))) == 0
        ep = json.loads(path.read_text())["scale_out"]["at_requested_scale"][
            "communication"]["expert_parallel"]
        assert ep["dispatcher"] == dispatcher and ep["moe_layers"] == 2
        times[dispatcher] = ep["alltoall_s"]
        said = " ".join(capsys.readouterr().out.split())
        assert ("hybridep's: a token once to each GPU and node of its experts" in said) == (
            dispatcher == "hybridep")
    # the NIC's share: 4 copies of a token's 8 go to the other node, 1 when deduplicated
    assert 3.5 < times["alltoall"] / times["hybridep"] < 4.1
    capsys.readouterr()
    assert main(["analyze", "qwen3-30b-a3b", "--layers", "2", "--ep-dispatcher",
                 "hybridep"]) == 2
    assert "--ep-dispatcher hybridep" in capsys.readouterr().err
    assert main(["analyze", "resnet18", "--qk-norm"]) == 2
    assert "--qk-norm" in capsys.readouterr().err


def test_the_expert_parallel_record_reads_the_saved_qwen3_row():
    # benchmarks/results/tp-megatron-bridge-qwen3.json: the median of the three releases'
    # rates (8,826, 8,901, 8,960) is 8,901; the record's ratio is the headline prediction
    # over it, its range the three attention shares', and the plain all-to-all's apart
    from pathlib import Path

    from dlperf.hardware.track_record import describe_expert_parallel, load_scale_out

    saved = json.loads((Path(__file__).resolve().parents[1] / "benchmarks/results/"
                        "tp-megatron-bridge-qwen3.json").read_text())["results"]["rows"][0]
    assert saved["measured_tokens_per_s_per_gpu"] == 8901
    record = load_scale_out()["expert_parallel"]["qwen3"][0]
    head = saved["mcore"]["predicted_tokens_per_s_per_gpu"]
    assert record["ratio"] == pytest.approx(head / 8901)
    assert record["ratio_low"] <= record["ratio"] <= record["ratio_high"]
    # the node's deduplication is what keeps the row from being predicted network-bound: the
    # plain all-to-all's four crossings a token make it slower than measured
    assert record["ratio_alltoall"] < 1 < record["ratio"]
    text = describe_expert_parallel()
    assert f"predicted {record['ratio']:.2f}x ({record['ratio_low']:.2f}-" in text
    assert f"{record['ratio_alltoall']:.2f}x were each copy of a token sent" in text


@pytest.mark.parametrize("glu", ("silu", "clamped-quick-gelu"))
def test_the_fused_routing_computes_the_op_by_op_mixture(glu):
    # Megatron-Core's path under TE (one permute kernel, w1 and w3 as one GEMM, the router's
    # weight inside the activation, one unpermute) against the op-by-op one in float64, the
    # same weights: the same output and the same gradients of the input and every weight
    from dlperf.models.gpt import MoE

    torch.manual_seed(0)
    extra = dict(bias=True, glu=glu) if glu != "silu" else {}
    fused = MoE(_moe(**extra)).double()
    plain = MoE(_moe(tp_impl="torch", **extra)).double()
    assert fused.fused and not plain.fused and fused.w3 is None
    assert fused.w1.shape == (4, 64, 128) and plain.w1.shape == (4, 64, 64)
    with torch.no_grad():
        plain.router.load_state_dict(fused.router.state_dict())
        plain.w1.copy_(fused.w1[..., :64])
        plain.w3.copy_(fused.w1[..., 64:])
        plain.w2.copy_(fused.w2)
        if glu != "silu":
            plain.b1.copy_(fused.b1[..., :64])
            plain.b3.copy_(fused.b1[..., 64:])
            plain.b2.copy_(fused.b2)
    x = torch.randn(2, 16, 64, dtype=torch.float64)
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    ys = [m(t) for m, t in zip((fused, plain), xs)]
    assert torch.allclose(ys[0], ys[1], atol=1e-12)
    g = torch.randn_like(ys[0])
    for y in ys:
        y.backward(g)
    assert torch.allclose(xs[0].grad, xs[1].grad, atol=1e-12)
    assert torch.allclose(fused.w1.grad, torch.cat((plain.w1.grad, plain.w3.grad), -1),
                          atol=1e-12)
    assert torch.allclose(fused.w2.grad, plain.w2.grad, atol=1e-12)
    assert torch.allclose(fused.router.weight.grad, plain.router.weight.grad, atol=1e-12)


def test_the_fused_routing_kernels_and_what_it_keeps_by_hand():
    # 2 sequences of 16 tokens, top-2 of 4 experts: 64 copies of d 64, 16 rows an expert,
    # hidden 64. Forward: one permute (64 x 64 rows out), one fc1 GEMM [4, 16, 64] x
    # [4, 64, 128], one weighted SwiGLU, one w2 GEMM, one unpermute (32 tokens out); backward:
    # the unpermute's backward is a permute and the permute's an unpermute, one kernel each,
    # the activation's one; no multiply, index_add or slice over the copies
    _, costs = _costs(_moe(), types=("MoE", "WeightedGLU"))
    blocks = 2
    count = Counter((c.op, c.phase) for c in costs)
    assert count[("moe_permute", "forward")] == count[("moe_unpermute", "forward")] == blocks
    assert count[("moe_permute", "dgrad")] == count[("moe_unpermute", "dgrad")] == blocks
    assert count[("te_weighted_swiglu", "forward")] == blocks
    assert count[("te_weighted_swiglu_backward", "dgrad")] == blocks
    assert count[("bmm", "forward")] == 2 * blocks
    # nothing else touches the copies (64 x 64 in BF16, 8 KiB): the other kernels are the
    # router's, on 32 x 4 logits and the 64 copies' weights (the weights' gather into
    # expert order, its backward, the renormalisation's)
    big = {c.op for c in costs if c.bytes >= 64 * 64 * 2}
    assert big == {"moe_permute", "moe_unpermute", "te_weighted_swiglu",
                   "te_weighted_swiglu_backward", "bmm"}
    assert count[("index_select", "forward")] == blocks
    permute = next(c for c in costs if c.op == "moe_permute" and c.phase == "forward")
    # reads 32 tokens x 64 in BF16 and 64 indices, writes 64 copies x 64
    assert permute.bytes == 32 * 64 * 2 + 64 * 8 + 64 * 64 * 2
    # kept a block (BF16): the fc1 GEMM's input, the 64 permuted copies (8,192 B); the
    # activation's input, fc1's output 64 x 128 (16,384 B), and the copies' weights in FP32
    # (256 B); w2's input, the activation 64 x 64 (8,192 B); the indices (512 B, the permute
    # and unpermute share them)
    with torch.device("meta"):
        model = GPT(_moe())
    from dlperf.analysis.api import _meta_forward, _meta_inputs
    from dlperf.analysis.capture import capture
    forward, params = _meta_forward(model, False, torch.bfloat16)
    cap = capture(model, _meta_inputs((2, 16), torch.long, False), train=True,
                  autocast_dtype=None, forward=forward, params=params)
    kept = cap.saved_by_module
    assert kept["blocks.0.moe.act"] == 64 * 128 * 2 + 64 * 4
    assert kept["blocks.0.moe"] >= 64 * 64 * 2 * 2 + 64 * 8
    assert kept["blocks.0.moe"] - (64 * 64 * 2 * 2 + 64 * 8) < 64 * 64 * 2 // 2
