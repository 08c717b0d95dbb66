"""Scale-out: one GPU's predicted step, on N GPUs in M nodes (issue #14). Pure functions.

Communication over NCCL is timed as NCCL's own tuner times it (analysis/nccl.py): for each
collective the fastest of its algorithms (one flat ring over all ranks; for an all-reduce a
tree, chains inside the nodes and a double binary tree between them) and protocols (LL,
LL128, Simple), with the tuner's latencies and the interconnects' bus bandwidths (across nodes
the smaller of NVLink's and the node's NICs together). Over a transport that is not NCCL's
(gloo, whose latency and bandwidth `dlperf probe --comm` measures), in bus bandwidth B per GPU
and latency a per step:

* ring all-reduce of S bytes over n GPUs: 2(n-1) a + S x 2(n-1)/n / B (nccl-tests' busbw
  definition; reduce-scatter then all-gather, each moving S (n-1)/n per GPU);
* tree all-reduce: the same bandwidth term, 2 ceil(log2 n) a of latency;
* reduce-scatter and all-gather: (n-1) a + S (n-1)/n / B each;
* across nodes, hierarchically: reduce-scatter inside the node, an all-reduce of the node's
  1/g share between the nodes (ring or tree, the faster), all-gather inside the node.

DDP (PyTorch DistributedDataParallel): gradients go into buckets in the order the backward
produces them, as DDP rebuilds its buckets after the first iteration (25 MiB each, the first
1 MiB; DDP's defaults); a bucket's all-reduce starts when the backward
has produced its last gradient and the one before it has finished (one communication stream);
what is left after the last backward kernel is the exposed time the step pays, plus DDP's
copies of the gradients into and out of the buckets. On a GPU the all-reduces run beside the
backward (NCCL's own kernels and copy engines); on a CPU they take the cores the backward
needs, so they are all exposed.

FSDP (full sharding): each wrapped unit's parameters are all-gathered in the forward and again
in the backward (in the autocast dtype under bf16/fp16, as FSDP's mixed-precision policy does),
and its gradients reduce-scattered in fp32, one collective per unit; across nodes each GPU's NIC
carries only its node's 1/g share, as for the all-reduce; the collectives run on one stream
beside the compute, unit by unit, with FSDP's prefetch of one unit (``fsdp_pipeline_s``): what
a unit's compute cannot hide stalls the next one, and the root's first all-gather and the
last reduce-scatter are always exposed; weights, gradients and optimizer state take 1/n of their
memory per GPU, and the optimizer step updates 1/n of the parameters. SHARD_GRAD_OP (ZeRO-2)
gathers once per micro-batch and keeps the parameters until the backward has used them. HSDP
(FSDP's HYBRID_SHARD, FSDP2 on a 2-D mesh): full sharding inside each node only, the nodes
holding replicas; a unit's gathers run over the node's GPUs alone, and its gradients are
reduce-scattered there, then the node's 1/g shard all-reduced with the same shard of every
other node (one GPU per node: the network), on the same stream; state is sharded 1/g. With
gradient accumulation DDP all-reduces once per optimizer step, FSDP on every micro-batch.

Tensor parallelism (``tp`` > 1, the built-in decoders only: models/gpt.py builds one rank's
shard, and its capture is the step each GPU computes), Megatron's scheme (Shoeybi et al., arXiv
1909.08053, section 3): inside a node, ``tp`` GPUs split every block's heads and MLP and the
vocabulary, with sequence parallelism between the split regions (as torchtitan always runs it,
Megatron with --sequence-parallel: norms and residual adds on 1/tp of the tokens): before each
of a block's two split regions (attention, MLP) an all-gather of the tokens, after it a
reduce-scatter ([B, T, d_model] in the activations' dtype, the volume of one all-reduce
between them), and in the backward the reverse; the vocabulary-parallel embedding adds a
reduce-scatter, the output layer an all-gather (and the reverse in the backward); a recomputed
forward (activation checkpointing) repeats the forward's. Without sequence parallelism
(Megatron's original scheme, ``sequence_parallel=False``) each rank holds every token between
the split regions and an all-reduce stands in each place of the pair. They sit between
dependent kernels, so none is hidden (``tensor_parallel_collectives``), except under
Megatron-LM's implementation (``impl="megatron"``, models/gpt.py's ``tp_impl``): there each
column-parallel layer's backward issues the input gradient's reduce-scatter (all-reduce
without sequence parallelism) before its weight-gradient GEMM and runs the two side by side,
and under sequence parallelism first gathers its input again (it kept only its shard) beside
its data-gradient GEMM; a region's collective then costs only what its GEMMs cannot cover
(``beside_gemm_s``). TransformerEngine's userbuffers (``impl="te"``, Megatron-LM's
--tp-comm-overlap, sequence parallel only) overlap the rest of the blocks' collectives too:
the forward's all-gathers chunk by chunk with the column-parallel GEMMs, its reduce-scatters
pipelined after the row-parallel ones, and the backward's all-gathers with the row-parallel
layers' data-gradient GEMMs (``TP_OVERLAP``, ``overlap_left_s``). The data-parallel
strategy then runs over the gpus / tp replicas, one GPU per replica in each of its tensor-parallel
positions, gpus_per_node / tp of them in a node.

Collectives beside the compute: a hidden collective is not free. NCCL's kernels hold one SM
per channel for as long as they run, and its CTAs do not share an SM with a compute kernel
(NVIDIA/nccl#1656, #689); on an NVSwitch node NCCL builds 32 collective channels (its logs:
"32 coll channels" on H100 and B200 nodes). The compute that runs beside a collective runs on
the SMs left over: each of its kernels is predicted again on those (``lent_spec``: fewer SMs
for the tile/wave model, the peaks and the SM side of memory bandwidth in proportion), and
the work that does not get done while the collective runs is done after it, so the step
grows by hidden x (1 - 1 / slowdown) (``contention_s``). A lent H200 measured the effect:
an MPT-13B block's GEMMs ran 0.84 of their speed beside a copy on a second stream
(benchmarks/README.md). It is charged only where the job says how many SMs its collectives
hold (``ScaleConfig.collective_sms``, `analyze --collective-sms N`; 32 on an NVSwitch node,
``NCCL_CHANNEL_SM_SHARE`` of an H100): the published table does not agree on it
(benchmarks/experiment_collective_sms.py). Its clean rows' errors follow the hidden
collectives' share of the step, and their fit keeps improving up to 0.61 of the SMs held, more
than any channel count (the term stands in for something else there); the Llama FSDP runs on
64-128 A100s that fix FlashAttention-2's share (networks assumed) would need that kernel
faster than its paper's forward peak to absorb even NCCL's 32 channels. So by default nothing
is charged. DDP's hidden all-reduces slow the backward, FSDP's gathers and reduce-scatters the
forward and backward. Not charged even then: tensor- and context-parallel collectives, whose
own overlap models time them against the GEMMs beside them, and the collective's own HBM
traffic.

Stragglers: data parallel training is synchronous, so every step lasts as long as the slowest
GPU's. GPUs of one SKU do not run at one speed (their power management clocks each chip to its
own silicon: Sinha et al., SC'22, arXiv 2208.11035; docs/design.md), and each step's host
work jitters. With each GPU's step time spread with coefficient of variation ``cv`` around the
predicted one, the step on N GPUs is the expected maximum of N draws: t (1 + cv e(N)), e(N) the
expected maximum of N standard normals (``expected_max_normal``: 0 for one GPU, 0.56 for two,
1.42 for eight, 3.63 for 4,096). ``STEP_CV`` is fitted to the published table
(benchmarks/fit_straggler.py); it is what turns "~99% on one node" into the 95-98% that
NVIDIA's own scaling tables show, and what grows the loss with the GPU count across nodes.
Where the host's JPEG decode sets the pace, each rank's step is its loader's time for a batch
and the step waits for the slowest loader the same way: batch / host rate x (1 + cv e(N)).
``benchmarks/bench_input_side_cpu.py`` checks the input side on real decoding and real
synchronisation (sleeping "GPUs"; results/input-side-cpu.json).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

import numpy as np

from dlperf.analysis.gemm import ELEMENT_BYTES, state_element_bytes
from dlperf.analysis.liveness import peak_total
from dlperf.errors import DlperfError, finite_number

DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP bucket_cap_mb=25
DDP_FIRST_BUCKET_BYTES = 1 * 2**20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
# Horovod's fusion buffer: HOROVOD_FUSION_THRESHOLD's default, 64 MiB (NVIDIA's MLPerf MXNet
# configs set it to 67108864 too): gradients ready together go in one all-reduce of up to this
HOROVOD_FUSION_BYTES = 64 * 2**20
# the spread (coefficient of variation) of one GPU's step time around the predicted one: see
# the module docstring; fitted by benchmarks/fit_straggler.py to the clean rows of
# benchmarks/validation/published_scaling.csv (results/straggler-fit.json, held out by source)
STEP_CV = 0.01


# The share of a GPU's SMs NCCL's kernels hold during a large collective on an NVSwitch node
# (one SM per channel, 32 collective channels; see the module docstring): 32 of an H100's 132
# SMs, 26 of an A100's 108. A reference for `analyze --collective-sms`, not a default: the
# published table's clean rows fit more (0.61, the grid's end), its Llama FSDP rows none
# (benchmarks/experiment_collective_sms.py, results/experiment-collective-sms.json).
NCCL_CHANNEL_SM_SHARE = 0.24


def held_sms(spec, sms: int) -> int:
    """The SMs a collective holds on ``spec`` when ``sms`` are asked for (``--collective-sms``):
    none on a CPU (gloo's collectives take cores, which the CPU model charges as exposed time
    instead); one line naming the flag where the GPU has no SM to leave the compute."""
    if not spec.tensor_cores:
        return 0
    if not 0 <= sms < spec.sm_count:
        raise DlperfError(f"--collective-sms {sms}: {spec.name} has {spec.sm_count} SMs; "
                          f"choose 0 (none held) to {spec.sm_count - 1}")
    return sms


def collective_sms(spec, share: float = NCCL_CHANNEL_SM_SHARE) -> int:
    """The SMs a collective holds on ``spec``: ``share`` of them (``held_sms``)."""
    return held_sms(spec, round(share * spec.sm_count))


def lent_spec(spec, sms: int):
    """``spec`` with ``sms`` of its SMs held by a collective's kernels: the compute's tiles run
    in waves over the rest, at their share of the peaks and of the SM side of the memory
    bandwidth (efficiency.sm_cycles_per_s follows ``sm_count``)."""
    if held_sms(spec, sms) == 0:
        return spec
    left = (spec.sm_count - sms) / spec.sm_count
    return replace(spec, sm_count=spec.sm_count - sms,
                   peak={unit: value * left for unit, value in spec.peak.items()})


def beside_slowdown(analysis, sms: int, phases: tuple[str, ...]) -> float:
    """How much longer the kernels of ``phases`` take with ``sms`` SMs held (>= 1): each kernel's
    predicted time scaled by its time on ``lent_spec`` over its time on the whole GPU, so a
    kernel's own adjustments (fusion, a measured time) carry over."""
    from dlperf.analysis.roofline import predict

    spec = analysis.device
    if not sms:
        return 1.0
    lent = lent_spec(spec, sms)
    tf32, eff = analysis.config.tf32, analysis.efficiency
    full = slow = 0.0
    for p in analysis.predictions:
        if p.cost.phase not in phases or p.time_s <= 0:
            continue
        alone = predict(p.cost, spec, tf32=tf32, efficiency=eff).time_s
        full += p.time_s
        slow += p.time_s * (predict(p.cost, lent, tf32=tf32, efficiency=eff).time_s / alone
                            if alone > 0 else 1.0)
    return slow / full if full else 1.0


def contention_s(hidden_s: float, slowdown: float) -> float:
    """What ``hidden_s`` of collectives beside compute that runs ``slowdown`` times slower costs
    the step: the compute does 1 / slowdown of its work while they run, the rest after."""
    return max(0.0, hidden_s) * (1.0 - 1.0 / slowdown) if slowdown > 1.0 else 0.0


FORWARD_BACKWARD = ("forward", "dgrad", "wgrad", "recompute")
BACKWARD = ("dgrad", "wgrad", "recompute")

# x on [-10, 10] for the expected maximum's integral (step 0.002: exact to ~1e-9 for any n a
# cluster has; the integrand is smooth and vanishes at both ends), with x phi(x) and log Phi(x)
# on it, computed once
_GRID = np.linspace(-10.0, 10.0, 10001)
_X_PHI = _GRID * np.exp(-_GRID**2 / 2) / math.sqrt(2 * math.pi)
_LOG_CDF = np.log([0.5 * math.erfc(-x / math.sqrt(2)) for x in _GRID])


def expected_max_normal(n: int) -> float:
    """E[max of ``n`` independent standard normals] = integral of x n phi(x) Phi(x)^(n-1) dx,
    by the trapezoid rule on _GRID (closed forms to check it: 1/sqrt(pi) for n = 2,
    3/(2 sqrt(pi)) for n = 3)."""
    if n <= 1:
        return 0.0
    h = _GRID[1] - _GRID[0]
    # the end points' weights (h/2) do not matter: the integrand is ~0 there
    return float(n * h * np.sum(_X_PHI * np.exp((n - 1) * _LOG_CDF)))


def straggler_s(gpu_step_s: float, gpus: int, cv: float) -> float:
    """What a synchronous step of ``gpu_step_s`` on one GPU waits, on ``gpus`` GPUs, for the
    slowest of them (module docstring)."""
    return gpu_step_s * cv * expected_max_normal(gpus)


def ring_allreduce_s(nbytes: float, n: int, bus_bw: float, latency_s: float) -> float:
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) * latency_s + nbytes * 2 * (n - 1) / n / bus_bw


def tree_allreduce_s(nbytes: float, n: int, bus_bw: float, latency_s: float) -> float:
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * math.ceil(math.log2(n)) * latency_s + nbytes * 2 * (n - 1) / n / bus_bw


def reduce_scatter_s(nbytes: float, n: int, bus_bw: float, latency_s: float) -> float:
    """Reduce-scatter (or all-gather) of an ``nbytes`` buffer over ``n`` GPUs."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) * latency_s + nbytes * (n - 1) / n / bus_bw


all_gather_s = reduce_scatter_s


def _nccl(coll: str, nbytes: float, gpus: int, gpus_per_node: int, node, network, gen: int,
          algorithms=None, protocols=None):
    """NCCL's tuner's time for ``coll`` (analysis/nccl.py) among the ``algorithms`` and
    ``protocols`` NCCL_ALGO and NCCL_PROTO allow (None: all), or None where the transport is
    not NCCL's (an interconnect without NCCL hardware: gloo, as `dlperf probe --comm`
    measures)."""
    from dlperf.analysis import nccl

    nodes = math.ceil(gpus / min(gpus, gpus_per_node))
    if not node.nccl or (nodes > 1 and not network.nccl):
        return None
    try:
        return nccl.collective(coll, nbytes, gpus, gpus_per_node, node.bus_bandwidth,
                               "nvlink" if node.nccl == "nvlink" else "pci",
                               network.bus_bandwidth if network is not None else None, gen,
                               algorithms, protocols)
    except ValueError as exc:
        raise DlperfError(f"--nccl-algo/--nccl-proto: {exc}") from None


def _nccl_name(coll: str, nbytes: float, cfg, node, network, gen: int) -> str | None:
    """"algorithm/protocol" NCCL picks for ``coll`` of ``nbytes`` at ``cfg``'s scale (what the
    report names beside the communication time), None over a transport that is not NCCL's."""
    choice = _nccl(coll, nbytes, cfg.gpus, cfg.gpus_per_node, node, network, gen,
                   cfg.algorithms, cfg.protocols)
    return f"{choice.algorithm}/{choice.protocol}" if choice and nbytes > 0 else None


