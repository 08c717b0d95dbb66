"""Issue #14's tensor-parallel check on this machine: one rank of a small GPT on each of 2 CPU
processes (gloo), joined by real all-reduces where Megatron-LM's original scheme has them,
measured against what `dlperf analyze --tp 2 --no-sequence-parallel` charges for them.

1. `dlperf probe --comm` (2 processes, gloo over loopback) fits the interconnect.
2. Each process builds one rank of dlperf's GPT (``GPTConfig(tp=2, sequence_parallel=False)``:
   half the heads, MLP and vocabulary) and runs training steps with one thread (forward, loss,
   backward, SGD), every step barrier-aligned; median of the timed steps on rank 0. Twice:
   - without collectives (both cores busy, as with them), which is the compute;
   - with Megatron's (Shoeybi et al., arXiv 1909.08053, section 3), inserted by module hooks
     as autograd Functions: an all-reduce of each row-parallel layer's output (the attention
     projection, the MLP's second layer) and of the vocabulary-parallel embedding's in the
     forward (Megatron's ``g``), and of the gradient entering each column-parallel layer (the
     QKV projection, the MLP's first layer, the output layer) in the backward (``f``).
3. Prediction: the run without collectives plus the scale-out's tensor-parallel term
   (``scaling.scale_out`` with ``tensor_parallel_collectives(..., sequence_parallel=False)``,
   each all-reduce timed on the probed gloo fit, none hidden) plus its wait for the slower
   process (``scaling.straggler_s``) at the spread of the two processes' step times in the
   run without collectives (as in bench_ddp_cpu.py). What is tested is the collectives' count,
   size and time, not the CPU's compute prediction.

Left out of both: the vocabulary-parallel loss's small all-reduces (max and sum over [B, T]),
which dlperf does not model (the loss here is each rank's cross-entropy over its own slice).

Run: python benchmarks/bench_tp_cpu.py [OUT.json] [--quick]  (about 40 s on 2 cores; --quick:
2 blocks, 4 timed steps, for the test that runs it)
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

import torch
from torch.nn import functional as F

OUT = Path(__file__).resolve().parent / "results" / "tp-cpu.json"
D_MODEL, HEADS, VOCAB, SEQ, BATCH = 256, 8, 4096, 256, 8
SIZES = {"full": (4, 3, 12), "quick": (2, 1, 4)}  # blocks, warm-up steps, timed steps


def _config(layers: int):
    from dlperf.models.gpt import GPTConfig

    return GPTConfig(layers=layers, d_model=D_MODEL, heads=HEADS, vocab=VOCAB, seq_len=SEQ,
                     bias=True, tp=2, sequence_parallel=False)


def _megatron_collectives(model, clock: list[float]) -> int:
    """Megatron's all-reduces on one rank of ``model`` (module docstring), by hooks, in place
    as Megatron's ``_reduce`` runs them; each call's seconds are appended to ``clock``.
    Returns how many a step makes."""
    import time

    import torch.distributed as dist

    def all_reduce(t: torch.Tensor) -> None:
        start = time.perf_counter()
        dist.all_reduce(t)
        clock.append(time.perf_counter() - start)

    class Reduce(torch.autograd.Function):  # g: all-reduce forward, identity backward
        @staticmethod
        def forward(ctx, x):
            ctx.mark_dirty(x)
            all_reduce(x)
            return x

        @staticmethod
        def backward(ctx, grad):
            return grad

    class Copy(torch.autograd.Function):  # f: identity forward, all-reduce backward
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            grad = grad.contiguous()
            all_reduce(grad)
            return grad

    rows = [model.tok] + [m for b in model.blocks for m in (b.attn.proj, b.out)]
    columns = [m for b in model.blocks for m in (b.attn, b.fc)] + [model.head]
    for m in rows:
        m.register_forward_hook(lambda _m, _a, out: Reduce.apply(out))
    for m in columns:
        m.register_forward_pre_hook(lambda _m, args: (Copy.apply(args[0]), *args[1:]))
    return len(rows) + len(columns)


def _worker(rank: int, port: int, collectives: bool, size: str, queue):
    import time

    import torch.distributed as dist

    from dlperf.models.gpt import GPT
    from dlperf.train.distributed import end_worker

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(rank)
    layers, warmup, steps = SIZES[size]
    cfg = _config(layers)
    model = GPT(cfg)
    clock: list[float] = []
    count = _megatron_collectives(model, clock) if collectives else 0
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randint(0, cfg.local_vocab, (BATCH, SEQ))
    y = torch.randint(0, cfg.local_vocab, (BATCH, SEQ))
    times, inside = [], []
    for i in range(warmup + steps):
        dist.barrier()
        clock.clear()
        start = time.perf_counter()
        logits = model(x)
        F.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - start)
            inside.append(list(clock))
    queue.put((rank, times, count, inside))
    end_worker(0)  # both ranks meet, then no finalization (distributed.end_worker)


def main(argv: list[str]) -> int:
    import torch.multiprocessing as mp

    from dlperf.analysis.api import AnalysisConfig, capture_costs, predict_on
    from dlperf.analysis.scaling import (ScaleConfig, allreduce_s, scale_out, straggler_s,
                                         tensor_parallel_collectives)
    from dlperf.hardware.comm_probe import _free_port, probe_comm
    from dlperf.hardware.probe import cached_cpu_probe
    from dlperf.models.gpt import GPT
    from dlperf.provenance import save_result

    size = "quick" if "--quick" in argv else "full"
    argv = [a for a in argv if a != "--quick"]
    out = Path(argv[0]) if argv else OUT
    layers, warmup, steps = SIZES[size]
    ic, comm = probe_comm(world=2, quick=size == "quick")
    print(f"gloo fit: {ic.bus_bandwidth / 1e9:.2f} GB/s bus bandwidth, "
          f"{ic.latency_s * 1e6:.0f} us per step")
    ctx = mp.get_context("spawn")

    def two_processes(collectives: bool) -> tuple[list[list[float]], int]:
        queue = ctx.SimpleQueue()
        port = _free_port()
        procs = [ctx.Process(target=_worker, args=(r, port, collectives, size, queue))
                 for r in range(2)]
        for p in procs:
            p.start()
        results = {r: (t, n, c) for r, t, n, c in (queue.get() for _ in procs)}
        for p in procs:
            p.join(timeout=600)
        return [results[0][0], results[1][0]], results[0][1], [results[0][2], results[1][2]]

    alone, _, _ = two_processes(collectives=False)
    joined, count, inside = two_processes(collectives=True)
    # seconds a step inside the all-reduce calls: each rank's include its waits for the other
    # at every call; at each call the rank that came last waited least, so the sum of the
    # two ranks' smaller time call by call is the transfers, and the rest the waits
    in_calls = statistics.median(sum(step) for step in inside[0])
    transfers = statistics.median(sum(min(a, b) for a, b in zip(s0, s1))
                                  for s0, s1 in zip(*inside))
    compute = statistics.median(alone[0])
    measured = statistics.median(joined[0])
    spread = statistics.stdev(a - b for a, b in zip(*alone)) / 2**0.5 / statistics.fmean(
        alone[0] + alone[1])

    cfg = _config(layers)
    with torch.device("meta"):
        model = GPT(cfg)
    spec = cached_cpu_probe(quick=True)[0]
    acfg = AnalysisConfig(model="gpt", input_shape=(BATCH, SEQ), dtype="fp32", train=True,
                          device=spec.name, tokens=True, optimizer="sgd")
    costs, uncounted, seconds, memory = capture_costs(model, acfg, torch.long)
    analysis = predict_on(costs, uncounted, acfg, spec, seconds, memory=memory)
    coll = tensor_parallel_collectives(layers, BATCH * SEQ, D_MODEL, 4, recompute=False,
                                       sequence_parallel=False)
    here = scale_out(analysis, [("w", 4)], ScaleConfig(gpus=2, gpus_per_node=2, tp=2,
                                                       tp_collectives=coll, step_cv=spread),
                     ic, ic)
    tp = here["communication"]["tensor_parallel"]
    wait = straggler_s(compute, 2, spread)
    predicted = compute + tp["exposed_s"] + wait
    nbytes = BATCH * SEQ * D_MODEL * 4
    result = {"interconnect": ic.to_dict(), "comm_measurements": comm,
              "collectives_per_step_run": count,
              "collectives_per_step_predicted": tp["collectives_per_micro_batch"],
              "bytes_each": nbytes, "predicted_allreduce_s": allreduce_s(nbytes, 2, 2, ic, ic),
              "step_spread_measured": spread,
              "without_collectives_step_times_s": alone,
              "with_collectives_step_times_s": joined,
              "without_collectives_step_s": compute, "with_collectives_step_s": measured,
              "measured_tp_cost_s": measured - compute,
              "measured_in_allreduce_calls_s": in_calls,
              "measured_in_allreduce_calls_less_waiting_rank_s": transfers,
              "predicted_tp_exposed_s": tp["exposed_s"], "predicted_straggler_s": wait,
              "predicted_step_s": predicted, "error": predicted / measured - 1,
              "cost_ratio": (predicted - compute) / (measured - compute)}
    print(f"{count} all-reduces of {nbytes / 2**20:.1f} MiB a step (dlperf counts "
          f"{tp['collectives_per_micro_batch']}); step without them {compute * 1e3:.0f} ms, "
          f"with them {measured * 1e3:.0f} ms measured, {predicted * 1e3:.0f} ms predicted "
          f"({predicted / measured - 1:+.0%}): tensor parallelism costs "
          f"{(measured - compute) * 1e3:.0f} ms measured, {(predicted - compute) * 1e3:.0f} ms "
          f"predicted ({tp['exposed_s'] * 1e3:.0f} ms of all-reduces, {wait * 1e3:.1f} ms for "
          f"the slower process at the measured spread {spread:.1%}); inside the all-reduce "
          f"calls {in_calls * 1e3:.0f} ms a step on rank 0, of which transfers (the later rank's "
          f"time at each call) {transfers * 1e3:.0f} ms")
    save_result(out, "tp-cpu", {"model": "gpt", "layers": layers, "d_model": D_MODEL,
                                "heads": HEADS, "vocab": VOCAB, "seq_len": SEQ,
                                "batch_per_rank": BATCH, "tp": 2, "sequence_parallel": False,
                                "warmup": warmup, "steps": steps, "threads_per_process": 1,
                                "backend": "gloo", "size": size}, result)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
