"""Roofline prediction: time = max(FLOPs / math rate, bytes / bandwidth) + launch cost.

Performance guide 2.1: an operation is math-bound when its arithmetic intensity (FLOPs per byte
moved) exceeds the GPU's ops:byte ratio for the math unit it runs on, memory-bound otherwise.
The ``bound`` label uses exactly that definition; the predicted time uses how much of each peak
real kernels reach, by kernel class (hardware/efficiency.py, fitted to published measurements),
and ``step_time`` adds the time the GPU waits for the CPU to issue its kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlperf.analysis.costs import Cost
from dlperf.analysis.gemm import (Quantization, alignment_elements, best_quantization,
                                  misaligned_dims)
from dlperf.errors import DlperfError
from dlperf.hardware.efficiency import (Efficiency, efficiency_for, kernel_head_dim,
                                        memory_class_of, traffic_factor)
from dlperf.hardware.specs import DeviceSpec

# Grouped convolutions with fewer channels per group than this (depthwise: 1) run in cuDNN's
# direct CUDA-core kernels in every precision, FP32 included: an implicit GEMM per group would
# have N = channels per group, a sliver of any tile, so neither Tensor Cores nor the tile/wave
# model apply (issue #11: fp32 EfficientNet-B0 on a V100 was predicted at 238 img/s with a
# 128-wide tile over N = 1; NVIDIA measured 655).
NARROW_GROUP_CHANNELS = 8
# Tensor Core convolutions in cuDNN work on NHWC data; given NCHW tensors, cuDNN transposes the
# activations into NHWC around the kernel (the record ResNet-50 blog's reason to keep NHWC end
# to end). Which activations it transposes depends on the GPU generation (``transposed_bytes``):
# * Volta and Turing: every activation the pass reads and the one it writes, each in its own
#   kernel (an nvprof trace of an FP16 NCHW convolution on a V100 with cuDNN 8.2, in
#   PaddlePaddle's operator-benchmark guide: nchwToNhwcKernel for the input and the filter,
#   nhwcToNchwKernel for the output, one call each per convolution).
# * Ampere and later (every GPU with TF32 Tensor Cores): only the activations the pass reads;
#   cuDNN's sm80 implicit-GEMM kernels write their NCHW output from the epilogue (their names
#   say it: ``sm80_xmma_fprop_implicit_gemm_..._nhwckrsc_nchw``, NHWC in, NCHW out). With the
#   output transposes counted on these GPUs too, the published table's NCHW mixed-precision
#   ResNet-50 rows on A100 to H200 were predicted 3-12% too slow and the fit's held-out error
#   was 10.5%; without them, 8.5% (benchmarks/README.md, results/efficiency-fit.json).
# Each transpose reads and writes its tensor once, at streaming bandwidth, in one kernel.
# TF32 convolutions pay ``Efficiency.tf32_nchw`` of these transposes' time, inside their kernel
# (no launches of their own): 0 in the shipped model, where every TF32 NCHW row of the
# published table fits without it; a lent H200 measured 0.57 of the bf16 cost per byte
# (hardware/efficiency.py explains why it is not shipped).
# The math classes of convolutions in an implicit-GEMM or direct kernel, whose backward
# (dgrad, wgrad) takes the efficiency model's ``conv_backward`` share.
CONV_CLASSES = ("cuda-core-conv", "tensor-conv", "grouped-conv")


# MXFP8's block-scaled GEMMs (models/fp8.py) against per-tensor FP8's on the same GPU, the
# operands already quantized: TransformerEngine's GEMM profiling tutorial (docs/examples/
# gemm_profiling/gemm_profiling.rst, a B300, the 12 GEMMs of a 5B model's layer at 15,872
# tokens) took 7.161 ms a layer in MXFP8 against 6.812 in FP8 with current scaling; the
# scales each block of 32 brings in are read beside the operands (docs/design.md, "MXFP8")
MX_GEMM_SHARE = 6.812 / 7.161


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
    # The efficiency model's classes this kernel's time used (hardware/efficiency.py)
    # tensor-gemm | tensor-conv | grouped-conv | attention | cuda-core | cuda-core-conv |
    # cuda-core-attention | none
    math_class: str = "none"
    # stream | depthwise | reduction | norm | reduction-backward | channel-norm |
    # channel-norm-backward | transcendental | gelu-tanh | window | window-backward
    memory_class: str = "stream"
    traffic_factor: float = 1.0  # real traffic / the guide's minimum bytes (two-pass kernels)
    kernels: int = 1  # kernels launched, the NCHW transposes included

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


def wide_depthwise_wgrad(cost: Cost) -> bool:
    """Whether ``cost`` is the weight gradient of a depthwise convolution (one input channel
    per group) whose window is wider than 3x3 (more than 9 taps: 5x5, 7x7): on a CPU, oneDNN's
    JIT depthwise kernel covers only 3x3 for it (``Efficiency.depthwise_wgrad_wide``). Its GEMM
    is (K/g, C/g x R x S, N x P x Q) per group (costs.conv_gemms), so with C/g = 1 the window's
    taps are the GEMM's N."""
    if cost.phase != "wgrad" or cost.groups <= 1 or cost.gemm is None or not cost.align_dims:
        return False
    c_in = dict(cost.align_dims).get("c_in")
    return c_in == 1 and cost.gemm.n > 9