def allreduce_s(nbytes: float, gpus: int, gpus_per_node: int, node, network, gen: int = 1,
                algorithms=None, protocols=None) -> float:
    """All-reduce of ``nbytes`` on ``gpus`` GPUs, ``gpus_per_node`` to a node: NCCL's choice of
    algorithm and protocol as its tuner times them (analysis/nccl.py; ``gen``: the GPUs'
    generation, nccl.generation); over a transport that is not NCCL's, a plain ring inside one
    node, and across nodes hierarchically (see the module docstring). ``algorithms``,
    ``protocols``: what NCCL_ALGO and NCCL_PROTO allow (None: all)."""
    choice = _nccl("allreduce", nbytes, gpus, gpus_per_node, node, network, gen, algorithms,
                   protocols)
    if choice is not None:
        return choice.seconds
    g = min(gpus, gpus_per_node)
    nodes = math.ceil(gpus / g)
    if nodes == 1:
        return ring_allreduce_s(nbytes, g, node.bus_bandwidth, node.latency_s)
    share = nbytes / g
    between = min(ring_allreduce_s(share, nodes, network.bus_bandwidth, network.latency_s),
                  tree_allreduce_s(share, nodes, network.bus_bandwidth, network.latency_s))
    inside = reduce_scatter_s(nbytes, g, node.bus_bandwidth, node.latency_s)
    return 2 * inside + between


def sharded_collective_s(nbytes: float, gpus: int, gpus_per_node: int, node, network,
                         calls: int = 1, gen: int = 1, algorithms=None, protocols=None
                         ) -> float:
    """All-gather (or reduce-scatter) of an ``nbytes`` buffer over ``gpus`` GPUs, split into
    ``calls`` collectives of equal size (FSDP issues one per wrapped unit): NCCL's flat ring
    (or PAT, one GPU per node) as its tuner times it (analysis/nccl.py); over a transport that
    is not NCCL's, a ring inside the node plus one of the node's 1/g share between the nodes."""
    if gpus <= 1 or nbytes <= 0:
        return 0.0
    choice = _nccl("allgather", nbytes / calls, gpus, gpus_per_node, node, network, gen,
                   algorithms, protocols)
    if choice is not None:
        return calls * choice.seconds
    g = min(gpus, gpus_per_node)
    nodes = math.ceil(gpus / g)
    inside = reduce_scatter_s(nbytes / calls, g, node.bus_bandwidth, node.latency_s)
    between = (reduce_scatter_s(nbytes / g / calls, nodes, network.bus_bandwidth,
                                network.latency_s) if nodes > 1 else 0.0)
    return calls * (inside + between)


def broadcast_s(nbytes: float, gpus: int, gpus_per_node: int, node, network, gen: int = 1,
                protocols=None) -> float:
    """Broadcast of ``nbytes`` from one GPU to ``gpus``: NCCL's ring as its tuner times it (a
    step per rank: its latency grows with the GPUs; ring is NCCL's only broadcast, so NCCL_ALGO
    does not apply); over a transport that is not NCCL's, a pipelined chain: a hop's latency
    per GPU, the bytes once at each link's bandwidth."""
    if gpus <= 1 or nbytes <= 0:
        return 0.0
    choice = _nccl("broadcast", nbytes, gpus, gpus_per_node, node, network, gen, None,
                   protocols)
    if choice is not None:
        return choice.seconds
    g = min(gpus, gpus_per_node)
    nodes = math.ceil(gpus / g)
    inside = (g - 1) * node.latency_s + nbytes / node.bus_bandwidth
    between = ((nodes - 1) * network.latency_s + nbytes / network.bus_bandwidth
               if nodes > 1 else 0.0)
    return inside + between


def module_buffers(model) -> tuple[tuple[str, int, int], ...]:
    """A module's buffers as DDP broadcasts them: (dtype, tensors, bytes) per dtype (batch
    norm's running mean and variance in FP32, its batch count in int64)."""
    groups: dict[str, list[int]] = {}
    for buf in model.buffers():
        entry = groups.setdefault(str(buf.dtype).removeprefix("torch."), [0, 0])
        entry[0] += 1
        entry[1] += buf.numel() * buf.element_size()
    return tuple((dtype, n, nbytes) for dtype, (n, nbytes) in sorted(groups.items()))


def buffer_broadcast_s(buffers, gpus: int, gpus_per_node: int, node, network, gen: int,
                       launch_s: float, host_s: float, protocols=None) -> dict:
    """DDP's broadcast of the module's buffers from rank 0 at the start of every forward that
    follows a synchronised backward (``broadcast_buffers=True``, torch's default;
    torch/nn/parallel/distributed.py ``_sync_buffers``, c10d ``broadcast_coalesced``): per
    dtype one flattened tensor (a cat kernel), broadcast, then one copy kernel per buffer back
    into its tensor; ``buffers`` as ``module_buffers``. The forward's kernels queue behind it.
    ``host_s``: the CPU's issue of those kernels where the GPU waits for it (after a step's
    host synchronisation), else 0: the copies are issued while the broadcast runs, so the
    step waits for the later of the two. Returns the seconds and their parts."""
    collective = sum(broadcast_s(nbytes, gpus, gpus_per_node, node, network, gen, protocols)
                     for _, _, nbytes in buffers)
    kernels = sum(n for _, n, _ in buffers) + len(buffers)  # the copies back, a cat a dtype
    gpu = kernels * launch_s
    host = kernels * host_s
    return {"seconds": max(collective + gpu, host), "broadcast_s": collective,
            "kernels": kernels, "tensors": sum(n for _, n, _ in buffers),
            "bytes": sum(b for *_, b in buffers), "host_issue_s": host}


def fsdp_units(params: list[tuple[str, int]]) -> int:
    """How many units FSDP wraps the model in, as per-block auto-wrapping does (torchtitan's
    and Composer's transformer blocks, a ResNet's bottlenecks): one per block
    (``capture.block_paths``: ``blocks.3``, ``layer1.0``, ViT's ``encoder_layer_3``), plus the
    root holding everything else."""
    return max(len(unit_bytes(params)), 1)


def unit_bytes(params: list[tuple[str, int]]) -> dict[str, int]:
    """Bytes of ``params`` [(name, bytes)] per FSDP unit (``fsdp_units``): block path -> bytes,
    "" for the root."""
    from dlperf.analysis.capture import block_path, block_paths

    blocks = block_paths(name for name, _ in params)
    out: dict[str, int] = {}
    for name, nbytes in params:
        unit = block_path(name.rpartition(".")[0], blocks)
        out[unit] = out.get(unit, 0) + nbytes
    return out


def _segments(predictions, units) -> tuple[list, list]:
    """The forward's and the backward's kernels in issue order as (FSDP unit, seconds) runs:
    each kernel belongs to the block its module is in when that block holds parameters, else
    the root. The backward starts at the first gradient kernel and holds what runs after it
    (an activation-checkpointed block's recomputed forward too); the optimizer is apart."""
    steps = [p for p in predictions if p.cost.phase != "optimizer"]
    first = next((i for i, p in enumerate(steps) if p.cost.phase in ("dgrad", "wgrad")),
                 len(steps))
    return _runs(steps[:first], units), _runs(steps[first:], units)


def _runs(predictions, units) -> list[tuple[str, float]]:
    from dlperf.analysis.capture import block_path

    runs: list[list] = []
    for p in predictions:
        unit = block_path(p.cost.module, units)  # "" (the root) outside every unit
        if runs and runs[-1][0] == unit:
            runs[-1][1] += p.time_s
        else:
            runs.append([unit, p.time_s])
    return [(u, t) for u, t in runs]


class _Stream:
    """One communication stream: collectives run one after another, each from when it is
    issued or the previous one ends, whichever is later."""

    def __init__(self):
        self.free = 0.0

    def issue(self, at: float, seconds: float) -> float:
        self.free = max(self.free, at) + seconds
        return self.free


def _walk(runs, t: float, ready: dict, order: list, gather_s, stream: _Stream,
          done=None) -> float:
    """Compute ``runs`` [(unit, seconds)] from ``t``: each run starts once the one before it
    has ended and its unit is gathered (``ready``: unit -> when; absent: already there); a
    unit of ``order`` starting for the first time issues the next one's all-gather (FSDP's
    prefetch of one unit). ``done(i, unit, end)`` after each run. Returns the end."""
    following = dict(zip(order, order[1:]))
    started: set[str] = set()
    for i, (unit, seconds) in enumerate(runs):
        start = max(t, ready.get(unit, 0.0))
        if unit in following and unit not in started:
            started.add(unit)
            nxt = following[unit]
            if nxt not in ready:
                ready[nxt] = stream.issue(start, gather_s(nxt))
        t = start + seconds
        if done is not None:
            done(i, unit, t)
    return t


def fsdp_pipeline_s(predictions, units, gather_s, reduce_s, regather: bool = True,
                    segments: tuple | None = None) -> dict:
    """One micro-batch's forward and backward under FSDP, unit by unit, with the collectives
    on one communication stream beside the compute (FSDP's default prefetch of one unit):

    * forward: the root's all-gather first, at the step's start; unit k+1's all-gather is
      issued when unit k's compute starts (it runs once the stream is free); a unit's compute
      starts once its parameters are gathered and the compute before it has ended;
    * backward (``regather``: full sharding; SHARD_GRAD_OP keeps the forward's parameters):
      each unit but the root is gathered again, the next one's all-gather issued when a
      unit's backward starts (BACKWARD_PRE); a unit's reduce-scatter is issued when its last
      backward kernel ends (its gradients are then complete), the root's at the backward's end.

    ``units``: the FSDP units (``unit_bytes``' keys: block paths, "" for the root);
    ``gather_s(unit)`` and ``reduce_s(unit)`` their collectives' seconds; ``segments``:
    ``_segments(predictions, units)`` when the caller has them already. Returns the compute
    seconds, the micro-batch's end with the communication, and the exposed difference: at
    least the root's first all-gather and the last reduce-scatter, which nothing can hide."""
    stream = _Stream()
    forward, backward = segments or _segments(predictions, units)
    order = list(dict.fromkeys([""] + [u for u, _ in forward]))  # gathering order, root first
    t = _walk(forward, 0.0, {"": stream.issue(0.0, gather_s(""))}, order, gather_s, stream)
    last = {u: i for i, (u, _) in enumerate(backward)}

    def reduce_when_complete(i: int, unit: str, end: float) -> None:
        if last[unit] == i:
            stream.issue(end, reduce_s(unit))

    again = list(dict.fromkeys(u for u, _ in backward if u)) if regather else []
    ready = {again[0]: stream.issue(t, gather_s(again[0]))} if again else {}
    t = _walk(backward, t, ready, again, gather_s, stream, reduce_when_complete)
    compute = sum(s for _, s in forward) + sum(s for _, s in backward)
    end = max(t, stream.free)
    return {"compute_s": compute, "end_s": end, "exposed_s": max(0.0, end - compute)}


def ddp_buckets(params: list[tuple[str, int]], cap: int = DDP_BUCKET_BYTES,
                first_cap: int = DDP_FIRST_BUCKET_BYTES) -> list[tuple[list[str], int]]:
    """DDP's initial buckets: ``params`` [(name, gradient bytes)] in registration order, filled
    in reverse (the backward produces the last layers' gradients first); a bucket closes once
    it holds at least its cap (the first ``first_cap``, the rest ``cap``)."""
    return fill_buckets(list(reversed(params)), cap, first_cap)


def rebuilt_buckets(tl: "Timeline", params: list[tuple[str, int]],
                    cap: int = DDP_BUCKET_BYTES, first_cap: int = DDP_FIRST_BUCKET_BYTES
                    ) -> list[tuple[list[str], int]]:
    """The buckets DDP trains with: after the first iteration its reducer rebuilds them in the
    order the backward produced the gradients (torch/nn/parallel/distributed.py: "bucket
    rebuild bucketizes parameters based on its real execution order in backward graph"; with
    find_unused_parameters=False the first iteration runs one bucket), with the same caps.
    The order is ``tl``'s ready times, ties (one module's tensors) in reverse registration
    order. It is the reverse registration order wherever a model registers its layers in the
    order it runs them, and not where it does not (a head registered before the trunk)."""
    return fill_buckets(sorted(reversed(params), key=lambda p: tl.param_ready_s(p[0])),
                        cap, first_cap)


def fill_buckets(ordered: list[tuple[str, int]], cap: int, first_cap: int
                 ) -> list[tuple[list[str], int]]:
    """Buckets of ``ordered`` [(name, bytes)], taken in that order; a bucket closes once it
    holds at least its cap (the first ``first_cap``, the rest ``cap``)."""
    buckets, names, size = [], [], 0
    for name, nbytes in ordered:
        names.append(name)
        size += nbytes
        if size >= (first_cap if not buckets else cap):
            buckets.append((names, size))
            names, size = [], 0
    if names:
        buckets.append((names, size))
    return buckets


def serial_overlap(ready_s: list[float], comm_s: list[float], backward_end_s: float
                   ) -> tuple[float, float]:
    """(end of the last bucket's all-reduce, exposed seconds after the backward ends) for
    buckets all-reduced one after another on one stream, each starting when ready."""
    end = 0.0
    for ready, comm in zip(ready_s, comm_s):
        end = max(end, ready) + comm
    return end, max(0.0, end - backward_end_s)


@dataclass(frozen=True)
class Timeline:
    """When a predicted single-GPU step's phases end (seconds from the step's start), and when
    each module's last backward kernel ends."""

    backward_end_s: float
    step_s: float
    optimizer_s: float
    grad_ready_s: dict  # module path -> seconds

    def param_ready_s(self, name: str) -> float:
        """When the gradient of parameter ``name`` ("a.b.weight") exists: its module's last
        backward kernel, or, where its module runs none, the nearest enclosing module's that
        does. A parameter can belong to a module whose forward never runs: nn.MultiheadAttention
        keeps ``out_proj`` as a Linear but multiplies by its weight in its own functional
        forward, so those kernels are the attention module's; a model-level parameter (ViT's
        class token) is the root's (path ""). The end of the backward when no module has one."""
        path = name.rpartition(".")[0]
        while True:
            if path in self.grad_ready_s:
                return self.grad_ready_s[path]
            if not path:
                return self.backward_end_s
            path = path.rpartition(".")[0]


