"""Uneven pipeline stages (analyze --pp-first-layers / --pp-last-layers): the layout of the
blocks (Megatron-Core's --decoder-first/last-pipeline-num-layers, Llama 3's 405B), the stage
of each kernel and parameter under it, and the bubble of stages of unequal time, checked
against a discrete-event run of the 1F1B schedule written here."""

from __future__ import annotations

import json

import pytest

from dlperf.analysis import pipeline
from dlperf.analysis.scaling import ScaleConfig, scale_out
from dlperf.errors import DlperfError
from test_pipeline import _capture, _second_stage


def test_the_layout_by_hand_and_what_megatron_refuses():
    # Llama 3 405B (arXiv 2407.21783, section 3.3.2): 126 blocks on 16 stages of 8 chunks,
    # one block fewer on the first and the last: (126 - 7 - 7) / 14 = 8 on each between,
    # one a chunk
    assert pipeline.check(126, 16, 8, 7, 7) == (7,) + (8,) * 14 + (7,)
    # equal stages as before: 96 / 8
    assert pipeline.check(96, 8, 3) == (12,) * 8
    # only the first given: the other two share 10 - 2 = 8
    assert pipeline.check(10, 3, 1, first=2) == (2, 4, 4)
    assert pipeline.check(10, 3, 1, last=0) == (5, 5, 0)
    assert pipeline.check(10, 2, 1, 4, 6) == (4, 6)
    for args, words in (((126, 16, 8, 6, 7), "do not split into 14 stages of 8 virtual"),
                        ((10, 2, 1, 4, 5), "leave 1 of the 10 blocks on no stage"),
                        ((10, 4, 1, 6, 6), "at most the model's 10"),
                        ((10, 4, 1, -1, 3), "0 or more"),
                        ((10, 1, 1, 2, None), "describe a pipeline")):
        with pytest.raises(ValueError, match=words):
            pipeline.check(*args)


def test_kernels_and_parameters_follow_an_uneven_layout():
    model, acfg, (costs, uncounted, seconds, memory) = _capture(layers=4)
    blocks = [f"blocks.{i}" for i in range(4)]
    # 3 stages: the first holds the embeddings and no block, then 3 blocks, then 1 and the
    # output layer
    layout = pipeline.check(4, 3, 1, 0, 1)
    assert layout == (0, 3, 1)
    stages = pipeline.stage_of_costs(costs, blocks, layout)
    for c, s in zip(costs, stages):
        if c.phase == "optimizer":
            assert s is None
        elif c.module.startswith(("blocks.0", "blocks.1", "blocks.2")):
            assert s == 1, c
        elif c.module.startswith("blocks.3"):
            assert s == 2, c
        elif c.module in ("tok", "pos"):
            assert s == 0, c
        elif c.module in ("ln_f", "head"):
            assert s == 2, c
    first = {c.module for c, s in zip(costs, stages) if s == 0 and c.phase == "forward"}
    assert pipeline.param_stage("blocks.0.fc.weight", blocks, layout, first) == 1
    assert pipeline.param_stage("blocks.3.fc.weight", blocks, layout, first) == 2
    assert pipeline.param_stage("tok.weight", blocks, layout, first) == 0
    # a number of stages is the equal layout, as before
    assert pipeline.stage_of_costs(costs, blocks, 2) == pipeline.stage_of_costs(
        costs, blocks, (2, 2))


