"""Pipeline parallelism (analyze --pp): the stages of the built-in decoder's blocks, the
schedule's bubble and transfers (analysis/pipeline.py), and the scale-out with them
(analysis/scaling.py)."""

from __future__ import annotations

import json

import pytest
import torch

from dlperf.analysis import pipeline
from dlperf.analysis.api import AnalysisConfig, capture_costs, predict_on
from dlperf.analysis.scaling import ScaleConfig, one_step, scale_out
from dlperf.errors import DlperfError
from dlperf.hardware.interconnect import PRESETS
from dlperf.hardware.specs import get_device
from dlperf.models.gpt import GPT, GPTConfig


def test_stages_hold_as_many_blocks_or_are_refused():
    pipeline.check(96, 8, 3)  # Megatron's 175B: 4 blocks a chunk
    pipeline.check(105, 35, 3)  # 530B: one block a chunk
    for layers, pp, virtual, words in ((10, 4, 1, "do not split into 4"),
                                       (96, 8, 5, "of 5 virtual chunks"),
                                       (8, 1, 2, "give --pp N"), (8, 0, 1, "at least 1")):
        with pytest.raises(ValueError, match=words):
            pipeline.check(layers, pp, virtual)
    assert pipeline.ordered_blocks({"blocks.10", "blocks.2", "blocks.1"}) == [
        "blocks.1", "blocks.2", "blocks.10"]


def test_the_schedule_by_hand():
    # Narayanan et al. 2021: bubble (p - 1) / v of a micro-batch's forward and backward;
    # 8 stages of 3 chunks, 2 s a micro-batch on the stage: 7 / 3 x 2 = 4.667 s
    assert pipeline.bubble_s(2.0, 8, 3) == pytest.approx(14 / 3)
    assert pipeline.bubble_s(2.0, 8) == pytest.approx(14.0)
    # 64 micro-batches of 3 chunks on 8 stages: 2 x (192 + 7) = 398 transfers
    assert pipeline.p2p_transfers(64, 8, 3) == 398
    assert pipeline.p2p_transfers(4, 2) == 10
    # the first stage's activations: 1 micro-batch of the model in 1F1B, 1 + 7 / 24 of it
    # interleaved over 8 stages of 3 chunks (Korthikanti et al., section 4.2.3)
    assert pipeline.in_flight(8) == 1.0 and pipeline.in_flight(8, 3) == pytest.approx(31 / 24)
    memory = {"parameters": 1000, "weights_bytes": 4000, "gradients_bytes": 4000,
              "optimizer_state_bytes": 8000, "activations_bytes": 2400, "total_bytes": 18400}
    held = pipeline.stage_memory(memory, 0.25, pipeline.in_flight_share((3,) * 8, 0, 3))
    # a quarter of the 16,000 bytes of state, and 2,400 x 31 / 24 = 3,100 of activations
    assert held["total_bytes"] == 4000 + 3100 and held["parameters"] == 250


def _capture(layers=4, tp=1):
    cfg = GPTConfig(layers=layers, d_model=256, heads=8, vocab=1024, seq_len=128, bias=True,
                    tp=tp)
    with torch.device("meta"):
        model = GPT(cfg)
    acfg = AnalysisConfig(model="gpt2", input_shape=(2, 128), dtype="bf16", train=True,
                          device="a100-80gb", tokens=True, optimizer="adamw", precision="fsdp")
    return model, acfg, capture_costs(model, acfg, torch.long)


def test_each_kernel_is_on_its_blocks_stage_and_the_ends_hold_the_rest():
    model, acfg, (costs, uncounted, seconds, memory) = _capture()
    blocks = [f"blocks.{i}" for i in range(4)]
    stages = pipeline.stage_of_costs(costs, blocks, 2)
    for c, s in zip(costs, stages):
        if c.module.startswith(("blocks.0.", "blocks.1.")) or c.module in ("blocks.0",
                                                                           "blocks.1"):
            assert s == 0, c
        elif c.module.startswith(("blocks.2", "blocks.3")):
            assert s == 1, c
        elif c.phase == "optimizer":
            assert s is None
        elif c.module in ("tok", "pos"):  # the embeddings, forward and backward: first
            assert s == 0, c
        elif c.module in ("ln_f", "head"):  # after the blocks: last
            assert s == 1, c
    # every kernel but the update is on exactly one stage; the update on each, scaled
    halves = [pipeline.stage_costs(costs, stages, k, 0.5) for k in (0, 1)]
    others = [c for c in costs if c.phase != "optimizer"]
    assert sum(len(h) for h in halves) == len(others) + 2 * (len(costs) - len(others))
    update = [c for c in costs if c.phase == "optimizer"][0]
    scaled = [c for c in halves[0] if c.phase == "optimizer"][0]
    assert scaled.bytes == update.bytes // 2 and scaled.kernels == update.kernels
    # parameters: a block's by its index; the embeddings (run before the blocks) first
    first = {c.module for c, s in zip(costs, stages) if s == 0 and c.phase == "forward"}
    assert pipeline.param_stage("blocks.3.fc.weight", blocks, 2, first) == 1
    assert pipeline.param_stage("tok.weight", blocks, 2, first) == 0
    assert pipeline.param_stage("ln_f.weight", blocks, 2, first) == 1


