"""dlperf's dtype names (what --dtype and the configs take) and the torch dtypes they mean.

``fp32`` and ``tf32`` store FP32 (TF32 is how FP32 GEMMs run on Tensor Cores, guide 2.2);
``bf16``/``fp16`` are the mixed-precision dtypes autocast computes in.
"""

from __future__ import annotations

import torch

STORAGE = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
           "fp16": torch.float16}
# The names a training step or an analysis takes (no tf32: that is --tf32 with fp32).
MIXED = ("fp32", "bf16", "fp16")


def autocast_dtype(name: str) -> torch.dtype | None:
    """The dtype autocast computes in for ``name``; None for FP32 (no autocast)."""
    dtype = STORAGE[name]
    return None if dtype is torch.float32 else dtype
