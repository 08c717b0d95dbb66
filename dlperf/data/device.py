"""The device side of the loader contract: uint8 NHWC -> normalised, channels_last, in one step.

The loader hands over uint8 [N, H, W, C]; viewing it as [N, C, H, W] with permute is free and is
exactly channels_last memory, so the model gets NHWC end to end (the record ResNet-50's layout)
with no transpose. Mean/std are applied after the dtype conversion, on the device, where the
work is trivial next to the model (and torch.compile fuses it into one kernel).
"""

from __future__ import annotations

import functools
import time

import torch

IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


def normalize_nhwc(images: torch.Tensor, device: torch.device | str | None = None,
                   dtype: torch.dtype = torch.float32, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                   non_blocking: bool = True) -> torch.Tensor:
    """uint8 [N, H, W, C] -> ``dtype`` [N, C, H, W] in channels_last memory, (x - mean) / std.

    With C = 4 (the stem padded for Tensor Core alignment) the 4th channel stays exactly 0.
    """
    if images.dtype != torch.uint8 or images.dim() != 4:
        raise ValueError(f"expected uint8 [N, H, W, C], got {images.dtype} {list(images.shape)}")
    x = images.to(device or images.device, non_blocking=non_blocking)
    x = x.permute(0, 3, 1, 2)  # a view: [N, C, H, W] with NHWC strides = channels_last
    mean_t, std_t = _channel_stats(x.device, x.shape[1], tuple(mean), tuple(std))
    out = (x.float() - mean_t) / std_t
    return out.to(dtype).contiguous(memory_format=torch.channels_last)


@functools.lru_cache(maxsize=16)
def _channel_stats(device: torch.device, c: int, mean: tuple, std: tuple):
    """Mean/std as [1, C, 1, 1] tensors on ``device``, made once: building them every batch
    copied from pageable host memory, which waits for the whole CUDA stream (a hidden host
    sync per training step)."""
    mean_t = torch.zeros(c, dtype=torch.float32)
    std_t = torch.ones(c, dtype=torch.float32)
    mean_t[:3] = torch.tensor(mean, dtype=torch.float32)
    std_t[:3] = torch.tensor(std, dtype=torch.float32)
    return (mean_t.view(1, c, 1, 1).to(device), std_t.view(1, c, 1, 1).to(device))


def host_to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor onto ``device`` without a host sync: ``torch.tensor(..., device=
    "cuda")`` copies from pageable memory and waits for the stream; from pinned memory (the
    caching host allocator keeps the block until the copy is done) the copy is asynchronous."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


class DevicePrefetcher:
    """Loader batches as ``(x, y, n)`` on ``device``, one batch ahead.

    On CUDA the host->device copy and the normalisation of batch k+1 are issued on a side
    stream while batch k trains, so the copy engine works alongside the SMs instead of in front
    of them (the data_prefetcher of NVIDIA's ResNet-50 recipe); the consumer's stream waits for
    the side stream only when it takes the batch, and the tensors are recorded on it so the
    caching allocator never hands their memory back early. Without CUDA it is a plain map.

    Being one batch ahead, it has taken one more batch from the loader than it has handed out:
    ``loader_state()`` is the loader's state for the batches handed out, which is what a
    checkpoint must record for an exact resume. ``last_wait`` is the time the last ``next()``
    spent blocked on the loader (the data wait; conversion time is not counted).
    """

    def __init__(self, loader, device: torch.device, channels_last: bool = True):
        self.loader, self.device, self.channels_last = loader, device, channels_last
        self._it = iter(loader)
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._ready = None
        self.last_wait = 0.0
        self._preload()

    def _convert(self, batch):
        x = normalize_nhwc(batch.images, self.device, torch.float32)
        if not self.channels_last:
            x = x.contiguous()
        y = batch.labels.to(self.device, non_blocking=True, copy=True)
        n = len(batch)
        batch.release()  # on the side stream: the loader reuses the buffer after this copy
        return x, y, n

    def _preload(self) -> None:
        t0 = time.perf_counter()
        batch = next(self._it, None)
        self.last_wait = time.perf_counter() - t0
        if batch is None:
            self._ready = None
        elif self._stream is None:
            self._ready = self._convert(batch)
        else:
            if batch.images.device.type == "cuda":  # made on the GPU (nvJPEG, DALI): the side
                self._stream.wait_stream(torch.cuda.current_stream(self.device))  # stream waits
            with torch.cuda.stream(self._stream):
                self._ready = self._convert(batch)

    def loader_state(self) -> dict:
        state = dict(self.loader.state_dict())
        if self._ready is not None:  # taken from the loader, not yet handed out
            state["next_batch"] -= 1
        return state

    def __iter__(self):
        return self

    def __next__(self):
        ready = self._ready
        if ready is None:
            raise StopIteration
        if self._stream is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(self._stream)
            ready[0].record_stream(current)
            ready[1].record_stream(current)
        self._preload()
        return ready