def test_the_stage_that_holds_the_most_activations():
    # 1F1B: stage s keeps N - s micro-batches of its blocks. Equal stages: the first, one
    # micro-batch of the whole model (4 x 8 / 32)
    assert pipeline.in_flight_share((8, 8, 8, 8), 0) == 1.0
    assert pipeline.in_flight_share((8, 8, 8, 8), 1) == pytest.approx(3 * 8 / 32)
    # Llama 3's: the first 16 x 7 / 126 = 0.889, the second 15 x 8 / 126 = 0.952, the most
    layout = pipeline.check(126, 16, 8, 7, 7)
    assert pipeline.in_flight_share(layout, 0) == pytest.approx(112 / 126)
    assert pipeline.in_flight_share(layout, 1) == pytest.approx(120 / 126)
    memory = {"weights_bytes": 100, "gradients_bytes": 100, "optimizer_state_bytes": 200,
              "activations_bytes": 1260, "total_bytes": 1660}
    held = pipeline.stage_memory(memory, 0.5, 120 / 126)
    assert held["activations_bytes"] == 1200 and held["total_bytes"] == 200 + 1200
    # interleaved (Megatron's warm-up: 2 (N - s - 1) + (V - 1) N chunks, and one more held):
    # Llama 3's first stage 30 + 112 + 1 = 143 chunks of 7 / 8 block, the second 28 + 112 +
    # 1 = 141 of one block: 125.1 and 141 of 126 blocks, the second still the most
    assert pipeline.in_flight_share(layout, 0, 8) == pytest.approx(143 * 7 / 8 / 126)
    assert pipeline.in_flight_share(layout, 1, 8) == pytest.approx(141 / 126)
    # equal stages: the first is Korthikanti's 1 + (N - 1) / (N V) (8 stages of 6 blocks,
    # V = 3: 14 + 16 + 1 = 31 chunks of 2 blocks, 62 of 48), and the later ones hold less
    assert pipeline.in_flight_share((6,) * 8, 0, 3) == pytest.approx(pipeline.in_flight(8, 3))
    assert pipeline.in_flight_share((6,) * 8, 1, 3) < pipeline.in_flight_share((6,) * 8, 0, 3)
    # no more in flight than the step's micro-batches: 2 of them on 4 stages (1F1B), or 2 x 3
    # chunks interleaved
    assert pipeline.in_flight_share((8, 8, 8, 8), 0, 1, 2) == pytest.approx(0.5)
    assert pipeline.in_flight_share((6,) * 4, 0, 3, 2) == pytest.approx(6 * 2 / 24)


def one_f_one_b(forward: list[float], backward: list[float], micro_batches: int) -> float:
    """The step of the 1F1B schedule (PipeDream-Flush, Megatron-LM's default) of stages with
    their own forward and backward times, by running it: stage s runs N - s - 1 forwards, then
    one forward and one backward in turn, then the backwards left; a forward waits for the
    stage before, a backward for the stage after (the last stage's for its own forward)."""
    pp = len(forward)
    orders = []
    for s in range(pp):
        warm = min(pp - s - 1, micro_batches)
        ops, f, b = [("F", i) for i in range(warm)], warm, 0
        while b < micro_batches:
            if f < micro_batches:
                ops.append(("F", f))
                f += 1
            ops.append(("B", b))
            b += 1
        orders.append(ops)
    done: dict[tuple, float] = {}
    position, free = [0] * pp, [0.0] * pp
    moved = True
    while moved:
        moved = False
        for s in range(pp):
            while position[s] < len(orders[s]):
                kind, i = orders[s][position[s]]
                if kind == "F":
                    needs = ("F", s - 1, i) if s > 0 else None
                else:
                    needs = ("B", s + 1, i) if s < pp - 1 else ("F", s, i)
                if needs is not None and needs not in done:
                    break
                start = max(free[s], done[needs] if needs else 0.0)
                free[s] = done[(kind, s, i)] = start + (forward[s] if kind == "F"
                                                        else backward[s])
                position[s] += 1
                moved = True
    assert position == [len(o) for o in orders]  # the schedule ran to its end
    return max(free)


@pytest.mark.parametrize("times", [
    [1.0] * 8,  # equal stages: (M + N - 1) T
    [7 / 8] + [1.0] * 14 + [7.65 / 8],  # Llama 3's: lighter first and last
    [0.5] + [1.0] * 7,  # a first stage of the embedding alone
    [1.0] * 7 + [1.3],  # a heavy last stage (the output layer)
])
@pytest.mark.parametrize("micro_batches", [8, 32])
def test_the_bubble_of_unequal_stages_against_the_schedule_run(times, micro_batches):
    forward, backward = times, [2 * t for t in times]
    slowest = max(f + b for f, b in zip(forward, backward))
    fill = pipeline.fill_stages([f + b for f, b in zip(forward, backward)])
    predicted = micro_batches * slowest + pipeline.bubble_s(slowest, len(times), 1, fill)
    ran = one_f_one_b(forward, backward, micro_batches)
    assert predicted == pytest.approx(ran, rel=0.003)
    # the stages' time as if each were the slowest, the bubble before: as much or more
    assert micro_batches * slowest + pipeline.bubble_s(slowest, len(times)) >= ran - 1e-9


