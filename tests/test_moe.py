"""Mixtures of experts and expert parallelism (analyze --experts/--ep): the built-in decoder's
MoE layer (models/gpt.py ``MoE``), one expert-parallel rank's step, the all-to-alls that join
the ranks and the experts' gradients over their own replicas (analysis/scaling.py
``alltoall_s``, ``expert_parallel_s``)."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from dlperf.analysis.api import AnalysisConfig, capture_costs, predict_on
from dlperf.analysis.scaling import (ScaleConfig, allreduce_s, alltoall_s, expert_parallel_s,
                                     scale_out)
from dlperf.errors import DlperfError
from dlperf.hardware.interconnect import PRESETS
from dlperf.hardware.specs import get_device
from dlperf.models.gpt import GPT, GPTConfig, expert_parameters, gpt_config


def test_mixtral_presets_have_the_released_parameter_counts():
    # Mixtral 8x7B by hand (arXiv 2401.04088 Table 1; config.json: dim 4096, 32 layers, 32
    # heads of 128, 8 K/V heads, hidden 14336, vocabulary 32000, 8 experts, no biases):
    # embeddings and output layer 2 x 32000 x 4096 = 262,144,000; a block: q and o 2 x 4096^2
    # = 33,554,432, k and v 2 x 4096 x 1024 = 8,388,608, router 4096 x 8 = 32,768, experts
    # 8 x 3 x 4096 x 14336 = 1,409,286,144, two norms 8,192: 1,451,270,144; 32 of them plus the
    # final norm's 4,096: 46,702,792,704 (Hugging Face's count for the checkpoint)
    # Mixtral 8x22B (dim 6144, 56 layers, 48 heads, hidden 16384, vocabulary 32768): 2 x 32768
    # x 6144 = 402,653,184; a block 2 x 6144^2 + 2 x 6144 x 1024 + 6144 x 8 + 8 x 3 x 6144 x
    # 16384 + 2 x 6144 = 2,504,060,928; x 56 + 6,144: 140,630,071,296
    for name, want in (("mixtral-8x7b", 46_702_792_704), ("mixtral-8x22b", 140_630_071_296)):
        with torch.device("meta"):
            model = GPT(gpt_config(name))
        assert sum(p.numel() for p in model.parameters()) == want
    # one of 8 expert-parallel ranks holds one expert a block: 1,451,270,144 - 7/8 of the
    # experts' 1,409,286,144 = 218,145,518 a block
    with torch.device("meta"):
        rank = GPT(gpt_config("mixtral-8x7b", ep=8))
    assert sum(p.numel() for p in rank.parameters()) == 32 * (
        1_451_270_144 - 1_409_286_144 * 7 // 8) + 262_144_000 + 4096


def _tiny(**kw) -> GPTConfig:
    return GPTConfig(**{**dict(layers=2, d_model=64, heads=4, kv_heads=2, vocab=100, seq_len=16,
                               norm="rmsnorm", mlp="swiglu", ffn_hidden=128, positions="rope",
                               tie_embeddings=False, experts=4, top_k=2), **kw})


def test_the_experts_flops_match_torch_s_flop_counter_and_the_hand_count():
    # 3 sequences of 16 tokens, top-2 of 4 experts: 96 token copies, 24 an expert; each
    # expert a SwiGLU of 64 -> 128 -> 64: three batched GEMMs of 24 x 64 x 128 an expert,
    # 2 x 96 x 64 x 128 = 1,572,864 FLOPs each, x 3 = 4,718,592 forward a layer, twice that
    # backward: 14,155,776 a layer, 28,311,552 for two
    torch.manual_seed(0)
    model = GPT(_tiny())
    tokens = torch.randint(0, 100, (3, 16))
    with FlopCounterMode(display=False) as counter:
        model(tokens).float().sum().backward()
    counted = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    assert counted["aten.bmm"] == 28_311_552
    with torch.device("meta"):
        meta = GPT(_tiny())
    acfg = AnalysisConfig(model="gpt", input_shape=(3, 16), dtype="fp32", train=True,
                          device="h100-sxm", tokens=True, optimizer="adamw")
    costs, *_ = capture_costs(meta, acfg, torch.long)
    assert sum(c.flops for c in costs if c.op == "bmm") == 28_311_552
    # and the router, attention projections and output layer as torch counts them
    assert sum(c.flops for c in costs if c.op in ("mm", "addmm")) == counted["aten.mm"]
    # every op of the layer has a cost rule (the copies' token index, floor_divide, too)
    _, uncounted, *_ = capture_costs(meta, acfg, torch.long)
    assert not uncounted


def _capture(checkpoint: bool = False, **kw):
    """One rank of a small Mixtral-form decoder (d 256, 4 experts of 512, top 2, 128 tokens,
    batch 2), bf16, training on the H100 preset: (config, model, analysis)."""
    cfg = gpt_config("mixtral-8x7b", layers=2, d_model=256, heads=8, vocab=1024, seq_len=128,
                     ffn_hidden=512, experts=4, **kw)
    with torch.device("meta"):
        model = GPT(cfg)
    acfg = AnalysisConfig(model="mixtral-8x7b", input_shape=(2, 128), dtype="bf16",
                          train=True, device="h100-sxm", tokens=True, optimizer="adamw",
                          activation_checkpointing=checkpoint)
    costs, uncounted, seconds, memory = capture_costs(model, acfg, torch.long)
    return cfg, model, predict_on(costs, uncounted, acfg, get_device("h100-sxm"), seconds,
                                  memory=memory)


def _bmm_flops(analysis) -> float:
    return sum(p.cost.flops for p in analysis.predictions if p.cost.op == "bmm")


def test_a_rank_runs_its_experts_on_every_rank_s_tokens_for_them():
    # balanced: a rank's experts take top_k x its own tokens whatever ep is (2 x 256 = 512
    # copies), in groups of 512 / (4 / ep); so its experts' FLOPs do not change with ep
    _, _, one = _capture()
    for ep in (2, 4):
        cfg, model, rank = _capture(ep=ep)
        assert cfg.local_experts == 4 // ep and cfg.expert_rows(256) == 512
        assert _bmm_flops(rank) == pytest.approx(_bmm_flops(one))
        assert model.blocks[0].moe.w1.shape == (4 // ep, 256, 512)
    # the busiest rank at 1.25x its share: 640 copies, 320 a local expert (ep 2)
    cfg, _, busy = _capture(ep=2, expert_load=1.25)
    assert cfg.expert_rows(256) == 640
    assert _bmm_flops(busy) == pytest.approx(1.25 * _bmm_flops(one))


def test_what_a_mixture_of_experts_refuses():
    for kw, words in ((dict(experts=1), "at least 2 experts"),
                      (dict(top_k=9), "top-k from 1"),
                      (dict(ep=3), "expert parallel over 3 GPUs"),
                      (dict(tp=2), "without tensor parallelism"),
                      (dict(expert_load=0.9), "1 or more"),
                      (dict(expert_load=float("nan")), "1 or more"),
                      (dict(expert_load=1.2), "add expert parallelism")):
        with pytest.raises(ValueError, match=words):
            gpt_config("mixtral-8x7b", **kw)
    with pytest.raises(ValueError, match="need a mixture of experts"):
        gpt_config("llama3-8b", ep=2)


def test_the_all_to_all_by_hand():
    node, net = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]
    mib64 = 64 * 2**20
    # 8 ranks in one node: each sends 7/8 of 64 MiB over NVLink at 370 GB/s, plus 2 us
    assert alltoall_s(mib64, 8, 8, node, net) == pytest.approx(mib64 * 7 / 8 / 370e9 + 2e-6)
    # 16 ranks over two nodes: 7/16 inside (NVLink), 8/16 over the rank's own NDR NIC (400
    # Gb/s x 0.92 = 46 GB/s, 6 us), side by side: the NIC's is the longer
    t = alltoall_s(mib64, 16, 8, node, net)
    assert t == pytest.approx(mib64 * 8 / 16 / net.bus_bandwidth + net.latency_s)
    assert net.bus_bandwidth == pytest.approx(46e9)
    # one rank exchanges nothing
    assert alltoall_s(mib64, 1, 8, node, net) == 0.0


def test_the_all_to_alls_of_a_micro_batch_are_counted_per_layer():
    _, _, plain = _capture(ep=2)
    d = expert_parallel_s(plain.predictions, 2, 1000.0, lambda nbytes: nbytes * 1e-9)
    # two layers, dispatch and combine forward and again backward: 8 of 1 us, all exposed
    assert (d["moe_layers"], d["recomputed_layers"], d["alltoalls_per_micro_batch"]) == (2, 0, 8)
    assert d["exposed_s"] == d["busy_s"] == pytest.approx(8e-6)
    # a full activation checkpoint replays the layer's forward and its two all-to-alls
    _, _, ckpt = _capture(ep=2, checkpoint=True)
    d = expert_parallel_s(ckpt.predictions, 2, 1000.0, lambda nbytes: nbytes * 1e-9)
    assert (d["recomputed_layers"], d["alltoalls_per_micro_batch"]) == (2, 12)


def _params(model):
    return [(n, p.numel() * 4) for n, p in model.named_parameters()]


def test_expert_parallel_scale_out_all_to_alls_and_expert_gradients():
    cfg, model, analysis = _capture(ep=4)
    params = _params(model)
    experts = expert_parameters(model)
    assert experts == {f"blocks.{i}.moe.{w}" for i in (0, 1) for w in ("w1", "w3", "w2")}
    node, net = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]
    nbytes = cfg.expert_rows(256) * 256 * 2  # 512 copies x d 256 x bf16
    ep = ScaleConfig(gpus=8, ep=4, ep_bytes=nbytes, expert_params=experts, step_cv=0.0)
    plain = ScaleConfig(gpus=8, step_cv=0.0)
    got = scale_out(analysis, params, ep, node, net)
    d = got["communication"]["expert_parallel"]
    assert d["in_node"] and d["alltoalls_per_micro_batch"] == 8
    assert d["exposed_s"] == pytest.approx(8 * alltoall_s(nbytes, 4, 8, node, net))
    # the experts' gradients are reduced over 8 / 4 = 2 replicas: over the same node, a byte
    # costs what a 2-GPU all-reduce of it costs against an 8-GPU one
    eg = got["communication"]["expert_gradients"]
    ref = 256 * 2**20
    assert eg["replicas"] == 2 and eg["cost_per_byte_vs_dense"] == pytest.approx(
        allreduce_s(ref, 2, 2, node, net, gen=3) / allreduce_s(ref, 8, 8, node, net, gen=3))
    # the buckets: plain DDP's with the expert bytes so priced; exposed on top of them, the
    # all-to-alls (and the copies into and out of the buckets, of the real bytes)
    priced = [(n, b * eg["cost_per_byte_vs_dense"] if n in experts else b) for n, b in params]
    base = scale_out(analysis, priced, plain, node, net)["communication"]
    mine = got["communication"]
    assert (mine["comm_s"], mine["exposed_s"]) == pytest.approx((base["comm_s"],
                                                                 base["exposed_s"]))
    assert got["exposed_comm_s"] == pytest.approx(
        mine["exposed_s"] + mine["bucket_copy_s"] + d["exposed_s"])
    # ep = every replica: each holds its own experts, nothing of theirs is reduced
    alone = scale_out(analysis, params, ScaleConfig(gpus=4, ep=4, ep_bytes=nbytes,
                                                    expert_params=experts), node, net)
    assert alone["communication"]["expert_gradients"]["cost_per_byte_vs_dense"] == 0.0
    # 16 ranks span two nodes: the all-to-all's far half goes over the NIC
    wide = scale_out(analysis, params, ScaleConfig(gpus=16, ep=16, ep_bytes=nbytes,
                                                   expert_params=experts), node, net)
    assert not wide["communication"]["expert_parallel"]["in_node"]
    # the curve starts where the experts fit: at ep GPUs
    from dlperf.analysis.scaling import scaling_curve
    assert [r["gpus"] for r in scaling_curve(analysis, params, ep, node, net)][0] == 4


def test_the_distributed_optimizer_shards_the_experts_state_over_their_replicas():
    cfg, model, analysis = _capture(ep=4)
    params = _params(model)
    experts = expert_parameters(model)
    share = sum(b for n, b in params if n in experts) / sum(b for _, b in params)
    node, net = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]
    got = scale_out(analysis, params, ScaleConfig(
        gpus=16, ep=4, ep_bytes=1 << 20, expert_params=experts, distributed_optimizer=True),
        node, net)["memory_per_gpu"]
    state = analysis.memory["optimizer_state_bytes"]
    # dense state over 16 replicas, the experts' over the 4 that hold the same experts
    assert got["optimizer_state_bytes"] == pytest.approx(state * ((1 - share) / 16 + share / 4))


def test_what_expert_parallel_scale_out_refuses():
    for kw, words in ((dict(gpus=6, ep=4, ep_bytes=1), "--ep 4"),
                      (dict(gpus=8, ep=4), "needs the bytes"),
                      (dict(gpus=8, ep=4, ep_bytes=1, strategy="fsdp"), "--strategy ddp")):
        with pytest.raises(DlperfError, match=words):
            ScaleConfig(**kw)


def test_analyze_ep_prints_and_saves_the_expert_parallel_scale_out(tmp_path, capsys):
    from conftest import run_cli

    path, page = tmp_path / "ep.json", tmp_path / "ep.html"
    common = ["analyze", "mixtral-8x7b", "--layers", "2", "--d-model", "256", "--heads", "8",
              "--vocab", "1024", "--seq-len", "128", "--batch-size", "2", "--dtype", "bf16",
              "--train", "--device", "h100-sxm"]
    code, out, err = run_cli(common + ["--gpus", "16", "--ep", "8", "--json", str(path),
                                       "--html", str(page)], capsys)
    assert code == 0, err
    text = " ".join(out.split())
    assert "8-way expert parallel in the node, DDP)" in text
    assert ("--ep 8: what follows is one expert-parallel rank's step: 1 of each block's 8 "
            "experts") in text
    assert "expert-parallel all-to-alls (tokens to their experts and back) 8 of" in text
    assert "the experts' gradients reduced over 2 replicas" in text
    # (the shipped record: Mixtral's figure, Megatron-Bridge's eight gpt-oss-120b rates, the
    # B200s' at EP 8 the furthest off, the B300s' on NICs the table does not give apart, and
    # its Qwen3-30B-A3B in FP8 across two nodes and in MXFP8 on four Blackwell nodes of 8)
    assert "Expert parallelism is checked against 14 published rates" in text
    assert "Qwen3-30B-A3B FP8, 16 H100s, EP 16" in text
    assert "Qwen3-30B-A3B in MXFP8 on one node of 8" in text
    assert "as up to 1.8x optimistic" in text
    report = " ".join(page.read_text().split())
    assert "8-way expert parallel, 8 all-to-alls a micro-batch" in report
    data = json.loads(path.read_text())
    here = data["scale_out"]["at_requested_scale"]
    d = here["communication"]["expert_parallel"]
    # 2 sequences x 128 tokens x top 2 x d 256 x bf16
    assert d["ep"] == 8 and d["bytes_each"] == 2 * 128 * 2 * 256 * 2
    assert [row["gpus"] for row in data["scale_out"]["curve"]][0] == 8
    for extra, words in ((["--ep", "2"], "--ep 2 splits the experts"),
                         (["--gpus", "8", "--ep", "3"], "--ep 3"),
                         (["--gpus", "8", "--expert-load", "1.5"], "--expert-load"),
                         (["--gpus", "12", "--ep", "8"], "--ep 8"),
                         (["--gpus", "16", "--ep", "8", "--strategy", "fsdp"],
                          "--strategy ddp")):
        code, out, err = run_cli(common + extra, capsys)
        assert code != 0 and words in err, (extra, err)
        assert "Traceback" not in err
    code, out, err = run_cli(["analyze", "resnet18", "--experts", "8"], capsys)
    assert code != 0 and "--experts" in err and "Traceback" not in err


def test_megatron_s_mixtral_count_and_the_readme_run_by_hand():
    from conftest import load_benchmark

    tp = load_benchmark("validate_tp")
    # Megatron-Core's count for Mixtral 8x7B at 4,096 tokens: 12 x 32 x 4096^2 = 6,442,450,944
    # times (1 + 8/32 + 4096/4096) + 14336/4096 x 2 x 3/2 + 32000 / (2 x 32 x 4096) =
    # 2.25 + 10.5 + 0.1220703125 = 12.8720703125: 82,927,681,536 FLOPs a token; 468 TFLOP/s
    # is then 5,643 tokens/s a GPU, a step of 256 x 4,096 tokens on 64 GPUs in 2.90 s
    assert tp.mixtral_flops_per_token(4096) == 82_927_681_536
    assert tp.MIXTRAL_TFLOPS * 1e12 / 82_927_681_536 == pytest.approx(5643.47, abs=0.01)
    args = tp.mixtral_args(8, 0.304)
    # 64 GPUs over 4 stages: 16 replicas, each 256 / 16 = 16 micro-batches of one sequence;
    # buckets of max(40M, 16M) fp32 parameters = 152.6 MiB
    for flag, value in (("--gpus", "64"), ("--ep", "8"), ("--pp", "4"), ("--pp-virtual", "8"),
                        ("--grad-accum", "16"), ("--batch-size", "1"),
                        ("--bucket-cap-mb", "152.6"), ("--tp-impl", "te")):
        assert args[args.index(flag) + 1] == value
    assert "--pp-overlap-p2p" in args and "--pp-overlap-p2p" not in tp.mixtral_args(1, 0.304)


def test_the_expert_parallel_record_reads_the_saved_mixtral_rows():
    from dlperf.hardware.track_record import build_expert_parallel, describe_expert_parallel

    rows = [{"virtual": v, "attention": a, "ratio": r}
            for v, a, r in ((1, 0.304, 0.80), (1, 0.187, 0.77), (1, 0.524, 0.82),
                            (8, 0.304, 0.92), (8, 0.187, 0.88), (8, 0.524, 0.95))]
    entry = build_expert_parallel({"rows": rows})
    assert (entry["ratio_1f1b"], entry["ratio_interleaved"]) == (0.80, 0.92)
    assert (entry["ratio_low"], entry["ratio_high"]) == (0.77, 0.95)
    text = describe_expert_parallel({"expert_parallel": entry})
    assert "predicted 0.92x its TFLOPS with one block a virtual stage and 0.80x" in text
    assert "0.77-0.95x" in text
    assert describe_expert_parallel({}).startswith("Expert parallelism is not yet checked")
    # the shipped record holds the saved file's reading (benchmarks/track_record.py)
    assert "Mixtral 8x7B" in describe_expert_parallel()
