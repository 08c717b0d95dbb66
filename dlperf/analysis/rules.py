"""The guide's checklist as rules: each turns the predictions into findings with a predicted gain.

Every saving is computed by re-running the roofline on a changed Cost (dtype, padded GEMM,
removed traffic), never guessed: ``saving_s`` is old predicted time minus new, per step.

Rules, in the order a user should act on them (performance guide and the ResNet-50 blog):
0. capacity          the step's memory (weights, gradients, optimizer, activations) exceeds the
                     device's: the prediction is for a step that cannot run
1. mixed-precision   FP32 -> BF16/FP16 Tensor Cores ("the easy big win")      guide 2.2, blog
2. channels-last     NCHW convolutions make cuDNN transpose around Tensor Core kernels   blog
   layout-copies     explicit copies that only reorder memory
3. fusion            memory-bound elementwise ops after another memory-bound op (BN+ReLU, ADD+ReLU)
4. alignment         GEMM M/N/K not a multiple of 16 bytes                     guide 2.2
5. quantization      tile/wave quantization wastes the SMs                     guide 2.3
6. launch-overhead   too many small kernels for the work                       (batch size, graphs)
7. optimizer         an unfused parameter update
8. train-metrics     cross-entropy train metrics recomputed on the logits the loss already read
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass, field

from dlperf.analysis.capture import METRICS_MODULE
from dlperf.analysis.costs import fused_optimizer, scaled_optimizer
from dlperf.analysis.gemm import GemmShape, alignment_elements
from dlperf.analysis.roofline import (Prediction, predict, predicted_step_s, step_time,
                                      winograd_shape)
from dlperf.hardware.efficiency import kernel_head_dim, kernel_head_sizes
from dlperf.units import gib

# A finding is shown when it saves at least this share of the step (or is a correctness-of-setup
# issue like FP32 math, which is always shown).
MIN_SHARE = 0.005
# Elementwise ops cheap enough to fold into the kernel that produced their input.
FUSIBLE_POINTWISE = frozenset({"relu", "relu_", "threshold_backward", "add", "add_", "mul",
                               "mul_", "gelu", "gelu_backward", "silu", "silu_", "sigmoid",
                               "hardswish", "hardswish_", "hardsigmoid", "div", "sub",
                               "hardtanh", "hardtanh_", "clamp_min", "clamp", "dropout",
                               "native_dropout", "tanh", "sigmoid_backward", "silu_backward",
                               "hardswish_backward", "hardsigmoid_backward", "where",
                               "hardsigmoid_", "gelu_", "leaky_relu", "leaky_relu_",
                               "leaky_relu_backward", "elu", "elu_", "elu_backward",
                               "hardtanh_backward", "tanh_backward", "mish", "mish_backward"})
MEMORY_KINDS = ("memory", "copy", "transpose", "fill")


@dataclass(frozen=True)
class Finding:
    rule: str
    message: str
    saving_s: float = 0.0
    layers: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return {"rule": self.rule, "message": self.message, "saving_s": self.saving_s,
                "layers": list(self.layers)}


def _names(preds, limit=4) -> str:
    seen = []
    for p in preds:
        name = p.cost.module or "(model)"
        if name not in seen:
            seen.append(name)
    more = f" and {len(seen) - limit} more" if len(seen) > limit else ""
    return ", ".join(seen[:limit]) + more


def _repredict(analysis, cost) -> Prediction:
    return predict(cost, analysis.device, tf32=analysis.config.tf32)


# Ops that CUDA autocast runs in FP32 whatever their input (torch.amp's fp32 list, as the
# kernels dlperf's capture names them), with their backward kernels.
AUTOCAST_FP32 = frozenset({
    "native_layer_norm", "native_layer_norm_backward", "native_group_norm",
    "native_group_norm_backward", "_softmax", "_softmax_backward_data", "_log_softmax",
    "_log_softmax_backward_data", "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward",
    "nll_loss2d_backward", "mse_loss", "mse_loss_backward", "binary_cross_entropy_with_logits",
    "exp", "log", "pow", "rsqrt", "sum", "cumsum", "norm", "linalg_vector_norm"})


def _mixed_precision(analysis, step_s) -> list[Finding]:
    cfg, spec = analysis.config, analysis.device
    if cfg.dtype != "fp32":
        return []
    target = "bf16" if spec.peak_flops("bf16") else "fp16" if spec.peak_flops("fp16") else None
    if target is None:
        return []
    times, counts, syncs = [], [], []
    for p in analysis.predictions:
        c = p.cost
        if target == "fp16" and c.phase == "optimizer" and c.op.endswith("_step"):
            # fp16 needs GradScaler: its unscale, and for an unfused update a host
            # synchronisation first (costs.scaled_optimizer)
            scaler, c = scaled_optimizer(c)
            new = predict(scaler, spec, tf32=False)
            times.append(new.time_s)
            counts.append(new.kernels)
            syncs.append(False)
        # Autocast stores activations in 16 bits: GEMM traffic halves and the math moves to
        # Tensor Cores; ops outside its fp32 list (batch norm, pooling, activations, adds) run
        # in their input's 16-bit type. Layer/group norm, softmax and losses stay FP32, and so
        # does the optimizer step (FP32 master weights).
        if (c.dtype == "fp32" and c.phase != "optimizer" and c.op not in AUTOCAST_FP32
                and (c.kind in ("gemm", "fused") or c.op in FUSIBLE_POINTWISE
                     or c.kind == "memory")):
            if c.kind == "gemm" and c.phase == "forward":
                # autocast casts each GEMM's FP32 weight to 16 bits first: one more small kernel
                # (its CPU issue time counts where the step is host-bound)
                times.append(analysis.efficiency.launch_s if analysis.efficiency else 0.0)
                counts.append(1)
                syncs.append(False)
            c = dataclasses.replace(c, dtype=target, bytes=c.bytes // 2,
                                    output_bytes=c.output_bytes // 2,
                                    activation_bytes=c.activation_bytes // 2)
        new = predict(c, spec, tf32=False)
        times.append(new.time_s)
        counts.append(new.kernels)
        syncs.append(c.syncs)
    host_s = analysis.host_s
    new_total = step_time(times, counts, host_s, syncs)
    # what the GEMMs run on now: TF32 Tensor Cores with --tf32 (where the GPU has them)
    now = "tf32" if cfg.tf32 and spec.peak_flops("tf32") else "fp32"
    saving = step_s - new_total
    msg = (f"Train with mixed precision (torch.autocast(dtype=torch.{'bfloat16' if target == 'bf16' else 'float16'})"
           f"{', with GradScaler' if target == 'fp16' else ''}): GEMMs move to {target} Tensor "
           f"Cores ({spec.peak_flops(target) / 1e12:,.0f} vs {spec.peak_flops(now) / 1e12:,.0f} "
           f"TFLOP/s {now.upper()}) and activations halve; predicted step {step_s * 1e3:.3g} -> "
           f"{new_total * 1e3:.3g} ms ({step_s / new_total:.2f}x).")
    # advice that does not pay (a host-bound step gains nothing from faster kernels, and
    # autocast adds cast kernels) is not given
    out = [Finding("mixed-precision", msg, saving)] if saving / step_s >= MIN_SHARE else []
    if not cfg.tf32 and spec.peak_flops("tf32"):
        tf32 = [predict(p.cost, spec, tf32=True) for p in analysis.predictions]
        tf32_total = predicted_step_s(tf32, host_s)
        out.append(Finding(
            "mixed-precision",
            "If FP32 must stay, at least allow TF32 (torch.backends.cuda.matmul.allow_tf32 = True, "
            "and keep torch.backends.cudnn.allow_tf32 = True, PyTorch's default): predicted step "
            f"{tf32_total * 1e3:.3g} ms.", step_s - tf32_total))
    return out


def _channels_last(analysis, step_s) -> list[Finding]:
    nchw = [p for p in analysis.predictions if p.transpose_time_s > 0]
    transposes = [p for p in analysis.predictions if p.cost.kind == "transpose"]
    out = []
    if nchw:
        # the transposes' time and their kernels' launches
        launch_s = analysis.model_constants.launch_s
        extra = sum(p.transpose_time_s + (p.kernels - p.cost.kernels) * launch_s for p in nchw)
        if extra / step_s >= MIN_SHARE:
            out.append(Finding(
                "channels-last",
                f"{len(nchw)} Tensor Core convolution passes run on NCHW tensors, so cuDNN "
                f"transposes their activations between NCHW and NHWC: ~{extra * 1e3:.3g} ms "
                f"({extra / step_s:.1%}) of the step. Use model.to(memory_format="
                "torch.channels_last) and channels_last inputs (NHWC end to end, as the record "
                "ResNet-50 does).", extra, tuple(sorted({p.cost.module for p in nchw}))))
    # FP32 3x3 convolutions in NHWC: cuDNN's Winograd algorithms take NCHW only
    # (hardware/efficiency.py, ``winograd``), so channels_last costs them in FP32
    winograd = analysis.model_constants.winograd
    lost = [p for p in analysis.predictions
            if winograd_shape(p.cost, p.math_class) and p.cost.nhwc]
    if lost and winograd < 1:
        extra = sum(p.time_s - dataclasses.replace(p, math_time_s=p.math_time_s * winograd).time_s
                    for p in lost)
        if extra / step_s >= MIN_SHARE:
            out.append(Finding(
                "winograd-layout",
                f"{len(lost)} FP32 3x3 convolution passes run in channels_last, where cuDNN has "
                f"no Winograd algorithm: in NCHW they would take ~{extra * 1e3:.3g} ms "
                f"({extra / step_s:.1%}) less. In FP32 keep NCHW; channels_last pays off with "
                "mixed precision (Tensor Cores want NHWC).", extra,
                tuple(sorted({p.cost.module for p in lost}))))
    if transposes:
        t = sum(p.time_s for p in transposes)
        if t / step_s >= MIN_SHARE:
            out.append(Finding(
                "layout-copies",
                f"{len(transposes)} copies that reorder memory (a permute/transpose made "
                f"contiguous, or a memory-format change) take {t * 1e3:.3g} ms "
                f"({t / step_s:.1%}) in {_names(transposes)}: keep one layout end to end, or let "
                "torch.compile fold the permute into the next kernel.", t,
                tuple(sorted({p.cost.module for p in transposes}))))
    return out


def fused_into_producer(cost):
    """``cost`` (an elementwise kernel) folded into the kernel that produced its input: it no
    longer writes the intermediate nor reads it back, so the traffic left is its output once
    (its other inputs, e.g. the residual, still read), and it has no launch of its own."""
    return dataclasses.replace(cost, bytes=max(cost.bytes - 2 * cost.output_bytes,
                                               cost.output_bytes), kernels=0)


def _fusion(analysis, step_s) -> list[Finding]:
    # a kernel already fused into another (--fusion, analysis/fusion.py) has no launch left
    candidates = [p for p in analysis.predictions
                  if p.cost.op in FUSIBLE_POINTWISE and p.bound == "memory" and p.cost.kernels]
    if not candidates:
        return []
    saving = 0.0
    by_op: dict[str, float] = defaultdict(float)
    for p in candidates:
        gain = p.time_s - _repredict(analysis, fused_into_producer(p.cost)).time_s
        saving += gain
        by_op[p.cost.op] += gain
    if saving / step_s < MIN_SHARE:
        return []
    top = ", ".join(f"{op} {t * 1e3:.3g} ms" for op, t in
                    sorted(by_op.items(), key=lambda kv: -kv[1])[:5])
    return [Finding(
        "fusion",
        f"{len(candidates)} memory-bound elementwise kernels could be fused into the kernel "
        f"before them (BN+ReLU and ADD+ReLU in the record ResNet-50, bias+GELU and residual adds "
        f"in transformers; torch.compile does this, `dlperf train compile=default`): "
        f"saves ~{saving * 1e3:.3g} ms ({saving / step_s:.1%}) of traffic and launches. "
        f"Largest: {top}."
        + (_fusion_hint(analysis) if analysis.config.fusion == "none" else ""),
        saving, tuple(sorted({p.cost.module for p in candidates})))]


def _fusion_hint(analysis) -> str:
    """Which --fusion level predicts this model's step fused: the batch-norm stacks for a
    network with batch norms, Megatron's kernels for a decoder's masked softmax, else
    torch.compile's (analysis/compiled.py)."""
    ops = {p.cost.op for p in analysis.predictions}
    if ops & {"native_batch_norm", "_native_batch_norm_legit", "cudnn_batch_norm"}:
        return (" `dlperf analyze --fusion bn-act` (or conv-bn) predicts the step with batch "
                "norm, ReLU and the residual add fused.")
    if "masked_fill" in ops and "_softmax" in ops:
        return (" `dlperf analyze --fusion megatron` predicts the step with Megatron-LM's "
                "fused scale-mask-softmax and bias+dropout+add.")
    return (" `dlperf analyze --fusion compile` predicts the step as torch.compile fuses it "
            "(every memory-bound kernel between two GEMMs or attention kernels in one).")


