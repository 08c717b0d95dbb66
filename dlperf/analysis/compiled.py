"""A training step as torch.compile's Inductor runs it: the memory-bound kernels of each stretch
between two library kernels fused into generated ones (``--fusion compile`` and
``compile-blocks``; issue #14). Pure functions over the capture's records and their costs.

Eager PyTorch runs one kernel per memory-bound op, each reading its inputs from memory and
writing its output there: a Llama block's RMSNorm alone is seven kernels (a cast, a square, a
mean, an add, an rsqrt, two multiplies) and its SwiGLU three (the guide's section on
memory-bound layers: fuse them). Inductor keeps the GEMMs, convolutions and fused attention in
their libraries (cuBLAS, cuDNN, FlashAttention: "extern kernels") and generates Triton kernels
for everything between them, fusing producer and consumer so that a tensor made and used inside
one kernel never goes to memory. The model here:

* **Fused kernels.** Two memory-bound kernels of one graph (the forward, or the backward:
  AOTAutograd compiles them apart) and one block (``capture.block_paths``: torchtitan compiles
  each transformer block on its own, ``apply_compile``, and a checkpointed block's recompute
  replays its own kernels only) fuse when one reads what the other wrote (vertical fusion) or
  both read one tensor (horizontal fusion, Inductor's shared-read score), unless some other
  kernel would then have to run between two members (``groups``: Inductor's fusion-cycle
  check, followed through the groups formed so far); a group holds reductions to one shape at
  most (a Triton kernel reduces over one axis: a norm's weight gradient, summed over the
  tokens, is a kernel apart from its input gradient, summed over the features). Eager
  PyTorch's issue order does not matter: SwiGLU's SiLU, issued before the second projection's
  GEMM, fuses with the product after it. Consumers are joined first: Inductor computes a
  pointwise result inside the kernel that uses it, so a kernel that could join either its
  producer's group or its consumer's goes with the consumer (a float8 cast's upcast to FP32
  is not written between a norm and the cast). A reduction to one value (a float8 cast's
  amax over a whole tensor: ``split_reduction``) is two launches, and what uses its value
  runs in a kernel after both. On a transformer the groups are what Inductor
  generates: one kernel per norm (with the residual add before it), per SwiGLU, per rotary
  embedding.
* **Traffic.** A fused kernel reads each tensor it takes from outside once (tensors told apart
  by storage, offset, shape and stride, so q and k split from one projection are two reads)
  and writes each tensor that something outside it reads: a library kernel, another fused
  kernel, the backward, or nothing the step records (a parameter's gradient, the loss). A
  member's read of a tensor is capped at what its own eager kernel reads (a gather: the
  negative log-likelihood reads one log-probability per target, not the N x C input). A
  two-pass op keeps its second pass (hardware/efficiency.py ``TRAFFIC_FACTOR``: a batch norm's
  statistics over batch and pixels before it normalises, too many values for a kernel to hold
  between the two; its backward's reductions before dx), and so does an outer reduction (down
  the rows: a column's amax, ``outer_reduction``) whose value a member after it applies to
  the same rows (a float8 cast per feature reads its input twice); a reduction along the rows
  (a norm, a token's amax) has its row in cache when it finishes.
* **Recompute instead of save.** AOTAutograd's partitioner (``min_cut_rematerialization_
  partition``, torch.compile's default for training) saves the fewest bytes for the backward
  and recomputes cheap pointwise work there. So a forward tensor made by a pointwise kernel
  (or a copy or a fill) whose only readers outside its kernel are memory-bound kernels of the
  backward is not written: the backward's kernel recomputes it, reading its sources (the
  tensors its forward kernel read to make it) instead. A reduction's output (a norm's rstd:
  small), anything made from random numbers (a dropout's mask) and anything a library kernel
  of the backward reads (a GEMM's saved input) are written.
* **Rates.** A fused kernel runs at the device's streaming bandwidth (generated code, not
  ATen's kernels: hardware/efficiency.py's memory classes describe the eager ones), one launch.

``compile`` (``torch.compile(model)``) fuses everywhere in the model, its root too (embedding,
final norm, output head), but not the loss, which trainers compute outside the compiled module;
``compile-blocks`` only inside the blocks, the root's kernels staying eager as torchtitan's
per-block compile leaves them. Library kernels, the optimizer (compiled apart, if
at all; dlperf charges its own fused or foreach kernels), TransformerEngine's own fused ops and
complex-valued work (Inductor generates no code for complex operators: torchtitan's rotary
multiply runs as ATen's kernel, ``generated``) are left as they are.

Against Inductor's own output (its C++ backend on a CPU, ``benchmarks/compile_kernels_cpu.py``):
the same fused kernels for SwiGLU, RMSNorm (with and without its weight), a GEMM between two
elementwise kernels and the product of two halves of one projection, forward and backward. On
a whole model it fuses a little more: across a block boundary (a block's last residual add with
the next block's norm: one read of the residual stream less per block, which dlperf keeps so
that checkpointing and FSDP units see whole blocks) and, in its C++ backend, independent loops
of one size (the key and value repeats of grouped-query attention) that a GPU's Triton kernels
fuse only when they share a read.

Memory: the backward keeps what eager autograd kept less the recomputed pointwise results
(``saved_bytes``; a Llama 2 7B step at 2 x 4,096 tokens keeps 32.3 GiB where eager keeps
45.8: benchmarks/results/predict-llama2-7b-a100-{eager,compile}.json); with activation
checkpointing the footprint stays the eager one's.

Not modelled: Inductor's GEMM epilogue fusion and autotuned Triton GEMMs (off by default:
``max_autotune``), CUDA graphs (``mode="reduce-overhead"``: ``--cuda-graphs``), and graph
breaks (a model that breaks its graph fuses less).
"""

