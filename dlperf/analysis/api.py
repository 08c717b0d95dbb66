"""`dlperf.analyze`: model -> capture -> costs -> roofline -> rules, as one plain function."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import asdict, dataclass, field

import torch

from dlperf.analysis import capture as capture_mod
from dlperf.analysis import compiled as compiled_mod
from dlperf.analysis import liveness
from dlperf.analysis import recompute as recompute_mod
from dlperf.analysis.costs import (OPTIMIZER_BYTES_PER_PARAM, OPTIMIZER_IMPLS, all_costs,
                                   optimizer_cost, scaled_optimizer, share_costs,
                                   spread_costs)
from dlperf.analysis.fusion import COMPILED, check_fusion, fuse_costs
from dlperf.analysis.gemm import state_element_bytes
from dlperf.analysis.pipeline import ordered_blocks
from dlperf.analysis.roofline import Prediction, predict, predicted_step_s
from dlperf.dtypes import MIXED, autocast_dtype
from dlperf.errors import DlperfError
from dlperf.hardware.efficiency import DEFAULT_ATTENTION_KERNEL, efficiency_for
from dlperf.hardware.specs import DeviceSpec, get_device
from dlperf.models.fp8 import MX_WEIGHT_OPS
from dlperf.models.fp8 import WEIGHT_OPS as FP8_WEIGHT_OPS
from dlperf.models.fp8 import fp8_weight_bytes
from dlperf.models.losses import DEFAULT_LOSS, LOSSES

# --dtype -> the dtype autocast (or model.half()) uses; fp32: none
DTYPES = {name: autocast_dtype(name) for name in MIXED}
# mixed: torch.autocast over fp32 weights; half: the model cast (model.half()); fsdp: FSDP's
# mixed precision (see AnalysisConfig.precision)
PRECISIONS = ("mixed", "half", "fsdp")
# the precisions whose model computes in the half dtype itself, without autocast
HALF_MODEL = ("half", "fsdp")
# what a checkpointed block recomputes (AnalysisConfig.checkpoint_policy, kept_by_policy)
CHECKPOINT_POLICIES = ("full", "selective-op", "selective-attention")
# Megatron-Core's --recompute-modules (with --recompute-granularity selective), as the policy
# "modules:NAME,NAME" (``recompute_modules``, ``kept_by_policy``): each block's norms
# ("layernorm"), its experts' activation ("moe_act"), its attention core ("core_attn", as
# "selective-attention") run again in the backward instead of being kept
RECOMPUTE_MODULES = ("layernorm", "moe_act", "core_attn")


def recompute_modules(policy: str) -> frozenset[str]:
    """The Megatron modules a "modules:..." checkpoint policy recomputes (empty otherwise)."""
    if not policy.startswith("modules:"):
        return frozenset()
    return frozenset(n for n in policy.split(":", 1)[1].split(",") if n)


def megatron_modules(policy: str) -> frozenset[str]:
    """The Megatron modules a policy recomputes: "selective-attention" is Megatron's
    ``--recompute-granularity selective`` with its default ``--recompute-modules core_attn``;
    "modules:..." names them; other policies are not Megatron's (empty)."""
    return (frozenset({"core_attn"}) if policy == "selective-attention"
            else recompute_modules(policy))


