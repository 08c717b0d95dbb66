"""Issue #14's host side, measured on one GPU: the update's launches after GradScaler's wait,
per optimizer implementation, and how a host busy with loader work stretches them.

NVIDIA's PyTorch ConvNets runs (21.03: PyTorch 1.9, SGD tensor by tensor) lose 13-18% per GPU
from one GPU to eight in mixed precision and 3-5% in FP32/TF32, where the scale-out model
(communication, the wait for the slowest GPU, the loaders' decode rate) predicts ~2%
(benchmarks/README.md). In mixed precision, and only there, ``scaler.step`` reads the inf
flag with ``.item()`` before the update, so the CPU issues the update's launches with the GPU
idle (``costs.scaled_optimizer``): a host made slower by eight processes' loader workers would
stretch exactly that part. This script measures both halves on one GPU:

1. the training step (fp16 autocast + GradScaler, channels_last, SGD momentum 0.9 weight
   decay 1e-4, ``torch.cuda.synchronize()`` after every step as the ConvNets loop does) with
   the update fused, foreach and for-loop: the for-loop's extra time over the fused one per
   extra launch is the host's time per launch, dlperf's ``host_s`` (unfitted: 10 µs);
2. the for-loop step again while K processes keep the host's cores busy decoding JPEGs (a
   loader's work; a busy loop without a corpus), K from none to twice the cores.

Each case is saved beside dlperf's prediction for it (the datasheet preset ``--device``).
Usage: python benchmarks/bench_host_issue_gpu.py OUT.json [--model resnet50] [--batch 256]
       [--device h100-sxm] [--steps 20] [--warmup 5] [--busy 0,8,16,32] [--corpus DIR]
       [--dispatch-only [--bertadam]]   (the CPU's part of a launch alone:
       results/host-dispatch-cpu.json; with --bertadam, BertAdam's loop:
       results/host-dispatch-bertadam-cpu.json)
On a machine without a GPU it runs on the CPU in bf16 without a scaler (a check of the script,
not a measurement: the CPU runs each op as it is issued).
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

IMPLS = ("fused", "foreach", "for-loop")


def _busy(corpus: str | None, stop) -> None:
    """A loader worker's load: decode the corpus's JPEGs in a loop (or spin without one)."""
    files = []
    if corpus:
        files = [p for p in Path(corpus).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg")]
    if files:
        from PIL import Image

        i = 0
        while not stop.is_set():
            with Image.open(files[i % len(files)]) as im:
                im.convert("RGB").resize((224, 224))
            i += 1
    else:
        x = 0
        while not stop.is_set():
            for k in range(10_000):
                x = (x * 31 + k) % 1_000_003


def _optimizer(params, impl: str, device):
    import torch

    kw = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
    if impl == "fused" and device.type == "cpu":
        kw = {"foreach": True}  # the CPU check: no fused CUDA kernel to call
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4, **kw)


def time_steps(model_name: str, batch: int, impl: str, steps: int, warmup: int,
               image: int = 224) -> list[float]:
    """Seconds per training step, each ending in a device synchronisation."""
    import torch
    import torchvision

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    model = getattr(torchvision.models, model_name)().to(device)
    model = model.to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, image, image, device=device).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=device)
    opt = _optimizer(model.parameters(), impl, device)
    dtype = torch.float16 if cuda else torch.bfloat16
    scaler = torch.amp.GradScaler("cuda", enabled=cuda)
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


@functools.cache
def predicted(model_name: str, batch: int, impl: str, device: str, image: int = 224) -> dict:
    """dlperf's step for the same case: fp16 autocast, channels_last, SGD as ``impl`` runs it."""
    import dlperf

    a = dlperf.analyze(model_name, (batch, 3, image, image), device=device, dtype="fp16",
                       train=True, channels_last=True, optimizer_impl=impl)
    [step] = [p for p in a.predictions if p.cost.op.endswith("_step")]
    return {"step_s": a.totals()["predicted_time_s"], "update_launches": step.cost.kernels,
            "host_s": a.host_s}