from __future__ import annotations

import dataclasses

from dlperf.analysis.capture import OUTSIDE_MODEL, OpRecord, TensorMeta, block_path
from dlperf.analysis.costs import ALLOCATIONS, FILL_OPS, FREE_OPS, Cost
from dlperf.hardware.efficiency import traffic_factor

# the kernels Inductor generates code for (and so may fuse): memory-bound ones
FUSIBLE_KINDS = frozenset({"memory", "copy", "transpose", "fill"})
COMPILED_OP = "compiled"  # the op name of a generated kernel (streams: efficiency.py's default)
# Inductor's no-split threshold (``_inner_reduction_no_split_threshold`` before Blackwell): a
# reduction to one value of up to this many elements runs as one kernel
SPLIT_REDUCTION_MIN = 8192
# kernels that draw random numbers: what they make cannot be recomputed in the backward (the
# partitioner saves a dropout's mask; replaying the generator, functionalize_rng_ops, is off by
# default)
RANDOM_OPS = frozenset({"native_dropout", "dropout", "bernoulli", "bernoulli_", "rand",
                        "rand_like", "randn", "randn_like", "randint", "uniform_", "normal_"})


def fusible(c: Cost) -> bool:
    """Whether Inductor generates this kernel (see the module docstring): a memory-bound kernel
    of one op, not a convolution's own (its bias gradient runs inside cuDNN's call), not the
    optimizer's, not a TransformerEngine kernel (an opaque custom op to the compiler: its
    fused ones, ``te_*``, and its FP8 casts, ``fp8_*``, which also stand for the casts before
    FSDP's float8 all-gather, outside the compiled model: models/float8.py)."""
    return (len(c.records) == 1 and c.kind in FUSIBLE_KINDS and c.phase != "optimizer"
            and not c.op.startswith(("convolution", "te_", "fp8_")))


def generated(costs: list[Cost], by_index: dict) -> dict[int, int]:
    """The records whose kernels Inductor generates, each with its cost's position: the
    ``fusible`` ones but the loss's and the train metrics' (trainers compute them outside the
    compiled module: torchtitan, fms-fsdp, Composer) and complex-valued work ("Torchinductor
    does not support code generation for complex operators": torchtitan's rotary multiply in
    complex64 runs as ATen's kernel, a library kernel here, with the casts around it
    generated)."""
    return {c.records[0]: pos for pos, c in enumerate(costs)
            if fusible(c) and c.module not in OUTSIDE_MODEL and not any(
                t.dtype.startswith("complex")
                for t in by_index[c.records[0]].inputs + by_index[c.records[0]].outputs)}


def _graph(r: OpRecord) -> str:
    return "forward" if r.phase == "forward" else "backward"


