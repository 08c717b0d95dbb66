"""dlperf's dtype names (what --dtype and the configs take) and the torch dtypes they mean.

``fp32`` and ``tf32`` store FP32 (TF32 is how FP32 GEMMs run on Tensor Cores, guide 2.2);
``bf16``/``fp16`` are the mixed-precision dtypes autocast computes in.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

STORAGE = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
           "fp16": torch.float16}
# The names a training step or an analysis takes (no tf32: that is --tf32 with fp32).
MIXED = ("fp32", "bf16", "fp16")


def autocast_dtype(name: str) -> torch.dtype | None:
    """The dtype autocast computes in for ``name``; None for FP32 (no autocast)."""
    dtype = STORAGE[name]
    return None if dtype is torch.float32 else dtype


@contextmanager
def tf32_flags(enabled: bool, cudnn_benchmark: bool | None = None):
    """Run the body with cuBLAS's and cuDNN's TF32 switches both set to ``enabled`` (and, when
    given, cuDNN's autotuning to ``cudnn_benchmark``), restoring the caller's settings after.

    Why both: PyTorch's defaults differ (``torch.backends.cudnn.allow_tf32`` is True,
    ``torch.backends.cuda.matmul.allow_tf32`` is False), so an "fp32" step left at the
    defaults runs its convolutions on TF32 Tensor Cores and its matmuls on the CUDA cores.
    dlperf's ``--dtype fp32`` means strict FP32 and ``--tf32`` TF32 for both (guide 2.2); a
    measurement must run what the prediction costs (on the second lent H200 an unflagged
    "fp32" ResNet-50 step ran its convolutions in TF32: 26.7 ms measured against 47.0 ms
    predicted for strict FP32, benchmarks/results/device-h200-2026-12-04-2/analyses.json)."""
    cuda, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    old = (cuda.allow_tf32, cudnn.allow_tf32, cudnn.benchmark)
    cuda.allow_tf32 = cudnn.allow_tf32 = enabled
    if cudnn_benchmark is not None:
        cudnn.benchmark = cudnn_benchmark
    try:
        yield
    finally:
        cuda.allow_tf32, cudnn.allow_tf32, cudnn.benchmark = old