def _single_thread_median(step, rounds: int, steps: int) -> float:
    """Median seconds of ``step()`` over ``rounds`` rounds of ``steps`` calls, on one thread
    (what the CPU spends per op, not torch's thread pool)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        step()  # (the optimizer's state)
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(steps):
                step()
            times.append((time.perf_counter() - start) / steps)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(times)


def cpu_dispatch(tensors: int = 161, rounds: int = 30, steps: int = 10) -> dict:
    """The CPU's own part of a for-loop launch: ``SGD(foreach=False).step()`` over ``tensors``
    one-element CPU tensors (ResNet-50 has 161), one thread, so the arithmetic is nil and what
    is timed is Python and the dispatcher per op (4 per tensor). On a GPU machine the per-launch
    time of the case above minus this is the CUDA launch itself."""
    import torch

    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(tensors)]
    for p in params:
        p.grad = torch.zeros(1)
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4, foreach=False)
    step = _single_thread_median(opt.step, rounds, steps)
    return {"tensors": tensors, "ops": 4 * tensors, "median_step_s": step,
            "s_per_op": step / (4 * tensors), "rounds": rounds}


def bertadam_tensor_step(p, state: dict, weight_decay: float, lr: float = 5e-5,
                         b1: float = 0.9, b2: float = 0.999, e: float = 1e-6,
                         sync_clip: bool = False) -> None:
    """DeepLearningExamples' ``optimization.BertAdam.step`` for one tensor, op for op, its
    ``clip_grad_norm_(p, 1.0)`` first (torch's own, as the original calls it); ``state``
    holds the moments ``m`` and ``v``. ``sync_clip``: the clip as torch 1.5.1-1.9 ran it
    (``bertadam-sync``: ``if clip_coef < 1`` waits for the GPU; the multiply only when the
    norm is above 1). tests/test_bertadam.py counts its ops and traffic against
    ``costs.bertadam_cost``; ``bertadam_dispatch`` times it."""
    import torch

    if sync_clip:  # torch 1.9's clip_grad_norm_ of one tensor, line for line
        total_norm = torch.norm(torch.stack([torch.norm(p.grad.detach(), 2.0)]), 2.0)
        clip_coef = 1.0 / (total_norm + 1e-6)
        if clip_coef < 1:
            p.grad.detach().mul_(clip_coef)
    else:
        torch.nn.utils.clip_grad_norm_(p, 1.0)
    grad, m, v = p.grad, state["m"], state["v"]
    m.mul_(b1).add_(grad, alpha=1 - b1)
    v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
    update = m / (v.sqrt() + e)
    if weight_decay > 0.0:
        update += weight_decay * p.data
    update_with_lr = lr * update
    p.data.add_(-update_with_lr)


def bertadam_dispatch(tensors: int = 391, rounds: int = 30, steps: int = 3) -> dict:
    """The CPU's own part of BertAdam's launches (``bertadam_tensor_step`` over ``tensors``
    one-element CPU tensors, every other one with weight decay; BERT-large has ~391), one
    thread: Python and the dispatcher per op, 19 ops a tensor on average (costs.py,
    BERTADAM_OPS and BERTADAM_CLIP_OPS)."""
    import torch

    from dlperf.analysis.costs import BERTADAM_CLIP_OPS, BERTADAM_OPS

    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(tensors)]
    for p in params:
        p.grad = torch.full((1,), 1e-3)
    states = [{"m": torch.zeros(1), "v": torch.zeros(1)} for _ in params]
    decays = [0.01 if i % 2 else 0.0 for i in range(tensors)]

    def step():
        for p, st, wd in zip(params, states, decays):
            bertadam_tensor_step(p, st, wd)

    ops = sum(BERTADAM_CLIP_OPS + BERTADAM_OPS[wd > 0] for wd in decays)
    step_s = _single_thread_median(step, rounds, steps)
    return {"tensors": tensors, "ops": ops, "median_step_s": step_s, "s_per_op": step_s / ops,
            "rounds": rounds}


def _summary(times: list[float]) -> dict:
    ordered = sorted(times)
    return {"median_s": statistics.median(ordered),
            "p90_s": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
            "steps": len(ordered)}


def run(args) -> dict:
    import torch
    from rich.progress import Progress

    if args.dispatch_only:
        return ({"bertadam_dispatch": bertadam_dispatch()} if args.bertadam
                else {"cpu_dispatch": cpu_dispatch()})
    cuda = torch.cuda.is_available()
    cores = os.cpu_count() or 1
    busy = ([int(b) for b in args.busy.split(",")] if args.busy
            else [0, cores // 2, cores, 2 * cores])
    cases = [(impl, 0) for impl in IMPLS] + [("for-loop", k) for k in busy if k > 0]
    rows = []
    ctx = mp.get_context("spawn")
    with Progress() as progress:
        task = progress.add_task("host issue", total=len(cases))
        for impl, k in cases:
            stop = ctx.Event()
            workers = [ctx.Process(target=_busy, args=(args.corpus, stop), daemon=True)
                       for _ in range(k)]
            for w in workers:
                w.start()
            try:
                times = time_steps(args.model, args.batch, impl, args.steps, args.warmup,
                                   args.image)
            finally:
                stop.set()
                for w in workers:
                    w.join(timeout=5)
                    if w.is_alive():
                        w.terminate()
            rows.append({"impl": impl, "busy_processes": k, **_summary(times),
                         "predicted": predicted(args.model, args.batch, impl, args.device,
                                                args.image)})
            progress.advance(task)
    by = {(r["impl"], r["busy_processes"]): r for r in rows}
    fused, loop = by[("fused", 0)], by[("for-loop", 0)]
    extra = loop["predicted"]["update_launches"] - fused["predicted"]["update_launches"]
    derived = {
        # the host's time per launch, as the for-loop's extra time over the fused update
        "host_s_per_launch": (loop["median_s"] - fused["median_s"]) / extra if extra else None,
        "predicted_host_s": loop["predicted"]["host_s"],
        # the for-loop step with K busy processes over the same step on an idle host
        "busy_stretch": {str(k): by[("for-loop", k)]["median_s"] / loop["median_s"]
                         for k in busy if ("for-loop", k) in by},
    }
    return {"device": "cuda" if cuda else "cpu", "cores": cores, "rows": rows,
            "derived": derived, "cpu_dispatch": cpu_dispatch(),
            "note": None if cuda else "CPU check of the script: not a measurement"}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--image", type=int, default=224)
    p.add_argument("--device", default="h100-sxm", help="dlperf preset for the predictions")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--busy", default=None, help="busy processes per case, e.g. 0,8,16,32 "
                                                "[0, cores/2, cores, 2 x cores]")
    p.add_argument("--corpus", default=None, help="JPEG folder the busy processes decode")
    p.add_argument("--dispatch-only", action="store_true",
                   help="only the CPU's part of a for-loop launch (cpu_dispatch): a real "
                        "measurement on a machine without a GPU")
    p.add_argument("--bertadam", action="store_true",
                   help="with --dispatch-only: BertAdam's loop instead (bertadam_dispatch)")
    args = p.parse_args(argv)
    if args.bertadam and not args.dispatch_only:
        raise SystemExit("--bertadam times the CPU's part of BertAdam's loop: use it with "
                         "--dispatch-only")
    from dlperf.provenance import save_result

    results = run(args)
    save_result(args.out, "host-issue-gpu", {k: (str(v) if isinstance(v, Path) else v)
                                            for k, v in vars(args).items()}, results)
    if "bertadam_dispatch" in results:
        c = results["bertadam_dispatch"]
        print(f"CPU per op of BertAdam's loop: {c['s_per_op'] * 1e6:.2f} µs "
              f"({c['median_step_s'] * 1e3:.1f} ms a step over {c['tensors']} tensors)")
        print(f"Wrote {args.out}")
        return 0
    c = results["cpu_dispatch"]
    print(f"CPU per op of SGD(foreach=False).step(): {c['s_per_op'] * 1e6:.2f} µs")
    d = results.get("derived", {})
    if d.get("host_s_per_launch") is not None:
        print(f"host time per launch: {d['host_s_per_launch'] * 1e6:.1f} µs "
              f"(dlperf's host_s: {d['predicted_host_s'] * 1e6:.0f} µs); busy host stretch: "
              + ", ".join(f"{k}: {v:.3f}x" for k, v in d["busy_stretch"].items()))
    print(f"Wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