def _flow(records: list[OpRecord]) -> tuple[dict, dict]:
    """(producer, readers): for each (record, input position) the record that last wrote that
    storage, in any phase (a backward record reading a forward one's output reads what autograd
    saved); for each (record, storage key) it wrote, the records that read it before it was
    overwritten. Views, reshapes and other ops that run no kernel pass their input's writer
    on."""
    writer: dict[int, int] = {}
    producer: dict[tuple[int, int], int] = {}
    readers: dict[tuple[int, int], set[int]] = {}
    for r in records:
        if r.is_view or r.op in FREE_OPS:
            # no kernel: what a view or a reshape outputs was written by its input's writer;
            # what an allocation outputs, by nobody yet
            w = (writer.get(r.inputs[0].key) if r.inputs and r.op not in ALLOCATIONS
                 else None)
            for t in r.outputs:
                if w is not None:
                    writer[t.key] = w
                else:
                    writer.pop(t.key, None)
            continue
        for pos, t in enumerate(r.inputs):
            w = writer.get(t.key)
            if w is not None:
                producer[(r.index, pos)] = w
                readers.setdefault((w, t.key), set()).add(r.index)
        for t in r.outputs:
            writer[t.key] = r.index
    return producer, readers


def _tensor_id(t: TensorMeta) -> tuple:
    return (t.key, t.offset, t.shape, t.stride)


def groups(costs: list[Cost], records: list[OpRecord], blocks: frozenset,
           whole_model: bool = True, flow: tuple[dict, dict] | None = None,
           member: dict | None = None) -> list[list[int]]:
    """The positions in ``costs`` of each fused kernel's members (module docstring), ordered
    by their first member; a kernel of one member is listed too (compiling it still changes
    what it writes).

    Within one unit (a graph of one block), a memory-bound kernel fuses with the one whose
    output it reads (vertical fusion), then kernels that read one tensor fuse (horizontal
    fusion, Inductor's shared-read score), each merge only if no other kernel (a library
    kernel, or another group) would have to run between two members (``_unit_groups``:
    Inductor's fusion-cycle check). Eager PyTorch's issue order does not matter: SwiGLU's
    SiLU, issued before the second projection's GEMM, fuses with the product after it.
    ``flow`` and ``member`` (``_flow``, ``generated``): when the caller has them already."""
    by_index = {r.index: r for r in records}
    producer, _ = flow or _flow(records)
    member = generated(costs, by_index) if member is None else member
    kernel = {i for c in costs for i in c.records}  # records that run a kernel
    units: dict[tuple, list[OpRecord]] = {}
    for r in records:
        if r.is_view or (r.index not in kernel and r.op in FREE_OPS):
            continue
        units.setdefault((_graph(r), block_path(r.module, blocks)), []).append(r)
    found: list[list[int]] = []
    for (_, block), rs in units.items():
        if not whole_model and block == "":
            continue
        found.extend(_unit_groups(rs, member, producer))
    return sorted(found)


