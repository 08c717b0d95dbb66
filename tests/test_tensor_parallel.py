"""Tensor parallelism (analyze --tp): one Megatron rank's shard of the built-in decoder
(models/gpt.py), the all-reduces that join the ranks, and the data-parallel strategy over the
replicas (analysis/scaling.py)."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from dlperf.analysis.api import AnalysisConfig, capture_costs, predict_on
from dlperf.analysis.scaling import (STEP_CV, ScaleConfig, one_step, scale_out,
                                     sharded_collective_s, straggler_s,
                                     tensor_parallel_collectives)
from dlperf.errors import DlperfError
from dlperf.hardware.interconnect import PRESETS
from dlperf.hardware.specs import get_device
from dlperf.models.gpt import GPT, GPTConfig, gpt_config


def _count(cfg) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in GPT(cfg).parameters())


def test_a_rank_holds_its_share_of_every_split_weight_and_all_of_the_rest():
    # Llama 3 8B over 8 ranks: per block wq + wo 2 x 4096 x 512 (4 of 32 heads of 128), wk + wv
    # 2 x 4096 x 128 (1 of 8 K/V heads), MLP 3 x 4096 x 1792 (14,336 / 8), norms 2 x 4096 whole:
    # 27,271,168; x 32 = 872,677,376; embedding and output 2 x 16,032 x 4096 (128,256 / 8) and
    # the final norm 4,096: 1,004,015,616
    assert _count(gpt_config("llama3-8b", tp=8)) == 32 * (
        2 * 4096 * 512 + 2 * 4096 * 128 + 3 * 4096 * 1792 + 2 * 4096) \
        + 2 * 16032 * 4096 + 4096 == 1_004_015_616
    # two ranks: half of everything split, the norms whole on each
    norms = 32 * 2 * 4096 + 4096
    assert _count(gpt_config("llama3-8b", tp=2)) == (8_030_261_248 - norms) // 2 + norms
    # a vocabulary the ranks do not divide: each slice as wide as the widest (Megatron pads)
    assert gpt_config("gpt2", tp=4).local_vocab == 12565  # ceil(50,257 / 4)


def test_a_split_the_model_cannot_take_is_refused():
    with pytest.raises(ValueError, match="kv_heads"):
        gpt_config("llama3-8b", tp=16)  # 8 K/V heads
    with pytest.raises(ValueError, match="heads"):
        gpt_config("gpt2", tp=8)  # 12 heads
    with pytest.raises(ValueError, match="at least 1"):
        GPTConfig(tp=0)
    # sequence parallel splits the tokens between the blocks: 100 over 8 ranks does not go
    with pytest.raises(ValueError, match="sequence"):
        GPTConfig(layers=1, d_model=64, heads=8, seq_len=100, tp=8)


def test_each_rank_computes_a_tp_th_of_the_flops_and_trains():
    # torch's own FLOP counter, forward and backward, on real CPU tensors: every GEMM and the
    # attention split, so a rank's FLOPs are exactly half at tp=2
    def flops(tp):
        torch.manual_seed(0)
        cfg = GPTConfig(layers=2, d_model=64, heads=4, vocab=128, seq_len=16, tp=tp)
        model = GPT(cfg)
        x = torch.randint(0, 64, (2, 16))
        with FlopCounterMode(display=False) as counter:
            model(x).float().logsumexp(-1).mean().backward()
        assert all(p.grad is not None for p in model.parameters())
        return counter.get_total_flops()

    assert flops(2) * 2 == flops(1)


def test_the_collectives_of_a_micro_batch():
    # 80 blocks, 8,192 tokens of d 8,192 in bf16: 134,217,728 bytes gathered each. All-gathers:
    # forward 2 x 80 + 1 (the output layer's input), backward 2 x 80 + 1 (the embedding's
    # reduce-scatter reversed), a full recompute 2 x 80 more: 482 (322 without it); the
    # reduce-scatters the same
    assert tensor_parallel_collectives(80, 8192, 8192, 2, recompute=True) == (
        ("allgather", 482, 134217728, None), ("reducescatter", 482, 134217728, None))
    assert tensor_parallel_collectives(80, 8192, 8192, 2, recompute=False)[0] == (
        "allgather", 322, 134217728, None)


def _capture(tp: int, layers: int):
    """One rank of a small decoder (d 256, 8 heads, 128 tokens, batch 4), bf16, training on
    the H100 preset: (config, model, analysis config, capture_costs' four results)."""
    cfg = GPTConfig(layers=layers, d_model=256, heads=8, vocab=1024, seq_len=128, tp=tp)
    with torch.device("meta"):
        model = GPT(cfg)
    acfg = AnalysisConfig(model="gpt", input_shape=(4, 128), dtype="bf16", train=True,
                          device="h100-sxm", tokens=True, optimizer="adamw")
    return cfg, model, acfg, capture_costs(model, acfg, torch.long)


def _tiny(tp):
    cfg, model, acfg, (costs, uncounted, seconds, memory) = _capture(tp, layers=4)
    analysis = predict_on(costs, uncounted, acfg, get_device("h100-sxm"), seconds,
                          memory=memory)
    params = [(n, p.numel() * 4) for n, p in model.named_parameters()]
    return cfg, analysis, params


def test_tensor_parallel_adds_its_all_reduces_and_shares_the_replica_s_samples():
    cfg, analysis, params = _tiny(2)
    node, net = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]
    coll = tensor_parallel_collectives(cfg.layers, 4 * 128, cfg.d_model, 2, recompute=False)
    _, count, nbytes, _ = coll[0]
    assert count == 2 * 4 + 1 + 2 * 4 + 1 and coll[1][1] == count
    # an all-gather and a reduce-scatter each (inside the node, an H100)
    each = 2 * sharded_collective_s(nbytes, 2, 2, node, net, gen=2)
    single = one_step(analysis, params).single_s
    # two GPUs, one tensor-parallel pair: no data-parallel traffic, every all-reduce exposed
    # (step_cv=0: no wait for the slowest GPU, so the step adds up by hand)
    two = scale_out(analysis, params, ScaleConfig(gpus=2, tp=2, tp_collectives=coll,
                                                  step_cv=0.0), node, net)
    assert two["communication"]["tensor_parallel"]["exposed_s"] == pytest.approx(count * each)
    assert two["exposed_comm_s"] == pytest.approx(count * each)
    assert two["step_s"] == pytest.approx(single + count * each)
    # the pair trains one replica's 4 sequences a step: 2 per GPU
    assert two["per_gpu_samples_per_s"] == pytest.approx(4 / (single + count * each) / 2)
    assert two["scaling_efficiency"] == pytest.approx(single / (single + count * each))
    # with 3 micro-batches: three times the all-reduces
    three = scale_out(analysis, params, ScaleConfig(gpus=2, tp=2, tp_collectives=coll,
                                                    grad_accum=3, step_cv=0.0), node, net)
    assert three["communication"]["tensor_parallel"]["exposed_s"] == pytest.approx(
        3 * count * each)
    # 16 GPUs: FSDP over 8 replicas, one per node's tensor-parallel pair position: the same as
    # FSDP on 8 GPUs of 4 per node for the data-parallel part, plus the pair's all-reduces,
    # and the wait for the slowest of all 16 GPUs
    wide = scale_out(analysis, params, ScaleConfig(gpus=16, tp=2, tp_collectives=coll,
                                                   strategy="fsdp", collective_sms=32),
                     node, net)
    dp = scale_out(analysis, params, ScaleConfig(gpus=8, gpus_per_node=4, strategy="fsdp",
                                                 step_cv=0.0, collective_sms=32), node, net)
    assert wide["communication"]["comm_s"] == pytest.approx(dp["communication"]["comm_s"])
    assert wide["memory_per_gpu"]["total_bytes"] == dp["memory_per_gpu"]["total_bytes"]
    # (the compute and the sharded update: dp's step less its exposed communication and the
    # compute's slowdown beside the hidden part, the same in both)
    assert wide["contention_s"] == pytest.approx(dp["contention_s"]) and dp["contention_s"] > 0
    assert wide["straggler_s"] == pytest.approx(
        straggler_s(dp["step_s"] - dp["exposed_comm_s"] - dp["contention_s"], 16, STEP_CV),
        rel=1e-6)
    assert wide["step_s"] == pytest.approx(dp["step_s"] + count * each + wide["straggler_s"])
    assert wide["nodes"] == 2 and wide["per_gpu_samples_per_s"] * 16 == pytest.approx(
        wide["total_samples_per_s"])


