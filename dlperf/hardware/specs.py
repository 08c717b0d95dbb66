"""Device presets: one table of datasheet facts, each with its source.

Peaks are *dense* FLOP/s (structured-sparsity figures are kept in ``sparse_peak`` and never used
by default: dense and sparse peaks never mix). Tensor Core math units are named by their input dtype:
``tf32``, ``fp16``, ``bf16``, ``fp8``, ``int8``; ``fp32`` means the CUDA cores (FMA pipes).

Performance guide 2.2: Tensor Cores are most efficient when the key GEMM dimensions are multiples
of 16 bytes (4 TF32, 8 FP16/BF16, 16 INT8/FP8 elements); on A100 the guide's matmul page adds that
128-byte multiples are best. ``tc_alignment_bytes`` / ``tc_best_alignment_bytes`` hold those.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from dlperf.errors import DlperfError, close_matches, finite_number
from dlperf.hardware.efficiency import (A100_FLASH2_ATTENTION, GEFORCE_TENSOR_GEMM,
                                         H200_TENSOR_GEMM, HOPPER_ATTENTION,
                                         HOPPER_CUDA_CORE_CONV, HOPPER_CUDNN_ATTENTION,
                                         HOPPER_FLASH2_ATTENTION, HOPPER_TENSOR_GEMM,
                                         VOLTA_CUDA_CORE, VOLTA_TENSOR_GEMM)

MATH_UNITS = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8")
T = 1e12


@dataclass(frozen=True)
class DeviceSpec:
    """What the roofline needs to know about one accelerator (or a measured CPU)."""

    name: str
    display_name: str
    sm_count: int  # streaming multiprocessors (CPU: cores), the unit of wave quantization
    mem_bandwidth: float  # bytes/s, DRAM (HBM/GDDR)
    peak: dict = field(default_factory=dict)  # math unit -> dense FLOP/s
    sparse_peak: dict = field(default_factory=dict)  # 2:4 sparsity figures, informational only
    boost_clock_mhz: float | None = None
    l2_bytes: int | None = None
    memory_bytes: int | None = None
    tc_alignment_bytes: int = 16
    tc_best_alignment_bytes: int = 128
    tensor_cores: bool = True
    source: str = ""
    notes: str = ""
    # Why dlperf's predictions on this device run off published measurements, where that is
    # known (benchmarks/README.md): printed with its track record (hardware/track_record.py)
    # under every prediction, so a number is never shown without what is known against it.
    caveat: str = ""
    measured: bool = False  # True when the figures come from `dlperf probe`
    launch_overhead_s: float | None = None  # per-kernel fixed cost; None = roofline default
    # Overrides of the efficiency model's parameters for this device (hardware/efficiency.py):
    # e.g. {"memory": 0.9, "tensor_conv": 0.7}; empty: the fitted defaults.
    efficiency: dict = field(default_factory=dict)

    def peak_flops(self, unit: str) -> float | None:
        """Dense peak for a math unit, or None when the device has no such unit."""
        value = self.peak.get(unit)
        return float(value) if value else None

    def ops_per_byte(self, unit: str) -> float | None:
        """The guide's ops:byte ratio (2.1): peak math rate over memory bandwidth."""
        peak = self.peak_flops(unit)
        return peak / self.mem_bandwidth if peak else None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict, origin: str = "spec") -> "DeviceSpec":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise DlperfError(f"{origin}: unknown device field(s) {', '.join(unknown)}; "
                              f"allowed: {', '.join(sorted(known))}")
        missing = [k for k in ("name", "sm_count", "mem_bandwidth", "peak") if k not in data]
        if missing:
            raise DlperfError(f"{origin}: missing device field(s) {', '.join(missing)}")
        peak = data["peak"]
        if not isinstance(peak, dict) or not peak:
            raise DlperfError(f"{origin}: 'peak' must map math units ({', '.join(MATH_UNITS)}) "
                              "to FLOP/s")
        for unit, value in {**peak, **data.get("sparse_peak", {})}.items():
            if unit not in MATH_UNITS:
                raise DlperfError(f"{origin}: unknown math unit {unit!r} in peak; "
                                  f"use one of {', '.join(MATH_UNITS)}")
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise DlperfError(f"{origin}: peak[{unit!r}] must be a positive FLOP/s number")
        for key in ("display_name", "source", "notes", "caveat"):
            if not isinstance(data.get(key, ""), str):
                raise DlperfError(f"{origin}: {key} must be a string, got {data[key]!r}")
        if "fp32" not in peak:
            raise DlperfError(f"{origin}: peak has no 'fp32' entry; every device needs its FP32 "
                              "FLOP/s (what non-Tensor-Core math runs at)")
        for key in ("sm_count", "mem_bandwidth"):
            value = data[key]
            if not finite_number(value) or value <= 0:
                raise DlperfError(f"{origin}: {key} must be a positive number, got {value!r}")
        if not isinstance(data["sm_count"], int) and not float(data["sm_count"]).is_integer():
            raise DlperfError(f"{origin}: sm_count must be a whole number, got {data['sm_count']!r}")
        # optional numbers: (field, smallest allowed, what it is)
        for key, low, what in (("tc_alignment_bytes", 1, "bytes"),
                               ("tc_best_alignment_bytes", 1, "bytes"),
                               ("launch_overhead_s", 0, "seconds"),
                               ("boost_clock_mhz", 1e-9, "MHz"), ("l2_bytes", 0, "bytes"),
                               ("memory_bytes", 1, "bytes")):
            value = data.get(key)
            if value is None:
                continue
            if not finite_number(value) or value < low:
                raise DlperfError(f"{origin}: {key} must be a number >= {low:g} ({what}), got "
                                  f"{value!r}")
        for key in ("tc_alignment_bytes", "tc_best_alignment_bytes"):
            value = data.get(key)
            if value is not None and (value & (value - 1) if isinstance(value, int) else True):
                raise DlperfError(f"{origin}: {key} must be a power of two (16 on NVIDIA Tensor "
                                  f"Cores), got {value!r}")
        data = dict(data)
        if "efficiency" in data:
            from dlperf.hardware.efficiency import check_overrides

            data["efficiency"] = check_overrides(data["efficiency"], origin)
        data.setdefault("display_name", data["name"])
        return cls(**data)


