"""Capture every aten op a model runs, forward and backward, without allocating real memory.

The model runs on the ``meta`` device under two modes:

* :class:`_AutocastEmulation` (a TorchFunctionMode, above autograd) applies CUDA autocast's
  per-op precision rules itself, because autocast does nothing for meta tensors (it only acts on CUDA/CPU ones). Casts
  are real ``.to()`` calls, so the cast kernels autocast launches show up as copies, and autograd
  records their backward exactly as it would under autocast. It also remembers which module (and
  which fused region, e.g. one scaled-dot-product-attention call) created each autograd node.
* :class:`_Recorder` (a TorchDispatchMode, below autograd) records each aten op with shapes,
  dtypes, strides, the owning module and the phase. In backward the running autograd node tells
  which module's forward created the work; an op whose result has the shape of one of that
  module's parameters is weight-gradient work (wgrad), anything else is data-gradient work (dgrad).
  ``convolution_backward`` does both at once; costs.py splits it by its ``output_mask``.

It also records what autograd saves for the backward (each storage once, by the module that
saved it, fused regions as their kernels save), which the memory estimate and activation
checkpointing read.

One module of ~500 lines: the dispatch mode, the autocast rules it applies by hand, the
phase/module attribution and the saved-tensor accounting all act on the same op stream in one
pass.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from dlperf.models.losses import DEFAULT_LOSS, cross_entropy

DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
               torch.float64: "fp64", torch.int64: "int64", torch.int32: "int32",
               torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool",
               torch.float8_e4m3fn: "fp8", torch.float8_e5m2: "fp8",
               # torchtitan's rotary embedding multiplies complex64 (models/gpt.py, apply_rope)
               torch.complex32: "complex32", torch.complex64: "complex64",
               torch.complex128: "complex128"}

# CUDA autocast op lists (PyTorch docs, "Autocast Op Reference", CUDA). Names are matched against
# the torch function's __name__, which is the same for torch.f, Tensor.f and F.f.
AUTOCAST_LOWER = frozenset({
    "__matmul__", "__rmatmul__", "addbmm", "addmm", "addmv", "addr", "baddbmm", "bmm",
    "chain_matmul", "multi_dot", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "conv_tbc", "linear", "matmul", "mm", "mv", "prelu",
    "scaled_dot_product_attention", "_convolution", "convolution", "einsum"})
AUTOCAST_FP32 = frozenset({
    "__pow__", "__rdiv__", "__rpow__", "__rtruediv__", "acos", "asin", "cosh", "erfinv", "exp",
    "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "sinh", "tan", "pow",
    "softplus", "layer_norm", "group_norm", "norm", "nuclear_norm", "frobenius_norm", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss",
    "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "softmax", "softmin", "log_softmax", "cross_entropy", "cumprod", "cumsum", "prod", "sum",
    "normalize"})
AUTOCAST_PROMOTE = frozenset({
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sample", "index_put",
    "scatter_add", "tensordot"})

# Torch functions whose whole forward (and backward) runs as one fused kernel on a GPU; their
# decomposed aten ops on meta are grouped into one region (costs.py charges only its external
# tensors). Flash/cuDNN attention never writes the L x L score matrix to memory.
FUSED_FUNCTIONS = frozenset({"scaled_dot_product_attention"})
# the module paths of the work a trainer runs on the model's output outside the model: the loss
# and its backward, and the train metrics evaluated after the backward (``_train_metrics``)
METRICS_MODULE = "metrics"
OUTSIDE_MODEL = ("loss", METRICS_MODULE)


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: str
    stride: tuple[int, ...]
    key: int  # storage identity: views of one tensor share it (parameters stay alive, so a
    #           parameter's key is never reused by another live tensor during a capture)
    offset: int = 0  # where in its storage the view starts (elements): q, k and v split from
    #                  one projection's output share a key, shape and stride, not an offset

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        return {"fp32": 4, "fp16": 2, "bf16": 2, "fp64": 8, "int64": 8, "int32": 4, "int16": 2,
                "int8": 1, "uint8": 1, "bool": 1, "fp8": 1, "complex32": 4, "complex64": 8,
                "complex128": 16}.get(self.dtype, 4)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def channels_last(self) -> bool:
        """4-D tensor stored NHWC (stride of C is 1 while W's is not)."""
        if len(self.shape) != 4 or self.shape[1] == 1:
            return False
        return self.stride[1] == 1 and self.stride[3] != 1


@dataclass(frozen=True)
class OpRecord:
    index: int
    op: str  # aten overload packet name, e.g. "convolution"
    module: str  # dotted module path, "" for the root, "loss" / "metrics" (OUTSIDE_MODEL)
    module_type: str
    phase: str  # "forward" | "dgrad" | "wgrad" | "backward" (convolution_backward, split later)
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta, ...]
    args: tuple = ()  # non-tensor positional args (strides, flags), for cost rules
    options: tuple = ()  # string keyword args as (name, value), e.g. gelu's approximate
    region: str | None = None  # fused region id, e.g. "scaled_dot_product_attention#0"
    pointwise: bool = False  # aten tag: elementwise op
    is_view: bool = False  # aliases its input: no kernel, no traffic
    measured_s: float | None = None  # wall time of the kernel when captured on a real device