def test_tp_is_checked_against_the_node_and_the_input():
    for kwargs in ({"gpus": 8, "tp": 3}, {"gpus": 4, "tp": 8}, {"gpus": 12, "tp": 8}):
        with pytest.raises(DlperfError, match="--tp"):
            ScaleConfig(**kwargs)
    with pytest.raises(DlperfError, match="--tp"):
        ScaleConfig(gpus=8, tp=2, decode="cpu", data_cores_per_gpu=4,
                    decode_img_per_s_per_core=100)


def test_analyze_tp_prints_and_saves_the_tensor_parallel_scale_out(tmp_path, capsys):
    from conftest import run_cli

    path = tmp_path / "tp.json"
    common = ["analyze", "gpt", "--layers", "2", "--d-model", "256", "--heads", "8",
              "--seq-len", "128", "--batch-size", "2", "--dtype", "bf16", "--train",
              "--device", "h100-sxm"]
    page = tmp_path / "tp.html"
    code, out, err = run_cli(common + ["--gpus", "16", "--tp", "4", "--strategy", "fsdp",
                                       "--json", str(path), "--html", str(page)], capsys)
    assert code == 0, err
    assert "up to 1.4x optimistic" in page.read_text()  # the HTML report says it too
    text = " ".join(out.split())
    assert "4-way tensor parallel in the node, FSDP over 4 replicas" in text
    # 2 x 2 + 1, twice, all-gathers and reduce-scatters alike
    assert "tensor-parallel all-gathers and reduce-scatters 20 of" in text
    # and what the published TP runs say of such predictions, under them
    assert "checked against eight published sources" in text and "up to 1.4x optimistic" in text
    assert "Megatron-LM's GPT" in text and "Megatron-Core's 1.7B-462B GPTs on H100s" in text
    assert "Megatron-DeepSpeed's BLOOM-176B and MT-NLG 530B" in text and "--deepspeed-bf16" in text
    data = json.loads(path.read_text())["scale_out"]
    tp = data["at_requested_scale"]["communication"]["tensor_parallel"]
    assert tp["tp"] == 4 and tp["bytes_each"] == 2 * 128 * 256 * 2
    # the curve runs over whole tensor-parallel groups; no band from data-parallel runs
    assert [row["gpus"] for row in data["curve"]][:3] == [4, 8, 16]
    assert data["track_record"] is None or data["track_record"]["efficiency_band"] is None
    # one line for each misuse
    for extra, words in ((["--tp", "2"], "--tp 2 splits the model"),
                         (["--gpus", "8", "--tp", "3"], "--tp 3"),
                         (["--gpus", "8", "--tp", "16"], "--tp 16")):
        code, out, err = run_cli(common + extra, capsys)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
    code, out, err = run_cli(["analyze", "resnet18", "--train", "--gpus", "8", "--tp", "2"],
                             capsys)
    assert code == 2 and "--tp: only for gpt and its presets" in err


def test_sequence_parallel_norms_and_adds_hold_a_tp_th_of_the_tokens():
    # between the split regions each rank keeps 1/tp of the tokens: its layer norms and
    # residual adds move half the bytes at tp=2; the stand-in collectives cost nothing
    def bytes_of(tp, ops):
        costs, uncounted, _, _ = _capture(tp, layers=2)[3]
        assert not uncounted
        return sum(c.bytes for c in costs if c.op in ops and c.phase == "forward"
                   and c.module.startswith("blocks."))

    # a norm moves its activations (split) and reads its weight (whole on every rank): 4 norms
    # of d = 256 fp32 weights (no biases) = 4,096 bytes, so 2 x tp2 - tp1 = 4,096
    one, two = bytes_of(1, {"native_layer_norm"}), bytes_of(2, {"native_layer_norm"})
    assert 2 * two - one == 4 * 256 * 4 and two < 0.51 * one
    assert bytes_of(2, {"add"}) * 2 == bytes_of(1, {"add"})


def test_a_decoder_that_does_not_fit_is_pointed_at_what_splits_activations(capsys):
    from conftest import run_cli

    # 65,536 sequences of 128 tokens on one GPU's share: the activations alone overflow 80 GB
    code, out, err = run_cli(["analyze", "gpt", "--layers", "2", "--d-model", "256", "--heads",
                              "8", "--seq-len", "128", "--batch-size", "65536", "--dtype", "bf16",
                              "--train", "--device", "h100-sxm", "--gpus", "16", "--strategy",
                              "fsdp", "--top", "1"], capsys)
    assert code == 0, err
    text = " ".join(out.split())
    assert "(does not fit)" in text and "--tp N (tensor and sequence parallel" in text