@dataclass(frozen=True)
class AnalysisConfig:
    model: str
    input_shape: tuple[int, ...]  # including the batch dimension
    dtype: str = "bf16"  # mixed precision as CUDA autocast runs it; fp32 = no autocast
    # mixed: torch.autocast (fp32 weights, per-op casts, softmax/norms in fp32); half: the model
    # itself in ``dtype`` (model.half(): no casts, everything in half, optimizer state in half);
    # fsdp: FSDP's mixed precision as torchtitan's FSDP2 (MixedPrecisionPolicy(param_dtype=
    # bf16, reduce_dtype=fp32)) and Composer's DEFAULT with llm-foundry's low-precision norms
    # run it: the gathered parameters and the whole forward and backward in ``dtype`` without
    # autocast (norms as the module writes them), fp32 master weights, gradients reduced in
    # fp32 and an fp32 optimizer on the shards (the gradients' cast to fp32 before the
    # reduction, 6 B per parameter, is not costed)
    precision: str = "mixed"
    tf32: bool = False  # with fp32: GEMMs on TF32 Tensor Cores
    train: bool = True
    channels_last: bool = False
    device: str = "h100-sxm"
    optimizer: str = "sgd"  # sgd | adamw | none: the parameter update counted in a train step
    # how torch.optim runs it (costs.OPTIMIZER_IMPLS): "fused" (fused=True), "foreach" (torch's
    # default on CUDA since 2.0) or "for-loop" (foreach=False; every release before 2.0);
    # "bertadam" / "bertadam-sync": DeepLearningExamples' FP32 BERT fine-tuning update
    # (costs.bertadam_cost), under torch 1.10 and later / 1.5.1-1.9
    optimizer_impl: str = "fused"
    tokens: bool = False  # integer token-id input [batch, seq_len]: report tokens/s too
    # recompute each block's forward in the backward (torch.utils.checkpoint per block, as
    # FSDP trainers wrap them): more math, activations only at block boundaries
    activation_checkpointing: bool = False
    # what a checkpointed block recomputes: "full" (its whole forward), "selective-op"
    # (torchtitan's op-level policy: matmul outputs alternately saved, attention saved, every
    # other kernel recomputed) or "selective-attention" (Megatron-LM's selective recompute:
    # the attention core only); see kept_by_policy
    checkpoint_policy: str = "full"
    # checkpoint every n-th block only (the n-th, 2n-th, ... counted from 1 in model order),
    # the rest keeping their activations: fms-fsdp's selective_checkpointing, torchtitan's
    # "selective" layer mode (selective_ac_option n); 1 = every block. With "full" only.
    checkpoint_every: int = 1
    # the fused kernels the step runs (analysis/fusion.py): "none" (eager PyTorch: batch
    # norm, ReLU and add each a kernel), "bn-act" (batch norm + ReLU and batch norm + add +
    # ReLU one kernel each), "conv-bn" (batch-norm statistics and apply inside the
    # convolutions), "megatron" (Megatron-LM's decoder kernels), "compile" / "compile-blocks"
    # (torch.compile of the model / of each block: analysis/compiled.py)
    fusion: str = "none"
    # the step replayed as one CUDA graph: the CPU issues no kernel, so its per-kernel cost
    # (Efficiency.host_s) never leaves the GPU waiting; the GPU's own gap (launch_s) stays
    cuda_graphs: bool = False
    # the recipe of the model's FP8 linear layers (models/fp8.py: the model carries them; this
    # names them in the report), None without
    fp8: str | None = None
    # micro-batches that share one FP8 copy of each weight (models/fp8.py: Megatron-Core on
    # TransformerEngine casts the weights in a step's first micro-batch and reuses the copies
    # in the rest, so a micro-batch's forward carries 1/reuse of those casts; 1 otherwise)
    fp8_weight_reuse: int = 1
    # torchao's float8 all-gather (models/float8.py, ``gathered``): each GPU casts its shard of
    # the float8 weights before FSDP gathers them, outside the model. The capture holds one
    # full cast of every weight a micro-batch (an amax pass and a cast pass in BF16); these are
    # the shares of them this GPU runs instead: the amax of its FP32 shard once a step
    # (precompute_float8_dynamic_scale_for_fsdp) and the cast of that shard before each gather
    fp8_weight_amax_share: float = 1.0
    fp8_weight_cast_share: float = 1.0
    # the fused attention kernel the stack runs (hardware/efficiency.py ATTENTION_KERNELS):
    # "flash2" (PyTorch's SDPA since 2.2: FlashAttention-2) or "triton-2023" (llm-foundry's
    # Triton flash kernel, MosaicML's 2023 runs) or "cudnn" (cuDNN's, what torch 2.11's SDPA
    # picked on an H200): its share of the Tensor Core peak
    attention_kernel: str = DEFAULT_ATTENTION_KERNEL
    # how the loss computes cross-entropy over the logits (models/losses.py LOSSES): "fp32"
    # (upcast first: torchtitan, Hugging Face, Megatron-LM, autocast), "half" (in the logits'
    # dtype) or "fused" (one kernel each way: flash-attn's, or a torch.compile'd loss)
    loss: str = DEFAULT_LOSS
    # cross-entropy train metrics the trainer evaluates on each micro-batch's logits after its
    # backward, outside autograd (capture._train_metrics: Composer's LanguageCrossEntropy and
    # LanguagePerplexity make 2, MosaicML's MPT runs); 0 for trainers that log the loss only
    train_metrics: int = 0


