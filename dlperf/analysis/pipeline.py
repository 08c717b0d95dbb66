"""Pipeline parallelism (``analyze --pp N``): the decoder's blocks split into N stages of
consecutive blocks, one stage per group of GPUs, micro-batches flowing through them (GPipe,
Huang et al. 2019; PipeDream-Flush's 1F1B schedule and Megatron-LM's interleaved one:
Narayanan et al. 2021, arXiv 2104.04473, section 2.2).

From one tensor-parallel rank's capture of the whole model (analysis/api.py), each stage's
kernels are its blocks' (``blocks.0`` .. ``blocks.L-1``, L / N consecutive ones each; with V
virtual stages, Megatron's interleaved schedule, each GPU holds V chunks of L / (N V) blocks
but runs the same L / N) plus, on the first stage, what the model runs before its first block
(the embeddings) and, on the last, what it runs after its last (the final norm, the output
layer, the loss), with their backward kernels; the optimizer's update is scaled to the
stage's share of the parameters. The pipeline's step (one optimizer step of M micro-batches)
is then the slowest stage's M micro-batches plus the schedule's bubble, (N - 1) / V of one
micro-batch's forward and backward on that stage (the fill and drain both schedules pay:
Narayanan et al., section 2.2.1, bubble fraction (N - 1) / (V M)), plus the point-to-point
sends of the activations between stages (``p2p_transfers``). Of equal stages the first holds
the most: in 1F1B it keeps N micro-batches' activations of its L / N blocks (one micro-batch
of the whole model's), and the interleaved schedule 1 + (N - 1) / (N V) times that
(Korthikanti et al. 2022, arXiv 2205.05198, section 4.2.3).

The first and the last stage may hold fewer blocks than the others (``check``'s layout:
Megatron-Core's uneven pipeline, Llama 3's 405B), for the embedding and the output layer they
also run. The stages then take unequal time, and the bubble counts each at its own pace
(``fill_stages``); after a lighter first stage the second holds the most activations
(``in_flight_share``: each stage's peak as Megatron's schedules keep it).

A tied embedding (GPT-2's and Megatron's GPT: the output layer reuses the input embedding's
weights) is on the first stage and the last: Megatron-LM keeps a copy on the last stage and
all-reduces the two copies' gradients after every step's backward (``stage_params``), which
the scale-out charges whole.

Pure functions: the scale-out (analysis/scaling.py) takes the stage's analysis and adds the
bubble, the transfers (``p2p_exposed_s``: whole, or beside the chunks' compute under
Megatron-Core's --overlap-p2p-communication) and the tied embedding's all-reduce.
"""

from __future__ import annotations

import bisect
import dataclasses
import re