def test_without_sequence_parallelism_the_collectives_are_all_reduces():
    # Megatron's original scheme on its 8B case: 42 blocks, batch 16 x 1,024 tokens of d 4,096
    # in fp16: 134,217,728 bytes each. Forward: one after each of the 2 x 42 split regions
    # and the embedding (85); backward: one before each split region and the output layer
    # (85); a full recompute: 2 x 42 more (84): 254 all-reduces, the count of each pair's kind
    # with sequence parallelism
    assert tensor_parallel_collectives(42, 16 * 1024, 4096, 2, recompute=True,
                                       sequence_parallel=False) == (
        ("allreduce", 254, 134217728, None),)
    assert tensor_parallel_collectives(42, 16 * 1024, 4096, 2, recompute=True)[0] == (
        "allgather", 254, 134217728, None)


def test_without_sequence_parallelism_each_rank_holds_every_token_between_the_regions():
    # the norms and residual adds of the whole residual stream on every rank: as many bytes as
    # one GPU's (the norms' weights whole on each rank too), while the GEMMs split
    def capture(tp, sp=True):
        cfg = GPTConfig(layers=2, d_model=256, heads=8, vocab=1024, seq_len=128, tp=tp,
                        sequence_parallel=sp)
        with torch.device("meta"):
            model = GPT(cfg)
        acfg = AnalysisConfig(model="gpt", input_shape=(4, 128), dtype="bf16", train=True,
                              device="h100-sxm", tokens=True, optimizer="adamw")
        costs, uncounted, _, _ = capture_costs(model, acfg, torch.long)
        assert not uncounted
        return costs

    def total(costs, key, ops):
        return sum(getattr(c, key) for c in costs if c.op in ops and c.phase == "forward"
                   and c.module.startswith("blocks."))

    one, whole, split = capture(1), capture(2, sp=False), capture(2)
    for ops in ({"native_layer_norm"}, {"add"}):
        assert total(whole, "bytes", ops) == total(one, "bytes", ops)
        assert total(split, "bytes", ops) < 0.51 * total(one, "bytes", ops)
    gemms = {"mm", "addmm"}
    assert total(whole, "flops", gemms) * 2 == total(one, "flops", gemms)
    # and a sequence the ranks do not divide is fine when the tokens are not split
    GPTConfig(layers=1, d_model=64, heads=8, seq_len=100, tp=8, sequence_parallel=False)


def test_all_reduces_are_timed_as_all_reduces_in_the_scale_out():
    from dlperf.analysis.scaling import allreduce_s

    cfg, analysis, params = _tiny(2)
    node, net = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]
    coll = tensor_parallel_collectives(cfg.layers, 4 * 128, cfg.d_model, 2, recompute=False,
                                       sequence_parallel=False)
    (_, count, nbytes, _), = coll
    each = allreduce_s(nbytes, 2, 2, node, net, gen=2)
    two = scale_out(analysis, params, ScaleConfig(gpus=2, tp=2, tp_collectives=coll,
                                                  step_cv=0.0), node, net)
    tensor = two["communication"]["tensor_parallel"]
    assert tensor["exposed_s"] == pytest.approx(count * each)
    # 4 blocks without a recompute: 2 x (2 x 4 + 1) all-reduces, one kind
    assert tensor["sequence_parallel"] is False and tensor["collectives_per_micro_batch"] == 18


def test_analyze_no_sequence_parallel_says_what_it_runs(tmp_path, capsys):
    from conftest import run_cli

    path = tmp_path / "tp.json"
    common = ["analyze", "gpt", "--layers", "2", "--d-model", "256", "--heads", "8",
              "--seq-len", "128", "--batch-size", "2", "--dtype", "fp16", "--train",
              "--device", "a100-80gb"]
    code, out, err = run_cli(common + ["--gpus", "8", "--tp", "4", "--no-sequence-parallel",
                                       "--json", str(path)], capsys)
    assert code == 0, err
    text = " ".join(out.split())
    assert "all the tokens between them (no sequence parallelism" in text
    # 2 x 2 + 1, twice
    assert "tensor-parallel all-reduces 10 of" in text
    tp = json.loads(path.read_text())["scale_out"]["at_requested_scale"]["communication"][
        "tensor_parallel"]
    assert tp["sequence_parallel"] is False and tp["bytes_each"] == 2 * 128 * 256 * 2
    code, out, err = run_cli(common + ["--gpus", "8", "--no-sequence-parallel"], capsys)
    assert code == 2 and "--no-sequence-parallel describes tensor parallelism" in err
    assert len(err.strip().splitlines()) == 1
    # the decoder's own flags are refused on other models and out of range, in one line each
    for argv, words in ((["analyze", "resnet18", "--attention", "math", "--dropout", "0.1"],
                         "--attention, --dropout: only for gpt"),
                        (common + ["--dropout", "1"], "--dropout: GPT dropout must be in [0, 1)")):
        code, out, err = run_cli(argv, capsys)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


# Megatron-LM's implementation (--tp-impl megatron): the backward's collectives beside the
# column-parallel layers' GEMMs, and the layer's input kept as its shard


def test_megatron_s_collectives_by_hand():
    # 80 blocks, full recompute, 8,192 tokens of d 8,192 in bf16 (134,217,728 bytes each).
    # 2 x 80 + 1 = 161 column-parallel layers (two a block and the output layer).
    # Sequence parallel: all-gathers between dependent kernels: the forward's 161, the
    # backward's 161 (the forward's reduce-scatters reversed) and the recompute's 160 = 482;
    # reduce-scatters the forward's 161 and the recompute's 160 = 321; beside the GEMMs: each
    # layer's input gathered again (161, data gradient) and its input gradient
    # reduce-scattered (161, weight gradient)
    assert tensor_parallel_collectives(80, 8192, 8192, 2, recompute=True, impl="megatron") == (
        ("allgather", 482, 134217728, None), ("reducescatter", 321, 134217728, None),
        ("allgather", 161, 134217728, "dgrad"), ("reducescatter", 161, 134217728, "wgrad"))
    # without: the forward's 161 all-reduces and the recompute's 160 exposed, the backward's
    # 161 beside the weight gradients
    assert tensor_parallel_collectives(80, 8192, 8192, 2, recompute=True,
                                       sequence_parallel=False, impl="megatron") == (
        ("allreduce", 321, 134217728, None), ("allreduce", 161, 134217728, "wgrad"))
    with pytest.raises(ValueError, match="one of torch, torch-async, megatron, te"):
        tensor_parallel_collectives(2, 8, 8, 2, recompute=False, impl="deepspeed")


