"""`dlperf probe --sweep`: fit the efficiency model to this machine from generic kernels (issue #11).

A probe measures peaks (the largest matmul, a copy); real layers reach less, and how much less
depends on the kind of kernel and its shape. The sweep times a fixed set of generic layers
(3x3, 1x1, strided and stem convolutions, linear layers of several shapes, BN+ReLU, residual
adds) through dlperf's own capture and cost rules (``analysis.measure``), so every kernel's
measured time lands on the same Cost the analyzer predicts, then fits the parameters of
``hardware.efficiency.Efficiency`` that these kernels exercise:

* the fraction of the probed peak the math reaches (``cuda_core`` on a CPU; the Tensor Core
  classes on a GPU),
* the small-problem ramp of GEMM-shaped kernels (``gemm_m0``, ``gemm_n0``, ``gemm_k0``: the
  M, N, K at which a GEMM runs at half its large-problem rate),
* the fraction of the probed copy bandwidth that memory-bound kernels reach (``memory``),
  and the share of that depthwise convolutions reach (``depthwise``),
* the fixed time per kernel (``launch_s``).

The sweep's layers are generic shapes, not the layers of any model dlperf is checked on; the
result goes into the probe's spec (``efficiency``), which ``dlperf analyze --device FILE``
and ``--measure`` use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn

from dlperf.analysis.api import AnalysisConfig
from dlperf.analysis.roofline import predict
from dlperf.hardware.efficiency import MEASURED, Efficiency
from dlperf.hardware.specs import DeviceSpec


class _BnRelu(nn.Sequential):
    def __init__(self, c: int):
        super().__init__(nn.BatchNorm2d(c), nn.ReLU(inplace=True))


class _Residual(nn.Module):
    """y = relu(x + x * scale): a broadcast mul, an add and a ReLU on one activation (with a
    per-channel scale, so the step has a backward)."""

    def __init__(self, c: int):
        super().__init__()
        self.scale = nn.Parameter(torch.full((c, 1, 1), 0.5))

    def forward(self, x):
        return torch.relu(x + x * self.scale)


@dataclass(frozen=True)
class Case:
    name: str
    build: object  # () -> nn.Module
    input_shape: tuple[int, ...]


def cases(quick: bool = False) -> list[Case]:
    """Generic layers over the shapes CNNs and MLPs use (batch 8, or 4 with ``quick``)."""
    n = 4 if quick else 8
    out = [
        Case("conv3x3 64@56", lambda: nn.Conv2d(64, 64, 3, padding=1, bias=False),
             (n, 64, 56, 56)),
        Case("conv3x3 128@28", lambda: nn.Conv2d(128, 128, 3, padding=1, bias=False),
             (n, 128, 28, 28)),
        Case("conv3x3 256@14", lambda: nn.Conv2d(256, 256, 3, padding=1, bias=False),
             (n, 256, 14, 14)),
        Case("conv3x3 512@7", lambda: nn.Conv2d(512, 512, 3, padding=1, bias=False),
             (n, 512, 7, 7)),
        Case("conv3x3 s2 64->128@56", lambda: nn.Conv2d(64, 128, 3, 2, 1, bias=False),
             (n, 64, 56, 56)),
        Case("conv1x1 64->256@56", lambda: nn.Conv2d(64, 256, 1, bias=False), (n, 64, 56, 56)),
        Case("conv1x1 256->64@56", lambda: nn.Conv2d(256, 64, 1, bias=False), (n, 256, 56, 56)),
        Case("conv1x1 s2 256->512@56", lambda: nn.Conv2d(256, 512, 1, 2, bias=False),
             (n, 256, 56, 56)),
        Case("conv1x1 1024->256@14", lambda: nn.Conv2d(1024, 256, 1, bias=False),
             (n, 1024, 14, 14)),
        Case("stem 7x7 s2 3->64@112", lambda: nn.Conv2d(3, 64, 7, 2, 3, bias=False),
             (n, 3, 112, 112)),
        Case("depthwise 3x3 96@56", lambda: nn.Conv2d(96, 96, 3, padding=1, groups=96,
                                                      bias=False), (n, 96, 56, 56)),
        Case("depthwise 5x5 240@14", lambda: nn.Conv2d(240, 240, 5, padding=2, groups=240,
                                                       bias=False), (n, 240, 14, 14)),
        Case("linear 512->1000", lambda: nn.Linear(512, 1000), (32 * n, 512)),
        Case("linear 1024->1024", lambda: nn.Linear(1024, 1024), (64 * n, 1024)),
        Case("linear 768->3072", lambda: nn.Linear(768, 3072), (16 * n, 768)),
        Case("bn+relu 64@56", lambda: _BnRelu(64), (n, 64, 56, 56)),
        Case("bn+relu 256@14", lambda: _BnRelu(256), (n, 256, 14, 14)),
        Case("residual 256@56", lambda: _Residual(256), (n, 256, 56, 56)),
        Case("residual 64@28", lambda: _Residual(64), (n, 64, 28, 28)),
    ]
    return out[::2] if quick else out


def identity(efficiency: Efficiency) -> Efficiency:
    """Every fitted fraction at 1, no ramp, 1 s per kernel: a prediction then holds raw terms."""
    return replace(efficiency, tensor_gemm=1.0, tensor_conv=1.0, grouped_conv=1.0,
                   cuda_core=1.0, memory=1.0, sm_bytes_per_clock=None, depthwise=1.0,
                   gemm_m0=0.0, gemm_n0=0.0, gemm_k0=0.0, launch_s=1.0, host_s=0.0)


def nelder_mead(f, x0, step: float = 0.8, iters: int = 3000, tol: float = 1e-10):
    """Plain Nelder-Mead (reflection 1, expansion 2, contraction 0.5, shrink 0.5)."""
    x0 = np.asarray(x0, dtype=float)
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < tol:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2 * (centroid - simplex[-1])
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                simplex = [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex]
                values = [f(x) for x in simplex]
    return simplex[int(np.argmin(values))]


# name -> (low, high); fractions and seconds searched on a log scale between the bounds
BOUNDS = {"math": (0.05, 1.5), "gemm_m0": (1.0, 4096.0), "gemm_n0": (1.0, 4096.0),
          "gemm_k0": (1.0, 4096.0), "memory": (0.05, 2.0), "depthwise": (0.01, 1.0),
          "launch_s": (1e-7, 1e-3)}


def _squash(z, lo, hi):
    return math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) / (1 + math.exp(-z)))


def fit_kernels(rows: list[dict]) -> dict:
    """Parameters minimising the squared log error of per-kernel time over ``rows``.

    Each row: raw math seconds (at the probed peak), raw memory seconds (at the probed
    bandwidth, real traffic), kernel count, GEMM dims (or None), whether it is a depthwise
    convolution and the measured seconds.
    "math" and "memory" may exceed 1: a probe's peak is the best of a few shapes, not a bound.
    """
    math_s = np.array([r["math_s"] for r in rows])
    mem_s = np.array([r["memory_s"] for r in rows])
    kernels = np.array([r["kernels"] for r in rows], dtype=float)
    # kernels that are no GEMM get dims so large that their ramp is 1
    dims = np.array([r["gemm"] or (1e30, 1e30, 1e30) for r in rows], dtype=float)
    dw = np.array([r.get("depthwise", False) for r in rows])
    measured = np.array([r["measured_s"] for r in rows])
    names = tuple(BOUNDS)

    def params(z):
        return {k: _squash(v, *BOUNDS[k]) for k, v in zip(names, z)}

    def times(p):
        ramp = (dims[:, 0] / (dims[:, 0] + p["gemm_m0"]) * dims[:, 1] / (dims[:, 1] + p["gemm_n0"])
                * dims[:, 2] / (dims[:, 2] + p["gemm_k0"]))
        bandwidth = p["memory"] * np.where(dw, p["depthwise"], 1.0)
        return (np.maximum(math_s / (p["math"] * ramp), mem_s / bandwidth)
                + kernels * p["launch_s"])

    def loss(z):
        return float(np.mean(np.log(times(params(z)) / measured) ** 2))

    z = np.zeros(len(names))
    best = loss(z)
    for _ in range(6):
        z_new = nelder_mead(loss, z)
        if loss(z_new) > best - 1e-9:
            break
        z, best = z_new, loss(z_new)
    fitted = params(z)
    errors = np.abs(times(fitted) / measured - 1)
    return {**fitted, "median_abs_error": float(np.median(errors)),
            "max_abs_error": float(np.max(errors)), "kernels": len(rows)}


def sweep(spec: DeviceSpec, device: str = "cpu", quick: bool = False, progress=None
          ) -> tuple[dict, list[dict], dict]:
    """Time the generic layers on ``device`` and fit the efficiency parameters for ``spec``
    (a probe's measured spec). Returns (efficiency overrides, per-kernel rows, the fit with
    its errors). On a GPU the layers run under bf16 autocast (Tensor Cores); untested here."""
    from dlperf.analysis.measure import MeasureConfig, measure

    base = identity(MEASURED)
    rows = []
    for case in cases(quick):
        cfg = AnalysisConfig(model=case.name, input_shape=case.input_shape,
                             dtype="bf16" if spec.tensor_cores else "fp32",
                             train=True, device=spec.name, optimizer="none")
        torch.manual_seed(0)
        m = measure(case.build(), cfg, spec, device,
                    cfg=MeasureConfig(steps=2 if quick else 3, warmup=1))
        for p, measured_s in zip(m.analysis.predictions, m.measured_s):
            if measured_s <= 0 or p.cost.kind in ("fill",) or not (p.cost.flops or p.cost.bytes):
                continue
            raw = predict(p.cost, spec, efficiency=base)
            g = p.cost.gemm
            rows.append({"case": case.name, "op": p.cost.op, "phase": p.cost.phase,
                         "math_s": raw.math_time_s, "memory_s": raw.memory_time_s,
                         "kernels": raw.kernels, "measured_s": measured_s,
                         "depthwise": raw.memory_class == "depthwise",
                         "gemm": (g.m, g.n, g.k) if g is not None and raw.math_class
                         not in ("none",) and raw.memory_class != "depthwise" else None})
        if progress:
            progress()
    fitted = fit_kernels(rows)
    math_class = "cuda_core" if not spec.tensor_cores else "tensor_conv"
    overrides = {math_class: fitted["math"], "memory": fitted["memory"],
                 "depthwise": fitted["depthwise"],
                 "launch_s": fitted["launch_s"], "gemm_m0": fitted["gemm_m0"],
                 "gemm_n0": fitted["gemm_n0"], "gemm_k0": fitted["gemm_k0"]}
    if spec.tensor_cores:  # one sweep fraction for every Tensor Core class
        overrides.update(tensor_gemm=fitted["math"], grouped_conv=fitted["math"])
    return overrides, rows, fitted