@dataclass
class Capture:
    records: list[OpRecord] = field(default_factory=list)
    module_types: dict[str, str] = field(default_factory=dict)
    param_shapes: dict[str, set] = field(default_factory=dict)  # module path -> param shapes
    # Storage keys of parameters and of their autocast copies: a backward op that reads one is
    # computing a data gradient (dgrad mm reads W), one that only writes a W-shaped result is wgrad.
    weight_keys: set = field(default_factory=set)
    # Of those, the parameters' own (their copies are memory a step makes: liveness.py)
    param_keys: set = field(default_factory=set)
    # Fused regions: id -> what the analytic cost needs (costs.attention_cost).
    regions: dict = field(default_factory=dict)
    # Bytes autograd keeps from the forward for the backward (activations, masks, autocast's
    # weight copies), each storage once: the activation memory of a training step.
    saved_bytes: int = 0
    # The same bytes by the module that saved them first, and the bytes of each module's first
    # tensor input: what activation checkpointing keeps instead (api.checkpointed_activations).
    saved_by_module: dict = field(default_factory=dict)
    input_bytes: dict = field(default_factory=dict)
    input_keys: dict = field(default_factory=dict)  # module -> storage key of that input
    saved_sizes: dict = field(default_factory=dict)  # storage key -> bytes saved (no params)
    # storage key -> the module that saved it first: its backward is when autograd lets it go
    # (liveness.py; a fused kernel's backward reads what it saved under no record's key)
    saved_owners: dict = field(default_factory=dict)
    # Forward records whose output autograd saved: where a checkpointed block's recompute can
    # stop (torch.utils.checkpoint stops once the backward's tensors exist again)
    saved_outputs: set = field(default_factory=set)
    # The model's blocks (``block_paths``): what checkpointing replays, worked out once here
    blocks: frozenset = frozenset()


# A storage's identity: a number given to its Python object the first time the capture sees
# it. PyTorch keeps that object exactly as long as the storage lives, so a storage allocated
# later at a freed one's address gets a new number. The address alone (``_cdata``) was reused
# by the allocator, and the data flow read through the keys (analysis/fusion.py: which batch
# norm's output an add reads) then joined unrelated tensors as the process's history had it:
# a ResNet-50 fusion test passed alone and failed within the suite. (A counter, not state:
# the numbers only need to differ.)
_STORAGE_IDS = itertools.count(1)


def _storage(t: torch.Tensor) -> tuple[int, int]:
    """(identity, bytes) of the storage under ``t``: views of one tensor share it. Tensors
    without storage (sparse, nested) stand for themselves."""
    try:
        storage = t.untyped_storage()
        key = getattr(storage, "_dlperf_key", None)
        if key is None:
            key = storage._dlperf_key = next(_STORAGE_IDS)
        return key, storage.nbytes()
    except (RuntimeError, NotImplementedError):
        return id(t), t.numel() * t.element_size()


def _meta(t: torch.Tensor) -> TensorMeta:
    key = _storage(t)[0]
    try:
        offset = t.storage_offset()
    except (RuntimeError, NotImplementedError):  # no strided storage (sparse, nested)
        offset = 0
    return TensorMeta(tuple(t.shape), DTYPE_NAMES.get(t.dtype, str(t.dtype)), tuple(t.stride()),
                      key, offset)