def test_a_collective_beside_gemms_costs_what_they_cannot_cover():
    from types import SimpleNamespace

    from dlperf.analysis.scaling import beside_gemm_s

    def kernel(module, phase, ms):
        return SimpleNamespace(cost=SimpleNamespace(module=module, phase=phase), time_s=ms / 1e3)

    predictions = [kernel("blocks.0.attn.wq", "dgrad", 0.4), kernel("blocks.0.attn.wk", "dgrad",
                                                                   0.3),
                   kernel("blocks.0.attn.wq", "wgrad", 2.0), kernel("blocks.0.fc", "dgrad", 2.0),
                   kernel("blocks.0.fc", "forward", 9.0)]
    regions = (("blocks.0.attn.wq", "blocks.0.attn.wk"), ("blocks.0.fc",), ("head",))
    # a 1 ms collective beside each region's data gradient: attention's 0.7 ms leave 0.3 ms,
    # the MLP's 2 ms hide it; the output layer is not in these predictions (another stage)
    left, present = beside_gemm_s(predictions, regions, "dgrad", 1e-3)
    assert (left, present) == (pytest.approx(0.3e-3), 2)
    # beside the weight gradients only attention has any: 1 ms hidden there; the MLP's region
    # has no weight-gradient kernel here, so it is not counted present
    assert beside_gemm_s(predictions, regions, "wgrad", 1e-3) == (0.0, 1)


def test_megatron_s_column_parallel_layer_is_linear_s_math():
    # with one rank its collectives are the identity: gradients equal autograd's nn.Linear's
    # (float64 gradcheck, and against F.linear's own backward)
    from dlperf.models.gpt import ColumnParallelLinear, _MegatronColumn

    torch.manual_seed(0)
    layer = ColumnParallelLinear(6, 5, bias=True, tp=1).double()
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: _MegatronColumn.apply(x, w, b, 1),
                                    (x, layer.weight, layer.bias))
    out = layer(x)
    out.square().sum().backward()
    ref_x = x.detach().clone().requires_grad_()
    w = layer.weight.detach().clone().requires_grad_()
    b = layer.bias.detach().clone().requires_grad_()
    torch.nn.functional.linear(ref_x, w, b).square().sum().backward()
    for got, want in ((x.grad, ref_x.grad), (layer.weight.grad, w.grad), (layer.bias.grad,
                                                                          b.grad)):
        torch.testing.assert_close(got, want)


def _megatron_capture(impl: str, **kwargs):
    cfg = GPTConfig(layers=2, d_model=64, heads=4, vocab=128, seq_len=16, tp=4, tp_impl=impl,
                    bias=True, **kwargs)
    with torch.device("meta"):
        model = GPT(cfg)
    acfg = AnalysisConfig(model="gpt", input_shape=(2, 16), dtype="bf16", train=True,
                          device="a100-80gb", tokens=True, optimizer="adamw", precision="fsdp")
    costs, uncounted, _, memory = capture_costs(model, acfg, torch.long)
    assert not uncounted
    return cfg, acfg, costs, memory


def test_megatron_keeps_the_shard_and_runs_the_same_gemms():
    _, _, torch_costs, torch_memory = _megatron_capture("torch")
    cfg, _, costs, memory = _megatron_capture("megatron")
    # a layer that gathers its own input keeps this rank's 1/4 of it: 2 x 16 tokens of 64 in
    # bf16 = 4,096 bytes gathered, 1,024 kept, at each of the 2 x 2 + 1 column-parallel layers
    # (their inputs are the norms' outputs, which nothing else keeps): 5 x 3,072 less
    assert torch_memory["activations_bytes"] - memory["activations_bytes"] == 5 * 3072

    def gemms(costs):
        return sorted((c.module, c.phase, c.flops) for c in costs if c.kind == "gemm")

    # the same GEMMs, each charged to its layer and pass (forward, data and weight gradients)
    assert gemms(costs) == gemms(torch_costs)
    qkv = {c.phase for c in costs if c.module == "blocks.0.attn.qkv" and c.kind == "gemm"}
    assert qkv == {"forward", "dgrad", "wgrad"}


def test_megatron_s_backward_collectives_hide_behind_the_gemms():
    from dlperf.models.gpt import column_parallel_regions

    cfg, acfg, costs, memory = _megatron_capture("megatron")
    analysis = predict_on(costs, {}, acfg, get_device("a100-80gb"), 0.0, memory=memory)
    params = [("w", 4)]
    node, net = PRESETS["nvlink3-a100"], PRESETS["ib-hdr"]
    coll = tensor_parallel_collectives(2, 32, 64, 2, recompute=False, impl="megatron")
    regions = column_parallel_regions(cfg)
    assert len(regions) == 5
    out = scale_out(analysis, params, ScaleConfig(gpus=4, tp=4, tp_collectives=coll,
                                                  tp_regions=regions, step_cv=0.0), node, net)
    tp = out["communication"]["tensor_parallel"]
    from dlperf.analysis.nccl import generation

    each = sharded_collective_s(32 * 64 * 2, 4, 4, node, net,
                                gen=generation(analysis.device.name))
    # 10 + 5 exposed (forward, and the backward's gathers of the reduce-scattered outputs)
    # and 5 + 5 beside the GEMMs: these kilobyte collectives are latency, longer than the
    # tiny GEMMs beside them, so what each region's leaves is the collective less its GEMMs
    assert tp["collectives_per_micro_batch"] == 25 and tp["beside_gemms"] == 10
    assert tp["busy_s"] == pytest.approx(25 * each)
    dgrad, wgrad = ({c.module: 0.0 for c in costs} for _ in range(2))
    for p in analysis.predictions:
        if p.cost.phase in ("dgrad", "wgrad"):
            (dgrad if p.cost.phase == "dgrad" else wgrad)[p.cost.module] += p.time_s
    left = sum(max(0.0, each - sum(phase[m] for m in r)) for r in regions
               for phase in (dgrad, wgrad))
    assert tp["exposed_s"] == pytest.approx(15 * each + left)
    assert 15 * each < tp["exposed_s"] < 25 * each
    # torch's way: the forward's 10 and the backward's 10, every one exposed
    plain = tensor_parallel_collectives(2, 32, 64, 2, recompute=False)
    torch_way = scale_out(analysis, params, ScaleConfig(gpus=4, tp=4, tp_collectives=plain,
                                                        step_cv=0.0), node, net)
    assert torch_way["communication"]["tensor_parallel"]["exposed_s"] == pytest.approx(
        20 * each)