def _spec(name, display, sms, clock, bw_gbs, peaks_t, sparse_t=None, l2_mb=None, mem_gb=None,
          source="", notes="", tensor_cores=True, caveat="", efficiency=None) -> DeviceSpec:
    return DeviceSpec(
        name=name, display_name=display, sm_count=sms, boost_clock_mhz=clock,
        mem_bandwidth=bw_gbs * 1e9,
        peak={k: v * T for k, v in peaks_t.items()},
        sparse_peak={k: v * T for k, v in (sparse_t or {}).items()},
        l2_bytes=int(l2_mb * 2**20) if l2_mb else None,
        memory_bytes=int(mem_gb * 2**30) if mem_gb else None,
        source=source, notes=notes, tensor_cores=tensor_cores, caveat=caveat,
        efficiency=dict(efficiency or {}))


_H100 = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
# What the efficiency model knows of Hopper GPUs beyond the fitted defaults: the GEMM share and
# the Triton attention kernel's, fitted together to the GEMM- and attention-bound decoder runs
# on H100s (hardware/efficiency.py, HOPPER_TENSOR_GEMM, HOPPER_ATTENTION, and their fit), and
# FlashAttention-2's and cuDNN's as lent H200s timed them (HOPPER_FLASH2_ATTENTION,
# HOPPER_CUDNN_ATTENTION):
# cuBLAS's GEMMs keep a smaller share of the Tensor Core peak in sustained training than on an
# A100, and fused attention (kernels written for Ampere's MMA instructions) about half of its
# A100 share, by kernel (--attention-kernel).
_HOPPER = {"tensor_gemm": HOPPER_TENSOR_GEMM,
           "by_attention": {"flash2": HOPPER_FLASH2_ATTENTION, "triton-2023": HOPPER_ATTENTION,
                            "cudnn": HOPPER_CUDNN_ATTENTION},
           # strict-FP32 convolutions, as a lent H200 ran them (HOPPER_CUDA_CORE_CONV)
           "cuda_core_conv": HOPPER_CUDA_CORE_CONV, "winograd": 1.0}
# The H200: the same, at the GEMM share it sustained (hardware/efficiency.py, H200_TENSOR_GEMM)
_H200 = {**_HOPPER, "tensor_gemm": H200_TENSOR_GEMM}
# The A100s' FlashAttention-2 share, fitted to the eager Llama rows (hardware/efficiency.py,
# A100_FLASH2_ATTENTION); the Triton kernel's is the generic fitted one, FITTED.attention.
_A100_ATTENTION = {"by_attention": {"flash2": A100_FLASH2_ATTENTION}}
# Printed with every prediction on them (beside the track record): where the shares come from,
# and what the runs on newer stacks say of them (benchmarks/README.md, eighth and twenty-second
# sessions). The GEMM sentence is the part's own (the H200 carries its measured share).
_H100_GEMM_CAVEAT = (
    f"Its GEMM share ({HOPPER_TENSOR_GEMM} of the Tensor Core peak) is fitted to MosaicML's "
    "FSDP runs on H100s with a 2023 stack (PyTorch 2.1, CUDA 12.1). A lent H200 (the same "
    "GH100 compute) sustained 0.70 of the peak on an MPT-13B block's GEMMs alone (torch 2.11) "
    "and 0.59 beside a collective's copy, and newer stacks ran faster than predicted (Lambda's "
    "BERT on one H100 by up to 15%): for a 2024 or later stack `--efficiency "
    f"tensor_gemm={H200_TENSOR_GEMM}` may be the better bet.")
