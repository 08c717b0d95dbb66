"""Tensor Core alignment, tile quantization and wave quantization (pure functions).

Performance guide 2.2 (alignment) and 2.3 (choose parameters so the work divides evenly); the
guide's "Matrix Multiplication Background" page describes the mechanics modelled here:

* cuBLAS splits the M x N output into tiles; a partial tile at the edge costs as much as a full
  one (*tile quantization*).
* Each SM works on one tile at a time, so tiles run in *waves* of ``sm_count``; a last, partial
  wave costs as much as a full one (*wave quantization*). The guide's A100 example: M=2304,
  K=4096, 256x128 tiles, 108 SMs: N=1536 gives 9x12 = 108 tiles (one full wave); N=1537 gives
  9x13 = 117 tiles, i.e. two waves of which the second is 9/108 full: 117/216 = 54% utilisation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# cuBLAS-like tile menu (M x N of the output tile), largest first.
TILES: tuple[tuple[int, int], ...] = (
    (256, 128), (128, 256), (128, 128), (256, 64), (64, 256), (128, 64), (64, 128), (64, 64))

# Relative per-tile efficiency: a bigger tile reuses each loaded operand across more outputs, so
# the same SM does more useful math per byte fetched. Values are our estimate of the relative
# throughput of cuBLAS kernels by tile size on large problems (the guide's matmul page shows the
# larger tiles ahead); they only steer which tile the model picks, like cuBLAS's heuristic.
TILE_INTRINSIC_EFFICIENCY = {
    (256, 128): 1.00, (128, 256): 1.00, (128, 128): 0.95, (256, 64): 0.90, (64, 256): 0.90,
    (128, 64): 0.85, (64, 128): 0.85, (64, 64): 0.70}

# Bytes per element of each math unit's inputs (TF32 reads FP32 storage).
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}


def state_element_bytes(precision: str) -> int:
    """Bytes per element of the parameters, their gradients and the optimizer state under
    ``precision`` (AnalysisConfig.precision): 2 for a model cast to half ("half"), 4 otherwise
    (autocast and FSDP's mixed precision keep them in fp32)."""
    return 2 if precision == "half" else 4


@dataclass(frozen=True)
class GemmShape:
    """A GEMM C[M,N] = A[M,K] @ B[K,N], repeated ``batch`` times (bmm, groups)."""

    m: int
    n: int
    k: int
    batch: int = 1

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch


@dataclass(frozen=True)
class Quantization:
    tile: tuple[int, int]
    tiles: int
    waves: int
    tile_efficiency: float  # useful output area / computed tile area
    wave_efficiency: float  # tiles / (waves * SMs)
    intrinsic_efficiency: float
    split_k: int = 1  # K cut into this many slices, each its own tile (counted in `tiles`)

    @property
    def efficiency(self) -> float:
        """Fraction of the tile-wave schedule that does useful work (tile x wave)."""
        return self.tile_efficiency * self.wave_efficiency


def alignment_elements(unit: str, align_bytes: int = 16) -> int | None:
    """Multiple an element count must be for Tensor Cores (guide 2.2): 16 B / element size.

    TF32 -> 4, FP16/BF16 -> 8, INT8/FP8 -> 16. None for FP32 on CUDA cores (no requirement).
    """
    if unit == "fp32":
        return None
    return align_bytes // ELEMENT_BYTES[unit]


def gemm_dims(shape: GemmShape) -> tuple[tuple[str, int], ...]:
    """The dimensions the 16-byte rule applies to for a plain GEMM: all of M, N and K."""
    return (("m", shape.m), ("n", shape.n), ("k", shape.k))


def misaligned_dims(dims, unit: str, align_bytes: int = 16) -> list[str]:
    """Names of the dimensions that break the Tensor Core rule (guide 2.2).

    ``dims`` is a GemmShape (M, N, K all checked: for a linear layer those are batch, inputs
    and outputs) or named (name, size) pairs, e.g. a convolution's channel counts.
    """
    multiple = alignment_elements(unit, align_bytes)
    if multiple is None:
        return []
    if isinstance(dims, GemmShape):
        dims = gemm_dims(dims)
    return [name for name, size in dims if size % multiple]


def wave_efficiency(tiles: int, sm_count: int) -> float:
    """tiles / (full waves x SMs): 1.0 when the last wave is full (guide 2.3)."""
    if tiles <= 0:
        return 1.0
    return tiles / (math.ceil(tiles / sm_count) * sm_count)


# Split-K: when the output has too few tiles to fill the SMs (weight gradients: small M x N, huge
# K = batch x pixels), cuBLAS/cuDNN cut K into slices computed in parallel and summed. We allow
# power-of-two splits, each slice at least this deep.
SPLIT_K_CHOICES = (1, 2, 4, 8, 16, 32, 64, 128)
MIN_SPLIT_K_DEPTH = 256


def quantize(m: int, n: int, tile: tuple[int, int], sm_count: int, batch: int = 1,
             split_k: int = 1) -> Quantization:
    """Tile and wave quantization of an M x N output (x batch, x split_k) for one tile size."""
    tm, tn = tile
    tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
    tiles = tiles_m * tiles_n * batch * split_k
    tile_eff = (m * n) / (tiles_m * tm * tiles_n * tn) if tiles else 1.0
    return Quantization(tile=tile, tiles=tiles, waves=math.ceil(tiles / sm_count),
                        tile_efficiency=tile_eff, wave_efficiency=wave_efficiency(tiles, sm_count),
                        intrinsic_efficiency=TILE_INTRINSIC_EFFICIENCY.get(tile, 1.0),
                        split_k=split_k)


def best_quantization(shape: GemmShape, sm_count: int) -> Quantization:
    """The tile (and split-K) a cuBLAS-like heuristic would choose: most useful work per SM-time.

    Predicted time is proportional to waves x tile_area / intrinsic efficiency, so the best tile
    maximises intrinsic x tile x wave efficiency. Ties go to the larger tile (earlier in TILES).
    Split-K is only considered while the output alone is less than one wave, as cuBLAS does.
    """
    best = None
    for tile in TILES:
        output_tiles = math.ceil(shape.m / tile[0]) * math.ceil(shape.n / tile[1]) * shape.batch
        for split in SPLIT_K_CHOICES:
            if split > 1 and (output_tiles >= sm_count or shape.k // split < MIN_SPLIT_K_DEPTH):
                break
            q = quantize(shape.m, shape.n, tile, sm_count, shape.batch, split)
            if best is None or (q.efficiency * q.intrinsic_efficiency
                                > best.efficiency * best.intrinsic_efficiency + 1e-12):
                best = q
    return best