def test_analyze_tp_impl_flags(tmp_path, capsys):
    from conftest import run_cli

    path = tmp_path / "tp.json"
    common = ["analyze", "gpt", "--layers", "2", "--d-model", "256", "--heads", "8",
              "--seq-len", "128", "--batch-size", "2", "--dtype", "bf16", "--train",
              "--device", "a100-80gb", "--gpus", "8"]
    code, out, err = run_cli(common + ["--tp", "4"], capsys)
    # the default says whose way it runs and how to ask for Megatron's
    assert code == 0 and "(for Megatron-LM's stack: --tp-impl megatron --fusion megatron)" \
        in " ".join(out.split())
    code, out, err = run_cli(common + ["--tp", "4", "--tp-impl", "megatron"], capsys)
    assert code != 0 and "--precision fsdp" in " ".join(err.split())
    assert "Traceback" not in err
    code, out, err = run_cli(["analyze", "gpt", "--tp-impl", "megatron", "--train"], capsys)
    assert code != 0 and "--tp-impl describes tensor parallelism" in " ".join(err.split())
    code, out, err = run_cli(common + ["--tp", "4", "--tp-impl", "megatron", "--precision",
                                       "fsdp", "--json", str(path)], capsys)
    assert code == 0, err
    assert "beside the backward's GEMMs (Megatron's)" in " ".join(out.split())
    assert "run as Megatron-LM runs them (--tp-impl megatron)" in " ".join(out.split())
    tp = json.loads(path.read_text())["scale_out"]["at_requested_scale"]["communication"][
        "tensor_parallel"]
    # 2 blocks: 5 column-parallel layers, each gathering again and reduce-scattering beside
    # its GEMMs
    assert tp["beside_gemms"] == 10 and tp["collectives_per_micro_batch"] == 25


@pytest.mark.slow
def test_the_tensor_parallel_cpu_benchmark_runs_megatron_s_all_reduces(tmp_path):
    # benchmarks/bench_tp_cpu.py --quick: one rank of a 2-block GPT on each of 2 gloo
    # processes, with real all-reduces where Megatron's original scheme has them
    import subprocess
    import sys

    from conftest import ROOT

    from dlperf.analysis.scaling import allreduce_s
    from dlperf.hardware.interconnect import Interconnect

    out = tmp_path / "tp.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_tp_cpu.py"), str(out),
                          "--quick"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    r = json.loads(out.read_text())["results"]
    # 2 blocks: 2 x 2 + 1 forward (row-parallel outputs, the embedding), as many backward
    # (column-parallel inputs, the output layer): the hooks ran what dlperf counts
    assert r["collectives_per_step_run"] == r["collectives_per_step_predicted"] == 10
    # [8, 256, 256] fp32 activations: 2 MiB each, timed on the probed gloo fit
    assert r["bytes_each"] == 8 * 256 * 256 * 4
    ic = Interconnect(**{k: v for k, v in r["interconnect"].items()
                         if k in Interconnect.__dataclass_fields__})
    each = allreduce_s(r["bytes_each"], 2, 2, ic, ic)
    assert r["predicted_tp_exposed_s"] == pytest.approx(10 * each, rel=1e-6)
    assert r["predicted_step_s"] == pytest.approx(
        r["without_collectives_step_s"] + r["predicted_tp_exposed_s"]
        + r["predicted_straggler_s"])
    assert 0 < r["measured_in_allreduce_calls_less_waiting_rank_s"] <= r[
        "measured_in_allreduce_calls_s"]


# TransformerEngine's overlap (--tp-impl te: Megatron-Core with --tp-comm-overlap)


def test_te_s_collectives_by_hand():
    # 80 blocks, full recompute, 8,192 tokens of d 8,192 in bf16 (134,217,728 bytes each), as
    # Megatron's above: the same collectives, placed beside GEMMs. Exposed: the output layer's
    # forward gather and the embedding's backward gather (2), the embedding's reduce-scatter
    # (1). Beside the blocks' GEMMs: the forward's 160 gathers (QKV, FC1) and 160
    # reduce-scatters (proj, FC2), the recompute's as many, the backward's 160 gathers of the
    # row-parallel layers' output gradients, and at the 161 column-parallel layers the input
    # gathered again (data gradient) and its gradient reduce-scattered (weight gradient)
    nb = 134217728
    te = tensor_parallel_collectives(80, 8192, 8192, 2, recompute=True, impl="te")
    assert te == (
        ("allgather", 2, nb, None), ("reducescatter", 1, nb, None),
        ("allgather", 160, nb, "fprop"), ("reducescatter", 160, nb, "row-fprop"),
        ("allgather", 160, nb, "recompute"), ("reducescatter", 160, nb, "row-recompute"),
        ("allgather", 160, nb, "row-dgrad"), ("allgather", 161, nb, "dgrad"),
        ("reducescatter", 161, nb, "wgrad"))
    megatron = tensor_parallel_collectives(80, 8192, 8192, 2, recompute=True, impl="megatron")
    for kind in ("allgather", "reducescatter"):
        assert sum(n for k, n, _, _ in te if k == kind) == sum(
            n for k, n, _, _ in megatron if k == kind)
    # without recompute the recompute's entries are gone, not zero
    assert all(n for _, n, _, _ in tensor_parallel_collectives(2, 8, 8, 2, recompute=False,
                                                               impl="te"))
    with pytest.raises(ValueError, match="sequence parallelism"):
        tensor_parallel_collectives(2, 8, 8, 2, recompute=False, sequence_parallel=False,
                                    impl="te")


def _chunked(collective: float, gemm: float, method: str, chunks: int) -> float:
    """An event-by-event simulation of a collective split with its GEMM into ``chunks``, the
    independent reference for ``overlap_left_s``: what the pair takes beyond the GEMM."""
    g = gemm / chunks
    if method == "ring":  # chunk k's GEMM needs chunk k's tokens; transfers go one at a time
        c = collective / (chunks - 1)
        arrived, done = 0.0, 0.0
        for k in range(chunks):
            if k:
                arrived += c
            done = max(done, arrived) + g
        return done - gemm
    # pipeline: chunk k's reduce-scatter starts when its GEMM and the previous transfer end
    c = collective / chunks
    done = sent = 0.0
    for _ in range(chunks):
        done += g
        sent = max(sent, done) + c
    return sent - gemm


