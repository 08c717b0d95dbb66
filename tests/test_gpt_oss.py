"""gpt-oss's decoder (models/gpt.py presets gpt-oss-20b and gpt-oss-120b): heads whose size is
not d_model / heads, attention with a sliding window and sinks as one fused kernel
(models/banded.py) charged by the tiles the window reaches (analysis/costs.py
``window_fraction``), biases on the router and the experts, and gpt-oss's clamped gated
activation (models/fused.py)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from dlperf.analysis.api import AnalysisConfig, capture_costs, predict_on
from dlperf.analysis.costs import window_fraction
from dlperf.analysis.scaling import expert_parallel_s
from dlperf.hardware.specs import get_device
from dlperf.models import fused
from dlperf.models.banded import banded_attention
from dlperf.models.gpt import GPT, GPTConfig, expert_parameters, gpt_config


def test_gpt_oss_presets_have_the_released_parameter_counts():
    # gpt-oss-120b by hand (config.json: 36 layers of 2,880, 64 heads of 64, 8 K/V heads,
    # 128 experts of 2,880, vocabulary 201,088, biases on the attention and the experts,
    # untied output layer):
    # embeddings and output layer 2 x 201,088 x 2,880 = 1,158,266,880
    # a block: q 2,880 x 4,096 + 4,096 = 11,800,576; k and v 2 x (2,880 x 512 + 512) =
    #   2,950,144; o 4,096 x 2,880 + 2,880 = 11,799,360; sinks 64 -> attention 26,550,144;
    #   two norms 5,760; router 2,880 x 128 + 128 = 368,768; experts 128 x (2,880 x 5,760
    #   + 5,760 + 2,880 x 2,880 + 2,880) = 128 x 24,891,840 = 3,186,155,520:
    #   3,213,080,192 a block
    # 36 blocks + the embeddings + the final norm's 2,880: 116,829,156,672 (the model card's
    # "116.83B"); gpt-oss-20b: 24 blocks of 32 experts: a block 26,550,144 + 5,760 + 2,880 x
    # 32 + 32 + 32 x 24,891,840 = 823,186,976; x 24 + 1,158,266,880 + 2,880 = 20,914,757,184
    # (the card's "20.91B")
    for name, want in (("gpt-oss-120b", 116_829_156_672), ("gpt-oss-20b", 20_914_757_184)):
        with torch.device("meta"):
            model = GPT(gpt_config(name))
        assert sum(p.numel() for p in model.parameters()) == want
    cfg = gpt_config("gpt-oss-120b")
    assert cfg.head_dim == 64 and cfg.d_model // cfg.heads == 45
    # every other block windowed, the 1st, 3rd, ... (Megatron-Core's window_attn_skip_freq 2)
    assert [cfg.block_window(i) for i in range(4)] == [128, 0, 128, 0]
    assert model.blocks[0].attn.window == 128 and model.blocks[1].attn.window == 0


def test_the_window_s_tiles_by_hand():
    # 4,096 tokens in tiles of 128: 32 query tiles; window 128: the first tile reaches only
    # itself, each of the other 31 its own key tile and the one before: 63 of 1,024 tiles
    assert window_fraction(4096, 4096, 128) == pytest.approx(63 / 1024)
    # a window of one token: the diagonal tiles only, 32 of 1,024
    assert window_fraction(4096, 4096, 1) == pytest.approx(32 / 1024)
    # a window as long as the sequence: every tile on or below the diagonal, 32 x 33 / 2
    assert window_fraction(4096, 4096, 4096) == pytest.approx(528 / 1024)
    # window 256: three key tiles for each query tile from the third on: 1 + 2 + 30 x 3
    assert window_fraction(4096, 4096, 256) == pytest.approx(93 / 1024)


def _reference(q, k, v, window, sinks):
    """Causal attention over a band with each head's sink as one more softmax column,
    written out in float64 (the formula of gpt-oss's model card, section 2.1)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    t = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    band = (j <= i) & ((i - j < window) if window else True)
    scores = scores.masked_fill(~band, float("-inf"))
    if sinks is not None:
        column = sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        return torch.cat((scores, column), -1).softmax(-1)[..., :-1] @ v
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("window,with_sinks", [(3, True), (3, False), (0, True)])
def test_banded_attention_and_its_gradients_match_the_formula(window, with_sinks):
    torch.manual_seed(0)
    d64 = dict(dtype=torch.float64, requires_grad=True)
    q = torch.randn(2, 4, 10, 8, **d64)
    k, v = torch.randn(2, 2, 10, 8, **d64), torch.randn(2, 2, 10, 8, **d64)
    sinks = torch.randn(4, **d64) if with_sinks else None
    got = banded_attention(q, k, v, window, sinks)
    want = _reference(q, k, v, window, sinks)
    assert torch.allclose(got, want, atol=1e-12)
    grad = torch.randn_like(got)
    inputs = (q, k, v) + ((sinks,) if with_sinks else ())
    for a, b in zip(torch.autograd.grad(got, inputs, grad),
                    torch.autograd.grad(want, inputs, grad)):
        assert torch.allclose(a, b, atol=1e-12)
    # no window and no sinks: PyTorch's own causal attention
    plain = banded_attention(q, k, v)
    assert torch.allclose(plain, F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                enable_gqa=True), atol=1e-12)


