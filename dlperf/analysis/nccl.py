"""NCCL's own cost model of its collectives (issue #14). Pure functions.

NCCL picks, for every collective, the algorithm and protocol its tuner predicts fastest
(``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime`` in NVIDIA/nccl src/graph/tuning.cc; the
constants below are that file's defaults at commit 5067397, 2026-06; docs/design.md). dlperf
runs the same model, so a predicted collective costs what NCCL itself expects it to, and the
choice it makes (ring or tree; LL, LL128 or Simple) is the one NCCL would make:

* time = latency + bytes / algorithm bandwidth (microseconds; GB/s);
* ring, over all n ranks in one flat ring (NCCL does not reduce inside the node first):
  latency = base + (steps - inter) x intra + inter x network, with 2(n-1) steps for an
  all-reduce (n-1 for an all-gather or a reduce-scatter), of which 2(nodes-1) (nodes-1) cross
  the network; a step inside the node costs at least the network's post overhead
  (1 us on Intel hosts, x 3 for Simple) once the ring spans nodes; Simple's latency x 1.4 on
  Ampere and later (x 1.9 before) across nodes once each rank's slice of each channel reaches
  64 B (NCCL: "plateau effect of ring"); algorithm bandwidth = bus bandwidth x n / steps;
* tree (all-reduce only): a chain inside each node, a double binary tree between the nodes:
  latency = base + 2((n/nodes - 1) intra + floor(log2 nodes) network); bandwidth = 0.92 x the
  bus bandwidth / 2, times NCCL's correction for mid-sized messages (``TREE_CORRECTION``);
* broadcast (DDP's buffers): ring only, n steps (tuning.cc counts every rank's hop for a
  broadcast or a reduce), nodes-1 of them across the network; algorithm bandwidth = the bus
  bandwidth; its latency grows with the ranks where an all-reduce's tree does not;
* PAT (all-gather and reduce-scatter with one GPU per node): base + floor(log2 nodes) x
  network / 3.5 + 2.8 us x n, 0.75 x the bus bandwidth;
* protocols: LL moves half the bytes per transfer (ring: half the bandwidth, tree: 1/3.8, at
  most NCCL's LL ceiling), LL128 120 of each 128 (ring 0.92; tree 7/9 in one node, 15/16
  across nodes), Simple all of them at the highest latency. LL128 runs only where the GPUs talk
  over NVLink (NCCL enables it up to NVLink or a PCIe switch; through the host it is off).

The bus bandwidth is dlperf's (the interconnect presets: what nccl-tests measures with large
messages, i.e. NCCL's Simple protocol). Across nodes a flat ring leaves each node through all
its NICs at once, one channel per NIC, so its bus bandwidth is the smaller of the node's and the
node's NICs together (g GPUs x the network's per-GPU bandwidth): nccl-tests on DGX-1s with four
EDR NICs reach 48 GB/s (NCCL's author, NVIDIA/nccl-tests#29: 4 x 12.5 GB/s), and 3 nodes of
8 A100 with four HDR NICs 85-96 GB/s of 100 (NVIDIA/nccl-tests#119).

NCCL_ALGO and NCCL_PROTO narrow the choice as they narrow NCCL's (``parse_list``: "Ring,Tree",
"^LL128"); what they leave a collective nothing to run with fails, as in NCCL.

Not modelled: NCCL's per-channel bandwidth ceilings (with the 16 channels NCCL builds on an
NVLink node they sit above every preset's bandwidth), NVLink SHARP and CollNet/SHARP in-network
reductions (the ``nvlink4-h100-nvls`` preset stands for the first), and a tuner plugin.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# NCCL_PROTO order: LL, LL128, Simple
PROTOCOLS = ("LL", "LL128", "Simple")
_LL, _LL128, _SIMPLE = 0, 1, 2
# baseLatencies (us) per algorithm and protocol
BASE_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "pat": (8.0, 8.0, 8.0)}
# hwLatencies (us) per step: NVLink, PCIe, network
HW_US = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "pat": (0.0, 0.0, 4.0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "pat": (0.0, 0.0, 4.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "pat": (0.0, 0.0, 14.0)},
}
# llMaxBws (GB/s): one node by GPU generation (Volta, Ampere, Hopper, Blackwell); across nodes
# by the host CPU (Intel; AMD would be row 1), for 1, 2 and more nodes
LL_MAX_GBS = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0),
              (282.0, 90.0, 70.0))
# treeCorrectionFactor per protocol, by floor(log2(bytes / 64)) from 0 to 23
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0,
     1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9,
     1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9,
     .9),
)
NET_OVERHEAD_US = 1.0  # getNetOverhead: Intel hosts and unknown ones (AMD: 2.0)
# the channels NCCL builds (an assumption: only where Simple's ring plateau starts depends on it)
CHANNELS = 16
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "broadcast")
ALGORITHMS = ("ring", "tree", "pat")
# NCCL's other algorithms, which dlperf does not time (in-network and NVLink SHARP reductions)
NOT_MODELLED = ("collnetdirect", "collnetchain", "collnet", "nvls", "nvlstree")

# GPU generation (tuning.cc's compute-capability index) by device preset name
_GENERATIONS = ((r"^g?b\d00|blackwell", 3), (r"^h\d00|^gh200|hopper", 2),
                (r"^a\d|^l4|^l40|^rtx[34]0|^rtx-a|^rtx6000-ada|ampere|ada", 1))


def generation(device_name: str) -> int:
    """tuning.cc's compute-capability index of a device preset: 0 Volta (and Turing), 1 Ampere
    (and Ada), 2 Hopper, 3 Blackwell."""
    name = device_name.lower()
    for pattern, index in _GENERATIONS:
        if re.search(pattern, name):
            return index
    return 0


@dataclass(frozen=True)
class Choice:
    """One collective as NCCL's tuner predicts it: the seconds of the fastest algorithm and
    protocol, and which they are."""

    seconds: float
    algorithm: str
    protocol: str


def parse_list(text: str, known: tuple[str, ...], flag: str) -> frozenset:
    """The names NCCL_ALGO- or NCCL_PROTO-style ``text`` allows of ``known``: "Ring,Tree"
    allows those, "^Tree" all but those (case does not matter). ``flag`` names the option in
    errors."""
    exclude = text.startswith("^")
    names = [n.strip().lower() for n in text.lstrip("^").split(",") if n.strip()]
    lookup = {k.lower(): k for k in known}
    for n in names:
        if n in NOT_MODELLED:
            raise ValueError(f"{flag} {text!r}: dlperf does not time NCCL's {n} (in-network "
                             f"or NVLink SHARP reductions); it times {', '.join(known)}")
        if n not in lookup:
            raise ValueError(f"{flag} {text!r}: unknown {n!r}; choose from {', '.join(known)}, "
                             "comma-separated, or ^ before the ones to leave out")
    if not names:
        raise ValueError(f"{flag} {text!r}: name at least one of {', '.join(known)}")
    chosen = {lookup[n] for n in names}
    return frozenset(set(known) - chosen if exclude else chosen)


def _log2i(n: float) -> int:
    return int(math.floor(math.log2(n))) if n >= 1 else -1


def _times(coll: str, nbytes: float, ranks: int, nodes: int, bus_gbs: float, intra: str,
           gen: int, algorithms=None, protocols=None):
    """(us, algorithm, protocol) for every pair NCCL would consider (of ``algorithms`` and
    ``protocols`` when given: what NCCL_ALGO and NCCL_PROTO allow)."""
    ppn = ranks / nodes
    llmax = LL_MAX_GBS[gen][0] if nodes == 1 else LL_MAX_GBS[0][min(nodes, 3) - 1]
    steps = (2 * (ranks - 1) if coll == "allreduce" else ranks if coll == "broadcast"
             else ranks - 1)
    inter_steps = 0 if nodes == 1 else (2 * (nodes - 1) if coll == "allreduce" else nodes - 1)
    algos = ["ring", "tree"] if coll == "allreduce" else ["ring"]
    if coll in ("allgather", "reducescatter") and nodes == ranks:
        algos.append("pat")  # PAT: one GPU per node only
    for algo in algos:
        if algorithms is not None and algo not in algorithms:
            continue
        for p, proto in enumerate(PROTOCOLS):
            if protocols is not None and proto not in protocols:
                continue
            if p == _LL128 and intra != "nvlink":
                continue
            if algo == "pat" and p != _SIMPLE:
                continue
            bw = bus_gbs
            if algo == "ring" and p == _LL:
                bw = min(llmax, bw * 0.5)
            if algo == "ring" and p == _LL128:
                bw *= 0.92
            if algo == "tree":
                bw *= 0.92
                if p == _LL:
                    bw = min(bw / 3.8, llmax)
                if p == _LL128:
                    bw *= 7 / 9 if nodes == 1 else 120 / 128
                bw *= 0.5
            elif algo == "pat":
                bw *= 0.75
            else:
                bw *= ranks / steps
            intra_us = HW_US[intra][algo][p]
            net_us = HW_US["net"]["tree" if ppn == 1 else algo][p]
            lat = BASE_US[algo][p]
            if algo == "ring":
                if nodes > 1:
                    intra_us = max(intra_us, NET_OVERHEAD_US * (3 if p == _SIMPLE else 1))
                lat += (steps - inter_steps) * intra_us + inter_steps * net_us
                if (p == _SIMPLE and nodes > 1 and coll == "allreduce"
                        and nbytes / (CHANNELS * ranks) >= 64):
                    lat *= 1.4 if gen >= 1 else 1.9
            elif algo == "tree":
                lat += 2 * ((ppn - 1) * intra_us + _log2i(nodes) * net_us)
                size = _log2i(nbytes / 64)
                if 0 <= size < 23:
                    bw *= TREE_CORRECTION[p][size]
            else:
                lat += _log2i(nodes) * net_us / 3.5 + ranks * 2.8
            yield lat + nbytes / (1e3 * bw), algo, proto


def collective(coll: str, nbytes: float, ranks: int, ranks_per_node: int, node_bus_bw: float,
               node_hw: str, net_bus_bw: float | None = None, gen: int = 1,
               algorithms: frozenset | None = None, protocols: frozenset | None = None
               ) -> Choice:
    """``coll`` (all-reduce, all-gather, reduce-scatter or broadcast) of an ``nbytes`` buffer
    (the whole buffer, as NCCL counts it: the gathered one for an all-gather) over ``ranks``
    GPUs, ``ranks_per_node`` to a node whose GPUs talk over ``node_hw`` ("nvlink" or "pci") at
    ``node_bus_bw`` B/s, the nodes over a network of ``net_bus_bw`` B/s per GPU; ``gen``: the
    GPUs' generation (``generation``); ``algorithms``, ``protocols``: what NCCL_ALGO and
    NCCL_PROTO leave it (``parse_list``; None: all). What NCCL's tuner predicts for its fastest
    choice. ValueError when they leave ``coll`` nothing, as NCCL then fails the call."""
    if coll not in COLLECTIVES:
        raise ValueError(f"unknown collective {coll!r}")
    if ranks <= 1 or nbytes <= 0:
        return Choice(0.0, "none", "none")
    g = min(ranks, ranks_per_node)
    nodes = math.ceil(ranks / g)
    bus = node_bus_bw if nodes == 1 else min(node_bus_bw, g * net_bus_bw)
    options = list(_times(coll, nbytes, ranks, nodes, bus / 1e9, node_hw, gen, algorithms,
                          protocols))
    if not options:
        raise ValueError(f"NCCL_ALGO {sorted(algorithms or ALGORITHMS)} and NCCL_PROTO "
                         f"{sorted(protocols or PROTOCOLS)} leave NCCL no way to run {coll} on "
                         f"{ranks} GPUs (NCCL fails such a call); allow ring")
    us, algo, proto = min(options)
    return Choice(us * 1e-6, algo, proto)