_NUMBERED = re.compile(r"(.*?)(\d+)")


def block_paths(param_names) -> frozenset[str]:
    """The blocks of a model, from its parameters' names: the outermost modules that are
    members of a numbered series of siblings, i.e. every child of their parent that holds
    parameters is named with one stem and a number (two at least, unless the names are bare
    numbers: a module list of one block is a series). A module list or Sequential's items
    (``blocks.3``, ``layer1.0``, ``features.5``) are such a series, and so are named layers
    (torchvision's ViT: ``encoder.layers.encoder_layer_0`` .. ``_11``; DenseNet's
    ``denselayer1`` .. ``6``). These are the units activation checkpointing and FSDP's
    per-block wrapping act on. A parent whose children mix names (ResNet's conv1, bn1,
    layer1 .. layer4, fc) holds no series, so its blocks are found further in (layer1.0)."""
    children: dict[str, set[str]] = {}
    paths = set()
    for name in param_names:
        parts = name.split(".")[:-1]  # the module path; the last part names the tensor
        paths.add(tuple(parts))
        for i, part in enumerate(parts):
            children.setdefault(".".join(parts[:i]), set()).add(part)

    def series(parent: str) -> bool:
        kids = children.get(parent, ())
        stems = {m.group(1) if m else None
                 for m in (_NUMBERED.fullmatch(k) for k in kids)}
        # a module list's items are blocks even alone (a one-layer model); named layers need
        # a second to be a series
        return len(stems) == 1 and None not in stems and (len(kids) >= 2 or "" in stems)

    out = set()
    for parts in paths:
        for i in range(len(parts)):
            if series(".".join(parts[:i])):
                out.add(".".join(parts[:i + 1]))
                break
    return frozenset(out)


def block_path(module: str, blocks) -> str:
    """The block (one of ``blocks``: ``block_paths``) that module path ``module`` is in, ""
    outside every block."""
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        if prefix in blocks:
            return prefix
    return ""


def _tensors(obj) -> list[torch.Tensor]:
    return [x for x in tree_flatten(obj)[0] if isinstance(x, torch.Tensor)]


def _scalars(args) -> tuple:
    out = []
    for a in args:
        if isinstance(a, (bool, int, float, str)) or a is None:
            out.append(a)
        elif isinstance(a, (list, tuple)) and all(isinstance(v, (bool, int, float)) for v in a):
            out.append(tuple(a))
        else:
            out.append("<tensor>" if isinstance(a, torch.Tensor) else type(a).__name__)
    return tuple(out)