def _second_stage():
    """The second of two stages of the 4-block capture, predicted on an A100, its parameters
    with fp32 gradient bytes, and a DGX A100's interconnects."""
    model, acfg, (costs, uncounted, seconds, memory) = _capture()
    blocks = [f"blocks.{i}" for i in range(4)]
    stages = pipeline.stage_of_costs(costs, blocks, 2)
    stage = predict_on(pipeline.stage_costs(costs, stages, 1, 0.5), uncounted, acfg,
                       get_device("a100-80gb"), seconds)
    params = [(n, p.numel() * 4) for n, p in model.named_parameters()]
    return stage, params, PRESETS["nvlink3-a100"], PRESETS["ib-hdr"]


def test_the_pipeline_adds_its_bubble_and_sends_to_the_slowest_stage():
    stage, params, node, net = _second_stage()
    step = one_step(stage, params)
    update = step.timeline.optimizer_s + step.optimizer_host_s  # the update, waits included
    micro = step.single_s - update  # one micro-batch's forward and backward on the stage
    # 2 stages of one GPU each in one node, 4 micro-batches of 2 x 128 tokens, 64 KiB sends
    cfg = ScaleConfig(gpus=2, pp=2, grad_accum=4, p2p_bytes=65536, step_cv=0.0)
    r = scale_out(stage, params, cfg, node, net)
    pipe = r["communication"]["pipeline"]
    assert pipe["bubble_s"] == pytest.approx(micro)  # (2 - 1) / 1 micro-batch
    # 2 x (4 + 1) = 10 sends inside the node: latency + 65,536 B at its bus bandwidth
    each = node.latency_s + 65536 / node.bus_bandwidth
    assert pipe["p2p_transfers"] == 10 and not pipe["p2p_between_nodes"]
    assert pipe["p2p_s"] == pytest.approx(10 * each)
    assert r["step_s"] == pytest.approx(4 * micro + micro + 10 * each + update)
    # a replica's 8 sequences a step over its 2 GPUs
    assert r["per_gpu_samples_per_s"] == pytest.approx(8 / r["step_s"] / 2)
    assert r["scaling_efficiency"] == pytest.approx((4 * micro + update) / r["step_s"])
    # 16 GPUs of 8 a node, 8 replicas: each stage's replicas fill a node, the sends cross
    wide = scale_out(stage, params, ScaleConfig(gpus=16, pp=2, grad_accum=4, p2p_bytes=65536),
                     node, net)
    assert wide["communication"]["pipeline"]["p2p_between_nodes"]
    assert wide["communication"]["comm_s"] > 0  # the replicas' all-reduce
    for kwargs in ({"gpus": 6, "pp": 4}, {"gpus": 8, "pp": 2, "strategy": "fsdp"}):
        with pytest.raises(DlperfError, match="--pp"):
            ScaleConfig(**kwargs)


def test_analyze_pp_prints_and_saves_the_pipeline(tmp_path, capsys):
    from conftest import run_cli

    path = tmp_path / "pp.json"
    common = ["analyze", "gpt2", "--layers", "4", "--d-model", "256", "--heads", "8",
              "--seq-len", "128", "--batch-size", "2", "--dtype", "bf16", "--train",
              "--device", "a100-80gb", "--top", "1"]
    code, out, err = run_cli(common + ["--gpus", "32", "--tp", "2", "--pp", "2",
                                       "--pp-virtual", "2", "--grad-accum", "8",
                                       "--json", str(path)], capsys)
    assert code == 0, err
    text = " ".join(out.split())
    assert "2-way tensor parallel in the node, 2 pipeline stages of 2 virtual chunks, DDP " \
           "over 8 replicas" in text
    # 2 x (8 x 2 + 1) = 34 sends of 2 x 128 x 256 bf16 / 2 ranks
    assert "pipeline bubble" in text and "34 point-to-point sends" in text
    assert "the scale-out below times its slowest pipeline stage" in text
    data = json.loads(path.read_text())["scale_out"]
    pipe = data["at_requested_scale"]["communication"]["pipeline"]
    assert pipe["p2p_bytes_each"] == 2 * 128 * 256 * 2 // 2 and pipe["micro_batches"] == 8
    assert [row["gpus"] for row in data["curve"]][:2] == [4, 8]  # whole pipelines only
    for extra, words in ((["--pp", "2"], "--pp 2 splits the model"),
                         (["--gpus", "8", "--pp", "3"], "do not split into 3"),
                         (["--gpus", "8", "--pp", "2", "--strategy", "fsdp"],
                          "runs with --strategy ddp")):
        code, out, err = run_cli(common + extra, capsys)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
    code, out, err = run_cli(["analyze", "resnet18", "--train", "--gpus", "8", "--pp", "2"],
                             capsys)
    assert code == 2 and "--pp: only for gpt" in err