_H200_GEMM_CAVEAT = (
    f"Its GEMM share ({H200_TENSOR_GEMM} of the Tensor Core peak) is what a lent H200 "
    "sustained on an MPT-13B block's GEMMs alone (torch 2.11; 0.59 beside a collective's "
    "copy), and what every published H200 run fits (KempnerForge's and Trainy's FSDP, Lambda's "
    "BERT: benchmarks/results/experiment-hopper-gemm.json); the H100 presets keep "
    f"{HOPPER_TENSOR_GEMM}, the share of the 2023-2024 runs on H100s.")


def _hopper_caveat(gemm: str) -> str:
    """The Hopper presets' caveat: the part's GEMM sentence, then the shares they all share."""
    return gemm + (
        " Its fused attention is the kernel PyTorch's SDPA picks with the torch installed "
        f"here: from torch 2.11 (cuDNN 9.15.1 and later) cuDNN's ({HOPPER_CUDNN_ATTENTION}, "
        "timed on an H200 with torch 2.11, whose SDPA picked it by default), before it "
        f"FlashAttention-2's ({HOPPER_FLASH2_ATTENTION}, forward and backward on the same H200; "
        "--attention-kernel flash2 or cudnn chooses; triton-2023: MosaicML's 2023 stack's "
        f"{HOPPER_ATTENTION}). Its strict-FP32 convolutions ran at {HOPPER_CUDA_CORE_CONV} of "
        "the FP32 peak on that H200, without a net Winograd gain. `--efficiency "
        "tensor_gemm=...` (or a device file's \"efficiency\") sets a stack's own values.")


_HOPPER_CAVEAT = _hopper_caveat(_H100_GEMM_CAVEAT)
_H200_CAVEAT = _hopper_caveat(_H200_GEMM_CAVEAT)
_A100 = ("https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
         "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")
_L40 = "https://www.nvidia.com/en-us/data-center/l40/"
_VOLTA = ("https://images.nvidia.com/content/technologies/volta/pdf/"
          "volta-v100-datasheet-update-us-1165301-r5.pdf")
# The V100s' own GEMM and CUDA-core shares, fitted to the published V100 rows (hardware/
# efficiency.py, VOLTA_TENSOR_GEMM, VOLTA_CUDA_CORE), and what they hold
_VOLTA_EFFICIENCY = {"tensor_gemm": VOLTA_TENSOR_GEMM, "cuda_core": VOLTA_CUDA_CORE}
_VOLTA_CAVEAT = (
    f"Its GEMM share ({VOLTA_TENSOR_GEMM} of the Tensor Core peak) and CUDA-core share "
    f"({VOLTA_CUDA_CORE} of the FP32 peak) are fitted to published V100 runs of 2018-2021 "
    "stacks (NVIDIA's DeepLearningExamples, Lambda); NVIDIA's 2022 BERT stack (NVFuser, "
    "fused LAMB) ran its GEMMs near 0.7: `--efficiency tensor_gemm=0.7` for such a stack.")
_ADA = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"
# The GeForce RTX 3090 and 4090: cuBLAS's GEMMs at a share of their own of the FP32-accumulate
# peak, fitted to published runs on them (hardware/efficiency.py, GEFORCE_TENSOR_GEMM)
_GEFORCE_EFFICIENCY = {"tensor_gemm": GEFORCE_TENSOR_GEMM}
_GEFORCE_CAVEAT = (
    f"Its GEMM share ({GEFORCE_TENSOR_GEMM} of the FP32-accumulate Tensor Core peak) is fitted "
    "to published runs on GeForce RTX 3090s and 4090s (timm, Lambda), whose boards run above "
    "the rated boost clock the peak assumes while power allows; a card held at its rated "
    "clock or power-limited runs GEMMs slower: `--efficiency tensor_gemm=0.78` for the "
    "shared share.")

# The GH100 at 132 SMs and 1,980 MHz (H100-SXM datasheet, TFLOP/s): the H100 SXM, the H200 and
# the GH200's GPU share it, dense and with 2:4 sparsity.
_GH100 = {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9,
          "int8": 1978.9}
