"""Float8 linear layers as torchao runs them (``torchao.float8``, ``convert_to_float8_training``
with the "tensorwise" recipe, dynamic per-tensor scales, or "rowwise", per-row scales), the FP8
training of torchtitan's published Llama runs (``--model.converters float8``);
``dlperf analyze --fp8 tensorwise|rowwise``.

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

The "rowwise" recipe (``--fp8 rowwise``; ``Float8LinearConfig.from_recipe_name("rowwise")``,
torchao 0.10 of 2025-02, the version torchao's README benchmark ran) scales each row of a
GEMM operand on its own, along the axis the GEMM reduces, so every operand is cast once for
each GEMM it enters, from the BF16 tensor (``matmul_with_hp_or_float8_args``, which keeps x
and W in BF16 for the backward):

* forward: x's amax per token (``torch.amax(torch.abs(x), dim=-1, keepdim=True)``), W's per
  output feature, each scale rounded down to a power of two
  (``round_scales_to_power_of_2``: ``exp2(floor(log2(s)))``), the casts to E4M3, and the
  GEMM on the per-row scales (``torch._scaled_mm`` with ``scale_a`` [M, 1] and ``scale_b``
  [1, N]: the rowwise CUTLASS kernel, fast accumulation);
* backward: the gradient cast per token for the data gradient and per feature for the weight
  gradient, W per input feature (after torchao's fake dependency on the gradient, ``W + g[:1]
  * 0``, which keeps the FP8 weight out of what is saved), x per feature: four more casts,
  each writing the layout its GEMM takes (a copy ``torch.compile`` fuses into the cast), all
  E4M3. Both backward GEMMs run without fast accumulation, which torchao sends to cuBLAS's
  tensorwise kernel at unit scales, multiplying the output by the outer product of the two
  scales after it (``addmm_float8_unwrapped``: "the rowwise CUTLASS-based kernel is so slow
  without fast-accum"): one more pass over each gradient, which Inductor fuses into what
  reads it where it can (the weight gradient's goes to FSDP's reduce-scatter: a kernel).

Compiled, each rowwise cast is one kernel, its amax and the cast of the same rows; a cast per
feature (the amax down the tokens) knows its scale only after the last token, so it reads its
input a second time (``compiled.outer_reduction``).

Not modelled: delayed and static scaling, ``rowwise_with_gw_hp``, float8 tensor parallelism
(``Float8ColwiseParallel``), FSDP's float8 all-gather under the rowwise recipe (torchao has
none: the weights gather in BF16), and the kernels' rates: the rowwise CUTLASS kernel and
cuBLAS without fast accumulation (torchao's default in the backward GEMMs) are charged the
FP8 GEMM rate of every other FP8 GEMM (the model's one; both run slower at some shapes).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dlperf.models.fp8 import ALIGN, _weight_amax, _weight_quantize

RECIPES = ("tensorwise", "rowwise")
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


def to_float8_axiswise(x: Tensor, fmt: torch.dtype, dim: int) -> tuple[Tensor, Tensor]:
    """torchao's axiswise cast as the rowwise recipe runs it (``hp_tensor_to_float8_dynamic``
    with ``ScalingGranularity.AXISWISE``, ``round_scales_to_power_of_2``): the amax over
    ``dim`` (kept as a dimension of 1), the scale in FP64 then FP32 (``amax_to_scale``),
    rounded down to a power of two, the cast; (FP8 data, inverse scale)."""
    amax = torch.amax(torch.abs(x), dim=dim, keepdim=True)
    top = torch.finfo(fmt).max
    scale = (top / torch.clamp(amax.to(torch.float64), min=EPS)).to(torch.float32)
    scale = torch.exp2(torch.floor(torch.log2(scale)))
    data = (x.to(torch.float32) * scale).clamp(min=-top, max=top).to(fmt)
    return data, scale.reciprocal()


def _row_major(a: Tensor) -> Tensor:
    """``preprocess_addmm``'s first operand: row-major, copied if not."""
    return a if a.is_contiguous() else a.contiguous()


def _column_major(b: Tensor) -> Tensor:
    """``preprocess_addmm``'s second operand: column-major, copied if not."""
    return b if b.t().is_contiguous() else b.t().contiguous().t()


def _mm_post_scaled(a: Tensor, b: Tensor, inv_a: Tensor, inv_b: Tensor,
                    out_dtype: torch.dtype) -> Tensor:
    """a @ b on per-row scales without fast accumulation, as torchao runs it: cuBLAS's
    tensorwise kernel at unit scales, then the output times the scales' outer product
    (``addmm_float8_unwrapped``; the module docstring)."""
    one = inv_a.new_ones(())
    out = torch._scaled_mm(_row_major(a), _column_major(b), one, one, out_dtype=out_dtype)
    out *= inv_a * inv_b
    return out


def _weight_to_float8(w: Tensor) -> tuple[Tensor, Tensor]:
    """The weight's cast before FSDP's float8 all-gather: outside the compiled model (the
    pre-all-gather hook), so the opaque cast ops of models/fp8.py (``api`` charges them on this
    GPU's shard of the weights)."""
    data, _, inv = _weight_quantize(w, _weight_amax(w), False, True, False)
    return data, inv