def test_overlap_left_s_by_hand_and_against_a_simulation():
    from dlperf.analysis.scaling import TE_RS_SPLITS, overlap_left_s

    ms = 1e-3
    # bulk: what the collective outlasts the GEMM by
    assert overlap_left_s(1 * ms, 0.7 * ms, "bulk", 8) == pytest.approx(0.3 * ms)
    assert overlap_left_s(1 * ms, 2 * ms, "bulk", 8) == 0.0
    # ring over 8 ranks: 7 transfers of 1/7 ms beside 7 GEMM chunks of 0.1 ms after the first:
    # 7 x (1/7 - 0.1) = 0.3 ms; a 2 ms GEMM hides it all
    assert overlap_left_s(1 * ms, 0.8 * ms, "ring", 8) == pytest.approx(0.3 * ms)
    assert overlap_left_s(1 * ms, 2 * ms, "ring", 8) == 0.0
    assert overlap_left_s(1 * ms, 0.0, "ring", 1) == 0.0  # one rank: nothing to gather
    # pipeline in 4 chunks: the last chunk's 0.25 ms is always exposed; with a 0.4 ms GEMM the
    # transfers (0.25 each) outrun its chunks (0.1): 0.1 + 4 x 0.25 - 0.4 = 0.7 ms
    assert TE_RS_SPLITS == 4
    assert overlap_left_s(1 * ms, 2 * ms, "pipeline", 8) == pytest.approx(0.25 * ms)
    assert overlap_left_s(1 * ms, 0.4 * ms, "pipeline", 8) == pytest.approx(0.7 * ms)
    for collective, gemm in ((1.0, 0.3), (1.0, 1.0), (0.2, 3.0), (2.5, 1.7)):
        for tp in (2, 4, 8):
            assert overlap_left_s(collective, gemm, "ring", tp) == pytest.approx(
                _chunked(collective, gemm, "ring", tp))
        assert overlap_left_s(collective, gemm, "pipeline", 8) == pytest.approx(
            _chunked(collective, gemm, "pipeline", TE_RS_SPLITS))
    with pytest.raises(ValueError, match="bulk, ring or pipeline"):
        overlap_left_s(1.0, 1.0, "async", 8)


def _tp_exposed(analysis, columns, rows, impl):
    """The tensor-parallel entry of the scale-out of a 2-block decoder's micro-batch (32 tokens
    of d 64 in bf16) on 4 GPUs of TP 4 under ``impl``."""
    node, net = PRESETS["nvlink3-a100"], PRESETS["ib-hdr"]
    coll = tensor_parallel_collectives(2, 32, 64, 2, recompute=False, impl=impl)
    return scale_out(analysis, [("w", 4)], ScaleConfig(
        gpus=4, tp=4, tp_collectives=coll, tp_regions=columns, tp_row_regions=rows,
        step_cv=0.0), node, net)["communication"]["tensor_parallel"]


def _by_hand(analysis, columns, rows, exposed: int, besides) -> tuple[float, float]:
    """(one collective's time, the exposed time by hand): ``exposed`` collectives whole, and
    each of ``besides`` (TP_OVERLAP's names) what its region's kernels of its phase leave, as
    overlap_left_s has it."""
    from dlperf.analysis.nccl import generation
    from dlperf.analysis.scaling import TP_OVERLAP, overlap_left_s

    each = sharded_collective_s(32 * 64 * 2, 4, 4, PRESETS["nvlink3-a100"], PRESETS["ib-hdr"],
                                gen=generation(analysis.device.name))
    time = {}
    for p in analysis.predictions:
        key = (p.cost.module, p.cost.phase)
        time[key] = time.get(key, 0.0) + p.time_s
    groups = {"column": columns, "row": rows,
              "column-blocks": tuple(r for r in columns if r != ("head",))}
    want = exposed * each
    for beside in besides:
        group, phase, method = TP_OVERLAP[beside]
        want += sum(overlap_left_s(each, sum(time.get((m, phase), 0.0) for m in r), method, 4)
                    for r in groups[group])
    return each, want


def test_te_overlaps_what_megatron_leaves_exposed():
    from dlperf.models.gpt import column_parallel_regions, row_parallel_regions

    cfg, acfg, costs, memory = _megatron_capture("te")
    _, _, megatron_costs, megatron_memory = _megatron_capture("megatron")
    # the same kernels and the same kept shard as Megatron's own layers
    assert memory == megatron_memory
    assert sorted((c.module, c.phase, c.flops) for c in costs) == sorted(
        (c.module, c.phase, c.flops) for c in megatron_costs)
    rows = row_parallel_regions(cfg)
    assert rows == (("blocks.0.attn.proj",), ("blocks.0.out",), ("blocks.1.attn.proj",),
                    ("blocks.1.out",))
    analysis = predict_on(costs, {}, acfg, get_device("a100-80gb"), 0.0, memory=memory)
    columns = column_parallel_regions(cfg)
    te, megatron = (_tp_exposed(analysis, columns, rows, impl) for impl in ("te", "megatron"))
    assert te["busy_s"] == pytest.approx(megatron["busy_s"])  # the same traffic
    assert te["collectives_per_micro_batch"] == 25 and te["beside_gemms"] == 22
    # by hand: 3 exposed whole, and each overlapped one what its region's GEMMs of its phase
    # leave
    each, want = _by_hand(analysis, columns, rows, 3,
                          ("fprop", "row-fprop", "row-dgrad", "dgrad", "wgrad"))
    assert te["exposed_s"] == pytest.approx(want)
    assert 3 * each < te["exposed_s"] < megatron["exposed_s"]


# PyTorch's async tensor parallelism (--tp-impl torch-async: Inductor's micro-pipeline pass)


def test_torch_async_collectives_by_hand():
    # 80 blocks, full recompute, 8,192 tokens of d 8,192 in bf16 (134,217,728 bytes each): the
    # traffic of PyTorch's tensor parallelism (4 L + 2 = 322 gathers and as many reduce-
    # scatters, plus the recompute's 160 each), placed by what the micro-pipeline pass fuses
    # in torchtitan's compiled blocks. Exposed: the output layer's forward gather and the
    # embedding's backward one, the embedding's reduce-scatter and the output layer's backward
    # one (outside the compiled blocks), and the 160 backward reduce-scatters of the column-
    # parallel layers' summed input gradients (q + k + v, w1 + w3: no single matmul produces
    # them). Fused: the forward's 160 gathers (QKV, FC1) and 160 reduce-scatters (proj, FC2),
    # the recompute's as many, the backward's 160 gathers of the row-parallel layers' output
    # gradients (with their data-gradient matmuls, which take them as the left operand; the
    # weight gradient reads their transpose, after the gather)
    nb = 134217728
    fused = tensor_parallel_collectives(80, 8192, 8192, 2, recompute=True, impl="torch-async")
    assert fused == (
        ("allgather", 2, nb, None), ("reducescatter", 2, nb, None),
        ("allgather", 160, nb, "fprop"), ("reducescatter", 160, nb, "row-fprop-ring"),
        ("allgather", 160, nb, "recompute"), ("reducescatter", 160, nb, "row-recompute-ring"),
        ("allgather", 160, nb, "row-dgrad"), ("reducescatter", 160, nb, None))
    plain = tensor_parallel_collectives(80, 8192, 8192, 2, recompute=True)
    for kind in ("allgather", "reducescatter"):  # the same traffic as the plain form
        assert sum(n for k, n, _, _ in fused if k == kind) == sum(
            n for k, n, _, _ in plain if k == kind) == 322 + 160
    assert all(n for _, n, _, _ in tensor_parallel_collectives(
        2, 8, 8, 2, recompute=False, impl="torch-async"))
    with pytest.raises(ValueError, match="needs it"):
        tensor_parallel_collectives(2, 8, 8, 2, recompute=False, sequence_parallel=False,
                                    impl="torch-async")


