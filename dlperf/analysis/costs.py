"""Pure cost rules: OpRecord -> Cost (FLOPs, minimum bytes, GEMM M/N/K per pass).

Conventions (performance guide 2.1 and its "Understanding Performance" background):

* FLOPs count 2 per multiply-add; one operation per output element for elementwise ops
  (ReLU: 1 op per element, so 1 / (2 + 2) bytes = 0.25 FLOP/B in FP16).
* Minimum bytes = every input tensor read once + every output written once, at its dtype size.
  Real kernels can move more (re-reads, workspaces) or less (L2 hits); this is the guide's bound.
* GEMM mapping (guide's linear/convolution tables, column-major like cuBLAS):
  linear forward M=outputs, N=batch, K=inputs; activation gradient M=inputs, N=batch,
  K=outputs; weight gradient M=inputs, N=outputs, K=batch. Convolution as implicit GEMM:
  fprop M=N*P*Q, N=K, K=C*R*S; dgrad M=N*H*W, N=C, K=K*R*S; wgrad M=K, N=C*R*S, K=N*P*Q.
  Grouped convolutions are ``groups`` independent GEMMs (GemmShape.batch) with C and K divided
  by ``groups``. All three passes do the same number of multiply-adds as fprop (strided dgrad
  included), which is also how torch.utils.flop_counter counts them.

One module of ~420 lines because it is one table: a rule per kind of op, each small.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from dlperf.analysis.capture import OpRecord, TensorMeta
from dlperf.analysis.gemm import GemmShape

# Ops that launch no kernel and move no data (metadata, allocation without initialisation).
FREE_OPS = frozenset({
    "detach", "view", "_unsafe_view", "t", "transpose", "permute", "expand", "as_strided",
    "slice", "select", "unsqueeze", "squeeze", "alias", "_reshape_alias", "empty", "empty_like",
    "empty_strided", "new_empty", "new_empty_strided", "as_strided_", "split", "split_with_sizes", "unbind",
    "chunk", "narrow", "lift_fresh", "diagonal", "unfold", "view_as_real", "view_as_complex",
    "_local_scalar_dense", "sym_size", "sym_stride", "sym_numel", "set_", "resize_",
    "_to_copy_noop", "lift_fresh_copy", "is_same_size", "_has_compatible_shallow_copy_type"})

# The free ops that allocate (their output holds no one's data yet); the others are views.
ALLOCATIONS = frozenset({"empty", "empty_like", "empty_strided", "new_empty",
                         "new_empty_strided"})

# Kernels that only write their output (fills, index ranges, masks).
FILL_OPS = frozenset({"zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "fill_",
                      "zero_", "fill", "arange", "scalar_tensor", "new_zeros", "new_ones",
                      "new_full", "tril", "triu", "eye", "linspace", "rand", "randn", "randint",
                      "rand_like", "randn_like", "bernoulli_", "uniform_", "normal_"})

# Copies: flagged as layout transposes when the element order in memory changes.
COPY_OPS = frozenset({"_to_copy", "copy_", "clone", "contiguous", "_copy_from", "copy",
                      "_to_copy_", "to"})

# Memory-bound ops that are not tagged pointwise, with FLOPs per element of their largest tensor
# (our estimate of the arithmetic; they are memory-bound at any of these values, guide 2.1).
MEMORY_OPS_FLOPS_PER_ELEMENT = {
    # activations PyTorch does not tag pointwise (their in-place forms and backwards)
    "hardswish": 4, "hardswish_": 4, "hardswish_backward": 4, "hardsigmoid": 3,
    "hardsigmoid_": 3, "hardsigmoid_backward": 2, "gelu": 8, "gelu_": 8, "leaky_relu_backward": 2,
    "elu_backward": 3, "hardtanh_backward": 2, "softplus_backward": 4, "mish_backward": 8,
    "log_sigmoid_backward": 4, "log_sigmoid_forward": 4, "prelu_backward": 3,
    "_prelu_kernel": 2, "_prelu_kernel_backward": 3, "rrelu_with_noise_backward": 2,
    # normalisation: statistics (sum, sum of squares) + scale and shift
    "native_batch_norm": 5, "_native_batch_norm_legit": 5, "_native_batch_norm_legit_functional": 5,
    "_native_batch_norm_legit_no_training": 2, "cudnn_batch_norm": 5,
    "native_batch_norm_backward": 8, "cudnn_batch_norm_backward": 8,
    "batch_norm_backward": 8, "native_layer_norm": 5, "native_layer_norm_backward": 8,
    "native_group_norm": 5, "native_group_norm_backward": 8, "_fused_rms_norm": 4,
    "_fused_rms_norm_backward": 6,
    # the fused kernels of Megatron-Core's Llama block (models/fused.py): RMSNorm as above;
    # silu(gate) x up, per output element sigmoid's exp, add and reciprocal and two multiplies
    # (its backward about 8); the rotary embedding, two multiplies and an add an element
    "te_rms_norm": 4, "te_rms_norm_backward": 6, "te_swiglu": 5, "te_swiglu_backward": 8,
    "te_rope": 3, "te_rope_backward": 3,
    # gpt-oss's gated activation (models/fused.py): two clamps, a scale, sigmoid, two
    # multiplies and the offset; the backward's two masked derivatives
    "te_clamped_geglu": 7, "te_clamped_geglu_backward": 12,
    # a mixture of experts' weighted gated activations (models/fused.py), one multiply more
    # each way and the weights' gradient (a sum over the row); the fused permute moves rows,
    # the unpermute adds each token's copies
    "te_weighted_swiglu": 6, "te_weighted_swiglu_backward": 11,
    "te_weighted_clamped_geglu": 8, "te_weighted_clamped_geglu_backward": 15,
    "moe_permute": 0, "moe_unpermute": 1,
    # TransformerEngine's FP8 casts (models/fp8.py): the amax, |x| and a max an element; the
    # cast (-transpose), a scale multiply and a conversion an element, whatever it writes
    # (row-wise, column-wise or both); the transpose of FP8 data moves bytes only
    "fp8_amax": 2, "fp8_weight_amax": 2, "fp8_quantize": 2, "fp8_weight_quantize": 2,
    "fp8_transpose": 0,
    # MXFP8's (models/fp8.py): each block's amax and power-of-two scale beside the cast, |x|,
    # a max, a multiply and a conversion an element for each copy written (the kernel writes
    # the row-wise and the column-wise copy from one read)
    "fp8_mx_quantize": 4, "fp8_mx_weight_quantize": 4,
    # softmax family: max, subtract, exp, sum, divide
    "_softmax": 5, "_log_softmax": 5, "_safe_softmax": 5, "_softmax_backward_data": 3,
    "_log_softmax_backward_data": 3,
    # reductions: one op per input element
    "sum": 1, "mean": 1, "amax": 1, "amin": 1, "max": 1, "min": 1, "var": 2, "var_mean": 3,
    "std": 2, "norm": 2, "linalg_vector_norm": 2, "prod": 1, "argmax": 1, "argmin": 1,
    "any": 1, "all": 1, "logsumexp": 3, "cumsum": 1,
    # integer division (a mixture of experts' token of each routed copy: models/gpt.py, MoE),
    # which PyTorch does not tag pointwise
    "floor_divide": 1,
    # losses; the fused cross-entropy (models/losses.py), one pass each way over the logits:
    # the forward's max, exp and sum an element, the backward's subtract, exp and scale
    "mse_loss": 3, "mse_loss_backward": 3,
    "fused_cross_entropy": 3, "fused_cross_entropy_backward": 3,
    "binary_cross_entropy_with_logits": 4,
    # pooling (window size handled separately for max/avg pool)
    "adaptive_avg_pool2d": 1, "_adaptive_avg_pool2d": 1, "_adaptive_avg_pool2d_backward": 1,
    "adaptive_avg_pool3d": 1, "_adaptive_avg_pool3d": 1,
    "max_pool2d_with_indices_backward": 1, "avg_pool2d_backward": 1,
    "upsample_nearest2d": 1, "upsample_bilinear2d": 8, "upsample_nearest2d_backward": 1,
    "upsample_bilinear2d_backward": 8,
    # data movement with indexing
    "cat": 0, "stack": 0, "embedding": 0, "embedding_dense_backward": 1, "index": 0,
    "index_select": 0, "gather": 0, "scatter": 0, "scatter_add": 1, "index_add": 1,
    "index_put": 0, "index_put_": 0, "_index_put_impl_": 0, "constant_pad_nd": 0, "roll": 0,
    "flip": 0, "repeat": 0, "masked_fill": 1, "masked_fill_": 1, "native_dropout": 2,
    "native_dropout_backward": 1, "topk": 2, "sort": 4, "one_hot": 1, "_unsafe_index": 0,
    "select_backward": 0, "slice_backward": 0, "select_scatter": 0, "slice_scatter": 0,
    "col2im": 1, "im2col": 0, "pixel_shuffle": 0, "channel_shuffle": 0,
}
POOL_OPS = frozenset({"max_pool2d_with_indices", "max_pool2d", "avg_pool2d", "max_pool3d",
                      "max_pool3d_with_indices", "avg_pool3d", "max_pool1d", "avg_pool1d"})

GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "dot", "vdot",
                      "convolution", "convolution_backward", "_int_mm", "_scaled_mm",
                      "fp8_gemm", "fp8_mx_gemm"})


@dataclass(frozen=True)
class Cost:
    """The guide's view of one kernel (or fused group of kernels)."""

    module: str
    module_type: str
    op: str
    phase: str  # forward | dgrad | wgrad
    kind: str  # gemm | memory | copy | transpose | fill | fused
    flops: int
    bytes: int
    dtype: str  # element type of the math (GEMM inputs) or of the largest tensor
    gemm: GemmShape | None = None
    kernels: int = 1
    records: tuple[int, ...] = ()
    output_bytes: int = 0  # the part of `bytes` that is written (what a fusion saves re-reading)
    nhwc: bool | None = None  # convolutions: activations in channels_last (None: not a conv)
    activation_bytes: int = 0  # convolutions: activation traffic (what an NCHW transpose moves)
    # Guide 2.2: for convolutions the 16-byte rule concerns the channel counts (per group), not
    # the GEMM dims built from batch and pixels; (name, size) pairs. None: check M, N and K.
    align_dims: tuple[tuple[str, int], ...] | None = None
    groups: int = 1
    # convolutions: the shape cuDNN's Winograd algorithms take (a 2-D 3x3 filter, unit stride
    # and dilation, one group); whether they run also depends on the layout and the unit
    # (roofline.predict, hardware/efficiency.py ``winograd``)
    winograd: bool = False
    # a kernel that is other code under the same op name: "tanh" for the tanh-approximated
    # GELU (hardware/efficiency.py, ``gelu_tanh``); "foreach" or "for-loop" for an optimizer
    # step that torch.optim does not fuse (``optimizer_cost``); "" otherwise
    variant: str = ""
    # the CPU waits for the GPU to finish every kernel before this one ahead of issuing it
    # (a host synchronisation: GradScaler's ``.item()`` on found_inf before an unfused
    # optimizer step), so its issue time is not hidden behind earlier kernels
    # (roofline.step_time)
    host_sync: bool = False
    # with ``host_sync``: the entry is issued in this many equal rounds, the CPU waiting for
    # the GPU before each (a synchronisation inside a loop over tensors: BertAdam's
    # per-tensor clip_grad_norm_ under torch 1.5-1.9, ``bertadam_cost``)
    sync_rounds: int = 1
    # an optimizer step: the parameter tensors it updates (0: not an optimizer step)
    tensors: int = 0
    # fused attention: the head size of Q and K (a kernel may compute with a padded one:
    # hardware/efficiency.py, ``kernel_head_dim``); 0 otherwise
    head_dim: int = 0

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else math.inf if self.flops else 0.0

    @property
    def syncs(self) -> int:
        """The host synchronisations before and inside this entry (roofline.step_time)."""
        return self.sync_rounds if self.host_sync else 0