def check(layers: int, pp: int, virtual: int = 1, first: int | None = None,
          last: int | None = None) -> tuple[int, ...]:
    """The blocks of each stage (``layout``), or ValueError for a split Megatron refuses.

    Without ``first`` and ``last``, Megatron's rule: every stage (and every virtual chunk of
    one) holds as many blocks. With them, Megatron-Core's uneven pipeline
    (--decoder-first-pipeline-num-layers, --decoder-last-pipeline-num-layers): the first
    (last) stage holds ``first`` (``last``) blocks, the stages between share the rest
    equally, each a multiple of the virtual stages. The first and last stage are freed of
    blocks because they also run the embedding and the output layer and loss; with virtual
    stages, their chunks split their blocks as evenly as they go, one chunk holding the
    embedding (or the output layer) in place of a block: Llama 3's layout (arXiv 2407.21783,
    section 3.3.2: 126 blocks on 16 stages of 8 one-block chunks, one block fewer on the
    first and the last stage; Megatron-Core's --account-for-embedding-in-pipeline-split and
    --account-for-loss-in-pipeline-split)."""
    if pp < 1 or virtual < 1:
        raise ValueError(f"pipeline stages and virtual stages must be at least 1, got {pp} "
                         f"and {virtual}")
    if virtual > 1 and pp == 1:
        raise ValueError("virtual pipeline stages interleave the chunks of several stages: "
                         "give --pp N (N > 1) with them")
    if first is None and last is None:
        if layers % (pp * virtual):
            raise ValueError(f"{layers} blocks do not split into {pp} pipeline stages"
                             + (f" of {virtual} virtual chunks each" if virtual > 1 else "")
                             + f": give a number of stages that divides {layers}"
                             + (" with the virtual stages" if virtual > 1 else ""))
        return (layers // pp,) * pp
    if pp < 2:
        raise ValueError("the first and last stage's blocks describe a pipeline: give --pp N "
                         "(N > 1) with them")
    ends = [n for n in (first, last) if n is not None]
    if any(n < 0 for n in ends) or sum(ends) > layers:
        raise ValueError(f"the first and last stage's blocks must be 0 or more and together "
                         f"at most the model's {layers}")
    between = pp - len(ends)  # the stages that share the rest equally
    rest = layers - sum(ends)
    if between == 0 and rest:
        raise ValueError(f"{pp} stages of {first} and {last} blocks leave {rest} of the "
                         f"{layers} blocks on no stage: give blocks that add up to {layers}")
    if between and rest % (between * virtual):
        raise ValueError(f"the {rest} blocks left after the first and last stage's do not "
                         f"split into {between} stages"
                         + (f" of {virtual} virtual chunks each" if virtual > 1 else "")
                         + ": change --pp-first-layers or --pp-last-layers")
    each = rest // between if between else 0
    return ((each if first is None else first,) + (each,) * (pp - 2)
            + (each if last is None else last,))


# Megatron-Core's --pipeline-model-parallel-layout characters (megatron/core/transformer/
# pipeline_parallel_layer_layout.py): E the embedding, t a decoder block, L the output layer and
# loss; | between chunks, (...)*n and x*n repeating
_LAYOUT_CHARS = frozenset("EtL|()*0123456789")
_REPEAT = (re.compile(r"\(([^)]+)\)\*(\d+)"), re.compile(r"(.)\*(\d+)"))


def parse_layout(text: str, layers: int, pp: int) -> tuple[tuple[int, ...], int]:
    """Megatron-Core's pipeline layout string (``--pipeline-model-parallel-layout``, e.g.
    Megatron-Bridge's Llama 3 70B "Et*2|(t*2|)*34,t*3|(t*2|)*3,tL") as ``check``'s layout:
    the blocks of each of the ``pp`` stages, and the virtual stages it gives. The string's
    chunks, separated by "|", go to the stages in turn (chunk i to stage i mod pp, as
    Megatron's interleaved schedule places them), so it has V x pp of them; "t" is a block,
    "E" the embedding (first in the first chunk), "L" the output layer and loss (last in the
    last), "(...)*n" and "x*n" repeat, commas are cosmetic. ValueError says what is wrong."""
    flat = text.replace(",", "")
    if not flat or set(flat) - _LAYOUT_CHARS:
        raise ValueError(f"layout {text!r}: use t (a block), E (the embedding), L (the output "
                         "layer and loss), | between chunks, (...)*n and x*n to repeat "
                         "(Megatron-Core's --pipeline-model-parallel-layout; no MTP layers)")
    for pattern in _REPEAT:
        flat = pattern.sub(lambda m: m.group(1) * int(m.group(2)), flat)
    chunks = flat.split("|")
    if set("()*0123456789") & set(flat) or len(chunks) % pp:
        raise ValueError(f"layout {text!r}: {len(chunks)} chunks" + (
            f" do not split over {pp} stages (give a multiple of --pp)"
            if len(chunks) % pp else " with a repeat it cannot unroll"))
    joined = "".join(chunks)
    if joined.count("E") != 1 or not chunks[0].startswith("E"):
        raise ValueError(f"layout {text!r}: the embedding (E) comes once, first in the first "
                         "chunk")
    if joined.count("L") != 1 or not chunks[-1].endswith("L"):
        raise ValueError(f"layout {text!r}: the output layer and loss (L) come once, last in "
                         "the last chunk")
    if joined.count("t") != layers:
        raise ValueError(f"layout {text!r} places {joined.count('t')} blocks; the model has "
                         f"{layers}")
    stages = [0] * pp
    for i, chunk in enumerate(chunks):
        stages[i % pp] += chunk.count("t")
    return tuple(stages), len(chunks) // pp


def boundaries(layout) -> list[int]:
    """The index of each stage's first block, and the blocks in all (``layout``: ``check``'s,
    or a number of equal stages)."""
    starts = [0]
    for n in layout:
        starts.append(starts[-1] + n)
    return starts


def _stage_of_block(i: int, starts: list[int]) -> int:
    """The stage of block ``i`` (``starts``: ``boundaries``); a stage of no blocks holds none."""
    return bisect.bisect_right(starts, i) - 1


def even_layout(blocks: int, pp) -> tuple[int, ...]:
    """``pp`` as a layout: a tuple is one already, a number of stages splits ``blocks``
    equally (as ``check`` allows)."""
    return tuple(pp) if isinstance(pp, tuple) else (blocks // pp,) * pp


def ordered_blocks(blocks) -> list[str]:
    """The model's blocks in execution order (``blocks.2`` before ``blocks.10``)."""
    def key(path: str):
        tail = path.rsplit(".", 1)[-1]
        digits = "".join(ch for ch in tail if ch.isdigit())
        return (path.rsplit(".", 1)[0], int(digits) if digits else -1, path)
    return sorted(blocks, key=key)


def modules_before(costs: list, blocks: list[str]) -> set[str]:
    """The modules outside the blocks whose forward kernels run before the first block's (the
    embeddings): the first stage's."""
    from dlperf.analysis.capture import block_path

    block_set = frozenset(blocks)
    before: set[str] = set()
    for c in costs:
        if c.phase != "forward":
            continue
        if block_path(c.module, block_set):
            break
        before.add(c.module)
    return before


def stage_of_costs(costs: list, blocks: list[str], pp) -> list[int | None]:
    """The stage of each kernel: a block's by its index (``pp``: the layout, ``check``'s, or
    a number of stages of L / N consecutive blocks each); outside the blocks, the first stage
    for what the forward runs before the first block (and the backward of those modules), the
    last for the rest; None for the optimizer's update (every stage runs its share:
    ``stage_costs``)."""
    from dlperf.analysis.capture import block_path

    layout = even_layout(len(blocks), pp)
    starts = boundaries(layout)
    index = {b: _stage_of_block(i, starts) for i, b in enumerate(blocks)}
    block_set = frozenset(blocks)
    before = modules_before(costs, blocks)
    out: list[int | None] = []
    for c in costs:
        block = block_path(c.module, block_set)
        if c.phase == "optimizer":
            out.append(None)
        elif block:
            out.append(index[block])
        else:
            out.append(0 if c.module in before else len(layout) - 1)
    return out


def param_stage(name: str, blocks: list[str], pp, first_modules: set[str]) -> int:
    """The stage holding parameter ``name`` (``pp``: as ``stage_of_costs``): its block's, or
    outside the blocks the first stage's if its module runs before the first block
    (``first_modules``), else the last's."""
    layout = even_layout(len(blocks), pp)
    starts = boundaries(layout)
    for i, b in enumerate(blocks):
        if name.startswith(b + "."):
            return _stage_of_block(i, starts)
    module = name.rsplit(".", 1)[0]
    return 0 if module in first_modules else len(layout) - 1


def stage_params(named: list[tuple[str, object, int]], blocks: list[str], pp,
                 first_modules: set[str]) -> tuple[list[tuple[str, int, int]], int]:
    """Each parameter's gradient bytes and stage, from ``named``: (name, the tensor's id,
    gradient bytes) for every name a parameter is registered under, shared ones included
    (``named_parameters(remove_duplicate=False)``). A parameter whose names fall on two
    stages (a tied embedding: the first stage's input embedding, the last stage's output
    layer) is held by both, as Megatron-LM keeps a copy of the word embeddings on the last
    stage and all-reduces the two copies' gradients every step. Returns the rows (name, bytes,
    stage) and the gradient bytes of such copies, which that all-reduce carries."""
    rows: list[tuple[str, int, int]] = []
    stages: dict[object, set[int]] = {}
    tied = 0
    for name, key, nbytes in named:
        stage = param_stage(name, blocks, pp, first_modules)
        held = stages.setdefault(key, set())
        if stage not in held:
            if held:
                tied += nbytes
            held.add(stage)
            rows.append((name, nbytes, stage))
    return rows, tied


def stage_costs(costs: list, stages: list[int | None], stage: int, fraction: float) -> list:
    """Stage ``stage``'s kernels (``stages``: ``stage_of_costs``), its optimizer update scaled
    to ``fraction`` of the parameters (the same launches, on fewer elements)."""
    out = []
    for c, s in zip(costs, stages):
        if s is None:
            out.append(dataclasses.replace(c, flops=int(c.flops * fraction),
                                           bytes=int(c.bytes * fraction),
                                           output_bytes=int(c.output_bytes * fraction)))
        elif s == stage:
            out.append(c)
    return out


def in_flight(pp: int, virtual: int = 1) -> float:
    """The first stage's activations in micro-batches of its blocks' over one micro-batch of
    the whole model's: 1 in 1F1B (N micro-batches of 1 / N of the blocks), 1 + (N - 1) / (N V)
    interleaved (Korthikanti et al., section 4.2.3)."""
    return 1.0 if virtual == 1 else 1.0 + (pp - 1) / (pp * virtual)


def stage_memory(memory: dict | None, fraction: float, share: float = 1.0) -> dict | None:
    """What a stage holds: its ``fraction`` of the weights, gradients and optimizer state, and
    ``share`` of one micro-batch's activations of the whole model (``in_flight_share``: 1 for
    the first of equal stages under 1F1B, ``in_flight`` of them interleaved)."""
    if memory is None:
        return None
    # (the whole model's peak, liveness.with_peak, is left out: what a stage has in flight
    # beside its saved micro-batches, a block's recompute or the last stage's logits, is not
    # separated per stage, so a stage is judged at rest)
    out = {k: v for k, v in memory.items()
           if k not in ("activations_peak_bytes", "peak_bytes", "peak_at")}
    for key in ("weights_bytes", "gradients_bytes", "optimizer_state_bytes"):
        out[key] = int(memory[key] * fraction)
    if "parameters" in out:
        out["parameters"] = int(memory["parameters"] * fraction)
    out["activations_bytes"] = int(memory["activations_bytes"] * share)
    out["total_bytes"] = sum(v for k, v in out.items() if k.endswith("_bytes")
                             and k != "total_bytes")
    return out


def in_flight_share(layout, stage: int, virtual: int = 1,
                    micro_batches: int | None = None) -> float:
    """Stage ``stage``'s activations at their peak, over one micro-batch's of the whole model,
    as Megatron's schedules keep them (megatron/core/pipeline_parallel/schedules.py,
    ``get_pp_rank_microbatches``): under 1F1B stage s runs N - s - 1 warm-up forwards and
    holds N - s micro-batches of its blocks (the first N, the last 1); interleaved, it runs
    2 (N - s - 1) + (V - 1) N warm-up chunks and holds one more, each a V-th of its blocks,
    so every stage keeps the V - 1 rounds of N chunks and the first the most of equal ones
    (1 + (N - 1) / (N V) micro-batches: ``in_flight``). At most the step's ``micro_batches``
    (x V chunks) are in flight. With a lighter first stage (``check``'s uneven layout) the
    second holds the most."""
    pp, blocks = len(layout), sum(layout) or 1
    if virtual == 1:
        held = pp - stage
        cap = micro_batches
    else:
        held = 2 * (pp - stage - 1) + (virtual - 1) * pp + 1
        cap = None if micro_batches is None else micro_batches * virtual
    if cap is not None:
        held = min(held, cap)
    return held * layout[stage] / virtual / blocks


def bubble_s(stage_micro_s: float, pp: int, virtual: int = 1,
             fill: float | None = None) -> float:
    """The schedule's idle time a step: (N - 1) / V of one micro-batch's forward and backward
    on the slowest stage (1F1B and interleaved alike; Narayanan et al., section 2.2), the fill
    and drain of the other N - 1 stages. With stages of unequal time, the first micro-batch
    still passes every other stage on the way in and the last on the way out, each at its own
    pace: ``fill`` is those N - 1 stages' micro-batch time in the slowest's (``fill_stages``;
    N - 1 when they are equal)."""
    return (pp - 1 if fill is None else fill) / virtual * stage_micro_s


def fill_stages(layout_times: list[float]) -> float:
    """``bubble_s``'s ``fill``: every stage's micro-batch time but the slowest's, over the
    slowest's (the step of M micro-batches is M T_max + sum_s T_s - T_max for 1F1B)."""
    slowest, most = max(layout_times), len(layout_times) - 1
    # (equal stages: exactly N - 1, not a rounding above it that ScaleConfig would refuse)
    return min(most, (sum(layout_times) - slowest) / slowest) if slowest > 0 else most


def interleaved_data_parallel_s(reduce_s: float, gather_s: float, pp: int, virtual: int,
                                forward_s: float, backward_s: float) -> tuple[float, float]:
    """What a stage's data-parallel communication leaves exposed under the interleaved
    schedule, as Megatron-Core runs it with --overlap-grad-reduce (and the distributed
    optimizer's --overlap-param-gather): (reduce-scatter or all-reduce, parameter gather).

    Each of the V model chunks is its own unit of gradient buffers (Megatron-Core buckets only
    the first stage's first chunk; ``reduce_s`` / V each), and a chunk's reduction starts when
    the backward of its last micro-batch ends. The schedule runs the last micro-batches in
    groups of N per chunk, chunk V - 1 first, so consecutive chunks finish N chunk-backwards
    apart (N ``backward_s`` / V, ``backward_s`` a micro-batch's backward on the stage) and
    the reductions run one after another on one stream, each from its chunk's end: what the
    last ends after the backward's end is exposed. The gathers (``gather_s`` / V each, one
    after another from the step's start) feed the first micro-batches' forwards in the same
    order, chunk j needed after j N chunk-forwards: the forward waits for the worst of them."""
    if virtual < 1 or pp < 1:
        raise ValueError("pipeline stages and virtual stages must be at least 1")
    r, a = reduce_s / virtual, gather_s / virtual
    spacing_b, spacing_f = pp * backward_s / virtual, pp * forward_s / virtual
    end = -float("inf")  # times from the backward's end; chunk k ends k spacings before it
    for k in range(virtual - 1, -1, -1):
        end = max(end, -k * spacing_b) + r
    waits = max(((j + 1) * a - j * spacing_f for j in range(virtual)), default=0.0)
    return max(0.0, end), max(0.0, waits)


def p2p_exposed_s(micro_batches: int, pp: int, virtual: int, each_s: float,
                  chunk_s: float, overlap: bool = False) -> float:
    """What the point-to-point transfers (``p2p_transfers``, ``each_s`` each) add to the step.
    Without overlap (1F1B, and the interleaved schedule before Megatron-Core's
    --overlap-p2p-communication) each is between dependent kernels: all of them. With it
    (Megatron-Core's default for the interleaved schedule) a chunk's send and the next one's
    receive run beside the chunk being computed (``chunk_s``: a micro-batch chunk's forward or
    backward on the stage, on average): the 2 (N - 1) of the fill and drain stay whole, the
    2 M V others cost what they outlast their chunk by."""
    if not overlap:
        return p2p_transfers(micro_batches, pp, virtual) * each_s
    return (2 * (pp - 1) * each_s
            + 2 * micro_batches * virtual * max(0.0, each_s - chunk_s))


def p2p_transfers(micro_batches: int, pp: int, virtual: int = 1) -> int:
    """Point-to-point transfers on the step's critical path: each of the M V micro-batch
    chunks a stage runs receives its input and sends its output in the forward and the
    reverse in the backward, one transfer each way at a time, and the fill and drain add
    N - 1 of each: 2 (M V + N - 1). Each carries the activations (or their gradient) at a stage
    boundary; charged whole, none hidden."""
    return 2 * (micro_batches * virtual + pp - 1)