class _State:
    """Module stack and autograd-node ownership shared by the two modes."""

    def __init__(self):
        self.stack: list[str] = [""]
        self.region: str | None = None
        self.region_counter = itertools.count()
        self.in_backward = False
        # What autograd saves for the backward: storage (or tensor id) -> bytes; filled by the
        # capture's saved-tensor hook and, for fused regions, by ``save_fused``.
        self.saved: dict = {}
        self.saved_owner: dict = {}  # key -> the module it was first saved in
        self.fused_saved: list[torch.Tensor] = []
        self.weight_copies: list[torch.Tensor] = []  # WEIGHT_COPY_OPS' outputs, kept alive
        # Sorted (last sequence number created by a top-level torch call, module, region).
        self.seq_marks: list[int] = []
        self.seq_owner: list[tuple[str, str | None]] = []

    def save(self, t: torch.Tensor):
        key, size = _storage(t)
        self.saved[key] = max(self.saved.get(key, 0), size)
        self.saved_owner.setdefault(key, self.stack[-1])

    def save_fused(self, info: dict, args, kwargs, out):
        """What a fused attention kernel keeps for its backward, in place of the math path's.

        On meta tensors scaled_dot_product_attention takes the math decomposition, whose
        autograd saves the B x H x Tq x Tk attention probabilities (twice: softmax output and
        the dropout/matmul input). Every fused backend (CUDA flash and memory-efficient,
        PyTorch's CPU flash kernel) saves q, k, v, the output and the row log-sum-exp
        (B x H x Tq, fp32) instead: at sequence 2048 the math path's set made an MPT-7B step's
        activations 3x too large (172 GiB at micro-batch 6, where it trains on 80 GB)."""
        names = ("query", "key", "value")
        bound = dict(zip(names, args))
        bound.update({k: v for k, v in kwargs.items() if k in names})
        for t in (*(bound.get(n) for n in names), out):
            if isinstance(t, torch.Tensor):
                self.save(t)
                # held like autograd holds what it saves: a freed storage's address (the key)
                # would be reused by a later tensor and the two counted once
                self.fused_saved.append(t)
        key = ("logsumexp", id(out))
        self.saved[key] = math.prod(info["q"][:-1]) * 4  # B x H x Tq fp32
        self.saved_owner.setdefault(key, self.stack[-1])

    def mark(self, outputs, module: str, region: str | None):
        seqs = [t.grad_fn._sequence_nr() for t in _tensors(outputs) if t.grad_fn is not None]
        if seqs:
            top = max(seqs)
            if not self.seq_marks or top > self.seq_marks[-1]:
                self.seq_marks.append(top)
                self.seq_owner.append((module, region))

    def owner_of_current_node(self) -> tuple[str, str | None]:
        node = torch._C._current_autograd_node()
        if node is None:  # the engine's own work before any node runs: seeding the loss grad
            return "loss", None
        seq = node._sequence_nr()
        i = bisect.bisect_left(self.seq_marks, seq)
        if i == len(self.seq_marks):  # AccumulateGrad and friends: no forward owner
            return "(autograd)", None
        return self.seq_owner[i]


class _AutocastEmulation(TorchFunctionMode):
    def __init__(self, state: _State, low: torch.dtype | None, capture: Capture):
        super().__init__()
        self.state = state
        self.low = low
        self.capture = capture
        self.cache: dict[int, torch.Tensor] = {}  # autocast caches casts of leaf parameters

    def _cast(self, obj, dtype, only_from):
        if isinstance(obj, torch.Tensor):
            if obj.is_floating_point() and obj.dtype in only_from and obj.dtype != dtype:
                if obj.is_leaf and obj.requires_grad:
                    key = id(obj)
                    if key not in self.cache:
                        self.cache[key] = obj.to(dtype)
                        self.capture.weight_keys.add(_meta(self.cache[key]).key)
                    return self.cache[key]
                return obj.to(dtype)
            return obj
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._cast(o, dtype, only_from) for o in obj)
        return obj

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if self.low is not None and not self.state.in_backward:
            if name in AUTOCAST_LOWER:
                args = self._cast(args, self.low, (torch.float32,))
                kwargs = {k: self._cast(v, self.low, (torch.float32,)) for k, v in kwargs.items()}
            elif name in AUTOCAST_FP32:
                lows = (torch.float16, torch.bfloat16)
                args = self._cast(args, torch.float32, lows)
                kwargs = {k: self._cast(v, torch.float32, lows) for k, v in kwargs.items()}
            elif name in AUTOCAST_PROMOTE:
                floats = [t.dtype for t in _tensors((args, kwargs)) if t.is_floating_point()]
                if len(set(floats)) > 1:
                    widest = max(floats, key=lambda d: torch.finfo(d).bits)
                    args = self._cast(args, widest, tuple(set(floats)))
                    kwargs = {k: self._cast(v, widest, tuple(set(floats))) for k, v in kwargs.items()}
        if name == "dropout" and not self.state.in_backward:
            fused = _cuda_dropout(args, kwargs)
            if fused is not None:
                self.state.mark(fused, self.state.stack[-1], self.state.region)
                return fused
        region_opened = False
        if name in FUSED_FUNCTIONS and self.state.region is None:
            self.state.region = f"{name}#{next(self.state.region_counter)}"
            self.capture.regions[self.state.region] = _sdpa_info(args, kwargs)
            region_opened = True
        try:
            out = func(*args, **kwargs)
            if region_opened and isinstance(out, torch.Tensor) and out.dim() == 4:
                # The fused kernels (CUDA flash and memory-efficient, the CPU flash kernel)
                # write O as B x T x H x D and return it transposed, so the usual
                # `y.transpose(1, 2).reshape(b, t, c)` after attention is a view; the meta
                # math path writes B x H x T x D, which made that reshape a copy kernel dlperf
                # charged (and advised against) in every attention block. Inside the region,
                # this re-layout folds into the fused kernel's cost.
                out = out.transpose(1, 2).contiguous().transpose(1, 2)
        finally:
            region = self.state.region
            if region_opened:
                self.state.region = None
        if region_opened and not self.state.in_backward and isinstance(out, torch.Tensor):
            self.state.save_fused(self.capture.regions[region], args, kwargs, out)
        if not self.state.in_backward:
            self.state.mark(out, self.state.stack[-1], region)
        return out