def _pad(value: int, multiple: int) -> int:
    return int(math.ceil(value / multiple) * multiple)


def _alignment(analysis, step_s) -> list[Finding]:
    spec = analysis.device
    bad = [p for p in analysis.predictions if p.aligned is False]
    if not bad:
        return []
    saving = 0.0
    examples = []
    for p in bad:
        c = p.cost
        multiple = alignment_elements(p.unit, spec.tc_alignment_bytes)
        named = dict(c.align_dims or ()) or {"m": c.gemm.m, "n": c.gemm.n, "k": c.gemm.k}
        padded = {d: _pad(v, multiple) if d in p.misaligned else v for d, v in named.items()}
        grow = math.prod(padded.values()) / math.prod(named.values())
        # Padding adds work in proportion (FLOPs x grow) but lets the aligned kernels run.
        fixed = dataclasses.replace(c, align_dims=tuple(padded.items()), flops=int(c.flops * grow),
                                    bytes=int(c.bytes * grow ** (2 / 3)))
        if c.align_dims is None:
            fixed = dataclasses.replace(fixed, gemm=GemmShape(padded["m"], padded["n"],
                                                              padded["k"], c.gemm.batch))
        gain = p.time_s - _repredict(analysis, fixed).time_s
        saving += max(gain, 0.0)
        dims = ", ".join(f"{d.upper()}={named[d]}->{padded[d]}" for d in p.misaligned)
        examples.append((gain, f"{c.module or '(model)'} {c.phase} ({dims})"))
    if saving / step_s < MIN_SHARE:  # e.g. padding a 3-channel stem to 8 costs more than it saves
        return []
    examples.sort(reverse=True)
    shown = "; ".join(e for _, e in examples[:4])
    unit = bad[0].unit
    return [Finding(
        "alignment",
        f"{len(bad)} Tensor Core GEMMs have a dimension that is not a multiple of "
        f"{alignment_elements(unit, spec.tc_alignment_bytes)} elements ({spec.tc_alignment_bytes} "
        f"bytes of {unit}, guide 2.2: channels for convolutions; batch, inputs and outputs for "
        f"linear layers): pad them (the 3-channel stem to 4 or 8 in NHWC, a vocabulary to a "
        f"multiple of 64). Predicted gain "
        f"~{saving * 1e3:.3g} ms. Worst: {shown}.", saving,
        tuple(sorted({p.cost.module for p in bad})))]