def test_fill_stages_by_hand():
    # every stage but one slowest (8) over it: (7 + 13 x 8 + 7.65) / 8 = 14.83125
    assert pipeline.fill_stages([7.0] + [8.0] * 14 + [7.65]) == pytest.approx(
        (7 + 13 * 8 + 7.65) / 8)
    assert pipeline.fill_stages([2.0, 2.0, 2.0]) == 2.0
    # 0.1 x 3 sums to 0.30000000000000004: equal stages still fill exactly N - 1
    assert pipeline.fill_stages([0.1, 0.1, 0.1, 0.1]) == 3
    assert pipeline.bubble_s(2.0, 16, 8, fill=14.5) == pytest.approx(14.5 / 8 * 2)


def test_the_scale_out_charges_the_fill_it_is_given():
    stage, params, node, net = _second_stage()
    base = dict(gpus=4, pp=4, grad_accum=8, step_cv=0.0)
    even = scale_out(stage, params, ScaleConfig(**base), node, net)
    light = scale_out(stage, params, ScaleConfig(**base, pp_fill=1.5), node, net)
    pe, pl = (r["communication"]["pipeline"] for r in (even, light))
    assert pe["fill_stages"] == 3 and pl["fill_stages"] == 1.5
    assert pl["bubble_s"] == pytest.approx(pe["bubble_s"] / 2)
    assert even["step_s"] - light["step_s"] == pytest.approx(pe["bubble_s"] / 2)
    for fill in (-0.5, 3.5, float("nan")):
        with pytest.raises(DlperfError, match="fill"):
            ScaleConfig(**base, pp_fill=fill)


def test_analyze_with_uneven_stages(tmp_path, capsys):
    from conftest import run_cli

    path = tmp_path / "uneven.json"
    common = ["analyze", "gpt2", "--layers", "10", "--d-model", "256", "--heads", "8",
              "--vocab", "1024",
              "--seq-len", "128", "--batch-size", "2", "--dtype", "bf16", "--train",
              "--device", "a100-80gb", "--top", "1"]
    code, out, err = run_cli(common + ["--gpus", "8", "--pp", "4", "--pp-first-layers", "2",
                                       "--pp-last-layers", "2", "--grad-accum", "8",
                                       "--json", str(path)], capsys)
    assert code == 0, err
    text = " ".join(out.split())
    assert "stages of 2, 3, 3, 2 blocks" in text
    pipe = json.loads(path.read_text())["scale_out"]["at_requested_scale"][
        "communication"]["pipeline"]
    # a middle stage of 3 blocks is the slowest; the others count less than 3 of it
    assert pipe["slowest_stage"] in (1, 2) and 1.5 < pipe["fill_stages"] < 3
    for extra, words in ((["--pp-first-layers", "2"], "describes a pipeline's stages"),
                         (["--gpus", "8", "--pp", "4", "--pp-first-layers", "3"],
                          "do not split into 3 stages"),
                         (["--gpus", "8", "--pp", "4", "--pp-first-layers", "6",
                           "--pp-last-layers", "6"], "at most the model's 10")):
        code, out, err = run_cli(common + extra, capsys)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_a_last_stage_of_no_blocks_with_context_parallelism(tmp_path, capsys):
    from conftest import run_cli

    path = tmp_path / "nolast.json"

    def slowest(vocab: int) -> tuple[int, int]:
        code, out, err = run_cli(
            ["analyze", "gpt2", "--layers", "4", "--d-model", "256", "--heads", "8",
             "--vocab", str(vocab), "--seq-len", "128", "--batch-size", "2", "--dtype",
             "bf16", "--train", "--device", "a100-80gb", "--top", "1", "--gpus", "8", "--pp",
             "2", "--pp-last-layers", "0", "--cp", "2", "--grad-accum", "4", "--json",
             str(path)], capsys)
        assert code == 0, err
        comm = json.loads(path.read_text())["scale_out"]["at_requested_scale"]["communication"]
        return comm["pipeline"]["slowest_stage"], comm["context_parallel"][
            "exchanges_per_micro_batch"]

    # a small output layer: the 4 blocks' stage is the slowest, each block's ring 3 transfers
    # (cp - 1 forward, cp - 1 backward, the last gradient home): 12
    assert slowest(8192) == (0, 12)
    # a vocabulary of 65,536 x 256: the output layer and the loss alone are the slowest
    # stage, which holds no attention and exchanges no K or V
    assert slowest(65536) == (1, 0)