def _cuda_dropout(args, kwargs) -> torch.Tensor | None:
    """Out-of-place dropout as CUDA runs it, for meta tensors; None to run ``func`` as is.

    On CUDA, ``at::dropout`` in training launches one fused ``native_dropout`` kernel (read x;
    write y and a bool mask) and autograd one ``native_dropout_backward``. On meta (and CPU)
    tensors it takes the decomposition instead: ``bernoulli_`` into a mask of the input's dtype,
    ``div_``, ``mul``, and a ``mul`` in backward, which overstated a BERT-large fp16 step by
    ~17% (issue #11). torch.nn.functional.dropout(input, p, training, inplace) and
    torch.dropout(input, p, train) are both named "dropout"; the in-place form stays
    decomposed on CUDA too (ATen fuses only the out-of-place one)."""
    x = args[0] if args else kwargs.get("input")
    if not isinstance(x, torch.Tensor) or not x.is_meta or not x.is_floating_point():
        return None
    p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
    train = args[2] if len(args) > 2 else kwargs.get("training", kwargs.get("train", True))
    inplace = args[3] if len(args) > 3 else kwargs.get("inplace", False)
    if inplace or not train or not 0 < float(p) < 1 or x.numel() == 0:
        return None  # identity (no kernel), all zeros, or the decomposed in-place form
    return torch.native_dropout(x, float(p), True)[0]