_GH100_SPARSE = {"tf32": 989.4, "fp16": 1978.9, "bf16": 1978.9, "fp8": 3957.8, "int8": 3957.8}
_POWER = ("Its board power ({w} W) is low for its silicon: under sustained Tensor Core load "
          "its clock sits below the boost clock the datasheet peaks assume, so math-bound steps "
          "run slower than predicted; for a number to bet on, run `dlperf probe` on the card and "
          "pass --device PROFILE.json.")

# SM counts and boost clocks come from the architecture whitepapers (Volta, Turing, GA100, GA102,
# AD102/AD104, GH100); peaks and bandwidth from each product's datasheet at `source`.
PRESETS: dict[str, DeviceSpec] = {s.name: s for s in (
    _spec("v100-sxm2", "NVIDIA V100-SXM2 (32 GB)", 80, 1530, 900,
          {"fp32": 15.7, "fp16": 125.0}, l2_mb=6, mem_gb=32,
          source=_VOLTA, efficiency=_VOLTA_EFFICIENCY, caveat=_VOLTA_CAVEAT,
          notes="The guide's example GPU: FP16 ops:byte = 125 TFLOP/s / 900 GB/s = 138.9."),
    _spec("v100-sxm2-16gb", "NVIDIA V100-SXM2 (16 GB)", 80, 1530, 900,
          {"fp32": 15.7, "fp16": 125.0}, l2_mb=6, mem_gb=16,
          source=_VOLTA, efficiency=_VOLTA_EFFICIENCY, caveat=_VOLTA_CAVEAT,
          notes="The 16 GB V100-SXM2 of the first DGX-1s (NVIDIA's DGX-1 16GB tables): the "
                "32 GB part's compute and bandwidth, half its memory."),
    _spec("v100-pcie", "NVIDIA V100-PCIe (32 GB)", 80, 1380, 900,
          {"fp32": 14.0, "fp16": 112.0}, l2_mb=6, mem_gb=32,
          source=_VOLTA, efficiency=_VOLTA_EFFICIENCY,
          notes="The V100's 250 W PCIe card: the datasheet's 14 TFLOP/s FP32 and 112 Tensor "
                "Core at a 1,380 MHz boost, against the SXM2 part's 15.7 and 125 at 1,530. "
                "The 16 GB card has the same compute and half the memory (a device file with "
                "memory_bytes says so).",
          caveat=_VOLTA_CAVEAT + " " + _POWER.format(w=250)),
    _spec("t4", "NVIDIA T4", 40, 1590, 320,
          {"fp32": 8.1, "fp16": 65.0, "int8": 130.0}, l2_mb=4, mem_gb=16,
          source="https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/"
                 "t4-tensor-core-datasheet-951643.pdf",
          notes="70 W part: sustained clocks are often below boost.",
          caveat=_POWER.format(w=70)),
    _spec("a10", "NVIDIA A10", 72, 1695, 600,
          {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0, "int8": 250.0},
          {"tf32": 125.0, "fp16": 250.0, "bf16": 250.0, "int8": 500.0}, l2_mb=6, mem_gb=24,
          source="https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/"
                 "datasheet-new/nvidia-a10-datasheet.pdf",
          caveat=_POWER.format(w=150)),
    _spec("rtx3090", "NVIDIA GeForce RTX 3090", 82, 1695, 936,
          {"fp32": 35.6, "tf32": 35.6, "fp16": 71.0, "bf16": 71.0, "int8": 284.0},
          {"tf32": 71.0, "fp16": 142.0, "bf16": 142.0, "int8": 568.0}, l2_mb=6, mem_gb=24,
          source="https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-"
                 "whitepaper-v2.pdf",
          notes="GeForce GA102: FP16/BF16 Tensor Core math with FP32 accumulation (what "
                "autocast's GEMMs use) runs at half the FP16-accumulate rate (142 TFLOP/s); "
                "the whitepaper's table of RTX 3090 specifications gives both. timm's published "
                "training benchmarks ran on this card.",
          efficiency=_GEFORCE_EFFICIENCY, caveat=_GEFORCE_CAVEAT),
    _spec("rtx4090", "NVIDIA GeForce RTX 4090", 128, 2520, 1008,
          {"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2, "fp8": 330.3,
           "int8": 660.6},
          {"tf32": 165.2, "fp16": 330.3, "bf16": 330.3, "fp8": 660.6, "int8": 1321.2},
          l2_mb=72, mem_gb=24, source=_ADA,
          notes="GeForce AD102: FP16/BF16 Tensor Core math with FP32 accumulation runs at half "
                "the FP16-accumulate rate (330 TFLOP/s dense), as on the RTX 3090; the Ada "
                "whitepaper's appendix gives both. 450 W board.",
          efficiency=_GEFORCE_EFFICIENCY, caveat=_GEFORCE_CAVEAT),
    _spec("rtx6000-ada", "NVIDIA RTX 6000 Ada Generation", 142, 2505, 960,
          {"fp32": 91.1, "tf32": 91.1, "fp16": 182.1, "bf16": 182.1, "fp8": 364.2,
           "int8": 364.2},
          {"tf32": 182.1, "fp16": 364.2, "bf16": 364.2, "fp8": 728.5, "int8": 728.5},
          l2_mb=96, mem_gb=48, source=_L40,
          notes="Workstation twin of the L40 (142-SM AD102, 300 W): FP16/BF16 Tensor Core math "
                "with FP32 accumulation, and TF32, at the rates of NVIDIA's L40 datasheet scaled "
                "to this card's 2,505 MHz boost (L40: 181.05 and 90.5 TFLOP/s dense; FP8 and "
                "INT8 362). The RTX 6000 Ada datasheet's 1,457 TFLOP/s is sparse FP8 with "
                "FP16 accumulation, the L40S's rate class; Lambda's measurements side with the "
                "L40 figures (BERT fine-tuning runs slower than on a GeForce RTX 4090, 165 "
                "TFLOP/s).",
          caveat=_POWER.format(w=300)),
    _spec("rtx-a6000", "NVIDIA RTX A6000", 84, 1800, 768,
          {"fp32": 38.7, "tf32": 77.4, "fp16": 154.8, "bf16": 154.8, "int8": 309.7},
          {"tf32": 154.8, "fp16": 309.7, "bf16": 309.7, "int8": 619.4}, l2_mb=6, mem_gb=48,
          source="https://www.nvidia.com/en-us/design-visualization/rtx-a6000/",
          notes="Workstation GA102: FP32 accumulation at the full rate (the datasheet's "
                "309.7 TFLOP/s is sparse FP16); TF32 at half the FP16 rate, as in the A40 "
                "datasheet (the same 84-SM GA102 at 1,740 MHz: 149.7 FP16, 74.8 TF32). 300 W.",
          caveat=_POWER.format(w=300)),
    _spec("a40", "NVIDIA A40", 84, 1740, 696,
          {"fp32": 37.4, "tf32": 74.8, "fp16": 149.7, "bf16": 149.7, "int8": 299.3},
          {"tf32": 149.6, "fp16": 299.4, "bf16": 299.4, "int8": 598.6}, l2_mb=6, mem_gb=48,
          source="https://images.nvidia.com/content/Solutions/data-center/a40/"
                 "nvidia-a40-datasheet.pdf",
          notes="Data-center GA102 (the RTX A6000's 84 SMs at 1,740 MHz, passively cooled, "
                "300 W): FP16/BF16 Tensor Core math with FP32 accumulation at the full rate, "
                "TF32 at half of it; 48 GB of GDDR6 at 696 GB/s.",
          caveat=_POWER.format(w=300)),
    _spec("a30", "NVIDIA A30", 56, 1440, 933,
          {"fp32": 10.3, "tf32": 82.0, "fp16": 165.0, "bf16": 165.0, "int8": 330.0},
          {"tf32": 165.0, "fp16": 330.0, "bf16": 330.0, "int8": 661.0}, l2_mb=24, mem_gb=24,
          source="https://www.nvidia.com/content/dam/en-zz/Solutions/data-center/products/"
                 "a30-gpu/pdf/a30-datasheet.pdf",
          notes="A GA100 with 56 SMs at 1,440 MHz and 24 GB of HBM2 at 933 GB/s (165 W): the "
                "A100's Tensor Cores per SM, about half its SMs and bandwidth.",
          caveat=_POWER.format(w=165)),
    _spec("quadro-rtx8000", "Quadro RTX 8000", 72, 1770, 672,
          {"fp32": 16.3, "fp16": 130.5, "int8": 261.0}, l2_mb=6, mem_gb=48,
          source="https://images.nvidia.com/aem-dam/en-zz/Solutions/design-visualization/"
                 "technologies/turing-architecture/NVIDIA-Turing-Architecture-Whitepaper.pdf",
          notes="Turing TU102 (the whitepaper's Quadro RTX 6000 column: the same GPU with "
                "24 GB): FP16 Tensor Cores with FP32 accumulation at the full rate, no TF32 "
                "or BF16, so FP32 training runs on the CUDA cores. 260 W.",
          caveat=_POWER.format(w=260)),
    _spec("a100-pcie-40gb", "NVIDIA A100-PCIE-40GB", 108, 1410, 1555,
          {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0, "int8": 624.0},
          {"tf32": 312.0, "fp16": 624.0, "bf16": 624.0, "int8": 1248.0}, l2_mb=40, mem_gb=40,
          source=_A100, efficiency=_A100_ATTENTION,
          notes="The SXM4 part's peaks and bandwidth at a 250 W board limit (SXM4: 400 W): "
                "under sustained Tensor Core load its clock can fall below the 1,410 MHz "
                "boost, which a datasheet preset does not know.",
          caveat=_POWER.format(w=250)),
    _spec("a100-pcie-80gb", "NVIDIA A100 80GB PCIe", 108, 1410, 1935,
          {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0, "int8": 624.0},
          {"tf32": 312.0, "fp16": 624.0, "bf16": 624.0, "int8": 1248.0}, l2_mb=40, mem_gb=80,
          source=_A100, efficiency=_A100_ATTENTION,
          notes="The SXM4 part's peaks at a 300 W board limit, 1,935 GB/s."),
    _spec("a100-40gb", "NVIDIA A100-SXM4-40GB", 108, 1410, 1555,
          {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0, "int8": 624.0},
          {"tf32": 312.0, "fp16": 624.0, "bf16": 624.0, "int8": 1248.0}, l2_mb=40, mem_gb=40,
          source=_A100, efficiency=_A100_ATTENTION),
    _spec("a100-80gb", "NVIDIA A100-SXM4-80GB", 108, 1410, 2039,
          {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0, "int8": 624.0},
          {"tf32": 312.0, "fp16": 624.0, "bf16": 624.0, "int8": 1248.0}, l2_mb=40, mem_gb=80,
          source=_A100, efficiency=_A100_ATTENTION),
    _spec("l4", "NVIDIA L4", 58, 2040, 300,
          {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0, "fp8": 242.5,
           "int8": 242.5},
          {"tf32": 120.0, "fp16": 242.0, "bf16": 242.0, "fp8": 485.0, "int8": 485.0},
          l2_mb=48, mem_gb=24,
          source="https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet",
          notes="72 W part: sustained clocks are often below boost.",
          caveat=_POWER.format(w=72)),
    _spec("l40", "NVIDIA L40", 142, 2490, 864,
          {"fp32": 90.5, "tf32": 90.5, "fp16": 181.05, "bf16": 181.05, "fp8": 362.0,
           "int8": 362.0},
          {"tf32": 181.0, "fp16": 362.1, "bf16": 362.1, "fp8": 724.0, "int8": 724.0},
          l2_mb=96, mem_gb=48, source=_L40,
          notes="The AD102 of the RTX 6000 Ada at 2,490 MHz (300 W): FP16/BF16 Tensor Core "
                "math with FP32 accumulation at half the L40S's rate (181.05 against 362.05 "
                "TFLOP/s dense), TF32 at half of that.",
          caveat=_POWER.format(w=300)),
    _spec("l40s", "NVIDIA L40S", 142, 2520, 864,
          {"fp32": 91.6, "tf32": 183.0, "fp16": 362.05, "bf16": 362.05, "fp8": 733.0,
           "int8": 733.0},
          {"tf32": 366.0, "fp16": 733.0, "bf16": 733.0, "fp8": 1466.0, "int8": 1466.0},
          l2_mb=96, mem_gb=48,
          source="https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413"),
    _spec("h100-sxm", "NVIDIA H100-SXM5-80GB", 132, 1980, 3350,
          _GH100, _GH100_SPARSE,
          l2_mb=50, mem_gb=80, efficiency=_HOPPER, source=_H100, caveat=_HOPPER_CAVEAT),
    _spec("h100-pcie", "NVIDIA H100-PCIe-80GB", 114, 1755, 2000,
          {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0, "fp8": 1513.0,
           "int8": 1513.0},
          {"tf32": 756.0, "fp16": 1513.0, "bf16": 1513.0, "fp8": 3026.0, "int8": 3026.0},
          l2_mb=50, mem_gb=80, efficiency=_HOPPER, source=_H100, caveat=_HOPPER_CAVEAT),
    _spec("h200", "NVIDIA H200-SXM-141GB", 132, 1980, 4800,
          _GH100, _GH100_SPARSE,
          l2_mb=50, mem_gb=141, efficiency=_H200, caveat=_H200_CAVEAT,
          source="https://www.nvidia.com/en-us/data-center/h200/",
          notes="Same GH100 compute as H100-SXM with HBM3e."),
    _spec("gh200", "NVIDIA GH200 (H100 96GB HBM3)", 132, 1980, 4000,
          _GH100, _GH100_SPARSE,
          l2_mb=50, mem_gb=96, efficiency=_HOPPER,
          source="https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/",
          notes="The Grace Hopper superchip's GPU: the H100-SXM's GH100 compute with 96 GB of "
                "HBM3 at 4 TB/s (a 144 GB HBM3e version has 4.9 TB/s); the module's 450-1000 W "
                "covers the Grace CPU and its memory too.",
          caveat="Its power budget (450-1000 W, set by the system builder) is shared with the "
                 "Grace CPU and its memory: under sustained Tensor Core load the GPU may not "
                 "hold the H100-SXM's clocks the preset assumes; for a number to bet on, run "
                 "`dlperf probe` on it and pass --device PROFILE.json. " + _HOPPER_CAVEAT),
    _spec("b200", "NVIDIA B200 (HGX, 1000 W)", 148, None, 8000,
          {"fp32": 75.0, "tf32": 1125.0, "fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0,
           "int8": 4500.0},
          {"tf32": 2250.0, "fp16": 4500.0, "bf16": 4500.0, "fp8": 9000.0, "int8": 9000.0},
          mem_gb=180,
          source="https://www.nvidia.com/en-us/data-center/hgx/",
          notes="Per-GPU figures are the HGX B200 8-GPU platform figures divided by 8; NVIDIA "
                "publishes no boost clock or L2 size in the datasheet."),
    # The GB200 NVL72 rack: 72 Blackwell GPUs at 1,200 W, two to a Grace CPU, one NVLink
    # domain (hardware/interconnect.py, nvlink5-nvl72); docs/design.md, published facts
    _spec("gb200", "NVIDIA GB200 (NVL72, 1200 W)", 148, None, 8000,
          {"fp32": 80.0, "tf32": 1250.0, "fp16": 2500.0, "bf16": 2500.0, "fp8": 5000.0,
           "int8": 5000.0},
          {"tf32": 2500.0, "fp16": 5000.0, "bf16": 5000.0, "fp8": 10000.0, "int8": 10000.0},
          mem_gb=186,
          source="https://www.nvidia.com/en-us/data-center/gb200-nvl72/",
          notes="Per-GPU figures are the GB200 NVL72 rack's divided by 72 (FP16/BF16 360 "
                "PFLOPS with sparsity, FP32 5,760 TFLOPS, 13.4 TB of HBM3e at 576 TB/s); the "
                "same GPU as the HGX B200's at 1,200 W instead of 1,000 W, so about 11% more "
                "Tensor Core peak. Its NVLink joins all 72 GPUs: a scale-out puts 72 in a "
                "node (--interconnect auto: nvlink5-nvl72)."),
    # Blackwell Ultra (sm_103): the B200's dense FP8/BF16/TF32 Tensor Core peaks (at 1,100
    # instead of 1,000 W), 288 GB of 12-high HBM3e, twice the special-function (exp)
    # throughput for attention's softmax (10.7 against 5 tera-exponentials/s) and almost no
    # INT8 or FP64 on the Tensor Cores; docs/design.md ("Blackwell Ultra"), published facts
    _spec("b300", "NVIDIA B300 (HGX, 1100 W)", 148, None, 8000,
          {"fp32": 75.0, "tf32": 1125.0, "fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0,
           "int8": 150.0},
          {"tf32": 2250.0, "fp16": 4500.0, "bf16": 4500.0, "fp8": 9000.0, "int8": 300.0},
          mem_gb=270,
          source="https://www.nvidia.com/en-us/data-center/hgx/",
          notes="Per-GPU figures are the HGX B300 8-GPU platform's divided by 8: the B200's "
                "dense FP8/BF16/TF32 peaks, 8 TB/s, 288 GB of HBM3e (about 270 usable); "
                "Blackwell Ultra trades INT8 Tensor Core math (0.15 POPS dense) and FP64 for "
                "NVFP4 and doubles the exponential units attention's softmax runs on; "
                "NVIDIA publishes no boost clock or L2 size (148 SMs, as the B200's)."),
    # The GB300 NVL72 rack: 72 Blackwell Ultra GPUs at 1,400 W, one NVLink domain, as the
    # GB200 NVL72 (hardware/interconnect.py, nvlink5-nvl72)
    _spec("gb300", "NVIDIA GB300 (NVL72, 1400 W)", 148, None, 8000,
          {"fp32": 80.0, "tf32": 1250.0, "fp16": 2500.0, "bf16": 2500.0, "fp8": 5000.0,
           "int8": 165.0},
          {"tf32": 2500.0, "fp16": 5000.0, "bf16": 5000.0, "fp8": 10000.0, "int8": 330.0},
          mem_gb=279,
          source="https://www.nvidia.com/en-us/data-center/gb300-nvl72/",
          notes="Per-GPU figures are the GB300 NVL72 rack's divided by 72 (FP16/BF16 360 "
                "PFLOPS and FP8 720 with sparsity, about 20 TB of HBM3e at 576 TB/s): the "
                "GB200's dense FP8/BF16 peaks at 1,400 W instead of 1,200 W, with the B300's "
                "288 GB, exponential units and reduced INT8. Its NVLink joins all 72 GPUs: a "
                "scale-out puts 72 in a node (--interconnect auto: nvlink5-nvl72).",
          caveat="Megatron-Bridge's published GB300 runs went about a fifth faster than the "
                 "GB200's on the same work, where the two datasheets give the same dense "
                 "FP8/BF16 peaks and bandwidth, so this preset predicts them alike: the figures "
                 "are in the record printed under --fp8 and --ep predictions; for a number to "
                 "bet on, run `dlperf probe` on the GPU and pass --device PROFILE.json."),
)}