def winograd_shape(cost: Cost, math_class: str) -> bool:
    """Whether ``cost`` is a convolution pass cuDNN's Winograd algorithms take, layout aside:
    on the CUDA cores (``math_class``), of their shape (``Cost.winograd``: 3x3, stride 1,
    dilation 1, one group)."""
    return math_class == "cuda-core-conv" and bool(cost.winograd)


def winograd_runs(cost: Cost, math_class: str) -> bool:
    """Whether cuDNN may run ``cost`` with a Winograd algorithm: ``winograd_shape`` in NCHW, the
    only layout they take (hardware/efficiency.py, ``winograd``)."""
    return winograd_shape(cost, math_class) and cost.nhwc is False


def writes_nchw_from_epilogue(spec: DeviceSpec) -> bool:
    """Whether cuDNN's Tensor Core convolutions on ``spec`` write an NCHW output directly (sm80
    and later: the GPUs with TF32 Tensor Cores), so that only their inputs are transposed."""
    return spec.tensor_cores and spec.peak_flops("tf32") is not None


def transposed_bytes(cost: Cost, spec: DeviceSpec) -> tuple[int, int]:
    """(bytes, tensors) cuDNN transposes around an NCHW Tensor Core convolution pass: the
    activations it reads (forward: x; dgrad: dy; wgrad: dy and x) and, before Ampere, the one
    it writes (forward: y; dgrad: dx). ``Cost.activation_bytes`` holds the pass's activations,
    ``output_bytes`` what it writes (wgrad writes the weight gradient, no activation)."""
    if cost.phase == "wgrad":
        return cost.activation_bytes, 2
    if writes_nchw_from_epilogue(spec):
        return cost.activation_bytes - cost.output_bytes, 1
    return cost.activation_bytes, 2