def _produce_then_send(collective: float, gemm: float, ranks: int) -> float:
    """symm_mem's fused matmul + reduce-scatter, event by event: the matmul in one chunk per
    destination rank, the remote ones first, each sent (one at a time) once computed while
    the next is computed, this rank's own last: what the pair takes beyond the matmul."""
    g, c = gemm / ranks, collective / (ranks - 1)
    sent = 0.0
    for k in range(ranks - 1):
        sent = max(sent, (k + 1) * g) + c
    return max(sent, gemm) - gemm


def test_torch_async_overlaps_within_torch_s_traffic():
    from dlperf.analysis.scaling import overlap_left_s
    from dlperf.models.gpt import column_parallel_regions, row_parallel_regions

    # the fused reduce-scatter's chunks leave what a ring's do (the formula it is timed by)
    for collective, gemm in ((1.0, 0.3), (1.0, 1.0), (0.2, 3.0), (2.5, 1.7)):
        for tp in (2, 4, 8):
            assert _produce_then_send(collective, gemm, tp) == pytest.approx(
                overlap_left_s(collective, gemm, "ring", tp))
    cfg, acfg, costs, memory = _megatron_capture("torch-async")
    _, _, torch_costs, torch_memory = _megatron_capture("torch")
    # the model is PyTorch's own: the same kernels and kept tensors
    assert memory == torch_memory
    assert sorted((c.module, c.phase, c.flops) for c in costs) == sorted(
        (c.module, c.phase, c.flops) for c in torch_costs)
    analysis = predict_on(costs, {}, acfg, get_device("a100-80gb"), 0.0, memory=memory)
    columns, rows = column_parallel_regions(cfg), row_parallel_regions(cfg)
    fused, plain = (_tp_exposed(analysis, columns, rows, impl)
                    for impl in ("torch-async", "torch"))
    assert fused["busy_s"] == pytest.approx(plain["busy_s"])
    assert plain["exposed_s"] == pytest.approx(plain["busy_s"])  # every one exposed
    # 4 L + 2 = 10 of each kind; beside matmuls: 2 L forward gathers, 2 L forward
    # reduce-scatters, 2 L backward gathers (beside the data-gradient matmuls)
    assert fused["collectives_per_micro_batch"] == 20 and fused["beside_gemms"] == 12
    # exposed whole: 2 + 2 outside the blocks, 2 L summed input gradients
    each, want = _by_hand(analysis, columns, rows, 8,
                          ("fprop", "row-fprop-ring", "row-dgrad"))
    assert fused["exposed_s"] == pytest.approx(want)
    assert 8 * each <= fused["exposed_s"] < plain["exposed_s"]


def test_torch_async_needs_compile_and_sequence_parallelism(capsys):
    from conftest import run_cli

    base = ["analyze", "gpt", "--train", "--batch-size", "2", "--seq-len", "64", "--gpus", "8",
            "--tp", "4", "--tp-impl", "torch-async", "--dtype", "bf16"]
    code, out, err = run_cli(base, capsys)
    assert code == 2 and "add --fusion compile-blocks" in err
    assert len(err.strip().splitlines()) == 1
    code, out, err = run_cli(base + ["--fusion", "compile-blocks", "--no-sequence-parallel"],
                             capsys)
    assert code == 2 and "drop --no-sequence-parallel" in err
    code, out, err = run_cli(base + ["--fusion", "compile-blocks"], capsys)
    assert code == 0, err
    assert "--tp-impl torch-async" in " ".join(out.split())


def test_distributed_optimizer_by_hand():
    from dlperf.analysis.nccl import generation
    _, acfg, _, _ = _megatron_capture("torch")
    cfg1 = GPTConfig(layers=2, d_model=64, heads=4, vocab=128, seq_len=16, bias=True)
    with torch.device("meta"):
        model = GPT(cfg1)
    costs, _, _, memory = capture_costs(model, acfg, torch.long)
    analysis = predict_on(costs, {}, acfg, get_device("h100-sxm"), 0.0, memory=memory)
    params = [(n, p.numel() * 4) for n, p in model.named_parameters()]
    node, net = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]
    plain = scale_out(analysis, params, ScaleConfig(gpus=16, step_cv=0.0), node, net)
    dist = scale_out(analysis, params, ScaleConfig(gpus=16, step_cv=0.0,
                                                   distributed_optimizer=True), node, net)
    step = one_step(analysis, params)
    # the update: 1/16 of the parameters on each replica (its launches' host time as before)
    host = step.optimizer_host_s
    assert plain["communication"]["optimizer_s"] == pytest.approx(step.timeline.optimizer_s
                                                                  + host)
    assert dist["communication"]["optimizer_s"] == pytest.approx(step.timeline.optimizer_s / 16
                                                                 + host)
    # each bucket reduce-scattered instead of all-reduced, no copies into buckets
    gen = generation(analysis.device.name)
    buckets = dist["communication"]["bucket_bytes"]
    assert buckets == plain["communication"]["bucket_bytes"]
    assert dist["communication"]["comm_s"] == pytest.approx(sum(
        sharded_collective_s(b, 16, 8, node, net, gen=gen) for b in buckets))
    assert dist["communication"]["bucket_copy_s"] == 0.0
    # bf16 parameters gathered back: half the fp32 gradients' bytes, bucket by bucket
    assert dist["communication"]["param_gather_s"] == pytest.approx(sum(
        sharded_collective_s(b / 2, 16, 8, node, net, gen=gen) for b in buckets))
    # memory, as Megatron's distributed optimizer holds it: the optimizer state and the fp32
    # master weights 1/16, the bf16 model whole (half the fp32 gradients' bytes), no second
    # copy of the gradients
    assert dist["memory_per_gpu"]["total_bytes"] == pytest.approx(
        memory["total_bytes"] - (memory["optimizer_state_bytes"] + memory["weights_bytes"])
        * 15 / 16 + sum(b for _, b in params) / 2)
    assert plain["memory_per_gpu"]["total_bytes"] == memory["total_bytes"] + sum(
        b for _, b in params)