def timeline(predictions) -> Timeline:
    """The step's kernels in issue order (the capture's order), each taking its predicted time."""
    t, backward_end, optimizer = 0.0, 0.0, 0.0
    ready: dict[str, float] = {}
    for p in predictions:
        t += p.time_s
        if p.cost.phase == "optimizer":
            optimizer += p.time_s
            continue
        if p.cost.phase in ("dgrad", "wgrad"):
            # a module's gradients exist once its last backward kernel ends (a norm's one
            # backward kernel gives both dx and its parameters' gradients)
            backward_end = t
            ready[p.cost.module] = t
    return Timeline(backward_end, t, optimizer, ready)


def ddp_exposed_s(tl: Timeline, params: list[tuple[str, int]], comm, overlap: bool = True,
                  caps: tuple[int, int] = (DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES)) -> dict:
    """DDP's buckets (``rebuilt_buckets``) over ``tl``: ``comm(nbytes) -> seconds``
    all-reduces one bucket.
    A parameter's gradient is ready when its module's last backward kernel ends (or its
    nearest enclosing module's, ``Timeline.param_ready_s``). ``overlap=False``: the all-reduces
    cannot run beside the backward (a CPU whose cores compute both, as gloo on one core per
    process does: benchmarks/README.md), so they all start after it. ``caps``: (a bucket's, the
    first's) bytes; Horovod's fusion buffers are (HOROVOD_FUSION_BYTES,) * 2."""
    buckets = rebuilt_buckets(tl, params, *caps)
    ready = [max(tl.param_ready_s(name) if overlap else tl.backward_end_s for name in names)
             for names, _ in buckets]
    comm_s = [comm(nbytes) for _, nbytes in buckets]
    end, exposed = serial_overlap(ready, comm_s, tl.backward_end_s)
    return {"buckets": len(buckets), "comm_s": sum(comm_s), "comm_end_s": end,
            "exposed_s": exposed, "bucket_bytes": [b for _, b in buckets]}


def phase_s(predictions, *phases: str) -> float:
    """The predicted kernels' time in the given phases ("forward", "dgrad", ...)."""
    return sum(p.time_s for p in predictions if p.cost.phase in phases)


def distributed_optimizer_gather(predictions, bucket_bytes: list, ratio: float, gather,
                                 overlap: bool = True) -> dict:
    """Megatron-LM's distributed optimizer all-gathers the updated parameters bucket by bucket
    (``bucket_bytes``: the gradient buckets, in the order the backward fills them; ``ratio``:
    the parameters' bytes over the gradients', 0.5 for bf16 parameters with fp32 gradients;
    ``gather(nbytes) -> seconds``). With --overlap-param-gather the next forward issues them
    in its own order (the backward's last bucket first) and each waits for its bucket only:
    the first bucket's gather is exposed, the rest run beside the forward and stay exposed
    only by what outlasts it (the forward of one micro-batch). Without overlap they all run
    after the update."""
    times = [gather(b * ratio) for b in reversed(bucket_bytes)]
    forward = phase_s(predictions, "forward")
    total = sum(times)
    exposed = (times[0] + max(0.0, total - times[0] - forward) if overlap and times
               else total)
    return {"param_gather_s": total, "param_gather_exposed_s": exposed}


def _streaming(analysis):
    """(the analysis's efficiency model, the device's streaming bandwidth in bytes/s) for
    the elementwise passes the scale-out adds outside the captured step."""
    from dlperf.hardware.efficiency import efficiency_for

    eff = analysis.efficiency or efficiency_for(analysis.device)
    return eff, eff.bandwidth(analysis.device)


def ddp_copy_s(grad_bytes: float, analysis) -> float:
    """DDP's copies of every gradient into its bucket (in the backward's hooks) and of the
    reduced bucket back into the gradients (before the optimizer), both on the compute stream
    (torch's default, gradient_as_bucket_view=False): 4 x the gradient bytes of memory traffic
    at the device's streaming bandwidth."""
    return 4 * grad_bytes / _streaming(analysis)[1]


# DeepSpeed's reduction of the fp32 gradients after the backward: buffered_allreduce_fallback
# with elements_per_buffer=MEMORY_OPT_ALLREDUCE_SIZE (500,000,000 elements; deepspeed/runtime/
# engine.py), 4 bytes each
DEEPSPEED_BUFFER_BYTES = 500_000_000 * 4
# bytes a parameter each micro-batch's accumulation moves (``deepspeed_bf16_s``): the cast
# reads the bf16 gradient and writes an fp32 copy (2 + 4), the add reads that copy and the
# fp32 accumulator and writes the accumulator (4 + 4 + 4)
DEEPSPEED_CAST_BYTES, DEEPSPEED_ADD_BYTES = 6, 12
DEEPSPEED_ACCUMULATE_BYTES = DEEPSPEED_CAST_BYTES + DEEPSPEED_ADD_BYTES


def deepspeed_bf16_s(params: list[tuple[str, int]], analysis) -> float:
    """One micro-batch's gradient accumulation under DeepSpeed's BF16_Optimizer
    (deepspeed/runtime/bf16_optimizer.py ``update_hp_grads``, called after every micro-batch's
    backward; the pipeline engine calls it itself on all but the last stage): for each
    parameter ``hp_grad.add_(lp.grad.to(fp32))``, two kernels a parameter on the compute
    stream, ``DEEPSPEED_ACCUMULATE_BYTES`` a parameter of memory traffic at the device's
    streaming bandwidth, each kernel at least a launch. ``params``: [(name, fp32 gradient
    bytes)] of this GPU's parameters. Megatron-LM accumulates into its fp32 gradient buffer
    inside the weight-gradient GEMM (gradient_accumulation_fusion), so it pays none of this."""
    eff, bandwidth = _streaming(analysis)
    return sum(max(eff.launch_s, per_element * nbytes / 4 / bandwidth)
               for _, nbytes in params
               for per_element in (DEEPSPEED_CAST_BYTES, DEEPSPEED_ADD_BYTES))


def bn_sync_s(predictions, group: int, node) -> float:
    """Synchronised batch norm over ``group`` GPUs of a node: each batch norm all-reduces its
    per-channel statistics once in the forward and once in the backward (2C fp32 values, at
    most 16 KB for ResNet-50's 2,048 channels: latency, 2(g-1) ring steps of ``node``; the
    bytes take under 0.1 us on NVLink). The batch norms are counted by their backward kernels,
    which every fused stack keeps (analysis/fusion.py)."""
    if group <= 1:
        return 0.0
    layers = sum(1 for p in predictions if p.cost.op == "native_batch_norm_backward")
    return 2 * layers * 2 * (group - 1) * node.latency_s


def fsdp_traffic(param_bytes: float, grad_bytes: float, n: int, gathers: int = 2) -> dict:
    """Bytes each GPU sends per step under sharding: the parameters all-gathered in the
    forward and again in the backward (``gathers`` = 2, full sharding; 1 for SHARD_GRAD_OP,
    which keeps them from the forward to the backward), the gradients reduce-scattered."""
    share = (n - 1) / n if n > 1 else 0.0
    return {"all_gather_bytes": gathers * param_bytes * share,
            "reduce_scatter_bytes": grad_bytes * share}


