"""The step's tensors over time: the peak of what is alive at once (issue #14, memory per GPU).

``capture.saved_bytes`` is what autograd keeps for the backward, the step at rest. A GPU's peak
is higher: at some moment the saved tensors share the memory with the ones in flight (the
loss's logits and their gradient, a checkpointed block's recomputed activations while its
backward runs). This follows every storage of the capture from the record that first makes it
to the last record that reads or writes it, in the order the records ran, and returns the
largest sum of those alive at once (``peak``), and at which record; a storage only the
records of one fused region touch (the scores of a fused attention, which the capture records
as the math it stands for) never exists. Pure functions over the capture's records.

Left out: the parameters and the tensors that share their storage (``param_keys``; the
sharded state is ``scaling.memory_per_gpu``'s; their autocast or FP8 copies are counted), the
gradients of the parameters (accumulated in ``.grad``: the same), what a Python variable
holds beyond its last use, the allocator's cache, and kernel workspaces. Under torch.compile
the tensors are the eager capture's (a fused kernel's intermediates counted as eager makes
them: torchtitan measured 5.4 GiB less compiled, benchmarks/validation/published_memory.csv).
With activation checkpointing (``checkpointed``: the blocks a checkpoint wraps) a tensor made
and read only inside one such block's forward is freed after its last forward use and made
again when the block's backward starts (the recompute), unless the checkpoint keeps it
(``kept``: the storage keys a selective policy saves); what crosses a block's boundary (its
input, its output) lives as it does without checkpointing, the checkpoint holding the block's
input. What autograd saved lives until its module's backward has run (``saved``). Under
Megatron's selective recompute (recompute.py) no block is checkpointed whole: the keys it
frees (``remade``) live over their forward uses, and again from their first use in the
backward (the recompute just before it) to their last; the core's inputs a checkpoint holds
(``held``) live until the keys it remakes from them are done with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (torch-free at import: the reports read ``peak_total`` without a capture)
    from dlperf.analysis.capture import OpRecord, TensorMeta


def _owner_spans(records: list[OpRecord], owners: set[str]) -> dict[str, list[int]]:
    """Each of ``owners`` (module paths) -> [its first forward record, its last backward
    record, its first backward record] (of it or its children; None where it has none)."""
    out: dict[str, list] = {}
    for r in records:
        path = r.module
        while True:
            if path in owners:
                span = out.setdefault(path, [None, None, None])
                if r.phase != "forward":
                    span[1] = r.index
                    if span[2] is None:
                        span[2] = r.index
                elif span[0] is None:
                    span[0] = r.index
            if not path:
                break
            path = path.rpartition(".")[0]
    return out


def _intervals(records: list[OpRecord], param_keys, checkpointed: frozenset,
               kept: frozenset, saved: dict | None = None, remade: frozenset = frozenset(),
               held: dict | None = None) -> dict[int, list[tuple[int, int]]]:
    """Storage key -> the record intervals [first, last] it is alive over."""
    from dlperf.analysis.capture import block_path

    first: dict[int, int] = {}
    last: dict[int, int] = {}
    forward_last: dict[int, int] = {}
    backward_last: dict[int, int] = {}
    backward_first: dict[int, int] = {}
    maker_block: dict[int, str] = {}  # key -> the checkpointed block that made it
    outside: set[int] = set()  # keys read or written outside their maker's block forward
    block_backward: dict[str, int] = {}  # block -> its first backward record (the recompute)
    region: dict[int, str | None] = {}  # key -> the one fused region every use is in, or None
    for r in records:
        block = block_path(r.module, checkpointed) if checkpointed else ""
        forward = r.phase == "forward"
        if not forward and block and block not in block_backward:
            block_backward[block] = r.index
        for pos, t in enumerate(r.inputs + r.outputs):
            k = t.key
            if k in param_keys:
                continue
            region[k] = r.region if region.get(k, r.region) == r.region else None
            if k not in first:
                first[k] = r.index
                if forward and block and pos >= len(r.inputs):
                    maker_block[k] = block
            last[k] = r.index
            if forward:
                forward_last[k] = r.index
                if maker_block.get(k) != block:
                    outside.add(k)
            else:
                backward_last[k] = r.index
                backward_first.setdefault(k, r.index)
    # what autograd saved lives until its module's backward has run, read there or not: a
    # fused kernel's backward (attention's) reads its saved q, k, v and output under no
    # record's key, as the capture records the math the kernel stands for; what the kernel
    # alone makes and saves (attention's log-sum-exp) has no record at all, and lives over
    # its module's forward and backward (under checkpointing too: a few bytes a token)
    saved = saved or {}
    owner_span = _owner_spans(records, set(saved.values()))
    for k, owner in saved.items():
        made, freed, backward = owner_span.get(owner, (None, None, None))
        if k not in first and made is not None:
            first[k], region[k] = made, None
        if k in first and freed is not None and freed > last.get(k, -1):
            last[k] = backward_last[k] = freed
        if k in remade and backward is not None:
            # (remade for a backward that reads it under no record's key: its module's)
            backward_first.setdefault(k, backward)
    for k, waits in (held or {}).items():
        if k in last:
            last[k] = max([last[k]] + [last[d] for d in waits if d in last])
    out: dict[int, list[tuple[int, int]]] = {}
    for k, start in first.items():
        if region[k] is not None:
            continue  # inside one fused kernel (attention's scores): never in memory
        if k in remade:  # freed after the forward, made again for the backward
            spans = [(start, forward_last.get(k, start))]
            if k in backward_first:
                spans.append((backward_first[k], last[k]))
            out[k] = spans
            continue
        b = maker_block.get(k)
        if b is not None and k in kept:
            # a checkpoint keeps what its policy saves until the recompute has used it (the
            # replay reads the cached output), even where the backward itself does not
            out[k] = [(start, max(last[k], block_backward.get(b, last[k])))]
            continue
        if b is None or k in outside:
            out[k] = [(start, last[k])]
            continue
        spans = [(start, forward_last.get(k, start))]
        if k in backward_last and b in block_backward:  # made again by the recompute
            spans.append((min(block_backward[b], backward_last[k]), backward_last[k]))
        out[k] = spans
    return out


def extent(t: TensorMeta) -> int:
    """The bytes of storage a view spans (an expanded view, of stride 0, spans its source's,
    not its shape's)."""
    if any(s == 0 for s in t.shape):
        return 0
    last = t.offset + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride))
    return (last + 1) * t.itemsize