def test_the_clamped_gated_activation_fused_and_op_by_op():
    # gate clamped to at most 7, up to [-7, 7], gate sigmoid(1.702 gate) (up + 1); values on
    # both sides of the clamps, and the fused kernel's gradients against autograd's through
    # the op-by-op form
    gate = torch.tensor([-9.0, -1.0, 0.5, 6.0, 8.0], dtype=torch.float64, requires_grad=True)
    up = torch.tensor([-8.0, -0.5, 2.0, 7.5, 1.0], dtype=torch.float64, requires_grad=True)
    plain = fused.clamped_quick_geglu(gate, up)
    values = plain.detach()
    g7 = torch.tensor(7.0, dtype=torch.float64)
    assert float(values[4]) == pytest.approx(float(g7 * torch.sigmoid(1.702 * g7) * 2.0))
    assert float(values[0]) == pytest.approx(-9.0 * float(torch.sigmoid(torch.tensor(-15.318))) * -6.0)
    one = fused.ClampedQuickGeGLU(fused=True)(gate, up)
    assert torch.allclose(one, plain)
    grad = torch.randn(5, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(one, (gate, up), grad),
                    torch.autograd.grad(plain, (gate, up), grad)):
        assert torch.allclose(a, b)


def _tiny(**kw) -> GPTConfig:
    """gpt-oss's form, small: 4 blocks of 96, 4 heads of 32 (not 96 / 4), 2 K/V heads, a
    window of 64 on 256 tokens, 8 experts of 64, top 2."""
    return dataclasses.replace(gpt_config("gpt-oss-20b"), **{**dict(
        layers=4, d_model=96, heads=4, kv_heads=2, head_size=32, vocab=512, seq_len=256,
        ffn_hidden=64, experts=8, top_k=2, window=64), **kw})


def _analysis(cfg: GPTConfig, batch: int = 2):
    with torch.device("meta"):
        model = GPT(cfg)
    acfg = AnalysisConfig(model="gpt-oss-20b", input_shape=(batch, cfg.seq_len), dtype="bf16",
                          train=True, device="h100-sxm", tokens=True, optimizer="adamw")
    costs, uncounted, seconds, memory = capture_costs(model, acfg, torch.long)
    return model, costs, uncounted, predict_on(costs, uncounted, acfg, get_device("h100-sxm"),
                                               seconds, memory=memory)


def test_a_windowed_block_s_attention_costs_its_tiles():
    model, costs, uncounted, _ = _analysis(_tiny(tp_impl="te"))
    assert not uncounted
    attention = {c.module: c for c in costs if c.op == "attention"}
    # forward FLOPs 4 B H T^2 D x the share computed: B 2, H 4, T 256, D 32 (the head size,
    # not 96 / 4): 4 x 2 x 4 x 65,536 x 32 = 67,108,864 on the whole square; a full block
    # (with its sinks) half of it, a windowed one 2 x 2 - 1 = 3 of its 4 tiles of 128
    full = 67_108_864
    assert attention["blocks.1.attn"].flops == full // 2
    assert attention["blocks.0.attn"].flops == full * 3 // 4
    # one fused kernel a pass: no B x H x T x T scores kept or charged
    assert not any(c.op in ("bmm", "_softmax") and ".attn" in c.module for c in costs)
    backward = [c for c in costs if c.op == "attention_backward"]
    assert len(backward) == 4 and backward[0].flops == pytest.approx(
        attention[backward[0].module].flops * 5 / 2)
    # the gated activation one kernel a pass under TransformerEngine's kernels, and op by
    # op under PyTorch's
    # (the experts' activation weighted by the router inside it: Megatron-Core's
    # weighted_bias_quick_geglu_impl)
    assert sum(c.op == "te_weighted_clamped_geglu" for c in costs) == 4
    _, plain, _, _ = _analysis(_tiny())
    assert not any(c.op.startswith("te_clamped") for c in plain)
    assert sum(c.op == "sigmoid" for c in plain) == 4