@dataclass
class Analysis:
    """Everything the report shows; ``to_dict`` is the documented JSON shape."""

    device: DeviceSpec
    config: AnalysisConfig
    predictions: list[Prediction]
    uncounted: dict[str, int]
    capture_seconds: float = 0.0
    findings: list = field(default_factory=list)
    efficiency: object = None  # the hardware.efficiency.Efficiency the times were predicted with
    memory: dict | None = None  # api.memory_footprint: what one device holds in a step

    def memory_report(self) -> dict | None:
        """The footprint beside the device's memory: does the step fit?"""
        if self.memory is None:
            return None
        capacity = self.device.memory_bytes
        return {**self.memory, "device_bytes": capacity,
                "fits": None if not capacity else liveness.peak_total(self.memory) <= capacity}

    @property
    def batch_size(self) -> int:
        return self.config.input_shape[0]

    @property
    def model_constants(self):
        """The efficiency model the times were predicted with (the device's default when the
        analysis was not given one)."""
        return self.efficiency or efficiency_for(self.device, self.config.attention_kernel)

    @property
    def host_s(self) -> float:
        """The CPU's time to issue one kernel: none under a CUDA graph."""
        return 0.0 if self.config.cuda_graphs else self.model_constants.host_s

    def totals(self) -> dict:
        preds = self.predictions
        gpu_s = sum(p.time_s for p in preds)
        host_s = self.host_s
        # the CPU issuing the kernels can leave the GPU idle (roofline.step_time)
        time_s = predicted_step_s(preds, host_s)
        mem = sum(p.time_s for p in preds if p.bound == "memory")
        by_phase: dict[str, float] = {}
        for p in preds:
            by_phase[p.cost.phase] = by_phase.get(p.cost.phase, 0.0) + p.time_s
        flops = sum(p.cost.flops for p in preds)
        return {
            "flops": flops,
            "macs": flops // 2,
            "bytes": sum(p.cost.bytes for p in preds),
            "predicted_time_s": time_s,
            "samples_per_s": self.batch_size / time_s if time_s else math.inf,
            **({"tokens_per_s": self.batch_size * self.config.input_shape[1] / time_s
                if time_s else math.inf} if self.config.tokens else {}),
            "kernels": sum(p.cost.kernels for p in preds),
            "memory_bound_time_share": mem / time_s if time_s else 0.0,
            "compute_time_s": sum(max(p.math_time_s, p.memory_time_s) for p in preds
                                  if p.math_time_s >= p.memory_time_s),
            "memory_time_s": sum(max(p.math_time_s, p.memory_time_s) for p in preds
                                 if p.math_time_s < p.memory_time_s),
            "launch_time_s": sum(p.launch_time_s for p in preds),
            "gpu_time_s": gpu_s,
            # time the GPU waits for the CPU to issue kernels (eager PyTorch's per-op cost)
            "host_wait_s": time_s - gpu_s,
            "nchw_transpose_time_s": sum(p.transpose_time_s for p in preds),
            "time_by_phase_s": by_phase,
            "gemm_flops_share": (sum(p.cost.flops for p in preds
                                     if p.cost.kind in ("gemm", "fused")) / flops) if flops else 0.0,
            "achieved_flops_per_s": flops / time_s if time_s else 0.0,
        }

    def layers(self) -> list[dict]:
        out = []
        for p in self.predictions:
            c = p.cost
            q = p.quantization
            out.append({
                "module": c.module, "module_type": c.module_type, "op": c.op, "phase": c.phase,
                "kind": c.kind, "dtype": c.dtype, "math_unit": p.unit, "flops": c.flops,
                "bytes": c.bytes, "intensity": None if math.isinf(p.intensity) else p.intensity,
                "bound": p.bound, "limited_by": p.limited_by,
                "gemm": None if c.gemm is None else {"m": c.gemm.m, "n": c.gemm.n,
                                                     "k": c.gemm.k, "batch": c.gemm.batch},
                "tensor_core_aligned": p.aligned, "misaligned_dims": list(p.misaligned),
                "quantization_efficiency": p.quantization_efficiency,
                "tile": None if q is None else list(q.tile),
                "tile_efficiency": None if q is None else q.tile_efficiency,
                "wave_efficiency": None if q is None else q.wave_efficiency,
                "waves": None if q is None else q.waves,
                "math_class": p.math_class, "memory_class": p.memory_class,
                "traffic_factor": p.traffic_factor,
                "math_time_s": p.math_time_s, "memory_time_s": p.memory_time_s,
                "predicted_time_s": p.time_s, "kernels": c.kernels,
            })
        return out

    def to_dict(self) -> dict:
        return {
            "device": self.device.to_dict(),
            "config": asdict(self.config),
            "model_constants": {**self.model_constants.to_dict(),
                                "flops_convention": "2 FLOPs per multiply-add"},
            "totals": self.totals(),
            "layers": self.layers(),
            "uncounted": [{"op": op, "count": n} for op, n in sorted(self.uncounted.items())],
            "memory": self.memory_report(),
            "findings": [f.to_dict() for f in self.findings],
            "track_record": self.track_record(),
            "capture_seconds": self.capture_seconds,
        }

    def track_record(self) -> dict | None:
        """dlperf's record against published measurements on this device and kind of workload
        (hardware/track_record.py); None for a measured profile."""
        from dlperf.hardware.track_record import describe, load, workload_class

        line = describe(self.device, self.config)
        if line is None:
            return None
        entry, cls = load().get(self.device.name, {}), workload_class(self.config)
        return {"text": line[0], "systematic": line[1], "device": entry.get("all"),
                "workload_class": cls, "workload": entry.get("classes", {}).get(cls)}


def _meta_inputs(input_shape, input_dtype, channels_last: bool) -> tuple:
    if input_dtype.is_floating_point:
        x = torch.empty(input_shape, device="meta", dtype=input_dtype)
        if channels_last and len(input_shape) == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return (x,)
    return (torch.empty(input_shape, device="meta", dtype=input_dtype),)


