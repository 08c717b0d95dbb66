"""Issue #14's check on this machine: a small model's DDP step on 2 CPU processes (gloo),
measured, against the scale-out model's prediction.

1. `dlperf probe --comm` (2 processes, gloo over loopback) fits the interconnect.
2. The single-process step is measured with one thread (each DDP process gets one of the two
   cores): forward, loss, backward, SGD step; median of the timed steps after warm-up.
3. The same two processes without DDP (both cores busy, steps barrier-aligned), then under
   DistributedDataParallel (the same per-process batch); medians on rank 0.
4. Prediction: the measured two-process step without DDP plus the exposed communication that
   ``analysis/scaling.py`` predicts from DDP's buckets and the measured interconnect (on a CPU
   not overlapped with the backward: the cores compute both), plus DDP's bucket copies, plus
   the wait for the slower process (``scaling.straggler_s``: under DDP each step's all-reduce
   waits for both, which the barrier-aligned run without DDP does not time) at the spread of
   the two processes' own step times, measured in the run without DDP (steps start together,
   so the spread of each step's difference is the spread the model takes); the analyzer's
   backward timeline is scaled to the measured single step, so what is tested is the
   communication and straggler model, not the CPU's compute prediction.

Run: python benchmarks/bench_ddp_cpu.py [OUT.json]  (about a minute on 2 cores)
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torchvision
from torch import nn

OUT = Path(__file__).resolve().parent / "results" / "ddp-cpu.json"
BATCH, SIZE, CLASSES, WARMUP, STEPS = 16, 64, 10, 3, 10


def _model():
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=CLASSES)


def _time_steps(model, opt, x, y, barrier=None) -> list[float]:
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for i in range(WARMUP + STEPS):
        if barrier:
            barrier()
        start = time.perf_counter()
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    return times


def _worker(rank: int, port: int, ddp: bool, queue):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dlperf.train.distributed import end_worker

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model = DDP(_model()) if ddp else _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(BATCH, 3, SIZE, SIZE, generator=g)
    y = torch.randint(0, CLASSES, (BATCH,), generator=g)
    times = _time_steps(model, opt, x, y, barrier=dist.barrier)
    queue.put((rank, times))
    end_worker(0)  # both ranks meet, then no finalization (distributed.end_worker)


def main(argv: list[str]) -> int:
    import torch.multiprocessing as mp

    import dlperf
    from dlperf.analysis.scaling import (STEP_CV, Timeline, ddp_copy_s, ddp_exposed_s,
                                         ring_allreduce_s, straggler_s, timeline)
    from dlperf.hardware.comm_probe import _free_port, probe_comm
    from dlperf.hardware.probe import cached_cpu_probe
    from dlperf.provenance import save_result

    out = Path(argv[0]) if argv else OUT
    ic, comm = probe_comm(world=2)
    print(f"gloo fit: {ic.bus_bandwidth / 1e9:.2f} GB/s bus bandwidth, "
          f"{ic.latency_s * 1e6:.0f} us per step")
    torch.set_num_threads(1)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(BATCH, 3, SIZE, SIZE), torch.randint(0, CLASSES, (BATCH,))
    single = statistics.median(_time_steps(model, opt, x, y))
    ctx = mp.get_context("spawn")

    def two_processes(ddp: bool) -> list[list[float]]:
        """Each rank's step times."""
        queue = ctx.SimpleQueue()
        port = _free_port()
        procs = [ctx.Process(target=_worker, args=(r, port, ddp, queue)) for r in range(2)]
        for p in procs:
            p.start()
        results = dict(queue.get() for _ in procs)
        for p in procs:
            p.join(timeout=600)
        return [results[0], results[1]]

    # the same two processes without DDP: both cores busy, as under DDP, and each step
    # barrier-aligned, so the difference is DDP's own cost
    alone = two_processes(ddp=False)
    concurrent = statistics.median(alone[0])
    ddp = statistics.median(two_processes(ddp=True)[0])
    # the spread of one process's step: two draws of sd s differ by sd s sqrt(2)
    spread = statistics.stdev(a - b for a, b in zip(*alone)) / 2**0.5 / statistics.fmean(
        alone[0] + alone[1])
    slower = statistics.fmean(max(a, b) for a, b in zip(*alone)) - statistics.fmean(alone[0])
    spec = cached_cpu_probe(quick=True)[0]
    analysis = dlperf.analyze(_model(), (BATCH, 3, SIZE, SIZE), device=spec, dtype="fp32",
                              train=True)
    tl = timeline(analysis.predictions)
    f = concurrent / tl.step_s  # the predicted timeline, stretched to the measured step
    scaled = Timeline(tl.backward_end_s * f, tl.step_s * f, tl.optimizer_s * f,
                      {k: v * f for k, v in tl.grad_ready_s.items()})
    params = [(n, p.numel() * 4) for n, p in _model().named_parameters()]
    # on a CPU the all-reduces take the cores the backward needs: no overlap (the model's rule)
    d = ddp_exposed_s(scaled, params,
                      lambda b: ring_allreduce_s(b, 2, ic.bus_bandwidth, ic.latency_s),
                      overlap=False)
    copies = ddp_copy_s(sum(b for _, b in params), analysis)
    with_overlap = ddp_exposed_s(scaled, params,
                                 lambda b: ring_allreduce_s(b, 2, ic.bus_bandwidth, ic.latency_s))
    wait = straggler_s(concurrent, 2, spread)
    predicted = concurrent + d["exposed_s"] + copies + wait
    result = {"interconnect": ic.to_dict(), "comm_measurements": comm,
              "step_spread_measured": spread, "predicted_straggler_s": wait,
              "measured_wait_for_slower_s": slower,
              "predicted_straggler_at_gpu_spread_s": straggler_s(concurrent, 2, STEP_CV),
              "two_processes_without_ddp_step_times_s": alone,
              "single_process_step_s": single, "ddp_step_s": ddp,
              "predicted_ddp_step_s": predicted, "predicted_exposed_comm_s": d["exposed_s"],
              "predicted_comm_s": d["comm_s"], "buckets": d["buckets"],
              "predicted_bucket_copy_s": copies,
              "predicted_if_overlapped_s": concurrent + with_overlap["exposed_s"] + copies + wait,
              "two_processes_without_ddp_step_s": concurrent,
              "bucket_bytes": d["bucket_bytes"],
              "measured_ddp_cost_s": ddp - concurrent, "error": predicted / ddp - 1}
    print(f"single process {single * 1e3:.0f} ms; two processes without DDP "
          f"{concurrent * 1e3:.0f} ms; DDP x2 {ddp * 1e3:.0f} ms measured, "
          f"{predicted * 1e3:.0f} ms predicted ({predicted / ddp - 1:+.0%}; all-reduce "
          f"{d['comm_s'] * 1e3:.0f} ms in {d['buckets']} buckets, not overlapped on a CPU; "
          f"bucket copies {copies * 1e3:.0f} ms; the slower process {wait * 1e3:.0f} ms at the "
          f"measured spread {spread:.1%} (waited {slower * 1e3:.0f} ms in the run without DDP); "
          f"overlapped as on a GPU it would be "
          f"{(concurrent + with_overlap['exposed_s'] + copies + wait) * 1e3:.0f} ms)")
    save_result(out, "ddp-cpu", {"model": "resnet18", "batch_per_process": BATCH,
                                 "image_size": SIZE, "classes": CLASSES, "warmup": WARMUP,
                                 "steps": STEPS, "threads_per_process": 1, "backend": "gloo"},
                result)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