# ---------------------------------------------------------------- guide examples as functions
def linear_gemm(batch: int, in_features: int, out_features: int, phase: str = "forward") -> GemmShape:
    """The guide's linear-layer GEMM for each pass (column-major, cuBLAS convention)."""
    table = {"forward": (out_features, batch, in_features),
             "dgrad": (in_features, batch, out_features),
             "wgrad": (in_features, out_features, batch)}
    m, n, k = table[phase]
    return GemmShape(m, n, k)


def gemm_bytes(shape: GemmShape, itemsize: int, out_itemsize: int | None = None) -> int:
    """Minimum traffic of C = A @ B: read A (MxK) and B (KxN), write C (MxN)."""
    out_itemsize = itemsize if out_itemsize is None else out_itemsize
    return shape.batch * ((shape.m * shape.k + shape.k * shape.n) * itemsize
                          + shape.m * shape.n * out_itemsize)


def elementwise_intensity(flops_per_element: float, bytes_per_element: float) -> float:
    return flops_per_element / bytes_per_element


def conv_gemms(n: int, c: int, k: int, in_spatial: int, out_spatial: int, rs: int,
               groups: int = 1) -> dict[str, GemmShape]:
    """Implicit-GEMM shapes of a regular convolution's three passes (guide's conv table).

    n batch, c input channels, k output channels, in_spatial = H*W(*D), out_spatial = P*Q(*Z),
    rs = R*S(*T) filter taps.
    """
    cg, kg = c // groups, k // groups
    return {"forward": GemmShape(n * out_spatial, kg, cg * rs, groups),
            "dgrad": GemmShape(n * in_spatial, cg, kg * rs, groups),
            "wgrad": GemmShape(kg, cg * rs, n * out_spatial, groups)}