class Float8Cast:
    """One input's FP8 cast, shared by the layers that read that input (the module docstring);
    ``data`` [M, K] and ``inv_scale`` the forward GEMMs' (tensorwise: one scale; rowwise: one a
    token, [M, 1]), ``wgrad_operand`` what the weight-gradient GEMMs read, made by the first
    backward that needs it; ``hp`` x [M, K] in BF16, which the rowwise recipe keeps (None
    under tensorwise)."""

    def __init__(self, x: Tensor, recipe: str = "tensorwise"):
        x2 = x.detach().reshape(-1, x.shape[-1])  # (the layers' Function carries x's gradient)
        # (tensorwise keeps only the FP8 data: holding x here would keep it alive too)
        self.recipe, self.hp = recipe, x2 if recipe == "rowwise" else None
        self.data, self.inv_scale = (to_float8(x2, E4M3) if recipe == "tensorwise" else
                                     to_float8_axiswise(x2, E4M3, -1))
        self.shape, self._t = x.shape, None

    def _wgrad(self) -> tuple[Tensor, Tensor]:
        if self.recipe == "tensorwise":  # the forward's FP8 data, column-major: one copy
            return _column_major(self.data), self.inv_scale
        # rowwise: x cast again per feature (its amax over the tokens), column-major
        data, inv = to_float8_axiswise(self.hp, E4M3, 0)
        return _column_major(data), inv

    def wgrad_operand(self) -> tuple[Tensor, Tensor]:
        """(x's FP8 data [M, K] column-major, its inverse scale) for the weight gradient.
        Under a real torch.compile (benchmarks/bench_compile_gpu.py) each layer makes its own,
        which the graph's common-subexpression elimination merges as it merges the casts:
        caching it here would mutate this object inside the backward, a graph break."""
        if torch.compiler.is_compiling():
            return self._wgrad()
        if self._t is None:
            self._t = self._wgrad()
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
        dw = torch._scaled_mm(gq.t().contiguous(), ctx.cast.wgrad_operand()[0], sg, sx,
                              out_dtype=grad.dtype)
        db = g2.sum(0) if ctx.has_bias else None
        return dx.reshape(ctx.cast.shape), dw, db, None, None


class _Float8RowwiseFn(torch.autograd.Function):
    """y = x Wᵀ (+ b) with torchao's rowwise recipe on ``cast`` (x's rowwise ``Float8Cast``;
    the module docstring): x and W kept in BF16, each cast again along the axis of the GEMM
    it enters."""

    @staticmethod
    def forward(ctx, x, weight, bias, cast: Float8Cast):
        wq_t, sw = to_float8_axiswise(weight.t(), E4M3, 0)  # [K, N], a scale per output
        y = torch._scaled_mm(_row_major(cast.data), _column_major(wq_t), cast.inv_scale, sw,
                             out_dtype=x.dtype, use_fast_accum=True)  # [M, N]
        if bias is not None:
            y = y + bias.to(y.dtype)
        ctx.save_for_backward(cast.hp, weight)
        ctx.cast, ctx.has_bias = cast, bias is not None
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        _, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])  # [M, N]
        # grad_input = g W: g per token, W per input feature, after torchao's fake dependency
        # on g (its ``g * 0`` of which Inductor computes the one row it slices)
        gq, sg = to_float8_axiswise(g2, E4M3, -1)
        wq, sw = to_float8_axiswise(weight.t() + g2[:1] * 0 * 0, E4M3, -1)  # [K, N], [K, 1]
        dx = _mm_post_scaled(gq, wq.t(), sg, sw.t(), grad.dtype)  # [M, K]
        # grad_weight = gᵀ x: g and x per feature (their amaxes over the tokens)
        gq1, sg1 = to_float8_axiswise(g2, E4M3, 0)  # [M, N], [1, N]
        xq1, sx1 = ctx.cast.wgrad_operand()  # [M, K], [1, K]
        dw = _mm_post_scaled(gq1.t(), xq1, sg1.t(), sx1, grad.dtype)  # [N, K]
        db = g2.sum(0) if ctx.has_bias else None
        return dx.reshape(ctx.cast.shape), dw, db, None


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
        if gathered and recipe != "tensorwise":
            raise ValueError(f"torchao's float8 all-gather is tensorwise only (the {recipe} "
                             "recipe gathers its weights in BF16)")
        super().__init__(in_features, out_features, bias=bias)
        self.recipe, self.gathered = recipe, gathered

    def cast(self, x: Tensor) -> Float8Cast:
        return Float8Cast(x, self.recipe)

    def forward(self, x: Tensor, cast: Float8Cast | None = None) -> Tensor:
        cast = cast or self.cast(x)
        if self.recipe == "rowwise":
            return _Float8RowwiseFn.apply(x, self.weight, self.bias, cast)
        return _Float8LinearFn.apply(x, self.weight, self.bias, cast, self.gathered)


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
