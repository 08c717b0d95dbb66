"""The GPU path of the input pipeline: nvJPEG decoding and batched per-sample crops on the GPU.

Same contract as the CPU loader (iterate Batches of uint8 [n, H, W, C] + int64 labels, set_epoch,
state_dict/load_state_dict, sharding, the bad-file policy), but the batch lives on the GPU:

1. CPU threads read each sample's bytes, parse its header and draw its crop from the same
   (seed, epoch, sample) stream as the CPU path; a file with restart markers (what
   ``dlperf data prepare`` stores) is cut to its crop in the compressed domain, so the decoder
   gets only the data under the crop (plus one MCU of context);
2. ``decode_jpeg(list, device="cuda")`` decodes the JPEGs as one nvJPEG batch, with EXIF
   orientation: torchcodec's when it is installed (torchvision's image decoding is deprecated
   since 0.29 in its favour), else torchvision.io's; a batch that fails is split in halves
   until the bad files stand alone, so one bad file only loses itself, and anything nvJPEG rejects (PNG, CMYK, corrupt)
   goes to the CPU decoder;
3. every sample's own crop box is resized to the output size by ONE ``torchvision.ops.roi_align``
   call over the packed batch (adaptive sampling averages ~ceil(box/output) samples per output
   pixel, an area filter against aliasing), then flips are applied as one indexed op. This is
   the per-sample crop that torchvision's transforms cannot do for a batch;
4. all of it runs in a background thread on its own CUDA stream, ``ahead`` batches before the
   consumer (DALI's prefetch queue): the training loop only waits on an event.

On a machine without CUDA the same code runs with ``device="cpu"`` (the decoders' CPU paths),
which is how the tests exercise its logic.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

import numpy as np
import torch

from dlperf.data.augment import CropPlan
from dlperf.data.decode import (BadImage, cut_to_plan, decode_into, image_header,
                                use_single_threaded_opencv)
from dlperf.data.device import host_to_device
from dlperf.data.loader import Batch, EpochReport, Loader, LoaderConfig
from dlperf.data.sources import Source
from dlperf.errors import DlperfError

# Images packed per roi_align call are capped at this many elements (3 x Hmax x Wmax x count),
# so one huge photo cannot make the packed buffer explode; a batch splits into several calls.
PACK_ELEMENTS = 1 << 28


def jpeg_batch_decoder(prefer: str = "auto"):
    """(name, decode(list of uint8 CPU tensors, device) -> list of [3, H, W] uint8 tensors).

    Both raise RuntimeError on a file they cannot decode and apply EXIF orientation.
    """
    if prefer in ("auto", "torchcodec"):
        try:
            from torchcodec.decoders import decode_jpeg as codec_decode
        except Exception:  # not installed, or built against another torch: torchvision then
            if prefer == "torchcodec":
                raise DlperfError("torchcodec is not importable (pip install torchcodec, a "
                                  "version built for this torch)") from None
        else:
            return "torchcodec", lambda tensors, device: list(
                codec_decode(list(tensors), mode="RGB", device=device))
    from torchvision.io import ImageReadMode, decode_jpeg

    return "torchvision", lambda tensors, device: list(
        decode_jpeg(list(tensors), mode=ImageReadMode.RGB, device=device,
                    apply_exif_orientation=True))


def plan_box(plan: CropPlan, height: int, width: int) -> tuple[float, float, float, float]:
    """The crop as a box (x1, y1, x2, y2) in the upright image's pixel coordinates.

    Eval plans (resize, then crop) become the equivalent box before the resize.
    """
    if plan.resize_to is None:
        return (plan.left, plan.top, plan.left + plan.width, plan.top + plan.height)
    sy, sx = plan.resize_to[0] / height, plan.resize_to[1] / width
    return (plan.left / sx, plan.top / sy, (plan.left + plan.width) / sx,
            (plan.top + plan.height) / sy)


def crop_resize_batch(images: list[torch.Tensor], boxes: list[tuple], flips: list[bool],
                      size: int) -> torch.Tensor:
    """Per-sample crop + resize + flip of [3, H, W] uint8 images -> uint8 [n, size, size, 3].

    One roi_align call per pack of images (usually the whole batch). In float32 on every
    device: roi_align computes its sample positions in the input's dtype, and float16 resolves
    only 0.25-0.5 px at 256-1023 px (1 px at 1024-2047), too coarse for photo coordinates.
    """
    from torchvision.ops import roi_align

    device = images[0].device
    compute = torch.float32
    out = torch.empty((len(images), size, size, 3), dtype=torch.uint8, device=device)
    start = 0
    while start < len(images):
        end, hmax, wmax = start, 0, 0
        while end < len(images):  # grow the pack while it stays under the element budget
            h, w = max(hmax, images[end].shape[1]), max(wmax, images[end].shape[2])
            if end > start and 3 * h * w * (end - start + 1) > PACK_ELEMENTS:
                break
            hmax, wmax, end = h, w, end + 1
        pack = torch.zeros((end - start, 3, hmax, wmax), dtype=compute, device=device)
        for i in range(start, end):
            pack[i - start, :, :images[i].shape[1], :images[i].shape[2]] = images[i]
        # Replicate each image's last row and then last column into the padding: roi_align
        # clamps only at the pack's edge, so a box on a smaller image's bottom or right border
        # would otherwise blend its last output row/column with zeros. Two batched copies, not
        # two per image (a self-copy where an image fills the pack's height or width).
        sizes = torch.tensor([images[i].shape[1:] for i in range(start, end)])
        hs, ws = sizes[:, 0], sizes[:, 1]
        idx, last_h, last_w = (host_to_device(t, device) for t in (
            torch.arange(end - start), torch.stack([hs - 1, torch.where(hs < hmax, hs, hs - 1)]),
            torch.stack([ws - 1, torch.where(ws < wmax, ws, ws - 1)])))
        pack[idx, :, last_h[1], :] = pack[idx, :, last_h[0], :]
        pack[idx, :, :, last_w[1]] = pack[idx, :, :, last_w[0]]
        rois = host_to_device(torch.tensor([[i - start, *boxes[i]] for i in range(start, end)],
                                           dtype=compute), device)
        # aligned=True: pixel centres at +0.5, so a box of the full image maps exactly.
        res = roi_align(pack, rois, output_size=(size, size), spatial_scale=1.0,
                        sampling_ratio=-1, aligned=True)
        flip = host_to_device(torch.tensor(flips[start:end]), device)
        res = torch.where(flip.view(-1, 1, 1, 1), res.flip(-1), res)
        out[start:end] = res.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
        start = end
    return out


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


_END = object()


def in_background(items, depth: int, device: torch.device):
    """Run the generator ``items`` in a thread, up to ``depth`` results ahead of the consumer.

    On CUDA the thread works on its own stream and fences each result with an event that the
    consumer's stream waits on (and records the tensors on it for the caching allocator), so
    decoding and cropping the next batches overlaps the training step instead of stalling it.
    An exception in the thread is raised in the consumer; leaving the loop early stops the
    thread after the batch it is working on.
    """
    results: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def put(item) -> bool:
        while not stop.is_set():
            try:
                results.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def run():
        try:
            with torch.cuda.stream(stream) if stream is not None else nullcontext():
                for k, batch in items:
                    event = None
                    if stream is not None:
                        event = torch.cuda.Event()
                        event.record(stream)
                    if not put((k, batch, event)):
                        return
        except BaseException as exc:  # noqa: BLE001 - raised again in the consumer
            put(_Failure(exc))
            return
        put(_END)

    thread = threading.Thread(target=run, name="dlperf-gpu-loader", daemon=True)
    thread.start()
    try:
        while True:
            item = results.get()
            if item is _END:
                return
            if isinstance(item, _Failure):
                raise item.exc
            k, batch, event = item
            if event is not None:
                current = torch.cuda.current_stream(device)
                current.wait_event(event)
                batch.images.record_stream(current)
                batch.labels.record_stream(current)
            yield k, batch
    finally:
        stop.set()
        thread.join()
        items.close()  # the thread has left the generator: its cleanup runs here


class GpuLoader(Loader):
    """Loader whose batches are decoded and augmented on ``device`` (see module docstring)."""

    def __init__(self, source: Source, cfg: LoaderConfig = LoaderConfig(), device: str = "cuda",
                 jpeg_decoder: str = "auto", ahead: int = 2, cut: bool = True):
        super().__init__(source, cfg)
        self.cut = cut  # cut files with restart markers to the crop before decoding
        if ahead < 0:
            raise DlperfError(f"GPU loader: ahead must be >= 0, got {ahead}")
        self.ahead = ahead  # batches a background thread prepares ahead of the consumer
        self.jpeg_decoder, self._decode_batch = jpeg_batch_decoder(jpeg_decoder)
        if cfg.channels != 3:
            raise DlperfError("the GPU loader emits 3 channels; pad on the device if needed")
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise DlperfError("GPU loader: no CUDA GPU is visible; use the CPU Loader")
        self.fallbacks = 0  # images the GPU decoder rejected and the CPU decoded

    def with_size(self, size: int) -> "GpuLoader":
        import dataclasses

        return GpuLoader(self.source, dataclasses.replace(self.cfg, size=size), str(self.device),
                         self.jpeg_decoder, self.ahead, self.cut)

    def _prepare(self, index: int, epoch: int):
        """(index, bytes, upright h, w, plan, nvjpeg-able) or (index, None, reason)."""
        src, limits = self.source, self.cfg.limits
        try:
            data = src.read_limited(index, limits.max_bytes)  # BadImage if over the limit
            height, width, orientation, fast = image_header(data, limits)
            plan = self._plan_for(index, epoch)(height, width)
            # Files with restart markers (dlperf data prepare writes them) are cut to the crop
            # in the compressed domain first: nvJPEG then decodes ~half the data per image.
            cut = cut_to_plan(data, plan, orientation) if fast and self.cut else None
            if cut is not None:
                data, height, width, plan = cut
        except BadImage as exc:
            return index, None, str(exc)
        except OSError as exc:
            return index, None, f"unreadable ({exc.strerror or exc})"
        return index, data, height, width, plan, fast

    def _decode_gpu(self, datas: list[bytes]) -> list[torch.Tensor | None]:
        return self._decode_halves([torch.frombuffer(bytearray(d), dtype=torch.uint8)
                                    for d in datas])

    def _decode_halves(self, tensors: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """Decoded images, None for each file the decoder rejects. One bad file fails a whole
        batched call, so a failing batch is split in halves until the bad files stand alone:
        about 2 log2(n) calls for one bad file instead of n one-image calls."""
        try:
            return self._decode_batch(tensors, self.device)
        except RuntimeError:
            if len(tensors) == 1:
                return [None]
            mid = len(tensors) // 2
            return self._decode_halves(tensors[:mid]) + self._decode_halves(tensors[mid:])

    def _cpu_decode(self, data: bytes, height: int, width: int) -> torch.Tensor:
        full = np.empty((height, width, 3), np.uint8)
        decode_into(data, lambda h, w: CropPlan(0, 0, h, w), full, self.cfg.limits)
        return torch.from_numpy(full).permute(2, 0, 1).to(self.device)

    def __iter__(self):
        if self._pool is None:
            use_single_threaded_opencv()
            self._pool = ThreadPoolExecutor(self.cfg.thread_count(), thread_name_prefix="dlperf-gpu")
        epoch, start = self.epoch, self._next_batch
        if start == 0:
            self.report = EpochReport(epoch)
        batches = self._batches(epoch, start)
        if self.ahead:
            batches = in_background(batches, self.ahead, self.device)
        # The position is the consumer's: a background thread may be batches ahead of it.
        for k, batch in batches:
            self._next_batch = k + 1
            yield batch
        self.reports.append(self.report.summary())
        self.epoch += 1
        self._next_batch = 0

    def _batches(self, epoch: int, start: int):
        """(k, Batch) for the epoch's batches from ``start``: the decoding and cropping."""
        cfg = self.cfg
        order, real = self.rank_order(epoch), self._real_count()

        def read(k):
            ids = order[k * cfg.batch_size:(k + 1) * cfg.batch_size]
            return ids, [self._pool.submit(self._prepare, int(i), epoch) for i in ids]

        ahead = read(start) if start < len(self) else None
        for k in range(start, len(self)):
            ids, futures = ahead
            ahead = read(k + 1) if k + 1 < len(self) else None  # CPU reads overlap GPU work
            items = [f.result() for f in futures]
            good = [it for it in items if it[1] is not None]
            bad = [(row, it[0], it[2]) for row, it in enumerate(items) if it[1] is None]
            fast = [it for it in good if it[5]]
            decoded = dict(zip((it[0] for it in fast), self._decode_gpu([it[1] for it in fast])))
            images, boxes, flips, labels, kept = [], [], [], [], []
            for row, it in enumerate(items):
                if it[1] is None:
                    continue
                index, data, height, width, plan, _ = it
                img = decoded.get(index)
                if img is None:
                    try:
                        img = self._cpu_decode(data, height, width)
                        self.fallbacks += 1
                    except BadImage as exc:
                        bad.append((row, index, str(exc)))
                        continue
                if img.shape[1:] != (height, width):
                    bad.append((row, index, "decoded size differs from the header"))
                    continue
                images.append(img)
                boxes.append(plan_box(plan, height, width))
                flips.append(plan.flip)
                labels.append(self.source.label(index))
                kept.append(row)
            self._record_bad(bad)
            first = k * cfg.batch_size
            self.report.samples += sum(1 for row in range(len(ids)) if first + row < real)
            out = (crop_resize_batch(images, boxes, flips, cfg.size) if images else
                   torch.empty((0, cfg.size, cfg.size, 3), dtype=torch.uint8, device=self.device))
            yield k, Batch(out, host_to_device(torch.tensor(labels, dtype=torch.int64),
                                               self.device),
                           ids[kept], sum(1 for row in kept if first + row >= real))

    def _record_bad(self, bad: list) -> None:
        for _, index, reason in sorted(bad):
            self._note_bad(self.source.name(index), reason)