def test_gpt_oss_experts_have_biases_and_their_all_to_alls_are_counted():
    cfg = _tiny(ep=2)
    model, costs, _, analysis = _analysis(cfg)
    names = expert_parameters(model)
    assert names == {f"blocks.{i}.moe.{w}" for i in range(4)
                     for w in ("w1", "w3", "w2", "b1", "b3", "b2")}
    assert model.blocks[0].moe.router.bias is not None
    # the experts' GEMMs carry their biases (baddbmm): still four MoE layers, each with its
    # dispatch and combine forward and backward
    assert {c.op for c in costs if c.module.endswith(".moe") and "bmm" in c.op} == {
        "baddbmm", "bmm"}
    d = expert_parallel_s(analysis.predictions, 2, 1000.0, lambda nbytes: 1e-6)
    assert (d["moe_layers"], d["alltoalls_per_micro_batch"]) == (4, 16)


def test_what_the_window_sinks_and_gated_activation_refuse():
    for kw, words in ((dict(attention="math"), "one fused kernel"),
                      (dict(cp=2), "one fused kernel"),
                      (dict(dropout=0.1), "one fused kernel"),
                      (dict(window=0), "it needs a window"),
                      (dict(window=-1), "0 \\(none\\) or positive"),
                      (dict(head_size=0), "head size must be positive")):
        with pytest.raises(ValueError, match=words):
            _tiny(**kw)
    with pytest.raises(ValueError, match="needs mlp 'swiglu'"):
        GPTConfig(glu="clamped-quick-gelu")
    with pytest.raises(ValueError, match="glu must be one of"):
        GPTConfig(mlp="swiglu", ffn_hidden=64, glu="relu")


def test_megatron_s_recompute_modules_replay_the_norms_and_the_experts_activation():
    cfg = _tiny(tp_impl="te")
    with torch.device("meta"):
        model = GPT(cfg)

    def run(policy):
        acfg = AnalysisConfig(model="gpt-oss-20b", input_shape=(2, 256), dtype="bf16",
                              train=True, device="h100-sxm", tokens=True, optimizer="adamw",
                              precision="fsdp", activation_checkpointing=policy is not None,
                              checkpoint_policy=policy or "full")
        return capture_costs(model, acfg, torch.long)

    eager, _, _, eager_memory = run(None)
    costs, _, _, memory = run("modules:layernorm,moe_act")
    replayed = [c for c in costs if c.phase == "recompute"]
    # each of the 4 blocks runs its two norms and its experts' activation again, nothing else
    assert sorted(c.op for c in replayed) == ["te_rms_norm"] * 8 + [
        "te_weighted_clamped_geglu"] * 4
    # and keeps less (the model in BF16, as Megatron runs it): the norms' outputs (2 x 512
    # tokens x 96 x 2 B = 196,608 B a block) and their FP32 1/rms (2 x 512 x 4 B = 4,096 B),
    # the activation's output (512 x 2 copies x 64 x 2 B = 131,072 B); one block's of them
    # back during its backward: 3 blocks' worth, 995,328 B
    saved = eager_memory["activations_bytes"] - memory["activations_bytes"]
    assert saved == 3 * (2 * 512 * 96 * 2 + 2 * 512 * 4 + 512 * 2 * 64 * 2) == 995_328
    # the step's peak is at the loss, where every block's are freed: 4 blocks' worth lower
    assert (eager_memory["activations_peak_bytes"] - memory["activations_peak_bytes"]
            == 4 * 331_776)
    assert memory["peak_at"] == eager_memory["peak_at"] == (
        "loss: _log_softmax_backward_data, dgrad")
    # "core_attn" replays the attention module's own kernels, as selective-attention (its
    # Megatron default) does, and keeps the same
    costs, _, _, core = run("modules:core_attn")
    selective = run("selective-attention")
    assert {c.op for c in costs if c.phase == "recompute"} == {
        c.op for c in selective[0] if c.phase == "recompute"}
    assert core == selective[3]
    # a normal checkpoint around the core: it frees what the core saved inside, the rotated
    # q and k (2 x 256 tokens x 4 heads x 32 x 2 B = 131,072 B; 2 K/V heads: 65,536 B), the
    # output before its layout copy (131,072 B) and the FP32 log-sum-exp (2 x 4 x 256 x 4 B =
    # 8,192 B), 335,872 B a block, and holds its inputs, the projections' q and k (131,072
    # + 65,536 B, which the rotary kernels do not save; v is saved anyway): 139,264 B less a
    # block, one block's 335,872 back during its backward
    assert (eager_memory["activations_bytes"] - core["activations_bytes"]
            == 4 * 139_264 - 335_872 == 221_184)
    assert not [c for c in eager if c.phase == "recompute"]


