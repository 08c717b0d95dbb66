"""The Llama form of dlperf's decoder (models/gpt.py): the published models to the parameter,
the kernels torchtitan's Llama runs, and a reference rotary embedding."""

from __future__ import annotations

import math

import pytest
import torch

from dlperf.hardware.specs import get_device
from dlperf.models.gpt import GPT, PRESETS, GPTConfig


def _count(cfg):
    with torch.device("meta"):
        return sum(p.numel() for p in GPT(cfg).parameters())


def test_llama_presets_are_the_published_models_to_the_parameter():
    # Llama 3 8B: SwiGLU hidden int(2 x 4 x 4096 / 3) = 10,922, x 1.3 = 14,198, up to a multiple
    # of 1,024: 14,336. Per layer: wq + wo 2 x 4096^2, wk + wv 2 x 4096 x 1024 (8 KV heads of
    # 128), MLP 3 x 4096 x 14,336, two norms 2 x 4096 = 218,112,000; x 32 = 6,979,584,000; plus
    # embedding and untied output 2 x 128,256 x 4,096 and the final norm: 8,030,261,248
    # (Meta's model card: 8.03 B).
    assert PRESETS["llama3-8b"].ffn_hidden == 14336
    assert _count(PRESETS["llama3-8b"]) == 32 * (2 * 4096**2 + 2 * 4096 * 1024
                                                 + 3 * 4096 * 14336 + 2 * 4096) \
        + 2 * 128256 * 4096 + 4096 == 8_030_261_248
    # Llama 2 7B: hidden 10,922 up to a multiple of 256 = 11,008; multi-head attention
    # 4 x 4096^2; 32 x 202,383,360 + 2 x 32,000 x 4,096 + 4,096 = 6,738,415,616
    assert PRESETS["llama2-7b"].ffn_hidden == 11008
    assert _count(PRESETS["llama2-7b"]) == 6_738_415_616
    # 70B: hidden int(21,845 x 1.3) = 28,398 up to a multiple of 4,096 = 28,672 (both
    # generations); Llama 2 70B has 68,976,648,192 parameters, Llama 3 70B 70,553,706,496
    assert PRESETS["llama2-70b"].ffn_hidden == PRESETS["llama3-70b"].ffn_hidden == 28672
    assert _count(PRESETS["llama2-70b"]) == 68_976_648_192
    assert _count(PRESETS["llama3-70b"]) == 70_553_706_496
    assert PRESETS["llama2-13b"].ffn_hidden == 13824
    # Llama 2 34B (Table 1 of the paper; as Code Llama 34B and fms-fsdp's "34b" build it):
    # hidden int(2 x 4 x 8192 / 3) = 21,845 up to a multiple of 256 = 22,016. Per layer: wq +
    # wo 2 x 8192^2 = 134,217,728, wk + wv 2 x 8192 x 1024 = 16,777,216, MLP 3 x 8192 x
    # 22,016 = 541,065,216, norms 16,384: 692,076,544; x 48 = 33,219,674,112, + 2 x 32,000 x
    # 8,192 + 8,192 = 33,743,970,304 (Code Llama's 33.7 B)
    assert PRESETS["llama2-34b"].ffn_hidden == 22016
    assert _count(PRESETS["llama2-34b"]) == 48 * (2 * 8192**2 + 2 * 8192 * 1024
                                                  + 3 * 8192 * 22016 + 2 * 8192) \
        + 2 * 32000 * 8192 + 8192 == 33_743_970_304
    # Llama 3.1 405B: hidden int(2 x 4 x 16,384 / 3) = 43,690, x 1.2 = 52,428, up to a multiple
    # of 4,096: 53,248. Per layer: wq + wo 2 x 16,384^2 = 536,870,912, wk + wv 2 x 16,384 x
    # 1,024 = 33,554,432, MLP 3 x 16,384 x 53,248 = 2,617,245,696, norms 32,768: 3,187,703,808;
    # x 126 = 401,650,679,808, + 2 x 128,256 x 16,384 + 16,384 = 405,853,388,800
    assert PRESETS["llama3-405b"].ffn_hidden == 53248
    assert _count(PRESETS["llama3-405b"]) == 126 * (2 * 16384**2 + 2 * 16384 * 1024
                                                    + 3 * 16384 * 53248 + 2 * 16384) \
        + 2 * 128256 * 16384 + 16384 == 405_853_388_800


def _rope_cfg(form, **kw):
    fields = dict(layers=1, d_model=24, heads=3, vocab=50, seq_len=16, norm="rmsnorm",
                  positions="rope", rope_theta=500000.0)
    return GPTConfig(**{**fields, **kw}, rope=form)