def _quantization(analysis, step_s) -> list[Finding]:
    worst = []
    for p in analysis.predictions:
        q = p.quantization
        if q is None or p.math_time_s <= p.memory_time_s or q.efficiency >= 0.8:
            continue
        ideal = p.math_time_s * q.efficiency
        gain = max(p.math_time_s, p.memory_time_s) - max(ideal, p.memory_time_s)
        if gain > 0:
            worst.append((gain, p))
    saving = sum(g for g, _ in worst)
    if not worst or saving / step_s < MIN_SHARE:
        return []
    worst.sort(key=lambda gp: -gp[0])
    shown = "; ".join(
        f"{p.cost.module or '(model)'} {p.cost.phase} {p.cost.gemm.m}x{p.cost.gemm.n}: "
        f"{p.quantization.tiles} tiles of {p.quantization.tile[0]}x{p.quantization.tile[1]} in "
        f"{p.quantization.waves} waves on {analysis.device.sm_count} SMs = "
        f"{p.quantization.efficiency:.0%}" for _, p in worst[:3])
    return [Finding(
        "quantization",
        f"{len(worst)} compute-bound GEMMs lose time to tile/wave quantization (guide 2.3: "
        f"choose batch, channels and features as multiples of 64-256). Up to "
        f"~{saving * 1e3:.3g} ms. Worst: {shown}.", saving,
        tuple(sorted({p.cost.module for _, p in worst})))]