def conv_flops(n: int, c: int, k: int, out_spatial: int, rs: int, groups: int = 1) -> int:
    """2 x multiply-adds of a convolution pass: N*P*Q * K * (C/groups)*R*S (any of the passes)."""
    return 2 * n * out_spatial * k * (c // groups) * rs


# ---------------------------------------------------------------- rules over captured records
def _prod(xs) -> int:
    return math.prod(xs) if xs else 1


def _bytes(tensors) -> int:
    return sum(t.nbytes for t in tensors)


def _conv_geometry(x: TensorMeta, w: TensorMeta, y: TensorMeta, transposed: bool, groups: int):
    """(n, c, k, in_spatial, out_spatial, rs) of the equivalent *regular* convolution.

    A transposed convolution is the data gradient of a regular one with input and output swapped.
    """
    n = x.shape[0]
    rs = _prod(w.shape[2:])
    if not transposed:
        return n, x.shape[1], y.shape[1], _prod(x.shape[2:]), _prod(y.shape[2:]), rs
    return n, y.shape[1], x.shape[1], _prod(y.shape[2:]), _prod(x.shape[2:]), rs


def _winograd_shape(w: TensorMeta, stride, dilation, transposed: bool, groups: int) -> bool:
    """Whether a convolution has the shape of cuDNN's Winograd algorithms (WINOGRAD and
    WINOGRAD_NONFUSED, forward, data and filter gradients): a 2-D 3x3 filter, stride 1 and
    dilation 1, one group (docs/design.md, "Winograd")."""
    return (len(w.shape) == 4 and tuple(w.shape[2:]) == (3, 3) and not transposed
            and groups == 1 and all(int(s) == 1 for s in stride)
            and all(int(d) == 1 for d in dilation))


def _common(r: OpRecord) -> dict:
    return {"module": r.module, "module_type": r.module_type, "records": (r.index,)}


def _nhwc(x: TensorMeta, y: TensorMeta) -> bool | None:
    """Activations of a 2-D conv in channels_last; None for 1-D/3-D convs (no NHWC rule)."""
    if len(x.shape) != 4:
        return None
    return x.channels_last or y.channels_last


def _conv_costs(r: OpRecord) -> list[Cost]:
    if r.op == "convolution":
        x, w = r.inputs[0], r.inputs[1]
        y = r.outputs[0]
        transposed, groups = bool(r.args[6]), int(r.args[8])
        n, c, k, ins, outs, rs = _conv_geometry(x, w, y, transposed, groups)
        shapes = conv_gemms(n, c, k, ins, outs, rs, groups)
        shape = shapes["dgrad" if transposed else "forward"]
        conv = dict(align_dims=(("c_in", c // groups), ("c_out", k // groups)), groups=groups,
                    winograd=_winograd_shape(w, r.args[3], r.args[5], transposed, groups))
        return [Cost(op="convolution", phase="forward", kind="gemm", **conv,
                     flops=conv_flops(n, c, k, outs, rs, groups),
                     bytes=_bytes(r.inputs) + _bytes(r.outputs), dtype=x.dtype, gemm=shape,
                     output_bytes=_bytes(r.outputs), nhwc=_nhwc(x, y),
                     activation_bytes=x.nbytes + y.nbytes, **_common(r))]
    # convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
    #                      transposed, output_padding, groups, output_mask)
    gy, x, w = r.inputs[0], r.inputs[1], r.inputs[2]
    transposed, groups, mask = bool(r.args[7]), int(r.args[9]), tuple(r.args[10])
    n, c, k, ins, outs, rs = _conv_geometry(x, w, gy, transposed, groups)
    shapes = conv_gemms(n, c, k, ins, outs, rs, groups)
    flops = conv_flops(n, c, k, outs, rs, groups)
    nhwc = _nhwc(x, gy)
    conv = dict(align_dims=(("c_in", c // groups), ("c_out", k // groups)), groups=groups,
                winograd=_winograd_shape(w, r.args[4], r.args[6], transposed, groups))
    outputs = iter(r.outputs)
    costs = []
    if mask[0]:
        gx = next(outputs)
        costs.append(Cost(op="convolution_backward", phase="dgrad", kind="gemm", flops=flops, **conv,
                          bytes=gy.nbytes + w.nbytes + gx.nbytes, dtype=gy.dtype,
                          gemm=shapes["forward" if transposed else "dgrad"],
                          output_bytes=gx.nbytes, nhwc=nhwc,
                          activation_bytes=gy.nbytes + gx.nbytes, **_common(r)))
    if mask[1]:
        gw = next(outputs)
        costs.append(Cost(op="convolution_backward", phase="wgrad", kind="gemm", flops=flops, **conv,
                          bytes=gy.nbytes + x.nbytes + gw.nbytes, dtype=gy.dtype,
                          gemm=shapes["wgrad"], output_bytes=gw.nbytes, nhwc=nhwc,
                          activation_bytes=gy.nbytes + x.nbytes, **_common(r)))
    if len(mask) > 2 and mask[2]:
        gb = next(outputs)
        costs.append(Cost(op="convolution_backward", phase="wgrad", kind="memory",
                          flops=gy.numel, bytes=gy.nbytes + gb.nbytes, dtype=gy.dtype,
                          output_bytes=gb.nbytes, **_common(r)))
    return costs


def _matmul_cost(r: OpRecord) -> Cost:
    op = r.op
    ins = r.inputs
    if op in ("mm", "_int_mm", "_scaled_mm"):
        a, b = ins[0], ins[1]
        shape = GemmShape(b.shape[1], a.shape[0], a.shape[1])
    elif op == "fp8_gemm":  # models/fp8.py: op(a) op(b), each transposed where its flag says,
        # on matrices or on a grouped layer's G of them ([G, M, K]: a batched GEMM)
        a, b = ins[0], ins[1]
        trans_a, trans_b = r.args[4], r.args[5]
        m, k = (a.shape[-1], a.shape[-2]) if trans_a else (a.shape[-2], a.shape[-1])
        shape = GemmShape(b.shape[-2] if trans_b else b.shape[-1], m, k,
                          *a.shape[:-2])
    elif op == "fp8_mx_gemm":  # models/fp8.py: a [.., M, K] times b [.., N, K] transposed
        # (the operands' E8M0 scales are inputs 1 and 3: their bytes are read too)
        a, b = ins[0], ins[2]
        shape = GemmShape(b.shape[-2], a.shape[-2], a.shape[-1], *a.shape[:-2])
    elif op == "addmm":
        a, b = ins[1], ins[2]
        shape = GemmShape(b.shape[1], a.shape[0], a.shape[1])
    elif op == "bmm":
        a, b = ins[0], ins[1]
        shape = GemmShape(b.shape[2], a.shape[1], a.shape[2], a.shape[0])
    elif op == "baddbmm":
        a, b = ins[1], ins[2]
        shape = GemmShape(b.shape[2], a.shape[1], a.shape[2], a.shape[0])
    elif op in ("mv", "addmv"):
        a = ins[0] if op == "mv" else ins[1]
        shape = GemmShape(a.shape[0], 1, a.shape[1])
    else:  # dot, vdot
        a = ins[0]
        shape = GemmShape(1, 1, a.shape[0])
    # The pre-multiplied term of addmm/baddbmm (bias, beta*C) is read once: included in bytes.
    return Cost(op=op, phase=r.phase, kind="gemm", flops=shape.flops,
                bytes=_bytes(ins) + _bytes(r.outputs), dtype=a.dtype,
                output_bytes=_bytes(r.outputs),
                gemm=shape if shape.n > 1 and shape.m > 1 else None, **_common(r))


def _largest(r: OpRecord) -> TensorMeta | None:
    tensors = r.inputs + r.outputs
    return max(tensors, key=lambda t: t.numel) if tensors else None


def _order(t: TensorMeta) -> tuple[int, ...]:
    """Dimension order from outermost to innermost in memory (size-1 dims ignored)."""
    dims = [d for d in range(len(t.shape)) if t.shape[d] != 1]
    return tuple(sorted(dims, key=lambda d: -t.stride[d]))


def is_layout_transpose(src: TensorMeta, dst: TensorMeta) -> bool:
    """A copy that reorders elements in memory (e.g. NCHW <-> NHWC), not just a cast."""
    return src.shape == dst.shape and _order(src) != _order(dst)


def record_costs(r: OpRecord) -> list[Cost] | None:
    """Costs of one captured op: [] for free ops, None when no rule covers it (uncounted)."""
    op = r.op
    if op in FREE_OPS or r.is_view:
        return []
    if op in ("convolution", "convolution_backward"):
        return _conv_costs(r)
    if op in BANDED_OPS:
        return [_banded_cost(r)]
    if op in GEMM_OPS:
        return [_matmul_cost(r)]
    big = _largest(r)
    if big is None:
        return []
    common = dict(op=op, phase=r.phase, dtype=big.dtype, output_bytes=_bytes(r.outputs),
                  **_common(r))
    if op in FILL_OPS:
        return [Cost(kind="fill", flops=0, bytes=_bytes(r.outputs), **common)]
    if op in COPY_OPS:
        src = r.inputs[0] if r.inputs else big
        dst = r.outputs[0] if r.outputs else big
        kind = "transpose" if is_layout_transpose(src, dst) else "copy"
        return [Cost(kind=kind, flops=0, bytes=src.nbytes + dst.nbytes, **common)]
    if op in POOL_OPS:
        # max/avg pool: one op per window element per output (3x3 -> 9 ops per output element).
        window = r.args[1] if len(r.args) > 1 and isinstance(r.args[1], tuple) else (1,)
        out = r.outputs[0]
        return [Cost(kind="memory", flops=out.numel * _prod(window),
                     bytes=_bytes(r.inputs) + _bytes(r.outputs), **common)]
    if r.pointwise:
        out = r.outputs[0] if r.outputs else big
        variant = "tanh" if dict(r.options).get("approximate") == "tanh" else ""
        return [Cost(kind="memory", flops=out.numel,
                     bytes=_bytes(r.inputs) + _bytes(r.outputs), variant=variant, **common)]
    if op in NLL_OPS:
        return [_nll_cost(r, common)]
    if op in MEMORY_OPS_FLOPS_PER_ELEMENT:
        return [Cost(kind="memory", flops=MEMORY_OPS_FLOPS_PER_ELEMENT[op] * big.numel,
                     bytes=_bytes(r.inputs) + _bytes(r.outputs), **common)]
    return None


NLL_OPS = frozenset({"nll_loss_forward", "nll_loss2d_forward", "nll_loss_backward",
                     "nll_loss2d_backward"})


def _nll_cost(r: OpRecord, common: dict) -> Cost:
    """The negative log-likelihood after a log-softmax, as CUDA's kernels move it.

    The forward gathers one log-probability per target (it does not read the N x C input: at a
    language model's vocabulary that read was 13 GB a step for MPT-125M at 65,536 tokens, half
    the cost dlperf charged the loss); the backward zero-fills the N x C gradient, then writes
    -weight at each target (two kernels; the log-probabilities are not read either)."""
    target = next((t for t in r.inputs if t.dtype in ("int64", "int32")), None)
    n = target.numel if target is not None else 1
    logp = max((t for t in r.inputs if t.dtype not in ("int64", "int32")),
               key=lambda t: t.numel)
    elem = logp.nbytes // max(logp.numel, 1)
    index_bytes = target.nbytes if target is not None else 0
    if r.op.endswith("_forward"):
        nbytes, kernels = index_bytes + n * elem + _bytes(r.outputs), 1
    else:
        nbytes, kernels = _bytes(r.outputs) + index_bytes + n * elem, 2
    return Cost(kind="memory", flops=n, bytes=nbytes, kernels=kernels, **common)


# The tile a flash kernel computes scores in, queries by keys: FlashAttention-2 and -3 and
# cuDNN's fused attention pick tiles of 64 to 192 by head size and GPU; 128 is taken for all.
# A tile any of whose scores a sliding window reaches is computed whole (masked inside).
ATTENTION_TILE = 128


def window_fraction(lq: int, lk: int, window: int, tile: int = ATTENTION_TILE) -> float:
    """The share of the lq x lk score matrix a causal flash kernel computes when each query
    attends only to itself and the ``window`` - 1 keys before it (queries are the last lq of
    the lk positions): whole ``tile`` x ``tile`` tiles, each query tile from the key tile
    holding its first query's earliest key to the one holding its last query's own position.
    E.g. 4,096 tokens, window 128: 1 tile for the first query tile, 2 for each of the other
    31, so 63 of 32 x 32 = 0.0615 (the scores the window needs are 0.031 of them)."""
    offset, n_q, n_k = lk - lq, -(-lq // tile), -(-lk // tile)
    computed = 0
    for i in range(n_q):
        first, last = i * tile + offset, min(lq, (i + 1) * tile) - 1 + offset
        computed += last // tile - max(0, first - window + 1) // tile + 1
    return computed / (n_q * n_k)


# Flash attention's backward recomputes the scores and runs five matmuls (S = QK^T, dP = dO V^T,
# dV = P^T dO, dQ = dS K, dK = dS^T Q) against the forward's two.
ATTENTION_BACKWARD_MATMULS = 5


def attention_cost(info: dict, phase: str, module: str, module_type: str,
                   records: tuple[int, ...] = ()) -> Cost:
    """scaled_dot_product_attention as one fused (flash) kernel per pass.

    Forward: S = Q K^T (2*B*H*Lq*Lk*D FLOPs) and O = P V (2*B*H*Lq*Lk*Dv); the softmax of the
    Lq x Lk scores stays on chip, so traffic is Q, K, V read and O (+ fp32 log-sum-exp) written.
    A causal mask lets the kernel skip the upper triangle: half the matmul work when Lq == Lk;
    a sliding window (``info["window"]``) leaves it only the tiles the window reaches.
    Backward: five matmuls; reads Q, K, V, O, dO, LSE and writes dQ, dK, dV.
    """
    q, k, v = info["q"], info["k"], info["v"]
    itemsize = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}.get(info["dtype"], 4)
    batch_heads = _prod(q[:-2])
    lq, lk, d, dv = q[-2], k[-2], q[-1], v[-1]
    window = info.get("window") or 0
    # (a window's tiles, models/banded.py; without one, half the causal square)
    fraction = (window_fraction(lq, lk, window) if window and info["causal"]
                else 0.5 if info["causal"] and lq == lk else 1.0)
    scores_flops = 2 * batch_heads * lq * lk * d * fraction
    pv_flops = 2 * batch_heads * lq * lk * dv * fraction
    q_b, k_b, v_b = (_prod(t) * itemsize for t in (q, k, v))
    o_b = batch_heads * lq * dv * itemsize
    lse_b = batch_heads * lq * 4
    if phase == "forward":
        flops, nbytes, op = scores_flops + pv_flops, q_b + k_b + v_b + o_b + lse_b, "attention"
        written = o_b + lse_b
    else:
        flops = (scores_flops + pv_flops) * ATTENTION_BACKWARD_MATMULS / 2
        nbytes = 2 * (q_b + k_b + v_b) + 2 * o_b + lse_b
        op, written = "attention_backward", q_b + k_b + v_b
    return Cost(module=module, module_type=module_type, op=op, phase=phase, kind="fused",
                flops=int(flops), bytes=int(nbytes), dtype=info["dtype"], records=records,
                output_bytes=int(written), head_dim=int(max(d, dv)))


# models/banded.py's attention with a sliding window and sinks, forward and backward
BANDED_OPS = frozenset({"banded_attention", "banded_attention_backward"})


def _banded_cost(r: OpRecord) -> Cost:
    """One fused attention kernel (``attention_cost``) of models/banded.py: the forward's
    inputs are (q, k, v, window, sinks, scale), the backward's (grad, q, k, v, out, lse,
    window, sinks, scale)."""
    forward = r.op == "banded_attention"
    q, k, v = r.inputs[0:3] if forward else r.inputs[1:4]
    info = {"q": q.shape, "k": k.shape, "v": v.shape, "dtype": q.dtype, "causal": True,
            "window": r.args[3] if forward else r.args[6]}
    return attention_cost(info, "forward" if forward else "dgrad", r.module, r.module_type,
                          (r.index,))


def all_costs(records: list[OpRecord], regions: dict | None = None
              ) -> tuple[list[Cost], dict[str, int]]:
    """Costs of a whole capture, fused regions costed as one kernel per pass; plus the
    {op: count} of uncounted ops (no rule: listed, never silently dropped)."""
    regions = regions or {}
    costs: list[Cost] = []
    uncounted: dict[str, int] = {}
    grouped: dict[tuple[str, bool], list[OpRecord]] = {}
    for r in records:
        if r.region is not None and r.region in regions:
            grouped.setdefault((r.region, r.phase == "forward"), []).append(r)
            continue
        found = record_costs(r)
        if found is None:
            uncounted[r.op] = uncounted.get(r.op, 0) + 1
        else:
            costs.extend(found)
    for (region, forward), group in grouped.items():
        costs.append(attention_cost(regions[region], "forward" if forward else "dgrad",
                                    group[0].module, group[0].module_type,
                                    tuple(r.index for r in group)))
    costs.sort(key=lambda c: c.records[0] if c.records else 0)  # execution order
    return costs, uncounted


# Optimizer step traffic per parameter, in bytes of fp32 state (the update is memory-bound).
# Fused (torch.optim's ``fused=True``, apex's FusedSGD/FusedAdam): one pass over each tensor.
# SGD with momentum reads param, grad, momentum and writes param, momentum (5 x 4 B);
# AdamW reads param, grad, exp_avg, exp_avg_sq and writes param and both moments (7 x 4 B).
OPTIMIZER_BYTES_PER_PARAM = {"sgd": 20, "adamw": 28}
OPTIMIZER_FLOPS_PER_PARAM = {"sgd": 4, "adamw": 12}
# How torch.optim runs the update: ``fused=True``; ``foreach`` (torch's default on CUDA since
# 2.0: one _foreach_* op per step of the formula over all tensors); ``for-loop``
# (``foreach=False``, and every release before 2.0: the same ops, tensor by tensor).
OPTIMIZER_IMPLS = ("fused", "foreach", "for-loop", "bertadam", "bertadam-sync")
# The unfused formula, op by op, as torch/optim/sgd.py and adamw's _single_tensor_adam /
# _multi_tensor_adam (torch 2.x; 1.x's for-loops are the same ops) run it; each op reads and
# writes whole tensors (tensors touched, reads + writes):
#   SGD, weight decay and momentum: g' = g + wd*p (3), buf *= m (2), buf += g' (3), p -= lr*buf (3)
#   AdamW: p *= 1 - lr*wd (2), m.lerp_(g) (3), v *= b2 (2), v.addcmul_(g, g) (3), s = v.sqrt()
#   (2), s /= bc2 (2), s += eps (2), p.addcdiv_(m, s) (4)
# tests/test_optimizer_costs.py counts them by running torch's own optimizers.
UNFUSED_OPS = {"sgd": 4, "adamw": 8}
UNFUSED_BYTES_PER_PARAM = {"sgd": 11 * 4, "adamw": 20 * 4}
# Fused/foreach optimizers process tensors in chunks (multi_tensor_apply): kernels per this many.
TENSORS_PER_OPTIMIZER_KERNEL = 64
# ... and at most this many elements per launch (multi_tensor_apply: 320 blocks of 65,536)
ELEMENTS_PER_OPTIMIZER_KERNEL = 320 * 65536


# ``bertadam``: NVIDIA DeepLearningExamples' BERT fine-tuning update in FP32 (PyTorch/
# LanguageModeling/BERT run_squad.py without --fp16/--amp, every commit from 2019 to 2022:
# optimization.BertAdam; docs/design.md, "BertAdam"), as run_squad.py runs it:
#  1. its GradientClipper: apex's multi_tensor_l2norm over every gradient (reads them once,
#     4 B a parameter), then ``total_norm.item()``: the CPU waits for the backward to end
#     before it issues the update, so none of the update's issue time hides behind it;
#  2. BertAdam.step, a Python loop over the tensors that for each one calls
#     torch.nn.utils.clip_grad_norm_(p, 1.0) and then runs Adam op by op (no bias correction,
#     weight decay added to the update):
#       m.mul_(b1) (2), m.add_(g) (3), v.mul_(b2) (2), v.addcmul_(g, g) (3), s = v.sqrt() (2),
#       s + eps (2), u = m / s (3), [t = wd * p (2), u += t (3)], u * lr (2), -u (2),
#       p.add_(-u) (3): 12 kernels and 29 tensor passes with weight decay, 10 and 24 without
#       (run_squad.py's no_decay list: biases and LayerNorm, i.e. the one-dimensional tensors).
# clip_grad_norm_ of one tensor: torch 1.10 and later (PR #61042 removed its synchronisations):
# norm, stack, norm, + eps, max_norm / x (reciprocal, mul), clamp, grad.mul_ (8 kernels; reads
# the gradient for the norm, reads and writes it for the multiply: 3 passes). Torch 1.5.1-1.9
# (``bertadam-sync``): norm, stack, norm, + eps, reciprocal, mul, ``clip_coef < 1`` and its
# copy to the host (8 launches; 1 pass), then ``if clip_coef < 1`` waits for the GPU: one host
# synchronisation per tensor (pytorch issue #60691), so each tensor's launches start with the
# GPU idle; the multiply runs only when that tensor's norm exceeds 1.0, taken here as never.
BERTADAM_OPS = {True: 12, False: 10}  # kernels of the Adam part, with / without weight decay
BERTADAM_PASSES = {True: 29, False: 24}  # tensor passes (reads + writes) of the Adam part
BERTADAM_CLIP_OPS = 8  # clip_grad_norm_ of one tensor, either torch
BERTADAM_CLIP_PASSES = {"bertadam": 3, "bertadam-sync": 1}
BERTADAM_CLIP_WRITES = {"bertadam": 1, "bertadam-sync": 0}
GRADIENT_CLIPPER_PASSES = 1  # run_squad's GradientClipper: one read of every gradient


def multi_tensor_kernels(num_params: int, num_tensors: int) -> int:
    """Launches of one multi_tensor_apply op (a fused optimizer step, a _foreach_* op, AMP's
    unscale): a new launch every TENSORS_PER_OPTIMIZER_KERNEL tensors or
    ELEMENTS_PER_OPTIMIZER_KERNEL elements, whichever comes first."""
    return max(1, math.ceil(num_tensors / TENSORS_PER_OPTIMIZER_KERNEL),
               math.ceil(num_params / ELEMENTS_PER_OPTIMIZER_KERNEL))


def bertadam_cost(num_params: int, num_tensors: int, decayed: tuple[int, int],
                  impl: str = "bertadam") -> Cost:
    """DeepLearningExamples' FP32 BERT fine-tuning update (run_squad.py's GradientClipper, then
    optimization.BertAdam: see BERTADAM_OPS). ``decayed``: (tensors, parameters) with weight
    decay; the rest skip two of its ops. The CPU waits for the GPU before it (the clipper's
    ``.item()``); under torch 1.5.1-1.9 (``bertadam-sync``) once more before each tensor."""
    tensors_decayed, params_decayed = decayed
    if not (0 <= tensors_decayed <= num_tensors and 0 <= params_decayed <= num_params):
        raise ValueError(f"decayed {decayed}: at most ({num_tensors}, {num_params})")
    passes = (BERTADAM_PASSES[True] * params_decayed
              + BERTADAM_PASSES[False] * (num_params - params_decayed)
              + (BERTADAM_CLIP_PASSES[impl] + GRADIENT_CLIPPER_PASSES) * num_params)
    # each op writes one tensor: the Adam part's, and the clip's multiply (torch 1.10 and later)
    written = (BERTADAM_OPS[True] * params_decayed
               + BERTADAM_OPS[False] * (num_params - params_decayed)
               + BERTADAM_CLIP_WRITES[impl] * num_params)
    kernels = (BERTADAM_OPS[True] * tensors_decayed
               + BERTADAM_OPS[False] * (num_tensors - tensors_decayed)
               + BERTADAM_CLIP_OPS * num_tensors + multi_tensor_kernels(num_params, num_tensors))
    return Cost(module="(optimizer)", module_type="adamw", op="adamw_step", phase="optimizer",
                kind="memory", flops=OPTIMIZER_FLOPS_PER_PARAM["adamw"] * num_params,
                bytes=4 * passes, dtype="fp32", kernels=kernels,
                output_bytes=4 * written, variant=impl, host_sync=True,
                sync_rounds=num_tensors + 1 if impl == "bertadam-sync" else 1,
                tensors=num_tensors)


def optimizer_cost(num_params: int, num_tensors: int, optimizer: str,
                   element_bytes: int = 4, impl: str = "fused",
                   decayed: tuple[int, int] | None = None) -> Cost:
    """One training step's parameter update as ``impl`` runs it (OPTIMIZER_IMPLS). The byte
    tables are for fp32 parameters and state; a model cast to half (``element_bytes`` 2) moves
    half that. Under fp16's GradScaler: ``scaled_optimizer``. ``decayed``: for the BertAdam
    impls, the (tensors, parameters) with weight decay (``bertadam_cost``; default: all)."""
    if impl not in OPTIMIZER_IMPLS:
        raise ValueError(f"optimizer implementation {impl!r}: use one of "
                         f"{', '.join(OPTIMIZER_IMPLS)}")
    if impl.startswith("bertadam"):
        if optimizer != "adamw" or element_bytes != 4:
            raise ValueError(f"{impl}: BertAdam is an FP32 Adam (optimizer adamw, fp32 state), "
                             f"not {optimizer} with {element_bytes}-byte state")
        return bertadam_cost(num_params, num_tensors, decayed or (num_tensors, num_params),
                             impl)
    per_param = (OPTIMIZER_BYTES_PER_PARAM if impl == "fused" else UNFUSED_BYTES_PER_PARAM)
    nbytes = per_param[optimizer] * num_params * element_bytes // 4
    launches = multi_tensor_kernels(num_params, num_tensors)
    kernels = (launches if impl == "fused" else
               UNFUSED_OPS[optimizer] * (launches if impl == "foreach" else max(1, num_tensors)))
    written = (2 if optimizer == "sgd" else 3) if impl == "fused" else UNFUSED_OPS[optimizer]
    touched = per_param[optimizer] // 4
    return Cost(module="(optimizer)", module_type=optimizer, op=f"{optimizer}_step",
                phase="optimizer", kind="memory",
                flops=OPTIMIZER_FLOPS_PER_PARAM[optimizer] * num_params,
                bytes=nbytes, dtype="fp32" if element_bytes == 4 else "fp16",
                kernels=kernels, output_bytes=nbytes * written // touched,
                variant="" if impl == "fused" else impl, tensors=num_tensors)


def grad_scaler_cost(num_params: int, launches: int) -> Cost:
    """torch.amp.GradScaler's work in an fp16 mixed-precision step (fp16 needs loss scaling;
    bf16 does not): ``unscale_`` (or, for a fused optimizer, the inf check) multiplies every
    fp32 gradient by 1/scale and flags infs, one multi-tensor pass (read and write: 8 B per
    parameter), and ``update`` adjusts the scale (one tiny kernel). For an unfused optimizer
    ``step`` then reads the inf flag with ``.item()`` before calling it (torch/amp/
    grad_scaler.py ``_maybe_opt_step``): the optimizer step that follows carries
    ``host_sync``. ``launches``: the unscale's, ``multi_tensor_kernels`` of the gradients."""
    return Cost(module="(optimizer)", module_type="GradScaler", op="amp_unscale",
                phase="optimizer", kind="memory", flops=num_params, bytes=8 * num_params,
                dtype="fp32", kernels=launches + 1, output_bytes=4 * num_params)


def _update_shape(opt: Cost) -> tuple[int, int]:
    """(parameters, launches of one multi-tensor pass over them) of an ``optimizer_cost``."""
    n = opt.flops // OPTIMIZER_FLOPS_PER_PARAM[opt.module_type]
    return n, multi_tensor_kernels(n, opt.tensors)


def scaled_optimizer(opt: Cost) -> tuple[Cost, Cost]:
    """``opt`` (an ``optimizer_cost``) as an fp16 step runs it under GradScaler: the scaler's
    unscale and update (``grad_scaler_cost``), then the step, which the CPU issues only after
    reading the inf flag unless the optimizer is fused (it takes the flag on the GPU)."""
    n, launches = _update_shape(opt)
    return grad_scaler_cost(n, launches), dataclasses.replace(
        opt, host_sync=bool(opt.variant) or opt.host_sync)


def fused_optimizer(opt: Cost) -> Cost:
    """``opt`` as torch.optim's ``fused=True`` runs it: one pass over every tensor, a launch
    per chunk, no host synchronisation (the fused kernels read GradScaler's flag themselves)."""
    n, launches = _update_shape(opt)
    element_bytes = 4 if opt.dtype == "fp32" else 2
    nbytes = OPTIMIZER_BYTES_PER_PARAM[opt.module_type] * n * element_bytes // 4
    return dataclasses.replace(opt, bytes=nbytes, kernels=launches, variant="", host_sync=False,
                               sync_rounds=1,
                               output_bytes=nbytes * (2 if opt.module_type == "sgd" else 3)
                               // (OPTIMIZER_BYTES_PER_PARAM[opt.module_type] // 4))


def spread_costs(costs: list[Cost], ops, micro_batches: int) -> list[Cost]:
    """``costs`` with the kernels named in ``ops`` spread over ``micro_batches``: work a step
    does once (Megatron-Core's FP8 weight casts, in its first micro-batch) charged to each
    micro-batch as 1/micro_batches of its FLOPs and bytes, so a step of that many micro-batches
    carries it once. The kernel count stays whole: the per-launch cost is over-counted by a
    few microseconds a layer a micro-batch."""
    if micro_batches < 1:
        raise ValueError(f"micro-batches must be at least 1, got {micro_batches}")
    return [dataclasses.replace(c, flops=c.flops // micro_batches,
                                bytes=c.bytes // micro_batches,
                                output_bytes=c.output_bytes // micro_batches)
            if c.op in ops else c for c in costs]


def share_costs(costs: list[Cost], ops, share: float) -> list[Cost]:
    """``costs`` with the kernels named in ``ops`` charged ``share`` of their FLOPs and bytes
    (``spread_costs``; torchao's float8 all-gather, whose weight casts run on a shard:
    api.AnalysisConfig). The kernel count stays whole."""
    if share < 0:
        raise ValueError(f"a share of a kernel's work is at least 0, got {share}")
    return [dataclasses.replace(c, flops=round(c.flops * share), bytes=round(c.bytes * share),
                                output_bytes=round(c.output_bytes * share))
            if c.op in ops else c for c in costs]
