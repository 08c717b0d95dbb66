"""torchrun environment, process group, DDP wrapping and rank-0 duties.

`torchrun --nproc_per_node N -m dlperf train ...` sets RANK, WORLD_SIZE, LOCAL_RANK and the
rendezvous; multi-node runs use torchrun's --rdzv options unchanged. NCCL on GPUs, gloo on CPU.
A collective timeout (TrainConfig.collective_timeout_s) makes every rank fail instead of hanging
forever when one dies.
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.distributed as dist

from dlperf.errors import DlperfError


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def setup(device_pref: str = "auto", timeout_s: int = 600) -> DistInfo:
    try:
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        raise DlperfError("RANK, WORLD_SIZE and LOCAL_RANK must be integers (torchrun sets them)") from None
    use_cuda = torch.cuda.is_available() and device_pref in ("auto", "cuda")
    if device_pref == "cuda" and not torch.cuda.is_available():
        raise DlperfError("device=cuda but no CUDA GPU is visible; use device=cpu")
    device = torch.device("cuda", local) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo",
                                timeout=datetime.timedelta(seconds=timeout_s))
    return DistInfo(rank, world, local, device)


def buffer_sync_flag(ddp_init) -> str:
    """The name of DDP's per-forward buffer broadcast flag in this torch: ``forward_sync_buffers``
    from torch 2.13 on, which deprecates ``broadcast_buffers`` with a FutureWarning (the new flag
    leaves the broadcast at construction in place, which is what a run wants: every rank starts
    from rank 0's statistics), ``broadcast_buffers`` before it."""
    import inspect

    params = inspect.signature(ddp_init).parameters
    return "forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers"


def wrap(model: torch.nn.Module, info: DistInfo,
         broadcast_buffers: bool = False) -> torch.nn.Module:
    """DDP over the ranks (one process: the model itself), the gradients living in its buckets;
    ``broadcast_buffers``: whether DDP broadcasts the buffers before every forward (see
    TrainConfig.broadcast_buffers), passed under this torch's name for the flag."""
    if not info.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [info.device.index] if info.device.type == "cuda" else None
    return DDP(model, device_ids=ids, gradient_as_bucket_view=True,
               **{buffer_sync_flag(DDP.__init__): broadcast_buffers})


@torch.no_grad()
def average_buffers(modules, info: DistInfo) -> int:
    """Average the floating-point buffers of ``modules`` (batch norm's running mean and
    variance; its batch counts agree on every rank) over the ranks, in place, one all-reduce per
    buffer, so an evaluation or a checkpoint sees one set of statistics where DDP does not
    broadcast them (broadcast_buffers=False). A collective: every rank calls it. Returns how
    many buffers it averaged (none with one process)."""
    if not info.enabled:
        return 0
    count = 0
    for module in modules:
        for buf in module.buffers():
            if buf.is_floating_point():
                dist.all_reduce(buf)
                buf.div_(info.world_size)
                count += 1
    return count


def all_reduce_sum(values: list[float], info: DistInfo) -> list[float]:
    if not info.enabled:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=info.device)
    dist.all_reduce(t)
    return t.tolist()


def all_gather_floats(values: list[float], info: DistInfo) -> list[list[float]]:
    """Every rank's ``values``, one list per rank in rank order (one process: ``[values]``)."""
    if not info.enabled:
        return [list(values)]
    t = torch.tensor(values, dtype=torch.float64, device=info.device)
    out = [torch.empty_like(t) for _ in range(info.world_size)]
    dist.all_gather(out, t)
    return [o.tolist() for o in out]


def any_rank_on_device(flag: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """A 0-dim bool tensor, true when it is true on any rank; a device collective, no host
    sync with NCCL (the non-finite guard's decision, so every rank skips the same steps)."""
    if not info.enabled:
        return flag
    t = flag.to(torch.float32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t > 0


def any_rank(flag: bool, info: DistInfo) -> bool:
    """True when the flag is set on any rank (e.g. a preemption signal seen by one rank)."""
    if not info.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=info.device)
    dist.all_reduce(t)
    return bool(t.item() > 0)


def stop_agreed(caught: bool, step: int, every: int, info: DistInfo) -> bool:
    """Whether every rank stops after ``step`` because some rank caught a signal. Agreeing is
    a collective and a host sync, so with several processes it runs every ``every`` steps
    (the same steps on every rank), not every step."""
    if not info.enabled:
        return caught
    return step % every == 0 and any_rank(caught, info)


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def teardown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


def end_worker(code: int = 0) -> NoReturn:
    """End a process that ran collectives as one rank of a group: every rank meets first (a
    peer that tears gloo down while another still works can abort that one), then the group
    is destroyed and the process leaves through ``exit_process`` (no finalization)."""
    dist.barrier()
    dist.destroy_process_group()
    exit_process(code)


def exit_process(code: int = 0) -> NoReturn:
    """End a process that ran c10d collectives with ``code``, without the interpreter's
    finalization.

    Why: c10d's worker threads (gloo's ``runLoop``, NCCL's watchdog) free a finished work
    *after* the collective has returned, and the tensors it holds may own Python objects whose
    release takes the GIL. Once the main thread has begun finalizing, CPython ends any thread
    that asks for the GIL with ``pthread_exit``; its unwind through the work's ``noexcept``
    destructor calls ``std::terminate`` and the process dies of SIGABRT ("terminate called
    without an active exception") after its work is done. torchrun reports such a rank as
    failed (and restarts the job when asked to). ``destroy_process_group`` does not close the
    window (the worker threads outlive it), and a barrier only narrows it (docs/design.md,
    "Ending a distributed process"; upstream pytorch/pytorch#190489, open for torch 2.14).

    So a process that has torn its group down flushes what it printed and logged and leaves
    with ``os._exit``, which runs no finalization: every checkpoint and result was already
    written atomically (fsync and rename) before this point. A process that used a
    ``multiprocessing.Queue`` must ``close`` and ``join_thread`` it first (a ``SimpleQueue``
    writes synchronously)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing left to save
            pass
    logging.shutdown()
    os._exit(code)
