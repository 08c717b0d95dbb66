"""Context parallelism (analyze --cp): one rank's chunks of every sequence in the built-in
decoder (models/gpt.py ``cp_attend``), the exchanges of K and V that join the ranks, and the
data-parallel strategy over the replicas (analysis/scaling.py ``context_parallel_s``)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dlperf.analysis.api import AnalysisConfig, capture_costs, predict_on
from dlperf.analysis.scaling import (ScaleConfig, context_parallel_s, one_step, scale_out,
                                     sharded_collective_s)
from dlperf.errors import DlperfError
from dlperf.hardware.interconnect import PRESETS
from dlperf.hardware.specs import get_device
from dlperf.models.gpt import GPT, GPTConfig, cp_attention_kernels, gpt_config


def _partial(q, k, v, causal):
    """Attention of q [T_q, D] over k, v [T_k, D] in float64, with its row log-sum-exp (what
    a flash kernel returns beside its output, for the merge)."""
    scores = q @ k.T / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1),
                                    float("-inf"))
    lse = scores.logsumexp(-1, keepdim=True)
    return (scores - lse).exp() @ v, lse


@pytest.mark.parametrize("comm", ["p2p", "allgather"])
@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_the_ranks_kernels_compute_exactly_causal_attention(cp, comm):
    # the whole sequence's causal attention in float64 against each rank's kernels, their
    # partial outputs merged by log-sum-exp as TransformerEngine merges them
    torch.manual_seed(cp)
    c, d = 3, 4  # tokens a chunk, head size
    q, k, v = torch.randn(3, 2 * cp * c, d, dtype=torch.float64).unbind(0)
    want, _ = _partial(q, k, v, causal=True)

    def rows(chunks):
        return torch.cat([torch.arange(m * c, (m + 1) * c) for m in chunks])

    for rank in range(cp):
        mine = (rank, 2 * cp - 1 - rank)
        out = {m: None for m in mine}
        for qs, ks, causal in cp_attention_kernels(cp, rank, comm):
            assert set(qs) <= set(mine)  # a rank computes only its own queries' outputs
            o, lse = _partial(q[rows(qs)], k[rows(ks)], v[rows(ks)], causal)
            for i, m in enumerate(qs):
                part = (o[i * c:(i + 1) * c], lse[i * c:(i + 1) * c])
                if out[m] is None:
                    out[m] = part
                else:  # the merge: both parts weighted by their share of the softmax
                    (o0, l0), (o1, l1) = out[m], part
                    total = torch.logaddexp(l0, l1)
                    out[m] = (o0 * (l0 - total).exp() + o1 * (l1 - total).exp(), total)
        for m in mine:
            torch.testing.assert_close(out[m][0], want[rows((m,))], rtol=1e-12, atol=1e-12)


def test_every_rank_does_the_same_causal_work():
    # the work of a kernel as the flash cost model counts it (costs.attention_cost: half of
    # Lq x Lk when causal and square, else all of it), in chunk-squared units: a rank's share
    # is the whole causal sequence's, (2 cp)^2 / 2, over cp = 2 cp
    for comm in ("p2p", "allgather"):
        for cp in (2, 4, 8, 16):
            for rank in range(cp):
                work = sum(len(qs) * len(ks) * (0.5 if causal else 1.0)
                           for qs, ks, causal in cp_attention_kernels(cp, rank, comm))
                assert work == 2 * cp
    # the ring: cp kernels; the all-gather: two per chunk (one for the first chunk, which has
    # nothing before it)
    assert len(cp_attention_kernels(8, 3, "p2p")) == 8
    assert len(cp_attention_kernels(8, 0, "allgather")) == 3
    assert len(cp_attention_kernels(8, 7, "allgather")) == 4


def _capture(cp: int, comm: str = "p2p", **kwargs):
    """One rank of a small Llama-style decoder (d 256, 8 heads, 2 K/V heads, 128 tokens,
    batch 2), bf16, training on the H100 preset: (config, model, analysis)."""
    cfg = gpt_config("llama3-8b", layers=2, d_model=256, heads=8, kv_heads=2, vocab=1024,
                     seq_len=128, ffn_hidden=512, cp=cp, cp_comm=comm, **kwargs)
    with torch.device("meta"):
        model = GPT(cfg)
    acfg = AnalysisConfig(model="llama3-8b", input_shape=(2, cfg.local_seq_len), dtype="bf16",
                          train=True, device="h100-sxm", tokens=True, optimizer="adamw")
    costs, uncounted, seconds, memory = capture_costs(model, acfg, torch.long)
    return cfg, model, predict_on(costs, uncounted, acfg, get_device("h100-sxm"), seconds,
                                  memory=memory)


def _flops(analysis, op=None) -> float:
    return sum(p.cost.flops for p in analysis.predictions
               if p.cost.phase != "optimizer" and (op is None or p.cost.op.startswith(op)))


def test_a_rank_runs_a_cp_th_of_the_model_s_flops():
    # the capture's own cost model: the attention kernels of one rank are exactly 1/cp of
    # the whole sequence's causal attention (forward and backward), and so are the GEMMs
    # (every other layer runs on 1/cp of the tokens); the elementwise work too
    _, _, whole = _capture(1)
    for cp, comm in ((2, "p2p"), (4, "p2p"), (4, "allgather")):
        cfg, model, rank = _capture(cp, comm)
        assert cfg.local_seq_len == 128 // cp
        assert _flops(rank, "attention") * cp == pytest.approx(_flops(whole, "attention"))
        assert _flops(rank, "mm") * cp == pytest.approx(_flops(whole, "mm"), rel=1e-9)
        # the same weights on every rank
        assert sum(p.numel() for p in model.parameters()) == 2 * (
            2 * 256 * 256 + 2 * 256 * 64 + 3 * 256 * 512 + 2 * 256) + 2 * 1024 * 256 + 256
    # the ring's kernels: cp a layer forward, cp backward
    _, _, ring = _capture(4)
    assert sum(p.cost.op == "attention" for p in ring.predictions) == 2 * 4
    assert sum(p.cost.op == "attention_backward" for p in ring.predictions) == 2 * 4


def test_a_split_the_sequence_cannot_take_is_refused():
    with pytest.raises(ValueError, match="8 equal chunks"):
        GPTConfig(layers=1, d_model=64, heads=4, seq_len=100, cp=4)
    with pytest.raises(ValueError, match="attention 'sdpa'"):
        GPTConfig(layers=1, d_model=64, heads=4, seq_len=64, cp=2, attention="math")
    with pytest.raises(ValueError, match="cp_comm"):
        GPTConfig(layers=1, d_model=64, heads=4, seq_len=64, cp=2, cp_comm="ring")
    # sequence parallel splits a rank's 16 tokens over the tensor-parallel ranks: 32 do not go
    with pytest.raises(ValueError, match="16 tokens on each of 4 context-parallel ranks"):
        GPTConfig(layers=1, d_model=64, heads=32, seq_len=64, cp=4, tp=32)
    sized = {"cp_kv_bytes": 1024, "cp_layers": 2}
    for kwargs in ({"gpus": 8, "cp": 3, **sized}, {"gpus": 8, "cp": 2, "tp": 8, **sized},
                   {"gpus": 8, "cp": 2, "cp_comm": "ring", **sized}, {"gpus": 8, "cp": 2}):
        with pytest.raises(DlperfError, match="--cp"):
            ScaleConfig(**kwargs)


def test_the_ways_to_exchange_k_and_v_are_named_once():
    from dlperf.analysis import scaling
    from dlperf.cli import build_parser
    from dlperf.models import gpt

    # the model's, the scale-out's and the CLI's lists are one
    assert scaling.CP_COMMS == gpt.CP_COMMS
    analyze = build_parser()._subparsers._group_actions[0].choices["analyze"]
    flag = next(a for a in analyze._actions if "--cp-comm" in a.option_strings)
    assert tuple(flag.choices) == gpt.CP_COMMS


class _Link:
    latency_s, bus_bandwidth = 5e-6, 100e9


def test_the_exchanges_by_hand():
    from types import SimpleNamespace as S

    def kernel(op, phase, t):
        return S(time_s=t, cost=S(op=op, phase=phase))

    # a stage of 2 layers, cp 4: each layer's 4 forward kernels 0.4 ms in all (0.1 each),
    # backward 1.2 ms (0.3 each); a recompute of the forward's
    predictions = [kernel("attention", "forward", 0.4e-3), kernel("attention", "forward", 0.4e-3),
                   kernel("attention_backward", "dgrad", 1.2e-3),
                   kernel("attention_backward", "dgrad", 1.2e-3),
                   kernel("mm", "forward", 5e-3)]
    kv = 15e6  # bytes: 5 us + 150 us a transfer
    x = 5e-6 + 15e6 / 100e9
    d = context_parallel_s(predictions, 4, "p2p", kv, 2, True, None, _Link)
    # forward: 3 transfers of 155 us beside 100 us kernels, 55 us left each; backward: 3 of
    # 310 us beside 300 us, 10 us left each, and the last gradient home, 155 us
    assert d["exchanges_per_micro_batch"] == 2 * (3 + 3 + 1)
    assert d["busy_s"] == pytest.approx(2 * (3 * x + 3 * 2 * x + x))
    assert d["exposed_s"] == pytest.approx(2 * (3 * (x - 1e-4) + 3 * (2 * x - 3e-4) + x))
    # the all-gather: one before each layer's attention, a reduce-scatter after its backward,
    # of the 4 ranks' K and V, none hidden; twice more with a recomputed forward
    seen = []
    d = context_parallel_s(predictions + [kernel("attention", "recompute", 0.4e-3)], 4,
                           "allgather", kv, 2, False,
                           lambda nbytes: seen.append(nbytes) or 1e-3, _Link)
    assert seen == [4 * kv] and d["exchanges_per_micro_batch"] == 2 * 3
    assert d["busy_s"] == d["exposed_s"] == pytest.approx(2 * 3 * 1e-3)


def test_context_parallel_shares_the_samples_and_reduces_over_dp_times_cp():
    cfg, model, analysis = _capture(2)
    params = [(n, p.numel() * 4) for n, p in model.named_parameters()]
    node, net = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]
    kv = 2 * 2 * 64 * 2 * 32 * 2  # K and V: batch 2 x 64 tokens x 2 heads x 32 x bf16
    single = one_step(analysis, params).single_s
    two = scale_out(analysis, params, ScaleConfig(gpus=2, cp=2, cp_kv_bytes=kv, cp_layers=2,
                                                  step_cv=0.0), node, net)
    d = two["communication"]["context_parallel"]
    assert d["in_node"] and d["exchanges_per_micro_batch"] == 2 * (1 + 1 + 1)
    # the pair is one replica, but its two ranks hold the same weights: their gradients are
    # all-reduced as two DDP replicas' are, and the exchanges' exposed time comes on top
    pair = scale_out(analysis, params, ScaleConfig(gpus=2, step_cv=0.0), node, net)
    assert pair["step_s"] > single
    assert two["step_s"] == pytest.approx(pair["step_s"] + d["exposed_s"])
    # the pair trains the replica's 2 sequences a step: 1 per GPU
    assert two["per_gpu_samples_per_s"] == pytest.approx(2 / two["step_s"] / 2)
    # 16 GPUs: the gradients reduced over all 16 (8 replicas x 2 context-parallel ranks), as
    # plain DDP over 16 GPUs reduces them
    wide = scale_out(analysis, params, ScaleConfig(gpus=16, cp=2, cp_kv_bytes=kv,
                                                   cp_layers=2), node, net)
    dp = scale_out(analysis, params, ScaleConfig(gpus=16), node, net)
    assert wide["communication"]["comm_s"] == pytest.approx(dp["communication"]["comm_s"])
    # tp 4 x cp 4 fills two nodes: the ring crosses them
    far = scale_out(analysis, params, ScaleConfig(gpus=16, tp=4, cp=4, cp_kv_bytes=kv,
                                                  cp_layers=2), node, net)
    assert not far["communication"]["context_parallel"]["in_node"]
    # the all-gather over 2 ranks in the node, timed by NCCL's tuner
    ag = scale_out(analysis, params, ScaleConfig(gpus=2, cp=2, cp_comm="allgather",
                                                 cp_kv_bytes=kv, cp_layers=2), node, net)
    t = sharded_collective_s(2 * kv, 2, 2, node, net, gen=2)
    assert ag["communication"]["context_parallel"]["exposed_s"] == pytest.approx(2 * 2 * t)


def test_analyze_cp_prints_and_saves_the_context_parallel_scale_out(tmp_path, capsys):
    from conftest import run_cli

    path, page = tmp_path / "cp.json", tmp_path / "cp.html"
    common = ["analyze", "gpt", "--layers", "2", "--d-model", "256", "--heads", "8",
              "--seq-len", "128", "--batch-size", "2", "--dtype", "bf16", "--train",
              "--device", "h100-sxm"]
    code, out, err = run_cli(common + ["--gpus", "16", "--cp", "4", "--cp-comm", "allgather",
                                       "--json", str(path), "--html", str(page)], capsys)
    assert code == 0, err
    # the HTML report too: the layout, its reference (the 4 ranks) and the caveat
    report = " ".join(page.read_text().split())
    assert "4-way context parallel, K and V by an all-gather" in report
    assert "of its 4 ranks without their collectives" in report
    assert "Context parallelism is checked against one published run" in report
    text = " ".join(out.split())
    assert "--cp 4: what follows is one context-parallel rank's step: 32 of each sequence's" \
        in text
    assert "4-way context parallel in the node, DDP over 4 replicas" in text
    assert "context-parallel all-gathers and reduce-scatters of K and V 4 of" in text
    # what the one published context-parallel run says (Llama 3 405B's 128K row)
    assert "Context parallelism is checked against one published run, Llama 3 405B" in text
    data = json.loads(path.read_text())
    assert data["config"]["input_shape"] == [2, 32]  # a rank's share of each sequence
    here = data["scale_out"]["at_requested_scale"]
    d = here["communication"]["context_parallel"]
    # K and V: 2 sequences x 32 tokens x 8 heads x 32 x bf16 each
    assert d["cp"] == 4 and d["kv_bytes_each"] == 2 * 2 * 32 * 8 * 32 * 2
    # rates in tokens/s of whole sequences: samples (sequences) x 128 tokens
    assert [row["gpus"] for row in data["scale_out"]["curve"]][:2] == [4, 8]
    assert "tokens/s per GPU" in text
    for extra, words in ((["--cp", "2"], "--cp 2 splits each sequence"),
                         (["--gpus", "8", "--cp-comm", "p2p"], "add --cp N"),
                         (["--gpus", "8", "--cp", "3"], "--cp 3"),
                         (["--gpus", "8", "--cp", "128"], "--cp 128")):
        code, out, err = run_cli(common + extra, capsys)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
    code, out, err = run_cli(["analyze", "resnet18", "--train", "--gpus", "8", "--cp", "2"],
                             capsys)
    assert code == 2 and "--cp: only for gpt and its presets" in err
