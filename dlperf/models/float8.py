"""Float8 linear layers as torchao runs them (``torchao.float8``, ``convert_to_float8_training``
with the "tensorwise" recipe: dynamic per-tensor scales), the FP8 training of torchtitan's
published Llama runs (``--model.converters float8``); ``dlperf analyze --fp8 tensorwise``.

Why hand-written: torchao is not a dependency (an optional GPU-side library), and what dlperf
costs is the ATen ops a layer runs, which torch.compile then fuses (analysis/compiled.py). So
each layer here runs the ops torchao's code runs, in its order, on plain tensors: the capture
records them as torchao's would be recorded, and on a CPU the layer trains (tests/test_float8.py
checks its numbers against a float64 product of the quantized operands).

What one layer runs (torchao/float8/float8_linear.py, float8_scaling_utils.py,
float8_tensor.py and float8_ops.py of 2024-12, the version torchtitan's tables ran):

* the input's cast (``hp_tensor_to_float8_dynamic``): its amax (``torch.max(torch.abs(x))``,
  a reduction over the whole tensor), the scale (the format's largest value over the amax,
  in FP32), then ``(x.to(float32) * scale).clamp(-max, max).to(float8_e4m3fn)``;
* the weight's cast, the same, unless FSDP gathered it in FP8 already (``gathered``:
  torchtitan's ``enable_fsdp_float8_all_gather`` with ``precompute_float8_dynamic_scale_for_
  fsdp``: the cast runs on each GPU's shard before the all-gather, outside the model; its
  cost is ``api``'s, the all-gather's bytes ``scaling``'s);
* the forward GEMM, ``torch._scaled_mm(x_fp8, w_fp8.t(), 1/sx, 1/sw, use_fast_accum=True)``;
* kept for the backward: the input's FP8 data (1 byte an element where a BF16 layer keeps 2)
  and its scale; the weight's FP8 copy too where the layer made it (an FSDP-gathered one is
  freed with the gathered parameters and gathered again);
* backward: the output gradient's cast to E5M2 (``NoopFwToFloat8E5M2BwDynamic``: amax,
  scale, cast); the data-gradient GEMM ``g_fp8 @ w_fp8``, whose second operand cuBLAS wants
  column-major (``preprocess_addmm``: ``w.t().contiguous().t()``, a transposed copy of the
  FP8 weight); the weight-gradient GEMM ``g_fp8.t() @ x_fp8``, both operands copied to the
  layouts it takes (the gradient's transpose, the input's transpose): FP8 copies, read from
  FP8 data.

torch.compile fuses the casts: a tensor's amax is one generated reduction reading it (two
kernels: Inductor splits a reduction to one value), its cast and, in the backward, the
transposed copy another (compiled.py). Without compile each op above is an eager kernel,
which is why torchao asks for compile.

Layers that read one input share its cast (``Float8Cast``: Llama's q, k and v; SwiGLU's two
input layers): each of torchao's layers casts its own input, but the casts are the same ops on
the same tensor, which torch.compile's common-subexpression elimination computes once; eager
torchao would cast it once per layer (a few percent more cast traffic; not modelled).

torchao's code of 2025 (0.10 on, torchao's README rows: ``matmul_with_hp_or_float8_args`` for
every recipe) keeps the BF16 input and weight instead and casts them again in the backward.
Under selective checkpointing, where the forward's casts are recomputed anyway, that moves
about one byte an element of each input less than modelled here; without checkpointing it
keeps the input at 2 bytes an element where this keeps 1 (not modelled: the 2024 form is the
one torchtitan's float8 tables ran).

Not modelled: the rowwise recipes (per-row scales, a kernel per scaling axis), delayed and
static scaling, float8 tensor parallelism (``Float8ColwiseParallel``), and ``use_fast_accum``
off in the backward GEMMs (torchao's default; cuBLAS's split accumulator costs Hopper some
FP8 GEMM rate at some shapes: the GEMM share is the model's one).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dlperf.models.fp8 import ALIGN, _weight_amax, _weight_quantize

RECIPES = ("tensorwise",)
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
EPS = 1e-12  # torchao's floor under an amax (float8_utils.EPS)


def _scale(amax: Tensor, fmt: torch.dtype) -> Tensor:
    """``amax_to_scale``: the format's largest value over the amax, in FP32."""
    return (torch.finfo(fmt).max / torch.clamp(amax.float(), min=EPS)).to(torch.float32)


def to_float8(x: Tensor, fmt: torch.dtype) -> tuple[Tensor, Tensor]:
    """``hp_tensor_to_float8_dynamic``: (x's FP8 data, its inverse scale, what ``_scaled_mm``
    multiplies back by), as torchao's ops compute them."""
    amax = torch.max(torch.abs(x))
    scale = _scale(amax, fmt)
    top = torch.finfo(fmt).max
    data = (x.to(torch.float32) * scale).clamp(min=-top, max=top).to(fmt)
    return data, scale.reciprocal()


def _weight_to_float8(w: Tensor) -> tuple[Tensor, Tensor]:
    """The weight's cast before FSDP's float8 all-gather: outside the compiled model (the
    pre-all-gather hook), so the opaque cast ops of models/fp8.py (``api`` charges them on this
    GPU's shard of the weights)."""
    data, _, inv = _weight_quantize(w, _weight_amax(w), False, True, False)
    return data, inv


