"""Roofline prediction: time = max(FLOPs / math rate, bytes / bandwidth) + launch cost.

Performance guide 2.1: an operation is math-bound when its arithmetic intensity (FLOPs per byte
moved) exceeds the GPU's ops:byte ratio for the math unit it runs on, memory-bound otherwise.
The ``bound`` label uses exactly that definition; the predicted time adds the efficiencies below.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlperf.analysis.costs import Cost
from dlperf.analysis.gemm import (Quantization, alignment_elements, best_quantization,
                                  misaligned_dims)
from dlperf.errors import DlperfError
from dlperf.hardware.specs import DeviceSpec

# Fraction of the datasheet's dense peak a large, well-shaped GEMM sustains (cuBLAS typically
# reaches 75-90% of dense Tensor Core peak; clocks drop under full load on H100-class parts).
MATH_EFFICIENCY = 0.80
# Fraction of datasheet DRAM bandwidth a streaming kernel sustains (STREAM-like copies reach
# 80-90% on HBM parts).
MEMORY_EFFICIENCY = 0.85
# Tensor Core GEMMs whose M, N or K break the 16-byte rule (guide 2.2) still run on Tensor Cores
# with cuBLAS >= 11 / cuDNN >= 7.6.3, but with narrower loads; our estimate of the remaining rate.
MISALIGNED_EFFICIENCY = 0.50
# GPU time per kernel that does no useful work (launch, ramp-up and tail), back to back.
LAUNCH_OVERHEAD_S = 3e-6
# Grouped convolutions with fewer channels per group than this (depthwise: 1) run in cuDNN's
# direct CUDA-core kernels in every precision, FP32 included: an implicit GEMM per group would
# have N = channels per group, a sliver of any tile, so neither Tensor Cores nor the tile/wave
# model apply (issue #11: fp32 EfficientNet-B0 on a V100 was predicted at 238 img/s with a
# 128-wide tile over N = 1; NVIDIA measured 655).
NARROW_GROUP_CHANNELS = 8
# Tensor Core convolutions in cuDNN work on NHWC data; given NCHW tensors, cuDNN transposes the
# activations into NHWC and back around the kernel (the record ResNet-50 blog's reason to keep
# NHWC end to end). Modelled as one extra read + write of every activation the pass touches,
# in this many extra kernels.
NCHW_TRANSPOSE_KERNELS = 2


def math_unit(dtype: str, tf32: bool) -> str:
    """Which math unit a GEMM with inputs of ``dtype`` runs on (guide 2.2)."""
    if dtype in ("fp16", "bf16", "fp8", "int8"):
        return dtype
    return "tf32" if tf32 else "fp32"


@dataclass(frozen=True)
class Prediction:
    cost: Cost
    unit: str
    intensity: float
    bound: str  # "compute" | "memory" | "none" (no traffic and no math)
    aligned: bool | None  # None when the rule does not apply (not a Tensor Core GEMM)
    misaligned: tuple[str, ...]
    quantization: Quantization | None
    math_time_s: float
    memory_time_s: float
    launch_time_s: float
    transpose_time_s: float = 0.0  # NCHW <-> NHWC around a Tensor Core convolution

    @property
    def quantization_efficiency(self) -> float:
        return self.quantization.efficiency if self.quantization else 1.0

    @property
    def time_s(self) -> float:
        return max(self.math_time_s, self.memory_time_s) + self.transpose_time_s + self.launch_time_s

    @property
    def limited_by(self) -> str:
        """The largest term of the predicted time: "math" (peak x efficiency x quantization),
        "memory" (bandwidth), "transposes" (NCHW <-> NHWC around a Tensor Core convolution) or
        "launch". Not the guide's ``bound``, which compares intensity with the ops:byte ratio
        at full peak: a memory-bound kernel whose math is cut by tile quantization can still be
        limited by its math."""
        roof = ("math", self.math_time_s) if self.math_time_s >= self.memory_time_s else (
            "memory", self.memory_time_s)
        terms = (roof, ("transposes", self.transpose_time_s), ("launch", self.launch_time_s))
        return max(terms, key=lambda t: t[1])[0] if any(t[1] for t in terms) else "none"


def predict(cost: Cost, spec: DeviceSpec, tf32: bool = False, math_efficiency: float | None = None,
            memory_efficiency: float | None = None, launch_overhead_s: float | None = None
            ) -> Prediction:
    """Predict one kernel's time on ``spec``. Measured specs (probe) carry efficiency 1.0."""
    m_eff = math_efficiency if math_efficiency is not None else (
        1.0 if spec.measured else MATH_EFFICIENCY)
    b_eff = memory_efficiency if memory_efficiency is not None else (
        1.0 if spec.measured else MEMORY_EFFICIENCY)
    launch = launch_overhead_s if launch_overhead_s is not None else (
        spec.launch_overhead_s if spec.launch_overhead_s is not None else LAUNCH_OVERHEAD_S)
    is_matmul = cost.kind in ("gemm", "fused")
    unit = math_unit(cost.dtype, tf32) if is_matmul else "fp32"
    peak = spec.peak_flops(unit)
    if peak is None and unit in ("bf16", "fp8") and is_matmul:
        raise DlperfError(f"{spec.name} has no {unit} math; choose a dtype it supports "
                          f"({', '.join(u for u in spec.peak if u != 'fp32')} or fp32)")
    if peak is None:  # e.g. tf32 on a pre-Ampere part: FP32 runs on the CUDA cores
        unit, peak = "fp32", spec.peak_flops("fp32")
    efficiency = m_eff
    quant, miss, aligned = None, (), None
    if is_matmul and cost.groups > 1 and cost.align_dims and min(
            size for _, size in cost.align_dims) < max(NARROW_GROUP_CHANNELS,
                                                        alignment_elements(unit) or 0):
        # Depthwise and narrow grouped convolutions run in cuDNN's CUDA-core kernels, whatever
        # the precision: no Tensor Cores, no tile model.
        unit, peak = "fp32", spec.peak_flops("fp32")
    elif cost.gemm is not None and cost.kind == "gemm":
        if spec.tensor_cores and unit != "fp32":
            miss = tuple(misaligned_dims(cost.align_dims or cost.gemm, unit,
                                         spec.tc_alignment_bytes))
            aligned = not miss
            if miss:
                efficiency *= MISALIGNED_EFFICIENCY
        if spec.tensor_cores:  # tile/wave model of cuBLAS on SMs; CPUs have no such waves
            quant = best_quantization(cost.gemm, spec.sm_count)
            efficiency *= quant.efficiency * quant.intrinsic_efficiency
    transpose_s, kernels = 0.0, cost.kernels
    if cost.nhwc is False and spec.tensor_cores and unit != "fp32" and cost.activation_bytes:
        transpose_s = 2 * cost.activation_bytes / (spec.mem_bandwidth * b_eff)
        kernels += NCHW_TRANSPOSE_KERNELS
    intensity = cost.intensity
    ratio = peak / spec.mem_bandwidth
    bound = "none" if not cost.flops and not cost.bytes else (
        "compute" if intensity > ratio else "memory")
    return Prediction(
        cost=cost, unit=unit, intensity=intensity, bound=bound, aligned=aligned, misaligned=miss,
        quantization=quant, math_time_s=cost.flops / (peak * efficiency) if cost.flops else 0.0,
        memory_time_s=cost.bytes / (spec.mem_bandwidth * b_eff) if cost.bytes else 0.0,
        launch_time_s=kernels * launch, transpose_time_s=transpose_s)