def sizes(records: list[OpRecord]) -> dict[int, int]:
    """Storage key -> bytes: the most of it any record's view spans."""
    out: dict[int, int] = {}
    for r in records:
        for t in r.inputs + r.outputs:
            out[t.key] = max(out.get(t.key, 0), extent(t))
    return out


def peak(records: list[OpRecord], param_keys=frozenset(), checkpointed=frozenset(),
         kept=frozenset(), saved: dict | None = None, saved_sizes: dict | None = None,
         remade=frozenset(), held: dict | None = None) -> dict:
    """The most bytes alive at once over the step (see the module docstring): ``bytes`` and
    ``record`` (the index of the record at that moment). ``saved``: the storage keys autograd
    saved, to the module that saved each (``Capture.saved_owners``); ``saved_sizes``: their
    bytes (``Capture.saved_sizes``: the size of those no record touches). ``remade`` and
    ``held``: Megatron's selective recompute (recompute.py): the keys it frees and makes
    again, and those a checkpoint holds, to the remade keys they wait for."""
    size = {**(saved_sizes or {}), **sizes(records)}
    delta: dict[int, int] = {}
    for k, spans in _intervals(records, frozenset(param_keys), frozenset(checkpointed),
                               frozenset(kept), saved, frozenset(remade), held).items():
        for start, end in spans:
            delta[start] = delta.get(start, 0) + size[k]
            delta[end + 1] = delta.get(end + 1, 0) - size[k]
    alive, best, at = 0, 0, None
    for i in sorted(delta):
        alive += delta[i]
        if alive > best:
            best, at = alive, i
    return {"bytes": best, "record": at}


def with_peak(memory: dict, activations_peak: int | None, at: str | None = None) -> dict:
    """``memory`` (a footprint whose ``total_bytes`` holds the activations at rest) with the
    step's peak beside it: ``activations_peak_bytes``, what the step's tensors hold at their
    busiest moment (``peak``; never below the activations at rest, which are all alive at the
    end of the forward: a policy's bookkeeping this does not follow cannot lower it), and
    ``peak_bytes``, the total with those in place of the ones at rest; ``peak_at``: where in
    the step (a module and op), if known. Call it on a summed total; a total summed again from
    the ``_bytes`` parts must leave these two out."""
    rest = memory["activations_bytes"]
    top = max(rest, activations_peak if activations_peak is not None else rest)
    out = {**memory, "activations_peak_bytes": top,
           "peak_bytes": memory["total_bytes"] - rest + top}
    if at is not None:
        out["peak_at"] = at
    return out


def peak_total(memory: dict) -> int:
    """What a footprint needs at its peak: ``peak_bytes`` where the step's tensors were followed
    (``with_peak``), else its total (inference, a footprint made without a capture)."""
    return memory.get("peak_bytes", memory["total_bytes"])