def test_a_tied_embedding_is_held_by_the_first_and_the_last_stage():
    # GPT-2's output layer reuses the input embedding: named "tok.weight" (before the first
    # block: stage 0) and "head.weight" (after the last: stage 3); 4 blocks on 4 stages
    blocks = [f"blocks.{i}" for i in range(4)]
    named = [("tok.weight", 1, 4000), ("pos.weight", 2, 100), ("blocks.0.fc.weight", 3, 50),
             ("blocks.3.fc.weight", 4, 50), ("ln_f.weight", 5, 10), ("head.weight", 1, 4000)]
    rows, tied = pipeline.stage_params(named, blocks, 4, {"tok", "pos"})
    assert rows == [("tok.weight", 4000, 0), ("pos.weight", 100, 0),
                    ("blocks.0.fc.weight", 50, 0), ("blocks.3.fc.weight", 50, 3),
                    ("ln_f.weight", 10, 3), ("head.weight", 4000, 3)]
    assert tied == 4000  # the copy's gradient, all-reduced between the two stages
    # an untied output layer (Llama's), or one stage: nothing shared
    untied = named[:-1] + [("head.weight", 6, 4000)]
    assert pipeline.stage_params(untied, blocks, 4, {"tok", "pos"})[1] == 0
    assert pipeline.stage_params(named, blocks, 1, {"tok", "pos"})[1] == 0


def test_the_tied_embedding_s_all_reduce_is_charged_on_the_critical_path(tmp_path, capsys):
    import json

    from conftest import run_cli

    from dlperf.analysis.scaling import allreduce_s
    from dlperf.analysis.nccl import generation
    from dlperf.hardware.interconnect import PRESETS

    common = ["analyze", "gpt", "--layers", "4", "--d-model", "256", "--heads", "8",
              "--seq-len", "128", "--vocab", "1024", "--batch-size", "2", "--dtype", "bf16",
              "--train", "--device", "a100-80gb", "--interconnect", "nvlink3-a100,ib-hdr",
              "--gpus", "16", "--tp", "4", "--pp", "2", "--grad-accum", "4"]
    path = tmp_path / "pp.json"
    code, out, err = run_cli(common + ["--json", str(path)], capsys)
    assert code == 0, err
    pipe = json.loads(path.read_text())["scale_out"]["at_requested_scale"]["communication"][
        "pipeline"]
    # gpt ties its embeddings: the vocabulary's quarter on a rank, 256 x 256 fp32 gradients
    assert pipe["tied_embedding_bytes"] == 256 * 256 * 4
    # 16 GPUs in nodes of 8, 4-way TP, 2 stages: a stage's 2 replicas x 4 ranks fill a node,
    # so the first and the last stage are in different nodes: 2 ranks, one a node
    node, net = PRESETS["nvlink3-a100"], PRESETS["ib-hdr"]
    assert pipe["p2p_between_nodes"] is True
    assert pipe["tied_embedding_allreduce_s"] == pytest.approx(
        allreduce_s(256 * 256 * 4, 2, 1, node, net, generation("a100-80gb")))
    assert "the tied embedding's all-reduce" in " ".join(out.split())
    # the first stage's weights: the embeddings and blocks 0-1 of one rank, fp32 (the tied
    # copy on the last stage takes nothing from the first stage's share)
    from dlperf.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(layers=4, d_model=256, heads=8, seq_len=128, vocab=1024, tp=4))
    first = sum(p.numel() for n, p in model.named_parameters()
                if n.split(".")[0] in ("tok", "pos") or n.startswith(("blocks.0.", "blocks.1.")))
    result = json.loads(path.read_text())
    memory = result["scale_out"]["at_requested_scale"]["memory_per_gpu"]
    # fp32 weights and gradients and AdamW's two moments (16 bytes a parameter), one
    # micro-batch's activations of the whole model (1F1B), and DDP's buckets
    assert memory["total_bytes"] == pytest.approx(
        16 * first + result["memory"]["activations_bytes"] + memory["ddp_bucket_bytes"],
        abs=16)


