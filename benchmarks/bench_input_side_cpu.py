"""Issue #14's input side, checked on this machine: synchronous data-parallel ranks fed by a
host JPEG decode, measured, against what ``analysis/scaling.py`` predicts for them.

The scale-out model says a rank runs at min(its GPU's rate, the host's decode for it), less
the wait for the slowest rank (``straggler_s`` at the shipped spread, on either side), where
the host's decode for one GPU is ``ScaleConfig.host_img_per_s``: the per-core rate times
min(loader workers, the node's cores / the GPUs sharing them). What is checked here is that
formula, with real decoding (dlperf's threaded loader on a JPEG folder, random-resized-crop
and flip at 224 px) and real synchronisation (every step all ranks meet at a barrier, as DDP's
all-reduce makes them), on this host's cores, including the crossover where the GPU's demand
comes close to the decode and a hard min() could be too kind.

No GPU is needed: each rank's "GPU step" is a sleep of a chosen length. A GPU runs its kernels
asynchronously and the host thread only waits for it, which a sleep reproduces: it holds no
core, so the loader's threads decode while the "GPU" computes, as on a real node. The GPU
demand is set as a multiple of the predicted host rate, from well below to well above it.

1. The per-core decode rate r: one process, one loader thread, no GPU step (median of rounds).
2. For 1 and 2 ranks (processes) with 1 and 2 loader threads each, at GPU demands of 0.5x to
   2x the predicted host rate: the per-rank img/s measured over the timed steps (after
   warm-up; the median of the plan's runs), against min(GPU rate, host_img_per_s) with this host's
   cores as the node. The spread of the steps (their coefficient of variation) is kept too.

Run: python benchmarks/bench_input_side_cpu.py CORPUS [OUT.json] [--quick]  (about 4 minutes on
2 cores, --quick a smoke run of ~20 s; CORPUS: an ImageNet-layout JPEG folder, e.g. one made by
`dlperf data corpus`)
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from queue import Empty

OUT = Path(__file__).resolve().parent / "results" / "input-side-cpu.json"
BATCH, SIZE, WARMUP = 32, 224, 3


@dataclass(frozen=True)
class Plan:
    """What is run: timed steps per run, runs per setting, the GPU demands (GPU rate over the
    predicted host rate) and the (ranks, loader threads) shapes. ``--quick``: a smoke run."""

    steps: int = 12
    rounds: int = 3
    demands: tuple = (0.5, 0.8, 0.95, 1.1, 1.5, 2.0)
    shapes: tuple = ((1, 1), (1, 2), (2, 1), (2, 2))


QUICK = Plan(steps=4, rounds=1, demands=(0.5, 2.0), shapes=((1, 1), (2, 1)))


def _loader(corpus: str, threads: int, rank: int, world: int):
    from dlperf.data.loader import Loader, LoaderConfig
    from dlperf.data.sources import open_source

    return Loader(open_source(corpus), LoaderConfig(batch_size=BATCH, size=SIZE, threads=threads,
                                                    prefetch=2, rank=rank, world_size=world,
                                                    pin_memory=False))


def _rank(corpus: str, threads: int, rank: int, world: int, gpu_step_s: float, steps: int,
          barrier, queue):
    """One rank: take a batch, "compute" for gpu_step_s, meet the other ranks; the seconds of
    each step, from one barrier to the next (the wait for the batch included)."""
    loader = _loader(corpus, threads, rank, world)
    times, epoch = [], 0
    barrier.wait()
    last = time.perf_counter()
    try:
        while len(times) < WARMUP + steps:
            loader.set_epoch(epoch)
            for batch in loader:  # the wait for the batch is part of the step
                batch.release()
                time.sleep(gpu_step_s)  # the GPU computes; this thread only waits for it
                barrier.wait()  # DDP's all-reduce: no rank starts the next step alone
                now = time.perf_counter()
                times.append((now - last, len(batch)))
                last = now
                if len(times) >= WARMUP + steps:
                    break
            epoch += 1
    finally:
        loader.close()
    queue.put((rank, times[WARMUP:]))


def run_ranks(corpus: str, ranks: int, threads: int, gpu_step_s: float, steps: int) -> dict:
    """Per-rank img/s of ``ranks`` synchronous processes (each rank's images over its timed
    steps' seconds; the median over ranks), each loading with ``threads`` decode threads."""
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(ranks), ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(corpus, threads, r, ranks, gpu_step_s, steps,
                                             barrier, queue)) for r in range(ranks)]
    for p in procs:
        p.start()
    results = {}
    deadline = time.monotonic() + 600
    while len(results) < ranks:  # a rank that dies stops the run, not a 10-minute wait
        try:
            rank, times = queue.get(timeout=1)
            results[rank] = times
        except Empty:
            if time.monotonic() > deadline or any(not p.is_alive() and p.exitcode
                                                  for p in procs):
                for p in procs:
                    p.kill()
                raise SystemExit(f"a rank failed (exit codes {[p.exitcode for p in procs]})")
    for p in procs:
        p.join(timeout=60)
    rates = [sum(n for _, n in t) / sum(s for s, _ in t) for t in results.values()]
    steps = [s for t in results.values() for s, _ in t]
    return {"img_per_s_per_rank": statistics.median(rates), "ranks_img_per_s": rates,
            "step_cv": statistics.stdev(steps) / statistics.mean(steps)}