def _head_padding(analysis, step_s) -> list[Finding]:
    """Fused attention whose kernel computes a padded head size (FlashAttention-2 runs a head
    of 80 as 96, llm-foundry's Triton kernel as 128: hardware/efficiency.py,
    ``kernel_head_dim``): the time the padding costs."""
    kernel = getattr(analysis.efficiency, "attention_kernel", "")
    padded = []
    for p in analysis.predictions:
        head = p.cost.head_dim
        if p.math_class != "attention" or not head:
            continue
        runs = kernel_head_dim(kernel, head)
        if runs > head:
            unpadded = p.math_time_s * head / runs
            gain = max(p.math_time_s, p.memory_time_s) - max(unpadded, p.memory_time_s)
            padded.append((gain, head, runs, p.cost.module))
    saving = sum(g for g, *_ in padded)
    if not padded or saving / step_s < MIN_SHARE:
        return []
    _, head, runs, _ = max(padded)
    return [Finding(
        "head-padding",
        f"{len(padded)} fused-attention kernels run heads of {head} in {kernel}'s {runs}-wide "
        f"kernel ({1 - head / runs:.0%} of their math is padding; it is built for heads of "
        f"{kernel_head_sizes(kernel)}): heads of a size it has, e.g. more "
        f"heads of 64 for the same width, save up to ~{saving * 1e3:.3g} ms.", saving,
        tuple(sorted({module for _, h, _, module in padded if h == head})))]