@pytest.mark.parametrize("form", ["complex", "matrix", "half"])
def test_each_rope_form_is_a_complex_multiply_in_float64(form):
    # the reference: pair (x[2j], x[2j+1]) as x[2j] + i x[2j+1], times e^(i t f_j) with
    # f_j = theta^(-2j / D), in float64 (torchtitan's apply_rotary_emb, computed wide)
    from dlperf.models.gpt import apply_rope, rope_buffers

    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, 8)
    freqs = 1.0 / 500000.0 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    angles = torch.outer(torch.arange(5, dtype=torch.float64), freqs)
    z = torch.view_as_complex(x.double().reshape(2, 5, 3, 4, 2).contiguous())
    ref = torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)[None, :, None])
    ref = ref.reshape(2, 5, 3, 8)
    tables = tuple(rope_buffers(_rope_cfg(form)).values())
    if form == "half":
        # rotate_half pairs feature j with j + D/2: the same rotation on features permuted
        # that way (what the checkpoint converters do to q's and k's weights)
        to_half = lambda t: t.unflatten(-1, (4, 2)).transpose(-1, -2).flatten(-2)  # noqa: E731
        ours, ours_k = apply_rope(to_half(x), to_half(x), tables, form)
        ours, ours_k = (t.unflatten(-1, (2, 4)).transpose(-1, -2).flatten(-2)
                        for t in (ours, ours_k))
    else:
        ours, ours_k = apply_rope(x, x, tables, form)
    assert ours.shape == ours_k.shape == x.shape and ours.is_contiguous() is (form != "matrix")
    assert torch.allclose(ours.double(), ref, atol=1e-5)
    assert torch.allclose(ours_k.double(), ref, atol=1e-5)
    # position 0 is not rotated; norms are kept
    assert torch.allclose(ours[:, 0], x[:, 0], atol=1e-6)
    assert torch.allclose(ours.norm(dim=-1), x.norm(dim=-1), atol=1e-4)


def _rope_forward_bytes(form):
    """Bytes of the attention's non-GEMM forward kernels of one block in bf16: the rotary
    embedding's (multi-head attention: no copy of K and V), and their kernel ops."""
    from dlperf.analysis.api import AnalysisConfig, analyze_model

    cfg = _rope_cfg(form, layers=1, d_model=256, heads=4, seq_len=64, tie_embeddings=False,
                    mlp="swiglu", ffn_hidden=512)
    with torch.device("meta"):
        model = GPT(cfg)
    a = analyze_model(model, AnalysisConfig(model="llama", input_shape=(2, 64), dtype="bf16",
                                            train=True, tokens=True, device="a100-80gb",
                                            optimizer="adamw", precision="half"),
                      input_dtype=torch.long)
    costs = [p.cost for p in a.predictions if p.cost.phase == "forward"
             and p.cost.module.startswith("blocks.0.attn")
             and p.cost.kind not in ("gemm", "fused")]
    return sum(c.bytes for c in costs), [c.op for c in costs]