def test_overlapped_transfers_cost_the_fill_and_drain_and_what_outlasts_a_chunk():
    from dlperf.analysis.pipeline import p2p_exposed_s

    # 8 micro-batches, 4 stages, 2 chunks a GPU, 1 ms a transfer: 2 (8 x 2 + 3) = 38 whole
    assert p2p_exposed_s(8, 4, 2, 1e-3, 5e-3) == pytest.approx(38e-3)
    # overlapped beside 5 ms chunks: the fill's and drain's 2 x 3 stay, the 32 others hide
    assert p2p_exposed_s(8, 4, 2, 1e-3, 5e-3, overlap=True) == pytest.approx(6e-3)
    # beside 0.25 ms chunks each of the 32 still costs 0.75 ms: 6 + 24 ms
    assert p2p_exposed_s(8, 4, 2, 1e-3, 0.25e-3, overlap=True) == pytest.approx(30e-3)


def test_pp_overlap_p2p_needs_virtual_stages(capsys):
    from conftest import run_cli

    code, out, err = run_cli(["analyze", "gpt", "--train", "--gpus", "4", "--pp", "2",
                              "--pp-overlap-p2p"], capsys)
    assert code != 0 and "add --pp-virtual V" in " ".join(err.split())
    assert "Traceback" not in err


def test_interleaved_chunks_reduce_as_each_one_ends_by_hand():
    from dlperf.analysis.pipeline import interleaved_data_parallel_s

    # 4 chunks, 2 stages, a 4 ms backward on the stage: chunks end 2 x 4 / 4 = 2 ms apart,
    # at -6, -4, -2 and 0 ms. A 4 ms reduction (1 ms a chunk) hides but the last chunk's 1 ms;
    # a 12 ms one (3 ms a chunk) queues: -6 -> -3, -3 -> 0, 0 -> 3, 3 -> 6: 6 ms exposed.
    # The gathers (1 ms a chunk) feed forwards 2 x 2 / 4 = 1 ms apart: only the first waits;
    # at 2 ms a chunk, chunk j is ready at 2 (j + 1) and needed at j: 5 ms for the last
    ms = 1e-3
    assert interleaved_data_parallel_s(4 * ms, 4 * ms, 2, 4, 2 * ms, 4 * ms) == (
        pytest.approx(1 * ms), pytest.approx(1 * ms))
    assert interleaved_data_parallel_s(12 * ms, 8 * ms, 2, 4, 2 * ms, 4 * ms) == (
        pytest.approx(6 * ms), pytest.approx(5 * ms))
    # one chunk: all of it after the backward, and the whole gather before the forward
    assert interleaved_data_parallel_s(4 * ms, 3 * ms, 2, 1, 2 * ms, 4 * ms) == (
        pytest.approx(4 * ms), pytest.approx(3 * ms))
    assert interleaved_data_parallel_s(0.0, 0.0, 8, 6, 1.0, 2.0) == (0.0, 0.0)


def test_an_interleaved_stage_reduces_per_model_chunk():
    from dlperf.analysis.pipeline import interleaved_data_parallel_s
    from dlperf.analysis.nccl import generation
    from dlperf.analysis.scaling import sharded_collective_s

    stage, params, node, net = _second_stage()
    # 32 GPUs, 2 stages of one GPU, 2 chunks each: 16 replicas of a stage, 8 a node
    cfg = ScaleConfig(gpus=32, pp=2, pp_virtual=2, grad_accum=4, step_cv=0.0,
                      distributed_optimizer=True)
    comm = scale_out(stage, params, cfg, node, net)["communication"]
    grads = sum(b for _, b in params)
    gen = generation(stage.device.name)
    each = sharded_collective_s(grads / 2, 16, 8, node, net, gen=gen)
    gather = sharded_collective_s(grads / 2 / 2, 16, 8, node, net, gen=gen)  # bf16 halves
    forward = sum(p.time_s for p in stage.predictions if p.cost.phase == "forward")
    backward = sum(p.time_s for p in stage.predictions if p.cost.phase in ("dgrad", "wgrad"))
    assert comm["per_model_chunk"] and comm["buckets"] == 2
    assert comm["comm_s"] == pytest.approx(2 * each)
    assert comm["param_gather_s"] == pytest.approx(2 * gather)
    want = interleaved_data_parallel_s(2 * each, 2 * gather, 2, 2, forward, backward)
    assert comm["exposed_s"] == pytest.approx(want[0])
    assert comm["param_gather_exposed_s"] == pytest.approx(want[1])
    # without virtual stages, DDP's buckets as before
    flat = scale_out(stage, params, ScaleConfig(gpus=32, pp=2, grad_accum=4, step_cv=0.0,
                                                distributed_optimizer=True), node, net)
    assert "per_model_chunk" not in flat["communication"]