def _meta_forward(model: torch.nn.Module, channels_last: bool, cast: torch.dtype | None = None):
    """A forward that runs ``model`` with meta stand-ins for its tensors, leaving it untouched;
    ``cast``: floating-point tensors in that dtype (what ``model.to(cast)`` would give)."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format

    def like(t: torch.Tensor, grad: bool) -> torch.Tensor:
        dtype = cast if cast is not None and t.is_floating_point() else t.dtype
        if channels_last and t.dim() == 4:
            m = torch.empty(t.shape, dtype=dtype, device="meta").contiguous(memory_format=fmt)
        else:
            m = torch.empty_strided(t.shape, t.stride(), dtype=dtype, device="meta")
        return m.requires_grad_(grad)

    on_meta = all(t.is_meta for t in list(model.parameters()) + list(model.buffers()))
    if on_meta and not channels_last and cast is None:
        return None, None
    params = {id(p): like(p, p.requires_grad) for p in model.parameters()}  # tied weights stay tied
    state = {n: params[id(p)] for n, p in model.named_parameters(remove_duplicate=False)}
    state.update({n: like(b, False) for n, b in model.named_buffers(remove_duplicate=False)})

    def forward(*args):
        return torch.func.functional_call(model, state, args, tie_weights=True)

    return forward, list(params.values())


# What PyTorch says when a meta tensor meets an op whose result depends on values.
_DATA_DEPENDENT = (("nonzero", "torch.nonzero (or boolean-mask indexing)"),
                   ("item()", "Tensor.item()"), ("_local_scalar_dense", "Tensor.item()"),
                   ("unique", "torch.unique"), ("masked_select", "torch.masked_select"),
                   ("data-dependent", "an op with a data-dependent output"),
                   ("data dependent", "an op with a data-dependent output"))


def data_dependent_op(message: str) -> str | None:
    """The value-dependent op a capture error is about, or None for any other error."""
    low = message.lower()
    if "meta" not in low and "data-dependent" not in low and "data dependent" not in low:
        return None
    return next((op for key, op in _DATA_DEPENDENT if key in low), None)


def capture_costs(model: torch.nn.Module, config: AnalysisConfig,
                  input_dtype: torch.dtype = torch.float32) -> tuple[list, dict, float]:
    """The device-independent half: capture on meta tensors and cost every kernel.

    Returns (costs, uncounted ops, seconds, memory footprint); ``predict_on`` turns them into an
    Analysis for a device, so several devices can be compared from one capture.
    """
    if config.dtype not in DTYPES:
        raise DlperfError(f"--dtype {config.dtype!r}: choose one of {', '.join(DTYPES)}")
    if config.optimizer not in (*OPTIMIZER_BYTES_PER_PARAM, "none"):
        raise DlperfError(f"--optimizer {config.optimizer!r}: choose sgd, adamw or none")
    if config.optimizer_impl not in OPTIMIZER_IMPLS:
        raise DlperfError(f"--optimizer-impl {config.optimizer_impl!r}: choose "
                          f"{', '.join(OPTIMIZER_IMPLS)}")
    if (config.cuda_graphs and config.train and config.optimizer != "none"
            and config.optimizer_impl != "fused" and config.dtype == "fp16"
            and config.precision == "mixed"):
        raise DlperfError("--cuda-graphs with --dtype fp16 and an unfused optimizer: "
                          "GradScaler reads its inf flag on the CPU (.item()) before such an "
                          "update, which a CUDA graph cannot hold; use --optimizer-impl fused "
                          "(the fused update reads the flag on the GPU)")
    if config.optimizer_impl.startswith("bertadam") and config.train and (
            config.optimizer != "adamw" or config.precision in HALF_MODEL):
        raise DlperfError(f"--optimizer-impl {config.optimizer_impl}: BertAdam is an Adam over "
                          "FP32 parameters; use it with --optimizer adamw and a model kept in "
                          f"FP32 (not --optimizer {config.optimizer} --precision "
                          f"{config.precision})")
    modules = recompute_modules(config.checkpoint_policy)
    if modules and not modules <= set(RECOMPUTE_MODULES):
        raise DlperfError(f"--recompute-modules {','.join(sorted(modules))}: name some of "
                          f"{', '.join(RECOMPUTE_MODULES)} (Megatron-Core's --recompute-modules)")
    if config.checkpoint_policy not in CHECKPOINT_POLICIES and not modules:
        raise DlperfError(f"--activation-checkpointing {config.checkpoint_policy!r}: choose "
                          f"{' or '.join(CHECKPOINT_POLICIES)}, or modules with "
                          "--recompute-modules")
    if config.checkpoint_every < 1:
        raise DlperfError(f"--checkpoint-every {config.checkpoint_every}: the n of every n-th "
                          "block checkpointed, at least 1")
    if config.checkpoint_every > 1 and config.checkpoint_policy != "full":
        raise DlperfError(f"--checkpoint-every {config.checkpoint_every} checkpoints whole "
                          "blocks (fms-fsdp, torchtitan's layer mode): use it with "
                          f"--activation-checkpointing full, not {config.checkpoint_policy}")
    check_fusion(config.fusion)
    if config.loss not in LOSSES:
        raise DlperfError(f"--loss {config.loss!r}: choose {' or '.join(LOSSES)}")
    if config.loss == "half" and config.precision == "mixed" and config.dtype != "fp32":
        # autocast's op lists put cross_entropy in FP32 whatever the logits' dtype
        raise DlperfError("--loss half: under autocast (--precision mixed) cross-entropy runs "
                          "in FP32 whatever the logits' dtype; use --loss fp32, or --precision "
                          "half or fsdp for a model that computes in its own dtype")
    if config.train_metrics < 0 or (config.train_metrics and not config.train):
        raise DlperfError(f"--train-metrics {config.train_metrics}: the cross-entropy metrics "
                          "a training step evaluates on its logits, 0 or more, with --train")
    if config.precision not in PRECISIONS:
        raise DlperfError(f"--precision {config.precision!r}: choose {' or '.join(PRECISIONS)}")
    half = DTYPES[config.dtype] if config.precision in HALF_MODEL else None
    if config.precision in HALF_MODEL and half is None:
        raise DlperfError(f"--precision {config.precision} needs --dtype fp16 or bf16 (the "
                          "dtype the model computes in)")
    # the optimizer's parameters and state: in half only for a model cast to half
    state_bytes = state_element_bytes(config.precision)
    if half is not None and input_dtype.is_floating_point:
        input_dtype = half  # model.half() is fed half inputs
    if config.train and not any(p.requires_grad for p in model.parameters()):
        # (the backward would fail with autograd's "does not require grad", which reads as a
        # bad input shape)
        raise DlperfError(f"--train: model {config.model!r} has no trainable parameters "
                          "(requires_grad); analyze its forward without --train")
    inputs = _meta_inputs(config.input_shape, input_dtype, config.channels_last)
    start = time.perf_counter()
    forward, params = _meta_forward(model, config.channels_last, half)
    try:
        cap = capture_mod.capture(model, inputs, train=config.train,
                                  autocast_dtype=None if half is not None else DTYPES[config.dtype],
                                  forward=forward, params=params, loss=config.loss,
                                  metrics=config.train_metrics)
    except DlperfError:
        raise
    except (RuntimeError, ValueError, TypeError, IndexError, AssertionError,
            NotImplementedError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        op = data_dependent_op(str(exc))
        if op is not None:  # not the input's fault: the capture cannot know tensor values
            raise DlperfError(
                f"model {config.model!r} calls {op}, whose result depends on tensor values "
                "(an output shape or a Python branch), which dlperf's capture on meta tensors "
                "cannot know: make that step shape-static (a mask multiply instead of "
                "nonzero/boolean indexing, no .item() or unique in forward), or analyze the "
                "part of the model before it") from None
        # The model rejected the input (shape, dtype): a user mistake, reported in one line.
        raise DlperfError(f"model {config.model!r} failed on input shape "
                          f"{list(config.input_shape)}: {first[:300]} "
                          "(check --input-shape)") from None
    costs, uncounted = all_costs(cap.records, cap.regions)
    recomputed: dict = {}  # (compiled levels: what the backward recomputes, not kept)
    costs = fuse_costs(costs, cap.records, config.fusion, cap.blocks, recomputed)
    if config.fp8_weight_reuse < 1:
        raise DlperfError(f"fp8_weight_reuse {config.fp8_weight_reuse}: the micro-batches "
                          "sharing one FP8 copy of the weights, at least 1")
    if config.fp8_weight_reuse > 1:
        costs = spread_costs(costs, FP8_WEIGHT_OPS + MX_WEIGHT_OPS, config.fp8_weight_reuse)
    if (config.fp8_weight_amax_share, config.fp8_weight_cast_share) != (1.0, 1.0):
        amax_op, cast_op = FP8_WEIGHT_OPS
        costs = share_costs(share_costs(costs, (amax_op,), config.fp8_weight_amax_share),
                            (cast_op,), config.fp8_weight_cast_share)
    trainable = [p for p in model.parameters() if p.requires_grad]  # shared weights once
    if config.train and config.optimizer != "none":
        # BertAdam skips weight decay for run_squad.py's no_decay list (biases, LayerNorm): the
        # one-dimensional tensors (costs.bertadam_cost)
        decayed = [p for p in trainable if p.dim() > 1]
        step = optimizer_cost(sum(p.numel() for p in trainable), len(trainable),
                              config.optimizer, element_bytes=state_bytes,
                              impl=config.optimizer_impl,
                              decayed=(len(decayed), sum(p.numel() for p in decayed)))
        # fp16 autocast training needs loss scaling: torch.amp.GradScaler's unscale, and for an
        # unfused optimizer a host synchronisation before the step (costs.scaled_optimizer)
        costs.extend(scaled_optimizer(step) if config.dtype == "fp16" and not half else [step])
    activations = cap.saved_bytes
    if recomputed and not config.activation_checkpointing:
        # torch.compile keeps less: pointwise results the backward recomputes (checkpointed
        # blocks keep their inputs as before: their footprint stays the eager one's)
        activations = compiled_mod.saved_bytes(cap.saved_sizes, cap.weight_keys, cap.records,
                                               recomputed)
    by_index = {r.index: r for r in cap.records}
    plan = None  # (Megatron's selective recompute: recompute.dropped_and_held, per block)
    if config.train and config.activation_checkpointing:
        blocks = cap.blocks
        if not blocks:
            raise DlperfError(f"--activation-checkpointing: {config.model!r} has no blocks (a "
                              "numbered series of children, e.g. a module list's blocks.0, "
                              "blocks.1, ...) to checkpoint")
        blocks = every_nth_block(blocks, config.checkpoint_every)
        if not blocks:
            raise DlperfError(f"--checkpoint-every {config.checkpoint_every}: {config.model!r} "
                              f"has {len(cap.blocks)} blocks, so none would be checkpointed; "
                              f"give at most {len(cap.blocks)}")
        record_ops = policy_ops(cap.records, costs, config.fusion)
        costs = with_recompute(costs, blocks, cap.saved_outputs, config.checkpoint_policy,
                               record_ops)
        megatron = megatron_modules(config.checkpoint_policy)
        if megatron:
            plan = recompute_mod.dropped_and_held(cap.records, blocks, megatron,
                                                  cap.saved_sizes, cap.saved_owners,
                                                  cap.param_keys)
            activations = recompute_mod.at_rest(cap.saved_bytes, plan, cap.saved_sizes,
                                                liveness.sizes(cap.records))
        else:
            activations = checkpointed_activations(cap, blocks, cap.blocks) + kept_bytes(
                costs, blocks, config.checkpoint_policy, record_ops,
                {r.index: sum(t.nbytes for t in r.outputs) for r in cap.records})
    memory = memory_footprint(model, config, activations, element_bytes=state_bytes)
    if config.train:
        # the most the step's tensors hold at once (liveness.py: in flight as well as at rest),
        # from the eager capture; Megatron's selective recompute checkpoints no whole block:
        # it frees some tensors and holds others (recompute.py)
        checkpointed = (blocks if config.activation_checkpointing and plan is None
                        else frozenset())
        kept = (kept_keys(costs, checkpointed, config.checkpoint_policy, record_ops, by_index)
                if checkpointed else frozenset())
        remade, held = recompute_mod.remade_and_held(plan or {})
        top = liveness.peak(cap.records, cap.param_keys, checkpointed, kept, cap.saved_owners,
                            cap.saved_sizes, remade, held)
        where = by_index.get(top["record"])
        memory = liveness.with_peak(memory, top["bytes"],
                                    f"{where.module or 'the model'}: {where.op}, {where.phase}"
                                    if where is not None else None)
    return costs, uncounted, time.perf_counter() - start, memory


def every_nth_block(blocks, every: int) -> frozenset[str]:
    """The blocks a checkpoint of every ``every``-th block wraps: counted from 1 in model
    order, those whose count is a multiple of ``every`` (fms-fsdp's
    ``apply_fsdp_checkpointing`` and torchtitan's layer-selective AC both count each
    transformer block as they wrap it and checkpoint when ``count % every == 0``): every = 2
    takes the 2nd, 4th, ... block, i.e. half of them; 1 takes all."""
    return frozenset(b for i, b in enumerate(ordered_blocks(blocks), start=1)
                     if i % every == 0)


# torchtitan's op-level policy saves these outputs too (its _save_list since 2025-02: "for
# low precision training, always save the absolute maximum used to compute the scaling
# factor"; kept_by_policy on its list of 2024-12, which named abs too)
POLICY_SAVED_OPS = frozenset({"max"})


def policy_ops(records: list, costs: list, fusion: str) -> dict[int, str]:
    """Record index -> op, as ``kept_by_policy`` reads a generated kernel's members: without
    those only the policy's saved ops of the same kernel read (``compiled.internal_readers``:
    the amax kernel's ``abs``, which the saved amax stands for: the partitioner neither saves
    nor recomputes it)."""
    ops = {r.index: r.op for r in records}
    if fusion not in COMPILED:
        return ops
    inner = compiled_mod.internal_readers(costs, records)
    return {i: op for i, op in ops.items()
            if not (i in inner and all(ops[j] in POLICY_SAVED_OPS for j in inner[i]))}


def policy_mm(c) -> bool:
    """A forward GEMM torchtitan's op-level policy counts as ``aten.mm``: a BF16 one, or a
    torchao float8 layer's (models/float8.py). torchao calls ``torch.mm`` on its
    ``Float8Tensor``s, and the policy's dispatch mode sees that ``aten.mm`` before the
    subclass turns it into ``aten._scaled_mm`` (modes come before subclasses); TE's FP8 GEMMs
    (models/fp8.py) are its own ops, which the policy never sees as a matmul."""
    return c.op == "mm" or (c.op == "_scaled_mm" and c.module_type == "Float8Linear")


def kept_by_policy(block_kernels: list, policy: str, record_ops: dict | None = None
                   ) -> list[bool]:
    """Per forward kernel of one block (in order): does the checkpoint keep its output instead
    of recomputing it? "full": none. "selective-op": torchtitan's op-level selective AC
    (torchtitan/parallelisms/parallelize_llama.py, 2024: ``_save_list`` and its policy): the
    outputs of fused attention and of every odd-numbered ``aten.mm`` in the block (the 1st, 3rd,
    ...: a Llama block keeps q, v, w1 and w2 and recomputes k, o and w3), everything else
    recomputed (norms, rotary, activations, casts, and matmuls with a bias: ``addmm``).
    torchao's float8 layers' GEMMs count as ``aten.mm`` (``policy_mm``): a float8 block keeps
    the same outputs, as the published memory says (torchtitan's Llama 3 8B on 8 H100s: 76.8
    GiB in float8, 77.0 in BF16; torchao's README: 47.77 and 47.65). It also saves ``max``
    (``POLICY_SAVED_OPS``): a float8 cast's amax. A generated kernel (``--fusion compile``)
    is kept when all its records are (``record_ops``: record index -> op, without the records
    only the saved ops beside it read, ``policy_ops``: the amax kernel's ``abs``).
    torchtitan's list of 2024-12 (commit 9dec370, its float8 tables) named ``abs`` too:
    compiled, that kept nothing more (the partitioner saves what the backward reads, and
    |x| is read by its amax only); eager it kept every cast's |x| (not modelled: the list
    dropped it in 2025-02, torchtitan #820, after it kept |W| of a rowwise cast's weight).
    "selective-attention": Megatron-LM's selective activation recomputation
    (--recompute-granularity selective; Korthikanti et al., arXiv 2205.05198, section 5): only
    the attention core is recomputed (Q Kᵀ, the mask and softmax, the dropout on the
    probabilities, times V, or the one fused attention kernel): the kernels an attention module
    (its path's last name holding "attn" or "attention") runs itself, not its projections'
    matmuls; everything else is kept."""
    if policy == "full":
        return [False] * len(block_kernels)
    modules = megatron_modules(policy)
    if modules:  # (recompute.py: the norms, the experts' activation, the attention core)
        return [not (recompute_mod.output_discarded(c.module, c.module_type, modules)
                     or recompute_mod.in_core(c.module, c.op, modules))
                for c in block_kernels]
    kept, mm = [], 0
    for c in block_kernels:
        mm += policy_mm(c)
        ops = ([record_ops[i] for i in c.records if i in record_ops]
               if record_ops is not None and c.records else [c.op])
        kept.append(c.kind == "fused" or (policy_mm(c) and mm % 2 == 1)
                    or bool(ops) and all(op in POLICY_SAVED_OPS for op in ops))
    return kept


def _block_forwards(costs: list, blocks: set[str]) -> dict[str, list]:
    forward: dict[str, list] = {}
    for c in costs:
        block = capture_mod.block_path(c.module, blocks)
        if c.phase == "forward" and block in blocks:
            forward.setdefault(block, []).append(c)
    return forward


def with_recompute(costs: list, blocks: set[str], saved_outputs: set[int],
                   policy: str = "full", record_ops: dict | None = None) -> list:
    """Activation checkpointing per block: each block's forward kernels run again (phase
    "recompute") just before the block's first backward kernel, as torch.utils.checkpoint
    replays them when the backward reaches the block, and only up to the last kernel whose
    output the backward needs (``saved_outputs``: record indices): checkpoint stops there
    (early stop, torch's default), so e.g. a transformer block's last projection is not
    recomputed. With a selective ``policy`` the kernels whose outputs it keeps
    (``kept_by_policy``) are not run again."""
    replay = {}
    for block, group in _block_forwards(costs, blocks).items():
        needed = [i for i, c in enumerate(group) if saved_outputs.intersection(c.records)]
        kept = kept_by_policy(group, policy, record_ops)
        replay[block] = [dataclasses.replace(c, phase="recompute")
                         for c, keep in zip(group[:needed[-1] + 1], kept) if not keep
                         ] if needed else []
    out, done = [], set()
    for c in costs:
        block = capture_mod.block_path(c.module, blocks)
        if c.phase in ("dgrad", "wgrad") and block in replay and block not in done:
            out.extend(replay[block])
            done.add(block)
        out.append(c)
    return out


def kept_bytes(costs: list, blocks: set[str], policy: str, record_ops: dict | None = None,
               record_bytes: dict | None = None) -> int:
    """Bytes a selective policy keeps on top of full checkpointing: the outputs of the kernels
    it saves, in every block (full: none). In a generated kernel (``--fusion compile``) the
    policy's saved ops keep their own outputs, which the policy makes the kernel write
    (``record_bytes``: record index -> output bytes), whether or not the kernel is replayed
    for its other members (an amax fused into the SwiGLU product it reads)."""
    if policy == "full":
        return 0

    def held(c, keep: bool) -> int:
        if record_ops is not None and record_bytes is not None and c.op == "compiled":
            return sum(record_bytes[i] for i in c.records
                       if record_ops.get(i) in POLICY_SAVED_OPS)
        return c.output_bytes if keep else 0

    return sum(held(c, keep) for group in _block_forwards(costs, blocks).values()
               for c, keep in zip(group, kept_by_policy(group, policy, record_ops)))


def kept_keys(costs: list, blocks: set[str], policy: str, record_ops: dict,
              by_index: dict) -> frozenset:
    """The storage keys a selective ``policy`` keeps through the step (``kept_bytes``' outputs,
    for liveness.peak): of a generated kernel, its saved ops' outputs only."""
    if policy == "full":
        return frozenset()
    out = set()
    for group in _block_forwards(costs, blocks).values():
        for c, keep in zip(group, kept_by_policy(group, policy, record_ops)):
            for i in c.records:
                if (record_ops.get(i) in POLICY_SAVED_OPS if c.op == "compiled" else keep):
                    out.update(t.key for t in by_index[i].outputs)
    return frozenset(out)


def checkpointed_activations(cap, blocks: set[str], all_blocks=None) -> int:
    """What a checkpointed step keeps at its peak: everything saved outside the blocks, each
    checkpointed block's input (checkpoint holds it), all a block left unwrapped saves
    (``all_blocks``: the model's blocks, when ``blocks`` is some of them: every_nth_block),
    and during a checkpointed block's backward its own activations again (recomputed; its
    input, when the block saves it, already counted), on top of what the blocks before it
    hold then: the peak is the largest of the end of the forward and those moments."""
    all_blocks = blocks if all_blocks is None else all_blocks
    inside: dict[str, int] = {}
    outside = 0
    for module, nbytes in cap.saved_by_module.items():
        block = capture_mod.block_path(module, all_blocks)
        if block in all_blocks:
            inside[block] = inside.get(block, 0) + nbytes
        else:
            outside += nbytes
    held = peak = outside  # (outside the blocks: held throughout, a bound)
    for b in ordered_blocks(all_blocks):
        if b in blocks:
            kept = cap.input_bytes.get(b, 0)
            replayed = inside.get(b, 0) - cap.saved_sizes.get(cap.input_keys.get(b), 0)
            peak = max(peak, held + kept + replayed)
        else:
            kept = inside.get(b, 0)
        held += kept
    return max(peak, held)


# optimizer state per trainable parameter, in parameter elements (SGD: momentum; AdamW: two
# moments)
OPTIMIZER_STATE_PER_PARAM = {"sgd": 1, "adamw": 2, "none": 0}


def memory_footprint(model: torch.nn.Module, config: AnalysisConfig, activation_bytes: int,
                     element_bytes: int = 4) -> dict:
    """What one device holds at the peak of a training step (the end of the forward, when every
    activation the backward needs is alive): weights and buffers, gradients, optimizer state,
    and the activations autograd saved (measured in the capture, each storage once). Not
    counted: the allocator's fragmentation and cache, cuDNN/cuBLAS workspaces, the CUDA
    context (~0.5-1 GB), temporaries inside one op."""
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    train = config.train
    out = {"parameters": params,
           # (with the FP8 copies TransformerEngine keeps of its layers' weights)
           "weights_bytes": params * element_bytes + buffers + fp8_weight_bytes(model),
           "gradients_bytes": trainable * element_bytes if train else 0,
           "optimizer_state_bytes": (OPTIMIZER_STATE_PER_PARAM[config.optimizer] * trainable
                                     * element_bytes if train else 0),
           "activations_bytes": activation_bytes if train else 0}
    out["total_bytes"] = sum(v for k, v in out.items() if k.endswith("_bytes"))
    return out


def predict_on(costs: list, uncounted: dict, config: AnalysisConfig, spec: DeviceSpec,
               capture_seconds: float = 0.0, efficiency=None, memory: dict | None = None
               ) -> Analysis:
    """The device half: roofline predictions and the checklist's findings on ``spec``
    (``efficiency``: a hardware.efficiency.Efficiency; default, the one for ``spec``)."""
    from dlperf.analysis.rules import findings

    config = dataclasses.replace(config, device=spec.name)
    efficiency = efficiency or efficiency_for(spec, config.attention_kernel)
    analysis = Analysis(device=spec, config=config,
                        predictions=[predict(c, spec, tf32=config.tf32, efficiency=efficiency)
                                     for c in costs],
                        uncounted=uncounted, capture_seconds=capture_seconds,
                        efficiency=efficiency, memory=memory)
    analysis.findings = findings(analysis)
    return analysis


def analyze_model(model: torch.nn.Module, config: AnalysisConfig, spec: DeviceSpec | None = None,
                  input_dtype: torch.dtype = torch.float32) -> Analysis:
    spec = spec or get_device(config.device)
    costs, uncounted, seconds, memory = capture_costs(model, config, input_dtype)
    return predict_on(costs, uncounted, config, spec, seconds, memory=memory)


# Defaults that decide a result, shared by `dlperf analyze` and ``analyze()`` so the command
# and the Python API answer the same question the same way: a step of 256 images or 8 token
# sequences, updated by SGD (image models, as the ResNet-50 recipe) or AdamW (token models,
# as GPT and BERT are trained).
DEFAULT_BATCH = {"image": 256, "tokens": 8}


def default_batch_size(tokens: bool) -> int:
    return DEFAULT_BATCH["tokens" if tokens else "image"]


def default_optimizer(tokens: bool) -> str:
    return "adamw" if tokens else "sgd"


def analyze(model, example_input_shape, device: str | DeviceSpec = "h100-sxm", dtype: str = "bf16",
            train: bool = True, tf32: bool = False, channels_last: bool = False,
            input_dtype: torch.dtype | None = None, optimizer: str = "auto",
            precision: str = "mixed", activation_checkpointing: bool = False,
            checkpoint_policy: str = "full", fusion: str = "none",
            cuda_graphs: bool = False, optimizer_impl: str = "fused",
            checkpoint_every: int = 1,
            attention_kernel: str | None = None, loss: str | None = None,
            train_metrics: int | None = None) -> Analysis:
    """Per-layer roofline of ``model`` (an nn.Module or a model name) on ``device``.

    ``example_input_shape`` includes the batch dimension, e.g. ``(256, 3, 224, 224)``; for a
    token model, ``(batch, seq_len)`` with ``input_dtype=torch.long``. ``precision``: "mixed"
    (torch.autocast in ``dtype``), "half" (the model cast to ``dtype``, ``model.half()``) or
    "fsdp" (FSDP's mixed precision: ``AnalysisConfig.precision``).
    ``optimizer``: the update counted in a training step; "auto" is ``default_optimizer``
    (AdamW for token models, SGD otherwise), as `dlperf analyze` counts it.
    ``activation_checkpointing``: recompute each block's forward in the backward;
    ``checkpoint_policy``: "full", "selective-op" or "selective-attention"
    (``kept_by_policy``); ``checkpoint_every``: only every n-th block checkpointed
    (``every_nth_block``).
    ``fusion``: the fused kernels, one of ``FUSIONS`` (analysis/fusion.py; "compile" for
    torch.compile, analysis/compiled.py);
    ``cuda_graphs``: the step replayed as a CUDA graph (no CPU issue time per kernel).
    ``optimizer_impl``: "fused", "foreach" or "for-loop" (``AnalysisConfig.optimizer_impl``).
    ``attention_kernel``: the fused attention kernel, "flash2", "triton-2023" or "cudnn"
    (``AnalysisConfig.attention_kernel``); None: ``default_attention_kernel`` (the MPT
    presets ran llm-foundry's Triton kernel; else what the installed PyTorch's SDPA picks on
    ``device``: "cudnn" on Hopper and B200 from torch 2.11, "flash2" otherwise).
    ``loss``: how the loss computes cross-entropy, "fp32", "half" or "fused"
    (``AnalysisConfig.loss``, models/losses.py); None: ``default_loss`` (the MPT presets ran
    llm-foundry's fused kernel; else "fp32").
    ``train_metrics``: cross-entropy metrics evaluated on each micro-batch's logits after its
    backward (``AnalysisConfig.train_metrics``); None: ``default_train_metrics`` (2 for the
    MPT presets, whose Composer runs computed two; else 0). Only with ``train``.
    """
    from dlperf.models.gpt import default_attention_kernel, default_loss, default_train_metrics

    name = model if isinstance(model, str) else type(model).__name__
    default_dtype = torch.float32
    if isinstance(model, str):
        from dlperf.models.registry import build_model

        model, model_input = build_model(model)
        default_dtype = model_input.dtype
    spec = device if isinstance(device, DeviceSpec) else get_device(device)
    input_dtype = input_dtype or default_dtype
    tokens = not input_dtype.is_floating_point
    cfg = AnalysisConfig(model=name, input_shape=tuple(example_input_shape), dtype=dtype,
                         tf32=tf32, train=train, channels_last=channels_last, device=spec.name,
                         optimizer=default_optimizer(tokens) if optimizer == "auto" else optimizer,
                         precision=precision, tokens=tokens and len(example_input_shape) == 2,
                         activation_checkpointing=activation_checkpointing,
                         checkpoint_policy=checkpoint_policy, checkpoint_every=checkpoint_every,
                         fusion=fusion, cuda_graphs=cuda_graphs,
                         optimizer_impl=optimizer_impl,
                         attention_kernel=(attention_kernel
                                           or default_attention_kernel(name, spec)),
                         loss=loss or default_loss(name),
                         train_metrics=(default_train_metrics(name) if train_metrics is None
                                        else train_metrics) if train else 0)
    return analyze_model(model, cfg, spec, input_dtype)