@pytest.mark.parametrize("form", ["complex", "matrix", "half"])
def test_each_rope_form_moves_the_bytes_of_its_stack_counted_by_hand(form):
    # q and k each [2, 64, 4, 64]: N = 32,768 elements in bf16 (2 B); D = 64, T = 64
    n, t, d, b = 32_768, 64, 64, 2
    total, ops = _rope_forward_bytes(form)
    if form == "complex":
        # per tensor: cast in (2 + 4 B a element), complex multiply (4 + 4, plus the complex64
        # table T x D/2 x 8 B = 16,384), cast out (4 + 2): 20 N + 16,384 B; for q and k
        # 2 x 671,744
        assert ops == ["_to_copy", "mul", "_to_copy"] * 2
        assert total == 2 * (20 * n + t * d // 2 * 8) == 1_343_488
    elif form == "matrix":
        # once: the positions (arange 64 x 8 B, repeat to 2 x 64: read 512, write 1,024) and the
        # gather of the matrices (bf16 here, as the model's buffers are cast: the table T x
        # D/2 x 4 x 2 B = 16,384 and the int64 positions 1,024 read, B T D/2 x 4 x 2 B =
        # 32,768 written) and their cast to FP32 (32,768 + 65,536); per tensor: cast in 6 N,
        # the broadcast product (read 4 N and the 65,536 B of matrices, write the
        # [.., D/2, 2, 2] FP32 product: 8 N), its sum (8 N + 4 N), cast out 6 N: 36 N + 65,536
        assert ops == ["arange", "repeat", "index", "_to_copy"] + [
            "_to_copy", "mul", "sum", "_to_copy"] * 2
        once = 512 + (512 + 1024) + (t * d // 2 * 4 * 2 + 1024 + b * t * d // 2 * 4 * 2) \
            + (32_768 + 65_536)
        assert once == 150_528
        assert total == once + 2 * (36 * n + 65_536) == 2_640_896
    else:
        # per tensor: q cos (2 + 2 B, the bf16 table T x D x 2 B), the negated upper half
        # (1 + 1), the concatenation (2 + 2), times sin (2 + 2, table), the sum (2 + 2 + 2):
        # 20 N + 2 x 8,192; the residual stream is bf16 here, so no cast of the tables
        assert ops == ["mul", "neg", "cat", "mul", "add"] * 2
        assert total == 2 * (20 * n + 2 * t * d * 2) == 1_343_488


def test_rope_form_is_checked():
    with pytest.raises(ValueError, match="rope must be one of complex, matrix, half"):
        _rope_cfg("rotary")


def test_grouped_query_attention_repeats_kv_heads_and_trains():
    cfg = GPTConfig(layers=2, d_model=64, heads=8, kv_heads=2, vocab=100, seq_len=16,
                    tie_embeddings=False, norm="rmsnorm", mlp="swiglu", ffn_hidden=96,
                    positions="rope")
    torch.manual_seed(0)
    model = GPT(cfg)
    attn = model.blocks[0].attn
    assert attn.wk.out_features == attn.wv.out_features == 2 * 8  # 2 KV heads of 8
    idx = torch.randint(0, 100, (2, 16))
    logits = model(idx)
    assert logits.shape == (2, 16, 100)
    # causal: changing the last token changes no earlier position's logits
    idx2 = idx.clone()
    idx2[:, -1] = (idx2[:, -1] + 1) % 100
    assert torch.allclose(model(idx2)[:, :-1], logits[:, :-1], atol=1e-5)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.flatten())
    loss.backward()
    assert math.isfinite(loss.item()) and attn.wk.weight.grad.abs().sum() > 0
    # the RMSNorm: x / rms(x) x weight
    x = torch.randn(3, 64)
    norm = model.blocks[0].ln1
    ref = x / torch.sqrt((x.double() ** 2).mean(-1, keepdim=True) + 1e-5).float()
    assert torch.allclose(norm(x), ref, atol=1e-5)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(kv_heads=3), "kv_heads"), (dict(mlp="swiglu"), "ffn_hidden"),
    (dict(norm="batchnorm"), "norm must be one of"), (dict(positions="alibi"), "positions"),
])
def test_bad_llama_configs_say_what_is_wrong(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        GPTConfig(layers=1, d_model=64, heads=8, **kwargs)


def test_llama_step_has_the_kernels_torchtitan_runs():
    # analysis of a 2-layer llama3-8b at 256 tokens: 7 GEMMs per block forward (q, k, v, o,
    # w1, w3, w2) with k and v at 1,024 outputs, fused attention, no LayerNorm kernels
    from dlperf.analysis.api import AnalysisConfig, analyze_model
    from dlperf.models.gpt import gpt_config

    cfg = gpt_config("llama3-8b", layers=2, seq_len=256)
    with torch.device("meta"):
        model = GPT(cfg)
    a = analyze_model(model, AnalysisConfig(model="llama3-8b", input_shape=(1, 256),
                                            dtype="bf16", train=True, tokens=True,
                                            device="h100-sxm", optimizer="adamw"),
                      input_dtype=torch.long)
    fwd = [p.cost for p in a.predictions if p.cost.phase == "forward"
           and p.cost.module.startswith("blocks.0.") and p.cost.kind == "gemm"]
    assert [c.module.split(".")[-1] for c in fwd] == ["wq", "wk", "wv", "wo", "fc", "gate", "out"]
    assert [c.gemm.m for c in fwd][:3] == [4096, 1024, 1024]  # M = output features
    assert any(p.cost.kind == "fused" for p in a.predictions)
    assert not any("layer_norm" in p.cost.op for p in a.predictions)


def _llama_analysis(policy, layers: int = 2, every: int = 1):
    from dlperf.analysis.api import AnalysisConfig, analyze_model
    from dlperf.models.gpt import gpt_config

    cfg = gpt_config("llama3-8b", layers=layers, seq_len=256)
    with torch.device("meta"):
        model = GPT(cfg)
    return analyze_model(model, AnalysisConfig(
        model="llama3-8b", input_shape=(1, 256), dtype="bf16", train=True, tokens=True,
        device="h100-sxm", optimizer="adamw", activation_checkpointing=policy is not None,
        checkpoint_policy=policy or "full", checkpoint_every=every), input_dtype=torch.long)


def test_checkpointing_every_nth_block_recomputes_those_blocks_only():
    # fms-fsdp's apply_fsdp_checkpointing and torchtitan's layer-selective AC count the blocks
    # from 1 as they wrap them and checkpoint when count % n == 0: of 4 blocks, n = 2 takes
    # blocks.1 and blocks.3, n = 3 blocks.2 alone, n = 1 all four.
    from dlperf.analysis.api import every_nth_block

    blocks = {f"blocks.{i}" for i in range(12)}
    assert every_nth_block(blocks, 2) == {f"blocks.{i}" for i in (1, 3, 5, 7, 9, 11)}
    # (model order, not string order: blocks.10 comes after blocks.9)
    assert every_nth_block(blocks, 5) == {"blocks.4", "blocks.9"}
    assert every_nth_block(blocks, 1) == blocks

    runs = {e: _llama_analysis(None if e == 0 else "full", 6, max(e, 1))
            for e in (0, 1, 2, 3, 6)}  # (0: no checkpointing)

    def recomputed(a):
        return {int(p.cost.module.split(".")[1]) for p in a.predictions
                if p.cost.phase == "recompute"}

    assert recomputed(runs[1]) == {0, 1, 2, 3, 4, 5}
    assert recomputed(runs[2]) == {1, 3, 5}
    assert recomputed(runs[3]) == {2, 5}
    assert recomputed(runs[0]) == set()

    # the recomputed FLOPs are exactly those of the checkpointed blocks (a decoder's blocks
    # are equal): half of full's with n = 2, a third with n = 3
    def flops(a):
        return sum(p.cost.flops for p in a.predictions if p.cost.phase == "recompute")

    assert flops(runs[2]) == flops(runs[1]) / 2 and flops(runs[3]) == flops(runs[1]) / 3
    # memory at the peak, by hand, for 6 equal blocks each saving s, with input i (held by a
    # checkpoint) and r = s - i recomputed in its backward, O outside the blocks:
    #   full: O + 6 i + r (the last block's backward);
    #   n = 2 (wraps 2, 4, 6): in the 6th's backward s + i + s + i + s before it, + i + r:
    #     O + 3 s + 3 i + r;
    #   n = 3 (wraps 3, 6): s + s + i + s + s, + i + r = O + 4 s + 2 i + r;
    #   n = 6 (wraps the last only): O + 5 s + i + r = O + 6 s, nothing saved at the peak;
    #   none: O + 6 s.
    # So n2 - full = 3 (s - i) = 3 (n3 - n2) (up to the first block's input, which is the
    # embedding's output: 128 KiB here), none - n3 = 2 s - 2 i - r = s - i = n3 - n2, and
    # n6 = none.
    act = {e: a.memory["activations_bytes"] for e, a in runs.items()}
    assert act[1] < act[2] < act[3] < act[0]
    assert act[2] - act[1] == pytest.approx(3 * (act[3] - act[2]), rel=1e-3)
    assert act[0] - act[3] == act[3] - act[2]
    assert act[6] == act[0]


def test_checkpoint_every_refuses_what_it_cannot_mean(capsys):
    from conftest import run_cli

    base = ["analyze", "llama3-8b", "--layers", "4", "--seq-len", "128", "--batch-size", "1",
            "--train"]
    code, out, err = run_cli(base + ["--checkpoint-every", "2"], capsys)
    assert code != 0 and "add --activation-checkpointing" in err and "Traceback" not in err
    code, out, err = run_cli(base + ["--activation-checkpointing", "selective-op",
                                     "--checkpoint-every", "2"], capsys)
    assert code != 0 and "--activation-checkpointing full, not selective-op" in err
    code, out, err = run_cli(base + ["--activation-checkpointing", "--checkpoint-every", "5"],
                             capsys)
    assert code != 0 and "has 4 blocks" in err and "at most 4" in err
    code, out, err = run_cli(base + ["--activation-checkpointing", "--checkpoint-every", "2",
                                     "--top", "1"], capsys)
    assert code == 0, err


def test_cli_rope_picks_the_stack_and_refuses_what_it_cannot_mean(capsys, tmp_path):
    import json

    from conftest import run_cli

    from dlperf.cli import build_parser
    from dlperf.models.gpt import ROPE_FORMS

    analyze = build_parser()._subparsers._group_actions[0].choices["analyze"]
    flag = next(a for a in analyze._actions if "--rope" in a.option_strings)
    assert tuple(flag.choices) == ROPE_FORMS  # the CLI's list is the model's
    base = ["analyze", "llama2-7b", "--layers", "1", "--seq-len", "256", "--batch-size", "1",
            "--train", "--dtype", "bf16", "--top", "1"]
    step = {}
    fsdp = ["--precision", "fsdp"]  # the residual stream in bf16, as FSDP's runs keep it
    for form in ROPE_FORMS:
        out_json = tmp_path / f"{form}.json"
        code, out, err = run_cli(base + fsdp + ["--rope", form, "--json", str(out_json)],
                                 capsys)
        assert code == 0, err
        step[form] = json.loads(out_json.read_text())["totals"]["bytes"]
    # fms's FP32 rotation matrices move the most bytes (36 B per element of q and k against
    # 20 B forward: test_each_rope_form_moves_the_bytes_of_its_stack_counted_by_hand)
    assert step["matrix"] > step["complex"] and step["matrix"] > step["half"]
    code, out, err = run_cli(["analyze", "gpt2", "--layers", "1", "--rope", "half"], capsys)
    assert code != 0 and "--rope: gpt2 has learned positions" in err and "Traceback" not in err
    code, out, err = run_cli(base + fsdp + ["--rope", "half", "--tp-impl", "te"], capsys)
    assert code != 0 and "--tp-impl te runs TransformerEngine's fused one" in err


def test_cli_attention_kernel_sets_the_attention_share(capsys, tmp_path):
    import json

    from conftest import run_cli

    from dlperf.hardware.efficiency import ATTENTION_KERNELS

    from dlperf.cli import build_parser

    analyze = build_parser()._subparsers._group_actions[0].choices["analyze"]
    flag = next(a for a in analyze._actions if "--attention-kernel" in a.option_strings)
    assert tuple(flag.choices) == ATTENTION_KERNELS and flag.default is None  # (the preset's)
    base = ["analyze", "llama3-8b", "--layers", "1", "--seq-len", "4096", "--batch-size", "1",
            "--train", "--precision", "fsdp", "--device", "a100-80gb", "--top", "1"]
    attention = {}
    for kernel in ATTENTION_KERNELS:
        out_json = tmp_path / f"{kernel}.json"
        code, out, err = run_cli(base + ["--attention-kernel", kernel, "--json", str(out_json)],
                                 capsys)
        assert code == 0, err
        layers = json.loads(out_json.read_text())["layers"]
        attention[kernel] = sum(l["predicted_time_s"] for l in layers if l["kind"] == "fused")
        assert f"attention: {kernel}" in out.replace("\n", " ") or kernel != "flash2"
    # the same FLOPs at 0.553 and at 0.325 of the peak: 1.70x the time on the 2023 kernel;
    # the A100 has no cuDNN share: the generic one, as the 2023 kernel's
    assert attention["triton-2023"] / attention["flash2"] == pytest.approx(0.553 / 0.325,
                                                                          rel=0.02)
    assert attention["cudnn"] == pytest.approx(attention["triton-2023"])
    hopper = {}
    for kernel in ("flash2", "cudnn"):
        out_json = tmp_path / f"h100-{kernel}.json"
        code, out, err = run_cli(base[:-4] + ["--device", "h100-sxm", "--top", "1",
                                              "--attention-kernel", kernel, "--json",
                                              str(out_json)], capsys)
        assert code == 0, err
        layers = json.loads(out_json.read_text())["layers"]
        hopper[kernel] = sum(l["predicted_time_s"] for l in layers if l["kind"] == "fused")
    # Hopper: FlashAttention-2 at 0.262 of the peak, cuDNN's at 0.475 (1.81x faster)
    assert hopper["flash2"] / hopper["cudnn"] == pytest.approx(0.475 / 0.262, rel=0.02)
    code, out, err = run_cli(base + ["--attention-kernel", "flash3"], capsys)
    assert code != 0 and "invalid choice: 'flash3'" in err
    # the MPT presets default to the kernel MosaicML's published runs used; a flag overrides
    mpt = ["analyze", "mpt-125m", "--layers", "1", "--seq-len", "512", "--batch-size", "1",
           "--train", "--precision", "fsdp", "--device", "a100-80gb", "--top", "1"]
    for extra, kernel in (([], "triton-2023"), (["--attention-kernel", "flash2"], "flash2")):
        out_json = tmp_path / f"mpt-{kernel}.json"
        code, out, err = run_cli(mpt + extra + ["--json", str(out_json)], capsys)
        assert code == 0, err
        assert json.loads(out_json.read_text())["config"]["attention_kernel"] == kernel


def test_selective_op_checkpointing_recomputes_what_torchtitans_policy_does():
    # torchtitan's op-level policy keeps the outputs of attention and of the 1st, 3rd, 5th and
    # 7th aten.mm of a block (q, v, w1, w2) and recomputes the rest: of the GEMMs, k, o and w3
    # (the 2nd, 4th, 6th); full checkpointing replays every kernel up to the last one the
    # backward needs.
    none, full, sel = (_llama_analysis(p) for p in (None, "full", "selective-op"))
    recompute = {name: [p.cost for p in a.predictions if p.cost.phase == "recompute"
                        and p.cost.module.startswith("blocks.0.")]
                 for name, a in (("full", full), ("sel", sel))}
    assert not any(p.cost.phase == "recompute" for p in none.predictions)
    gemms = [c.module.split(".")[-1] for c in recompute["sel"] if c.kind == "gemm"]
    assert gemms == ["wk", "wo", "gate"]
    assert not any(c.kind == "fused" for c in recompute["sel"])
    full_gemms = [c.module.split(".")[-1] for c in recompute["full"] if c.kind == "gemm"]
    assert full_gemms[:6] == ["wq", "wk", "wv", "wo", "fc", "gate"]
    assert any(c.kind == "fused" for c in recompute["full"])
    # recomputed FLOPs per block: k (256 x 1024 x 4096), o (256 x 4096 x 4096) and w3
    # (256 x 14336 x 4096) GEMMs, 2 FLOPs per multiply-add
    sel_flops = sum(c.flops for c in recompute["sel"] if c.kind == "gemm")
    assert sel_flops == 2 * 256 * 4096 * (1024 + 4096 + 14336)
    # and the memory: selective keeps more than full, less than none
    assert (full.memory["activations_bytes"] < sel.memory["activations_bytes"]
            < none.memory["activations_bytes"])


def test_cli_selective_checkpointing_and_fsdp_scale_out_in_tokens(capsys):
    from conftest import run_cli

    code, out, err = run_cli(["analyze", "llama3-8b", "--layers", "1", "--seq-len", "128",
                              "--batch-size", "1", "--train", "--activation-checkpointing",
                              "selective-op", "--gpus", "16", "--strategy", "fsdp",
                              "--interconnect", "nvlink4-h100,ib-ndr", "--top", "3"], capsys)
    assert code == 0, err
    assert "recompute" in out and "tokens/s per GPU" in out and "per GPU tokens/s" in out
    code, out, err = run_cli(["analyze", "llama3-8b", "--layers", "1", "--seq-len", "128",
                              "--activation-checkpointing", "everything", "--train"], capsys)
    assert code != 0 and "selective-op" in err


def test_math_attention_equals_the_fused_kernel_in_float64():
    # the same weights through F.scaled_dot_product_attention and through Q Kᵀ, the causal
    # mask, softmax and times V: one function, computed twice
    for extra in ({}, {"positions": "rope", "kv_heads": 2, "norm": "rmsnorm"}):
        torch.manual_seed(0)
        fused = GPT(GPTConfig(layers=2, d_model=64, heads=4, vocab=128, seq_len=16,
                              **extra)).double()
        explicit = GPT(GPTConfig(layers=2, d_model=64, heads=4, vocab=128, seq_len=16,
                                 attention="math", **extra)).double()
        explicit.load_state_dict(fused.state_dict())
        x = torch.randint(0, 128, (2, 16))
        torch.testing.assert_close(explicit(x), fused(x), rtol=1e-10, atol=1e-10)


def test_math_attention_and_dropout_are_the_kernels_a_user_runs():
    import collections

    from dlperf.analysis.api import AnalysisConfig, capture_costs

    cfg = GPTConfig(layers=2, d_model=256, heads=8, vocab=1024, seq_len=128, attention="math",
                    dropout=0.1)
    with torch.device("meta"):
        model = GPT(cfg)
    # the model run in bf16 without autocast (Megatron's --fp16 way: no fp32 softmax)
    acfg = AnalysisConfig(model="gpt", input_shape=(4, 128), dtype="bf16", train=True,
                          device="h100-sxm", tokens=True, optimizer="adamw", precision="fsdp")
    costs, uncounted, _, _ = capture_costs(model, acfg, torch.long)
    assert not uncounted
    forward = collections.Counter(c.op for c in costs if c.phase == "forward")
    # per block: Q Kᵀ and times V, the mask, the softmax; dropout on the probabilities and on
    # the two outputs (3 a block), and one after the embeddings
    assert forward["bmm"] == 2 * 2 and forward["masked_fill"] == 2 and forward["_softmax"] == 2
    assert forward["native_dropout"] == 3 * 2 + 1 and "attention" not in forward
    # the scores [4, 8, 128, 128] in bf16: the softmax reads and writes them once each
    softmax = [c for c in costs if c.op == "_softmax" and c.phase == "forward"][0]
    assert softmax.bytes == 2 * 4 * 8 * 128 * 128 * 2
    with pytest.raises(ValueError, match="dropout"):
        GPTConfig(dropout=1.0)
    with pytest.raises(ValueError, match="attention"):
        GPTConfig(attention="flash")


def test_selective_attention_checkpointing_recomputes_the_attention_core_only():
    # Megatron's selective recompute on a GPT-2 block with explicit attention: the backward
    # replays Q Kᵀ, the mask, softmax, the probabilities' dropout and times V (and the layout
    # copies around them), no projection, norm or MLP kernel
    from dlperf.analysis.api import AnalysisConfig, analyze_model

    cfg = GPTConfig(layers=2, d_model=256, heads=8, vocab=1024, seq_len=128, bias=True,
                    attention="math", dropout=0.1)
    with torch.device("meta"):
        model = GPT(cfg)

    def analysis(policy):
        return analyze_model(model, AnalysisConfig(
            model="gpt", input_shape=(4, 128), dtype="fp16", precision="fsdp", train=True,
            tokens=True, device="a100-80gb", optimizer="adamw",
            activation_checkpointing=policy is not None, checkpoint_policy=policy or "full"),
            input_dtype=torch.long)

    none, full, sel = (analysis(p) for p in (None, "full", "selective-attention"))
    replay = [p.cost for p in sel.predictions if p.cost.phase == "recompute"
              and p.cost.module.startswith("blocks.0.")]
    assert {c.module for c in replay} == {"blocks.0.attn"}
    ops = [c.op for c in replay]
    assert ops.count("bmm") == 2 and {"masked_fill", "_softmax", "native_dropout"} <= set(ops)
    assert not any(c.op in ("mm", "addmm", "native_layer_norm", "gelu") for c in replay)
    # recomputed FLOPs per block: Q Kᵀ and times V, 2 x (4 x 8 heads x 128 x 128 x 32) MACs x 2,
    # plus the scaling of Q (4 x 128 x 256 multiplies) and the softmax's own FLOPs
    bmm_flops = sum(c.flops for c in replay if c.op == "bmm")
    assert bmm_flops == 2 * 2 * 4 * 8 * 128 * 128 * 32
    # memory between no checkpointing and full, and less time than full
    assert (full.memory["activations_bytes"] < sel.memory["activations_bytes"]
            < none.memory["activations_bytes"])
    total = {n: sum(p.time_s for p in a.predictions) for n, a in
             (("none", none), ("full", full), ("sel", sel))}
    assert total["none"] < total["sel"] < total["full"]


def test_selective_attention_on_a_fused_kernel_frees_its_log_sum_exp_not_its_output():
    # Megatron's selective recompute checkpoints the attention core normally: its output
    # stays alive (here the output projection reads and keeps it), and what the fused kernel
    # saved besides its inputs goes: the FP32 log-sum-exp, 2 x 8 heads x 128 x 4 B = 8,192 B
    # a block; one block's back during its backward, so 2 blocks keep 8,192 B less. (It once
    # counted the output as freed and the projections' output as held, and kept more than
    # no recompute at all.)
    from dlperf.analysis.api import AnalysisConfig, capture_costs

    cfg = GPTConfig(layers=2, d_model=256, heads=8, vocab=1024, seq_len=128, bias=True)
    with torch.device("meta"):
        model = GPT(cfg)

    def memory(policy):
        return capture_costs(model, AnalysisConfig(
            model="gpt", input_shape=(2, 128), dtype="bf16", precision="fsdp", train=True,
            tokens=True, optimizer="adamw", activation_checkpointing=policy is not None,
            checkpoint_policy=policy or "full"), torch.long)[3]

    none, sel = memory(None), memory("selective-attention")
    assert none["activations_bytes"] - sel["activations_bytes"] == 8_192
    # and at the step's peak (the loss's backward), both blocks' are freed
    assert none["activations_peak_bytes"] - sel["activations_peak_bytes"] == 2 * 8_192


def test_sdpa_kernel_follows_pytorchs_own_backend_order():
    from dlperf.hardware.efficiency import sdpa_kernel

    h200, a100, b200 = (get_device(n) for n in ("h200", "a100-80gb", "b200"))
    # torch 2.11 with its bundled cuDNN 9.19 on Hopper: cuDNN first (what the lent H200 ran)
    assert sdpa_kernel(h200, "2.11.0+cu130", 91900, environ={})[0] == "cudnn"
    # cuDNN 9.15.0 is below the gate (> 9.15.0: 9.15.1 fixed lengths not multiples of 128)
    assert sdpa_kernel(h200, "2.10.0", 91500, environ={})[0] == "flash2"
    assert sdpa_kernel(h200, "2.10.0", 91501, environ={})[0] == "cudnn"
    # Trainy's NGC 25.05 stack (torch 2.8, cuDNN 9.10), and 2.9's wheels (cuDNN 9.10):
    # FlashAttention-2
    assert sdpa_kernel(h200, "2.8.0a0", 91001, environ={})[0] == "flash2"
    assert sdpa_kernel(h200, "2.9.1+cu128", 91002, environ={})[0] == "flash2"
    # the environment switch PyTorch reads
    kernel, why = sdpa_kernel(h200, "2.14.1", 92400,
                              environ={"TORCH_CUDNN_SDPA_DEPRIORITIZED": "1"})
    assert kernel == "flash2" and "TORCH_CUDNN_SDPA_DEPRIORITIZED" in why
    # ... read as PyTorch reads it (c10::utils::check_env): "0" leaves cuDNN first
    assert sdpa_kernel(h200, "2.14.1", 92400,
                       environ={"TORCH_CUDNN_SDPA_DEPRIORITIZED": "0"})[0] == "cudnn"
    # an A100 (sm80) keeps FlashAttention-2 at any version; B200 (sm100) is on the list
    assert sdpa_kernel(a100, "2.14.1", 92400, environ={})[0] == "flash2"
    assert sdpa_kernel(b200, "2.14.1", 92400, environ={})[0] == "cudnn"
    # a CPU-only PyTorch has no cuDNN to ask: its version stands for its CUDA wheels'
    assert sdpa_kernel(h200, "2.11.0+cpu", None, environ={})[0] == "cudnn"
    assert sdpa_kernel(h200, "2.10.1+cpu", None, environ={})[0] == "flash2"
    assert "cuDNN 9.19.0" in sdpa_kernel(h200, "2.11.0", 91900, environ={})[1]


def test_analyze_times_the_attention_the_installed_torch_would_run(capsys, tmp_path,
                                                                   monkeypatch):
    import json

    from conftest import run_cli

    import dlperf.hardware.efficiency as eff

    base = ["analyze", "llama3-8b", "--layers", "1", "--seq-len", "4096", "--batch-size", "1",
            "--train", "--precision", "fsdp", "--top", "1"]
    chosen = {}
    for device in ("h100-sxm", "a100-80gb"):
        out_json = tmp_path / f"{device}.json"
        code, out, err = run_cli(base + ["--device", device, "--json", str(out_json)], capsys)
        assert code == 0, err
        chosen[device] = json.loads(out_json.read_text())["config"]["attention_kernel"]
        assert f"fused attention ({chosen[device]})" in " ".join(out.split())
    assert chosen == {"h100-sxm": eff.sdpa_kernel(get_device("h100-sxm"))[0],
                      "a100-80gb": "flash2"}
    # with TORCH_CUDNN_SDPA_DEPRIORITIZED, as PyTorch itself, FlashAttention-2 on the H100
    monkeypatch.setenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", "1")
    out_json = tmp_path / "deprioritized.json"
    code, out, err = run_cli(base + ["--device", "h100-sxm", "--json", str(out_json)], capsys)
    assert code == 0, err
    assert json.loads(out_json.read_text())["config"]["attention_kernel"] == "flash2"
    # the validation scripts name a stack's kernel; without a device, FlashAttention-2
    from dlperf.models.gpt import default_attention_kernel

    assert default_attention_kernel("llama3-8b") == "flash2"
    assert default_attention_kernel("mpt-7b", get_device("h100-sxm")) == "triton-2023"


def test_a_device_comparison_times_each_gpu_with_its_own_attention_kernel(capsys, tmp_path):
    import json

    from conftest import run_cli

    from dlperf.hardware.efficiency import sdpa_kernel

    base = ["analyze", "llama3-8b", "--layers", "1", "--seq-len", "4096", "--batch-size", "1",
            "--train", "--precision", "fsdp", "--top", "1"]
    out_json = tmp_path / "both.json"
    code, out, err = run_cli(base + ["--device", "a100-80gb,h100-sxm", "--json",
                                     str(out_json)], capsys)
    assert code == 0, err
    rows = {r["device"]: r for r in json.loads(out_json.read_text())["comparison"]}
    h100 = sdpa_kernel(get_device("h100-sxm"))[0]
    assert rows["a100-80gb"]["attention_kernel"] == "flash2"
    assert rows["h100-sxm"]["attention_kernel"] == h100
    # the H100's row is the H100 analysed alone
    alone = tmp_path / "h100.json"
    code, out, err = run_cli(base + ["--device", "h100-sxm", "--json", str(alone)], capsys)
    assert code == 0, err
    assert rows["h100-sxm"]["predicted_time_s"] == pytest.approx(
        json.loads(alone.read_text())["totals"]["predicted_time_s"], rel=1e-9)
    # a kernel given applies to every device
    code, out, err = run_cli(base + ["--device", "a100-80gb,h100-sxm",
                                     "--attention-kernel", "flash2", "--json", str(out_json)],
                             capsys)
    assert code == 0, err
    assert {r["attention_kernel"] for r in json.loads(out_json.read_text())["comparison"]} == {
        "flash2"}
