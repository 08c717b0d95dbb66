"""`dlperf probe --comm`: measure all-reduce on this machine and fit the interconnect model.

Spawns ``world`` processes on this host (torch.distributed: gloo on a CPU, NCCL when each
process has its own GPU), times an all-reduce of each size (warm-up, then the median of
``repeats`` barrier-aligned runs on rank 0: the typical time, which is what a training step
meets), and fits the two terms the scale-out model uses
(``analysis/scaling.py``): a ring all-reduce of S bytes over n processes takes
2(n-1) a + S x 2(n-1)/n / B, so the measured times are a straight line in
x = S x 2(n-1)/n whose slope is 1 / B (NCCL's bus bandwidth) and whose intercept is 2(n-1) a.
The result is an ``Interconnect`` that `dlperf analyze --gpus N --interconnect FILE` accepts.
How far the line misses its worst size is kept with it (``fit_misses``): on a busy host the
medians wander (this project's 2-core VM once timed a 4 KiB all-reduce slower than a 1 MiB
one, benchmarks/results/tp-cpu.json), and every prediction from the file carries that error.
"""

from __future__ import annotations

import os
import socket
import statistics
import time

import numpy as np
import torch

from dlperf.errors import DlperfError
from dlperf.hardware.interconnect import Interconnect

SIZES = (2**12, 2**16, 2**20, 2**22, 2**24)  # bytes
QUICK_SIZES = (2**12, 2**16, 2**20, 2**22)
# On a busy 2-core host one size's median can land above a larger one's (CI once measured
# 1 MiB faster than 64 KiB, a negative slope): the quick set ends at 4 MiB, where the
# bandwidth term dominates, and a fit that does not grow with size is measured again.
ATTEMPTS = 3
TIMEOUT_S = 600  # for all of one measurement's processes together


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, sizes, repeats: int, backend: str, queue):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group(backend, rank=rank, world_size=world)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    medians = []
    for size in sizes:
        t = torch.ones(size // 4, dtype=torch.float32, device=device)
        for _ in range(3):
            dist.all_reduce(t)
        times = []
        for _ in range(repeats):
            dist.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            dist.all_reduce(t)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
        medians.append(statistics.median(times))
    if rank == 0:
        queue.put(medians)
    from dlperf.train.distributed import end_worker

    end_worker(0)  # (the SimpleQueue wrote the medians synchronously)


def fit_ring(sizes, seconds, world: int) -> tuple[float, float]:
    """(bus bandwidth B/s, latency s per step) of the ring model through the measurements,
    least squares on relative error (small and large messages count alike)."""
    x = np.array([s * 2 * (world - 1) / world for s in sizes], dtype=float)
    t = np.array(seconds, dtype=float)
    steps = 2 * (world - 1)
    # t = steps * a + x / B, weighted by 1 / t
    design = np.stack([np.full_like(x, steps), x], axis=1) / t[:, None]
    (a, inv_b), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    a = max(float(a), 0.0)
    if inv_b <= 0:
        raise DlperfError("the all-reduce times do not grow with size; rerun `dlperf probe "
                          "--comm` on a quieter machine")
    return 1.0 / float(inv_b), a


# the probe says so when its line misses a size by more than this factor
MISFIT_WARN = 2.0


def fit_misses(sizes, seconds, fitted) -> tuple[float, int]:
    """How far the fitted line misses the measurements: (the largest of measured / fitted
    and fitted / measured over the sizes, the size where it is)."""
    worst = max(zip(sizes, seconds, fitted), key=lambda x: max(x[1] / x[2], x[2] / x[1]))
    return max(worst[1] / worst[2], worst[2] / worst[1]), worst[0]


def _measure(world: int, sizes, repeats: int, backend: str) -> list[float]:
    """Seconds per all-reduce of each size, from ``world`` spawned processes."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, sizes, repeats, backend, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    # one deadline for all: a rank that dies leaves the others waiting in the rendezvous, so
    # whoever is still running at the deadline is stopped, never left behind
    deadline = time.monotonic() + TIMEOUT_S
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    hung = [p for p in procs if p.is_alive()]
    for p in hung:
        p.kill()
        p.join(timeout=10)
    if hung or any(p.exitcode != 0 for p in procs) or queue.empty():
        stopped = f"; {len(hung)} still running after {TIMEOUT_S} s, stopped" if hung else ""
        raise DlperfError(f"the {backend} all-reduce processes failed (exit codes "
                          f"{[p.exitcode for p in procs]}{stopped}); is port {port} free on "
                          "127.0.0.1?")
    return queue.get()


def max_world() -> int:
    """The most processes worth timing here: one per core (gloo) or per GPU (NCCL). More
    processes than cores time the cores' contention, not the link, and each one is a Python
    with torch loaded (hundreds of MB): --world 100000 would take the machine down."""
    return max(2, os.cpu_count() or 1, torch.cuda.device_count())


def probe_comm(world: int = 2, quick: bool = False, repeats: int = 7, backend: str = "auto"
               ) -> tuple[Interconnect, dict]:
    """Measure and fit; returns (the fitted Interconnect, the measurements)."""
    if world < 2:
        raise DlperfError("--comm needs at least 2 processes (--world 2 or more)")
    if world > max_world():
        raise DlperfError(f"--world {world}: this host has {os.cpu_count()} cores and "
                          f"{torch.cuda.device_count()} GPUs; time at most {max_world()} "
                          "processes (one per core, or per GPU with NCCL)")
    if backend == "auto":
        backend = "nccl" if torch.cuda.device_count() >= world else "gloo"
    sizes = QUICK_SIZES if quick else SIZES
    for attempt in range(ATTEMPTS):
        seconds = _measure(world, sizes, repeats, backend)
        try:
            bus_bw, latency = fit_ring(sizes, seconds, world)
            break
        except DlperfError:
            if attempt == ATTEMPTS - 1:
                raise
    predicted = [2 * (world - 1) * latency + s * 2 * (world - 1) / world / bus_bw for s in sizes]
    misfit, at = fit_misses(sizes, seconds, predicted)
    ic = Interconnect(name=f"measured-{backend}-{world}", display_name=f"{backend} all-reduce, "
                      f"{world} processes on this host (measured)", bus_bandwidth=bus_bw,
                      latency_s=latency, scope="node",
                      source=f"dlperf probe --comm: ring fit to {len(sizes)} sizes, median of "
                             f"{repeats} runs each; the fit misses its worst size "
                             f"({at:,} bytes) by {misfit:.1f}x")
    return ic, {"backend": backend, "world": world, "sizes_bytes": list(sizes),
                "seconds": seconds, "fitted_seconds": predicted, "fit_worst_ratio": misfit,
                "fit_worst_size_bytes": at}
