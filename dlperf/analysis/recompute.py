"""What Megatron's selective recompute frees, as storage keys (issue #14, memory per GPU).

Megatron-Core's ``--recompute-granularity selective --recompute-modules ...`` (dlperf's
"selective-attention" policy is its default, ``core_attn``; "modules:NAME,..." names others)
recomputes parts of each block in the backward in two ways (Megatron-Core's
``TransformerConfig.recompute_modules``: "moe_act", "layernorm" [...] use output-discarding
checkpointing, "core_attn" [...] normal checkpointing"):

- **output-discarding** ("layernorm", "moe_act": ``CheckpointWithoutOutput``): the module runs
  without autograd keeping anything, its output's storage is freed once the next GEMM has
  read it, and a hook on that GEMM's output gradient makes it again just before the GEMM's
  backward. Freed: everything the norm's or the activation's kernels saved, their outputs
  included, though the GEMM after them saved that output too.
- **normal** ("core_attn": ``tensor_parallel.checkpoint`` around the attention core): the core
  keeps its inputs (q, k and v) and its output stays alive as any other tensor; what its
  kernels saved inside is freed and made again when the backward reaches the core. In
  dlperf's models the core is an attention module's own kernels but its GEMMs (the rotary
  embedding and the layout copies included: Megatron applies the rotary before the core, so
  its inputs are the rotated q and k, of the same size as the projections' outputs held here).

``dropped_and_held`` returns those keys per block; ``at_rest`` the activations they leave, and
``liveness.peak`` follows them through the step (``remade_and_held``). Pure functions over the
capture's records.
"""

from __future__ import annotations

from dataclasses import dataclass

# the modules a block's "layernorm" names (models/gpt.py's norms, TransformerEngine's fused one)
NORM_MODULE_TYPES = frozenset({"RMSNorm", "FusedRMSNorm", "LayerNorm"})
# the GEMMs of an attention module that are its projections, not its core
PROJECTION_OPS = ("mm", "addmm")


def is_attention_module(path: str) -> bool:
    """Is ``path`` (a module's dotted name) an attention module (``blocks.3.attn``,
    ``encoder_layer_0.self_attention``), not one of its children (``blocks.3.attn.qkv``)?"""
    name = path.rsplit(".", 1)[-1].lower()
    return "attn" in name or "attention" in name


def output_discarded(module: str, module_type: str, modules: frozenset[str]) -> bool:
    """Does one of Megatron's output-discarding ``modules`` run the kernels of ``module``: a
    norm ("layernorm"), a mixture of experts' activation ("moe_act": models/gpt.py's
    ``blocks.N.moe.act``)?"""
    return (("layernorm" in modules and module_type in NORM_MODULE_TYPES)
            or ("moe_act" in modules and module.endswith(".moe.act")))


def in_core(module: str, op: str, modules: frozenset[str]) -> bool:
    """Is a kernel of ``module`` running ``op`` part of the attention core "core_attn"
    recomputes: an attention module's own kernel, not its projections' GEMMs?"""
    return "core_attn" in modules and is_attention_module(module) and op not in PROJECTION_OPS


@dataclass(frozen=True)
class BlockRecompute:
    """One block under Megatron's selective recompute: ``dropped``, the saved storage keys
    freed after the forward and made again in the backward; ``held``, the keys the normal
    checkpoint keeps as the core's inputs that autograd would not have kept."""
    dropped: frozenset
    held: frozenset


def dropped_and_held(records: list, blocks: set[str], modules: frozenset[str],
                     saved_sizes: dict, saved_owners: dict, param_keys=frozenset()
                     ) -> dict[str, BlockRecompute]:
    """Block -> what Megatron's ``modules`` free and hold in it (see the module docstring).
    ``saved_sizes``: the keys autograd saved (``Capture.saved_sizes``); ``saved_owners``: the
    module that saved each (a fused attention's log-sum-exp, which no record makes, is its
    attention module's)."""
    from dlperf.analysis.capture import block_path

    maker: dict[int, object] = {}  # key -> the forward record that first wrote it
    core_readers: dict[int, set] = {}  # key -> the core kernels (by block) that read it
    outside_read: set[int] = set()  # keys a forward kernel outside the core reads
    touched: set[int] = set()  # keys any forward kernel reads or writes
    core: set[int] = set()  # record indices of the core kernels
    for r in records:
        if r.phase != "forward":
            continue
        if in_core(r.module, r.op, modules) and block_path(r.module, blocks) in blocks:
            core.add(r.index)
        read = {t.key for t in r.inputs}
        touched |= read | {t.key for t in r.outputs}
        for t in r.outputs:
            if t.key not in read:  # (a view makes nothing: a buffer's first view is not its maker)
                maker.setdefault(t.key, r)
        for t in r.inputs:
            if r.index in core:
                core_readers.setdefault(t.key, set()).add(block_path(r.module, blocks))
            else:
                outside_read.add(t.key)
    dropped: dict[str, set] = {b: set() for b in blocks}
    held: dict[str, set] = {b: set() for b in blocks}
    for k, r in maker.items():
        b = block_path(r.module, blocks)
        if b not in blocks or k in param_keys:
            continue
        if k in saved_sizes and (output_discarded(r.module, r.module_type, modules)
                                 or (r.index in core and k not in outside_read)):
            dropped[b].add(k)
    for k, owner in saved_owners.items():
        b = block_path(owner, blocks)
        if k not in touched and b in blocks and in_core(owner, "", modules):
            dropped[b].add(k)
    for k, readers in core_readers.items():
        r = maker.get(k)
        if r is None or r.index in core or k in saved_sizes or k in param_keys:
            continue  # (a buffer, a key autograd keeps anyway, or the core's own)
        for b in readers:
            held[b].add(k)
    return {b: BlockRecompute(frozenset(dropped[b]), frozenset(held[b])) for b in blocks}


def at_rest(saved_bytes: int, plan: dict[str, BlockRecompute], saved_sizes: dict,
            sizes: dict) -> int:
    """The activations a step keeps at the end of its forward under ``plan``, with one block's
    dropped tensors back (the largest: its backward remakes them while the others stay
    freed): what autograd saved, less every block's dropped keys, plus the inputs the
    checkpoints hold. ``sizes``: storage key -> bytes (``liveness.sizes``)."""
    freed = [sum(saved_sizes[k] for k in p.dropped) for p in plan.values()]
    held = sum(sizes.get(k, 0) for p in plan.values() for k in p.held)
    return saved_bytes - sum(freed) + max(freed, default=0) + held


def remade_and_held(plan: dict[str, BlockRecompute]) -> tuple[frozenset, dict]:
    """``plan`` as ``liveness.peak`` takes it: every dropped key (``remade``), and each held
    key to the dropped keys it waits for (a key several blocks' cores read waits for all)."""
    remade = frozenset(k for p in plan.values() for k in p.dropped)
    held: dict = {}
    for p in plan.values():
        for k in p.held:
            held[k] = held.get(k, frozenset()) | p.dropped
    return remade, held
