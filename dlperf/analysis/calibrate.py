"""`dlperf probe --sweep`: fit the efficiency model to this machine from generic kernels (issue #11).

A probe measures peaks (the largest matmul, a copy); real layers reach less, and how much less
depends on the kind of kernel and its shape. The sweep times a fixed set of generic layers
(3x3, 1x1, strided and stem convolutions, linear layers of several shapes, depthwise
convolutions, BN+ReLU, residual adds, pooling, LayerNorm, softmax, GELU, SiLU and fused
attention) through dlperf's own capture and cost rules (``analysis.measure``), so every kernel's
measured time lands on the same Cost the analyzer predicts, then fits the parameters of
``hardware.efficiency.Efficiency`` that these kernels exercise:

* the fraction of the probed peak the math reaches (``cuda_core`` on a CPU; the Tensor Core
  classes on a GPU),
* the small-problem ramp of GEMM-shaped kernels (``gemm_m0``, ``gemm_n0``, ``gemm_k0``: the
  M, N, K at which a GEMM runs at half its large-problem rate),
* the fraction of the probed peak the convolutions reach, when it differs from the GEMMs'
  (``cuda_core_conv`` on a CPU, ``tensor_conv`` on a GPU), and fused attention's
  (``cuda_core_attention`` on a CPU, ``attention`` on a GPU),
* the fraction of the probed copy bandwidth that streaming memory-bound kernels reach
  (``memory``), and the share of that each memory class reaches (``depthwise``,
  ``reduction``, ``norm``, ``reduction_backward``, ``channel_norm``,
  ``channel_norm_backward``, ``transcendental``, ``gelu_tanh``, ``window``,
  ``window_backward``; see
  ``hardware/efficiency.py``),
* the fixed time per kernel (``launch_s``), and the fixed time more per convolution kernel
  (``conv_launch_s``: on a CPU, oneDNN's thread team woken for every call).

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
from dlperf.analysis.roofline import CONV_CLASSES, predict, wide_depthwise_wgrad
from dlperf.hardware.efficiency import CLASS_FALLBACK, MEASURED, MEMORY_CLASSES, Efficiency
from dlperf.hardware.specs import DeviceSpec


class _BnRelu(nn.Sequential):
    """BN + ReLU. In the sweep behind a per-channel scale (``_bn_relu``): with the layer's input a
    leaf that needs no gradient, the batch-norm backward computed only its weight and bias
    gradients (a read of dy and x, no dx written), where every batch norm in a network but a
    first one writes dx too, and the fitted rate then predicted the CNNs' batch-norm backwards
    at 0.52-0.71x of their measured time (benchmarks/README.md, seventh to ninth CPU runs)."""

    def __init__(self, c: int):
        super().__init__(nn.BatchNorm2d(c), nn.ReLU(inplace=True))


class _Scaled(nn.Module):
    """y = op(x * scale): a per-channel (or per-feature) scale in front of a parameter-free op,
    so the step has a backward through it. ``op`` None: y = relu(x + x * scale), a broadcast
    mul, an add and a ReLU on one activation (a residual block's elementwise tail)."""

    def __init__(self, shape: tuple[int, ...], op: nn.Module | None = None):
        super().__init__()
        self.scale = nn.Parameter(torch.full(shape, 0.5))
        self.op = op

    def forward(self, x):
        if self.op is None:
            return torch.relu(x + x * self.scale)
        return self.op(x * self.scale)


class _Attention(nn.Module):
    """Fused scaled-dot-product attention on x * scale as q, k and v: [batch, heads, T, head
    dim] in, the same out; ``causal`` as a decoder's. The scale gives the step a backward."""

    def __init__(self, heads: int, causal: bool):
        super().__init__()
        self.scale = nn.Parameter(torch.full((heads, 1, 1), 0.5))
        self.causal = causal

    def forward(self, x):
        q = x * self.scale
        return nn.functional.scaled_dot_product_attention(q, q, q, is_causal=self.causal)


@dataclass(frozen=True)
class Case:
    name: str
    build: object  # () -> nn.Module
    input_shape: tuple[int, ...]
    quick: bool = False  # also in the quick sweep (one case or more of every class)
    half: bool = False  # also in the half-precision pass on a CPU (see ``sweep``)


def _conv(cin, cout, k, stride=1, groups=1, first=False):
    """A convolution as a network has it: behind a per-channel scale, so the backward computes
    its data gradient (dgrad) as well as its weight gradient, as every convolution's but the
    first layer's does (``first``: the input needs no gradient, wgrad only)."""
    def build():
        conv = nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False)
        return conv if first else _Scaled((cin, 1, 1), conv)
    return build