def _launch(analysis, step_s) -> list[Finding]:
    launch = sum(p.launch_time_s for p in analysis.predictions)
    if launch / step_s < 0.10:
        return []
    kernels = sum(p.cost.kernels for p in analysis.predictions)
    return [Finding(
        "launch-overhead",
        f"{kernels} kernels spend {launch * 1e3:.3g} ms ({launch / step_s:.0%}) on launch and "
        "ramp-up rather than work: raise the batch size, or capture the step with CUDA graphs / "
        "torch.compile(mode='reduce-overhead') (dlperf train: cuda_graphs=true or "
        "compile=reduce-overhead).", launch)]


def _capacity(analysis, step_s) -> list[Finding]:
    """The step's memory against the device's: a prediction for a step that cannot run is no
    prediction. Suggests the largest batch that fits (activations scale with the batch, 10%
    kept for workspaces and the allocator) or, when the weights, gradients and optimizer state
    alone do not fit, how many GPUs they must be sharded over."""
    m = analysis.memory_report()
    if not m or m["fits"] is not False:
        return []
    usable = 0.9 * m["device_bytes"]
    # judged at the step's peak (liveness.with_peak): the activations at their busiest moment
    active = m.get("activations_peak_bytes", m["activations_bytes"])
    static = m["total_bytes"] - m["activations_bytes"]
    parts = (f"weights {gib(m['weights_bytes'])}, gradients {gib(m['gradients_bytes'])}, "
             f"optimizer state {gib(m['optimizer_state_bytes'])}, activations "
             + (f"{gib(m['activations_bytes'])} saved and {gib(active)} at the peak"
                if active != m["activations_bytes"] else gib(active)))
    advice = []
    if static < usable and active:
        per_sample = active / analysis.batch_size
        batch = int((usable - static) // per_sample)
        if batch >= 1:
            advice.append(f"batch {batch} fits (activations scale with the batch; keep the "
                          "global batch with gradient accumulation)")
        advice.append("activation checkpointing keeps a fraction of the activations for ~1/3 "
                      "more forward compute")
    else:
        shards = math.ceil(static / usable) if usable else 0
        advice.append(f"the weights, gradients and optimizer state alone need "
                      f"{gib(static)}: shard them over at least {shards} GPUs (FSDP, "
                      "ZeRO-3), or train in lower precision")
    return [Finding(
        "capacity",
        f"Does not fit: the step holds ~{gib(static + active)} ({parts}) on a "
        f"{gib(m['device_bytes'])} {analysis.device.display_name}; "
        + "; ".join(advice) + ". The predicted time assumes it fit.", 0.0)]


# how an unfused update runs (Cost.variant of an optimizer step), in the finding's words
HOW = {"for-loop": "tensor by tensor, as foreach=False and torch 1.x run it",
       "foreach": "as torch's default _foreach_ ops",
       "bertadam": "as DeepLearningExamples' BertAdam: clip_grad_norm_ and Adam op by op for "
                   "each tensor, after a norm read with .item()",
       "bertadam-sync": "as DeepLearningExamples' BertAdam under torch 1.5-1.9: clip_grad_norm_ "
                        "and Adam op by op for each tensor, the CPU waiting for the GPU before "
                        "each"}


def _optimizer(analysis, step_s) -> list[Finding]:
    """An unfused parameter update (``--optimizer-impl foreach`` or ``for-loop``) against the
    same update fused: its extra traffic, its launches, and under fp16's GradScaler the wait
    before them (costs.scaled_optimizer), all in the predicted step."""
    preds = analysis.predictions
    at = next((i for i, p in enumerate(preds) if p.cost.phase == "optimizer"
               and p.cost.op.endswith("_step") and p.cost.variant), None)
    if at is None:
        return []
    c = preds[at].cost
    fused = fused_optimizer(c)
    new = _repredict(analysis, fused)
    times, counts = [p.time_s for p in preds], [p.kernels for p in preds]
    syncs = [p.cost.syncs for p in preds]
    times[at], counts[at], syncs[at] = new.time_s, new.kernels, False
    now = analysis.totals()["predicted_time_s"]
    saving = now - step_time(times, counts, analysis.host_s, syncs)
    if saving / now < MIN_SHARE:
        return []
    bert = c.variant.startswith("bertadam")
    wait = (", each issued by the CPU after GradScaler's inf check (.item()) has waited for "
            "the GPU, which then idles" if c.host_sync and not bert else "")
    name = {"sgd": "SGD", "adamw": "AdamW"}[c.module_type]
    fix = ("Use a fused Adam (torch.optim.AdamW(..., fused=True) or apex's FusedAdam, as "
           "run_squad.py's --fp16 path does) after one clip_grad_norm_ over all the parameters"
           if bert else f"Use torch.optim.{name}(..., fused=True), as `dlperf train` does "
           "(fused_optimizer=true)")
    return [Finding(
        "optimizer",
        f"The {name} update runs {HOW[c.variant]} ({c.kernels:,} launches{wait}): "
        f"{saving * 1e3:.3g} ms ({saving / now:.1%}) of the step more than the fused update "
        f"({new.kernels} launches, one pass over the state). {fix}.", saving)]


def _train_metrics(analysis, step_s) -> list[Finding]:
    """The trainer's cross-entropy train metrics (``AnalysisConfig.train_metrics``,
    capture._train_metrics): each evaluation makes an FP32 copy of the logits and a log-softmax
    of it after the backward, to compute again a number the loss already holds. The saving is
    the step without their kernels."""
    preds = analysis.predictions
    gone = {i for i, p in enumerate(preds) if p.cost.module == METRICS_MODULE}
    if not gone:
        return []
    kept = [p for i, p in enumerate(preds) if i not in gone]
    now = analysis.totals()["predicted_time_s"]
    saving = now - predicted_step_s(kept, analysis.host_s)
    if saving / now < MIN_SHARE:
        return []
    n = analysis.config.train_metrics
    return [Finding(
        "train-metrics",
        f"{n} train metric{'s' if n != 1 else ''} evaluate{'' if n != 1 else 's'} the "
        f"cross-entropy of each micro-batch's logits again after its backward, each on an FP32 "
        f"copy of them: {saving * 1e3:.3g} ms ({saving / now:.1%}) of the step. The loss "
        "already holds that number (perplexity is its exp): log it instead, or evaluate the "
        "metrics on some steps only (llm-foundry: model.use_train_metrics: false).", saving,
        (METRICS_MODULE,))]


RULES = (_capacity, _mixed_precision, _channels_last, _fusion, _alignment, _quantization,
         _head_padding, _launch, _optimizer, _train_metrics)


def findings(analysis) -> list[Finding]:
    step_s = sum(p.time_s for p in analysis.predictions)
    if step_s <= 0:
        return []
    out: list[Finding] = []
    for rule in RULES:
        out.extend(rule(analysis, step_s))
    return out