def run_rounds(corpus: str, ranks: int, threads: int, gpu_step_s: float, plan: Plan) -> dict:
    """``run_ranks`` ``plan.rounds`` times: the median round by per-rank img/s, and every
    round's."""
    rounds = sorted((run_ranks(corpus, ranks, threads, gpu_step_s, plan.steps)
                     for _ in range(plan.rounds)), key=lambda r: r["img_per_s_per_rank"])
    return {**rounds[len(rounds) // 2],
            "rounds_img_per_s_per_rank": [r["img_per_s_per_rank"] for r in rounds]}


def per_core_rate(corpus: str, plan: Plan) -> float:
    """Images/s of one loader thread alone (no GPU step), the median of the plan's runs."""
    return run_rounds(corpus, 1, 1, 0.0, plan)["img_per_s_per_rank"]


def main(argv: list[str]) -> int:
    from rich.progress import Progress

    from dlperf.analysis.scaling import STEP_CV, ScaleConfig, straggler_s
    from dlperf.provenance import save_result

    plan = QUICK if "--quick" in argv else Plan()
    argv = [a for a in argv if a != "--quick"]
    if not argv or not Path(argv[0]).is_dir():
        print("usage: python benchmarks/bench_input_side_cpu.py CORPUS [OUT.json] [--quick]  "
              "(CORPUS: an ImageNet-layout JPEG folder; `dlperf data corpus DST` makes one)",
              file=sys.stderr)
        return 2
    corpus, out = argv[0], Path(argv[1]) if len(argv) > 1 else OUT
    from dlperf.data.sources import open_source

    most = max(ranks for ranks, _ in plan.shapes)
    if len(open_source(corpus)) < BATCH * most:  # else a rank's epoch has no whole batch
        print(f"{corpus}: {len(open_source(corpus))} images; the benchmark needs at least "
              f"{BATCH * most} ({most} ranks x batch {BATCH})", file=sys.stderr)
        return 2
    cores = len(os.sched_getaffinity(0))
    r = per_core_rate(corpus, plan)
    print(f"one loader thread alone: {r:,.0f} img/s (the per-core rate)")
    rows = []
    with Progress() as bar:
        task = bar.add_task("ranks x threads x GPU demand",
                            total=len(plan.shapes) * len(plan.demands))
        for ranks, threads in plan.shapes:
            # this host is the node: its cores shared by `ranks` GPUs
            cfg = ScaleConfig(gpus=ranks, gpus_per_node=ranks, decode="cpu",
                              data_cores_per_gpu=cores / ranks, decode_img_per_s_per_core=r,
                              loader_workers_per_gpu=threads)
            host = cfg.host_img_per_s(ranks)
            for demand in plan.demands:
                gpu_rate = demand * host
                measured = run_rounds(corpus, ranks, threads, BATCH / gpu_rate, plan)
                # the model's step: the slower of the GPU's and the loader's, waiting for the
                # slowest rank (scale_out: straggler_s at the shipped spread)
                slower_s = BATCH / min(gpu_rate, host)
                predicted = BATCH / (slower_s + straggler_s(slower_s, ranks, STEP_CV))
                rows.append({"ranks": ranks, "loader_threads": threads, "gpu_demand": demand,
                             "gpu_img_per_s": gpu_rate, "host_img_per_s_predicted": host,
                             "predicted_img_per_s": predicted, **measured,
                             "ratio": predicted / measured["img_per_s_per_rank"]})
                bar.advance(task)
    print(f"{'ranks':>5} {'threads':>7} {'demand':>6} {'GPU /s':>8} {'host /s':>8} "
          f"{'predicted':>9} {'measured':>9} {'pred/meas':>9}")
    for row in rows:
        print(f"{row['ranks']:5d} {row['loader_threads']:7d} {row['gpu_demand']:6.2f} "
              f"{row['gpu_img_per_s']:8,.0f} {row['host_img_per_s_predicted']:8,.0f} "
              f"{row['predicted_img_per_s']:9,.0f} {row['img_per_s_per_rank']:9,.0f} "
              f"{row['ratio']:9.3f}")
    errors = sorted(abs(row["ratio"] - 1) for row in rows)
    near = sorted(abs(row["ratio"] - 1) for row in rows if 0.8 <= row["gpu_demand"] <= 1.1)
    summary = {"median_abs_error": statistics.median(errors), "max_abs_error": errors[-1],
               "near_crossover_median_abs_error": statistics.median(near) if near else None,
               "per_core_img_per_s": r, "host_cores": cores}
    print(f"median |error| {summary['median_abs_error']:.1%}, worst {summary['max_abs_error']:.1%}"
          + (f"; near the crossover (demand 0.8-1.1x) {statistics.median(near):.1%}"
             if near else ""))
    save_result(out, "input-side-cpu",
                {"corpus": str(corpus), "batch": BATCH, "size": SIZE, "warmup": WARMUP,
                 "steps": plan.steps, "rounds_for_rate": plan.rounds,
                 "demands": list(plan.demands), "shapes": [list(x) for x in plan.shapes]},
                {"rows": rows, "summary": summary})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