def test_recompute_modules_on_the_command_line(capsys):
    from dlperf.cli import main as cli

    base = ["analyze", "gpt-oss-20b", "--layers", "2", "--seq-len", "256", "--train",
            "--batch-size", "1", "--tp-impl", "te", "--precision", "fsdp"]
    assert cli(base + ["--recompute-modules", "layernorm"]) == 2
    assert "add --activation-checkpointing modules" in capsys.readouterr().err
    assert cli(base + ["--activation-checkpointing", "modules", "--recompute-modules",
                       "mlp"]) == 2
    err = capsys.readouterr().err
    assert "--recompute-modules mlp: name some of layernorm, moe_act, core_attn" in err
    assert "Traceback" not in err


def test_the_gpt_oss_rows_run_as_their_perf_recipes_say():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "validate_tp.py"
    spec = importlib.util.spec_from_file_location("validate_tp", path)
    tp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tp)
    h100, b200 = tp.GPT_OSS_ROWS[0], tp.GPT_OSS_ROWS[1]
    args = tp.gpt_oss_args(*h100[1:7], 0.304)
    # 1,280 sequences over 64 / 4 = 16 replicas in micro-batches of 1: 80 a step; buckets of
    # max(40M, 16 x 1M) fp32 parameters = 152.6 MiB
    for flag, value in (("--grad-accum", "80"), ("--pp", "4"), ("--ep", "8"),
                        ("--bucket-cap-mb", "152.6"), ("--recompute-modules",
                                                       "layernorm,moe_act"),
                        ("--interconnect", "nvlink4-h100,ib-ndr"), ("--loss", "fused")):
        assert args[args.index(flag) + 1] == value
    # B200s: 64 replicas of micro-batches of 4: 1,280 / 64 / 4 = 5; buckets of 64M: 244.1 MiB
    args = tp.gpt_oss_args(*b200[1:7], None)
    for flag, value in (("--grad-accum", "5"), ("--ep", "64"), ("--batch-size", "4"),
                        ("--bucket-cap-mb", "244.1"), ("--device", "b200")):
        assert args[args.index(flag) + 1] == value
    assert "--pp" not in args and "--efficiency" not in args
    # the rows whose all-to-alls stay on NVLink: B200s at EP 8 in a node, GB200s at EP 64 in
    # one NVL72 rack, whose interconnect makes the 64 GPUs one node
    ep8 = next(r for r in tp.GPT_OSS_ROWS if r[1] == "b200" and r[4] == 8)
    args = tp.gpt_oss_args(*ep8[1:7], None)
    assert args[args.index("--ep") + 1] == "8" and args[args.index("--grad-accum") + 1] == "5"
    gb = next(r for r in tp.GPT_OSS_ROWS if r[1] == "gb200")
    args = tp.gpt_oss_args(*gb[1:7], None)
    assert args[args.index("--interconnect") + 1] == "nvlink5-nvl72,ib-ndr"
    assert args[args.index("--ep") + 1] == "64"


def test_the_expert_parallel_record_reads_the_gpt_oss_rows():
    from dlperf.hardware.track_record import build_expert_parallel, describe_expert_parallel

    mixtral = {"rows": [{"virtual": v, "attention": 0.304, "ratio": r}
                        for v, r in ((1, 0.80), (8, 0.92))]}
    rows = (("h100-sxm", 1.31, "nvlink", "26.02"), ("b200", 1.24, "network", "26.02"),
            ("h100-sxm", 1.30, "nvlink", "25.11"), ("b200", 1.21, "network", "25.11"),
            ("b200", 1.67, "nvlink", "26.04.01"), ("gb200", 1.63, "nvlink", "26.02"))
    bridge = {"rows": [{"device": d, "mcore": {"ratio": r}, "alltoall_over": o, "container": c}
                       for d, r, o, c in rows]}
    entry = build_expert_parallel(mixtral, bridge)
    g = entry["gpt_oss"]
    assert (g["runs"], g["ratio_low"], g["ratio_high"]) == (6, 1.21, 1.67)
    assert g["by_device"]["b200"] == {"low": 1.21, "high": 1.67}
    assert g["by_alltoall"]["nvlink"] == {"low": 1.30, "high": 1.67, "runs": 4}
    # containers sorted as versions: 25.11 before 26.02 before 26.04.01
    assert g["source"].endswith("(NeMo 25.11 to 26.04.01)")
    text = describe_expert_parallel({"expert_parallel": entry})
    assert text.startswith("Expert parallelism is checked against 7 published rates.")
    assert ("predicted 1.21-1.67x their tokens/s (H100s 1.30-1.31x; B200s 1.21-1.67x; "
            "GB200s 1.63x), too fast; the 4 whose all-to-alls stay on NVLink are the furthest "
            "off (1.30-1.67x)") in text
    assert "up to 1.7x optimistic" in text
    # rows of an older record (no alltoall_over) read as crossing the network: no claim
    old = {"rows": [{"device": "b200", "mcore": {"ratio": 1.2}}]}
    text = describe_expert_parallel({"expert_parallel": build_expert_parallel(mixtral, old)})
    assert "stay on NVLink" not in text and "(B200s 1.20x)" in text


