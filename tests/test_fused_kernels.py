"""models/fused.py: Megatron-Core's fused kernels of a Llama block (--tp-impl te), their
gradients against autograd in float64, the model they make against the unfused one, and what
they keep for the backward against a count by hand (TransformerEngine's saved tensors)."""

from __future__ import annotations

import pytest
import torch

from dlperf.analysis.api import AnalysisConfig, capture_costs
from dlperf.analysis.capture import capture
from dlperf.hardware.efficiency import memory_class_of
from dlperf.models import fused
from dlperf.models.gpt import GPT, GPTConfig, RMSNorm, apply_rope, gpt_config, rope_tables


def _double(*shape, grad=True):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=grad)


def test_each_fused_op_has_autograds_gradient_in_float64():
    torch.manual_seed(0)
    x, w = _double(2, 5, 8), _double(8)
    assert torch.autograd.gradcheck(lambda x, w: fused._rms_norm(x, w, 1e-5)[0], (x, w))
    gate, up = _double(2, 5, 8), _double(2, 5, 8)
    assert torch.autograd.gradcheck(fused._swiglu, (gate, up))
    cos, sin = rope_tables(8, 5, 10000.0)
    q = _double(2, 5, 3, 8)
    assert torch.autograd.gradcheck(lambda q: fused.fused_rope(q, cos.double(), sin.double()),
                                    (q,))


def test_fused_ops_compute_what_the_unfused_ones_do():
    torch.manual_seed(0)
    x = torch.randn(3, 7, 16)
    ref, ours = RMSNorm(16, 1e-5), fused.FusedRMSNorm(16, 1e-5)
    with torch.no_grad():
        ref.weight.normal_()
        ours.weight.copy_(ref.weight)
    assert torch.allclose(ours(x), ref(x), atol=1e-6)
    gate, up = torch.randn(4, 6), torch.randn(4, 6)
    assert torch.allclose(fused.FusedSwiGLU()(gate, up), torch.nn.functional.silu(gate) * up)
    cos, sin = rope_tables(16, 7, 500000.0)
    q = torch.randn(3, 7, 2, 16)
    # (torchtitan's complex multiply: the unfused form of dlperf's Llama presets)
    unfused, _ = apply_rope(q, q, (torch.complex(cos, sin),), "complex")
    assert torch.allclose(fused.fused_rope(q, cos, sin), unfused, atol=1e-6)


def _llama(tp_impl, **kw):
    return GPTConfig(layers=2, d_model=64, heads=8, kv_heads=2, vocab=100, seq_len=32,
                     tie_embeddings=False, norm="rmsnorm", mlp="swiglu", ffn_hidden=96,
                     positions="rope", tp_impl=tp_impl, **kw)