def _linear(fin, fout):
    """A linear layer behind a per-feature scale, so its backward has the data gradient (dgrad)
    as well as the weight gradient, as every linear layer's in a network but a first one."""
    return lambda: _Scaled((fin,), nn.Linear(fin, fout))


def _scaled(shape, op=None):
    return lambda: _Scaled(shape, op() if op else None)


def _bn_relu(c):
    """BN + ReLU behind a per-channel scale, so its backward writes the data gradient."""
    return _scaled((c, 1, 1), lambda: _BnRelu(c))


def cases(quick: bool = False) -> list[Case]:
    """Generic layers over the shapes CNNs, MLPs and transformers use (batch 8, or 4 with
    ``quick``), at least one for every class of the efficiency model: convolutions and GEMMs
    (the math and its small-problem ramp), depthwise convolutions, streaming elementwise
    kernels, reductions and their backward (norms, softmax, global pooling), transcendental
    activations, window pooling and fused attention."""
    n = 4 if quick else 8
    out = [
        Case("conv3x3 64@56", _conv(64, 64, 3), (n, 64, 56, 56), quick=True, half=True),
        Case("conv3x3 128@28", _conv(128, 128, 3), (n, 128, 28, 28)),
        Case("conv3x3 256@14", _conv(256, 256, 3), (n, 256, 14, 14), quick=True, half=True),
        Case("conv3x3 512@7", _conv(512, 512, 3), (n, 512, 7, 7), half=True),
        Case("conv3x3 s2 64->128@56", _conv(64, 128, 3, 2), (n, 64, 56, 56), quick=True,
             half=True),
        Case("conv1x1 64->256@56", _conv(64, 256, 1), (n, 64, 56, 56)),
        Case("conv1x1 256->64@56", _conv(256, 64, 1), (n, 256, 56, 56), quick=True, half=True),
        Case("conv1x1 s2 256->512@56", _conv(256, 512, 1, 2), (n, 256, 56, 56)),
        Case("conv1x1 1024->256@14", _conv(1024, 256, 1), (n, 1024, 14, 14), quick=True,
             half=True),
        Case("stem 7x7 s2 3->64@112", _conv(3, 64, 7, 2, first=True), (n, 3, 112, 112),
             half=True),
        # few channels (mobile networks' expand/project layers) and tiny tensors, where the
        # fixed cost per kernel shows
        Case("conv1x1 16->64@56", _conv(16, 64, 1), (n, 16, 56, 56), quick=True),
        Case("conv1x1 40->120@28", _conv(40, 120, 1), (n, 40, 28, 28)),
        Case("conv1x1 240->64@1", _conv(240, 64, 1), (n, 240, 1, 1), quick=True),
        # squeeze-excite convolutions (1 pixel) and late-stage layers at 4-7 pixels: the fixed
        # cost per convolution call (conv_launch_s) against the small-problem ramp
        Case("conv1x1 512->128@1", _conv(512, 128, 1), (n, 512, 1, 1)),
        Case("conv1x1 128->512@1", _conv(128, 512, 1), (n, 128, 1, 1)),
        Case("conv1x1 96->576@7", _conv(96, 576, 1), (n, 96, 7, 7)),
        Case("conv1x1 576->96@7", _conv(576, 96, 1), (n, 576, 7, 7), quick=True),
        Case("conv3x3 256@4", _conv(256, 256, 3), (n, 256, 4, 4), half=True),
        Case("depthwise 3x3 96@56", _conv(96, 96, 3, groups=96), (n, 96, 56, 56), quick=True),
        Case("depthwise 5x5 240@14", _conv(240, 240, 5, groups=240), (n, 240, 14, 14)),
        # strided and late-stage depthwise layers: their backward's rate varies 2-17 GFLOP/s
        # with shape on a CPU, so the fitted depthwise_backward needs more than two points
        Case("depthwise 3x3 s2 144@28", _conv(144, 144, 3, 2, groups=144), (n, 144, 28, 28)),
        Case("depthwise 3x3 512@7", _conv(512, 512, 3, groups=512), (n, 512, 7, 7)),
        Case("depthwise 5x5 480@7", _conv(480, 480, 5, groups=480), (n, 480, 7, 7)),
        # wider windows (EfficientNet's strided 5x5, ConvNeXt's 7x7): on a CPU their weight
        # gradient runs other code than the 3x3 one's (depthwise_wgrad_wide)
        Case("depthwise 5x5 s2 96@28", _conv(96, 96, 5, 2, groups=96), (n, 96, 28, 28)),
        Case("depthwise 7x7 192@14", _conv(192, 192, 7, groups=192), (n, 192, 14, 14)),
        Case("linear 512->1000", _linear(512, 1000), (32 * n, 512), quick=True),
        Case("linear 1024->1024", _linear(1024, 1024), (64 * n, 1024), half=True),
        Case("linear 768->3072", _linear(768, 3072), (16 * n, 768), quick=True,
             half=True),
        # transformer MLP shapes at a few hundred tokens, and a classifier at batch n: the
        # GEMMs' own ramp (the convolutions have theirs)
        Case("linear 384->1536", _linear(384, 1536), (64 * n, 384)),
        Case("linear 1536->384", _linear(1536, 384), (64 * n, 1536)),
        Case("linear 1536->1000", _linear(1536, 1000), (n, 1536), quick=True),
        Case("bn+relu 64@56", _bn_relu(64), (n, 64, 56, 56), quick=True),
        Case("bn+relu 256@14", _bn_relu(256), (n, 256, 14, 14)),
        Case("residual 256@56", _scaled((256, 1, 1)), (n, 256, 56, 56), quick=True),
        Case("residual 64@28", _scaled((64, 1, 1)), (n, 64, 28, 28)),
        Case("residual 96@7", _scaled((96, 1, 1)), (n, 96, 7, 7), quick=True),
        Case("bn+relu 512@7", _bn_relu(512), (n, 512, 7, 7)),
        Case("maxpool 3x3 s2 128@56", _scaled((128, 1, 1), lambda: nn.MaxPool2d(3, 2, 1)),
             (n, 128, 56, 56), quick=True),
        Case("avgpool 2x2 s2 256@28", _scaled((256, 1, 1), lambda: nn.AvgPool2d(2)),
             (n, 256, 28, 28)),
        Case("global pool 1024@14", _scaled((1024, 1, 1), lambda: nn.AdaptiveAvgPool2d(1)),
             (n, 1024, 14, 14)),
        Case("layernorm 1024", _scaled((1024,), lambda: nn.LayerNorm(1024)), (64 * n, 1024),
             quick=True),
        Case("softmax 8x128x128", _scaled((8, 1, 1), lambda: nn.Softmax(-1)),
             (n, 8, 128, 128), quick=True),
        Case("gelu 2048", _scaled((2048,), nn.GELU), (64 * n, 2048), quick=True),
        # the tanh-approximated GELU (GPT-2's, BERT's): the same aten op, other code on a CPU
        Case("gelu tanh 2048", _scaled((2048,), lambda: nn.GELU(approximate="tanh")),
             (64 * n, 2048)),
        # fused attention (flash-attention kernels): a decoder's causal self-attention and an
        # encoder's full one
        Case("attention causal 8x256x64", lambda: _Attention(8, True), (n // 2, 8, 256, 64),
             quick=True),
        Case("attention 12x197x64", lambda: _Attention(12, False), (n // 2, 12, 197, 64)),
        Case("silu 192@28", _scaled((192, 1, 1), nn.SiLU), (n, 192, 28, 28)),
    ]
    return [c for c in out if c.quick] if quick else out


def identity(efficiency: Efficiency) -> Efficiency:
    """Every fitted fraction at 1, no ramp, 1 s per kernel: a prediction then holds raw terms."""
    return replace(efficiency, tensor_gemm=1.0, tensor_conv=1.0, grouped_conv=1.0,
                   cuda_core=1.0, cuda_core_conv=None, memory=1.0, sm_bytes_per_clock=None,
                   winograd=1.0, conv_backward=1.0, depthwise_backward=1.0,
                   depthwise_wgrad_wide=None,
                   depthwise=1.0, reduction=1.0,
                   norm=1.0, reduction_backward=1.0, transcendental=1.0, window=1.0,
                   gemm_m0=0.0, gemm_n0=0.0, gemm_k0=0.0, conv_m0=None, conv_n0=None,
                   conv_k0=None, launch_s=1.0, conv_launch_s=0.0,
                   host_s=0.0)


# the sweep's raw terms (kernel_row): one identity model for every timed kernel
_RAW = identity(MEASURED)


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


# name -> (low, high); fractions and seconds searched on a log scale between the bounds.
# "math" is the GEMMs' fraction of the probed peak, "conv" the convolutions' (forward),
# "conv_backward" the backward convolutions' share of that, "attention" fused attention's;
# the memory classes are fractions of the streaming bandwidth ("memory").
BOUNDS = {"math": (0.05, 3.0), "conv": (0.05, 3.0), "conv_backward": (0.1, 3.0),
          "depthwise_backward": (0.005, 3.0), "depthwise_wgrad_wide": (0.002, 3.0),
          "attention": (0.01, 3.0),
          "gemm_m0": (1.0, 4096.0),
          "gemm_n0": (1.0, 4096.0), "gemm_k0": (1.0, 4096.0),
          "conv_m0": (1.0, 4096.0), "conv_n0": (1.0, 4096.0), "conv_k0": (1.0, 4096.0),
          "memory": (0.05, 2.0),
          "depthwise": (0.01, 1.0), "reduction": (0.01, 2.0), "norm": (0.01, 2.0),
          "reduction_backward": (0.01, 2.0), "channel_norm": (0.01, 2.0),
          "channel_norm_backward": (0.01, 2.0), "window_backward": (0.01, 2.0),
          "gelu_tanh": (0.01, 2.0),
          "transcendental": (0.01, 2.0), "window": (0.01, 2.0), "launch_s": (1e-7, 1e-3),
          "conv_launch_s": (1e-7, 1e-3)}
# the convolutions' own small-problem ramp (efficiency.Efficiency.ramp)
CONV_RAMP = ("conv_m0", "conv_n0", "conv_k0")
# the memory classes of efficiency.MEMORY_CLASSES with a parameter of their own: every one but
# streaming, named as the Efficiency field
CLASS_PARAMS = tuple(c.replace("-", "_") for c in MEMORY_CLASSES if c != "stream")


def squash(z: float, lo: float, hi: float) -> float:
    """An unbounded search coordinate -> a value in [lo, hi], log-uniformly (a sigmoid in log
    space); stable for any z (a simplex can wander to |z| > 700, where exp overflows)."""
    sigmoid = 1 / (1 + math.exp(-z)) if z >= 0 else math.exp(z) / (1 + math.exp(z))
    # clamped: exp(log(3.0)) is 3.0000000000000004, which a device file's check (fractions up
    # to 3) then refused when a fit ran to its bound
    return min(hi, max(lo, math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * sigmoid)))


class KernelTerms:
    """The sweep's rows (``sweep``) as arrays, and their predicted seconds under a parameter
    set: what ``fit_kernels`` evaluates thousands of times, the arithmetic of
    ``roofline.predict`` in vectorised form (tests/test_efficiency.py ties the two together)."""

    def __init__(self, rows: list[dict]):
        self.math_s = np.array([r["math_s"] for r in rows])
        self.mem_s = np.array([r["memory_s"] for r in rows])
        self.kernels = np.array([r["kernels"] for r in rows], dtype=float)
        # kernels that are no GEMM get dims so large that their ramp is 1
        self.dims = np.array([r["gemm"] or (1e30, 1e30, 1e30) for r in rows], dtype=float)
        self.has_gemm = np.array([r["gemm"] is not None for r in rows])
        self.cls = np.array([r.get("memory_class")
                             or ("depthwise" if r.get("depthwise") else "stream") for r in rows])
        self.conv = np.array([bool(r.get("conv")) for r in rows])
        # every convolution kernel, depthwise ones included: the per-call cost (conv_launch_s)
        self.conv_kernel = np.array([r.get("op", "").startswith("convolution") for r in rows])
        not_forward = np.array([r.get("phase", "forward") != "forward" for r in rows])
        self.backward = self.conv & not_forward
        # depthwise backward: math-bound at its own share of the math rate (efficiency.py), the
        # weight gradient of windows wider than 3x3 at another (a CPU's oneDNN runs other code)
        self.dw_backward = (self.cls == "depthwise") & not_forward
        self.dw_wide = self.dw_backward & np.array([bool(r.get("depthwise_wide")) for r in rows])
        self.attention = np.array([bool(r.get("attention")) for r in rows])
        self.measured = np.array([r["measured_s"] for r in rows])

    def times(self, p: dict) -> np.ndarray:
        """Seconds per row under ``p`` (every name of ``BOUNDS``; None: the one it falls back
        to, as in ``overrides_from_fit``)."""
        conv, dims = self.conv, self.dims
        half = [np.where(conv, p[c] if p[c] is not None else p[g], p[g])
                for c, g in zip(CONV_RAMP, ("gemm_m0", "gemm_n0", "gemm_k0"))]
        ramp = (dims[:, 0] / (dims[:, 0] + half[0]) * dims[:, 1] / (dims[:, 1] + half[1])
                * dims[:, 2] / (dims[:, 2] + half[2]))
        fraction = np.ones(len(self.math_s))
        for c in CLASS_PARAMS:
            own = c.replace("_", "-")
            value = p[c] if p[c] is not None else p[CLASS_FALLBACK[own].replace("-", "_")]
            fraction[self.cls == own] = value
        math_eff = np.where(conv, (p["conv"] or p["math"])
                            * np.where(self.backward, p["conv_backward"], 1.0),
                            np.where(self.attention, p["attention"] or p["math"], p["math"])
                            * np.where(self.dw_wide, p["depthwise_wgrad_wide"]
                                       or p["depthwise_backward"],
                                       np.where(self.dw_backward, p["depthwise_backward"], 1.0)))
        launch = p["launch_s"] + np.where(self.conv_kernel, p["conv_launch_s"], 0.0)
        return (np.maximum(self.math_s / (math_eff * ramp), self.mem_s / (p["memory"] * fraction))
                + self.kernels * launch)


def fit_kernels(rows: list[dict], only: tuple[str, ...] | None = None,
                fixed: dict | None = None) -> dict:
    """Parameters minimising the squared log error of per-kernel time over ``rows``.

    Each row: raw math seconds (at the probed peak), raw memory seconds (at the probed
    bandwidth, real traffic), kernel count, GEMM dims (or None), its memory class (or the
    older ``depthwise`` flag), whether it is a convolution, and the measured seconds.
    "math", "conv" and "memory" may exceed 1: a quick probe's peak is the best of a few shapes
    timed briefly, not a bound (on a 2-core CPU one probe's fp32 peak came out at 128 GFLOP/s
    and the next at 165), and small tensors stay in cache.
    A parameter no row exercises (a class absent from the sweep) is not fitted: it stays at
    the identity model's value (1.0; "conv" as "math").
    ``only``: fit just these parameters, the others taken from ``fixed`` (an earlier fit):
    the half-precision pass refits the math on its own kernels and keeps the memory model.
    """
    t = KernelTerms(rows)
    # Rows measured as one kernel (a convolution_backward's dgrad and wgrad: one aten call,
    # its time shared between them in proportion to an unfitted prediction) are fitted as
    # their sum against its time: a split made before the fit says nothing about which half
    # is slow (a 5x5 depthwise convolution's weight gradient on a CPU, efficiency.py).
    keys = [r.get("group", i) for i, r in enumerate(rows)]
    group = np.unique(np.array([str(k) for k in keys]), return_inverse=True)[1]
    measured_group = np.bincount(group, weights=t.measured)
    names = tuple(n for n in BOUNDS
                  if (n not in CLASS_PARAMS or np.any(t.cls == n.replace("_", "-")))
                  and (n != "conv" or (np.any(t.conv) and np.any(~t.conv & (t.math_s > 0))))
                  and (n != "conv_backward"
                       or (np.any(t.backward) and np.any(t.conv & ~t.backward)))
                  and (n != "depthwise_backward" or np.any(t.dw_backward & (t.math_s > 0)))
                  and (n != "depthwise_wgrad_wide" or np.any(t.dw_wide & (t.math_s > 0)))
                  and (n != "attention" or np.any(t.attention & (t.math_s > 0)))
                  and (n != "conv_launch_s" or np.any(t.conv_kernel))
                  # the convolutions' own ramp: only beside GEMMs that keep theirs
                  and (n not in CONV_RAMP or (np.any(t.conv & t.has_gemm)
                                              and np.any(~t.conv & t.has_gemm & ~t.attention)))
                  and (only is None or n in only))
    # what a parameter that is not fitted stays at: the identity model (no ramp, no fixed cost)
    start = {"math": 1.0, "memory": 1.0, "gemm_m0": 0.0, "gemm_n0": 0.0, "gemm_k0": 0.0,
             "launch_s": 0.0, "conv": None, "attention": None, "conv_backward": 1.0,
             "depthwise_backward": 1.0, "depthwise_wgrad_wide": None, "conv_launch_s": 0.0,
             **{c: None for c in CONV_RAMP},
             **{c: 1.0 for c in CLASS_PARAMS},
             **{c.replace("-", "_"): None for c in CLASS_FALLBACK}, **(fixed or {})}

    def params(z):
        p = dict(start)
        p.update({k: squash(v, *BOUNDS[k]) for k, v in zip(names, z)})
        return p

    def group_times(p):
        return np.bincount(group, weights=t.times(p))

    def loss(z):
        return float(np.mean(np.log(group_times(params(z)) / measured_group) ** 2))

    z = np.zeros(len(names))
    best = loss(z)
    # Restarts from the best point; once one stalls, from random kicks around it (up to four in
    # a row): with 20 and more parameters a simplex can settle where one class's kernels are
    # explained by another class's parameter (depthwise backward by the depthwise memory
    # share, say), and a restart from the same point settles there again.
    rng = np.random.default_rng(0)  # deterministic: the same rows give the same fit
    kicks = 0
    for _ in range(16):
        start_z = z if kicks == 0 else z + rng.normal(0.0, 1.5, len(z))
        z_new = nelder_mead(loss, start_z)
        if loss(z_new) > best - 1e-9:
            kicks += 1
            if kicks > 4:
                break
            continue
        z, best, kicks = z_new, loss(z_new), 0
    fitted = {k: v for k, v in params(z).items() if k in BOUNDS}
    if fitted["conv"] is None:
        fitted["conv"] = fitted["math"]
    if fitted["attention"] is None:
        fitted["attention"] = fitted["math"]
    errors = np.abs(group_times(fitted) / measured_group - 1)
    return {**fitted, "loss": best, "median_abs_error": float(np.median(errors)),
            "max_abs_error": float(np.max(errors)), "kernels": len(rows),
            "measured_kernels": len(measured_group),
            "fitted": list(names)}


# What the half-precision pass refits: the math fractions and the convolutions' ramp (its memory
# kernels are few and the same code as FP32's), see ``sweep``. The ramp, because oneDNN's bf16
# convolutions are other kernels than its FP32 ones (other channel blocking): FP32's ramp, fitted
# mostly to small FP32 convolutions, need not hold for them. The pass's late-stage layers (4-7
# pixels) are there for it; still, the bf16 ResNet-18's layer4 backward convolutions on 4x4
# pixels were predicted at 0.37-0.73x of their measured time in the last round of
# benchmarks/results/predict-vs-measure-cpu.json (the seventh run).
HALF_PARAMS = ("math", "conv", "conv_backward", "conv_m0", "conv_n0", "conv_k0")


def half_pass(spec: DeviceSpec) -> bool:
    """Whether the sweep adds a bf16 pass: on a device without Tensor Cores (a CPU) whose probe
    found bf16 math. There bf16 runs other code than FP32 (on a CPU without bf16 units, oneDNN
    emulates it at a tenth of the FP32 rate, backward convolutions at about half the forward's:
    benchmarks/README.md), so FP32's fractions do not carry over. On a GPU the sweep itself
    runs in bf16."""
    return not spec.tensor_cores and bool(spec.peak.get("bf16"))


def sweep_cases(spec: DeviceSpec, quick: bool = False) -> list[tuple[Case, str]]:
    """(case, dtype) in the order ``sweep`` times them; its length is the progress total."""
    main = "bf16" if spec.tensor_cores else "fp32"
    out = [(c, main) for c in cases(quick)]
    if half_pass(spec):
        out += [(c, "bf16") for c in cases(quick) if c.half]
    return out


def measure_case(case: Case, dtype: str, spec: DeviceSpec, device: str = "cpu",
                 quick: bool = False):
    """One sweep layer's training step, measured kernel by kernel as the sweep times it (bf16 on
    a device without Tensor Cores: the half pass, in channels_last)."""
    from dlperf.analysis.measure import MeasureConfig, measure

    half_pass_case = dtype == "bf16" and not spec.tensor_cores
    cfg = AnalysisConfig(model=case.name, input_shape=case.input_shape, dtype=dtype,
                         train=True, device=spec.name, optimizer="none",
                         channels_last=half_pass_case and len(case.input_shape) == 4)
    torch.manual_seed(0)
    return measure(case.build(), cfg, spec, device,
                   cfg=MeasureConfig(steps=2 if quick else 3, warmup=1))


def timed_kernels(m) -> list:
    """(prediction, measured seconds) of a measurement's kernels that the sweep fits: timed,
    not a fill, and with FLOPs or traffic to cost."""
    return [(p, t) for p, t in zip(m.analysis.predictions, m.measured_s)
            if t > 0 and p.cost.kind != "fill" and (p.cost.flops or p.cost.bytes)]


def kernel_row(cost, spec: DeviceSpec, measured_s: float, case: str, pass_: str,
               dtype: str) -> dict:
    """One timed kernel of the sweep as ``fit_kernels`` reads it: its raw terms on ``spec``
    (the identity model: every fraction 1, no ramp, no fixed cost) and its measured time."""
    raw = predict(cost, spec, efficiency=_RAW)
    g = cost.gemm
    # the measured kernels (aten records) this row's time came from: a convolution_backward
    # is one record costed as dgrad + wgrad, and the fit compares their sum with it
    return {"case": case, "pass": pass_, "group": f"{case}|{dtype}|{cost.records}",
            "op": cost.op, "phase": cost.phase, "dtype": cost.dtype,
            "math_s": raw.math_time_s, "memory_s": raw.memory_time_s,
            "kernels": raw.kernels, "measured_s": measured_s,
            "memory_class": raw.memory_class, "depthwise_wide": wide_depthwise_wgrad(cost),
            "conv": raw.math_class in CONV_CLASSES,
            "attention": raw.math_class in ("attention", "cuda-core-attention"),
            "gemm": (g.m, g.n, g.k) if g is not None and raw.math_class not in ("none",)
            and raw.memory_class != "depthwise" else None}


def sweep(spec: DeviceSpec, device: str = "cpu", quick: bool = False, progress=None
          ) -> tuple[dict, list[dict], dict]:
    """Time the generic layers on ``device`` and fit the efficiency parameters for ``spec``
    (a probe's measured spec). Returns (efficiency overrides, per-kernel rows, the fit with
    its errors). On a GPU the layers run under bf16 autocast (Tensor Cores); untested here.
    On a CPU with bf16 math (``half_pass``) the GEMM and convolution layers run again under
    bf16 autocast in channels_last (on a 2-core EPYC that emulates bf16, its forward
    convolutions ran 3.5-5.8x faster than NCHW ones and its backward ones 3-3.7x slower:
    benchmarks/results/conv-layout-cpu.json), and their math fractions go into
    ``by_dtype["bf16"]``; the fit returned holds that pass's as ``fitted["bf16"]``."""
    rows = []
    for case, dtype in sweep_cases(spec, quick):
        half_pass_case = dtype == "bf16" and not spec.tensor_cores
        m = measure_case(case, dtype, spec, device, quick)
        for p, measured_s in timed_kernels(m):
            rows.append(kernel_row(p.cost, spec, measured_s, case.name,
                                   dtype if half_pass_case else "main", dtype))
        if progress:
            progress()
    overrides, fitted = fit_sweep(rows, spec)
    return overrides, rows, fitted


def fit_sweep(rows: list[dict], spec: DeviceSpec, drop: tuple[str, ...] = ()
              ) -> tuple[dict, dict]:
    """The sweep's fit of its timed ``rows`` (``sweep``): (efficiency overrides, the fit).
    ``drop``: parameters left out of the model (kept at the identity model's value), to
    measure what each one buys on the same timings (benchmarks/bench_predict_vs_measure.py)."""
    kept = tuple(n for n in BOUNDS if n not in drop)
    fitted = fit_kernels([r for r in rows if r["pass"] == "main"], only=kept)
    overrides = overrides_from_fit(fitted, spec.tensor_cores)
    # the half pass's own math kernels: bf16 GEMMs and convolutions (its casts and scales are
    # FP32-class memory kernels, predicted by the main fit)
    half = [r for r in rows if r["pass"] == "bf16" and r["dtype"] == "bf16"
            and (r["conv"] or r["gemm"] is not None)]
    if half:
        fitted["bf16"] = fit_kernels(half, only=tuple(n for n in HALF_PARAMS if n in kept),
                                     fixed=fitted)
        # fused attention is not timed in bf16 (the pass stays within the sweep's time): it
        # keeps FP32's share of the GEMMs' rate
        h = fitted["bf16"]
        overrides["by_dtype"] = {"bf16": {
            "cuda_core": h["math"], "cuda_core_conv": h["conv"],
            # (within the fit's bound, as every fitted share: a device file refuses more)
            "cuda_core_attention": min(BOUNDS["attention"][1],
                                       fitted["attention"] / fitted["math"] * h["math"]),
            "conv_backward": h["conv_backward"], **{c: h[c] for c in CONV_RAMP}}}
    return overrides, fitted


def overrides_from_fit(fitted: dict, tensor_cores: bool) -> dict:
    """The efficiency parameters a sweep's fit sets: on a GPU the Tensor Core classes (the
    sweep runs under bf16 autocast; grouped convolutions as the others), on a CPU the core
    classes; the memory classes, the ramp and the time per kernel on both."""
    if tensor_cores:
        math = {"tensor_gemm": fitted["math"], "tensor_conv": fitted["conv"],
                "grouped_conv": fitted["conv"], "attention": fitted["attention"]}
    else:
        math = {"cuda_core": fitted["math"], "cuda_core_conv": fitted["conv"],
                "cuda_core_attention": fitted["attention"]}
    return {**math, "conv_backward": fitted["conv_backward"],
            "depthwise_backward": fitted["depthwise_backward"],
            "depthwise_wgrad_wide": fitted["depthwise_wgrad_wide"], "memory": fitted["memory"],
            **{c: fitted[c] for c in CLASS_PARAMS},
            "launch_s": fitted["launch_s"], "conv_launch_s": fitted["conv_launch_s"],
            "gemm_m0": fitted["gemm_m0"],
            "gemm_n0": fitted["gemm_n0"], "gemm_k0": fitted["gemm_k0"],
            **{c: fitted[c] for c in CONV_RAMP}}