ALIASES = {"v100": "v100-sxm2", "a100": "a100-80gb", "h100": "h100-sxm", "h200-sxm": "h200",
           "a100-sxm": "a100-80gb", "h100-sxm5": "h100-sxm", "a100-pcie": "a100-pcie-80gb",
           "a6000": "rtx-a6000", "rtx-8000": "quadro-rtx8000"}


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def load_spec_file(path: str | Path) -> DeviceSpec:
    """Read a user's DeviceSpec from JSON or TOML (the format `dlperf probe` writes)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DlperfError(f"{path}: cannot read device spec ({exc.strerror})") from None
    try:
        if path.suffix.lower() == ".toml":
            import tomllib

            data = tomllib.loads(raw.decode())
        else:
            data = json.loads(raw)
    except Exception as exc:  # json/toml/unicode errors all mean "not a valid spec file"
        raise DlperfError(f"{path}: not a valid device spec file ({exc})") from None
    if isinstance(data, dict) and "spec" in data and isinstance(data["spec"], dict):
        data = data["spec"]  # a probe result: {"spec": {...}, "measurements": [...]}
    if not isinstance(data, dict):
        raise DlperfError(f"{path}: a device spec must be a JSON/TOML object")
    return DeviceSpec.from_dict(data, origin=str(path))


def get_device(name_or_path: str) -> DeviceSpec:
    """A preset by name (case/underscore-insensitive, a few aliases) or a spec file path.

    ``cpu`` is not a preset: callers that accept it run a fresh probe (hardware.probe).
    """
    key = _normalise(name_or_path)
    key = ALIASES.get(key, key)
    if key in PRESETS:
        return PRESETS[key]
    if name_or_path.lower().endswith((".json", ".toml")) or Path(name_or_path).is_file():
        return load_spec_file(name_or_path)
    raise DlperfError(f"unknown device {name_or_path!r}"
                      f"{close_matches(key, list(PRESETS) + ['cpu'])}; "
                      "run `dlperf devices` for the list, or pass a spec file (.json/.toml)")


# (pattern on the CUDA device name, preset), most specific first: "A10" must not catch "A100".
_NAME_PATTERNS = (
    (r"\bh100\b.*\bpcie\b", "h100-pcie"), (r"\bh100\b", "h100-sxm"), (r"\bgh200\b", "gh200"), (r"\bh200\b", "h200"),
    (r"\bgb200\b", "gb200"), (r"\bb200\b", "b200"),
    (r"\bgb300\b", "gb300"), (r"\bb300\b", "b300"),
    (r"\ba100\b(?=.*\bpcie\b)(?=.*\b80\s*gb)", "a100-pcie-80gb"),
    (r"\ba100\b(?=.*\bpcie\b)", "a100-pcie-40gb"), (r"\ba100\b.*80\s*gb", "a100-80gb"),
    (r"\ba100\b", "a100-40gb"), (r"\brtx 3090\b", "rtx3090"), (r"\brtx 4090\b", "rtx4090"),
    (r"\brtx 6000 ada\b", "rtx6000-ada"), (r"\brtx a6000\b", "rtx-a6000"),
    (r"\bquadro rtx 8000\b", "quadro-rtx8000"), (r"\ba10\b", "a10"), (r"\ba40\b", "a40"),
    (r"\ba30\b", "a30"), (r"\bl40s\b", "l40s"), (r"\bl40\b", "l40"), (r"\bl4\b", "l4"),
    (r"\bt4\b", "t4"), (r"\bv100\b.*\bpcie\b", "v100-pcie"),
    (r"\bv100\b.*\b16\s*gb\b", "v100-sxm2-16gb"), (r"\bv100\b", "v100-sxm2"))


def match_preset(device_name: str) -> DeviceSpec | None:
    """The preset for a CUDA device name (torch.cuda.get_device_name), or None."""
    name = device_name.lower().replace("-", " ")
    for pattern, preset in _NAME_PATTERNS:
        if re.search(pattern, name):
            return PRESETS[preset]
    return None