def memory_per_gpu(memory: dict | None, params: list[tuple[str, int]], strategy: str,
                   gpus: int, gathered_bytes: float | None = None,
                   bucket_view: bool = False, units: dict | None = None,
                   optimizer_sharded: bool = False, model_copy_bytes: float | None = None,
                   half_gradient_bytes: float = 0.0, expert_share: float = 0.0,
                   expert_ways: int = 1, gradient_cast: float = 1.0) -> dict | None:
    """What each GPU holds, from one GPU's footprint (``Analysis.memory``). DDP: all of it,
    plus its gradient buckets (a second copy of the gradients, torch's default; none with
    ``bucket_view``, DDP's gradient_as_bucket_view: the gradients live in the buckets). FSDP: the
    weights, gradients and optimizer state sharded 1/n, all the activations, plus what is
    gathered whole at the peak: FSDP gathers a unit (``unit_bytes``) at a time, the root unit
    (embeddings, output head, everything outside the blocks) stays gathered from the start
    of the forward to the end of the backward (its forward encloses every block's), and beside
    it the block being computed and the one prefetched: root + 2 x the largest block, in the
    gathered dtype (``gathered_bytes``: the whole model in it; bf16 under mixed precision).
    FSDP's SHARD_GRAD_OP (ZeRO-2): the same shards, but every parameter stays gathered from
    the forward to the backward. ``optimizer_sharded`` (DDP under Megatron-LM's distributed
    optimizer): the optimizer state 1/n, the rest as DDP; with ``model_copy_bytes`` (the model
    in its half dtype beside fp32 master weights, FSDP-style mixed precision) the masters are
    1/n too and the half copy is held whole, as Megatron's distributed optimizer keeps them.
    ``half_gradient_bytes``: gradients in the model's half dtype held beside the fp32 ones
    (DeepSpeed's BF16_Optimizer, whose backward writes bf16 gradients that it then adds into
    its fp32 buffer), whole on every GPU. ``expert_share`` of the parameters are experts split
    over ``expert_ways`` expert-parallel ranks (``params`` holds this rank's): the distributed
    optimizer shards their state over the 1/expert_ways of the replicas that hold them.
    ``gradient_cast``: the distributed optimizer's gradient buffer in a smaller dtype
    (ScaleConfig.reduce_dtype, as a fraction of the gradients' own bytes): the buffer that
    much, its buckets too. (Megatron-Core's distributed optimizer copies this GPU's shard of
    a BF16 buffer to FP32 for the update and frees it at the next step's zero_grad, before
    the forward: it is never held beside the activations, so the peak leaves it out.)
    Returns the total and its parts: weights, gradients, optimizer state and activations as
    one GPU holds them, and DDP's buckets or FSDP's gathered parameters; where the footprint
    has the step's peak (liveness.with_peak: the activations at their busiest moment), the
    total with it, ``peak_bytes``, on which ``fits`` is judged."""
    if memory is None:
        return None
    grads = sum(b for _, b in params)
    weights, gradients, state, activations = (
        memory[k] for k in ("weights_bytes", "gradients_bytes", "optimizer_state_bytes",
                            "activations_bytes"))
    states = weights + gradients + state
    # (one GPU's activations are every data-parallel GPU's: the peak's too)
    peak = {k: memory[k] for k in ("activations_peak_bytes", "peak_at") if k in memory}

    def parts(**kw) -> dict:  # what each GPU holds, by kind, and their sum
        out = {"weights_bytes": weights, "gradients_bytes": gradients,
               "optimizer_state_bytes": state, "activations_bytes": activations, **kw}
        out["total_bytes"] = sum(v for k, v in out.items() if k.endswith("_bytes"))
        if peak:
            out.update(peak, peak_bytes=out["total_bytes"] - activations
                       + peak["activations_peak_bytes"])
        return out

    if strategy == "ddp" or gpus == 1:
        extra = grads if gpus > 1 and not bucket_view else 0
        half = {"half_gradients_bytes": half_gradient_bytes} if half_gradient_bytes else {}
        if not optimizer_sharded:
            return parts(ddp_bucket_bytes=extra, **half)
        # the distributed optimizer: 1/n of the state (and of the fp32 masters beside the
        # model's half copy, which is held whole); the experts' over their own replicas
        share = ((1 - expert_share) / gpus
                 + expert_share / max(1, gpus // expert_ways))
        if gradient_cast != 1.0:  # the buffer in its dtype
            gradients *= gradient_cast
            extra *= gradient_cast
        return parts(ddp_bucket_bytes=extra, **half, optimizer_state_bytes=state * share,
                     weights_bytes=(weights * share + model_copy_bytes
                                    if model_copy_bytes is not None else weights))
    if strategy == "fsdp-grad-op":
        gathered = gathered_bytes if gathered_bytes is not None else grads
    else:
        ratio = gathered_bytes / grads if gathered_bytes is not None and grads else 1.0
        units = unit_bytes(params) if units is None else units  # (``one_step`` has them)
        blocks = [b for unit, b in units.items() if unit]
        gathered = ratio * (units.get("", 0) + 2 * max(blocks, default=0))
    out = parts(weights_bytes=weights / gpus, gradients_bytes=gradients / gpus,
                optimizer_state_bytes=state / gpus, gathered_bytes=gathered)
    out["sharded_state_bytes"] = states / gpus  # (of the total: the three above)
    return out


# MXNet's device kvstore (`--kv-store device`; apache/mxnet src/kvstore/comm.h, CommDevice;
# NVIDIA's MXNet ResNet-50 of 2018: its 18.12 README's runner and MLPerf v0.5's DGX-1 run):
# one process drives a node's GPUs, and each gradient tensor (a key) is reduced on its own,
# by the threaded engine, one operation at a time: its n copies into a merge buffer on the
# GPU the key is assigned to (keys spread by size), one ElementwiseSum, the update (on the
# kvstore), the copy back into the stored value and n copies out to the GPUs; on one GPU only
# the last two and the update run, so n GPUs add 2 n operations a key. Each costs the engine's
# scheduling and a launch: MXNET_KVSTORE_OP_S, fitted by benchmarks/fit_kvstore.py to NVIDIA's
# 18.12 README (4 and 8 V100s of a DGX-1, fp16 and FP32: 18-20 ms a step at 8 GPUs whether the
# gradients are 51 or 102 MB, so operations, not bytes, set the cost), the record blog's run
# held out; the bytes move at the node's bus bandwidth (each GPU sends and receives
# 2 (n - 1) / n of them, as in a ring). Not overlapped with the backward: the added time is
# the same at batch 96 and 208 (results/kvstore-fit.json).
KVSTORES = ("device",)
MXNET_KVSTORE_OP_S = 5.43e-6  # results/kvstore-fit.json: 5.431 us


def device_kvstore_ops(keys: int, gpus: int) -> int:
    """Engine operations MXNet's device kvstore adds to a step on ``gpus`` GPUs over one GPU's:
    2 n a key (see MXNET_KVSTORE_OP_S)."""
    return keys * 2 * gpus if gpus > 1 else 0


def device_kvstore_s(params: list[tuple[str, int]], gpus: int, node,
                     op_s: float | None = None) -> dict:
    """One step's reduction of the gradients ``params`` ([(name, bytes)], one key each) by
    MXNet's device kvstore on ``gpus`` GPUs of ``node``: its engine operations at ``op_s``
    each (None: MXNET_KVSTORE_OP_S) and its copies at the node's bus bandwidth, all exposed."""
    op_s = MXNET_KVSTORE_OP_S if op_s is None else op_s
    nbytes = sum(b for _, b in params)
    ops = device_kvstore_ops(len(params), gpus)
    copies = 2 * (gpus - 1) / gpus * nbytes / node.bus_bandwidth if gpus > 1 else 0.0
    t = ops * op_s + copies
    return {"kvstore": "device", "keys": len(params), "engine_ops": ops, "op_s": op_s,
            "copy_s": copies, "comm_s": t, "exposed_s": t}


# fsdp: full sharding (ZeRO-3); fsdp-grad-op: FSDP's SHARD_GRAD_OP (ZeRO-2), parameters
# gathered once in the forward and kept until the backward has used them; hsdp: FSDP's
# HYBRID_SHARD, full sharding inside each node and a replica per node
STRATEGIES = ("ddp", "fsdp", "fsdp-grad-op", "hsdp")
# whose tensor parallelism (``tensor_parallel_collectives``; models/gpt.py ``tp_impl``)
TP_IMPLS = ("torch", "torch-async", "megatron", "te")
# how context parallelism exchanges K and V (models/gpt.py CP_COMMS; context_parallel_s)
CP_COMMS = ("p2p", "allgather")
DECODES = ("gpu", "cpu", "synthetic")
# FSDP's reduce_dtype (ScaleConfig.reduce_dtype)
REDUCE_DTYPES = ("fp32", "bf16", "fp16")


def tensor_parallel_collectives(layers: int, tokens: int, d_model: int, act_bytes: int,
                                recompute: bool, sequence_parallel: bool = True,
                                impl: str = "torch", fp8: bool = False,
                                recompute_every: int = 1, float8: str | None = None,
                                mxfp8: bool = False
                                ) -> tuple[tuple[str, int, int, str | None], ...]:
    """The collectives one micro-batch of ``tokens`` (batch x sequence) makes among the
    tensor-parallel ranks of a decoder of ``layers`` blocks (see the module docstring): (kind,
    count, bytes of the whole tensor, beside), ``beside`` None for a collective between
    dependent kernels, else the column-parallel GEMMs it runs beside ("dgrad", "wgrad").

    With sequence parallelism, all-gathers and reduce-scatters: forward 2 of each per block, a
    reduce-scatter after the embedding and an all-gather before the output layer (2 L + 1 of
    each); the backward the same in reverse; a recomputed forward 2 of each per block again
    (per ``recompute_every``-th block, when only those are checkpointed).
    Without it (Megatron's original scheme), an all-reduce in each of those places instead of
    the pair (NCCL's ring all-reduce is a reduce-scatter then an all-gather): forward one after
    each split region and the embedding, backward one before each split region and the output
    layer, a recompute one per split region. Under Megatron's implementation the backward's
    collectives at the 2 L + 1 column-parallel layers (the input gradient's reduce-scatter or
    all-reduce) run beside the weight-gradient GEMMs, and with sequence parallelism each of
    those layers also gathers its input again beside its data-gradient GEMM (2 L + 1
    all-gathers more). Each tensor is the residual stream, tokens x d_model in the activations'
    dtype; under ``fp8`` (TransformerEngine's FP8 layers, ``impl`` "te" only; models/fp8.py)
    the blocks' layers all-gather FP8 data, 1 byte an element (their inputs, and the
    row-parallel layers' output gradients), while the reduce-scatters and the output layer's
    and embedding's collectives stay in the activations' dtype; under ``mxfp8`` (``fp8``
    with TE's MXFP8 block scaling) each gathered copy carries a scale byte for each 32
    elements, and a row-parallel layer gathers its output gradient's two copies, row- and
    column-wise (models/fp8.py, ``MxCast`` and ``_MxLinearFn``). So do torchao's float8 layers
    under ``float8`` "tensorwise" (``impl`` "torch" or "torch-async" with sequence parallelism:
    models/float8.py, torchao's float8 tensor-parallel styles); under "rowwise" they gather in
    the activations' dtype and cast after the gather, so under "torch-async" no matmul reads
    an all-gather's output and Inductor fuses none of them (pytorch/pytorch#149990): only the
    forward's reduce-scatters, after the matmuls that produce them."""
    if impl not in TP_IMPLS:
        raise ValueError(f"tensor-parallel implementation {impl!r}: one of "
                         f"{', '.join(TP_IMPLS)}")
    if fp8 and impl != "te":
        raise ValueError("FP8 layers are TransformerEngine's: impl must be 'te'")
    if mxfp8 and not fp8:
        raise ValueError("MXFP8 is one of TransformerEngine's FP8 recipes: mxfp8 needs fp8")
    if float8 is not None and (float8 not in ("tensorwise", "rowwise")
                               or impl not in ("torch", "torch-async")):
        raise ValueError(f"torchao's float8 recipe {float8!r} (tensorwise or rowwise) runs on "
                         "PyTorch's tensor parallelism: impl 'torch' or 'torch-async'")
    nbytes = tokens * d_model * act_bytes
    # what the blocks' layers gather (TransformerEngine's or torchao's tensorwise: FP8)
    gathered = tokens * d_model * (1 if fp8 or float8 == "tensorwise" else act_bytes)
    # an MXFP8 copy with its E8M0 scales (d_model: a multiple of 32 under MXFP8); the
    # row-parallel layers' output gradient gathered both ways
    gathered += gathered // 32 if mxfp8 else 0
    gradient = 2 * gathered if mxfp8 else gathered
    regions = 2 * layers + 1  # the split regions' column-parallel layers, the output layer's
    # (a checkpoint of every n-th block replays the collectives of those blocks only)
    again = 2 * (layers // recompute_every) if recompute else 0
    if impl == "te":
        if not sequence_parallel:
            raise ValueError("TransformerEngine's tensor-parallel overlap needs sequence "
                             "parallelism (Megatron-LM refuses --tp-comm-overlap without it)")
        # the blocks' four split layers overlap every collective of theirs with a GEMM; the
        # output layer (Megatron's own column-parallel linear) gathers its input between
        # dependent kernels in the forward, and the embedding's reduce-scatter (all-gather in
        # the backward) has no GEMM beside it
        return tuple(c for c in (
            ("allgather", 2, nbytes, None),  # the output layer's, the embedding's backward
            ("reducescatter", 1, nbytes, None),  # after the embedding
            ("allgather", 2 * layers, gathered, "fprop"),  # ring exchange beside QKV, FC1
            ("reducescatter", 2 * layers, nbytes, "row-fprop"),  # pipelined after proj, FC2
            ("allgather", again, gathered, "recompute"),
            ("reducescatter", again, nbytes, "row-recompute"),
            ("allgather", 2 * layers, gradient, "row-dgrad"),  # ring beside proj's, FC2's dgrad
            # bulk: the input again, beside dgrad (the output layer's in the activations' dtype)
            *((("allgather", 2 * layers, gathered, "dgrad"), ("allgather", 1, nbytes, "dgrad"))
              if fp8 else (("allgather", regions, nbytes, "dgrad"),)),
            ("reducescatter", regions, nbytes, "wgrad"),  # bulk: dgrad's, beside wgrad
        ) if c[1])
    if impl == "torch-async":
        if not sequence_parallel:
            raise ValueError("PyTorch's async tensor parallelism fuses the all-gathers and "
                             "reduce-scatters of sequence parallelism: it needs it")
        # Inductor's micro-pipeline pass (torch/_inductor/fx_passes/micro_pipeline_tp.py,
        # torchtitan's --parallelism.enable_async_tensor_parallel) inside the compiled blocks:
        # an all-gather whose output only matmuls read becomes fused_all_gather_matmul, a
        # reduce-scatter of one matmul's output fused_matmul_reduce_scatter, each chunk's
        # matmul beside the next chunk's transfer. The output layer and the embedding are
        # outside torchtitan's compiled blocks: theirs stay exposed. In the backward the
        # column-parallel layers' input gradient is a sum of matmuls (q, k and v; w1 and w3),
        # not one matmul's output, so its reduce-scatter is not fused either.
        # (torchao's rowwise recipe casts after the gather: the all-gathers' readers are its
        # casts, not matmuls, so none of them is fused)
        fused = float8 != "rowwise"
        return tuple(c for c in (
            ("allgather", 2, nbytes, None),  # the output layer's, the embedding's backward
            ("reducescatter", 2, nbytes, None),  # the embedding's, the output layer's backward
            ("allgather", 2 * layers, gathered, "fprop" if fused else None),  # QKV's, FC1's
            ("reducescatter", 2 * layers, nbytes, "row-fprop-ring"),  # with proj's, FC2's
            ("allgather", again, gathered, "recompute" if fused else None),
            ("reducescatter", again, nbytes, "row-recompute-ring"),
            # the row-parallel layers' output gradient, fused with the data-gradient matmul
            # (the pass fuses the matmuls that take the gathered tensor as their left
            # operand; the weight gradient's reads its transpose, after the gather)
            ("allgather", 2 * layers, gathered, "row-dgrad" if fused else None),
            ("reducescatter", 2 * layers, nbytes, None),  # the sum of q, k, v's (w1, w3's)
        ) if c[1])
    if impl == "torch":
        if not sequence_parallel:
            return (("allreduce", 2 * regions + again, nbytes, None),)
        if float8 == "tensorwise":  # torchao's float8 styles: the blocks' all-gathers in FP8
            return (("allgather", 2, nbytes, None),  # the output layer's, the embedding's
                    ("allgather", 4 * layers + again, gathered, None),
                    ("reducescatter", 2 * regions + again, nbytes, None))
        return (("allgather", 2 * regions + again, nbytes, None),
                ("reducescatter", 2 * regions + again, nbytes, None))
    if not sequence_parallel:
        return (("allreduce", regions + again, nbytes, None),
                ("allreduce", regions, nbytes, "wgrad"))
    # forward (and recompute) as above; the backward's all-gathers at the row-parallel
    # outputs and the embedding stay between dependent kernels
    return (("allgather", 2 * regions + again, nbytes, None),
            ("reducescatter", regions + again, nbytes, None),
            ("allgather", regions, nbytes, "dgrad"),
            ("reducescatter", regions, nbytes, "wgrad"))


def float8_tp_reductions(recipe: str, layers: int, column: int, row: int, tokens: int,
                         d_model: int, recompute_layers: int = 0, sequence_parallel: bool = True
                         ) -> tuple[tuple[str, int, int, None], ...]:
    """The amax all-reduces that torchao's float8 layers (models/float8.py) add among the
    tensor-parallel ranks in one micro-batch of ``tokens`` through ``layers`` blocks of
    ``column`` column-parallel and ``row`` row-parallel layers each (Llama: q, k, v, w1, w3 and
    wo, w2), ``recompute_layers`` of whose forwards run again. A float8 cast reduces its
    amax over the axis its scale covers; where DTensor holds that axis split over the ranks,
    the amax is partial and is all-reduced (max) before the cast, a collective between
    dependent kernels: (kind, count, bytes, None), as ``tensor_parallel_collectives``.

    * "tensorwise" (one FP32 amax a cast; torchao's float8 styles): a forward casts each split
      region's input on the token shard (2 a block, with sequence parallelism), each
      row-parallel layer's input (split over its features) and every weight (split over the
      ranks); a backward each layer's output gradient (the column layers' split over their
      features, the row layers' on the token shard).
    * "rowwise" (an amax a row; torchtitan's plain styles, casts after the gathers): those
      whose reduced axis is split: a forward's row-parallel inputs per token (``tokens``
      values) and their weights per output feature (``d_model``, over the split input
      features); a backward's column-parallel output gradients per token, and their weights
      per input feature (``d_model``, over the split outputs)."""
    if recipe not in ("tensorwise", "rowwise"):
        raise ValueError(f"torchao's float8 recipe {recipe!r}: tensorwise or rowwise")
    if min(layers, column, row, tokens, d_model, recompute_layers) < 0:
        raise ValueError("layers, column and row layers, tokens, d_model and recomputed layers "
                         "are counts: not negative")
    forwards = layers + recompute_layers
    if recipe == "tensorwise":
        inputs = 2 if sequence_parallel else 0  # the split regions' inputs, on the token shard
        count = forwards * (inputs + row + column + row) + layers * (column + row)
        return (("allreduce", count, 4, None),) if count else ()
    return tuple(c for c in (
        ("allreduce", forwards * row + layers * column, 4 * tokens, None),  # per token
        ("allreduce", forwards * row + layers * column, 4 * d_model, None),  # per feature
    ) if c[1])


# TransformerEngine's pipelined reduce-scatter splits its GEMM in this many chunks (its
# default ``num_splits`` for the "pipeline" method, transformer_engine/pytorch/module/base.py
# ``initialize_ub``, 2024-07; Megatron-LM passes no configuration of its own by default)
TE_RS_SPLITS = 4

# What each ``beside`` of ``tensor_parallel_collectives`` runs beside: the regions (column:
# the column-parallel layers, the output layer's included; column-blocks: the blocks' only;
# row: the blocks' row-parallel layers), the phase of their kernels, and how the collective
# overlaps them (``overlap_left_s``). Megatron-LM's own backward overlap is "bulk" (the whole
# collective beside the whole GEMM); TransformerEngine's userbuffers (Megatron-LM
# --tp-comm-overlap) add the forward's and the row-parallel layers' data gradient: their
# all-gathers in a ring exchange of the tokens chunk by chunk ("qkv_fprop", "fc1_fprop",
# "proj_dgrad", "fc2_dgrad"), the forward's reduce-scatters pipelined after the GEMM's chunks
# ("proj_fprop", "fc2_fprop"), the column-parallel layers' backward in bulk ("qkv_dgrad",
# "qkv_wgrad", "fc1_dgrad", "fc1_wgrad"): the defaults of TransformerEngine's initialize_ub.
TP_OVERLAP = {
    "dgrad": ("column", "dgrad", "bulk"), "wgrad": ("column", "wgrad", "bulk"),
    "fprop": ("column-blocks", "forward", "ring"),
    "recompute": ("column-blocks", "recompute", "ring"),
    "row-fprop": ("row", "forward", "pipeline"),
    "row-recompute": ("row", "recompute", "pipeline"),
    "row-dgrad": ("row", "dgrad", "ring"),
    # PyTorch's async tensor parallelism (impl "torch-async"): its fused reduce-scatter
    # computes the matmul one destination rank's chunk at a time, each chunk sent beside the
    # next one's matmul (symm_mem's _pipelined_produce_and_all2all): a ring, like the
    # all-gathers
    "row-fprop-ring": ("row", "forward", "ring"),
    "row-recompute-ring": ("row", "recompute", "ring"),
}


def overlap_left_s(collective_s: float, gemm_s: float, method: str, tp: int) -> float:
    """What a collective of ``collective_s`` leaves exposed beside a GEMM of ``gemm_s``:
    * bulk: both issued at once: what the collective outlasts the GEMM by;
    * ring (TransformerEngine's ring exchange of an all-gather over ``tp`` ranks): the GEMM in
      ``tp`` chunks, the first on this rank's own tokens while the next chunk arrives, each
      further chunk's transfer (collective_s / (tp - 1)) beside the chunk before:
      (tp - 1) max(0, collective_s / (tp - 1) - gemm_s / tp);
    * pipeline (a reduce-scatter after the GEMM's ``TE_RS_SPLITS`` chunks, each chunk's
      reduce-scatter beside the next chunk's GEMM): the last chunk's is exposed, and any chunk
      whose transfer outlasts the next GEMM chunk: max(c, s c - (s - 1) g), c and g a chunk's.
    The overlap is taken as perfect otherwise: the communication kernels also take SMs and
    memory bandwidth from the GEMM beside them, which this does not charge."""
    if method == "bulk":
        return max(0.0, collective_s - gemm_s)
    if method == "ring":
        return max(0.0, collective_s - gemm_s * (tp - 1) / tp) if tp > 1 else 0.0
    if method == "pipeline":
        s = TE_RS_SPLITS
        return max(collective_s / s, collective_s - gemm_s * (s - 1) / s)
    raise ValueError(f"overlap method {method!r}: bulk, ring or pipeline")


def beside_gemm_s(predictions, regions, phase: str, collective_s: float,
                  method: str = "bulk", tp: int = 1) -> tuple[float, int]:
    """What a micro-batch's collectives of ``collective_s`` each, one per region, leave
    exposed when each runs beside its region's ``phase`` ("forward", "dgrad", "wgrad",
    "recompute") kernels (``regions``: tuples of module paths, models/gpt.py
    ``column_parallel_regions`` and ``row_parallel_regions``), overlapped as ``method`` does
    (``overlap_left_s``, over ``tp`` ranks): (the sum over the regions present in
    ``predictions`` of what is left exposed, how many regions are present: a pipeline stage
    holds some)."""
    beside: dict[str, float] = {}
    for p in predictions:
        if p.cost.phase == phase:
            beside[p.cost.module] = beside.get(p.cost.module, 0.0) + p.time_s
    present = [r for r in regions if any(m in beside for m in r)]
    return (sum(overlap_left_s(collective_s, sum(beside.get(m, 0.0) for m in r), method, tp)
                for r in present), len(present))


def context_parallel_s(predictions, cp: int, comm: str, kv_bytes: float, layers: int,
                       in_node: bool, collective, link) -> dict:
    """What context parallelism over ``cp`` ranks adds to one micro-batch of a stage of
    ``layers`` blocks (models/gpt.py ``cp_attend``), each layer exchanging ``kv_bytes`` (the
    rank's own K and V, in the activations' dtype):
    * "p2p" (TransformerEngine's ring): each of a layer's cp attention kernels (equal work,
      ``cp_attention_kernels``) runs while the next step's K and V arrive from the ring
      neighbour, so each of the cp - 1 transfers (``link``: latency plus ``kv_bytes`` over
      its bandwidth) leaves exposed what it outlasts a kernel by; the backward passes K and V
      and their gradient (twice the bytes) beside each backward kernel and sends the last
      gradient home after them; a recomputed forward repeats the forward's;
    * "allgather" (Llama 3's): an all-gather of every rank's K and V before the layer's
      kernels and a reduce-scatter of their gradients after its backward
      (``collective(nbytes)``: the gathered size over the cp ranks), exposed, as Llama 3
      describes them; again in a recomputed forward.
    The kernels' times are the layer's share of the predicted attention kernels
    (``predictions``, a stage's). Returns busy and exposed seconds and the counts."""
    attention = {phase: sum(p.time_s for p in predictions if p.cost.phase == phase
                            and p.cost.op in ("attention", "attention_backward"))
                 for phase in ("forward", "dgrad", "recompute")}
    # (a pipeline stage of no blocks, the embedding or the output layer alone: no exchanges)
    per = max(layers, 1) * cp  # a layer's attention kernel's share of the stage's
    if comm == "p2p":
        x = link.latency_s + kv_bytes / link.bus_bandwidth
        steps = cp - 1
        # (phase, transfers a layer, seconds each, the kernel each runs beside)
        plan = [("forward", steps, x, attention["forward"] / per),
                ("dgrad", steps, 2 * x, attention["dgrad"] / per),
                ("dgrad", 1, x, 0.0)]  # the last gradient sent home
        if attention["recompute"]:
            plan.append(("recompute", steps, x, attention["recompute"] / per))
    elif comm == "allgather":
        t = collective(cp * kv_bytes)
        plan = [("forward", 1, t, 0.0), ("dgrad", 1, t, 0.0)]
        if attention["recompute"]:
            plan.append(("recompute", 1, t, 0.0))
    else:
        raise ValueError(f"context-parallel communication {comm!r}: one of "
                         f"{', '.join(CP_COMMS)}")
    busy = layers * sum(n * t for _, n, t, _ in plan)
    exposed = layers * sum(n * max(0.0, t - beside) for _, n, t, beside in plan)
    return {"cp": cp, "comm": comm, "in_node": in_node, "kv_bytes_each": kv_bytes,
            "exchanges_per_micro_batch": layers * sum(n for _, n, _, _ in plan),
            "busy_s": busy, "exposed_s": exposed}


# the buffer on which expert parallelism's gradient reduction is compared with the dense one
# (``scale_out``): large enough that both run at their links' bandwidth
EXPERT_REFERENCE_BYTES = 256 * 2**20


def alltoall_s(nbytes: float, gpus: int, gpus_per_node: int, node, network) -> float:
    """One all-to-all over ``gpus`` ranks, ``gpus_per_node`` of them in each node, in which
    each rank holds ``nbytes`` and sends 1/gpus of them to every rank, itself included (a
    mixture of experts' token dispatch or combine: ``expert_parallel_s``). NCCL runs it as a
    send and a receive to each peer at once (ncclGroupStart; nccl-tests' alltoall_perf), so
    the share for the ranks of its node moves over the node's links and the rest over the
    rank's own NIC, side by side: the slower of the two, each at its link's bus bandwidth
    plus one latency. For the all-to-all nccl-tests reports busbw = algbw x (n-1)/n, the
    rate of each rank's link, which is what the presets hold for the all-reduce; that the
    two are equal on a link is an assumption (no all-to-all measurement is in the presets)."""
    if gpus <= 1 or nbytes <= 0:
        return 0.0
    inside = min(gpus, gpus_per_node)
    t_node = (nbytes * (inside - 1) / gpus / node.bus_bandwidth + node.latency_s
              if inside > 1 else 0.0)
    t_net = (nbytes * (gpus - inside) / gpus / network.bus_bandwidth + network.latency_s
             if gpus > inside else 0.0)
    return max(t_node, t_net)


# How a mixture of experts' tokens reach their experts' ranks (ScaleConfig.ep_dispatcher):
# "alltoall", every copy sent to its expert's rank (Megatron-Core's alltoall dispatcher,
# torchtitan's); "deepep" and "hybridep", each token sent once to each GPU holding one of its
# experts, over the network once to each other node holding one (DeepSeek's DeepEP and
# NVIDIA's HybridEP: Megatron-Core's flex dispatcher, --moe-flex-dispatcher-backend), timed
# alike (``node_deduplicated_alltoall_s``)
EP_DISPATCHERS = ("alltoall", "deepep", "hybridep")


def node_deduplicated_alltoall_s(nbytes: float, gpus: int, gpus_per_node: int, node, network,
                                 experts: int, top_k: int) -> float:
    """One dispatch (or combine) of DeepEP's or HybridEP's over ``gpus`` expert-parallel
    ranks, ``gpus_per_node`` of them in each node, each rank holding ``nbytes`` of token
    copies (``top_k`` a token, to ``experts`` experts spread evenly over the ranks). The
    kernels move a token, not its copies: once to each GPU that holds one or more of its
    experts (DeepEP's ``get_dispatch_layout``: ``is_token_in_rank``, a token x rank map; the
    receiving GPU feeds it to each of its experts there, and the combine sums a GPU's copies
    before sending them back), and across the network once to each other node that holds
    one (the kernels send it to that node's GPU on the sender's rail, which forwards it over
    NVLink: DeepEP's README, "internode" kernels; arXiv 2412.19437, section 3.2.2), where the
    plain all-to-all sends each copy (``alltoall_s``). With the router's choices spread evenly
    (the published runs force the balance), a group of e experts holds none of a token's k
    with probability C(E - e, k) / C(E, k): a token leaves its node for (nodes - 1) x (1 - that)
    nodes (e a node's experts), and reaches gpus x (1 - that) GPUs (e a GPU's), (n - 1) / n of
    them over NVLink for n GPUs in a node (all but the one it came in on, or started from).
    The two links run side by side (the kernels pipeline their chunks): the slower, each at
    its bus bandwidth plus one latency. With one expert a GPU this is the plain all-to-all.
    Not modelled: the SMs the kernels hold while they run (HybridEP's default 16) beside other
    work; the dispatch is exposed anyway."""
    inside = min(gpus, gpus_per_node)
    nodes = -(-gpus // inside)
    if nbytes <= 0:
        return alltoall_s(nbytes, gpus, gpus_per_node, node, network)
    token = nbytes / top_k  # one copy of each of the rank's tokens

    def reached(group: int) -> float:  # 1 - P(a group of ``group`` experts holds none)
        return 1 - math.comb(experts - group, top_k) / math.comb(experts, top_k)

    t_node = (token * gpus * reached(experts // gpus) * (inside - 1) / inside
              / node.bus_bandwidth + node.latency_s)
    if nodes == 1:
        return t_node
    t_net = (token * (nodes - 1) * reached(experts * inside // gpus) / network.bus_bandwidth
             + network.latency_s)
    return max(t_node, t_net)


def expert_parallel_s(predictions, ep: int, nbytes: float, alltoall) -> dict:
    """What expert parallelism over ``ep`` ranks adds to one micro-batch of a stage
    (models/gpt.py ``MoE``): each mixture-of-experts layer in the ``predictions`` (a stage's)
    dispatches its token copies to their experts' ranks and combines them back, an all-to-all
    each (``alltoall(nbytes)``: ``nbytes`` the busiest rank's copies, ``GPTConfig.expert_rows``
    x d_model in the activations' dtype), and its backward runs the two again for the
    gradients; a layer whose forward is recomputed (a full activation checkpoint replays the
    MoE layer, Megatron-Core's --recompute-granularity full) runs its two again. Exposed, every
    one: the experts wait for their tokens and the next layer for the combine (Megatron-Core's
    all-to-all dispatcher without --overlap-moe-expert-parallel-comm, torchtitan's). Returns
    busy (= exposed) seconds and the counts."""
    layers = {phase: len({p.cost.module for p in predictions if p.cost.module_type == "MoE"
                          and p.cost.kind == "gemm" and p.cost.phase == phase})
              for phase in ("forward", "recompute")}
    each = alltoall(nbytes)
    count = 4 * layers["forward"] + 2 * layers["recompute"]
    return {"ep": ep, "moe_layers": layers["forward"], "recomputed_layers": layers["recompute"],
            "alltoalls_per_micro_batch": count, "bytes_each": nbytes, "alltoall_s": each,
            "busy_s": count * each, "exposed_s": count * each}


@dataclass(frozen=True)
class ScaleConfig:
    """How the job is spread: ``gpus`` in nodes of ``gpus_per_node``, data parallel by DDP or
    FSDP, each GPU fed by a JPEG decode on the GPU (or synthetic data), or on
    ``data_cores_per_gpu`` host cores decoding ``decode_img_per_s_per_core`` images/s each
    (`dlperf bench data` measures that rate on a machine). ``loader_workers_per_gpu``: the
    loader's worker processes per GPU (a DataLoader's num_workers), when known: each decodes
    one image at a time, so a GPU's decode runs on min(workers, the node's cores / the GPUs
    sharing them) cores, and a job that fits one GPU on a host it does not share decodes
    faster than the same job on every GPU of that host (``decode_parallelism``)."""

    gpus: int
    gpus_per_node: int = 8
    strategy: str = "ddp"
    decode: str = "gpu"
    data_cores_per_gpu: float | None = None
    decode_img_per_s_per_core: float | None = None
    loader_workers_per_gpu: int | None = None
    # micro-batches per optimizer step: DDP all-reduces once per step (no_sync on the others),
    # FSDP gathers and reduce-scatters on every micro-batch (its default; Composer's too)
    grad_accum: int = 1
    # DDP: the gradients' all-reduce runs beside the backward (torch DDP's buckets); False: it
    # starts after the backward, in Horovod's 64 MiB fusion buffers (one for ResNet-50), as
    # NVIDIA's multi-node MLPerf ResNet-50 configs run it: "Default is no NCCL and BWD overlap"
    overlap: bool = True
    # DDP's bucket_cap_mb (MiB; None: its default, 25 MiB buckets after a 1 MiB first one;
    # any value given, the default included, makes the first bucket that size too, as
    # torch's _BucketCapacityConfig does), or with overlap=False Horovod's fusion threshold
    bucket_cap_mb: float | None = None
    # DDP's gradient_as_bucket_view: the gradients are views into the buckets, so DDP neither
    # copies them in and out (``ddp_copy_s``) nor holds a second copy of them
    bucket_view: bool = False
    # DDP as Megatron-LM's distributed optimizer runs it (--use-distributed-optimizer, ZeRO-1
    # with its gradient buffer as the buckets): each bucket reduce-scattered beside the
    # backward, each replica updating 1/n of the parameters and keeping 1/n of the optimizer
    # state, the updated parameters all-gathered (in the model's dtype) beside the next
    # forward (--overlap-param-gather; after the update without overlap)
    distributed_optimizer: bool = False
    # DDP as DeepSpeed's BF16_Optimizer runs it (a "bf16" config at ZeRO stage 0, which
    # implements its own stage 1: Megatron-DeepSpeed's BLOOM-176B run; ``deepspeed_bf16_s``):
    # after every micro-batch's backward each bf16 gradient is cast to fp32 and added into an
    # fp32 buffer of the whole model; after the last one that buffer is all-reduced (not
    # reduce-scattered: the buffer is not sharded) after the backward, each replica updates
    # 1/n of the fp32 master weights and Adam state, and the bf16 parameters are all-gathered
    # after the update
    deepspeed_bf16: bool = False
    # FSDP's reduce_dtype (MixedPrecision): the dtype the gradients are reduce-scattered (and
    # under HSDP all-reduced between replicas) in; None: their own (fp32, or the model's dtype
    # under --precision half). FSDP1's bf16 policies reduce in bf16 (fms-fsdp's bfSixteen,
    # llama-recipes), torchtitan's FSDP2 and Composer's DEFAULT in fp32. Under DDP with the
    # distributed optimizer: Megatron-Core's gradient buffer in that dtype (its DDP config's
    # grad_reduce_in_fp32 off, as every Megatron-Bridge performance config sets it,
    # scripts/performance/configs/ at v0.2.0 and v0.3.0): the backward accumulates into a
    # buffer of that dtype, which is reduce-scattered as it is, and the optimizer copies its
    # shard to FP32.
    reduce_dtype: str | None = None
    # GPUs that share each batch norm's statistics (synchronised batch norm in groups, MXNet's
    # BN_GROUP): every batch norm exchanges its per-channel sums in the forward and again in
    # the backward, one small all-reduce each inside the node, on the step's critical path
    bn_group: int = 1
    # the spread of one GPU's step time (coefficient of variation; None: STEP_CV, the fitted
    # one); the step waits for the slowest GPU (straggler_s)
    step_cv: float | None = None
    # NCCL_ALGO and NCCL_PROTO as the job sets them ("Ring", "^Tree", "LL,Simple"; None: NCCL's
    # own choice among all): the collectives are timed among what they allow
    nccl_algo: str | None = None
    nccl_proto: str | None = None
    # tensor-parallel ranks inside a node (1: none), the collectives among them per micro-batch
    # ((kind, count, bytes, beside): tensor_parallel_collectives) and the column-parallel
    # regions (tuples of module paths) that those run beside a GEMM are timed against
    tp: int = 1
    tp_collectives: tuple = ()
    tp_regions: tuple = ()
    # the blocks' row-parallel layers (attention output, MLP output), that TransformerEngine's
    # overlap runs the forward's reduce-scatters and the backward's all-gathers beside
    tp_row_regions: tuple = ()
    # pipeline-parallel stages (1: none; analysis/pipeline.py), the virtual stages of each
    # GPU (Megatron's interleaved schedule; 1: 1F1B), and the bytes one point-to-point
    # transfer carries between stages (a micro-batch's activations at a stage boundary, on one
    # tensor-parallel rank); the analysis is then the slowest stage's, and grad_accum the
    # micro-batches of a step
    pp: int = 1
    pp_virtual: int = 1
    p2p_bytes: int = 0
    # the interleaved schedule's transfers beside the chunks' compute (Megatron-Core's
    # --overlap-p2p-communication, its default with virtual stages; pipeline.p2p_exposed_s)
    pp_overlap_p2p: bool = False
    # the other stages' fill and drain in micro-batches of the slowest stage (None: pp - 1,
    # stages of equal time; pipeline.fill_stages for an uneven layout)
    pp_fill: float | None = None
    # with pipeline stages, the gradient bytes of a tied embedding that the first and the
    # last stage both hold (Megatron-LM's word embeddings), all-reduced between them each step
    pp_tied_bytes: int = 0
    # context-parallel ranks (1: none; models/gpt.py): each sequence split over cp GPUs next
    # to the tensor-parallel ranks in Megatron's order (tensor, context, data, pipeline; Llama
    # 3's too), exchanging K and V by ``cp_comm`` (context_parallel_s): ``cp_kv_bytes`` a
    # layer's K and V on one rank for a micro-batch, ``cp_layers`` the blocks of a stage. The
    # gradients are reduced over the data-parallel and context-parallel ranks together.
    cp: int = 1
    cp_comm: str = "p2p"
    cp_kv_bytes: int = 0
    cp_layers: int = 0
    # the gradients' reduction: NCCL's collectives (None), or MXNet's single-process device
    # kvstore ("device": ``device_kvstore_s``), one node's GPUs driven by one process; and
    # that kvstore's cost per engine operation (None: MXNET_KVSTORE_OP_S, the fitted one)
    kvstore: str | None = None
    kvstore_op_s: float | None = None
    # FSDP: the parameters (names) gathered in FP8, one byte an element (torchao's float8
    # all-gather: models/float8.py, ``float8_parameters``); the rest in the model's dtype
    fp8_gathered: frozenset = frozenset()
    # the SMs a data-parallel collective's kernels hold while it runs beside the compute, which
    # then runs on the rest (contention_s); 0: none, the compute beside it at full speed (the
    # default: see NCCL_CHANNEL_SM_SHARE)
    collective_sms: int = 0
    # DDP: the module's buffers, (dtype, tensors, bytes) per dtype (``module_buffers``), and
    # whether DDP broadcasts them from rank 0 before every forward (broadcast_buffers, torch's
    # default True; ``buffer_broadcast_s``). MXNet's and Horovod's reductions do not.
    buffers: tuple = ()
    broadcast_buffers: bool = True
    # expert-parallel ranks (1: none; models/gpt.py ``MoE``): the experts split over ep of
    # the data-parallel ranks (Megatron-Core's order: tensor, context, expert, data, pipeline,
    # so they are adjacent), each micro-batch's mixture-of-experts layers exchanging
    # ``ep_bytes`` a rank by all-to-alls (``expert_parallel_s``); the experts' gradients
    # (``expert_params``: their names) are reduced over the data-parallel ranks that hold the
    # same experts, 1/ep of them (Megatron-Core's expert data parallel group)
    ep: int = 1
    ep_bytes: int = 0
    expert_params: frozenset = frozenset()
    # how the tokens reach their experts (EP_DISPATCHERS), and the routing the node-
    # deduplicating dispatchers need: (experts, top_k) of the model
    ep_dispatcher: str = "alltoall"
    ep_routing: tuple = ()

    def __post_init__(self):
        self.algorithms, self.protocols  # parsed (and checked) once, then kept
        if self.step_cv is not None and not 0 <= self.step_cv < 0.5:
            raise DlperfError(f"--step-cv {self.step_cv}: the spread of one GPU's step time is "
                              "a fraction from 0 to 0.5 (0.01: 1%)")
        if self.gpus < 1 or self.gpus_per_node < 1:
            raise DlperfError("--gpus and --gpus-per-node must be at least 1")
        if self.grad_accum < 1:
            raise DlperfError("--grad-accum must be at least 1")
        if self.collective_sms < 0:
            raise DlperfError(f"--collective-sms {self.collective_sms}: the SMs a collective "
                              "holds are 0 or more")
        if not 1 <= self.bn_group <= self.gpus_per_node:
            raise DlperfError(f"--bn-group {self.bn_group}: batch-norm groups are GPUs of one "
                              f"node, 1 to {self.gpus_per_node}")
        if self.gpus_per_node % self.bn_group:
            # equal groups that tile a node (NVIDIA's BN_GROUP 1, 2, 4 or 8 on 8 GPUs): a size
            # that leaves GPUs over would time groups no job can form
            raise DlperfError(f"--bn-group {self.bn_group}: batch-norm groups split a node of "
                              f"{self.gpus_per_node} GPUs evenly; choose a divisor of "
                              f"{self.gpus_per_node}")
        if self.bucket_cap_mb is not None and not (
                finite_number(self.bucket_cap_mb) and self.bucket_cap_mb > 0):
            raise DlperfError(f"--bucket-cap-mb {self.bucket_cap_mb!r}: give a positive number "
                              "of MiB (DDP's bucket_cap_mb)")
        if (self.bucket_cap_mb is not None or self.bucket_view) and self.strategy != "ddp":
            raise DlperfError("--bucket-cap-mb and --grad-as-bucket-view shape DDP's gradient "
                              "buckets; FSDP communicates one collective per unit")
        if self.deepspeed_bf16 and (self.strategy != "ddp" or self.distributed_optimizer
                                    or self.kvstore is not None):
            raise DlperfError("--deepspeed-bf16 is DeepSpeed's data parallelism with its own "
                              "sharded update: use it with --strategy ddp, without "
                              "--distributed-optimizer or --kvstore")
        if self.deepspeed_bf16 and self.pp_virtual > 1:
            raise DlperfError(f"--deepspeed-bf16 with --pp-virtual {self.pp_virtual}: "
                              "DeepSpeed's pipeline engine runs 1F1B only; drop --pp-virtual "
                              "(the interleaved schedule is Megatron-LM's)")
        if self.reduce_dtype is not None and self.reduce_dtype not in REDUCE_DTYPES:
            raise DlperfError(f"--reduce-dtype {self.reduce_dtype!r}: choose "
                              f"{', '.join(REDUCE_DTYPES)}")
        if (self.reduce_dtype is not None and self.strategy == "ddp"
                and not self.distributed_optimizer):
            raise DlperfError("--reduce-dtype with --strategy ddp is Megatron-Core's gradient "
                              "buffer in that dtype (grad_reduce_in_fp32 off): use it with "
                              "--distributed-optimizer, or with --strategy fsdp, hsdp or "
                              "fsdp-grad-op (PyTorch DDP's compression hooks are not "
                              "modelled)")
        if (self.strategy == "hsdp" and self.gpus > self.gpus_per_node
                and self.gpus % self.gpus_per_node):
            raise DlperfError(f"--strategy hsdp: {self.gpus} GPUs do not fill nodes of "
                              f"{self.gpus_per_node} (HSDP keeps one replica per node); give "
                              f"a multiple of {self.gpus_per_node}")
        if self.strategy not in STRATEGIES:
            raise DlperfError(f"--strategy {self.strategy!r}: choose ddp, fsdp, fsdp-grad-op "
                              "or hsdp")
        if self.decode not in DECODES:
            raise DlperfError(f"--decode {self.decode!r}: choose gpu, cpu or synthetic")
        # a host's cores and rate given for a decode that does not run there would be ignored
        # in silence (the step then says compute-bound): refuse them
        given = [flag for flag, value in (("--data-cores", self.data_cores_per_gpu),
                                          ("--decode-rate", self.decode_img_per_s_per_core),
                                          ("--loader-workers", self.loader_workers_per_gpu))
                 if value is not None]
        if self.decode != "cpu" and given:
            raise DlperfError(f"{', '.join(given)} describe{'s' if len(given) == 1 else ''} a "
                              f"JPEG decode on the host's cores: add --decode cpu (with "
                              f"--decode {self.decode} they would be ignored)")
        if self.decode == "cpu" and not (self.data_cores_per_gpu and self.decode_img_per_s_per_core):
            raise DlperfError("--decode cpu needs --data-cores (host cores per GPU) and "
                              "--decode-rate (images/s one core decodes; `dlperf bench data` "
                              "measures it)")
        # nan, inf or a negative rate would print a negative or nan throughput, not an error
        for flag, value in (("--data-cores", self.data_cores_per_gpu),
                            ("--decode-rate", self.decode_img_per_s_per_core)):
            if value is not None and not (finite_number(value) and value > 0):
                raise DlperfError(f"{flag} {value!r}: give a positive finite number")

        if self.tp < 1 or self.gpus_per_node % self.tp or self.gpus % self.tp:
            raise DlperfError(f"--tp {self.tp}: tensor parallelism runs inside a node; give a "
                              f"size that divides --gpus-per-node ({self.gpus_per_node}) and "
                              f"--gpus ({self.gpus})")
        if self.pp < 1 or self.pp_virtual < 1 or self.gpus % (self.tp * self.pp):
            raise DlperfError(f"--pp {self.pp}: pipeline stages split the GPUs: give a number "
                              f"of stages (and virtual stages) of at least 1 whose product "
                              f"with --tp ({self.tp}) divides --gpus ({self.gpus})")
        if self.pp_fill is not None and not (finite_number(self.pp_fill)
                                             and 0 <= self.pp_fill <= self.pp - 1):
            raise DlperfError(f"the pipeline's fill of {self.pp_fill!r} stages: give the other "
                              f"stages' time in the slowest's, 0 to {self.pp - 1}")
        if self.cp < 1 or self.gpus % (self.tp * self.pp * self.cp):
            raise DlperfError(f"--cp {self.cp}: context-parallel ranks split the GPUs: give a "
                              f"size whose product with --tp ({self.tp}) and --pp ({self.pp}) "
                              f"divides --gpus ({self.gpus})")
        if self.ep < 1 or self.gpus % (self.tp * self.pp * self.cp * self.ep):
            raise DlperfError(f"--ep {self.ep}: expert-parallel ranks split the data-parallel "
                              f"ones: give a size whose product with --tp ({self.tp}), --pp "
                              f"({self.pp}) and --cp ({self.cp}) divides --gpus ({self.gpus})")
        if self.ep > 1 and self.ep_bytes <= 0:
            raise DlperfError(f"--ep {self.ep} needs the bytes of a rank's token copies "
                              "(ep_bytes) to time the all-to-alls")
        if self.ep_dispatcher not in EP_DISPATCHERS:
            raise DlperfError(f"--ep-dispatcher {self.ep_dispatcher!r}: choose one of "
                              f"{', '.join(EP_DISPATCHERS)}")
        if self.ep_dispatcher != "alltoall" and len(self.ep_routing) != 2:
            raise DlperfError(f"--ep-dispatcher {self.ep_dispatcher} needs the model's experts "
                              "and top-k (ep_routing) to count the nodes a token reaches")
        if self.ep > 1 and (self.strategy != "ddp" or self.kvstore is not None
                            or self.deepspeed_bf16):
            raise DlperfError(f"--ep {self.ep} is modelled with --strategy ddp (Megatron-Core's "
                              "data parallelism, with or without --distributed-optimizer): "
                              "FSDP's sharding of the experts over their own group, "
                              "DeepSpeed's and MXNet's reductions are not")
        if self.cp_comm not in CP_COMMS:
            raise DlperfError(f"--cp-comm {self.cp_comm!r}: choose one of "
                              f"{', '.join(CP_COMMS)}")
        # (a pipeline stage may hold no blocks: the embedding or the output layer alone)
        if self.cp > 1 and (self.cp_layers < (0 if self.pp > 1 else 1)
                            or self.cp_kv_bytes <= 0):
            raise DlperfError(f"--cp {self.cp} needs the blocks of a stage (cp_layers) and "
                              "the bytes of a layer's K and V (cp_kv_bytes) to time the "
                              "exchanges")
        if self.pp > 1 and self.strategy != "ddp":
            raise DlperfError(f"--pp {self.pp} runs with --strategy ddp (Megatron-LM's data "
                              "parallelism over the pipelines): FSDP's per-micro-batch "
                              "gathers across pipeline stages are not modelled")
        if (self.tp > 1 or self.pp > 1 or self.cp > 1) and self.decode == "cpu":
            raise DlperfError("--tp, --pp and --cp are for the built-in decoders (token inputs); "
                              "--decode cpu describes a JPEG pipeline")
        if self.loader_workers_per_gpu is not None and self.loader_workers_per_gpu < 1:
            raise DlperfError("--loader-workers needs a count of at least 1 (the data "
                              "loader's worker processes per GPU)")
        if self.kvstore is not None:
            if self.kvstore not in KVSTORES:
                raise DlperfError(f"--kvstore {self.kvstore!r}: choose one of "
                                  f"{', '.join(KVSTORES)}")
            if (self.strategy != "ddp" or self.distributed_optimizer or self.tp > 1
                    or self.pp > 1 or self.cp > 1 or self.gpus > self.gpus_per_node):
                raise DlperfError(f"--kvstore {self.kvstore} is MXNet's reduction inside one "
                                  "node by one process: use it with --strategy ddp on at most "
                                  f"--gpus-per-node ({self.gpus_per_node}) GPUs, without "
                                  "--tp, --pp, --cp or --distributed-optimizer")
            ignored = [flag for flag, given in (
                ("--bucket-cap-mb", self.bucket_cap_mb is not None),
                ("--grad-as-bucket-view", self.bucket_view), ("--no-overlap", not self.overlap),
                ("--nccl-algo", self.nccl_algo is not None),
                ("--nccl-proto", self.nccl_proto is not None)) if given]
            if ignored:  # (they shape NCCL's all-reduce, which the kvstore does not run)
                raise DlperfError(f"{', '.join(ignored)} shape{'s' if len(ignored) == 1 else ''}"
                                  f" DDP's NCCL all-reduce; --kvstore {self.kvstore} reduces "
                                  "each gradient on its own, after the backward, without NCCL: "
                                  "drop one of them")
            if self.kvstore_op_s is not None and not (finite_number(self.kvstore_op_s)
                                                      and self.kvstore_op_s >= 0):
                raise DlperfError(f"the kvstore's cost per operation {self.kvstore_op_s!r}: "
                                  "give seconds, 0 or more")

    @staticmethod
    def _allowed(text: str | None, known: tuple[str, ...], flag: str) -> frozenset | None:
        from dlperf.analysis import nccl

        if text is None:
            return None
        try:
            return nccl.parse_list(text, known, flag)
        except ValueError as exc:
            raise DlperfError(str(exc)) from None

    # cached: every collective of every scale asks (a frozen dataclass's cached_property
    # writes the instance's __dict__, not a field)
    @functools.cached_property
    def algorithms(self) -> frozenset | None:
        """The NCCL algorithms ``nccl_algo`` allows (None: all)."""
        from dlperf.analysis.nccl import ALGORITHMS

        return self._allowed(self.nccl_algo, ALGORITHMS, "--nccl-algo")

    @functools.cached_property
    def protocols(self) -> frozenset | None:
        """The NCCL protocols ``nccl_proto`` allows (None: all)."""
        from dlperf.analysis.nccl import PROTOCOLS

        return self._allowed(self.nccl_proto, PROTOCOLS, "--nccl-proto")

    @property
    def sharded_update(self) -> bool:
        """DDP whose update is sharded over the replicas and whose parameters are gathered
        after it: Megatron-LM's distributed optimizer, or DeepSpeed's BF16_Optimizer."""
        return self.distributed_optimizer or self.deepspeed_bf16

    @property
    def nodes(self) -> int:
        return math.ceil(self.gpus / self.gpus_per_node)

    def host_img_per_s(self, gpus_in_node: int) -> float:
        """Images/s the host decodes for each GPU when ``gpus_in_node`` GPUs share a node (inf
        for a decode on the GPU or synthetic data): the GPU takes min(its own rate, this)."""
        if self.decode != "cpu":
            return math.inf
        return self.decode_parallelism(gpus_in_node) * self.decode_img_per_s_per_core

    def loader_processes_per_core(self, gpus_in_node: int) -> float | None:
        """The node's loader workers over its cores when ``gpus_in_node`` GPUs run (None
        without a worker count). Above 1 the workers outnumber the cores and the training
        processes compete with them for a core every step, which the prediction does not
        charge: benchmarks/bench_input_side_cpu.py measured 5-10% per step on 2 cores with
        twice as many decode threads (results/input-side-cpu.json)."""
        if not self.loader_workers_per_gpu:
            return None
        return (self.loader_workers_per_gpu * gpus_in_node
                / (self.data_cores_per_gpu * self.gpus_per_node))

    def decode_parallelism(self, gpus_in_node: int) -> float:
        """Host cores decoding for each GPU when ``gpus_in_node`` GPUs share a node. Without a
        worker count the loader is taken as sized to the GPU's share of the host
        (``data_cores_per_gpu`` at every scale); with one, the node's cores
        (``data_cores_per_gpu`` x ``gpus_per_node``) are split among the GPUs in use, and no
        GPU's loader runs on more cores than it has workers."""
        if not self.loader_workers_per_gpu:
            return self.data_cores_per_gpu
        return min(self.loader_workers_per_gpu,
                   self.data_cores_per_gpu * self.gpus_per_node / gpus_in_node)


@dataclass(frozen=True)
class OneStep:
    """What ``scale_out`` reads of the one-GPU step that no GPU count changes, worked out once
    for a whole curve (``one_step``): the step's timeline and predicted seconds, the FSDP
    units' gradient bytes and the step's kernels run by run per unit."""

    timeline: Timeline
    single_s: float
    units: dict  # unit_bytes(params)
    segments: tuple  # _segments(predictions, units)
    # the optimizer's CPU issue time the GPU waits through, beyond the update's own GPU time
    # (an unfused step after GradScaler's host synchronisation: costs.scaled_optimizer); it
    # does not shrink when FSDP shards the update (the same launches, on smaller shards)
    optimizer_host_s: float = 0.0
    # beside_slowdown by (SMs held, phases), filled as scale_out asks (a curve asks once)
    slowdowns: dict = field(default_factory=dict, compare=False)

    def slowdown(self, analysis, sms: int, phases: tuple[str, ...]) -> float:
        key = (sms, phases)
        if key not in self.slowdowns:
            self.slowdowns[key] = beside_slowdown(analysis, sms, phases)
        return self.slowdowns[key]


def one_step(analysis, params: list[tuple[str, int]]) -> OneStep:
    from dlperf.analysis.roofline import predicted_step_s

    units = unit_bytes(params)
    tl = timeline(analysis.predictions)
    single_s = analysis.totals()["predicted_time_s"]
    before = [p for p in analysis.predictions if p.cost.phase != "optimizer"]
    micro_s = predicted_step_s(before, analysis.host_s)
    waits = single_s - micro_s - tl.optimizer_s
    # (a difference of sums: rounding leaves ~1e-16 s where the CPU never held the GPU up)
    return OneStep(tl, single_s, units, _segments(analysis.predictions, units),
                   waits if waits > 1e-9 * single_s else 0.0)


def scale_out(analysis, params: list[tuple[str, int]], cfg: ScaleConfig, node, network,
              step: OneStep | None = None) -> dict:
    """Per-GPU and total throughput of ``analysis`` (one GPU's predicted training step, per-GPU
    batch) on ``cfg.gpus`` GPUs: the communication the strategy adds and how much of it the
    backward hides, the input side, and what limits the step. ``params``: [(name, gradient
    bytes)] in registration order; ``step``: ``one_step(analysis, params)``, when the caller
    runs several scales."""
    from dlperf.analysis.nccl import generation

    step = step or one_step(analysis, params)
    tl = step.timeline
    # with tensor parallelism the data-parallel strategy runs over gpus / tp replicas, gpus
    # per node / tp of them in a node (one GPU per tensor-parallel position: a rail each)
    # with pipeline stages too, over gpus / (tp pp) replicas (Megatron's rank order: tensor
    # parallel innermost, then data parallel, then the stages, so the replicas of a stage
    # share nodes and the stages span them)
    # (context parallel: the data-parallel and context-parallel ranks reduce the gradients
    # together, gpus / (tp pp) of them, the same rails)
    tp, pp, cp = cfg.tp, cfg.pp, cfg.cp
    dcfg = cfg if tp == pp == cp == 1 else replace(
        cfg, gpus=cfg.gpus // (tp * pp), tp=1, tp_collectives=(), tp_regions=(),
        tp_row_regions=(), pp=1,
        pp_virtual=1, pp_fill=None, pp_tied_bytes=0, cp=1, cp_kv_bytes=0, cp_layers=0,
        p2p_bytes=0, gpus_per_node=cfg.gpus_per_node // tp, bn_group=1)
    gen = generation(analysis.device.name)  # NCCL's constants by GPU generation
    sms = held_sms(analysis.device, cfg.collective_sms)
    contention = 0.0  # the step's compute slowed beside its hidden collectives (contention_s)
    single_s = step.single_s
    opt_host_s = step.optimizer_host_s
    single_opt_s = tl.optimizer_s + opt_host_s  # the update on one GPU, waits included
    micro_s = single_s - single_opt_s  # forward and backward of one micro-batch
    accum = cfg.grad_accum
    grad_bytes = sum(b for _, b in params)
    comm = {"strategy": cfg.strategy, "gradient_bytes": grad_bytes}
    # what a gradient byte becomes on the wire under --reduce-dtype (FSDP's reduce_dtype, or
    # Megatron's gradient buffer under DDP, whose buckets keep their elements: Megatron sizes
    # them in parameters)
    cast = (ELEMENT_BYTES[cfg.reduce_dtype] / state_element_bytes(analysis.config.precision)
            if cfg.reduce_dtype else 1.0)
    # the experts' share of the gradient bytes (expert parallel: their own replicas reduce them
    # and the distributed optimizer shards their state over those)
    expert_bytes = sum(b for n, b in params if n in cfg.expert_params)
    if cfg.deepspeed_bf16:  # each micro-batch's gradients added into the fp32 buffer
        accumulate = deepspeed_bf16_s(params, analysis)
        micro_s += accumulate  # (on one GPU too: the stack's own cost, not the scale's)
        comm["deepspeed_bf16"] = {"accumulate_s_per_micro_batch": accumulate,
                                  "accumulate_s": accum * accumulate}
    # the parameters as FSDP gathers them: in the autocast dtype under bf16/fp16 (2 bytes)
    gathered = grad_bytes / 2 if analysis.config.dtype in ("bf16", "fp16") else grad_bytes
    # the GPUs that share one copy of the state: all of them under FSDP, a node's under HSDP
    shard = min(dcfg.gpus, dcfg.gpus_per_node) if cfg.strategy == "hsdp" else dcfg.gpus
    # FSDP (any sharding) updates only this GPU's shard of the parameters; DDP all of them
    sharded_update = cfg.sharded_update
    optimizer_s = (tl.optimizer_s / shard if cfg.strategy != "ddp" or sharded_update
                   else tl.optimizer_s) + opt_host_s
    if dcfg.gpus == 1:
        exposed = 0.0
        optimizer_s = single_opt_s
        comm.update(comm_s=0.0, exposed_s=0.0)
    elif cfg.kvstore == "device":
        d = device_kvstore_s(params, dcfg.gpus, node, cfg.kvstore_op_s)
        exposed = d["exposed_s"]
        comm.update(d, bucket_copy_s=0.0, overlap=False, nccl=None)
    elif cfg.strategy == "ddp":
        on_cpu = not analysis.device.tensor_cores
        # (DeepSpeed reduces its fp32 buffer after the backward, whatever --no-overlap says)
        overlap = cfg.overlap and not on_cpu and not cfg.deepspeed_bf16
        # --no-overlap is Horovod's way: after the backward every gradient is ready at once,
        # so they go in fusion buffers of up to 64 MiB, not in DDP's 25 MiB buckets
        caps = ((int(cfg.bucket_cap_mb * 2**20),) * 2 if cfg.bucket_cap_mb is not None
                else (DEEPSPEED_BUFFER_BYTES,) * 2 if cfg.deepspeed_bf16
                else (HOROVOD_FUSION_BYTES,) * 2 if not cfg.overlap
                else (DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES))
        def reduce(nbytes: float) -> float:  # a bucket's all-reduce, or its reduce-scatter
            return (sharded_collective_s if cfg.distributed_optimizer else allreduce_s)(
                nbytes * cast, dcfg.gpus, dcfg.gpus_per_node, node, network, gen=gen,
                algorithms=cfg.algorithms, protocols=cfg.protocols)

        def gather(nbytes: float) -> float:  # the distributed optimizer's parameter gather
            return sharded_collective_s(nbytes, dcfg.gpus, dcfg.gpus_per_node, node, network,
                                        gen=gen, algorithms=cfg.algorithms,
                                        protocols=cfg.protocols)

        ratio = gathered / grad_bytes if grad_bytes else 0.0
        # expert parallel: the experts' gradients are reduced over the 1/ep of the replicas
        # that hold the same experts (Megatron-Core's expert data parallel group; the expert
        # ranks adjacent, so a node holds 1/ep of its replicas' share of that group, at least
        # one), in the same buckets' order; each expert byte is charged what a byte costs over
        # that group, the ratio of the two collectives' times on EXPERT_REFERENCE_BYTES,
        # nothing where every replica holds experts of its own (ep = the replicas)
        comm_params = params
        if cfg.ep > 1:
            peers = dcfg.gpus // cfg.ep

            def reduce_experts(nbytes: float) -> float:
                return (sharded_collective_s if cfg.distributed_optimizer else allreduce_s)(
                    nbytes * cast, peers, max(1, dcfg.gpus_per_node // cfg.ep), node, network,
                    gen=gen, algorithms=cfg.algorithms, protocols=cfg.protocols)

            factor = (reduce_experts(EXPERT_REFERENCE_BYTES) / reduce(EXPERT_REFERENCE_BYTES)
                      if peers > 1 else 0.0)
            comm_params = [(n, b * factor if n in cfg.expert_params else b)
                           for n, b in params]
            comm["expert_gradients"] = {
                "bytes": expert_bytes,
                "replicas": peers, "cost_per_byte_vs_dense": factor}
        interleaved = overlap and cfg.pp > 1 and cfg.pp_virtual > 1
        if interleaved:  # Megatron-Core: a unit per model chunk, reduced as each chunk ends
            from dlperf.analysis.pipeline import interleaved_data_parallel_s

            v = cfg.pp_virtual
            chunk = sum(b for _, b in comm_params) / v
            reduce_s = v * reduce(chunk)
            gather_s = v * gather(chunk * ratio) if cfg.distributed_optimizer else 0.0
            reduce_exposed, gather_exposed = interleaved_data_parallel_s(
                reduce_s, gather_s, cfg.pp, v, phase_s(analysis.predictions, "forward"),
                phase_s(analysis.predictions, "dgrad", "wgrad", "recompute"))
            d = {"buckets": v, "comm_s": reduce_s, "exposed_s": reduce_exposed,
                 "bucket_bytes": [chunk] * v, "per_model_chunk": True}
            if cfg.distributed_optimizer:
                d.update(param_gather_s=gather_s, param_gather_exposed_s=gather_exposed)
        else:
            d = ddp_exposed_s(tl, comm_params, reduce, overlap=overlap, caps=caps)
            if sharded_update:
                d.update(distributed_optimizer_gather(analysis.predictions, d["bucket_bytes"],
                                                      ratio, gather, overlap))
        # gradient_as_bucket_view (and Megatron's gradient buffer, DeepSpeed's flat fp32
        # one): the gradients are views of the buckets, nothing is copied
        copies = (0.0 if cfg.bucket_view or sharded_update
                  else ddp_copy_s(grad_bytes, analysis))
        exposed = d["exposed_s"] + copies  # once per optimizer step, after the last backward
        # the next forward waits for the buffers' broadcast; its kernels' issue is the CPU's
        # where the GPU already waits for the CPU at the step's end (the update's launches
        # after GradScaler's wait, or ones that outlast their GPU time: opt_host_s)
        if cfg.broadcast_buffers and cfg.buffers:
            eff = analysis.efficiency
            b = buffer_broadcast_s(cfg.buffers, dcfg.gpus, dcfg.gpus_per_node, node, network,
                                   gen, eff.launch_s, eff.host_s if opt_host_s > 0 else 0.0,
                                   cfg.protocols)
            exposed += b["seconds"]
            d = {**d, "buffer_broadcast": b}
        if overlap:  # the backward beside the buckets' reductions
            contention = contention_s(d["comm_s"] - d["exposed_s"],
                                      step.slowdown(analysis, sms, BACKWARD))
        if sharded_update:
            exposed += d["param_gather_exposed_s"]
            if overlap:  # the next forward beside the parameters' gather
                contention += contention_s(d["param_gather_s"] - d["param_gather_exposed_s"],
                                           step.slowdown(analysis, sms, ("forward",)))
        comm.update(d, bucket_copy_s=copies, overlap=overlap,
                    nccl=_nccl_name("reducescatter" if cfg.distributed_optimizer
                                    else "allreduce", max(d["bucket_bytes"]), dcfg, node,
                                    network, gen))
    else:  # FSDP: per unit, gathers in forward and backward, one reduce-scatter; prefetch
        # hides them behind the compute. Mixed precision as torchtitan, Composer's DEFAULT and
        # FSDP's MixedPrecisionPolicy run it: parameters gathered in the autocast dtype
        # (2 bytes), gradients reduced in fp32 (in ``reduce_dtype`` when one is given).
        gathers = 1 if cfg.strategy == "fsdp-grad-op" else 2
        grads = step.units  # fp32 (or the model's) gradient bytes per unit
        ratio = gathered / grad_bytes if grad_bytes else 0.0
        # torchao's float8 all-gather: those weights gathered at 1 byte an element
        fp8 = 1 / (2 if analysis.config.dtype in ("bf16", "fp16") else 4)
        on_wire = unit_bytes([(n, b * ratio * (fp8 if n in cfg.fp8_gathered else 1))
                              for n, b in params]) if cfg.fp8_gathered else {
                                  u: b * ratio for u, b in grads.items()}
        gathered = sum(on_wire.values())
        traffic = fsdp_traffic(gathered, grad_bytes * cast, shard, gathers)
        replicas = dcfg.gpus // shard  # HSDP's nodes, each a replica (1 under FSDP)
        per_node = shard if cfg.strategy == "hsdp" else dcfg.gpus_per_node

        def collective(nbytes: float) -> float:
            return sharded_collective_s(nbytes, shard, per_node, node, network, gen=gen,
                                        algorithms=cfg.algorithms, protocols=cfg.protocols)

        def across(nbytes: float) -> float:  # HSDP: a shard's all-reduce among the replicas
            return (allreduce_s(nbytes, replicas, 1, node, network, gen, cfg.algorithms,
                                cfg.protocols) if replicas > 1 else 0.0)

        gather = {u: collective(on_wire.get(u, 0)) for u in grads}
        reduce = {u: collective(b * cast) + across(b * cast / shard) for u, b in grads.items()}
        if replicas > 1:
            traffic["allreduce_bytes"] = (grad_bytes * cast / shard * 2 * (replicas - 1)
                                          / replicas)
            traffic["replicas"] = replicas
        comm_s = sum(gathers * gather[u] + reduce[u] for u in grads)
        pipe = fsdp_pipeline_s(analysis.predictions, grads, lambda u: gather.get(u, 0.0),
                               lambda u: reduce.get(u, 0.0), regather=gathers == 2,
                               segments=step.segments)
        traffic["units"] = len(grads)
        traffic["nccl"] = _nccl_name("allgather", max(on_wire.values(), default=0), dcfg,
                                     node, network, gen)
        exposed = accum * pipe["exposed_s"]  # on every micro-batch
        # the forward and backward beside the gathers and reduce-scatters they hide
        hidden = min(pipe["compute_s"], comm_s - pipe["exposed_s"])
        contention = accum * contention_s(hidden, step.slowdown(analysis, sms,
                                                                FORWARD_BACKWARD))
        comm.update(traffic, comm_s=comm_s, exposed_s=exposed)
    if tp > 1:  # the node's tensor-parallel collectives
        # (an all-gather and a reduce-scatter of a buffer move the same: NCCL's ring for both)
        def tp_time(kind: str, nbytes: int) -> float:
            if kind == "allreduce":
                return allreduce_s(nbytes, tp, tp, node, network, gen=gen,
                                   algorithms=cfg.algorithms, protocols=cfg.protocols)
            return sharded_collective_s(nbytes, tp, tp, node, network, gen=gen,
                                        algorithms=cfg.algorithms, protocols=cfg.protocols)

        groups = {"column": cfg.tp_regions, "row": cfg.tp_row_regions,  # see TP_OVERLAP
                  "column-blocks": tuple(r for r in cfg.tp_regions
                                         if all(m.startswith("blocks.") for m in r))}
        busy = micro_exposed = 0.0
        for kind, n, b, beside in cfg.tp_collectives:
            t = tp_time(kind, b)
            busy += n * t
            if beside is None:
                micro_exposed += n * t
            else:  # one per region; a pipeline stage's regions are what its analysis holds
                group, phase, method = TP_OVERLAP[beside]
                left, present = beside_gemm_s(analysis.predictions, groups[group], phase, t,
                                              method, tp)
                micro_exposed += left * n / present if present else n * t
        tp_s = accum * micro_exposed
        biggest = max((b for _, _, b, _ in cfg.tp_collectives), default=0)
        group = replace(cfg, gpus=tp, gpus_per_node=tp, bn_group=1, pp=1, pp_virtual=1,
                        pp_fill=None, p2p_bytes=0, cp=1)
        comm["tensor_parallel"] = {
            "tp": tp, "collectives_per_micro_batch": sum(n for _, n, _, _ in cfg.tp_collectives),
            # (all-gathers only under sequence parallelism; without it all-reduces, and
            # torchao's float8 amaxes are all-reduced either way)
            "sequence_parallel": any(k == "allgather" for k, *_ in cfg.tp_collectives),
            "beside_gemms": sum(n for _, n, _, s in cfg.tp_collectives if s is not None),
            # TransformerEngine's overlap: collectives beside the forward's GEMMs too
            "forward_overlap": any(TP_OVERLAP[s][1] in ("forward", "recompute")
                                   for *_, s in cfg.tp_collectives if s is not None),
            "bytes_each": biggest, "busy_s": accum * busy, "exposed_s": tp_s,
            "nccl": _nccl_name(cfg.tp_collectives[0][0] if cfg.tp_collectives else "allgather",
                               biggest, group, node, network, gen)}
        exposed += tp_s
    if cp > 1:  # the K and V exchanges of each layer's attention, on every micro-batch
        # the context-parallel ranks of a tensor-parallel position: adjacent after the
        # tensor-parallel ones, so in one node while tp x cp fills no more than a node
        per_node = min(cp, max(1, cfg.gpus_per_node // tp))
        in_node = tp * cp <= cfg.gpus_per_node
        group = replace(dcfg, gpus=cp, gpus_per_node=per_node)
        d = context_parallel_s(
            analysis.predictions, cp, cfg.cp_comm, cfg.cp_kv_bytes, cfg.cp_layers, in_node,
            lambda nbytes: sharded_collective_s(nbytes, cp, per_node, node, network, gen=gen,
                                                algorithms=cfg.algorithms,
                                                protocols=cfg.protocols),
            node if in_node else network)
        d.update(busy_s=accum * d["busy_s"], exposed_s=accum * d["exposed_s"],
                 nccl=_nccl_name("allgather", cp * cfg.cp_kv_bytes, group, node, network, gen)
                 if cfg.cp_comm == "allgather" else None)
        comm["context_parallel"] = d
        exposed += d["exposed_s"]
    if cfg.ep > 1:  # the mixture-of-experts layers' all-to-alls, on every micro-batch
        # the expert-parallel ranks of a tensor- and context-parallel position: adjacent,
        # so in one node while they fit in it
        per_node = min(cfg.ep, max(1, cfg.gpus_per_node // (tp * cp)))
        if cfg.ep_dispatcher == "alltoall":
            def alltoall(nbytes):
                return alltoall_s(nbytes, cfg.ep, per_node, node, network)
        else:
            def alltoall(nbytes):
                return node_deduplicated_alltoall_s(nbytes, cfg.ep, per_node, node, network,
                                                    *cfg.ep_routing)
        d = expert_parallel_s(analysis.predictions, cfg.ep, cfg.ep_bytes, alltoall)
        d.update(busy_s=accum * d["busy_s"], exposed_s=accum * d["exposed_s"],
                 in_node=cfg.ep <= per_node, dispatcher=cfg.ep_dispatcher)
        comm["expert_parallel"] = d
        exposed += d["exposed_s"]
    comm["optimizer_s"] = optimizer_s
    # of which the CPU's issue of the update's launches with the GPU idle (after GradScaler's
    # wait: costs.scaled_optimizer), on one GPU and on many alike
    comm["optimizer_host_s"] = opt_host_s
    bn_sync = accum * bn_sync_s(analysis.predictions, min(cfg.bn_group, cfg.gpus), node)
    comm["bn_sync_s"] = bn_sync
    exposed += bn_sync
    cv = STEP_CV if cfg.step_cv is None else cfg.step_cv
    batch = analysis.batch_size * accum
    comm["contention"] = {"sms": sms}  # (what it costs: the result's contention_s)
    gpu_wait = straggler_s(accum * micro_s + optimizer_s, cfg.gpus, cv)
    # one optimizer step
    step_s = accum * micro_s + exposed + contention + optimizer_s + gpu_wait
    bubble = 0.0
    if pp > 1:  # the schedule's fill and drain, and the stages' point-to-point transfers
        from dlperf.analysis.pipeline import bubble_s, p2p_exposed_s, p2p_transfers

        # (a micro-batch on the stage: its kernels and its tensor- and context-parallel
        # exchanges)
        tp_micro = sum(comm[k]["exposed_s"] / accum for k in (
            "tensor_parallel", "context_parallel", "expert_parallel") if k in comm)
        bubble = bubble_s(micro_s + tp_micro, pp, cfg.pp_virtual, cfg.pp_fill)
        # a stage's replicas fill the node before the next stage starts: its boundary is
        # between nodes unless a node holds more than one stage
        crosses = tp * dcfg.gpus >= cfg.gpus_per_node
        link = network if crosses else node
        transfers = p2p_transfers(accum, pp, cfg.pp_virtual)
        each = (link.latency_s + cfg.p2p_bytes / link.bus_bandwidth) if cfg.p2p_bytes else 0.0
        # the tied embedding's two copies (first and last stage, the same tensor-parallel
        # position and replica) all-reduce their gradients after the backward, before the
        # update: Megatron-LM's embedding all-reduce, on the step's critical path
        tied = (allreduce_s(cfg.pp_tied_bytes, 2, 1 if crosses else 2, node, network, gen,
                            cfg.algorithms, cfg.protocols) if cfg.pp_tied_bytes else 0.0)
        # a chunk's forward or backward, on average: a micro-batch's over 2 V
        p2p = p2p_exposed_s(accum, pp, cfg.pp_virtual, each, micro_s / (2 * cfg.pp_virtual),
                            cfg.pp_overlap_p2p)
        comm["pipeline"] = {"pp": pp, "virtual": cfg.pp_virtual, "micro_batches": accum,
                            "bubble_s": bubble,
                            "fill_stages": pp - 1 if cfg.pp_fill is None else cfg.pp_fill,
                            "p2p_transfers": transfers,
                            "p2p_bytes_each": cfg.p2p_bytes, "p2p_s": transfers * each,
                            "p2p_exposed_s": p2p, "p2p_overlap": cfg.pp_overlap_p2p,
                            "p2p_between_nodes": crosses,
                            "tied_embedding_bytes": cfg.pp_tied_bytes,
                            "tied_embedding_allreduce_s": tied}
        exposed += p2p + tied
        step_s += bubble + p2p + tied
    # a replica's samples, over its tp x pp GPUs (context parallel: cp GPUs share each sample)
    ways = tp * pp * cp
    gpu_rate = batch / step_s / ways
    host_rate = cfg.host_img_per_s(min(cfg.gpus, cfg.gpus_per_node))
    # Where the host's decode sets the pace, each rank's step is its loader's time for a batch,
    # and the synchronous step still waits for the slowest rank: the same spread applies to
    # that time (one rank alone waits for nobody: the host rate itself)
    input_s = batch / host_rate
    input_wait = straggler_s(input_s, cfg.gpus, cv)
    input_bound = input_s + input_wait > step_s
    per_gpu = batch / (input_s + input_wait) if input_bound else gpu_rate
    wait = input_wait if input_bound else gpu_wait
    # the ways out of a host decode: the GPUs' own rate, which a decode on the GPU (DALI,
    # nvJPEG) would feed (its own GPU time not counted), or the host cores per GPU that would
    # keep up at the same per-core rate
    alternatives = ({"gpu_decode_samples_per_s": gpu_rate,
                     "host_cores_needed_per_gpu": gpu_rate / cfg.decode_img_per_s_per_core}
                    if cfg.decode == "cpu" else {})
    if input_bound:
        limit = "input (host JPEG decode)"
    elif bubble > 0.05 * step_s and bubble >= exposed:
        limit = "pipeline bubble"
    elif exposed > 0.05 * step_s:
        limit = ("communication (MXNet's device kvstore)" if cfg.kvstore == "device"
                 else "communication")
    elif exposed + contention > 0.05 * step_s:
        limit = "communication (the compute beside it, on the SMs NCCL leaves)"
    else:
        limit = "compute"
    # one GPU; with tensor parallelism, its tp ranks without their collectives
    # (with pipeline stages: its tp x pp ranks without their collectives and bubble)
    single_rate = min(batch / (accum * micro_s + single_opt_s) / ways,
                      cfg.host_img_per_s(1))
    memory = memory_per_gpu(analysis.memory, params,
                            "fsdp" if cfg.strategy == "hsdp" else cfg.strategy,
                            shard if cfg.strategy != "ddp" else dcfg.gpus, gathered,
                            bucket_view=cfg.bucket_view or sharded_update,
                            units=step.units,
                            optimizer_sharded=sharded_update,
                            # DeepSpeed keeps each micro-batch's bf16 gradients beside its
                            # fp32 buffer
                            half_gradient_bytes=gathered if cfg.deepspeed_bf16 else 0.0,
                            # fp32 masters beside the model in bf16/fp16 (--precision fsdp)
                            model_copy_bytes=gathered if analysis.config.precision == "fsdp"
                            and gathered < grad_bytes else None,
                            expert_share=expert_bytes / grad_bytes if grad_bytes else 0.0,
                            expert_ways=cfg.ep,
                            gradient_cast=cast if cfg.strategy == "ddp" else 1.0)
    if memory is not None and analysis.device.memory_bytes:
        memory["fits"] = peak_total(memory) <= analysis.device.memory_bytes
        memory["capacity_bytes"] = analysis.device.memory_bytes
    return {"gpus": cfg.gpus, "nodes": cfg.nodes, "per_gpu_samples_per_s": per_gpu,
            "memory_per_gpu": memory,
            "total_samples_per_s": per_gpu * cfg.gpus,
            "scaling_efficiency": per_gpu / single_rate if single_rate else 0.0,
            "step_s": batch / (per_gpu * ways),
            # the GPUs of one replica (tp x pp x cp; 1 for data parallelism alone)
            "ranks_per_replica": ways,
            "single_gpu_step_s": accum * micro_s + single_opt_s,
            "grad_accum": accum,
            "exposed_comm_s": exposed, "contention_s": contention,
            "straggler_s": wait, "step_cv": cv,
            "input_bound": input_bound,
            "loader_processes_per_core": cfg.loader_processes_per_core(
                min(cfg.gpus, cfg.gpus_per_node)),
            "host_img_per_s": None if math.isinf(host_rate) else host_rate, **alternatives,
            "limited_by": limit, "communication": comm}


CURVE = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def scaling_curve(analysis, params, cfg: ScaleConfig, node, network,
                  step: OneStep | None = None) -> list[dict]:
    """``scale_out`` from 1 to 4,096 GPUs (the same per-GPU batch), reusing one analysis and
    what of its step no GPU count changes (``one_step``)."""
    step = step or one_step(analysis, params)
    return [scale_out(analysis, params, replace(cfg, gpus=n), node, network, step)
            for n in CURVE if n % (cfg.tp * cfg.pp * cfg.cp * cfg.ep) == 0 and (
                cfg.strategy != "hsdp" or n <= cfg.gpus_per_node or n % cfg.gpus_per_node == 0)
            and (cfg.kvstore is None or n <= cfg.gpus_per_node)]  # (one process, one node)


def scale_out_and_curve(analysis, params, cfg: ScaleConfig, node, network
                        ) -> tuple[dict, list[dict]]:
    """What `analyze --gpus` shows: ``scale_out`` at ``cfg``'s scale and the curve, sharing one
    ``one_step``."""
    step = one_step(analysis, params)
    return (scale_out(analysis, params, cfg, node, network, step),
            scaling_curve(analysis, params, cfg, node, network, step))