def _sdpa_info(args, kwargs) -> dict:
    """What flash attention's cost depends on: q/k/v shapes and dtype, causal masking."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    q, k, v = bound["query"], bound["key"], bound["value"]
    return {"kind": "attention", "q": tuple(q.shape), "k": tuple(k.shape), "v": tuple(v.shape),
            "dtype": DTYPE_NAMES.get(q.dtype, str(q.dtype)),
            "causal": bool(bound.get("is_causal", False)),
            "mask": bound.get("attn_mask") is not None}


# Ops that make a copy of a weight the backward reads (models/fp8.py: TransformerEngine's FP8
# copies of a layer's weight): a backward op reading one computes a data gradient, as one
# reading the weight itself or autocast's copy of it does (``Capture.weight_keys``).
WEIGHT_COPY_OPS = frozenset({"fp8_weight_quantize"})

# Ops whose output layout the caller chooses (memory_format=...) or that alias their input.
_LAYOUT_EXPLICIT = frozenset({"_to_copy", "clone", "contiguous", "copy_", "empty_like",
                              "empty_strided", "as_strided", "view", "_unsafe_view"})


def _keep_channels_last(func, args, out):
    """Give fresh 4-D outputs of a channels_last input the channels_last layout.

    Several meta kernels (batch norm, pooling, convolution_backward) allocate contiguous NCHW
    outputs, while the CUDA and CPU kernels follow the input's suggested memory format; without
    this, one BatchNorm would silently turn a channels_last model into NCHW in the capture.
    """
    if func.is_view or func._overloadpacket.__name__ in _LAYOUT_EXPLICIT:
        return out
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if (first is None or not first.is_meta or first.dim() != 4 or first.shape[1] == 1
            or not first.is_contiguous(memory_format=torch.channels_last)
            or first.is_contiguous()):
        return out
    inputs = {id(a) for a in args if isinstance(a, torch.Tensor)}

    def fix(t):
        if (isinstance(t, torch.Tensor) and t.dim() == 4 and id(t) not in inputs
                and t.shape[1] != 1 and t.is_contiguous()):
            return t.contiguous(memory_format=torch.channels_last)
        return t

    if isinstance(out, (tuple, list)):
        return type(out)(fix(t) for t in out)
    return fix(out)


class _Recorder(TorchDispatchMode):
    def __init__(self, state: _State, capture: Capture, timer=None):
        super().__init__()
        self.state = state
        self.capture = capture
        self.timer = timer  # (func, args, kwargs) -> (out, seconds): measure.py on real tensors

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.timer is None:
            out = func(*args, **kwargs)
            elapsed = None
        else:
            out, elapsed = self.timer(func, args, kwargs)
        out = _keep_channels_last(func, args, out)
        inputs = tuple(_meta(t) for t in _tensors((args, kwargs)))
        outputs = tuple(_meta(t) for t in _tensors(out))
        if self.state.in_backward:
            module, region = self.state.owner_of_current_node()
            op = func._overloadpacket.__name__
            if op == "convolution_backward":
                phase = "backward"
            else:
                shapes = self.capture.param_shapes.get(module, ())
                wgrad = (bool(outputs)
                         and all(o.shape in shapes or tuple(reversed(o.shape)) in shapes
                                 for o in outputs)
                         and not any(i.key in self.capture.weight_keys for i in inputs))
                phase = "wgrad" if wgrad and region is None else "dgrad"
        else:
            module, region, phase = self.state.stack[-1], self.state.region, "forward"
            if func._overloadpacket.__name__ in WEIGHT_COPY_OPS:
                self.capture.weight_keys.update(o.key for o in outputs)
                # held to the end, as parameters are: a freed copy's address (its key) would
                # be reused by a later tensor and taken for a weight's
                self.state.weight_copies.extend(_tensors(out))
        self.capture.records.append(OpRecord(
            index=len(self.capture.records), op=func._overloadpacket.__name__, module=module,
            module_type=self.capture.module_types.get(
                module, module if module in OUTSIDE_MODEL else ""),
            phase=phase, inputs=inputs, outputs=outputs, args=_scalars(args), region=region,
            options=tuple((k, v) for k, v in (kwargs or {}).items() if isinstance(v, str)),
            pointwise=torch.Tag.pointwise in func.tags, is_view=func.is_view,
            measured_s=elapsed))
        return out


def _default_loss(output, form: str = DEFAULT_LOSS) -> torch.Tensor:
    """Cross-entropy for logits ([B, C] or [B, T, V]) as ``form`` computes it (models/
    losses.py: by default on the logits upcast to FP32, as torchtitan, Hugging Face, Megatron-LM
    and autocast do; under the autocast emulation the upcast is the cast autocast makes), else
    a sum: enough to drive backward."""
    tensors = _tensors(output)
    if not tensors:
        raise ValueError("the model returned no tensor to differentiate")
    out = tensors[0]
    if out.is_floating_point() and out.dim() in (2, 3):
        logits = out.reshape(-1, out.shape[-1])
        target = torch.zeros(logits.shape[0], dtype=torch.long, device=out.device)
        return cross_entropy(logits, target, form)
    return out.float().sum()


def _train_metrics(output, count: int) -> None:
    """What a trainer's cross-entropy train metrics compute on a micro-batch's logits after its
    backward, outside autograd: ``count`` evaluations of ``F.cross_entropy``, each on its own
    FP32 copy of the logits (the ``fp32`` form's forward: a cast, a log-softmax and the NLL).
    Composer (0.16, the version of MosaicML's published MPT runs) evaluates every train metric
    after each micro-batch's ``loss.backward()`` (``Trainer._train_microbatch`` calls
    ``_eval_train_metrics``) under ``torch.no_grad()`` and the run's precision context, whose
    autocast runs cross_entropy in FP32; llm-foundry's ComposerMPTCausalLM gives it two,
    LanguageCrossEntropy and LanguagePerplexity, each a ``CrossEntropyLoss(reduction='sum')``
    of its own (composer/metrics/nlp.py). The logits therefore stay alive to the step's end."""
    with torch.no_grad():
        for _ in range(count):
            _default_loss(output, "fp32")


def capture(model: torch.nn.Module, example_inputs: tuple, train: bool = True,
            autocast_dtype: torch.dtype | None = None, loss_fn=None, forward=None,
            params=None, timer=None, loss: str = DEFAULT_LOSS, metrics: int = 0) -> Capture:
    """Run ``model(*example_inputs)`` (+ loss and backward when ``train``) and record every op.

    Inputs should live on the meta device, and so should the model's tensors, or ``forward``
    runs the model with meta stand-ins (api.py uses torch.func.functional_call) so the user's
    model is not touched. ``autocast_dtype`` emulates ``torch.autocast('cuda', dtype)``. The
    model's train/eval flags are restored afterwards. ``params``: the tensors ``forward`` uses
    as parameters (default: the model's own). ``timer`` times every kernel (real tensors only).
    ``loss``: how the default loss computes cross-entropy (models/losses.py ``LOSSES``), when
    no ``loss_fn`` is given. ``metrics``: train metrics computed on the output after the
    backward (``_train_metrics``), recorded as forward kernels of the module "metrics".
    The backward starts from no gradients, as a step after ``zero_grad(set_to_none=True)``
    does, and the parameters' ``.grad`` are put back as they were: a model captured twice (a
    second analysis, a validation table reusing one model for several rows) would otherwise
    accumulate into the first capture's gradients, one extra ``add`` per parameter.
    """
    result = Capture()
    state = _State()
    hooks = []
    param_list = list(model.parameters() if params is None else params)
    grads = [p.grad for p in param_list]
    for p in param_list:
        result.weight_keys.add(_meta(p).key)
        p.grad = None
    for name, mod in model.named_modules():
        result.module_types[name] = type(mod).__name__
        result.param_shapes[name] = {tuple(p.shape) for p in mod.parameters(recurse=False)}

        def pre(_m, args, name=name):
            state.stack.append(name)
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if first is not None and name not in result.input_bytes:
                result.input_bytes[name] = first.numel() * first.element_size()
                result.input_keys[name] = _meta(first).key

        def post(_m, _a, out, name=name):
            # a module's output made by a custom autograd Function (models/gpt.py's Megatron
            # column-parallel linear) comes from no torch call the autocast emulation sees:
            # marked here, its backward is the module's (a later mark would claim it)
            if not state.in_backward:
                state.mark(out, name, None)
            state.stack.pop()

        hooks.append(mod.register_forward_pre_hook(pre))
        hooks.append(mod.register_forward_hook(post, always_call=True))
    modes = {m: m.training for m in model.modules()}
    model.train(train)
    forward = forward or model

    def pack(t):
        if state.region is None:  # a fused region's saved set is its kernel's (save_fused)
            state.save(t)
        return t

    param_keys = set(result.weight_keys)  # the parameters themselves are not activations
    result.param_keys = param_keys
    try:
        with _AutocastEmulation(state, autocast_dtype, result), _Recorder(state, result, timer):
            with torch.set_grad_enabled(train):
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    output = forward(*example_inputs)
                result.saved_bytes = sum(v for k, v in state.saved.items() if k not in param_keys)
                for k, v in state.saved.items():
                    if k not in param_keys:
                        owner = state.saved_owner.get(k, "")
                        result.saved_by_module[owner] = result.saved_by_module.get(owner, 0) + v
                        result.saved_sizes[k] = v
                        result.saved_owners[k] = owner
                # (saved inside the record's own block: a block's output that the next block
                # saves is that block's checkpointed input, not something to recompute)
                blocks = result.blocks = block_paths(n for n, _ in model.named_parameters())
                result.saved_outputs = {
                    r.index for r in result.records
                    if any(o.key in state.saved and o.key not in param_keys
                           and block_path(state.saved_owner[o.key], blocks)
                           == block_path(r.module, blocks)
                           for o in r.outputs)}
                if train:
                    state.stack.append("loss")
                    loss = (loss_fn(output) if loss_fn is not None
                            else _default_loss(output, loss))
                    state.stack.pop()
                    state.in_backward = True
                    loss.backward()
                    if metrics:
                        state.in_backward = False
                        state.stack.append(METRICS_MODULE)
                        _train_metrics(output, metrics)
                        state.stack.pop()
    finally:
        for h in hooks:
            h.remove()
        for m, mode in modes.items():
            m.training = mode
        for p, g in zip(param_list, grads):
            p.grad = g
    return result