def predict(cost: Cost, spec: DeviceSpec, tf32: bool = False,
            efficiency: Efficiency | None = None) -> Prediction:
    """Predict one kernel's time on ``spec`` with the efficiency model (default: the one for
    ``spec``, hardware/efficiency.py: fitted for datasheet presets, 1.0 for measured specs)."""
    eff = (efficiency or efficiency_for(spec)).for_dtype(cost.dtype)
    is_matmul = cost.kind in ("gemm", "fused")
    unit = math_unit(cost.dtype, tf32) if is_matmul else "fp32"
    peak = spec.peak_flops(unit)
    if peak is None and unit in ("bf16", "fp8") and is_matmul:
        raise DlperfError(f"{spec.name} has no {unit} math; choose a dtype it supports "
                          f"({', '.join(u for u in spec.peak if u != 'fp32')} or fp32)")
    if peak is None:  # e.g. tf32 on a pre-Ampere part: FP32 runs on the CUDA cores
        unit, peak = "fp32", spec.peak_flops("fp32")
    is_conv = cost.op.startswith("convolution")
    quant, miss, aligned = None, (), None
    memory_class = memory_class_of(cost.op, cost.variant)
    efficiency = 1.0
    if is_matmul and cost.groups > 1 and cost.align_dims and min(
            size for _, size in cost.align_dims) < max(NARROW_GROUP_CHANNELS,
                                                        alignment_elements(unit) or 0):
        # Depthwise and narrow grouped convolutions run in cuDNN's CUDA-core kernels, whatever
        # the precision: no Tensor Cores, no tile model; their traffic is the depthwise class.
        unit, peak = "fp32", spec.peak_flops("fp32")
        math_class, memory_class = "cuda-core", "depthwise"
    elif is_matmul:
        on_tc = spec.tensor_cores and unit != "fp32"
        if not on_tc:
            math_class = ("cuda-core-conv" if is_conv else
                          "cuda-core-attention" if cost.kind == "fused" else "cuda-core")
        else:
            math_class = ("grouped-conv" if is_conv and cost.groups > 1
                          else "tensor-conv" if is_conv
                          else "attention" if cost.kind == "fused" else "tensor-gemm")
        if cost.gemm is not None and cost.kind == "gemm":
            if on_tc:
                miss = tuple(misaligned_dims(cost.align_dims or cost.gemm, unit,
                                             spec.tc_alignment_bytes))
                aligned = not miss
                if miss:
                    efficiency *= eff.misaligned
            if spec.tensor_cores:  # tile/wave model of cuBLAS on SMs; CPUs have no such waves
                quant = best_quantization(cost.gemm, spec.sm_count)
                efficiency *= quant.efficiency * quant.intrinsic_efficiency
            efficiency *= eff.ramp(cost.gemm, conv=is_conv)
        if cost.op == "fp8_mx_gemm":
            efficiency *= MX_GEMM_SHARE
    else:
        math_class = "cuda-core" if cost.flops else "none"
    efficiency *= eff.math(math_class)
    if math_class == "attention" and cost.head_dim:
        # the kernel's padded head size: FlashAttention-2 computes a head of 80 as 96
        efficiency *= cost.head_dim / kernel_head_dim(eff.attention_kernel, cost.head_dim)
    if winograd_runs(cost, math_class):
        efficiency /= eff.winograd
    if is_conv and cost.phase != "forward" and math_class in CONV_CLASSES:
        efficiency *= eff.conv_backward
    if memory_class == "depthwise" and cost.phase != "forward":
        efficiency *= (eff.depthwise_wgrad_wide if eff.depthwise_wgrad_wide is not None
                       and wide_depthwise_wgrad(cost) else eff.depthwise_backward)
    bandwidth = eff.bandwidth(spec, memory_class)
    factor = traffic_factor(cost.op)
    transpose_s, kernels = 0.0, cost.kernels
    layout_share = eff.tf32_nchw if unit == "tf32" else 1.0
    if (cost.nhwc is False and spec.tensor_cores and unit != "fp32" and layout_share > 0
            and cost.activation_bytes):
        moved, tensors = transposed_bytes(cost, spec)
        # read NCHW, write NHWC (or back); TF32: ``tf32_nchw`` of that, inside the kernel
        transpose_s = 2 * moved / eff.bandwidth(spec) * layout_share
        kernels += tensors if unit != "tf32" else 0
    intensity = cost.intensity
    ratio = peak / spec.mem_bandwidth
    bound = "none" if not cost.flops and not cost.bytes else (
        "compute" if intensity > ratio else "memory")
    return Prediction(
        cost=cost, unit=unit, intensity=intensity, bound=bound, aligned=aligned, misaligned=miss,
        quantization=quant, math_time_s=cost.flops / (peak * efficiency) if cost.flops else 0.0,
        memory_time_s=cost.bytes * factor / bandwidth if cost.bytes else 0.0,
        launch_time_s=kernels * eff.launch_s + (cost.kernels * eff.conv_launch_s if is_conv
                                                else 0.0),
        transpose_time_s=transpose_s,
        math_class=math_class, memory_class=memory_class, traffic_factor=factor,
        kernels=kernels)