class Float8Cast:
    """One input's FP8 cast, shared by the layers that read that input (the module docstring);
    ``data`` [M, K] and ``inv_scale`` the forward GEMMs', ``wgrad_operand`` the transposed copy
    the weight-gradient GEMMs read, made by the first backward that needs it."""

    def __init__(self, x: Tensor):
        x2 = x.detach().reshape(-1, x.shape[-1])  # (the layers' Function carries x's gradient)
        self.data, self.inv_scale = to_float8(x2, E4M3)
        self.shape, self._t = x.shape, None

    def wgrad_operand(self) -> Tensor:
        """x_fp8 [M, K] as column-major data (``x.t().contiguous().t()``): one copy. Under a
        real torch.compile (benchmarks/bench_compile_gpu.py) each layer makes its own, which the
        graph's common-subexpression elimination merges as it merges the casts: caching it
        here would mutate this object inside the backward, a graph break."""
        if torch.compiler.is_compiling():
            return self.data.t().contiguous().t()
        if self._t is None:
            self._t = self.data.t().contiguous().t()
        return self._t


class _Float8LinearFn(torch.autograd.Function):
    """y = x Wᵀ (+ b) with torchao's tensorwise FP8 GEMMs on ``cast`` (x's ``Float8Cast``)."""

    @staticmethod
    def forward(ctx, x, weight, bias, cast: Float8Cast, gathered: bool):
        wq, sw = _weight_to_float8(weight) if gathered else to_float8(weight, E4M3)
        y = torch._scaled_mm(cast.data, wq.t(), cast.inv_scale, sw, out_dtype=x.dtype,
                             use_fast_accum=True)  # [M, N]
        if bias is not None:
            y = y + bias.to(y.dtype)
        if gathered:  # the gathered FP8 weight: freed with FSDP's gathered parameters
            ctx.save_for_backward(cast.data, cast.inv_scale)
            ctx.weight_fp8 = (wq, sw)
        else:
            ctx.save_for_backward(cast.data, cast.inv_scale, wq, sw)
            ctx.weight_fp8 = None
        ctx.cast, ctx.has_bias = cast, bias is not None
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        saved = ctx.saved_tensors
        wq, sw = ctx.weight_fp8 if ctx.weight_fp8 is not None else saved[2:]
        sx = saved[1]
        g2 = grad.reshape(-1, grad.shape[-1])
        gq, sg = to_float8(g2, E5M2)
        # grad_input = g W: cuBLAS takes W column-major, a transposed FP8 copy
        dx = torch._scaled_mm(gq, wq.t().contiguous().t(), sg, sw, out_dtype=grad.dtype)
        # grad_weight = gᵀ x: gᵀ row-major and x column-major, two more FP8 copies
        dw = torch._scaled_mm(gq.t().contiguous(), ctx.cast.wgrad_operand(), sg, sx,
                              out_dtype=grad.dtype)
        db = g2.sum(0) if ctx.has_bias else None
        return dx.reshape(ctx.cast.shape), dw, db, None, None


class Float8Linear(nn.Linear):
    """nn.Linear whose GEMMs run in FP8 as torchao's ``Float8Linear`` runs them (the module
    docstring); the same parameters. ``gathered``: FSDP gathers its weight in FP8.
    ``forward(x, cast)``: ``cast`` is x's ``Float8Cast`` when other layers read x too
    (``self.cast(x)`` makes one)."""

    def __init__(self, in_features: int, out_features: int, bias: bool,
                 recipe: str = "tensorwise", gathered: bool = False):
        if recipe not in RECIPES:
            raise ValueError(f"torchao float8 recipe must be one of {', '.join(RECIPES)}, "
                             f"got {recipe!r}")
        if in_features % ALIGN or out_features % ALIGN:
            # torch._scaled_mm's rule (torchtitan's module filter skips such layers)
            raise ValueError(f"a float8 linear layer needs its sizes to be multiples of "
                             f"{ALIGN}, got {in_features} x {out_features}")
        super().__init__(in_features, out_features, bias=bias)
        self.recipe, self.gathered = recipe, gathered

    def cast(self, x: Tensor) -> Float8Cast:
        return Float8Cast(x)

    def forward(self, x: Tensor, cast: Float8Cast | None = None) -> Tensor:
        return _Float8LinearFn.apply(x, self.weight, self.bias, cast or self.cast(x),
                                     self.gathered)


def float8_parameters(model: nn.Module) -> frozenset[str]:
    """The names of the weights FSDP gathers in FP8 (the ``gathered`` float8 layers')."""
    return frozenset(f"{name}.weight" if name else "weight"
                     for name, m in model.named_modules()
                     if isinstance(m, Float8Linear) and m.gathered)


def gather_shares(shards: int, grad_accum: int = 1, gathers: int = 2) -> dict:
    """``api.AnalysisConfig``'s shares of the weight casts under FSDP's float8 all-gather
    (``gathered`` layers): each GPU casts its 1/``shards`` of every float8 weight from the
    FP32 master copy (4 bytes an element, where the capture's cast reads 2 of BF16): the amax
    once a step (torchtitan's ``precompute_float8_dynamic_scale_for_fsdp``, after the update;
    the step's ``grad_accum`` micro-batches share it), the cast before each of a micro-batch's
    ``gathers`` (two under FSDP's resharding after the forward: forward and backward)."""
    if shards < 1 or grad_accum < 1 or gathers < 1:
        raise ValueError(f"shards, micro-batches and gathers are at least 1, got {shards}, "
                         f"{grad_accum}, {gathers}")
    # amax: 4 bytes read of 1/N against 2 of the whole; cast: 4 read + 1 written of 1/N
    # against 2 + 1 of the whole
    return {"fp8_weight_amax_share": 4 / 2 / (shards * grad_accum),
            "fp8_weight_cast_share": gathers * (4 + 1) / (2 + 1) / shards}