def _unit_groups(rs: list[OpRecord], member: dict, producer: dict) -> list[list[int]]:
    """``groups`` inside one unit (its records ``rs``, in order). Every kernel of the unit is a
    group at first (a library kernel stays one); two groups merge only where no other group
    would depend on one and feed the other, following the groups' own dependencies (so the
    merged kernels can still run in some order). A group holds reductions to one shape at
    most: Inductor runs a reduction over other axes (a norm's weight gradient, summed over the
    tokens, beside its input gradient, summed over the features) as a kernel of its own,
    which reads its inputs again."""
    bit = {r.index: 1 << n for n, r in enumerate(rs)}
    anc: dict[int, int] = {}  # record -> its ancestors in the unit (a bit set)
    inputs: dict[int, list] = {}
    for r in rs:
        a, ins = 0, []
        for pos, t in enumerate(r.inputs):
            p = producer.get((r.index, pos))
            if p in bit:
                a |= bit[p] | anc[p]
                ins.append(p)
            else:
                ins.append(_tensor_id(t))  # from outside the unit
        anc[r.index], inputs[r.index] = a, ins
    desc = {r.index: 0 for r in rs}  # record -> its descendants in the unit
    for r in reversed(rs):
        for p in inputs[r.index]:
            if p in desc:
                desc[p] |= bit[r.index] | desc[r.index]
    fused = [r.index for r in rs if r.index in member]
    by_index = {r.index: r for r in rs}
    group = {r.index: r.index for r in rs}
    bits = {i: bit[i] for i in group}  # group root -> its members
    above = dict(anc)  # group root -> its members' ancestors
    below = dict(desc)  # ... descendants
    reduces = {i: _reduced_shapes(by_index[i]) for i in fused}
    # group root -> what runs after its split reductions' second stage (``split_reduction``):
    # none of it may join the group
    after = {i: desc[i] if split_reduction(by_index[i]) else 0 for i in fused}
    roots = set(group)

    def root(i: int) -> int:
        while group[i] != i:
            i = group[i]
        return i

    def reach(start: int, side: dict, skip: tuple) -> int:
        # what the groups reached from ``start`` reach in turn, to a fixed point
        changed = True
        while changed:
            changed = False
            for c in roots:
                if c not in skip and bits[c] & start and side[c] & ~start:
                    start |= side[c]
                    changed = True
        return start

    def merge(a: int, b: int) -> None:
        a, b = root(a), root(b)
        if a == b:
            return
        shapes = reduces[a] | reduces[b]
        if len(shapes) > 1:
            return  # reductions over other axes: kernels apart
        members = bits[a] | bits[b]
        if (after[a] | after[b]) & members:
            return  # a use of a split reduction's value: a kernel after its second stage
        down = reach((below[a] | below[b]) & ~members, below, (a, b))
        up = reach((above[a] | above[b]) & ~members, above, (a, b))
        if any(bits[c] & down and bits[c] & up for c in roots if c not in (a, b)):
            return  # another kernel would have to run between two members
        group[b] = a
        roots.discard(b)
        bits[a], reduces[a], after[a] = members, shapes, after[a] | after[b]
        above[a], below[a] = above[a] | above[b], below[a] | below[b]

    # vertical: producer and consumer, the consumers first: Inductor computes a pointwise
    # result inside the kernel that uses it (it inlines it), so where a kernel could join
    # either its producer's group or its consumer's but not both (a float8 cast's
    # ``x.to(float32)``: its producer, a norm, runs before the amax the cast's other factor
    # waits for), it goes with its consumer and reads what it is made of
    for i in reversed(fused):
        for p in inputs[i]:
            if p in member and p in bit:
                merge(p, i)
    readers: dict = {}  # horizontal: kernels that read one tensor (a library kernel's output,
    for i in fused:    # or one from outside the unit)
        for t in inputs[i]:
            if not (isinstance(t, int) and t in member):
                readers.setdefault(t, []).append(i)
    for ids in readers.values():
        for i in ids[1:]:
            merge(ids[0], i)
    out: dict[int, list[int]] = {}
    for i in fused:
        out.setdefault(root(i), []).append(member[i])
    return [sorted(v) for v in out.values()]


def compile_costs(costs: list[Cost], records: list[OpRecord], blocks: frozenset,
                  whole_model: bool = True, recomputed: dict | None = None) -> list[Cost]:
    """``costs`` with each group's kernels (``groups``) as the one generated kernel that replaces
    them: the group's first cost becomes one ``compiled`` cost (all its records, its traffic and
    FLOPs), the others stay in place with nothing left (``variant`` "fused"). ``recomputed``,
    when given, is filled with the forward records whose outputs the backward recomputes
    (record -> the tensors it is made of: ``saved_bytes``)."""
    by_index = {r.index: r for r in records}
    producer, readers = _flow(records)
    free = {r.index for r in records if r.op in FREE_OPS}  # no kernel: reading is not using
    member = generated(costs, by_index)
    fusible_records = set(member)
    # forward record -> the tensors it is made of
    recomputed = {} if recomputed is None else recomputed
    new: dict[int, Cost] = {}
    for group in groups(costs, records, blocks, whole_model, (producer, readers), member):
        members = [costs[p] for p in group]
        new.update(_kernel(members, group, by_index, producer, readers, free, fusible_records,
                           recomputed))
    return [new.get(p, c) for p, c in enumerate(costs)]


