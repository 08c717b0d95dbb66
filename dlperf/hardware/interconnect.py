"""Interconnects between GPUs, as NCCL sees them (issue #14).

Each preset is the **bus bandwidth** an NCCL all-reduce reaches on it with large messages, per
GPU, in NCCL's definition (nccl-tests' ``busbw``): for an all-reduce of S bytes over n GPUs that
takes t seconds, algbw = S / t and busbw = algbw x 2(n-1)/n, the rate each GPU's link carries,
independent of n. A ring all-reduce then takes S x 2(n-1)/n / busbw plus 2(n-1) latency steps
(``analysis/scaling.py``).

Where a measurement was published it is used and cited; otherwise the figure is the datasheet
line rate times NCCL's protocol efficiency on NVLink, 370 of 450 GB/s = 0.82 (NCCL's author,
NVIDIA/nccl-tests#212), or for InfiniBand/Ethernet 0.92 of the line rate (an estimate, marked
as one). Network presets are per GPU: a node with one NIC per GPU gives each GPU a whole NIC;
the DGX-1's four EDR NICs for eight GPUs give each half of one.

Over NCCL (every preset: ``nccl`` names the hardware), a collective's latency is NCCL's own
tuner's, per algorithm, protocol and hardware (analysis/nccl.py). ``latency_s`` (2 us inside a
node, 6-30 us across the network, estimates) times what is not NCCL's: a synchronised batch
norm's statistics exchange (MXNet's NVSHMEM/peer-memory groups), and an interconnect file
without ``nccl`` (gloo, measured by `dlperf probe --comm`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from dlperf.errors import DlperfError, close_matches, finite_number

NVLINK_PROTOCOL = 370 / 450  # nccl-tests#212: effective NVLink4 bandwidth over line rate
NETWORK_PROTOCOL = 0.92  # estimate: NCCL over RDMA NICs reaches ~90-95% of line rate


@dataclass(frozen=True)
class Interconnect:
    name: str
    display_name: str
    bus_bandwidth: float  # B/s per GPU: NCCL all-reduce busbw, large messages
    latency_s: float  # seconds per step of a ring (a hop's fixed cost)
    scope: str  # "node": between the GPUs of one node; "network": between nodes, per GPU
    source: str
    # the hardware NCCL's tuner prices a step on (analysis/nccl.py): "nvlink", "pci" (inside a
    # node) or "net"; "" for a transport that is not NCCL's (gloo: `dlperf probe --comm`),
    # timed as a plain ring at ``latency_s`` a step
    nccl: str = ""
    # a node interconnect's GPUs, the default --gpus-per-node: 8 in a DGX/HGX server, 72 in
    # an NVL72 rack, whose NVLink joins them all (NCCL runs inside it as inside a server)
    gpus: int = 8

    def to_dict(self) -> dict:
        return asdict(self)


def _nv(name, display, line_rate_gbs, source, latency_s=2e-6):
    return Interconnect(name, display, line_rate_gbs * 1e9 * NVLINK_PROTOCOL, latency_s, "node",
                        f"{line_rate_gbs:g} GB/s per direction x {NVLINK_PROTOCOL:.2f} "
                        f"(NVLink protocol efficiency, nccl-tests#212); {source}", "nvlink")


def _net(name, display, gbit_per_nic, nics_per_gpu, source, latency_s=6e-6, nccl="net"):
    per_gpu = gbit_per_nic / 8 * 1e9 * nics_per_gpu * NETWORK_PROTOCOL
    return Interconnect(name, display, per_gpu, latency_s, "network",
                        f"{gbit_per_nic:g} Gb/s per NIC x {nics_per_gpu:g} NIC per GPU x "
                        f"{NETWORK_PROTOCOL} (estimated NCCL efficiency); {source}", nccl)


PRESETS = {i.name: i for i in (
    # NVLink 2 (V100 SXM2): 6 links x 25 GB/s per direction; the DGX-1's hybrid cube mesh lets
    # NCCL build rings over all six.
    _nv("nvlink2-dgx1", "NVLink 2, DGX-1 hybrid cube mesh (V100)", 150.0,
        "V100 datasheet: 300 GB/s NVLink, both directions"),
    # The DGX-2 wires each V100's six NVLink 2 links to its NVSwitch fabric: 16 GPUs, any pair
    # at the full per-GPU rate.
    _nv("nvlink2-dgx2", "NVLink 2 + NVSwitch, DGX-2 (16x V100)", 150.0,
        "V100 datasheet: 300 GB/s NVLink, both directions; DGX-2: all six links to NVSwitch"),
    Interconnect("nvlink3-a100", "NVLink 3 + NVSwitch (8x A100 SXM)", 208e9, 2e-6, "node",
                 "measured: all_reduce_perf busbw 208 GB/s on 8 A100 SXM4 (NVIDIA/nccl-tests#178; "
                 "~200 GB/s in nccl-tests#149)", "nvlink"),
    Interconnect("nvlink4-h100", "NVLink 4 + NVSwitch (8x H100 SXM), ring", 370e9, 2e-6, "node",
                 "NCCL's author: 450 GB/s line rate, ~370 GB/s effective busbw with "
                 "NCCL_ALGO=Ring; ~480 GB/s with NVLink SHARP (NVIDIA/nccl-tests#212)", "nvlink"),
    Interconnect("nvlink4-h100-nvls", "NVLink 4 + NVSwitch SHARP (8x H100 SXM)", 480e9, 2e-6,
                 "node", "NCCL's author: peak all-reduce busbw ~480 GB/s on 8 H100 with NVLink "
                 "SHARP, large messages (NVIDIA/nccl-tests#212)", "nvlink"),
    Interconnect("nvlink4-h200", "NVLink 4 + NVSwitch (8x H200)", 475e9, 2e-6, "node",
                 "measured: all_reduce_perf peak busbw 475 GB/s on 8 H200, NCCL 2.20 "
                 "(NVIDIA/nccl-tests#272)", "nvlink"),
    _nv("nvlink5-b200", "NVLink 5 + NVSwitch (8x B200)", 900.0,
        "B200 datasheet: 1.8 TB/s NVLink, both directions"),
    _nv("nvlink5-b300", "NVLink 5 + NVSwitch (8x B300)", 900.0,
        "HGX B300 datasheet: 1.8 TB/s NVLink a GPU, both directions (the B200's)"),
    # The GB200 NVL72: each GPU's 18 NVLink 5 links go to the rack's NVLink switch trays, so
    # all 72 GPUs reach each other at the full 900 GB/s per direction (a "multi-node NVLink"
    # domain NCCL treats as one node). Measured over the whole rack: 835-847 GB/s busbw at
    # 4-8 GiB, 0.93 of the line rate where the nvlink4 ring reaches 0.82
    Interconnect("nvlink5-nvl72", "NVLink 5 + NVLink Switch, one NVL72 rack (72 GPUs)", 835e9,
                 2e-6, "node", "measured: all_reduce_perf busbw 835 GB/s (4 GiB) to 847 GB/s "
                 "over a full GB200 NVL72 rack, 72 GPUs (coreweave/nccl-tests#43)", "nvlink",
                 gpus=72),
    _net("pcie3", "PCIe Gen3 x16 (through the host)", 126.0, 1,
         "PCIe 3.0 x16: 15.75 GB/s per direction", nccl="pci"),
    _net("pcie4", "PCIe Gen4 x16 (through the host)", 252.0, 1,
         "PCIe 4.0 x16: 31.5 GB/s per direction", nccl="pci"),
    Interconnect("pcie5", "PCIe Gen5, 8 GPUs through the host", 28e9, 10e-6, "node",
                 "measured: all_reduce_perf busbw 28 GB/s on 8 PCIe Gen5 GPUs; bounded by the "
                 "host's memory, as NCCL's author explains (NVIDIA/nccl#1639)", "pci"),
    _net("ib-edr-dgx1", "InfiniBand EDR, 4 NICs for 8 GPUs (DGX-1)", 100.0, 0.5,
         "EDR 100 Gb/s; the DGX-1 has 4 EDR ports for 8 GPUs"),
    _net("ib-edr-dgx2", "InfiniBand EDR, 8 NICs for 16 GPUs (DGX-2)", 100.0, 0.5,
         "EDR 100 Gb/s; the DGX-2 has 8 EDR NICs for its 16 GPUs (pcper.com, 'NVIDIA "
         "Announces DGX-2 with 16 GV100s & 8 100Gb NICs', 2018-03)"),
    _net("ib-hdr", "InfiniBand HDR, one NIC per GPU", 200.0, 1, "HDR 200 Gb/s (DGX A100)"),
    # Jean Zay's A100 nodes, where BLOOM-176B trained: "8 GPUs per node Using NVLink 4
    # inter-gpu connects, 4 OmniPath links" of 100 Gb/s (bigscience-workshop/bigscience,
    # train/tr11-176B-ml/README.md); NCCL's efficiency over Omni-Path is not published: the
    # RDMA estimate
    _net("opa-100-jeanzay", "Omni-Path 100 Gb/s, 4 links for 8 GPUs (Jean Zay A100)", 100.0,
         0.5, "Omni-Path 100 Gb/s; Jean Zay's A100 nodes have 4 links for 8 GPUs "
         "(bigscience-workshop/bigscience, train/tr11-176B-ml/README.md)"),
    _net("ib-ndr", "InfiniBand NDR, one NIC per GPU", 400.0, 1, "NDR 400 Gb/s (DGX H100)"),
    _net("ib-xdr", "InfiniBand XDR, one NIC per GPU", 800.0, 1, "XDR 800 Gb/s"),
    _net("roce-100g", "RoCE 100 GbE, one NIC per GPU", 100.0, 1, "100 Gb Ethernet",
         latency_s=10e-6),
    _net("roce-200g", "RoCE 200 GbE, one NIC per GPU", 200.0, 1,
         "200 Gb Ethernet: MosaicML's A100 clusters of its MPT throughput tables ('1600 Gbps "
         "node-node interconnect (RoCE)' for nodes of 8 GPUs; llm-foundry, scripts/train/"
         "benchmarking/README.md)", latency_s=10e-6),
    _net("roce-400g", "RoCE 400 GbE, one NIC per GPU", 400.0, 1,
         "400 Gb Ethernet: Meta's Llama 3 405B cluster, 400 Gb/s between GPUs (arXiv "
         "2407.21783, section 3.3.1)", latency_s=10e-6),
    _net("ethernet-25g", "25 GbE TCP, one NIC per node of 8 GPUs", 25.0, 1 / 8,
         "25 Gb Ethernet shared by 8 GPUs", latency_s=30e-6),
    # A node's network given as one total (cloud instances, IBM's FSDP blog): its 8 GPUs share
    # it, each reaching an eighth of it between nodes (NCCL runs one ring per NIC)
    _net("roce-400g-per-node", "RoCE, 400 Gb/s per node of 8 GPUs", 400.0, 1 / 8,
         "400 Gb/s of RDMA per node shared by 8 GPUs: IBM's A100 cluster of its 2024 FSDP "
         "blog (pytorch.org/blog/maximizing-training, '128 A100 GPUs with 400Gbps')",
         latency_s=10e-6),
    _net("roce-800g-per-node", "RoCE, 800 Gb/s per node of 8 GPUs", 800.0, 1 / 8,
         "800 Gb/s of RDMA per node shared by 8 GPUs: IBM's H100 cluster of the same blog "
         "('96 GPUs and 800Gbps inter-node interconnect')", latency_s=10e-6),
)}

# The node interconnect a GPU preset's DGX/HGX system has (for --interconnect auto)
NODE_OF_DEVICE = {"v100-sxm2": "nvlink2-dgx1", "v100-sxm2-16gb": "nvlink2-dgx1",
                  "a100-40gb": "nvlink3-a100",
                  "a100-80gb": "nvlink3-a100", "h100-sxm": "nvlink4-h100",
                  "h200": "nvlink4-h200", "b200": "nvlink5-b200", "gb200": "nvlink5-nvl72",
                  "b300": "nvlink5-b300", "gb300": "nvlink5-nvl72"}
NETWORK_OF_DEVICE = {"v100-sxm2": "ib-edr-dgx1", "v100-sxm2-16gb": "ib-edr-dgx1",
                     "a100-40gb": "ib-hdr", "a100-80gb": "ib-hdr",
                     "h100-sxm": "ib-ndr", "h200": "ib-ndr", "b200": "ib-xdr",
                     # a GB200 compute tray's four ConnectX-7 NICs, one 400 Gb/s NIC a GPU
                     "gb200": "ib-ndr",
                     # Blackwell Ultra systems: a ConnectX-8 SuperNIC a GPU, 800 Gb/s
                     "b300": "ib-xdr", "gb300": "ib-xdr"}
# PCIe cards have no system of their own: inside a node their all-reduce goes through the host
# at their PCIe generation (Lambda's 2-8 GPU PCIe servers scaled ResNet-50 at 94.5-100.5%
# against 99.7-100% predicted this way; benchmarks/README.md); between nodes nothing is known,
# so `--interconnect auto` assumes 100 GbE RoCE and says so.
PCIE_OF_DEVICE = {"t4": "pcie3", "quadro-rtx8000": "pcie3", "v100-pcie": "pcie3",
                  "a10": "pcie4", "a30": "pcie4", "a40": "pcie4", "rtx3090": "pcie4",
                  "rtx4090": "pcie4", "rtx-a6000": "pcie4", "rtx6000-ada": "pcie4",
                  "a100-pcie-40gb": "pcie4", "a100-pcie-80gb": "pcie4", "l4": "pcie4",
                  "l40": "pcie4", "l40s": "pcie4", "h100-pcie": "pcie5"}
PCIE_NETWORK_ASSUMED = "roce-100g"


def auto_interconnects(device: str) -> tuple[str, str, bool] | None:
    """(node, network, assumed) for ``--interconnect auto`` on a GPU preset: the DGX/HGX system
    an SXM part is sold in; PCIe through the host for a PCIe card, with an assumed network
    (``assumed`` True); None for a device with neither (a CPU, a user's spec file)."""
    if device in NODE_OF_DEVICE:
        return NODE_OF_DEVICE[device], NETWORK_OF_DEVICE[device], False
    if device in PCIE_OF_DEVICE:
        return PCIE_OF_DEVICE[device], PCIE_NETWORK_ASSUMED, True
    return None


def _check_file_fields(ic: Interconnect, path: Path) -> None:
    """Refuse what would turn into a nan, negative or crashing prediction: Python's json reads
    NaN and Infinity, a quoted number stays a string, and true is an int to Python."""
    for key in ("name", "display_name", "scope", "source", "nccl"):
        if not isinstance(getattr(ic, key), str):
            raise DlperfError(f"{path}: {key} must be a string, got {getattr(ic, key)!r}")
    for key, positive, what in (("bus_bandwidth", True, "a positive number (B/s)"),
                                ("latency_s", False, "a number >= 0 (seconds)")):
        value = getattr(ic, key)
        if not finite_number(value) or value < 0 or (positive and value == 0):
            raise DlperfError(f"{path}: {key} must be {what}, got {value!r}")
    # a figure in the wrong unit (46 for 46 GB/s, 5 for 5 us) would predict nonsense quietly:
    # no link a job runs over is slower than 1 MB/s (10 Mb/s Ethernet: 1.25) or waits a second
    if ic.bus_bandwidth < 1e6:
        raise DlperfError(f"{path}: bus_bandwidth is in bytes per second: {ic.bus_bandwidth:g} "
                          f"is {ic.bus_bandwidth:g} B/s; for {ic.bus_bandwidth:g} GB/s write "
                          f"{ic.bus_bandwidth:g}e9")
    if ic.latency_s >= 1:
        raise DlperfError(f"{path}: latency_s is in seconds: {ic.latency_s:g} is "
                          f"{ic.latency_s:g} s; for {ic.latency_s:g} us write "
                          f"{ic.latency_s:g}e-6")
    if isinstance(ic.gpus, bool) or not isinstance(ic.gpus, int) or ic.gpus < 1:
        raise DlperfError(f"{path}: gpus (a node's GPUs) must be a whole number >= 1, got "
                          f"{ic.gpus!r}")
    if ic.scope not in ("node", "network") or ic.nccl not in ("", "nvlink", "pci", "net"):
        raise DlperfError(f"{path}: scope must be node or network, and nccl nvlink, pci, net or "
                          f"absent (got scope {ic.scope!r}, nccl {ic.nccl!r})")


def get_interconnect(name: str) -> Interconnect:
    """A preset by name, or a JSON file: the fields of Interconnect (bus_bandwidth in B/s), or
    what `dlperf probe --comm` writes."""
    if name in PRESETS:
        return PRESETS[name]
    path = Path(name)
    if path.suffix == ".json" and path.is_file():
        try:
            data = json.loads(path.read_text())
            if isinstance(data, dict) and "interconnect" in data:  # `dlperf probe --comm`
                data = data["interconnect"]
            ic = Interconnect(**data)
        except (OSError, ValueError, TypeError) as exc:
            raise DlperfError(f"{path}: not an interconnect file ({exc}); give name, "
                              "display_name, bus_bandwidth (B/s), latency_s, scope (node or "
                              "network), source and, for NCCL, nccl (nvlink, pci or net)"
                              ) from None
        _check_file_fields(ic, path)
        return ic
    if path.suffix == ".json":
        raise DlperfError(f"{path}: no such interconnect file; write one with `dlperf probe "
                          "--comm --out FILE` or give a preset (`dlperf devices "
                          "--interconnects`)")
    raise DlperfError(f"unknown interconnect {name!r}{close_matches(name, list(PRESETS))}; "
                      f"choose one of {', '.join(PRESETS)} or a .json file")