def step_time(kernel_times, kernel_counts, host_s: float, syncs=None) -> float:
    """Step time when a CPU issues the kernels, ``host_s`` each, into the GPU's launch queue.

    Kernel i can start once the GPU finished kernel i-1 and the CPU has issued it:
    g_i = max(g_{i-1}, C_i) + d_i with C_i the CPU's cumulative issue time. With host_s = 0
    this is the plain sum; when kernels are shorter than host_s the CPU is the bottleneck and
    the GPU idles. An entry of n kernels taking d in all (a convolution's several kernels, an
    unfused optimizer's hundreds) is n equal kernels, each run as soon as it is issued: it ends
    at the latest of g + d (the GPU busy throughout), C + host_s + d (waiting for the first)
    and C + n host_s + d / n (waiting for the last), C being the issue time before it.
    ``syncs`` (one count per entry, optional; a flag reads as 0 or 1): the CPU waits for the GPU
    to finish everything before entry i ahead of issuing it (``Cost.syncs``), so C restarts
    from g_{i-1}: the queue is empty and the GPU idles while the CPU issues entry i's kernels.
    A count k > 1: the entry is issued in k equal rounds (n / k kernels, d / k), the CPU
    waiting for the GPU before each (a synchronisation inside a loop over tensors).
    """
    if host_s <= 0:
        return float(sum(kernel_times))
    d = np.asarray(kernel_times, dtype=float)
    n = np.asarray(kernel_counts, dtype=float)
    waits = np.zeros(len(d), dtype=int) if syncs is None else np.asarray(syncs, dtype=int)
    gpu = issued = 0.0
    # runs of entries without a wait, each starting at one that waits (or at the first)
    edges = [0, *np.flatnonzero(waits).tolist(), len(d)]
    for a, b in zip(edges[:-1], edges[1:]):
        if a == b:
            continue
        if waits[a]:
            issued = max(issued, gpu)
            if waits[a] > 1 and n[a] > 0:
                # k rounds of m kernels, each issued with the GPU idle: it ends ``first``
                # after its issue starts, and the next round's issue starts then
                k = min(waits[a], n[a])
                m, part = n[a] / k, d[a] / k
                first = max(host_s + part, m * host_s + part / m)
                gpu = issued + k * first
                issued = gpu - first + m * host_s
                a += 1
                if a == b:
                    continue
        gpu, issued = _issued_run(d[a:b], n[a:b], host_s, gpu, issued)
    return float(gpu)


def _issued_run(d, n, host_s: float, gpu: float, issued: float) -> tuple[float, float]:
    """(GPU end, CPU issue time) after entries (times ``d``, kernel counts ``n``) that no wait
    separates, from a GPU busy until ``gpu`` and a CPU that has issued until ``issued``:
    g_j = max(g_{j-1} + d_j, C_{j-1} + first_j), unrolled to the largest of the GPU's own
    time and, for each entry, its issue plus its first kernel's wait plus the GPU time after
    it. ``first``: max(host_s + d, n host_s + d / n) for an entry of n launches, d for one
    fused into another (no launch, run once issued)."""
    issue = n * host_s
    before = issued + np.cumsum(issue) - issue
    first = np.where(n > 0, np.maximum(host_s + d, issue + d / np.maximum(n, 1)), d)
    remaining = np.cumsum(d[::-1])[::-1]
    end = max(gpu + float(remaining[0]), float(np.max(before + first + remaining - d)))
    return end, issued + float(issue.sum())


def predicted_step_s(predictions, host_s: float) -> float:
    """``step_time`` of a list of Predictions: their times, kernel counts and host syncs, in
    order (a step's, or the step with some kernels changed or left out)."""
    return step_time([p.time_s for p in predictions], [p.kernels for p in predictions], host_s,
                     [p.cost.syncs for p in predictions])