def _kernel(members: list[Cost], positions: list[int], by_index: dict, producer: dict,
             readers: dict, free: set, fusible_records: set, recomputed: dict) -> dict:
    inside = {c.records[0] for c in members}
    graph = _graph(by_index[members[0].records[0]])
    sources: dict[int, list[TensorMeta]] = {}

    def made_of(index: int) -> list[TensorMeta] | None:
        # the outside tensors a member is made from; None if it draws random numbers
        if index not in sources:
            r = by_index[index]
            found: list[TensorMeta] | None = [] if r.op not in RANDOM_OPS else None
            for pos, t in enumerate(r.inputs):
                if found is None:
                    break
                p = producer.get((index, pos))
                more = made_of(p) if p in inside else recomputed.get(p, [t])
                found = None if more is None else found + more
            sources[index] = found
        return sources[index]

    reads: dict[tuple, int] = {}
    for c in members:
        r = by_index[c.records[0]]
        outside = [(producer.get((r.index, pos)), t) for pos, t in enumerate(r.inputs)
                   if producer.get((r.index, pos)) not in inside]
        # a member reads no more than its eager kernel did (a gather reads what it picks)
        budget = max(0, c.bytes - c.output_bytes)
        total = sum(t.nbytes for _, t in outside) or 1
        scale = min(1.0, budget / total)
        for p, t in outside:
            for s in recomputed.get(p, [t]):
                tid = _tensor_id(s)
                reads[tid] = max(reads.get(tid, 0), int(s.nbytes * scale))
    # a two-pass op keeps its second pass (a batch norm's statistics over batch and pixels
    # before it normalises, its backward's reductions before dx; a layer norm's backward's
    # parameter gradients): what eager's TRAFFIC_FACTOR charges beyond one pass
    second_pass = int(sum((traffic_factor(c.op) - 1) * c.bytes for c in members))
    # an outer reduction (down the rows of a row-major tensor: a column's amax) has its value
    # only after the last row, so a member after it that reads the same rows again (the cast
    # scaling x by x's column amax) reads them from memory a second time: all the columns'
    # rows are more than a kernel holds; a reduction along the rows finishes a row while the
    # row is still in cache. Where the kernel makes those rows from several tensors (a
    # gradient computed in the kernel) they cost at most a write and a read of the reduced
    # tensor: Inductor stores a result two loops read rather than compute it twice
    for c in members:
        r = by_index[c.records[0]]
        if outer_reduction(r):
            again = _reread(r.index, inside, by_index, producer, readers, made_of, recomputed)
            if again:
                second_pass += min(sum(t.nbytes for t in again), 2 * r.inputs[0].nbytes)
    writes = 0
    for c in members:
        r = by_index[c.records[0]]
        for t in r.outputs:
            used = readers.get((r.index, t.key), set()) - free
            away = used - inside
            if used and not away:
                continue  # made and used inside the kernel
            later = {_graph(by_index[i]) for i in away}
            if (graph == "forward" and away and later == {"backward"}
                    and away <= fusible_records):
                made = made_of(r.index)
                if made is not None and all(m.numel <= t.numel for m in made):
                    # pointwise work: no reduction, no random numbers
                    recomputed[r.index] = made  # the backward makes it again
                    continue
            writes += t.nbytes
    first = members[0]
    biggest = max(members, key=lambda c: c.bytes)
    # a split reduction's second stage is a launch of its own (reading a few partial results)
    launches = 1 + sum(split_reduction(by_index[c.records[0]]) for c in members)
    merged = dataclasses.replace(
        first, op=COMPILED_OP, kind="memory", flops=sum(c.flops for c in members),
        bytes=sum(reads.values()) + writes + second_pass, output_bytes=writes,
        kernels=launches,
        dtype=biggest.dtype, records=tuple(i for c in members for i in c.records),
        variant="", host_sync=False)
    out = {positions[0]: merged}
    for p, c in zip(positions[1:], members[1:]):
        out[p] = dataclasses.replace(c, flops=0, bytes=0, output_bytes=0, kernels=0,
                                     variant="fused")
    return out


def internal_readers(costs: list[Cost], records: list[OpRecord]) -> dict[int, set[int]]:
    """The records of generated kernels whose outputs nothing outside their own kernel reads,
    each with its readers (a float8 cast's ``abs``, read only by the ``max`` beside it):
    what the partitioner need not save for the backward (``api.policy_ops``)."""
    _, readers = _flow(records)
    read_by: dict[int, set[int]] = {}  # writer -> every record that reads what it wrote
    for (w, _), rs in readers.items():
        read_by.setdefault(w, set()).update(rs)
    return {i: read_by[i] for c in costs if c.op == COMPILED_OP for i in c.records
            if read_by.get(i) and read_by[i] <= set(c.records)}


