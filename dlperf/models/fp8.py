"""FP8 linear layers as TransformerEngine runs them (per-tensor scaling, and MXFP8 block
scaling on Blackwell), for a
decoder under Megatron-Core (models/gpt.py, ``GPTConfig.fp8``; ``dlperf analyze --fp8``).

Why hand-written: PyTorch has the FP8 GEMM (``torch._scaled_mm``, which the capture records
and costs/roofline charge at the GPU's FP8 Tensor Core rate) but not TransformerEngine's
quantization kernels, and what a layer casts, keeps and gathers is what FP8 training costs
beside its GEMMs. Each kernel is one ``torch.library.custom_op`` with a real implementation
(so a layer built with them trains on a CPU and tests/test_fp8.py checks its numbers against a
float64 product of the quantized operands) and a fake one for meta tensors.

What one layer runs (transformer_engine/pytorch/module/linear.py and layernorm_linear.py, an
``fp8_autocast`` with ``Format.HYBRID``: E4M3 in the forward, E5M2 for gradients):

* forward: the input quantized (row-wise for the forward GEMM and column-wise, i.e. its
  transpose, for the weight-gradient GEMM: TE's fused cast-transpose kernel), the weight
  quantized the same way, one FP8 GEMM (Hopper's FP8 GEMMs take only "TN" operands, hence the
  transposed copies);
* backward: the output gradient quantized (row-wise for the data-gradient GEMM, column-wise for
  the weight-gradient GEMM), two FP8 GEMMs;
* kept for the backward: the input's column-wise FP8 copy (1 byte an element, where a BF16
  layer keeps 2) and the weight's FP8 copies (module state: ``memory_footprint`` counts them
  as weights, 2 bytes a parameter).

The two recipes differ in where the scale comes from. ``delayed`` (``DelayedScaling``): from
the amax history of earlier steps, so one cast kernel a tensor, which also records this
tensor's amax. ``current`` (``Float8CurrentScaling``; Megatron-Bridge's "FP8-CS"): from this
tensor's own amax, so an amax kernel (a reduction over the tensor) before each cast.

Under sequence parallelism (``gather``/``scatter`` > 1, Megatron-Core's column- and row-parallel
layers) TE gathers in FP8: a column-parallel layer quantizes its shard of the tokens row-wise
only, all-gathers the FP8 data, keeps the shard and gathers it again in the backward, where it
transposes the gathered FP8 data for the weight gradient; a row-parallel layer reduce-scatters
its BF16 output and, in the backward, quantizes its shard of the gradient, all-gathers it in
FP8 and transposes it. The collectives are allocations here (as gpt.py's stand-ins); the
scale-out times them at 1 byte an element (analysis/scaling.py, tensor_parallel_collectives).

On datacenter Blackwell (sm 10.x: B200, B300, GB200; ``tn_only=False``: TE's
``nvte_is_non_tn_fp8_gemm_supported``, which excludes sm 12.x parts) FP8 GEMMs take any
operand layout: the casts write the row-wise data only, no transposes are
made, the gradient GEMMs read the row-wise data (``fp8_gemm``), and a weight has one FP8 copy.

Under MXFP8 block scaling (``mxfp8``: TE's ``MXFP8BlockScaling``, Megatron-Bridge's "FP8-MX",
datacenter Blackwell only) every tensor is E4M3 with a power-of-two (E8M0) scale for each 32
elements along one dimension. A GEMM needs each operand blocked along the dimension it
reduces, so a tensor read by both a forward-or-data-gradient GEMM and a weight-gradient GEMM
is cast once into two copies, row-wise and column-wise (``_mx_quantize``, one kernel, no amax
pass), and a weight keeps both (``_MxLinearFn``, ``_MxGroupedFn``); sizes and each expert's
rows are multiples of 32 (``align``). Under sequence parallelism TE gathers MXFP8 copies
with their scales: a column-parallel layer's row-wise input in the forward and its
column-wise input again in the backward, a row-parallel layer's gradient both ways
(``MxCast``, ``_MxLinearFn``; analysis/scaling.py times them at 1 + 1/32 bytes an element).

Not modelled: a delayed recipe's norm that writes FP8 itself (TE fuses the cast into the
RMSNorm/LayerNorm kernel before a ``LayerNormLinear``; here the norm writes BF16 and the layer
casts it: one extra read and write of the norm's output, under 1% of a Llama step), and the
once-a-step amax-history update (a few small kernels a step).

Registering the ops is torch.library's process-wide registry: done once, at import.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dlperf.models.fused import NAMESPACE

RECIPES = ("delayed", "current")  # per-tensor scaling
# block scaling (``MXFP8BlockScaling``; Megatron's --fp8-recipe mxfp8, Megatron-Bridge's
# "FP8-MX"): ``_MxLinearFn`` and ``_MxGroupedFn`` below
MX_RECIPES = ("mxfp8",)
TE_RECIPES = RECIPES + MX_RECIPES
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
_MAX = {E4M3: 448.0, E5M2: 57344.0}  # the largest finite value of each format

# The ops below are recorded by their names (fp8_amax, fp8_quantize, fp8_transpose, fp8_gemm,
# and the weight's casts): analysis/costs.py charges each cast as one memory-bound kernel and
# fp8_gemm as a GEMM. The weight's casts have names of their own because Megatron-Core casts a
# weight once a step (TE's ``is_first_microbatch``: the FP8 copies are cached for the step's
# other micro-batches), so ``api.capture_costs`` spreads them over
# ``AnalysisConfig.fp8_weight_reuse`` micro-batches.
WEIGHT_OPS = ("fp8_weight_amax", "fp8_weight_quantize")
MX_WEIGHT_OPS = ("fp8_mx_weight_quantize",)
# what TransformerEngine requires an FP8 layer's sizes to be multiples of
# (``assert_dim_for_fp8_exec``): 16 elements, 16 bytes of FP8, the guide's alignment rule;
# under MXFP8 a block of scaling, 32 (both dimensions: the column-wise copy is scaled in
# blocks down the columns); ``align`` gives a recipe's
ALIGN = 16
MX_BLOCK = 32  # elements sharing one E8M0 scale (OCP Microscaling Formats v1.0, MXFP8)


def align(recipe: str | None) -> int:
    """The multiple an FP8 layer's sizes (and a grouped layer's rows) must be under
    ``recipe``: 32 for MXFP8 (one block of scaling), else 16."""
    return MX_BLOCK if recipe in MX_RECIPES else ALIGN


def _amax_impl(x: Tensor) -> Tensor:
    """|x|'s maximum over each matrix: a scalar for x [M, K], one an expert for a grouped
    layer's x [G, M, K] (TE's GroupedLinear gives every expert its own quantizer)."""
    if not x.numel():
        return x.new_zeros(x.shape[:-2], dtype=torch.float32)
    return x.detach().abs().amax(dim=(-2, -1)).float()


def _quantize_impl(x: Tensor, amax: Tensor | None, e5m2: bool, rowwise: bool,
                   columnwise: bool) -> tuple[Tensor, Tensor, Tensor]:
    """x [M, K] -> (FP8 data [M, K] or empty, its transpose [K, M] or empty, the inverse scale
    the GEMM multiplies back by); a grouped layer's x [G, M, K] likewise, each of its G
    matrices scaled by its own amax (inverse scales [G]). Without ``amax`` (the delayed
    recipe) the kernel takes this tensor's amax itself, as a stand-in for the history's."""
    fmt = E5M2 if e5m2 else E4M3
    top = _MAX[fmt]
    a = _amax_impl(x) if amax is None else amax.float()
    scale = torch.where(a > 0, top / a, torch.ones_like(a))
    q = (x.float() * scale[..., None, None]).clamp(-top, top).to(fmt)
    empty = x.new_empty((0,), dtype=fmt)
    return (q if rowwise else empty, q.transpose(-2, -1).contiguous() if columnwise else empty,
            scale.reciprocal())


def _quantize_fake(x, amax, e5m2, rowwise, columnwise):
    fmt = E5M2 if e5m2 else E4M3
    *lead, m, k = x.shape
    return (x.new_empty((*lead, m, k) if rowwise else (0,), dtype=fmt),
            x.new_empty((*lead, k, m) if columnwise else (0,), dtype=fmt),
            x.new_empty(lead, dtype=torch.float32))


def _register(name: str, fn, fake):
    op = torch.library.custom_op(f"{NAMESPACE}::{name}", fn, mutates_args=())
    op.register_fake(fake)
    return op


def _transpose_fn(data: Tensor) -> Tensor:
    return data.transpose(-2, -1).contiguous()


def _amax_fake(x):
    return x.new_empty(x.shape[:-2], dtype=torch.float32)


def _transpose_fake(data):
    return data.new_empty((*data.shape[:-2], data.shape[-1], data.shape[-2]))


def _gemm_fn(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor, trans_a: bool,
             trans_b: bool, out_dtype: torch.dtype, bias: Tensor | None = None) -> Tensor:
    """op(a) op(b) (+ bias) in FP8 with any operand layout (Blackwell's FP8 GEMMs; Hopper's
    take only the TN form ``torch._scaled_mm`` does): op(t) is t transposed where asked. On
    [G, M, K] and [G, K, N] operands, G GEMMs, each with its own scales [G] (a grouped layer's:
    TE's grouped GEMM), computed here as the exact product of the dequantized operands."""
    a = a.transpose(-2, -1) if trans_a else a
    b = b.transpose(-2, -1) if trans_b else b
    if a.dim() == 3:
        y = torch.bmm(a.float() * scale_a[:, None, None], b.float() * scale_b[:, None, None])
        return (y if bias is None else y + bias.float()).to(out_dtype)
    return torch._scaled_mm(a.contiguous(), b.t().contiguous().t(), scale_a, scale_b,
                            bias=bias, out_dtype=out_dtype)


def _gemm_fake(a, b, scale_a, scale_b, trans_a, trans_b, out_dtype, bias=None):
    m = a.shape[-1] if trans_a else a.shape[-2]
    n = b.shape[-2] if trans_b else b.shape[-1]
    return a.new_empty((*a.shape[:-2], m, n), dtype=out_dtype)


_amax = _register("fp8_amax", _amax_impl, _amax_fake)
_quantize = _register("fp8_quantize", _quantize_impl, _quantize_fake)
_transpose = _register("fp8_transpose", _transpose_fn, _transpose_fake)
_weight_amax = _register("fp8_weight_amax", _amax_impl, _amax_fake)
_weight_quantize = _register("fp8_weight_quantize", _quantize_impl, _quantize_fake)
_gemm = _register("fp8_gemm", _gemm_fn, _gemm_fake)


def _mx_blocks(t: Tensor) -> tuple[Tensor, Tensor]:
    """t [..., M, K] in MXFP8, scaled in blocks of 32 along K: (E4M3 data [..., M, K], E8M0
    scales [..., M, K / 32] as uint8, the exponent biased by 127). Each block's scale is the
    power of two that brings its amax within E4M3's 448, rounded up so nothing saturates
    (TransformerEngine's ``float_to_e8m0`` of amax / 448)."""
    *lead, m, k = t.shape
    blocks = t.float().reshape(*lead, m, k // MX_BLOCK, MX_BLOCK)
    amax = blocks.abs().amax(-1)
    e = torch.where(amax > 0, torch.ceil(torch.log2(amax / _MAX[E4M3])),
                    torch.full_like(amax, -127.0)).clamp(-127, 127)
    q = (blocks / torch.exp2(e)[..., None]).clamp(-_MAX[E4M3], _MAX[E4M3]).to(E4M3)
    return q.reshape(*lead, m, k), (e + 127).to(torch.uint8)


def _mx_dequantized(data: Tensor, scale: Tensor) -> Tensor:
    """The values MXFP8 ``data`` [..., M, K] with ``scale`` [..., M, K / 32] stand for."""
    return data.float() * torch.exp2(scale.float() - 127).repeat_interleave(MX_BLOCK, -1)


def _mx_quantize_impl(x: Tensor, rowwise: bool, columnwise: bool
                      ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """x [..., M, K] -> (row-wise data [..., M, K] and scales [..., M, K/32], column-wise data
    and scales), each pair empty where not asked: one kernel reading x once (TE's MXFP8
    quantize; no amax pass, the kernel takes each block's amax itself). The column-wise copy
    is scaled in blocks of 32 down each column, so it is not a transpose of the row-wise one:
    the weight-gradient GEMMs, which reduce over the rows, need it. TE writes it in x's own
    layout; here it is stored transposed, [..., K, M] with scales [..., K, M/32], so that
    every MXFP8 operand is blocked along its last dimension (the same bytes)."""
    empty = x.new_empty((0,), dtype=E4M3), x.new_empty((0,), dtype=torch.uint8)
    row = _mx_blocks(x) if rowwise else empty
    col = _mx_blocks(x.transpose(-2, -1)) if columnwise else empty
    return (*row, *col)


def _mx_quantize_fake(x, rowwise, columnwise):
    *lead, m, k = x.shape
    e8m0 = torch.uint8

    def pair(rows, cols, on):
        return ((x.new_empty((*lead, rows, cols), dtype=E4M3),
                 x.new_empty((*lead, rows, cols // MX_BLOCK), dtype=e8m0)) if on
                else (x.new_empty((0,), dtype=E4M3), x.new_empty((0,), dtype=e8m0)))
    return (*pair(m, k, rowwise), *pair(k, m, columnwise))


def _mx_gemm_fn(a: Tensor, scale_a: Tensor, b: Tensor, scale_b: Tensor, out_dtype: torch.dtype,
                bias: Tensor | None = None) -> Tensor:
    """a [..., M, K] times b [..., N, K] transposed (+ bias): [..., M, N], both operands
    MXFP8 blocked along K, the dimension the GEMM reduces (Blackwell's block-scaled Tensor
    Core GEMM, which applies each block's scale as it accumulates in FP32); computed here as
    the exact product of the dequantized operands."""
    y = _mx_dequantized(a, scale_a) @ _mx_dequantized(b, scale_b).transpose(-2, -1)
    return (y if bias is None else y + bias.float()).to(out_dtype)


def _mx_gemm_fake(a, scale_a, b, scale_b, out_dtype, bias=None):
    return a.new_empty((*a.shape[:-1], b.shape[-2]), dtype=out_dtype)


_mx_quantize = _register("fp8_mx_quantize", _mx_quantize_impl, _mx_quantize_fake)
_mx_weight_quantize = _register("fp8_mx_weight_quantize", _mx_quantize_impl, _mx_quantize_fake)
_mx_gemm = _register("fp8_mx_gemm", _mx_gemm_fn, _mx_gemm_fake)


def _cast(x: Tensor, recipe: str, e5m2: bool, rowwise: bool, columnwise: bool,
          weight: bool = False):
    """One tensor's quantization: an amax kernel first under the current recipe."""
    amax_op, quantize_op = (_weight_amax, _weight_quantize) if weight else (_amax, _quantize)
    amax = amax_op(x) if recipe == "current" else None
    return quantize_op(x, amax, e5m2, rowwise, columnwise)


def _stand_in(t: Tensor, rows: int) -> Tensor:
    """A collective's result along the tokens (first) dimension: allocated, no kernel."""
    return t.new_empty((rows, *t.shape[1:]))


def _rank_output(y: Tensor, x: Tensor, gather: int, scatter: int) -> Tensor:
    """A layer's output y [M', N] (M' the tokens its GEMM ran: x's times ``gather``) as this
    rank holds it: reduce-scattered over ``scatter`` ranks (a row-parallel layer's; an
    allocation), in x's leading shape with its tokens times gather / scatter."""
    if scatter > 1:
        y = _stand_in(y, y.shape[0] // scatter)
    lead = x.shape[:-1]
    return y.reshape(*lead[:-1], lead[-1] * gather // scatter, y.shape[-1])


def _mx_stand_in(pair: tuple[Tensor, Tensor], ranks: int, tokens_last: bool = False
                 ) -> tuple[Tensor, Tensor]:
    """An MXFP8 copy (data, scales) all-gathered along the tokens over ``ranks``: allocated,
    no kernel. The tokens are the first dimension of a row-wise copy [M, K] (scales
    [M, K/32]) and the last of a column-wise one, stored transposed [K, M] (scales [K, M/32]);
    TE gathers the data and the scales, 1 + 1/32 bytes an element (``_all_gather_mxfp8``)."""
    if ranks == 1:
        return pair
    if tokens_last:
        return tuple(t.new_empty((*t.shape[:-1], t.shape[-1] * ranks)) for t in pair)
    return tuple(_stand_in(t, t.shape[0] * ranks) for t in pair)


class SharedCast:
    """One input's FP8 cast, shared by the layers that read that input (Llama's q, k and v
    projections; SwiGLU's two input layers): Megatron-Core runs each group as one TE layer
    (``linear_qkv``, ``linear_fc1``) that casts, keeps and gathers its input once. ``total``
    is the GEMMs' operand (all-gathered under ``gather`` > 1), ``keep`` what the backward
    needs (the column-wise copy, or the row-wise shard it gathers again), ``scale_inv`` the
    GEMMs' factor; ``x_t`` is the gathered input's transpose, made by the group's first
    backward and used by the rest."""

    def __init__(self, x: Tensor, recipe: str, gather: int = 1, tn_only: bool = True):
        x2 = x.detach().reshape(-1, x.shape[-1])  # (the layers' Function carries x's gradient)
        if gather > 1 or not tn_only:
            # row-wise only: TE gathers FP8 row-wise data and transposes it later; a GPU whose
            # FP8 GEMMs take any layout needs no transpose at all
            xq, _, self.scale_inv = _cast(x2, recipe, False, True, False)
            self.total, self.keep = _stand_in(xq, xq.shape[0] * gather) if gather > 1 else xq, xq
        else:
            self.total, self.keep, self.scale_inv = _cast(x2, recipe, False, True, True)
        self.gather, self.tn_only, self.shape, self.x_t = gather, tn_only, x.shape, None

    def wgrad_operand(self) -> Tensor:
        """The input as the weight-gradient GEMMs read it: its column-wise copy [K, M'] (TN
        GEMMs), or its row-wise data [M', K] (any-layout GEMMs), re-gathered once for the
        group under sequence parallelism."""
        if self.gather == 1:
            return self.keep
        if self.x_t is None:  # the re-gather (an allocation), and on TN GPUs one transpose
            total = _stand_in(self.keep, self.keep.shape[0] * self.gather)
            self.x_t = _transpose(total) if self.tn_only else total
        return self.x_t


class _Fp8LinearFn(torch.autograd.Function):
    """y = x Wᵀ (+ b) with FP8 GEMMs, as the module docstring describes, on ``cast`` (x's
    ``SharedCast``; x [..., K] is this rank's tokens); ``scatter``: ranks the output is
    reduce-scattered over (1: none)."""

    @staticmethod
    def forward(ctx, x, weight, bias, recipe: str, cast: SharedCast, scatter: int):
        wq, wq_t, sw = _cast(weight, recipe, False, True, cast.tn_only, weight=True)
        y = torch._scaled_mm(cast.total, wq.t(), cast.scale_inv, sw, bias=bias,
                             out_dtype=x.dtype)  # [M', N]
        ctx.save_for_backward(cast.keep, cast.scale_inv)
        # TE's cached FP8 weight: module state (api.memory_footprint), not an activation
        ctx.weight_fp8 = (wq_t if cast.tn_only else wq, sw)
        ctx.recipe, ctx.cast, ctx.scatter = recipe, cast, scatter
        ctx.has_bias = bias is not None
        return _rank_output(y, x, cast.gather, scatter)

    @staticmethod
    def backward(ctx, grad):
        _keep, sx = ctx.saved_tensors
        wq, sw = ctx.weight_fp8  # W^T [K, N] on TN GPUs, W [N, K] on any-layout ones
        cast = ctx.cast
        tn = cast.tn_only
        n = grad.shape[-1]
        g2 = grad.reshape(-1, n)
        if ctx.scatter > 1 or not tn:
            # row-wise only (this rank's tokens of the gradient all-gathered in FP8, then, on
            # TN GPUs, transposed)
            gq, _, sg = _cast(g2, ctx.recipe, True, True, False)
            g_total = _stand_in(gq, gq.shape[0] * ctx.scatter) if ctx.scatter > 1 else gq
            g_t = _transpose(g_total) if tn else None
        else:
            g_total, g_t, sg = _cast(g2, ctx.recipe, True, True, True)
        x_w = cast.wgrad_operand()
        if tn:  # Hopper: TN operands, the transposed copies
            dx = torch._scaled_mm(g_total, wq.t(), sg, sw, out_dtype=grad.dtype)  # [M', K]
            dw = torch._scaled_mm(g_t, x_w.t(), sg, sx, out_dtype=grad.dtype)  # [N, K]
        else:  # Blackwell: G W and G^T X from the row-wise data
            dx = _gemm(g_total, wq, sg, sw, False, False, grad.dtype)
            dw = _gemm(g_total, x_w, sg, sx, True, False, grad.dtype)
        if cast.gather > 1:
            dx = _stand_in(dx, dx.shape[0] // cast.gather)  # its reduce-scatter
        db = g2.sum(0) if ctx.has_bias else None  # (TE fuses it into the cast: Llama has none)
        return dx.reshape(cast.shape), dw, db, None, None, None


class Fp8Linear(nn.Linear):
    """nn.Linear whose GEMMs run in FP8 (``_Fp8LinearFn``); the same parameters. ``gather`` /
    ``scatter``: Megatron-Core's column- / row-parallel layer under sequence parallelism, which
    all-gathers its input (reduce-scatters its output) itself. ``forward(x, cast)``: ``cast``
    is x's ``SharedCast`` when other layers read x too (``self.cast(x)`` makes one)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, recipe: str,
                 gather: int = 1, scatter: int = 1, tn_only: bool = True):
        if recipe not in TE_RECIPES:
            raise ValueError(f"FP8 recipe must be one of {', '.join(TE_RECIPES)}, got "
                             f"{recipe!r}")
        if in_features % align(recipe) or out_features % align(recipe):
            raise ValueError(f"an FP8 linear layer needs its sizes to be multiples of "
                             f"{align(recipe)} (TransformerEngine refuses others), got "
                             f"{in_features} x {out_features}")
        if recipe in MX_RECIPES and tn_only:
            raise ValueError("MXFP8 layers are modelled on Blackwell (tn_only False)")
        super().__init__(in_features, out_features, bias=bias)
        self.recipe, self.gather, self.scatter = recipe, gather, scatter
        self.tn_only = tn_only

    def cast(self, x: Tensor):
        if self.recipe in MX_RECIPES:
            return MxCast(x, self.gather)
        return SharedCast(x, self.recipe, self.gather, self.tn_only)

    def forward(self, x: Tensor, cast=None) -> Tensor:
        if self.recipe in MX_RECIPES:
            return _MxLinearFn.apply(x, self.weight, self.bias, cast or self.cast(x),
                                     self.scatter)
        return _Fp8LinearFn.apply(x, self.weight, self.bias, self.recipe,
                                  cast or self.cast(x), self.scatter)


class MxCast:
    """One input's MXFP8 cast, shared as ``SharedCast`` is by the layers that read it: one
    kernel writing the row-wise copy the forward GEMMs read (``total``) and the column-wise
    one the weight-gradient GEMMs read (``keep``, kept for the backward), each with its
    scales.

    Under sequence parallelism (``gather`` > 1: a column-parallel layer's input, this rank's
    share of the tokens) TE 2.x casts the shard both ways, all-gathers the row-wise copy only
    for the forward GEMMs, keeps the shard's column-wise copy, and in the backward all-gathers
    that column-wise copy for the weight-gradient GEMMs (``wgrad_operand``; module/linear.py
    and layernorm_linear.py: an MXFP8 quantizer is not ``supports_only_rowwise_all_gather``,
    so the saved input keeps its column-wise usage and the backward gathers that). No
    transpose anywhere: the copies are already blocked the way each GEMM reduces."""

    def __init__(self, x: Tensor, gather: int = 1):
        x2 = x.detach().reshape(-1, x.shape[-1])  # (the layers' Function carries x's gradient)
        row, row_scale, col, col_scale = _mx_quantize(x2, True, True)
        self.total = _mx_stand_in((row, row_scale), gather)
        self.keep, self.shape, self.gather = (col, col_scale), x.shape, gather
        self._gathered = None

    def wgrad_operand(self) -> tuple[Tensor, Tensor]:
        """The column-wise copy the weight-gradient GEMMs read: the shard's, all-gathered
        once for the group under sequence parallelism."""
        if self.gather == 1:
            return self.keep
        if self._gathered is None:
            self._gathered = _mx_stand_in(self.keep, self.gather, tokens_last=True)
        return self._gathered


class _MxLinearFn(torch.autograd.Function):
    """y = x Wᵀ (+ b) as TransformerEngine runs a linear layer under ``MXFP8BlockScaling`` on
    Blackwell (transformer_engine/common/recipe: every tensor in E4M3, gradients too, each
    block of 32 elements with its own power-of-two scale, E8M0; the GEMMs are Blackwell's
    block-scaled ones, which take each operand blocked along the dimension they reduce):

    * forward: the input cast once, row-wise and column-wise (``MxCast``), the weight the same
      (once a step: module state, as the per-tensor recipes'), one GEMM on the row-wise copies;
    * backward: the output gradient cast both ways in one kernel; the data gradient from its
      row-wise copy and the weight's column-wise one, the weight gradient from the two
      column-wise copies (gradient's and input's);
    * kept: the input's column-wise copy and its scales (1 + 1/32 bytes an element), and the
      weight's two copies (``fp8_weight_bytes``).

    Under sequence parallelism a column-parallel layer's input is gathered as ``MxCast``
    says, its input gradient reduce-scattered in BF16; a row-parallel layer (``scatter`` > 1)
    reduce-scatters its BF16 output and, in the backward, casts its shard of the output
    gradient both ways and all-gathers both copies, 2 (1 + 1/32) bytes an element (TE sets
    the gradient's quantizer to both usages before ``grad_output_preprocess`` gathers it).

    Against the per-tensor recipes on the same GPU: no amax pass (the cast takes each block's
    amax itself), but every cast writes two copies, and a weight keeps two (per-tensor FP8 on
    Blackwell writes and keeps one: its GEMMs read the row-wise data either way round)."""

    @staticmethod
    def forward(ctx, x, weight, bias, cast: MxCast, scatter: int = 1):
        w_row, w_row_scale, w_col, w_col_scale = _mx_weight_quantize(weight, True, True)
        y = _mx_gemm(*cast.total, w_row, w_row_scale, x.dtype, bias)  # [M', N]
        ctx.save_for_backward(*cast.keep)
        ctx.weight_fp8 = (w_col, w_col_scale)  # W blocked down its columns, stored [K, N]
        ctx.cast, ctx.scatter, ctx.has_bias = cast, scatter, bias is not None
        return _rank_output(y, x, cast.gather, scatter)

    @staticmethod
    def backward(ctx, grad):
        w_col, w_col_scale = ctx.weight_fp8
        cast, scatter = ctx.cast, ctx.scatter
        g2 = grad.reshape(-1, grad.shape[-1])
        g_row, g_row_scale, g_col, g_col_scale = _mx_quantize(g2.contiguous(), True, True)
        # a row-parallel layer's gradient: this rank's tokens, both copies all-gathered
        g_row, g_row_scale = _mx_stand_in((g_row, g_row_scale), scatter)
        g_col, g_col_scale = _mx_stand_in((g_col, g_col_scale), scatter, tokens_last=True)
        x_col, x_col_scale = cast.wgrad_operand()
        dx = _mx_gemm(g_row, g_row_scale, w_col, w_col_scale, grad.dtype)  # [M', K]
        dw = _mx_gemm(g_col, g_col_scale, x_col, x_col_scale, grad.dtype)  # [N, K]
        if cast.gather > 1:
            dx = _stand_in(dx, dx.shape[0] // cast.gather)  # its reduce-scatter
        db = g2.sum(0) if ctx.has_bias else None
        return dx.reshape(cast.shape), dw, db, None, None


def group_cast(h: Tensor, recipe: str, tn_only: bool) -> tuple[Tensor, ...]:
    """A grouped layer's input h [G, R, K] (each local expert's rows) quantized for its FP8
    GEMMs, each expert's rows scaled by their own amax: (row-wise data, column-wise data or
    empty, inverse scales [G]); under MXFP8 by blocks (``_mx_quantize``: row-wise data and
    scales, column-wise data and scales). One cast for all G experts (TE's
    ``split_quantize``, one multi-tensor kernel)."""
    if recipe in MX_RECIPES:
        return _mx_quantize(h.detach(), True, True)
    return _cast(h.detach(), recipe, False, True, tn_only)


class _Fp8GroupedFn(torch.autograd.Function):
    """Each local expert's rows times its weight, h [G, R, K] @ w [G, K, N] (+ b [G, 1, N]),
    with FP8 GEMMs as TransformerEngine's GroupedLinear runs a mixture of experts' layers under
    Megatron-Core (transformer_engine/pytorch/module/grouped_linear.py; Megatron's
    TEGroupedMLP), on ``cast`` (h's ``group_cast``):

    * forward: the input cast once for all the experts (row-wise, and on TN GPUs column-wise),
      each expert's weight quantized (module state cached for the step's micro-batches, as a
      dense layer's), one grouped FP8 GEMM;
    * backward: the output gradient cast in E5M2 (row-wise, and column-wise on TN GPUs), a
      grouped data-gradient and a grouped weight-gradient GEMM;
    * kept: the input's column-wise FP8 copy (TN GPUs) or its row-wise data (any layout).

    The grouped GEMM is one op of G GEMMs here (costs.py charges it as a batched GEMM, as it
    does the BF16 experts' ``bmm``); on Hopper TE runs it as G cuBLAS GEMMs over a few streams.
    A bias is added in the GEMM (TE's epilogue) and its gradient summed beside the cast
    (gpt-oss's experts; a separate reduction here, where TE fuses it)."""

    @staticmethod
    def forward(ctx, h, weight, bias, recipe: str, tn_only: bool, cast):
        hq, ht, sh = cast
        wq, wt, sw = _cast(weight, recipe, False, True, tn_only, weight=True)
        y = _gemm(hq, wq, sh, sw, False, False, h.dtype, bias)  # [G, R, N]
        ctx.save_for_backward(ht if tn_only else hq, sh)
        ctx.weight_fp8 = (wt if tn_only else wq, sw)  # module state, as Fp8Linear's
        ctx.recipe, ctx.tn_only, ctx.has_bias = recipe, tn_only, bias is not None
        return y

    @staticmethod
    def backward(ctx, grad):
        keep, sh = ctx.saved_tensors
        w, sw = ctx.weight_fp8  # W's column-wise copy [G, N, K] on TN GPUs, else W [G, K, N]
        gq, gt, sg = _cast(grad.contiguous(), ctx.recipe, True, True, ctx.tn_only)
        if ctx.tn_only:  # Hopper: each GEMM on the transposed copies the casts wrote
            dh = _gemm(gq, w, sg, sw, False, False, grad.dtype)  # [G, R, K]
            dw = _gemm(keep, gt, sh, sg, False, True, grad.dtype)  # [G, K, N]
        else:  # Blackwell: G W^T and H^T G from the row-wise data
            dh = _gemm(gq, w, sg, sw, False, True, grad.dtype)
            dw = _gemm(keep, gq, sh, sg, True, False, grad.dtype)
        db = grad.sum(1, keepdim=True) if ctx.has_bias else None
        return dh, dw, db, None, None, None


class _MxGroupedFn(torch.autograd.Function):
    """``_Fp8GroupedFn`` under MXFP8 (``_MxLinearFn``'s casts and GEMMs, per expert): h's
    cast both ways once for the experts, each expert's weight cast both ways once a step,
    the gradient cast both ways; the data gradient from the gradient's row-wise and the
    weight's column-wise copies, the weight gradient from the two column-wise ones; kept:
    h's column-wise copy. Each expert's rows are a multiple of 32 (Megatron pads them:
    ``get_fp8_align_size``, 32 for MXFP8)."""

    @staticmethod
    def forward(ctx, h, weight, bias, cast):
        h_row, h_row_scale, h_col, h_col_scale = cast
        # W [G, K, N] blocked along K for the forward ([G, N, K]) and along N for the data
        # gradient ([G, K, N])
        w_row, w_row_scale, w_col, w_col_scale = _mx_weight_quantize(
            weight.transpose(-2, -1), True, True)
        y = _mx_gemm(h_row, h_row_scale, w_row, w_row_scale, h.dtype, bias)  # [G, R, N]
        ctx.save_for_backward(h_col, h_col_scale)
        ctx.weight_fp8 = (w_col, w_col_scale)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, grad):
        h_col, h_col_scale = ctx.saved_tensors
        w_col, w_col_scale = ctx.weight_fp8
        g_row, g_row_scale, g_col, g_col_scale = _mx_quantize(grad.contiguous(), True, True)
        dh = _mx_gemm(g_row, g_row_scale, w_col, w_col_scale, grad.dtype)  # [G, R, K]
        dw = _mx_gemm(h_col, h_col_scale, g_col, g_col_scale, grad.dtype)  # [G, K, N]
        db = grad.sum(1, keepdim=True) if ctx.has_bias else None
        return dh, dw, db, None


def grouped_fp8(h: Tensor, weight: Tensor, bias: Tensor | None, recipe: str,
                tn_only: bool) -> Tensor:
    """h [G, R, K] @ weight [G, K, N] (+ bias [G, 1, N]) in FP8 (``_Fp8GroupedFn``, or
    ``_MxGroupedFn`` under MXFP8), on h's ``group_cast``. TransformerEngine's sizes: K and N
    multiples of ``align(recipe)``, and each expert's rows too (Megatron pads them:
    ``GPTConfig.expert_rows``)."""
    if recipe not in TE_RECIPES:
        raise ValueError(f"FP8 recipe must be one of {', '.join(TE_RECIPES)}, got "
                         f"{recipe!r}")
    if any(n % align(recipe) for n in (*h.shape[1:], weight.shape[-1])):
        raise ValueError(f"a grouped FP8 layer needs its rows and sizes to be multiples of "
                         f"{align(recipe)} (TransformerEngine refuses others), got "
                         f"{h.shape[1]} rows of {weight.shape[1]} x {weight.shape[2]}")
    if recipe in MX_RECIPES:
        if tn_only:
            raise ValueError("MXFP8 grouped layers are modelled on Blackwell (tn_only False)")
        return _MxGroupedFn.apply(h, weight, bias, group_cast(h, recipe, tn_only))
    return _Fp8GroupedFn.apply(h, weight, bias, recipe, tn_only, group_cast(h, recipe, tn_only))


def shared_cast(layer: nn.Module, x: Tensor):
    """x's cast for the group of layers that ``layer`` starts: None unless it is an FP8 layer
    (this module's, or torchao's of models/float8.py: each has a ``cast`` method)."""
    cast = getattr(layer, "cast", None)
    return cast(x) if callable(cast) else None


def call(layer: nn.Module, x: Tensor, cast) -> Tensor:
    """``layer(x)``, on x's shared cast where there is one."""
    return layer(x) if cast is None else layer(x, cast)


def fp8_weight_bytes(model: nn.Module) -> int:
    """Bytes of the FP8 weight copies TE keeps through a step, one byte an element: row-wise
    and column-wise on TN GPUs, row-wise only where FP8 GEMMs take any layout, both with a
    scale byte for each 32 elements under MXFP8, for every FP8 layer (its weight shared with
    no other layer) and every grouped FP8 layer's experts (a module's ``fp8_weights()``:
    models/gpt.py's MoE)."""
    def per_element(recipe: str, tn_only: bool) -> float:
        return 2 * (1 + 1 / MX_BLOCK) if recipe in MX_RECIPES else 2 if tn_only else 1

    dense = sum(per_element(m.recipe, m.tn_only) * m.weight.numel() for m in model.modules()
                if isinstance(m, Fp8Linear))
    grouped = sum(per_element(m.fp8, m.tn_only) * sum(w.numel() for w in m.fp8_weights())
                  for m in model.modules() if callable(getattr(m, "fp8_weights", None)))
    return round(dense + grouped)
