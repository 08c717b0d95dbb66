"""Top-1/top-5 evaluation on the validation loader, counted on the device and summed over
processes."""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn

from dlperf.train import distributed as D


@torch.no_grad()
def evaluate(model: nn.Module, loader, info: D.DistInfo, dtype, channels_last: bool) -> dict:
    from dlperf.data.device import normalize_nhwc

    model.eval()
    # counts summed on the device and read once at the end (no host sync per batch)
    correct = torch.zeros(2, dtype=torch.int64, device=info.device)
    seen = 0
    for batch in loader:
        keep = len(batch) - batch.num_padded  # sharding padding is not evaluated twice
        x = normalize_nhwc(batch.images[:keep], info.device)
        if not channels_last:
            x = x.contiguous()
        y = batch.labels[:keep].to(info.device, non_blocking=True, copy=True)
        batch.release()
        with torch.autocast(info.device.type, dtype=dtype) if dtype else nullcontext():
            logits = model(x)
        top5 = logits.float().topk(min(5, logits.shape[1]), dim=1).indices
        hits = top5 == y[:, None]
        correct += torch.stack([hits[:, 0].sum(), hits.any(dim=1).sum()])
        seen += keep
    correct1, correct5 = correct.tolist()
    correct1, correct5, seen = D.all_reduce_sum([correct1, correct5, seen], info)
    model.train()
    return {"top1": correct1 / seen if seen else 0.0, "top5": correct5 / seen if seen else 0.0,
            "samples": int(seen)}