def test_the_expert_parallel_record_sets_apart_unknown_nics_and_pairs_gb300_with_gb200():
    """A row saved with its rate on 400 Gb/s NICs (the B300's, whose NICs its table does not
    give) is named on its own, outside the ranges; a GB300 row and a GB200 row of the same
    configuration give the GB300's measured and predicted speed-up over the GB200."""
    from dlperf.hardware.track_record import build_expert_parallel, describe_expert_parallel

    mixtral = {"rows": [{"virtual": 1, "attention": 0.304, "ratio": 0.9}]}
    same = {"ep": 64, "micro_batch": 4, "global_batch": 1280, "container": "26.02"}
    bridge = {"rows": [
        {**same, "device": "gb200", "mcore": {"ratio": 1.63}, "alltoall_over": "nvlink",
         "measured_tokens_per_s_per_gpu": 15784},
        {**same, "device": "gb300", "mcore": {"ratio": 1.37}, "alltoall_over": "nvlink",
         "measured_tokens_per_s_per_gpu": 19412},
        {**same, "device": "b200", "mcore": {"ratio": 1.24}, "alltoall_over": "network",
         "measured_tokens_per_s_per_gpu": 8047},
        {**same, "device": "b300", "mcore": {"ratio": 1.77}, "alltoall_over": "network",
         "measured_tokens_per_s_per_gpu": 8359, "at_400g_nics": {"ratio": 1.21}}]}
    g = build_expert_parallel(mixtral, bridge)["gpt_oss"]
    assert g["unknown_nics"] == [{"device": "b300", "ratio": 1.77, "ratio_400g": 1.21}]
    assert (g["ratio_low"], g["ratio_high"]) == (1.24, 1.63) and "b300" not in g["by_device"]
    text = describe_expert_parallel({"expert_parallel": {"source": "x", "ratio_1f1b": 0.9,
                                                         "ratio_interleaved": 0.9,
                                                         "ratio_low": 0.9, "ratio_high": 0.9,
                                                         "gpt_oss": g}})
    assert ("the B300s' row, whose all-to-alls cross NICs the table does not give, 1.77x on "
            "the 800 Gb/s of their datasheet and 1.21x on 400 Gb/s") in text
    # measured 19,412 / 15,784 = 1.230; predicted (19,412 x 1.37) / (15,784 x 1.63) = 26,594 /
    # 25,728 = 1.034; so a GB300 rate reads 1.230 / 1.034 = 1.19x pessimistic beside a GB200's
    assert ("GB300s ran 1.23x as fast as GB200s on the same configuration (1 pair) where "
            "dlperf predicts 1.03x") in text
    assert "up to 1.19x pessimistic beside a GB200's" in text


def test_the_attention_flags_build_the_config(tmp_path, capsys):
    import json

    from dlperf.cli import main as cli

    out = tmp_path / "r.json"
    assert cli(["analyze", "llama3-8b", "--layers", "2", "--seq-len", "512", "--batch-size",
                "1", "--head-dim", "64", "--sliding-window", "128", "--full-attention-every",
                "2", "--attention-sinks", "--top", "1", "--json", str(out)]) == 0
    kernels = {k["module"]: k for k in json.loads(out.read_text())["layers"]
               if k["op"] == "attention"}
    # 32 heads of 64 (not 4,096 / 32 = 128) over 512 tokens: 4 x 32 x 512^2 x 64 = 2.15
    # GFLOP on the whole square; block 0 windowed (7 of 16 tiles of 128), block 1 the causal
    # half
    full = 4 * 32 * 512 ** 2 * 64
    assert kernels["blocks.0.attn"]["flops"] == full * 7 // 16
    assert kernels["blocks.1.attn"]["flops"] == full // 2
    capsys.readouterr()
    assert cli(["analyze", "resnet50", "--sliding-window", "8"]) == 2
    assert "--sliding-window: only for gpt and its presets" in capsys.readouterr().err