def test_the_te_llama_is_the_same_function_with_the_same_gradients():
    # at TP 1 the te form is the torch form's math with fused kernels (and K, V not copied to
    # the query heads): the same parameters give the same logits and gradients (in float64,
    # but for the unfused norm and rotary embedding's FP32 arithmetic: hence 1e-6)
    torch.manual_seed(0)
    plain = GPT(_llama("torch")).double()
    te = GPT(_llama("te")).double()
    assert [n for n, _ in plain.named_parameters()] == [n for n, _ in te.named_parameters()]
    te.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 100, (2, 32))
    out_plain, out_te = plain(idx), te(idx)
    assert torch.allclose(out_plain, out_te, atol=1e-6)
    out_plain.square().mean().backward()
    out_te.square().mean().backward()
    for (name, p), q in zip(plain.named_parameters(), te.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name


def _kernels(cfg, batch=1):
    with torch.device("meta"):
        model = GPT(cfg).to(torch.bfloat16)
    cap = capture(model, (torch.zeros(batch, cfg.seq_len, dtype=torch.long, device="meta"),))
    return cap, [r for r in cap.records if r.module.startswith("blocks.0")]


def test_a_te_block_runs_one_kernel_for_each_fused_layer():
    _, te = _kernels(_llama("te", tp=2))
    ops = [r.op for r in te]
    # (the attention's own records are one fused kernel's: its region)
    forward = [r.op for r in te if r.phase == "forward" and r.region is None]
    # two norms, the rotary embedding of q and of k, one SwiGLU; each backward one op
    assert forward.count("te_rms_norm") == 2 and ops.count("te_rms_norm_backward") == 2
    assert forward.count("te_rope") == 2 and ops.count("te_rope_backward") == 2
    assert forward.count("te_swiglu") == 1 and ops.count("te_swiglu_backward") == 1
    # no FP32 elementwise chains of the unfused norm and rotary embedding, no copy of K and V
    # to the query heads (the unfused block's pow, rsqrt, mean, stack and clone)
    for op in ("pow", "rsqrt", "mean", "stack", "clone", "silu"):
        assert op not in forward, op
    _, plain = _kernels(_llama("torch", tp=2))
    assert {"pow", "rsqrt", "silu"} <= {r.op for r in plain if r.phase == "forward"}
    # each one memory-bound kernel in the cost model, of the class its real kernel is
    costs, uncounted, _, _ = capture_costs(GPT(_llama("te", tp=2)).to("meta"), AnalysisConfig(
        model="gpt", input_shape=(1, 32), dtype="bf16", train=True, device="h100-sxm",
        tokens=True, optimizer="adamw"), torch.long)
    assert not any(op.startswith("te_") for op in uncounted)
    # (the mixture of experts' ops, moe_* and te_weighted_*: tests/test_qwen3.py)
    assert {c.op for c in costs if c.op.startswith("te_")} == {
        op for op in fused.OPS if not op.startswith(("moe_", "te_weighted_"))}
    assert all(c.kind == "memory" for c in costs if c.op.startswith("te_"))
    assert memory_class_of("te_rms_norm") == "norm"
    assert memory_class_of("te_swiglu") == "transcendental"
    assert memory_class_of("te_rope") == "stream"


def test_a_te_block_keeps_what_transformer_engine_keeps_counted_by_hand():
    # One block of the small Llama at TP 2 (sequence parallel), 32 tokens, bf16: 16 tokens of
    # the residual stream on the rank, 4 query heads and 1 K/V head of 8, SwiGLU 48 wide.
    #   norm 1: its input 16 x 64 x 2 = 2,048 B and the FP32 rstd 16 x 4 = 64 B
    #   q, k, v projections: their input's shard (the norm's output) 2,048 B
    #   attention: q 32 x 4 x 8 x 2 = 2,048, k and v 32 x 8 x 2 = 512 each, output 2,048,
    #     log-sum-exp 4 x 32 x 4 = 512; the rotary tables (cos, sin 32 x 4 x 2 B) 512
    #   norm 2: 2,048 + 64; the MLP's input shard 2,048
    #   SwiGLU: both GEMMs' outputs 32 x 48 x 2 = 3,072 each; the second GEMM its input 3,072
    # = 23,680 B
    cap, _ = _kernels(_llama("te", tp=2))
    block = sum(v for k, v in cap.saved_by_module.items() if k.startswith("blocks.0"))
    assert block == 23_680
    # the unfused block (FP32 norms and rotary embedding, K and V copied to 4 heads, SiLU and
    # the product each keeping their inputs) keeps more
    plain, _ = _kernels(_llama("megatron", tp=2))
    assert sum(v for k, v in plain.saved_by_module.items() if k.startswith("blocks.0")) > block


@pytest.mark.slow
def test_llama3_405b_block_at_tp8_keeps_half_a_gib():
    # Llama 3 405B (d 16,384, 128 heads, 8 K/V heads, SwiGLU 53,248) at TP 8, 8,192 tokens:
    # per token of the rank's 1,024 (sequence parallel), by the list above,
    #   6 x 2 d (two norm inputs, two GEMM input shards, q and the attention output, each
    #   d / 8 wide over 8 x the tokens) = 196,608 B, k and v 2 x 2 x 1,024 = 4,096,
    #   log-sum-exp 16 heads x 8 x 4 = 512, two rstd 8, SwiGLU 3 x 2 x 53,248 = 319,488
    # = 520,712 B a token, x 1,024 = 533,209,088 B, plus the rotary tables 2 x 8,192 x 64 x 2
    # = 2,097,152: 0.4985 GiB (the unfused block keeps 0.724 GiB: 1.45x)
    cap, _ = _kernels(gpt_config("llama3-405b", layers=1, tp=8, tp_impl="te", seq_len=8192))
    block = sum(v for k, v in cap.saved_by_module.items() if k.startswith("blocks.0"))
    assert block == 520_712 * 1024 + 2 * 8192 * 64 * 2


def test_the_capture_counts_what_autograd_keeps_on_real_tensors():
    # the independent reference: autograd's saved tensors on real CPU tensors (the CPU's
    # flash kernel takes grouped K and V as they are, as TransformerEngine's does)
    import dlperf
    from test_memory import _saved_bytes_on_real_tensors

    counts = {}
    for impl in ("te", "torch"):
        torch.manual_seed(0)
        model = GPT(_llama(impl))
        real = _saved_bytes_on_real_tensors(model, torch.randint(0, 100, (2, 32)))
        a = dlperf.analyze(model, (2, 32), device="a100-80gb", dtype="fp32", optimizer="sgd",
                           input_dtype=torch.int64)
        counts[impl] = a.memory_report()["activations_bytes"]
        assert counts[impl] == real, impl
    assert counts["te"] < 0.75 * counts["torch"]  # 400,128 B against 580,352