def test_megatron_cores_layout_string_by_hand():
    # Megatron-Bridge's Llama 3 70B (80 blocks, PP 8 x 5 virtual): chunk 0 "Et*2" (the
    # embedding and 2 blocks), 34 chunks of 2, one of 3 (chunk 35: stage 35 mod 8 = 3), 3 of
    # 2, the last "tL" (1 block, the output layer: stage 7). Stage 3: 4 x 2 + 3 = 11 blocks,
    # stage 7: 4 x 2 + 1 = 9, the rest 10
    assert pipeline.parse_layout("Et*2|(t*2|)*34,t*3|(t*2|)*3,tL", 80, 8) == (
        (10, 10, 10, 11, 10, 10, 10, 9), 5)
    # the Llama 3 405B split as a layout is check's (one block fewer on the first and last)
    layout, virtual = pipeline.parse_layout("Et|(tt|)*62,tL", 126, 8)
    assert virtual == 8 and layout == pipeline.check(126, 8, 8, 15, 15)
    for text, layers, pp, words in (("Et|tt|tL", 4, 2, "3 chunks do not split over 2"),
                                    ("tE|ttL", 3, 2, "embedding (E) comes once, first"),
                                    ("Et|tL|t", 3, 3, "(L) come once, last"),
                                    ("Et|ttL", 4, 2, "places 3 blocks; the model has 4"),
                                    ("Et|tmL", 3, 2, "no MTP layers"),
                                    ("(Et|tL", 2, 2, "cannot unroll")):
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
            pipeline.parse_layout(text, layers, pp)


def test_a_layout_string_runs_as_the_first_and_last_stage_flags_do(tmp_path, capsys):
    from conftest import run_cli

    common = ["analyze", "gpt2", "--layers", "10", "--d-model", "256", "--heads", "8",
              "--vocab", "1024", "--seq-len", "128", "--batch-size", "2", "--dtype", "bf16",
              "--train", "--device", "a100-80gb", "--top", "1", "--gpus", "8", "--pp", "2",
              "--pp-virtual", "2", "--grad-accum", "8"]
    rates = []
    # stage 0: chunks 0 and 2 (2 + 2 blocks and the embedding), stage 1: chunks 1 and 3
    # (3 + 3 and the output layer): check's (4, 6)
    for extra in (["--pp-first-layers", "4"], ["--pp-layout", "Ett|ttt|tt|tttL"]):
        path = tmp_path / "r.json"
        code, out, err = run_cli(common + extra + ["--json", str(path)], capsys)
        assert code == 0, err
        assert "stages of 4, 6 blocks" in " ".join(out.split())
        here = json.loads(path.read_text())["scale_out"]["at_requested_scale"]
        rates.append((here["per_gpu_samples_per_s"], here["communication"]["pipeline"]))
    assert rates[0] == rates[1]
    base = common[:common.index("--pp-virtual")]
    for extra, words in ((["--pp-virtual", "1", "--pp-layout", "Ett|ttt|tt|tttL"],
                          "has 2 chunks a stage over --pp 2: give --pp-virtual 2"),
                         (["--pp-virtual", "2", "--pp-layout", "Ett|ttt|tt|tttL",
                           "--pp-first-layers", "4"], "drop --pp-first-layers"),
                         (["--pp-layout", "Et|ttttttttL"], "places 9 blocks; the model has 10")):
        code, out, err = run_cli(base + extra, capsys)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