def test_megatrons_bf16_gradient_buffer_halves_the_reduce_scatter_not_the_gather():
    # Megatron-Core with grad_reduce_in_fp32 off (every Megatron-Bridge performance config):
    # the backward accumulates into a BF16 buffer that is reduce-scattered as it is
    from dlperf.analysis.nccl import generation
    _, acfg, _, _ = _megatron_capture("torch")
    with torch.device("meta"):
        model = GPT(GPTConfig(layers=2, d_model=64, heads=4, vocab=128, seq_len=16, bias=True))
    costs, _, _, memory = capture_costs(model, acfg, torch.long)
    analysis = predict_on(costs, {}, acfg, get_device("h100-sxm"), 0.0, memory=memory)
    params = [(n, p.numel() * 4) for n, p in model.named_parameters()]
    grads = sum(b for _, b in params)
    node, net = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]
    fp32, bf16 = (scale_out(analysis, params, ScaleConfig(
        gpus=16, step_cv=0.0, distributed_optimizer=True, reduce_dtype=d), node, net)
        for d in (None, "bf16"))
    gen = generation(analysis.device.name)
    # the same buckets (Megatron sizes them in parameters), each reduce-scattered at 2 bytes
    # a gradient instead of 4; the BF16 parameters gathered back as before
    buckets = bf16["communication"]["bucket_bytes"]
    assert buckets == fp32["communication"]["bucket_bytes"]
    assert bf16["communication"]["comm_s"] == pytest.approx(sum(
        sharded_collective_s(b / 2, 16, 8, node, net, gen=gen) for b in buckets))
    assert bf16["communication"]["comm_s"] < fp32["communication"]["comm_s"]
    assert bf16["communication"]["param_gather_s"] == pytest.approx(
        fp32["communication"]["param_gather_s"])
    # memory: the whole buffer at 2 bytes a parameter (half the fp32 gradients); the FP32
    # copy of this GPU's 1/16 shard lives only through the update, after the activations
    m32, m16 = fp32["memory_per_gpu"], bf16["memory_per_gpu"]
    assert m16["gradients_bytes"] == m32["gradients_bytes"] / 2 == grads / 2
    assert m16["total_bytes"] == pytest.approx(m32["total_bytes"] - grads / 2)
    assert m16["peak_bytes"] == pytest.approx(m32["peak_bytes"] - grads / 2)
    # plain DDP's compression hooks are not modelled: refused in one line
    with pytest.raises(DlperfError, match="--reduce-dtype with --strategy ddp is "
                                          "Megatron-Core's gradient buffer"):
        ScaleConfig(gpus=8, reduce_dtype="bf16")


def test_the_parameter_gather_hides_behind_the_forward_but_its_first_bucket():
    from types import SimpleNamespace

    from dlperf.analysis.scaling import distributed_optimizer_gather

    def kernel(phase, ms):
        return SimpleNamespace(cost=SimpleNamespace(module="m", phase=phase), time_s=ms / 1e3)

    forward = [kernel("forward", 3.0), kernel("dgrad", 50.0)]
    # buckets in the backward's order 400, 200, 100 MB of gradients; bf16 parameters: half;
    # 1 ms per 100 MB gathered: the forward needs the last bucket first (50 MB: 0.5 ms,
    # exposed), then 1 + 2 ms beside its 3 ms
    gather = distributed_optimizer_gather(forward, [400e6, 200e6, 100e6], 0.5,
                                          lambda b: b / 100e6 * 1e-3)
    assert gather["param_gather_s"] == pytest.approx(3.5e-3)
    assert gather["param_gather_exposed_s"] == pytest.approx(0.5e-3)
    # a 1 ms forward leaves 2 of those 3 ms exposed too; without overlap all of it is
    short = [kernel("forward", 1.0)]
    assert distributed_optimizer_gather(short, [400e6, 200e6, 100e6], 0.5,
                                        lambda b: b / 100e6 * 1e-3)[
        "param_gather_exposed_s"] == pytest.approx(2.5e-3)
    assert distributed_optimizer_gather(forward, [400e6, 200e6, 100e6], 0.5,
                                        lambda b: b / 100e6 * 1e-3, overlap=False)[
        "param_gather_exposed_s"] == pytest.approx(3.5e-3)


def test_analyze_te_distributed_optimizer_and_untied_flags(tmp_path, capsys):
    from conftest import run_cli

    common = ["analyze", "gpt", "--layers", "2", "--d-model", "256", "--heads", "8",
              "--seq-len", "128", "--batch-size", "2", "--dtype", "bf16", "--train",
              "--device", "h100-sxm", "--gpus", "16", "--precision", "fsdp"]
    code, out, err = run_cli(common + ["--tp", "4", "--tp-impl", "te",
                                       "--no-sequence-parallel"], capsys)
    assert code != 0 and "drop --no-sequence-parallel" in " ".join(err.split())
    assert "Traceback" not in err
    code, out, err = run_cli(common + ["--distributed-optimizer", "--strategy", "fsdp"], capsys)
    assert code != 0 and "--distributed-optimizer is DDP's" in " ".join(err.split())
    code, out, err = run_cli(["analyze", "gpt", "--train", "--distributed-optimizer"], capsys)
    assert code != 0 and "add --gpus N" in " ".join(err.split())
    code, out, err = run_cli(["analyze", "resnet18", "--untie-embeddings"], capsys)
    assert code != 0 and "--untie-embeddings: only for gpt" in " ".join(err.split())
    tied, untied = tmp_path / "tied.json", tmp_path / "untied.json"
    base = common + ["--tp", "4", "--tp-impl", "te", "--distributed-optimizer"]
    code, out, err = run_cli(base + ["--json", str(tied)], capsys)
    assert code == 0, err
    text = " ".join(out.split())
    assert "(--tp-impl te)" in text
    assert "4-way tensor parallel in the node, DDP with the distributed optimizer over 4 " \
        "replicas" in text
    assert "beside the forward's and backward's GEMMs (TransformerEngine's)" in text
    code, out, err = run_cli(base + ["--untie-embeddings", "--json", str(untied)], capsys)
    assert code == 0, err
    a, b = (json.loads(p.read_text()) for p in (tied, untied))
    # an untied output layer adds its own 1/4 of the 50,257-token vocabulary x 256 weights
    # (the vocabulary padded to the ranks: 50,260 / 4 = 12,565 rows), in fp32 gradients
    assert (b["scale_out"]["at_requested_scale"]["communication"]["gradient_bytes"]
            - a["scale_out"]["at_requested_scale"]["communication"]["gradient_bytes"]
            ) == 12565 * 256 * 4
    tp = b["scale_out"]["at_requested_scale"]["communication"]["tensor_parallel"]
    assert tp["beside_gemms"] == tp["collectives_per_micro_batch"] - 3
    assert "param_gather_s" in b["scale_out"]["at_requested_scale"]["communication"]
