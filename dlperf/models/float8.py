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

Under tensor parallelism (models/gpt.py, ``tp`` > 1 with sequence parallelism) the tensorwise
recipe runs torchao's float8 styles, as torchtitan's ``apply_tp`` picks them for it
(torchao/float8/float8_tensor_parallel.py of 2025-06, the version torchtitan's async-TP table
ran): ``PrepareFloat8ModuleInput`` casts the attention's and the MLP's input on this rank's
shard of the tokens, before the all-gather, which then moves FP8 data (``Float8Cast.gather``;
one cast for all the layers that read it, as the style's docstring says);
``Float8RowwiseParallel`` puts ``NoopFwToFloat8BwDynamic`` after the row-parallel layer's
reduce-scatter, so the backward casts the output gradient on the shard too and all-gathers it
in FP8 (``scatter_float8``). The reduce-scatters stay in BF16 (they sum). Each of these casts is
of a DTensor sharded over the ranks, so its amax is all-reduced among them (one FP32 value;
analysis/scaling.py ``float8_tp_reductions``). The rowwise recipe runs torchtitan's plain
tensor-parallel styles instead ("float8 all-gather with TP is only supported for tensorwise"):
BF16 all-gathers, each cast on the gathered tensor, as without tensor parallelism; its casts
along a sharded axis all-reduce one amax a row.

Not modelled: delayed and static scaling, ``rowwise_with_gw_hp``, FSDP's float8 all-gather
under the rowwise recipe (torchao has none: the weights gather in BF16), and the kernels'
rates: the rowwise CUTLASS kernel and cuBLAS without fast accumulation (torchao's default in
the backward GEMMs) are charged the FP8 GEMM rate of every other FP8 GEMM (the model's one;
both run slower at some shapes).
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

    def gather(self, tp: int) -> "Float8Cast":
        """This cast, made on one rank's shard of the tokens (dim 1 of x), all-gathered in FP8
        over ``tp`` ranks (torchao's ``PrepareFloat8ModuleInput``: tensorwise only; the module
        docstring): the gathered data a stand-in as models/gpt.py's ``_SeqGather`` (allocated, no
        kernel: the scale-out times the all-gather at one byte an element), the scale the
        shard's (in torchao the amax all-reduced over the ranks: one value)."""
        if self.recipe != "tensorwise":
            raise ValueError("torchao gathers float8 data under the tensorwise recipe only")
        out = object.__new__(Float8Cast)
        out.recipe, out.hp, out.inv_scale, out._t = self.recipe, None, self.inv_scale, None
        out.data = self.data.new_empty((self.data.shape[0] * tp, self.data.shape[1]))
        out.shape = (self.shape[0], self.shape[1] * tp, *self.shape[2:])
        return out

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


class Float8GradCast:
    """A row-parallel layer's output gradient, cast to FP8 on this rank's shard of the tokens
    and all-gathered in FP8 (torchao's ``Float8RowwiseParallel``: ``NoopFwToFloat8BwDynamic``
    after the output's reduce-scatter; the module docstring): ``scatter_float8``'s backward
    fills ``value`` with (the gathered FP8 gradient [M, N], its inverse scale), the layer's
    backward takes it in place of its own cast."""

    def __init__(self):
        self.value: tuple[Tensor, Tensor] | None = None


class _Float8Scatter(torch.autograd.Function):
    """Sequence parallelism's reduce-scatter of a row-parallel float8 layer's output y [B, T,
    N] over ``tp`` ranks (a stand-in as models/gpt.py's ``_SeqScatter``: this rank's tokens,
    allocated), whose backward casts the gradient on the shard (real kernels) and all-gathers
    the FP8 data (a stand-in) into ``grad_cast``; the BF16 gradient it hands on is a stand-in
    of one element (expanded to y's shape), which the layer does not read: it takes the FP8
    one."""

    @staticmethod
    def forward(ctx, y, tp: int, grad_cast: Float8GradCast):
        ctx.shape, ctx.tp, ctx.grad_cast = y.shape, tp, grad_cast
        return y.new_empty((y.shape[0], y.shape[1] // tp, *y.shape[2:]))

    @staticmethod
    def backward(ctx, grad):
        g2 = grad.reshape(-1, grad.shape[-1])
        gq, sg = to_float8(g2, E5M2)  # on the shard, before the gather
        ctx.grad_cast.value = (gq.new_empty((gq.shape[0] * ctx.tp, gq.shape[1])), sg)
        return grad.new_empty((1,) * len(ctx.shape)).expand(ctx.shape), None, None


def scatter_float8(y: Tensor, tp: int, grad_cast: Float8GradCast) -> Tensor:
    """``_Float8Scatter``: y reduce-scattered over ``tp`` ranks, its gradient cast to FP8 on
    the shard and gathered in FP8 for the layer that made y (``grad_cast``, given to it)."""
    return _Float8Scatter.apply(y, tp, grad_cast)


class _Float8LinearFn(torch.autograd.Function):
    """y = x Wᵀ (+ b) with torchao's tensorwise FP8 GEMMs on ``cast`` (x's ``Float8Cast``);
    ``grad_cast``: the output gradient arrives cast already (``Float8GradCast``)."""

    @staticmethod
    def forward(ctx, x, weight, bias, cast: Float8Cast, gathered: bool,
                grad_cast: Float8GradCast | None = None):
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
        ctx.cast, ctx.has_bias, ctx.grad_cast = cast, bias is not None, grad_cast
        return y.reshape(*cast.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        saved = ctx.saved_tensors
        wq, sw = ctx.weight_fp8 if ctx.weight_fp8 is not None else saved[2:]
        sx = saved[1]
        if ctx.grad_cast is None:
            g2 = grad.reshape(-1, grad.shape[-1])
            gq, sg = to_float8(g2, E5M2)
        else:  # cast on the shard and gathered in FP8 (``scatter_float8``): grad a stand-in
            (gq, sg), ctx.grad_cast.value = ctx.grad_cast.value, None
        # grad_input = g W: cuBLAS takes W column-major, a transposed FP8 copy
        dx = torch._scaled_mm(gq, wq.t().contiguous().t(), sg, sw, out_dtype=grad.dtype)
        # grad_weight = gᵀ x: gᵀ row-major and x column-major, two more FP8 copies
        dw = torch._scaled_mm(gq.t().contiguous(), ctx.cast.wgrad_operand()[0], sg, sx,
                              out_dtype=grad.dtype)
        if not ctx.has_bias:
            db = None
        elif ctx.grad_cast is None:
            db = g2.sum(0)
        else:  # from the gathered FP8 gradient (grad is a stand-in)
            db = (gq.to(torch.float32).sum(0) * sg).to(grad.dtype)
        return dx.reshape(ctx.cast.shape), dw, db, None, None, None


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
    ``forward(x, cast, grad_cast)``: ``cast`` is x's ``Float8Cast`` when other layers read x
    too (``self.cast(x)`` makes one) or it was gathered in FP8 (``Float8Cast.gather``: x is then
    a stand-in of the gathered shape); ``grad_cast`` a ``Float8GradCast`` when the output's
    gradient arrives in FP8 (``scatter_float8``)."""

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

    def forward(self, x: Tensor, cast: Float8Cast | None = None,
                grad_cast: Float8GradCast | None = None) -> Tensor:
        cast = cast or self.cast(x)
        if self.recipe == "rowwise":
            if grad_cast is not None:
                raise ValueError("torchao casts the gradient before the gather under the "
                                 "tensorwise recipe only")
            return _Float8RowwiseFn.apply(x, self.weight, self.bias, cast)
        return _Float8LinearFn.apply(x, self.weight, self.bias, cast, self.gathered, grad_cast)


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
