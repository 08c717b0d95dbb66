"""The whole training step as one CUDA graph (TrainConfig.cuda_graphs).

Forward, loss, backward, gradient norm, the non-finite guard, the fused optimizer update and
the EMA are captured once per input shape and replayed: one launch instead of ~1,000 kernel
launches per ResNet-50 step, so the step no longer depends on how fast Python issues kernels
(performance guide, "launch overhead"; NVIDIA's DeepLearningExamples `--cuda-graphs`). It is the
eager counterpart of ``compile=reduce-overhead`` and possible only because nothing in the step
waits for the host: the guard runs in deferred mode (found_inf on the device).

What a replayed graph needs, and where it is arranged:
* static memory: inputs are copied into tensors the graph reads; gradients are allocated by the
  captured backward and rewritten in place by every replay (never set to None afterwards);
* values that change between steps live in device tensors the graph reads: each param group's
  learning rate becomes a 0-dim tensor that LambdaLR ``fill_``s in place, the loss-scale-free
  found_inf flag is computed inside the graph;
* warm-up: the first ``warmup`` steps of each shape run eagerly on a side stream (cuDNN picks
  its algorithms, the optimizer state exists) before capture, as PyTorch's whole-network capture
  recipe prescribes; they are real training steps;
* autocast without its weight cache (cached casts would outlive the capture).

Not combined with: torch.compile (reduce-overhead already uses graphs), fp16 loss scaling,
gradient accumulation, more than one process (DDP's collectives), non-finite check ``step``.
Each is refused with a one-line error in TrainConfig or train().
"""

from __future__ import annotations

import torch

from dlperf.errors import DlperfError
from dlperf.train.step import StepParts, train_step


def graph_capture_supported(device: torch.device) -> bool:
    """CUDA graphs need CUDA. (Tests patch this to run the graphed step's body eagerly on the
    CPU, which exercises the loop's whole graphed branch except the capture itself.)"""
    return device.type == "cuda"


def graphed_step_for(parts: StepParts, cfg, distributed: bool) -> "GraphedStep | None":
    """The GraphedStep a run with ``cfg`` (a TrainConfig) uses, None without cuda_graphs; a
    run that cannot capture is refused in one line."""
    if not cfg.cuda_graphs:
        return None
    if not graph_capture_supported(parts.device):
        raise DlperfError("cuda_graphs=true needs a CUDA GPU (this run is on "
                          f"{parts.device.type}); drop it")
    if distributed:
        raise DlperfError("cuda_graphs=true is single-process for now (DDP's collectives "
                          "are not captured); drop it or run one process")
    return GraphedStep(parts, capture=parts.device.type == "cuda")


def tensor_learning_rates(optimizer: torch.optim.Optimizer, device: torch.device) -> list:
    """Give each param group a device tensor learning rate (kept if it already has one), so a
    captured optimizer step reads the value the scheduler writes in place; returns them."""
    for group in optimizer.param_groups:
        lr = group["lr"]
        if not (isinstance(lr, torch.Tensor) and lr.device == device):
            group["lr"] = torch.tensor(float(lr), dtype=torch.float32, device=device)
    return [group["lr"] for group in optimizer.param_groups]


def keep_learning_rates_in_place(optimizer: torch.optim.Optimizer, tensors: list) -> None:
    """After a scheduler step: where the group's lr is no longer the captured tensor (torch
    versions whose LRScheduler assigns a float instead of ``fill_``-ing a tensor), write the new
    value into the captured tensor and put it back, so replays never train on a stale lr."""
    for group, tensor in zip(optimizer.param_groups, tensors):
        if group["lr"] is not tensor:
            tensor.fill_(float(group["lr"]))  # a float from the scheduler: no sync
            group["lr"] = tensor


def float_learning_rates(state: dict) -> dict:
    """An optimizer state_dict with plain float learning rates (portable checkpoints: a run
    without graphs, or on another device, resumes from it)."""
    for group in state["param_groups"]:
        if isinstance(group.get("lr"), torch.Tensor):
            group["lr"] = float(group["lr"])
    return state


class GraphedStep:
    """``step(x, y) -> (loss, grad_norm, applied)``: ``step.train_step`` on one batch,
    captured; with ``capture=False`` the same step runs eagerly every time (the CPU, and
    tests)."""

    def __init__(self, parts: StepParts, capture: bool = True, warmup: int = 3):
        self.parts = parts
        self.optimizer, self.device = parts.optimizer, parts.device
        self.capture, self.warmup = capture, warmup
        self._graphs: dict = {}  # input signature -> (graph, static x, static y, outputs)
        self._eager_calls: dict = {}
        self._pool = None  # one memory pool shared by the graphs of every shape
        self._lrs: list = []  # the lr tensors the graphs read
        self.captures = 0

    def after_scheduler_step(self) -> None:
        if self._lrs:
            keep_learning_rates_in_place(self.optimizer, self._lrs)

    def _body(self, x: torch.Tensor, y: torch.Tensor):
        # the gradients stay allocated: the captured backward rewrites them in place
        return train_step(self.parts, [(x, y)], step=-1, zero_grad=False, autocast_cache=False)

    def __call__(self, x: torch.Tensor, y: torch.Tensor):
        key = (tuple(x.shape), tuple(x.stride()), x.dtype, tuple(y.shape))
        entry = self._graphs.get(key)
        if entry is None:
            calls = self._eager_calls.get(key, 0)
            if not self.capture or calls < self.warmup:
                self._eager_calls[key] = calls + 1
                self.optimizer.zero_grad(set_to_none=True)
                if not self.capture:
                    return self._body(x, y)
                side = torch.cuda.Stream(self.device)
                side.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(side):
                    out = self._body(x, y)
                torch.cuda.current_stream(self.device).wait_stream(side)
                return out
            # One live graph: a new shape (progressive resizing) replaces the old one, whose
            # gradient buffers the new capture takes over; a shape that comes back is warmed
            # up and captured again.
            self._graphs.clear()
            self._eager_calls = {key: calls}
            entry = self._graphs[key] = self._capture(x, y)
        graph, static_x, static_y, outputs = entry
        static_x.copy_(x, non_blocking=True)
        static_y.copy_(y, non_blocking=True)
        graph.replay()
        return outputs

    def _capture(self, x: torch.Tensor, y: torch.Tensor):
        self._lrs = tensor_learning_rates(self.optimizer, self.device)
        static_x, static_y = x.clone(), y.clone()  # clone keeps channels_last strides
        self.optimizer.zero_grad(set_to_none=True)  # the captured backward allocates them
        graph = torch.cuda.CUDAGraph()
        # thread_local: the GPU input path decodes the next batches in its own thread on its
        # own stream while this thread captures; in PyTorch's default "global" mode any CUDA
        # call that thread makes (nvJPEG's allocations, its event syncs) invalidates the
        # capture (cudaErrorStreamCaptureInvalidated, seen on the H200 run of 2026-12-04).
        # The caching allocator routes only this stream's allocations to the graph's pool.
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            outputs = self._body(static_x, static_y)
        self._pool = graph.pool()
        self.captures += 1
        return graph, static_x, static_y, outputs