def split_reduction(r: OpRecord) -> bool:
    """Whether Inductor splits this reduction in two kernels: one value from more than
    ``SPLIT_REDUCTION_MIN`` (a float8 cast's amax over a whole tensor, a gradient's norm).
    One output gives one thread block nothing to share, so its ``Reduction.num_splits``
    reduces partial blocks first and their partial results in a second kernel; what uses the
    value (the cast that scales by it) runs in a kernel after both. Reductions to a few values
    (a batch norm's statistics over 64 channels) are split too, on a GPU of more SMs than
    twice their outputs; their traffic is the two-pass charge already (``TRAFFIC_FACTOR``)."""
    largest = max((t.numel for t in r.inputs), default=0)
    return (bool(r.outputs) and r.outputs[0].numel == 1 and largest > SPLIT_REDUCTION_MIN
            and r.op not in FILL_OPS)


def _reread(red: int, inside: set, by_index: dict, producer: dict, readers: dict,
            made_of, recomputed: dict) -> list[TensorMeta]:
    """What the kernel's members after reduction ``red`` (those that use its value) read
    again of the tensors ``red`` is made of, through pointwise work only (a path through
    another reduction reads that one's few values, not the rows; a forward result the
    backward recomputes is read as what it is made of, ``recomputed``)."""
    sources = {_tensor_id(t): t for t in made_of(red) or []}
    after, todo = set(), [red]
    while todo:  # the members that use red's value, directly or through others
        i = todo.pop()
        for t in by_index[i].outputs:
            for j in readers.get((i, t.key), set()) & inside:
                if j not in after:
                    after.add(j)
                    todo.append(j)
    seen: dict[int, set] = {}

    def pointwise_reads(i: int) -> set:
        # the outside tensors member i reads through pointwise members only
        if i not in seen:
            seen[i] = set()
            found = set()
            for pos, t in enumerate(by_index[i].inputs):
                p = producer.get((i, pos))
                if p in inside:
                    if not _reduced_shapes(by_index[p]):
                        found |= pointwise_reads(p)
                else:
                    found |= {_tensor_id(s) for s in recomputed.get(p, [t])}
            seen[i] = found
        return seen[i]

    read = set().union(*(pointwise_reads(j) for j in after)) if after else set()
    return [sources[k] for k in read if k in sources]


def outer_reduction(r: OpRecord) -> bool:
    """Whether a reduction runs down the rows of its input (its reduced dimensions, kept as
    dimensions of 1, leave the input's innermost one: a column's amax of a row-major
    tensor), not along them."""
    if not r.inputs or not r.outputs or r.op in FILL_OPS:
        return False
    x, y = r.inputs[0], r.outputs[0]
    if (len(x.shape) != len(y.shape) or y.numel >= x.numel
            or any(b not in (a, 1) for a, b in zip(x.shape, y.shape))):
        return False  # (not a reduction that keeps its dimensions: a gather, a scatter)
    dims = [d for d in range(len(x.shape)) if x.shape[d] > 1]
    innermost = min(dims, key=lambda d: x.stride[d])
    return y.shape[innermost] != 1


def _reduced_shapes(r: OpRecord) -> frozenset:
    """The output shape of a reduction (an output smaller than the largest input), as a set:
    empty for pointwise work, copies and fills (``x.new_ones(())`` takes x for its dtype and
    device, not its values)."""
    if r.op in FILL_OPS:
        return frozenset()
    largest = max((t.numel for t in r.inputs), default=0)
    return frozenset(t.shape for t in r.outputs[:1] if t.numel < largest)


def saved_bytes(saved_sizes: dict, weight_keys: set, records: list[OpRecord],
                recomputed: dict) -> int:
    """What autograd keeps for the backward of a compiled step: the eager capture's saved
    tensors (``saved_sizes``: storage key -> bytes, parameters left out) less the outputs the
    partitioner recomputes in the backward (``compile_costs``' ``recomputed``), plus the
    tensors they are made of where eager did not keep those already (SwiGLU: the SiLU's output
    is not kept, its input, kept anyway, is what the backward reads)."""
    by_index = {r.index: r for r in records}
    kept = dict(saved_sizes)
    for index in recomputed:
        for t in by_index[index].outputs:
            kept.pop(t.key, None)
    for sources in recomputed.values():
        for t in sources:
            if t.key not in weight_keys and t.key not in kept:
                kept[t.key] = t.nbytes
    return sum(kept.values())
