"""Scale-out prediction (issue #14): collectives, DDP buckets and overlap, FSDP volumes, the
input side, by hand."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os

import pytest
import torch

from dlperf.analysis.report import render_scaling
from dlperf.analysis.scaling import (CURVE, STEP_CV, ScaleConfig, Timeline, allreduce_s,
                                     ddp_buckets, expected_max_normal, fsdp_traffic,
                                     rebuilt_buckets, reduce_scatter_s, ring_allreduce_s,
                                     scale_out, scaling_curve, serial_overlap, timeline,
                                     tree_allreduce_s)
from dlperf.errors import DlperfError
from dlperf.hardware.interconnect import PRESETS, Interconnect, get_interconnect

MiB = 2**20
NODE = Interconnect("n", "node", 100e9, 1e-6, "node", "test")
NET = Interconnect("i", "net", 10e9, 5e-6, "network", "test")


def test_ring_and_tree_all_reduce_follow_ncclS_bus_bandwidth():
    # 1 GB over 8 GPUs at 100 GB/s busbw, 1 us a step:
    # ring: 2 x 7 x 1 us + 1e9 x 2 x 7/8 / 1e11 = 14 us + 17.5 ms = 17.514 ms
    assert ring_allreduce_s(1e9, 8, 100e9, 1e-6) == pytest.approx(0.017514)
    # tree: 2 x log2(8) = 6 steps of latency, the same bandwidth term: 17.506 ms
    assert tree_allreduce_s(1e9, 8, 100e9, 1e-6) == pytest.approx(0.017506)
    # reduce-scatter: 7 x 1 us + 1e9 x 7/8 / 1e11 = 8.757 ms
    assert reduce_scatter_s(1e9, 8, 100e9, 1e-6) == pytest.approx(0.008757)
    assert ring_allreduce_s(1e9, 1, 100e9, 1e-6) == 0.0  # one GPU: nothing to reduce
    # NCCL's definition read back: algbw = S / t, busbw = algbw x 2(n-1)/n = B (no latency)
    t = ring_allreduce_s(1e9, 8, 100e9, 0.0)
    assert 1e9 / t * 2 * 7 / 8 == pytest.approx(100e9)


def test_over_a_transport_that_is_not_ncclS_the_all_reduce_is_hierarchical():
    # (NODE and NET name no NCCL hardware: gloo, as `dlperf probe --comm` measures it; NCCL's
    # own choices are tests/test_nccl.py's.) 16 GPUs in 2 nodes of 8, 1 GB: reduce-scatter in the node (8.757 ms), an all-reduce of
    # the 125 MB share between the 2 nodes at 10 GB/s, 5 us (ring = tree: 2 x 5 us +
    # 1.25e8 x 2 x 1/2 / 1e10 = 12.51 ms), all-gather in the node (8.757 ms): 30.024 ms.
    assert allreduce_s(1e9, 16, 8, NODE, NET) == pytest.approx(0.030024)
    # one node: a plain ring at the node's bandwidth
    assert allreduce_s(1e9, 8, 8, NODE, NET) == pytest.approx(0.017514)
    # many nodes, small message: the tree's log(n) latency beats the ring's n
    ring = ring_allreduce_s(1e3 / 8, 512, 10e9, 5e-6)
    tree = tree_allreduce_s(1e3 / 8, 512, 10e9, 5e-6)
    assert tree < ring
    assert allreduce_s(1e3, 4096, 8, NODE, NET) == pytest.approx(
        2 * reduce_scatter_s(1e3, 8, 100e9, 1e-6) + tree)


def test_ddp_buckets_fill_in_reverse_with_a_small_first_bucket():
    # registration order a, b, c, d; the backward produces d first. d (30 MiB) closes the
    # first bucket (cap 1 MiB); c + b + a = 4.1 MiB never reach 25 MiB: the last bucket.
    params = [("a.weight", int(3 * MiB)), ("b.weight", int(0.5 * MiB)),
              ("c.weight", int(0.6 * MiB)), ("d.weight", 30 * MiB)]
    buckets = ddp_buckets(params)
    assert [names for names, _ in buckets] == [["d.weight"], ["c.weight", "b.weight", "a.weight"]]
    assert buckets[1][1] == int(3 * MiB) + int(0.5 * MiB) + int(0.6 * MiB)


def test_ddp_buckets_match_torch_ddp_assignment():
    # torch's own bucket assignment (the C++ DDP reducer's, exposed in torch.distributed) on
    # the same sizes: the same buckets, parameters in the same order.
    import torch
    import torch.distributed as dist

    if not hasattr(dist, "_compute_bucket_assignment_by_size"):
        pytest.skip("this torch does not expose DDP's bucket assignment")
    sizes = [3 * MiB, MiB // 2, 600_000, 30 * MiB, 8 * MiB, 20 * MiB, 2 * MiB]
    tensors = [torch.empty(s // 4, dtype=torch.float32) for s in sizes]
    # DDP passes the parameters reversed, with limits [first bucket, cap]
    order, _ = dist._compute_bucket_assignment_by_size(
        list(reversed(tensors)), [1 * MiB, 25 * MiB])
    theirs = [[len(sizes) - 1 - i for i in bucket] for bucket in order]
    ours = ddp_buckets([(str(i), s) for i, s in enumerate(sizes)])
    assert [[int(n) for n in names] for names, _ in ours] == theirs


_DDP_REBUILD = """
import json, os, torch, torch.distributed as dist
from torch import nn
os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", os.environ["PORT"]
dist.init_process_group("gloo", rank=0, world_size=1)
torch.manual_seed(0)
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(512, 300)  # registered first, runs last
        self.trunk = nn.Sequential(*[nn.Linear(512, 512) for _ in range(6)])
    def forward(self, x):
        return self.head(self.trunk(x))
ddp = nn.parallel.DistributedDataParallel(Net(), bucket_cap_mb=2)
for _ in range(3):
    ddp(torch.randn(4, 512)).sum().backward()
print(json.dumps(ddp._get_ddp_logging_data()["rebuilt_per_bucket_param_indices"]))
from dlperf.train.distributed import end_worker
end_worker(0)  # no finalization: gloo's threads can abort it (exit_process says why)
"""


def test_ddp_trains_with_buckets_rebuilt_in_the_order_gradients_come():
    # After its first iteration DDP rebuilds its buckets in the order the backward produced
    # the gradients. A head registered before the trunk it follows: the initial assignment
    # (reverse registration) would put the head's gradients in the last bucket, ready only at
    # the end of the backward; DDP itself (run here on one gloo process, read from its own
    # logging data) puts them first, and so does dlperf's timeline
    import subprocess
    import sys

    from torch import nn

    import dlperf

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(512, 300)
            self.trunk = nn.Sequential(*[nn.Linear(512, 512) for _ in range(6)])

        def forward(self, x):
            return self.head(self.trunk(x))

    model = Net()
    params = [(n, p.numel() * 4) for n, p in model.named_parameters()]
    analysis = dlperf.analyze(model, (4, 512), device="h100-sxm", dtype="fp32", train=True)
    ours = rebuilt_buckets(timeline(analysis.predictions), params, 2 * MiB, 2 * MiB)
    index = {name: i for i, (name, _) in enumerate(params)}
    ours = [[index[n] for n in names] for names, _ in ours]
    # head.bias (1,200 B), head.weight (614,400), then each trunk layer's bias and weight
    # (2,048 + 1,048,576): the bucket closes at >= 2 MiB after trunk.4 (2,716,848 B)
    assert ours == [[1, 0, 13, 12, 11, 10], [9, 8, 7, 6], [5, 4, 3, 2]]
    assert [[index[n] for n in names] for names, _ in ddp_buckets(params, 2 * MiB, 2 * MiB)
            ][-1][-2:] == [1, 0]  # the initial assignment: the head last
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("this torch build has no gloo backend to run DDP on")
    env = {**os.environ, "PORT": str(29500 + os.getpid() % 1000)}
    run = subprocess.run([sys.executable, "-c", _DDP_REBUILD], capture_output=True, text=True,
                         timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    theirs = [[int(i) for i in bucket.split()]
              for bucket in json.loads(run.stdout.strip().splitlines()[-1]).split(",")]
    assert theirs == ours


def test_buckets_overlap_the_backward_on_one_stream():
    # ready at 1, 2, 3 s; all-reduces of 1.5, 0.5, 2 s; the backward ends at 3.5 s:
    # bucket 1 runs 1-2.5, bucket 2 2.5-3, bucket 3 3-5: 1.5 s left after the backward.
    end, exposed = serial_overlap([1.0, 2.0, 3.0], [1.5, 0.5, 2.0], 3.5)
    assert (end, exposed) == (5.0, 1.5)
    assert serial_overlap([1.0], [0.5], 3.5) == (1.5, 0.0)  # hidden entirely


def test_a_gradient_is_ready_with_the_nearest_module_that_computes_it():
    # nn.MultiheadAttention keeps out_proj as a Linear it never calls: the kernels that make
    # out_proj's gradients are the attention module's. Before, such a parameter counted as
    # ready at the backward's end, so every DDP bucket holding one (each of ViT-B/16's 12
    # layers) waited for the end: 2.87 ms of 2.95 exposed on 16 H100s instead of ~0.1 ms.
    tl = Timeline(backward_end_s=9.0, step_s=10.0, optimizer_s=1.0,
                  grad_ready_s={"blocks.1.attn": 4.0, "blocks.1": 4.5, "": 8.5})
    assert tl.param_ready_s("blocks.1.attn.out_proj.weight") == 4.0  # its parent's kernels
    assert tl.param_ready_s("blocks.1.norm.weight") == 4.5  # the block's
    assert tl.param_ready_s("class_token") == 8.5  # the root module's own kernels
    assert Timeline(9.0, 10.0, 1.0, {}).param_ready_s("a.b.weight") == 9.0  # nothing: the end
    # through a capture: two nn.TransformerEncoderLayer blocks; the later block's gradients
    # (its out_proj's included) come first in the backward, long before it ends
    import dlperf

    model = torch.nn.Sequential(torch.nn.TransformerEncoderLayer(64, 4, 256, batch_first=True),
                                torch.nn.TransformerEncoderLayer(64, 4, 256, batch_first=True))
    analysis = dlperf.analyze(model, (8, 32, 64), device="h100-sxm", dtype="bf16", train=True)
    tl = timeline(analysis.predictions)
    assert "1.self_attn.out_proj" not in tl.grad_ready_s  # the module runs no kernel itself
    late = tl.param_ready_s("1.self_attn.out_proj.weight")
    assert late == tl.grad_ready_s["1.self_attn"] < tl.param_ready_s("0.linear1.weight")
    assert late < tl.backward_end_s


def test_fsdp_moves_parameters_twice_and_gradients_once():
    # 1 GB of parameters and gradients on 4 GPUs: all-gather 2 x 1 GB x 3/4, reduce-scatter 0.75 GB
    assert fsdp_traffic(1e9, 1e9, 4) == {"all_gather_bytes": 1.5e9,
                                         "reduce_scatter_bytes": 0.75e9}


def _resnet18_on_h100():
    import torchvision

    import dlperf

    model = torchvision.models.resnet18()
    analysis = dlperf.analyze(model, (64, 3, 224, 224), device="h100-sxm", dtype="bf16",
                              train=True)
    params = [(n, p.numel() * 4) for n, p in model.named_parameters()]  # fp32 gradients
    return analysis, params


def test_scale_out_names_what_limits_each_scale():
    analysis, params = _resnet18_on_h100()
    nvlink, ndr = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]
    one = scale_out(analysis, params, ScaleConfig(gpus=1), nvlink, ndr)
    assert one["scaling_efficiency"] == 1.0 and one["exposed_comm_s"] == 0.0
    eight = scale_out(analysis, params, ScaleConfig(gpus=8), nvlink, ndr)
    # 46.8 MB of fp32 gradients in 3 buckets over NVLink: hidden but for the last one (the
    # stem's and layer1's 15.9 MB, ready when the backward ends): NCCL's ring LL128 at
    # 0.92 x 370 x 8/14 = 194.5 GB/s, 81.5 us + 14 + 14 x 1.9 us = 122.1 us; DDP's bucket
    # copies, 4 x 46.8 MB at ~1.86 TB/s, another ~0.1 ms of a ~6 ms step
    from dlperf.analysis.nccl import collective

    assert eight["communication"]["gradient_bytes"] == sum(b for _, b in params)
    last = eight["communication"]["bucket_bytes"][-1]
    assert last == 15853824
    assert eight["communication"]["exposed_s"] == pytest.approx(
        collective("allreduce", last, 8, 8, 370e9, "nvlink", None, gen=2).seconds)
    assert eight["communication"]["exposed_s"] == pytest.approx(122.1e-6, rel=1e-3)
    assert eight["communication"]["bucket_copy_s"] == pytest.approx(
        4 * sum(b for _, b in params) / analysis.efficiency.bandwidth(analysis.device))
    assert eight["limited_by"] == "compute" and 0.94 < eight["scaling_efficiency"] < 0.99
    # a CPU decode of 2 cores x 300 img/s per GPU cannot feed an H100: input-bound, at 600 img/s
    # a loader, and every step waits for the slowest of the 8 loaders: a batch of 64 takes
    # 64 / 600 = 106.7 ms, x (1 + 0.01 x e(8) = 1.42360) = 108.2 ms -> 591.6 img/s per GPU
    cpu = scale_out(analysis, params, ScaleConfig(gpus=8, decode="cpu", data_cores_per_gpu=2,
                                                  decode_img_per_s_per_core=300), nvlink, ndr)
    assert analysis.batch_size == 64
    assert cpu["input_bound"] and cpu["per_gpu_samples_per_s"] == pytest.approx(591.58, rel=1e-4)
    assert cpu["straggler_s"] == pytest.approx(64 / 600 * 0.01 * 1.42360, rel=1e-4)
    assert cpu["limited_by"].startswith("input")
    # the ways out: the GPUs' own rate (a decode on the GPU), or the cores that would keep up
    gpu_rate = eight["per_gpu_samples_per_s"]
    assert cpu["gpu_decode_samples_per_s"] == pytest.approx(gpu_rate)
    assert cpu["host_cores_needed_per_gpu"] == pytest.approx(gpu_rate / 300)
    assert "gpu_decode_samples_per_s" not in eight
    # 25 GbE shared by a node's 8 GPUs, 64 nodes: communication dominates
    slow = scale_out(analysis, params, ScaleConfig(gpus=512), nvlink, PRESETS["ethernet-25g"])
    assert slow["limited_by"] == "communication" and slow["scaling_efficiency"] < 0.8
    curve = scaling_curve(analysis, params, ScaleConfig(gpus=1), nvlink, PRESETS["ethernet-25g"])
    per_gpu = [c["per_gpu_samples_per_s"] for c in curve]
    assert [c["gpus"] for c in curve][-1] == 4096
    # the curve works out the step's shape once (one_step) and gets what each scale alone gets
    assert curve[CURVE.index(512)] == slow
    assert all(a >= b * 0.999 for a, b in zip(per_gpu, per_gpu[1:]))  # never faster per GPU


def test_loader_workers_share_the_host_cores_among_the_gpus_in_a_node():
    # NVIDIA's DGX-1 with its CPU loader: 40 cores for 8 GPUs (5 per GPU), 8 worker processes
    # per GPU, each core decoding 215 img/s (assumed). One GPU alone: min(8 workers, 40 cores)
    # = 8 -> 1,720 img/s; eight GPUs: min(8, 40 / 8) = 5 -> 1,075 img/s per GPU; four: min(8,
    # 10) = 8. Without a worker count the loader keeps its 5 cores at every scale (as before).
    cfg = ScaleConfig(gpus=8, decode="cpu", data_cores_per_gpu=5, decode_img_per_s_per_core=215,
                      loader_workers_per_gpu=8)
    assert [cfg.decode_parallelism(g) for g in (1, 4, 5, 8)] == [8, 8, 8, 5]
    plain = ScaleConfig(gpus=8, decode="cpu", data_cores_per_gpu=5,
                        decode_img_per_s_per_core=215)
    assert plain.decode_parallelism(1) == plain.decode_parallelism(8) == 5
    with pytest.raises(DlperfError, match="--loader-workers describes .* add --decode cpu"):
        ScaleConfig(gpus=8, loader_workers_per_gpu=8)
    with pytest.raises(DlperfError, match="--loader-workers needs a count of at least 1"):
        ScaleConfig(gpus=8, decode="cpu", data_cores_per_gpu=5, decode_img_per_s_per_core=215,
                    loader_workers_per_gpu=0)
    # through scale_out: a ResNet-18 step on an H100 wants far more than either cap, so one GPU
    # runs at the 1,720 img/s of its 8 workers, eight GPUs at 1,075 each: 62.5% scaling, input
    analysis, params = _resnet18_on_h100()
    nvlink, ndr = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]
    one = scale_out(analysis, params, ScaleConfig(gpus=1, decode="cpu", data_cores_per_gpu=5,
                    decode_img_per_s_per_core=215, loader_workers_per_gpu=8), nvlink, ndr)
    eight = scale_out(analysis, params, cfg, nvlink, ndr)
    # (one GPU waits for nobody; eight wait for the slowest loader: 1,075 / 1.014236)
    assert one["per_gpu_samples_per_s"] == pytest.approx(1720.0)
    assert eight["per_gpu_samples_per_s"] == pytest.approx(1075.0 / 1.014236, rel=1e-5)
    assert eight["scaling_efficiency"] == pytest.approx(1075 / 1.014236 / 1720, rel=1e-5)
    assert eight["limited_by"].startswith("input")
    # with no spread the host rate itself: the loaders' straggler is the only change
    flat = scale_out(analysis, params, dataclasses.replace(cfg, step_cv=0.0), nvlink, ndr)
    assert flat["per_gpu_samples_per_s"] == pytest.approx(1075.0)
    # 8 GPUs x 8 workers on 40 cores: 64 / 40 = 1.6 workers a core, which the line flags (the
    # training processes then wait for a core; not in the prediction); one GPU: 8 / 40 = 0.2
    assert eight["loader_processes_per_core"] == pytest.approx(1.6)
    assert one["loader_processes_per_core"] == pytest.approx(0.2)
    assert plain.loader_processes_per_core(8) is None
    from rich.console import Console

    console = Console(width=400, markup=False)
    with console.capture() as captured:
        render_scaling(eight, [eight], nvlink, ndr, console)
    assert "workers outnumber the node's cores 1.6 to 1" in captured.get()
    with console.capture() as captured:
        render_scaling(one, [one], nvlink, ndr, console)
    assert "outnumber" not in captured.get()


def test_scale_config_and_interconnect_files_refuse_nonsense(tmp_path):
    with pytest.raises(DlperfError, match="--data-cores"):
        ScaleConfig(gpus=8, decode="cpu")
    # the host's cores, rate or workers without --decode cpu were ignored in silence
    with pytest.raises(DlperfError, match="--data-cores, --decode-rate describe a JPEG decode "
                                          "on the host's cores: add --decode cpu"):
        ScaleConfig(gpus=8, data_cores_per_gpu=5, decode_img_per_s_per_core=215)
    with pytest.raises(DlperfError, match="--loader-workers describes .* --decode synthetic"):
        ScaleConfig(gpus=8, decode="synthetic", loader_workers_per_gpu=8)
    with pytest.raises(DlperfError, match="ddp, fsdp, fsdp-grad-op or hsdp"):
        ScaleConfig(gpus=8, strategy="zero3")
    with pytest.raises(DlperfError, match="--nccl-algo 'rings'"):
        ScaleConfig(gpus=8, nccl_algo="rings")
    with pytest.raises(DlperfError, match="--nccl-proto 'LL256'"):
        ScaleConfig(gpus=8, nccl_proto="LL256")
    assert ScaleConfig(gpus=8, nccl_algo="^tree").algorithms == {"ring", "pat"}
    path = tmp_path / "my-ib.json"
    path.write_text(json.dumps({"name": "mine", "display_name": "my IB", "bus_bandwidth": 4e10,
                                "latency_s": 4e-6, "scope": "network", "source": "measured"}))
    mine = get_interconnect(str(path))
    assert mine.bus_bandwidth == 4e10 and mine.nccl == ""  # not NCCL's: a plain ring
    path.write_text(json.dumps({"name": "mine", "display_name": "my IB", "bus_bandwidth": 4e10,
                                "latency_s": 4e-6, "scope": "network", "source": "measured",
                                "nccl": "net"}))
    assert get_interconnect(str(path)).nccl == "net"  # NCCL's tuner prices its steps
    path.write_text(json.dumps({"name": "mine", "display_name": "my IB", "bus_bandwidth": 4e10,
                                "latency_s": 4e-6, "scope": "network", "source": "measured",
                                "nccl": "infiniband"}))
    with pytest.raises(DlperfError, match="nccl nvlink, pci, net or absent"):
        get_interconnect(str(path))
    path.write_text(json.dumps({"name": "mine", "bus_bandwidth": 4e10}))
    with pytest.raises(DlperfError, match="my-ib.json"):
        get_interconnect(str(path))
    with pytest.raises(DlperfError, match="did you mean"):
        get_interconnect("nvlink4-h10")
    # what Python's json lets through and would crash or poison the prediction: a quoted
    # number (a TypeError before), NaN and Infinity (a "nan µs" line before), true (1 B/s)
    good = {"name": "mine", "display_name": "my IB", "bus_bandwidth": 4e10, "latency_s": 4e-6,
            "scope": "network", "source": "measured"}
    for key, bad, says in (("bus_bandwidth", "4e10", "bus_bandwidth must be a positive"),
                           ("bus_bandwidth", float("nan"), "got nan"),
                           ("bus_bandwidth", float("inf"), "got inf"),
                           ("bus_bandwidth", True, "got True"),
                           ("bus_bandwidth", 0, "got 0"),
                           ("latency_s", float("nan"), "latency_s must be a number >= 0"),
                           ("latency_s", -1e-6, "latency_s must be a number >= 0"),
                           ("name", ["x"], "name must be a string"),
                           ("scope", "rack", "scope must be node or network"),
                           # a figure in the wrong unit: GB/s or microseconds
                           ("bus_bandwidth", 46, "is 46 B/s; for 46 GB/s write 46e9"),
                           ("latency_s", 5, "is 5 s; for 5 us write 5e-6"),
                           # a node's GPUs: a whole number, at least one
                           ("gpus", 0, "gpus .* must be a whole number >= 1, got 0"),
                           ("gpus", 7.5, "got 7.5"), ("gpus", True, "got True")):
        path.write_text(json.dumps({**good, key: bad}))
        with pytest.raises(DlperfError, match=f"my-ib.json: .*{says}"):
            get_interconnect(str(path))
    # a rate or core count that is nan, infinite or negative printed a negative or nan
    # throughput; the API refuses it as the command line does
    for field in ("data_cores_per_gpu", "decode_img_per_s_per_core"):
        for bad in (float("nan"), float("inf"), -5.0, True):
            args = {"data_cores_per_gpu": 4.0, "decode_img_per_s_per_core": 215.0, field: bad}
            with pytest.raises(DlperfError, match="positive finite number"):
                ScaleConfig(gpus=8, decode="cpu", **args)
    for ic in PRESETS.values():  # every preset says where its figure comes from
        assert ic.source and ic.bus_bandwidth > 1e8 and ic.scope in ("node", "network")
        # and is NCCL's: NVLink or PCIe inside a node, a NIC between nodes
        assert ic.nccl == ("nvlink" if ic.name.startswith("nvlink") else
                           "pci" if ic.name.startswith("pcie") else "net")


def test_an_nvl72_rack_is_one_node_of_72_gpus(tmp_path, capsys):
    """The GB200 NVL72: its NVLink joins 72 GPUs, so --interconnect auto makes them one node
    (nvlink5-nvl72, gpus=72) unless --gpus-per-node, --nodes or a server's NVLink says
    otherwise; its preset is the B200's silicon at 1,200 W (360 PFLOPS of sparse FP16/BF16
    over 72 GPUs: 5 sparse, 2.5 dense each)."""
    from conftest import run_cli

    from dlperf.analysis.nccl import generation
    from dlperf.hardware.interconnect import auto_interconnects
    from dlperf.hardware.specs import get_device, match_preset

    gb200 = get_device("gb200")
    assert gb200.peak_flops("bf16") == 2.5e15 and gb200.peak_flops("fp8") == 5e15
    assert gb200.mem_bandwidth == 8e12  # 576 TB/s / 72
    assert match_preset("NVIDIA GB200").name == "gb200"
    assert match_preset("NVIDIA B200").name == "b200"  # not caught by the GB200's pattern
    assert generation("gb200") == generation("b200") == 3  # NCCL's Blackwell tuning
    assert auto_interconnects("gb200") == ("nvlink5-nvl72", "ib-ndr", False)
    assert PRESETS["nvlink5-nvl72"].gpus == 72 and PRESETS["nvlink5-b200"].gpus == 8
    base = ["analyze", "resnet18", "--train", "--batch-size", "64", "--device", "gb200",
            "--gpus", "128", "--top", "1", "--json", str(tmp_path / "r.json")]
    nodes = {}
    for extra in ([], ["--gpus-per-node", "64"], ["--nodes", "4"],
                  ["--interconnect", "nvlink5-b200,ib-ndr"]):
        code, out, err = run_cli(base + extra, capsys)
        assert code == 0, err
        data = json.loads((tmp_path / "r.json").read_text())["scale_out"]
        nodes[" ".join(extra)] = data["at_requested_scale"]["nodes"]
    # 128 GPUs: two racks (72 + 56), two of 64, four given, or 16 servers of 8
    assert nodes == {"": 2, "--gpus-per-node 64": 2, "--nodes 4": 4,
                     "--interconnect nvlink5-b200,ib-ndr": 16}


def test_blackwell_ultra_presets_are_blackwell_with_more_memory_and_no_int8():
    """B300 and GB300 (Blackwell Ultra, sm_103): the B200's and GB200's dense FP8/BF16 peaks
    (HGX B300: 72 PFLOPS sparse FP8 over 8 GPUs = 4.5 dense each; GB300 NVL72: 720 sparse over
    72 = 5 dense), 288 GB of HBM3e (270 and 279 usable), INT8 cut to 0.15-0.165 POPS dense
    (under 4% of their FP8), ConnectX-8 NICs at 800 Gb/s, NCCL's Blackwell tuning, FP8 GEMMs
    in any layout and cuDNN's attention first in SDPA."""
    from dlperf.analysis.nccl import generation
    from dlperf.hardware.efficiency import sdpa_kernel
    from dlperf.hardware.interconnect import auto_interconnects
    from dlperf.hardware.specs import get_device

    pairs = {"b300": "b200", "gb300": "gb200"}
    for ultra, base in pairs.items():
        u, b = get_device(ultra), get_device(base)
        assert [u.peak_flops(d) for d in ("bf16", "fp8", "tf32")] == \
            [b.peak_flops(d) for d in ("bf16", "fp8", "tf32")]
        assert u.peak_flops("int8") < 0.04 * u.peak_flops("fp8") < b.peak_flops("int8")
        assert u.memory_bytes > 1.45 * 180 * 2**30 and u.mem_bandwidth == 8e12
        assert generation(ultra) == 3
        assert sdpa_kernel(u, "2.14.1", 91900, environ={})[0] == "cudnn"
    assert get_device("b300").peak_flops("bf16") == 2.25e15
    assert get_device("gb300").peak_flops("bf16") == 2.5e15
    assert auto_interconnects("gb300") == ("nvlink5-nvl72", "ib-xdr", False)
    assert auto_interconnects("b300") == ("nvlink5-b300", "ib-xdr", False)


def test_analyze_gpus_prints_and_saves_the_scaling_curve(tmp_path, capsys):
    from conftest import run_cli

    path = tmp_path / "scale.json"
    code, out, err = run_cli(["analyze", "resnet18", "--train", "--batch-size", "64",
                              "--gpus", "16", "--json", str(path)], capsys)
    assert code == 0, err
    assert "On 16 GPUs" in out and "Scaling, same per-GPU batch" in out
    data = json.loads(path.read_text())["scale_out"]
    assert data["config"]["node"]["name"] == "nvlink4-h100"  # auto: the H100's HGX system
    assert data["config"]["network"]["name"] == "ib-ndr"
    assert data["at_requested_scale"]["nodes"] == 2
    assert [row["gpus"] for row in data["curve"]][:4] == [1, 2, 4, 8]
    # the wait for the slowest GPU is in the line and in the JSON (default spread: STEP_CV)
    assert "waiting for the slowest GPU (step spread 1.0%)" in " ".join(out.split())
    assert data["at_requested_scale"]["step_cv"] == STEP_CV
    assert data["at_requested_scale"]["straggler_s"] > 0
    # a host decode of 1 core x 100 img/s cannot feed an H100: the line says what would
    code, out, err = run_cli(["analyze", "resnet18", "--train", "--batch-size", "64", "--gpus",
                              "8", "--decode", "cpu", "--data-cores", "1", "--decode-rate",
                              "100"], capsys)
    text = " ".join(out.split())
    assert code == 0 and "limited by input (host JPEG decode) (decoding on the GPUs" in text
    assert "cores per GPU at this rate" in text
    # HSDP from the command line: named in the line, and 12 GPUs in nodes of 8 refused
    code, out, err = run_cli(["analyze", "resnet18", "--train", "--batch-size", "64", "--gpus",
                              "16", "--strategy", "hsdp"], capsys)
    assert code == 0 and "; HSDP): " in " ".join(out.split()), err
    code, out, err = run_cli(["analyze", "resnet18", "--train", "--gpus", "12", "--strategy",
                              "hsdp"], capsys)
    assert code == 2 and "12 GPUs do not fill nodes of 8" in err
    assert len(err.strip().splitlines()) == 1
    code, out, err = run_cli(["analyze", "resnet18", "--train", "--step-cv", "0.02"], capsys)
    assert code == 2 and "add --gpus N" in err and len(err.strip().splitlines()) == 1
    code, out, err = run_cli(["analyze", "resnet18", "--train", "--gpus", "8", "--step-cv",
                              "0.9"], capsys)
    assert code == 2 and "--step-cv 0.9" in err and len(err.strip().splitlines()) == 1
    code, out, err = run_cli(["analyze", "resnet18", "--train", "--collective-sms", "8"],
                             capsys)
    assert code == 2 and "add --gpus N" in err and len(err.strip().splitlines()) == 1
    code, out, err = run_cli(["analyze", "resnet18", "--train", "--gpus", "8",
                              "--collective-sms", "132"], capsys)
    assert code == 2 and "--collective-sms 132: h100-sxm has 132 SMs" in err
    assert len(err.strip().splitlines()) == 1
    code, out, err = run_cli(["analyze", "resnet18", "--gpus", "8"], capsys)
    assert code == 2 and "--gpus needs --train" in err and len(err.strip().splitlines()) == 1
    code, out, err = run_cli(["analyze", "resnet18", "--train", "--gpus", "8", "--decode",
                              "cpu"], capsys)
    assert code == 2 and "--data-cores" in err
    code, out, err = run_cli(["analyze", "resnet18", "--train", "--loader-workers", "8"], capsys)
    assert code == 2 and "add --gpus N" in err and len(err.strip().splitlines()) == 1
    for flag, bad in (("--decode-rate", "nan"), ("--decode-rate", "-5"), ("--data-cores", "inf"),
                      ("--data-cores", "four")):
        cores, rate = ("4", bad) if flag == "--decode-rate" else (bad, "215")
        code, out, err = run_cli(["analyze", "resnet18", "--train", "--gpus", "8", "--decode",
                                  "cpu", "--data-cores", cores, "--decode-rate", rate], capsys)
        assert code == 2 and f"argument {flag}: expected a positive number" in err, (flag, bad)
        assert len(err.strip().splitlines()) == 1 and "samples/s" not in out
    # a bad interconnect file stops the command before the model is traced
    bad = tmp_path / "bad-ic.json"
    bad.write_text(json.dumps({"name": "x", "display_name": "x", "bus_bandwidth": "1e9",
                               "latency_s": 1e-6, "scope": "node", "source": "s"}))
    code, out, err = run_cli(["analyze", "resnet18", "--train", "--gpus", "8", "--interconnect",
                              str(bad)], capsys)
    assert code == 2 and "bad-ic.json: bus_bandwidth must be a positive number" in err
    assert "Time split" not in out  # the single-GPU report was never printed
    # a display name is the user's text: printed as written (rich markup crashed on "[/]")
    bad.write_text(json.dumps({"name": "x", "display_name": "[/] my [bold]IB", "source": "s",
                               "bus_bandwidth": 1e10, "latency_s": 1e-6, "scope": "network"}))
    code, out, err = run_cli(["analyze", "resnet18", "--train", "--gpus", "16", "--interconnect",
                              f"nvlink4-h100,{bad}"], capsys)
    assert code == 0, err
    assert "then [/] my [bold]IB; DDP" in " ".join(out.split())
    code, out, err = run_cli(["devices", "--interconnects"], capsys)
    assert code == 0 and "nvlink4-h200" in out and "nccl-tests#272" in out
    # a .json that is not there is named as a missing file, not as an unknown preset
    code, out, err = run_cli(["analyze", "resnet18", "--train", "--gpus", "8", "--interconnect",
                              str(tmp_path / "gone.json")], capsys)
    assert code == 2 and "gone.json: no such interconnect file" in err
    assert "unknown interconnect" not in err and len(err.strip().splitlines()) == 1


def test_nodes_spreads_the_gpus_evenly(tmp_path, capsys):
    # --nodes M is the (and torchrun's --nnodes) way to give the node count: 16 GPUs
    # over 4 nodes are nodes of 4, the same job as --gpus-per-node 4, and not the same as
    # nodes of 8 (more of the ring crosses the network).
    from conftest import run_cli

    from dlperf.cli.analyze import gpus_per_node
    from dlperf.errors import DlperfError

    assert gpus_per_node(16, None, None) == 8 and gpus_per_node(16, None, 2) == 2
    assert gpus_per_node(16, 4, None) == 4 and gpus_per_node(16, 4, 4) == 4
    for gpus, nodes, per_node, said in ((None, 2, None, "add --gpus N"),
                                        (16, 3, None, "does not spread evenly"),
                                        (16, 4, 8, "make 32 GPUs, not --gpus 16")):
        with pytest.raises(DlperfError, match=said):
            gpus_per_node(gpus, nodes, per_node)
    runs = {}
    for name, flags in (("nodes", ["--nodes", "4"]), ("per-node", ["--gpus-per-node", "4"]),
                        ("eights", [])):
        out_json = tmp_path / f"{name}.json"
        code, out, err = run_cli(["analyze", "resnet18", "--train", "--batch-size", "32",
                                  "--gpus", "16", *flags, "--json", str(out_json)], capsys)
        assert code == 0, err
        runs[name] = json.loads(out_json.read_text())["scale_out"]["at_requested_scale"]
    assert runs["nodes"] == runs["per-node"]
    assert (runs["nodes"]["nodes"], runs["eights"]["nodes"]) == (4, 2)
    assert runs["nodes"]["exposed_comm_s"] != runs["eights"]["exposed_comm_s"]
    code, out, err = run_cli(["analyze", "resnet18", "--train", "--gpus", "16", "--nodes", "3"],
                             capsys)
    assert code == 2 and "--nodes 3" in err and len(err.strip().splitlines()) == 1


def test_interconnect_auto_for_pcie_cards_says_what_it_assumes(tmp_path, capsys):
    # A PCIe card has no DGX/HGX system: auto takes PCIe through the host at the card's
    # generation inside a node and says the network between nodes is an assumption; a device
    # with no system at all (a CPU profile, a user's spec file) still asks for names.
    from conftest import run_cli

    from dlperf.hardware.interconnect import auto_interconnects

    assert auto_interconnects("h100-sxm") == ("nvlink4-h100", "ib-ndr", False)
    assert auto_interconnects("h100-pcie") == ("pcie5", "roce-100g", True)
    assert auto_interconnects("quadro-rtx8000")[0] == "pcie3"
    assert auto_interconnects("v100-pcie")[0] == "pcie3"
    assert auto_interconnects("a40") == ("pcie4", "roce-100g", True)
    assert auto_interconnects("v100-sxm2-16gb") == ("nvlink2-dgx1", "ib-edr-dgx1", False)
    # every GPU preset has a system or a PCIe generation for --interconnect auto, but the
    # GH200, whose systems (NVL2, NVL32, single boards) differ: it must be told
    from dlperf.hardware.specs import PRESETS as GPU_PRESETS
    assert [name for name in GPU_PRESETS if not auto_interconnects(name)] == ["gh200"]
    assert auto_interconnects("cpu") is None
    path = tmp_path / "scale.json"
    code, out, err = run_cli(["analyze", "resnet18", "--device", "rtx4090", "--train",
                              "--batch-size", "64", "--gpus", "2", "--json", str(path)], capsys)
    assert code == 0, err
    assert "rtx4090 is a PCIe card" in " ".join(out.split()) and "assumed" in out
    data = json.loads(path.read_text())["scale_out"]
    assert data["config"]["node"]["name"] == "pcie4"
    assert data["config"]["network"]["name"] == "roce-100g"
    spec = tmp_path / "gpu.json"
    spec.write_text(json.dumps({"name": "mygpu", "sm_count": 10, "mem_bandwidth": 1e11,
                                "peak": {"fp32": 1e13, "fp16": 1e14}}))
    code, out, err = run_cli(["analyze", "resnet18", "--device", str(spec), "--train",
                              "--batch-size", "8", "--dtype", "fp16", "--gpus", "2"], capsys)
    assert code == 2 and "--interconnect auto knows no system for mygpu" in err


def test_comm_fit_recovers_bus_bandwidth_and_latency():
    # 4 processes, B = 2 GB/s, a = 50 us: t = 6 x 50 us + S x 6/4 / 2e9
    from dlperf.hardware.comm_probe import fit_ring

    sizes = [4096, 65536, 2**20, 2**24]
    seconds = [6 * 50e-6 + s * 1.5 / 2e9 for s in sizes]
    bus_bw, latency = fit_ring(sizes, seconds, 4)
    assert bus_bw == pytest.approx(2e9, rel=1e-6) and latency == pytest.approx(50e-6, rel=1e-6)
    with pytest.raises(DlperfError, match="do not grow"):
        fit_ring(sizes, list(reversed(seconds)), 4)


def test_comm_probe_measures_again_when_a_busy_host_bends_the_line(monkeypatch):
    # CI once measured 1 MiB faster than 64 KiB: a first measurement that shrinks with size is
    # retaken; the second, clean one (B = 1 GB/s, a = 100 us, 2 processes) is the one fitted
    from dlperf.hardware import comm_probe

    sizes = comm_probe.QUICK_SIZES
    clean = [2 * 100e-6 + s / 1e9 for s in sizes]
    runs = iter([list(reversed(clean)), clean])
    monkeypatch.setattr(comm_probe, "_measure", lambda *a: next(runs))
    ic, data = comm_probe.probe_comm(quick=True, backend="gloo")
    assert ic.bus_bandwidth == pytest.approx(1e9, rel=1e-6) and data["seconds"] == clean
    always_bent = [list(reversed(clean))] * comm_probe.ATTEMPTS
    runs = iter(always_bent)
    with pytest.raises(DlperfError, match="do not grow"):
        comm_probe.probe_comm(quick=True, backend="gloo")


def test_comm_probe_says_how_far_its_line_misses(monkeypatch, tmp_path, capsys):
    # measured / fitted and fitted / measured, worst size: 3.0 / 1.5 = 2x at 4 KiB beats
    # 1.0 / 1.25 (1.25x) and a size on the line
    from dlperf.hardware import comm_probe

    assert comm_probe.fit_misses([4096, 2**20, 2**22], [3.0, 1.0, 2.0],
                                 [1.5, 1.25, 2.0]) == (2.0, 4096)
    # a clean line (B = 1 GB/s, a = 100 us, 2 processes): fitted exactly, nothing to say
    from conftest import run_cli

    sizes = comm_probe.QUICK_SIZES
    clean = [2 * 100e-6 + s / 1e9 for s in sizes]
    monkeypatch.setattr(comm_probe, "_measure", lambda *a: list(clean))
    out = tmp_path / "comm.json"
    code, text, err = run_cli(["probe", "--comm", "--quick", "--out", str(out)], capsys)
    assert code == 0, err
    m = json.loads(out.read_text())["measurements"]
    assert m["fit_worst_ratio"] == pytest.approx(1.0) and "misses" not in text
    assert "misses its worst size" in json.loads(out.read_text())["interconnect"]["source"]
    # the 4 KiB all-reduce 10x slower than its neighbours let it be: the line misses it, and
    # the probe says so in one line
    bent = [clean[0] * 10] + clean[1:]
    monkeypatch.setattr(comm_probe, "_measure", lambda *a: list(bent))
    code, text, err = run_cli(["probe", "--comm", "--quick", "--out", str(out)], capsys)
    assert code == 0, err
    m = json.loads(out.read_text())["measurements"]
    assert m["fit_worst_ratio"] > comm_probe.MISFIT_WARN
    assert "The fit misses the" in " ".join(text.split()) and "quieter machine" in text


def test_comm_probe_spawns_no_more_processes_than_the_host_can_time(capsys):
    # --world 100000 started 100,000 Pythons with torch loaded (it hung this machine); the
    # probe now refuses more processes than cores (gloo) or GPUs (NCCL), in one line
    import os

    from conftest import run_cli

    from dlperf.hardware import comm_probe

    most = comm_probe.max_world()
    assert most == max(2, os.cpu_count() or 1, torch.cuda.device_count())
    with pytest.raises(DlperfError, match=f"--world {most + 1}: .* at most {most} processes"):
        comm_probe.probe_comm(world=most + 1, quick=True)
    code, out, err = run_cli(["probe", "--comm", "--world", "100000"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "at most" in err


@pytest.mark.slow
def test_comm_probe_processes_that_fail_are_reported_not_waited_for():
    # both ranks fail at once (a backend torch does not have): one line naming the exit codes
    from dlperf.hardware import comm_probe

    with pytest.raises(DlperfError, match="all-reduce processes failed \\(exit codes"):
        comm_probe._measure(2, comm_probe.QUICK_SIZES, 1, "no-such-backend")


@pytest.mark.slow
def test_probe_comm_measures_gloo_and_analyze_uses_the_file(tmp_path, capsys):
    from conftest import run_cli

    path = tmp_path / "comm.json"
    code, out, err = run_cli(["probe", "--comm", "--quick", "--out", str(path)], capsys)
    assert code == 0, err
    data = json.loads(path.read_text())
    assert data["measurements"]["backend"] == "gloo" and len(data["measurements"]["seconds"]) == 4
    ic = get_interconnect(str(path))
    assert ic.bus_bandwidth > 1e6 and ic.scope == "node"
    report = tmp_path / "a.json"
    code, out, err = run_cli(["analyze", "resnet18", "--train", "--batch-size", "8", "--gpus", "2",
                              "--interconnect", str(path), "--json", str(report)], capsys)
    assert code == 0, err
    scale = json.loads(report.read_text())["scale_out"]
    assert scale["config"]["node"]["name"] == "measured-gloo-2"
    assert scale["at_requested_scale"]["communication"]["comm_s"] > 0


def test_ddp_on_a_cpu_exposes_every_all_reduce_and_pays_the_bucket_copies():
    from dlperf.analysis.scaling import ddp_copy_s, ddp_exposed_s

    # two modules, ready at 1 s and 2 s; the backward ends at 3 s; 1 s per bucket
    tl = Timeline(3.0, 3.5, 0.5, {"a": 2.0, "b": 1.0})
    params = [("a.weight", 4 * MiB), ("b.weight", 30 * MiB)]  # b's bucket first, then a's
    assert ddp_exposed_s(tl, params, lambda b: 1.0)["exposed_s"] == 0.0  # 1-2, 2-3: hidden
    assert ddp_exposed_s(tl, params, lambda b: 1.0, overlap=False)["exposed_s"] == 2.0

    class A:  # an analysis on a CPU spec: 20 GB/s measured, streaming at 100%
        from dlperf.hardware.specs import DeviceSpec

        device = DeviceSpec(name="cpu", display_name="cpu", sm_count=2, mem_bandwidth=20e9,
                            peak={"fp32": 1e11}, tensor_cores=False, measured=True)
        efficiency = None

    # 100 MB of gradients: into the buckets and back, read + write each: 400 MB at 20 GB/s
    assert ddp_copy_s(100e6, A) == pytest.approx(0.02)


def test_html_report_draws_the_scaling_curve(tmp_path, capsys):
    import re
    import xml.dom.minidom

    from conftest import run_cli

    page = tmp_path / "r.html"
    code, _, err = run_cli(["analyze", "resnet18", "--train", "--batch-size", "64", "--gpus", "64",
                            "--interconnect", "nvlink4-h100,ethernet-25g", "--html", str(page)],
                           capsys)
    assert code == 0, err
    text = page.read_text()
    assert "<h3>Scale-out</h3>" in text and "limited by communication" in text
    svgs = re.findall(r"<svg.*?</svg>", text, flags=re.S)
    assert len(svgs) == 2  # the roofline and the scaling curve, both well-formed
    scaling = xml.dom.minidom.parseString(svgs[1])
    assert len(scaling.getElementsByTagName("circle")) == 13  # 1 .. 4,096 GPUs
    assert "<script" not in text


def test_another_reading_of_a_source_swaps_only_what_it_names():
    # validate_scaling.py --source S --interconnect OLD=NEW --set COLUMN=VALUE: one source's
    # rows, each named preset read as another (the other of a pair kept), a column set
    from conftest import ROOT, load_benchmark

    vs = load_benchmark("validate_scaling")
    rows = vs.read_rows(ROOT / "benchmarks/validation/published_scaling.csv")
    ibm = vs.reread([dict(r) for r in rows], "ibm-fms-fsdp",
                    ["roce-400g-per-node=roce-400g"], ["reduce_dtype="])
    assert len(ibm) == 8 and {r["source"] for r in ibm} == {"ibm-fms-fsdp"}
    a100 = [r for r in ibm if r["device"] == "a100-80gb"]
    assert {r["interconnect"] for r in a100} == {"nvlink3-a100,roce-400g"}
    assert {r["interconnect"] for r in ibm if r not in a100} == {
        "nvlink4-h100,roce-800g-per-node"}
    assert all(r["reduce_dtype"] is None for r in ibm)
    assert all(r["reduce_dtype"] == "bf16" for r in rows if r["source"] == "ibm-fms-fsdp")
    for bad, needle in ((("nobody", [], []), "no row of the table"),
                        ((None, ["roce-400g"], []), "OLD=NEW"),
                        ((None, [], ["colour=red"]), "not a column")):
        with pytest.raises(SystemExit, match=needle):
            vs.reread([dict(r) for r in rows], *bad)


def test_an_experiments_efficiency_model_reads_the_scaling_table_from_flags(tmp_path):
    # validate_scaling.py OUT --fitted NAME=VALUE --efficiency [DEVICE:]NAME=VALUE: the
    # record's DGX-1 row with the V100's convolutions at 0.3 of the Tensor Core peak runs
    # slower, and the result says which edit made it; so does a shared bandwidth share; a
    # shared parameter the V100 holds its own value of (tensor_gemm: its 0.604, which times
    # the classifier's GEMMs) leaves it exactly as shipped
    from conftest import ROOT, load_benchmark

    vs = load_benchmark("validate_scaling")
    lines = (ROOT / "benchmarks/validation/published_scaling.csv").read_text().splitlines(
        keepends=True)
    table = tmp_path / "one.csv"
    table.write_text(next(l for l in lines if l.startswith("id,"))
                     + next(l for l in lines if l.startswith("record-dgx1-v100-x8,")))

    def run(name, *flags):
        assert vs.main([str(table), str(tmp_path / name), *flags]) == 0
        saved = json.loads((tmp_path / name).read_text())
        return saved["config"]["efficiency_edits"], saved["results"]["rows"][0]

    assert run("shipped.json")[0] is None
    shipped = run("shipped.json")[1]["predicted_per_gpu"]
    edits, row = run("v100.json", "--efficiency", "v100-sxm2:tensor_conv=0.3")
    assert edits == {"fitted": {}, "devices": {"v100-sxm2": {"tensor_conv": 0.3}}}
    assert row["predicted_per_gpu"] < 0.9 * shipped
    assert run("memory.json", "--fitted", "memory=0.5")[1]["predicted_per_gpu"] < 0.9 * shipped
    edits, row = run("shared.json", "--fitted", "tensor_gemm=0.3")
    assert row["predicted_per_gpu"] == shipped and edits["fitted"] == {"tensor_gemm": 0.3}
    # the same share set over the V100's own (as `dlperf analyze --efficiency`) does slow it
    assert run("own.json", "--efficiency", "tensor_gemm=0.3")[1]["predicted_per_gpu"] < shipped
    with pytest.raises(SystemExit, match="its own OUT.json"):
        vs.main([str(table), "--fitted", "memory=0.5"])


def test_the_saved_scaling_table_is_current_and_holds_the_held_out_sources():
    # results/validation-scaling.json scores every row of the table as it stands (a row added
    # to the CSV without a rerun fails here), and the sources no fit has seen stay within 10%
    # per GPU: NVIDIA's PaddlePaddle ResNet-50 on 8 A100s (1.03x TF32, 1.07x AMP), and the
    # H200 FSDP runs at the GEMM share a lent H200 sustained (KempnerForge 0.96x/0.93x,
    # Trainy 0.95x/0.96x; 0.81-0.88x at the H100's). NVIDIA's PyTorch ResNet-50 AMP on 8
    # A100s, named in issue #14: within 10% (0.93x).
    from conftest import ROOT, load_benchmark

    vs = load_benchmark("validate_scaling")
    table = [r["id"] for r in vs.read_rows(ROOT / "benchmarks/validation/published_scaling.csv")]
    saved = json.loads((ROOT / "benchmarks/results/validation-scaling.json").read_text())
    rows = {r["id"]: r for r in saved["results"]["rows"]}
    assert sorted(rows) == sorted(table)
    held_out = ["dle-pd-rn50-a100-tf32-x8", "dle-pd-rn50-a100-amp-x8",
                "kf-llama3-8b-h200-fsdp2", "kf-llama3-8b-h200-fsdp4",
                "trainy-llama3-8b-h200-x32-float8", "trainy-llama3-8b-h200-x64-float8",
                "nvidia-pt-a100-x8-amp"]
    for name in held_out:
        assert abs(rows[name]["per_gpu_ratio"] - 1) < 0.10, name
    # NVIDIA's ConvNets tables of the 20.12 container (held out, 18 runs with the CPU loader):
    # one GPU to eight keeps 91-97% in FP32/TF32, which dlperf predicts within 8%, and 78-83%
    # in AMP, which it does not (98%: the host side, benchmarks/README.md)
    convnets_2012 = [r for r in rows.values() if r["source"] == "dle-convnets-2012"]
    assert len(convnets_2012) == 18
    assert rows["dle2012-rn50-a100-amp-x8"]["measured_efficiency"] == pytest.approx(
        15977 / 8 / 2461)
    for r in convnets_2012:
        if r["precision"] == "amp":
            assert 0.77 < r["measured_efficiency"] < 0.84 and r["efficiency_ratio"] > 1.15
        else:
            assert abs(r["efficiency_ratio"] - 1) < 0.08, r["id"]
    # NVIDIA's ConvNets tables of the 20.06 container (held out, 18 runs, DALI's CPU pipeline,
    # apex's DDP and static loss scale): every run's scaling within 13%, FP32/TF32 and ResNet-50
    # AMP within 3.1%, and in AMP each kept more of one GPU than the 20.12 run of the same model
    # and system with torch's DataLoader, DDP and GradScaler (ResNet-50 on the DGX-1 16GB:
    # 6,635.90 / 8 / 856.52 = 96.8% against 80.6%)
    convnets_2006 = [r for r in rows.values() if r["source"] == "dle-convnets-2006"]
    assert len(convnets_2006) == 18 and {r["loader"] for r in convnets_2006} == {"dali-cpu"}
    assert rows["dle2006-rn50-v100-16-amp-x8"]["measured_efficiency"] == pytest.approx(
        6635.90 / 8 / 856.52)
    for r in convnets_2006:
        assert abs(r["efficiency_ratio"] - 1) < 0.13, r["id"]
        if r["precision"] != "amp" or r["model"] == "resnet50":
            assert abs(r["efficiency_ratio"] - 1) < 0.031, r["id"]
        else:
            later = rows[r["id"].replace("dle2006", "dle2012")]
            assert r["measured_efficiency"] > later["measured_efficiency"] + 0.08, r["id"]
    for system in ("a100", "v100-16", "v100-32"):
        assert (rows[f"dle2006-rn50-{system}-amp-x8"]["measured_efficiency"]
                > rows[f"dle2012-rn50-{system}-amp-x8"]["measured_efficiency"] + 0.14)
    # NVIDIA's BERT-large tables of the 20.06 container (held out): SQuAD fine-tuning, 11 runs
    # under apex's DDP, lose most of what they lose at 4 GPUs (DGX-1 16G fp16: 183 / 4 / 50 =
    # 91.5%, dlperf 95.8%), and from 4 GPUs on the per-GPU rate follows the prediction within
    # 2.1% but on the DGX-2's 16 (6.5%); pre-training, 29 runs of one all-reduce per 20-460 s
    # step, scales within 6.5% of the prediction, and bert-large-pretrain's per-GPU rate on the
    # A100 is within 6% (V100: 0.87-1.33x)
    squad = [r for r in rows.values() if r["source"] == "dle-bert-2006" and "-squad-" in r["id"]]
    pretrain = [r for r in rows.values()
                if r["source"] == "dle-bert-2006" and r["model"] == "bert-large-pretrain"]
    assert len(squad) == 11 and len(pretrain) == 29
    assert rows["dle2006-bertL-squad-v100-16-fp16-x4"]["measured_efficiency"] == pytest.approx(
        183 / 4 / 50)
    for r in squad:
        assert 1.02 < r["efficiency_ratio"] < 1.16, r["id"]
        if r["gpus"] > 4:
            limit = 0.066 if r["gpus"] == 16 else 0.021
            assert abs(r["relative_ratio"] - 1) < limit, r["id"]
    for r in pretrain:
        assert abs(r["efficiency_ratio"] - 1) < 0.065, r["id"]
        if r["device"] == "a100-40gb":
            assert abs(r["per_gpu_ratio"] - 1) < 0.06, r["id"]
    # the Paddle runs' one-to-eight-GPU loss: none in TF32, 6.6% in AMP (DALI, CPU affinity)
    assert rows["dle-pd-rn50-a100-tf32-x8"]["measured_efficiency"] == pytest.approx(
        7955 / 8 / 993)
    assert rows["dle-pd-rn50-a100-amp-x8"]["measured_efficiency"] == pytest.approx(
        20267 / 8 / 2711)


def test_no_one_busier_host_launch_cost_explains_the_cpu_loader_runs():
    # results/experiment-host-launch.json (benchmarks/experiment_host_launch.py): for each of
    # the 46 eight-GPU rows of NVIDIA's PyTorch tables with the CPU loader, the host cost per
    # launch at which the predicted step added from one GPU to eight matches the measured one.
    # AMP rows match at 11-67 us, FP32/TF32 rows at 18-110 us or, every ResNet-50 one, not at
    # all: no one value serves the rows (benchmarks/README.md, "Is it the host's cost per
    # kernel launch?")
    from conftest import ROOT, load_benchmark

    saved = json.loads((ROOT / "benchmarks/results/experiment-host-launch.json").read_text())
    rows = saved["results"]["rows"]
    vs = load_benchmark("validate_scaling")
    table = {r["id"] for r in vs.read_rows(ROOT / "benchmarks/validation/published_scaling.csv")
             if r["source"] in saved["config"]["sources"] and r["gpus"] == 8
             and r["measured_single"]}
    assert {r["id"] for r in rows} == table and len(rows) == 46
    amp = [r["host_s_that_matches"] for r in rows
           if r["precision"] == "amp" and r["host_s_that_matches"]]
    other = [r for r in rows if r["precision"] != "amp"]
    matched = [r["host_s_that_matches"] for r in other if r["host_s_that_matches"]]
    assert len(amp) == 21 and max(amp) / min(amp) > 3
    assert len(matched) == 17 and max(matched) / min(matched) > 3
    unmatched = [r for r in other if not r["host_s_that_matches"]]
    assert len(unmatched) == 6 and {r["model"] for r in unmatched} == {"resnet50"}
    assert not any(r["over_at_shipped"] for r in unmatched)
    # every row's added step grows with the cost per launch (the bisection's premise)
    for r in rows:
        steps = list(r["added_ms_at_host_s"].values())
        assert steps == sorted(steps), r["id"]


def test_every_published_scaling_row_is_complete_and_runs(tmp_path):
    # the table's rows name known presets, models and interconnects, cite a source its header
    # explains, and one row of each source runs through the script that scores them (all 25
    # take ~40 s: `python benchmarks/validate_scaling.py` runs them)
    from conftest import ROOT, load_benchmark

    from dlperf.hardware.specs import get_device
    from dlperf.models.gpt import PRESETS as GPTS

    vs = load_benchmark("validate_scaling")
    table = ROOT / "benchmarks/validation/published_scaling.csv"
    text = table.read_text()
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    rows = vs.read_rows(table)
    assert len(rows) >= 20 and len({r["id"] for r in rows}) == len(rows)
    for row in rows:
        assert row["source"] in header, row["id"]
        assert row["measured_per_gpu"] > 0 and row["gpus"] > 1 and row["grad_accum"] >= 1
        assert row["strategy"] in ("ddp", "fsdp", "fsdp-grad-op", "hsdp")
        assert get_device(row["device"])
        assert row["model"] in GPTS or not row["model"].startswith(("mpt", "gpt"))
        for name in row["interconnect"].split(","):
            get_interconnect(name.strip())
    lines = text.splitlines(keepends=True)
    columns = next(l for l in lines if l.startswith("id,"))
    first = {}
    for line in lines:
        if not line.startswith(("#", "id,")):
            first.setdefault(next(csv.DictReader([columns, line]))["source"], line)
    sample = tmp_path / "sample.csv"
    sample.write_text(header + next(l for l in lines if l.startswith("id,"))
                      + "".join(first.values()))
    out = tmp_path / "v.json"
    assert vs.main([str(sample), str(out)]) == 0
    scored = json.loads(out.read_text())["results"]
    assert len(scored["rows"]) == len(first) >= 4
    assert all(r["predicted_per_gpu"] > 0 for r in scored["rows"])
    # the decoders are scored in tokens/s: within a factor of 2 of what was measured
    mpt = [r for r in scored["rows"] if r["model"].startswith("mpt")]
    assert mpt and all(0.5 < r["per_gpu_ratio"] < 2 for r in mpt)
    assert all(r["measured_efficiency"] for r in scored["rows"] if r["measured_single"])
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"  # the scatter, drawn


def test_scaling_table_flags_parse_to_bools_with_their_defaults(tmp_path):
    # cuda_graphs and overlap are optional true/false columns: blank means no graphs and DDP's
    # overlap; the parsed rows hold bools (what validate_published and the ablation read), and
    # anything else stops the script with the row named
    from conftest import ROOT, load_benchmark

    vs = load_benchmark("validate_scaling")
    table = ROOT / "benchmarks/validation/published_scaling.csv"
    lines = [line for line in table.read_text().splitlines(keepends=True)
             if not line.startswith("#")]
    header, row = lines[0], lines[1]
    columns = header.strip().split(",")
    assert {"cuda_graphs", "overlap"} <= set(columns)

    def with_flags(graphs: str, overlap: str) -> str:
        values = next(csv.reader([row]))
        values[columns.index("cuda_graphs")] = graphs
        values[columns.index("overlap")] = overlap
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerow(values)
        return out.getvalue()

    path = tmp_path / "t.csv"
    path.write_text(header + with_flags("", "") + with_flags("true", "false"))
    blank, set_ = vs.read_rows(path)
    assert (blank["cuda_graphs"], blank["overlap"]) == (False, True)
    assert (set_["cuda_graphs"], set_["overlap"]) == (True, False)
    path.write_text(header + with_flags("yes", ""))
    with pytest.raises(SystemExit, match=r"t\.csv: .*cuda_graphs must be true, false or blank"):
        vs.read_rows(path)


def test_memory_per_gpu_under_ddp_and_fsdp():
    from dlperf.analysis.scaling import memory_per_gpu

    # one GPU: weights 4 GB, gradients 4 GB, optimizer state 4 GB (SGD momentum), activations
    # 10 GB = 22 GB. fp32 gradients: two blocks of 1.5 GB (two modules each) and 0.5 GB, and
    # 0.5 GB outside them (an embedding: the root unit).
    memory = {"weights_bytes": 4e9, "gradients_bytes": 4e9, "optimizer_state_bytes": 4e9,
              "activations_bytes": 10e9, "total_bytes": 22e9}
    params = [("embed.weight", int(0.5e9)), ("blocks.0.attn.weight", int(1e9)),
              ("blocks.0.mlp.weight", int(0.5e9)), ("blocks.1.attn.weight", int(0.3e9)),
              ("blocks.1.mlp.weight", int(0.2e9)), ("blocks.2.attn.weight", int(1.5e9))]
    # DDP on 8: everything, plus buckets holding a second copy of the 4 GB of gradients
    assert memory_per_gpu(memory, params, "ddp", 8)["total_bytes"] == pytest.approx(26e9)
    assert memory_per_gpu(memory, params, "ddp", 1)["total_bytes"] == pytest.approx(22e9)
    # FSDP on 8: 12 GB of state / 8 = 1.5 GB, 10 GB of activations, and gathered: the root
    # 0.5 GB + 2 x the largest block 1.5 GB = 3.5 GB (before: 2 x the largest *module*,
    # blocks.2.attn, the same 3 GB here only because that block has one module)
    fsdp = memory_per_gpu(memory, params, "fsdp", 8)
    assert fsdp["gathered_bytes"] == pytest.approx(3.5e9)
    assert fsdp["total_bytes"] == pytest.approx(1.5e9 + 10e9 + 3.5e9)
    # gathered in bf16 under mixed precision (the whole model's 4 GB of fp32 is 2 GB): half
    assert memory_per_gpu(memory, params, "fsdp", 8, 2e9)["gathered_bytes"] == \
        pytest.approx(1.75e9)
    # no blocks: the whole model is the root unit, gathered once
    flat = [("a.weight", int(3e9)), ("b.weight", int(1e9))]
    assert memory_per_gpu(memory, flat, "fsdp", 8)["gathered_bytes"] == pytest.approx(4e9)
    assert memory_per_gpu(None, params, "fsdp", 8) is None


def test_memory_per_gpu_says_what_it_is_made_of(capsys):
    from conftest import run_cli

    from dlperf.analysis.html import memory_parts
    from dlperf.analysis.scaling import memory_per_gpu

    memory = {"weights_bytes": 4e9, "gradients_bytes": 4e9, "optimizer_state_bytes": 4e9,
              "activations_bytes": 10e9, "total_bytes": 22e9}
    params = [("blocks.0.w", int(3e9)), ("blocks.1.w", int(1e9))]
    parts = ("weights_bytes", "gradients_bytes", "optimizer_state_bytes", "activations_bytes")
    # DDP on 8: everything whole, and the buckets' second copy of the gradients (26 GB)
    ddp = memory_per_gpu(memory, params, "ddp", 8)
    assert [ddp[k] for k in parts] == [4e9, 4e9, 4e9, 10e9] and ddp["ddp_bucket_bytes"] == 4e9
    # the distributed optimizer beside a 2 GB half copy of the model: the fp32 masters and the
    # state 1/8 (0.5 GB each), the half copy whole (weights 2.5 GB), no buckets: 17 GB, as
    # 22 GB - ((4 + 4) x 7/8 - 2) was before the parts were kept
    do = memory_per_gpu(memory, params, "ddp", 8, bucket_view=True, optimizer_sharded=True,
                        model_copy_bytes=2e9)
    assert (do["weights_bytes"], do["optimizer_state_bytes"]) == (2.5e9, 0.5e9)
    assert do["total_bytes"] == pytest.approx(17e9)
    # FSDP on 8: each state 1/8, the gathered root (none) + 2 x the largest block (3 GB)
    fsdp = memory_per_gpu(memory, params, "fsdp", 8)
    assert [fsdp[k] for k in parts] == [0.5e9, 0.5e9, 0.5e9, 10e9]
    assert fsdp["gathered_bytes"] == 6e9 and fsdp["total_bytes"] == pytest.approx(17.5e9)
    for m in (ddp, do, fsdp):  # the parts add up to the total
        assert sum(v for k, v in m.items() if k.endswith("_bytes") and k not in (
            "total_bytes", "sharded_state_bytes")) == pytest.approx(m["total_bytes"])
    # 4e9 B = 3.73 GiB, 10e9 = 9.31 GiB; a part under a GiB in MiB, an absent one left out
    assert memory_parts(ddp) == (": weights 3.73 GiB, gradients 3.73 GiB, DDP's buckets "
                                 "3.73 GiB, optimizer state 3.73 GiB, activations 9.31 GiB")
    assert memory_parts(do) == (": weights 2.33 GiB, gradients 3.73 GiB, optimizer state "
                                "477 MiB, activations 9.31 GiB")
    code, out, err = run_cli(["analyze", "resnet18", "--train", "--batch-size", "32", "--gpus",
                              "8", "--top", "1"], capsys)
    assert code == 0, err
    # judged at the step's peak (the loss's and the backward's tensors in flight) beside the
    # total at rest, and the parts
    text = " ".join(out.split())
    assert "at the step's peak (" in text and "at rest): weights " in text
    assert " at rest, " in text and " at the peak (" in text


def test_memory_per_gpu_carries_the_steps_peak():
    from dlperf.analysis.html import memory_parts, memory_total
    from dlperf.analysis.pipeline import stage_memory
    from dlperf.analysis.scaling import memory_per_gpu

    # the footprint of the test above, with the activations at 16 GB at the step's peak (6 GB
    # in flight on top of the 10 GB saved): every GPU's total at the peak is 6 GB above its
    # total at rest, however the state is sharded
    memory = {"weights_bytes": 4e9, "gradients_bytes": 4e9, "optimizer_state_bytes": 4e9,
              "activations_bytes": 10e9, "total_bytes": 22e9, "activations_peak_bytes": 16e9,
              "peak_bytes": 28e9, "peak_at": "loss: _log_softmax_backward_data, dgrad"}
    params = [("blocks.0.w", int(3e9)), ("blocks.1.w", int(1e9))]
    ddp = memory_per_gpu(memory, params, "ddp", 8)  # 26 GB at rest (buckets 4 GB): 32 GB
    fsdp = memory_per_gpu(memory, params, "fsdp", 8)  # 17.5 GB at rest: 23.5 GB
    assert (ddp["peak_bytes"], fsdp["peak_bytes"]) == (pytest.approx(32e9),
                                                       pytest.approx(23.5e9))
    assert fsdp["activations_peak_bytes"] == 16e9 and fsdp["peak_at"] == memory["peak_at"]
    # the parts still add up to the total at rest (the peak's keys are not parts)
    assert sum(v for k, v in fsdp.items() if k.endswith("_bytes") and k not in (
        "total_bytes", "sharded_state_bytes", "peak_bytes", "activations_peak_bytes")) \
        == pytest.approx(fsdp["total_bytes"])
    # 23.5e9 B = 21.9 GiB, 17.5e9 = 16.3 GiB, 16e9 = 14.9 GiB
    assert memory_total(fsdp) == "~21.9 GiB at the step's peak (16.3 GiB at rest)"
    assert memory_parts(fsdp).endswith(", activations 9.31 GiB at rest, 14.9 GiB at the peak "
                                       "(loss: _log_softmax_backward_data, dgrad)")
    # without a peak (inference, a footprint made by hand): one figure, no peak part
    plain = memory_per_gpu({k: memory[k] for k in list(memory)[:5]}, params, "fsdp", 8)
    assert "peak_bytes" not in plain and memory_total(plain) == "~16.3 GiB"
    # a pipeline stage is judged at rest (its own in-flight tensors are not separated): a
    # total summed again from the parts does not take the peak's keys in
    stage = stage_memory(memory, 0.5)
    assert "peak_bytes" not in stage and stage["total_bytes"] == pytest.approx(16e9)


def _unit_collectives(params, ratio: float, gpus: int = 8) -> float:
    """NCCL's time for one collective per FSDP unit of ``params``, ``ratio`` of each unit's
    gradient bytes, on ``gpus`` H100s in nodes of 8 over NDR."""
    from dlperf.analysis.nccl import collective
    from dlperf.analysis.scaling import unit_bytes

    return sum(collective("allgather", b * ratio, gpus, 8, 370e9, "nvlink", 46e9, gen=2).seconds
               for b in unit_bytes(params).values())


def test_fsdp_gathers_bf16_parameters_and_reduces_fp32_gradients():
    analysis, params = _resnet18_on_h100()  # bf16 autocast, fp32 gradients
    nvlink = PRESETS["nvlink4-h100"]
    r = scale_out(analysis, params, ScaleConfig(gpus=8, strategy="fsdp"), nvlink, PRESETS["ib-ndr"])
    grads = sum(b for _, b in params)
    # two all-gathers of the 2-byte parameters (half the fp32 gradient bytes), one fp32
    # reduce-scatter, on one node's ring; one collective per unit: resnet18's 8 basic blocks
    # (layer1.0 .. layer4.1) and the root (stem, fc): 9 units, each timed as NCCL would
    assert r["communication"]["units"] == 9
    expected = 2 * _unit_collectives(params, 0.5) + _unit_collectives(params, 1.0)
    assert r["communication"]["comm_s"] == pytest.approx(expected)
    assert r["communication"]["all_gather_bytes"] == pytest.approx(2 * grads / 2 * 7 / 8)
    assert r["memory_per_gpu"]["total_bytes"] < analysis.memory["total_bytes"]


def test_collective_sms_beyond_the_gpu_stop_the_command_before_the_capture(capsys,
                                                                           monkeypatch):
    # the check runs with the other scale-out flags, before the model is traced (a large
    # model's capture takes minutes): a capture here would fail the test
    from conftest import run_cli

    from dlperf.analysis import capture as capture_mod

    def traced(*_a, **_k):
        raise AssertionError("the model was traced before --collective-sms was checked")

    monkeypatch.setattr(capture_mod, "capture", traced)
    code, out, err = run_cli(["analyze", "resnet18", "--train", "--gpus", "8",
                              "--device", "a100-80gb", "--collective-sms", "200"], capsys)
    assert code == 2 and "--collective-sms 200: a100-80gb has 108 SMs; choose 0" in err
    assert len(err.strip().splitlines()) == 1


def test_fsdp_reduce_dtype_bf16_halves_the_gradient_collectives_only():
    from dlperf.analysis.scaling import sharded_collective_s, unit_bytes

    analysis, params = _resnet18_on_h100()  # bf16 autocast, fp32 gradients
    node, net = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]
    grads = sum(b for _, b in params)
    units = unit_bytes(params)
    fp32, bf16 = (scale_out(analysis, params, ScaleConfig(gpus=32, strategy="hsdp",
                                                          reduce_dtype=d), node, net)
                  for d in (None, "bf16"))
    # FSDP1's MixedPrecision(reduce_dtype=bf16): per unit of b fp32 gradient bytes the
    # reduce-scatter moves b/2 and HSDP's all-reduce of the node's shard b/16; the parameter
    # gathers (b/2, bf16) are unchanged
    expected = sum(2 * sharded_collective_s(b / 2, 8, 8, node, net, gen=2)
                   + sharded_collective_s(b / 2, 8, 8, node, net, gen=2)
                   + allreduce_s(b / 16, 4, 1, node, net, gen=2) for b in units.values())
    assert bf16["communication"]["comm_s"] == pytest.approx(expected)
    assert bf16["communication"]["comm_s"] < fp32["communication"]["comm_s"]
    assert bf16["communication"]["reduce_scatter_bytes"] == pytest.approx(grads / 2 * 7 / 8)
    assert bf16["communication"]["allreduce_bytes"] == pytest.approx(grads / 16 * 2 * 3 / 4)
    assert bf16["communication"]["all_gather_bytes"] == pytest.approx(
        fp32["communication"]["all_gather_bytes"])
    # fp32 named is the default; DDP and an unknown dtype are refused, one line each
    same = scale_out(analysis, params, ScaleConfig(gpus=32, strategy="hsdp",
                                                   reduce_dtype="fp32"), node, net)
    assert same["communication"]["comm_s"] == pytest.approx(fp32["communication"]["comm_s"])
    with pytest.raises(DlperfError, match="use it with --distributed-optimizer, or with "
                                          "--strategy fsdp, hsdp or fsdp-grad-op"):
        ScaleConfig(gpus=8, reduce_dtype="bf16")
    with pytest.raises(DlperfError, match="choose fp32, bf16, fp16"):
        ScaleConfig(gpus=8, strategy="fsdp", reduce_dtype="int8")


def test_hsdp_shards_in_the_node_and_all_reduces_the_shards_between_nodes():
    from dlperf.analysis.scaling import sharded_collective_s, unit_bytes

    analysis, params = _resnet18_on_h100()  # bf16 autocast, fp32 gradients
    node, net = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]
    grads = sum(b for _, b in params)
    units = unit_bytes(params)
    hsdp = scale_out(analysis, params, ScaleConfig(gpus=32, strategy="hsdp"), node, net)
    comm = hsdp["communication"]
    # per unit of b gradient bytes: two all-gathers of its b/2 bf16 parameters and one
    # reduce-scatter of b, all inside the node (8 GPUs, NVLink), then the node's 1/8 shard,
    # b/8, all-reduced by the 4 nodes' GPUs holding it (one per node: the network)
    expected = sum(2 * sharded_collective_s(b / 2, 8, 8, node, net, gen=2)
                   + sharded_collective_s(b, 8, 8, node, net, gen=2)
                   + allreduce_s(b / 8, 4, 1, node, net, gen=2) for b in units.values())
    assert comm["comm_s"] == pytest.approx(expected)
    assert comm["replicas"] == 4
    # bytes each GPU sends: the node's ring (7/8 of each buffer), then the shard's all-reduce
    # between 4 replicas (2 x 3/4 of grads / 8)
    assert comm["all_gather_bytes"] == pytest.approx(2 * grads / 2 * 7 / 8)
    assert comm["reduce_scatter_bytes"] == pytest.approx(grads * 7 / 8)
    assert comm["allreduce_bytes"] == pytest.approx(grads / 8 * 2 * 3 / 4)
    # state sharded over the node's 8 GPUs, not the 32: as FSDP on 8 GPUs
    fsdp8 = scale_out(analysis, params, ScaleConfig(gpus=8, strategy="fsdp"), node, net)
    fsdp32 = scale_out(analysis, params, ScaleConfig(gpus=32, strategy="fsdp"), node, net)
    assert hsdp["memory_per_gpu"]["total_bytes"] == pytest.approx(
        fsdp8["memory_per_gpu"]["total_bytes"])
    assert hsdp["memory_per_gpu"]["total_bytes"] > fsdp32["memory_per_gpu"]["total_bytes"]
    # one node: HSDP is FSDP
    one = scale_out(analysis, params, ScaleConfig(gpus=8, strategy="hsdp"), node, net)
    assert one["communication"]["comm_s"] == pytest.approx(fsdp8["communication"]["comm_s"])
    assert "replicas" not in one["communication"]
    # a replica per node: the GPUs must fill whole nodes, one line that says so
    with pytest.raises(DlperfError, match="--strategy hsdp: 12 GPUs do not fill nodes of 8"):
        ScaleConfig(gpus=12, strategy="hsdp")
    # the curve keeps the scales HSDP can run (whole nodes, or one partial node)
    curve = scaling_curve(analysis, params, ScaleConfig(gpus=12, gpus_per_node=6,
                                                        strategy="hsdp"), node, net)
    assert [r["gpus"] for r in curve] == [1, 2, 4]


def test_fsdp_across_nodes_runs_one_flat_ring_at_the_nodes_nics():
    from dlperf.analysis.scaling import sharded_collective_s

    node, net = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]  # 370 / 46 GB/s
    # 16 GB all-gathered by 128 GPUs, 8 per node, in 33 collectives of 484.8 MB. NCCL's flat
    # ring leaves each node through its 8 NICs at once: bus bandwidth min(370, 8 x 46) = 368
    # GB/s. LL128: 0.92 x 368 x 128/127 = 341.2 GB/s, 1,420.9 us a collective; latency 14 +
    # (127 - 15) x max(1.9, 1) + 15 x 4.0 = 286.8 us (Simple: 8.4 + 112 x 3.4 + 15 x 14 =
    # 599.2 us, at 370.9 GB/s, 1,307.2 us: 1,906.4 us): 33 x 1,707.7 us
    t = sharded_collective_s(16e9, 128, 8, node, net, calls=33, gen=2)
    assert t == pytest.approx(33 * 1707.7e-6, rel=1e-4)
    # one node: a ring over NVLink, Simple for so large a buffer (8.4 + 7 x 3.4 us)
    assert sharded_collective_s(16e9, 8, 8, node, net, gen=2) == pytest.approx(
        16e9 * 7 / 8 / 370e9 + 32.2e-6)
    assert sharded_collective_s(16e9, 1, 8, node, net) == 0.0
    # over a transport that is not NCCL's (gloo), inside the node then the node's 1/8 share
    # between the nodes, each with its own latency a step
    plain = Interconnect("g", "gloo", 370e9, 2e-6, "node", "test")
    far = Interconnect("w", "wan", 46e9, 6e-6, "network", "test")
    inside, between = 16e9 * 7 / 8 / 370e9, 2e9 * 15 / 16 / 46e9
    assert sharded_collective_s(16e9, 128, 8, plain, far, calls=33) == pytest.approx(
        inside + between + 33 * (7 * 2e-6 + 15 * 6e-6))


def _kernels(*runs):
    from types import SimpleNamespace

    return [SimpleNamespace(cost=SimpleNamespace(phase=phase, module=module), time_s=t)
            for phase, module, t in runs]


# a root (embedding "wte", head "head") around two blocks: forward 1 + 2 + 2 + 1 s, backward
# 2 + 4 + 4 + 2 s (the head's backward first, the embedding's last), 18 s of compute
_STEP = _kernels(("forward", "wte", 1.0), ("forward", "blocks.0.mlp", 2.0),
                 ("forward", "blocks.1.mlp", 2.0), ("forward", "head", 1.0),
                 ("dgrad", "head", 2.0), ("dgrad", "blocks.1.mlp", 2.0),
                 ("wgrad", "blocks.1.mlp", 2.0), ("dgrad", "blocks.0.mlp", 4.0),
                 ("wgrad", "wte", 2.0), ("optimizer", "", 3.0))
_UNITS = {"": 10, "blocks.0": 10, "blocks.1": 10}


def test_fsdp_pipeline_hides_what_prefetch_can_and_exposes_the_ends():
    from dlperf.analysis.scaling import fsdp_pipeline_s

    # gathers of 1 s, reduce-scatters of 1.5 s. Forward: root gathered 0-1, wte 1-2 (block 0
    # gathered 1-2), block 0 2-4 (block 1 gathered 2-3), block 1 4-6, head 6-7. Backward:
    # block 1 gathered 7-8 beside the head's 7-9; block 1 9-13 (block 0 gathered 9-10), its
    # reduce-scatter 13-14.5; block 0 13-17, reduce-scatter 17-18.5; wte 17-19, the root's
    # reduce-scatter 19-20.5: 20.5 s for 18 of compute, 2.5 exposed (the root's gather and the
    # last reduce-scatter); SHARD_GRAD_OP the same here (its gathers were hidden anyway)
    full = fsdp_pipeline_s(_STEP, _UNITS, lambda u: 1.0, lambda u: 1.5)
    assert full == {"compute_s": 18.0, "end_s": 20.5, "exposed_s": 2.5}
    assert fsdp_pipeline_s(_STEP, _UNITS, lambda u: 1.0, lambda u: 1.5,
                           regather=False)["exposed_s"] == 2.5
    # gathers of 5 s: forward root 0-5, wte 5-6 (block 0 gathered 5-10), block 0 10-12
    # (block 1 10-15), block 1 15-17, head 17-18. Full sharding: block 1 again 18-23 beside
    # the head's 18-20, block 1 23-27 (block 0 23-28), its reduce-scatter 28-29.5; block 0
    # 28-32, reduce-scatter 32-33.5; wte 32-34, the root's 34-35.5: 17.5 s exposed.
    # SHARD_GRAD_OP keeps the parameters: backward 18-30 unstalled, reduce-scatters 24-25.5,
    # 28-29.5 and 30-31.5: 13.5 s exposed
    slow = fsdp_pipeline_s(_STEP, _UNITS, lambda u: 5.0, lambda u: 1.5)
    assert slow["end_s"] == 35.5 and slow["exposed_s"] == 17.5
    grad_op = fsdp_pipeline_s(_STEP, _UNITS, lambda u: 5.0, lambda u: 1.5, regather=False)
    assert grad_op["end_s"] == 31.5 and grad_op["exposed_s"] == 13.5
    # no communication: nothing exposed
    assert fsdp_pipeline_s(_STEP, _UNITS, lambda u: 0.0, lambda u: 0.0)["exposed_s"] == 0.0


def test_fsdp_units_are_the_blocks_of_a_module_list():
    from dlperf.analysis.scaling import fsdp_units
    from dlperf.models.gpt import GPT, gpt_config

    with torch.device("meta"):
        gpt = GPT(gpt_config("gpt", layers=5))
    params = [(n, p.numel()) for n, p in gpt.named_parameters()]
    assert fsdp_units(params) == 6  # blocks.0 .. blocks.4, and the root (embeddings, ln_f)
    assert fsdp_units([("weight", 1), ("bias", 1)]) == 1


def test_blocks_are_numbered_series_of_siblings_whatever_their_names():
    # torchvision's ViT names its layers encoder_layer_0 .. _11 in a Sequential: the first
    # bare number in a path is inside each layer's MLP (mlp.0, mlp.3), so before, FSDP's units
    # were 24 lone Linear layers and the root held every attention and norm (34.5% of the
    # parameters), and checkpointing replayed only those Linears
    import torchvision

    from dlperf.analysis.capture import block_path, block_paths
    from dlperf.analysis.scaling import unit_bytes

    with torch.device("meta"):
        vit = torchvision.models.vit_b_16()
        resnet = torchvision.models.resnet50()
        densenet = torchvision.models.densenet121()
    blocks = block_paths(n for n, _ in vit.named_parameters())
    assert blocks == {f"encoder.layers.encoder_layer_{i}" for i in range(12)}
    assert block_path("encoder.layers.encoder_layer_3.self_attention", blocks) == \
        "encoder.layers.encoder_layer_3"
    assert block_path("encoder.ln", blocks) == "" and block_path("", blocks) == ""
    units = unit_bytes([(n, p.numel()) for n, p in vit.named_parameters()])
    # the root: conv_proj 590,592 + class token 768 + position embedding 151,296 + final
    # LayerNorm 1,536 + head 769,000 = 1,513,192 of 86,567,656
    assert len(units) == 13 and units[""] == 1_513_192
    # ResNet's root mixes conv1, bn1, layer1 .. layer4 and fc: no series there; its blocks
    # are the 16 bottlenecks (as before); DenseNet's are its 58 dense layers, named
    # denselayer1 .. denselayerN inside each dense block (before: one unit, the root)
    assert block_paths(n for n, _ in resnet.named_parameters()) == {
        f"layer{s}.{i}" for s, n in zip((1, 2, 3, 4), (3, 4, 6, 3)) for i in range(n)}
    dense = block_paths(n for n, _ in densenet.named_parameters())
    assert len(dense) == 6 + 12 + 24 + 16 and "features.denseblock4.denselayer16" in dense
    # one item of a module list is a block; one named layer alone is not a series
    assert block_paths(["blocks.0.w"]) == {"blocks.0"}
    assert block_paths(["head_1.w", "conv.w"]) == frozenset()
    # and ViT checkpoints and shards by those layers end to end
    import dlperf

    analysis = dlperf.analyze(vit, (8, 3, 224, 224), device="h100-sxm", dtype="bf16",
                              train=True, activation_checkpointing=True)
    recomputed = {block_path(p.cost.module, blocks) for p in analysis.predictions
                  if p.cost.phase == "recompute"}
    assert recomputed == blocks


def test_grad_accumulation_and_sharded_optimizer_in_the_step():
    analysis, params = _resnet18_on_h100()
    tl = timeline(analysis.predictions)
    single = analysis.totals()["predicted_time_s"]
    micro = single - tl.optimizer_s
    node, net = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]
    # one GPU, 4 micro-batches: four forward+backward passes and one optimizer step
    one = scale_out(analysis, params, ScaleConfig(gpus=1, grad_accum=4), node, net)
    assert one["step_s"] == pytest.approx(4 * micro + tl.optimizer_s)
    assert one["per_gpu_samples_per_s"] == pytest.approx(4 * 64 / (4 * micro + tl.optimizer_s))
    assert one["scaling_efficiency"] == pytest.approx(1.0)
    # DDP: the all-reduce once per optimizer step (no_sync on the first three)
    # (step_cv=0: no wait for the slowest GPU, collective_sms=0: the compute beside the
    # collectives at full speed, so the step adds up by hand)
    ddp1 = scale_out(analysis, params, ScaleConfig(gpus=8, step_cv=0.0, collective_sms=0),
                     node, net)
    ddp4 = scale_out(analysis, params, ScaleConfig(gpus=8, grad_accum=4, step_cv=0.0,
                                                   collective_sms=0), node, net)
    assert ddp4["exposed_comm_s"] == pytest.approx(ddp1["exposed_comm_s"])
    assert ddp4["step_s"] == pytest.approx(4 * micro + tl.optimizer_s + ddp1["exposed_comm_s"])
    # FSDP: each GPU updates its 1/8 shard; its collectives run on every micro-batch
    fsdp = scale_out(analysis, params, ScaleConfig(gpus=8, strategy="fsdp", grad_accum=4,
                                                   step_cv=0.0, collective_sms=0), node, net)
    assert fsdp["communication"]["optimizer_s"] == pytest.approx(tl.optimizer_s / 8)
    # (exposed on each micro-batch: the unit-by-unit pipeline of fsdp_pipeline_s)
    from dlperf.analysis.scaling import fsdp_pipeline_s, sharded_collective_s, unit_bytes

    grads = unit_bytes(params)

    def coll(nbytes):
        return sharded_collective_s(nbytes, 8, 8, node, net, gen=2)  # an H100: Hopper

    pipe = fsdp_pipeline_s(analysis.predictions, grads, lambda u: coll(grads[u] / 2),
                           lambda u: coll(grads[u]))
    assert pipe["exposed_s"] > 0  # the root's first all-gather and the last reduce-scatter
    assert fsdp["exposed_comm_s"] == pytest.approx(4 * pipe["exposed_s"])
    assert fsdp["step_s"] == pytest.approx(4 * (micro + pipe["exposed_s"]) + tl.optimizer_s / 8)
    with pytest.raises(DlperfError, match="--grad-accum"):
        ScaleConfig(gpus=8, grad_accum=0)


def test_comm_timer_measures_exposed_and_busy_time_from_bucket_marks():
    from dlperf.train.commtime import CommTimer

    timer = CommTimer(torch.device("cpu"))
    assert timer.take() is None and timer.summary() == {}
    # three buckets (host clock, seconds): ready/done at 0/10 ms, 5/20 ms, 30/32 ms. The last
    # bucket is ready at 30 ms (the backward's end) and done at 32: 2 ms exposed. The network
    # was busy 0-20 and 30-32: 22 ms.
    timer.marks = [(0.0, 0.010, 100), (0.005, 0.020, 200), (0.030, 0.032, 50)]
    got = timer.take()
    assert got["comm_exposed_ms"] == pytest.approx(2.0)
    assert got["comm_busy_ms"] == pytest.approx(22.0)
    assert got["comm_buckets"] == 3 and got["comm_bytes"] == 350 and timer.marks == []
    # a bucket finishing before the last one is ready exposes nothing
    timer.marks = [(0.0, 0.001, 8), (0.004, 0.004, 8)]
    assert timer.take()["comm_exposed_ms"] == 0.0
    assert timer.summary() == {"comm_exposed_ms_median": pytest.approx(1.0),
                               "comm_steps_measured": 2}
    # across ranks: this rank exposed 5 ms, the others 2 and 3.5 (their backward ended later).
    # The least exposed is the communication alone, this rank waited 5 - 2 = 3 ms for the
    # slowest, and the ranks' sample spread is stdev(5, 2, 3.5) = 1.5 ms
    got = timer.across_ranks({"comm_exposed_ms": 5.0}, [5.0, 2.0, 3.5])
    assert got["comm_exposed_min_ms"] == 2.0 and got["comm_wait_ms"] == 3.0
    assert got["rank_spread_ms"] == pytest.approx(1.5)
    s = timer.summary()
    assert s["comm_wait_ms_median"] == 3.0 and s["rank_spread_ms_median"] == pytest.approx(1.5)
    # one process gathers only its own
    from dlperf.train.distributed import DistInfo, all_gather_floats

    assert all_gather_floats([1.5, 2.0], DistInfo()) == [[1.5, 2.0]]


def test_shard_grad_op_gathers_once_and_keeps_the_parameters():
    from dlperf.analysis.scaling import memory_per_gpu

    analysis, params = _resnet18_on_h100()  # bf16 autocast, fp32 gradients
    node, net = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]
    full = scale_out(analysis, params, ScaleConfig(gpus=8, strategy="fsdp"), node, net)
    zero2 = scale_out(analysis, params, ScaleConfig(gpus=8, strategy="fsdp-grad-op"), node, net)
    grads = sum(b for _, b in params)
    # one all-gather of the 2-byte parameters instead of two; the same reduce-scatter
    assert zero2["communication"]["all_gather_bytes"] == pytest.approx(grads / 2 * 7 / 8)
    assert full["communication"]["all_gather_bytes"] == pytest.approx(2 * grads / 2 * 7 / 8)
    assert zero2["communication"]["reduce_scatter_bytes"] == full["communication"][
        "reduce_scatter_bytes"]
    assert full["communication"]["comm_s"] - zero2["communication"]["comm_s"] == pytest.approx(
        _unit_collectives(params, 0.5))
    # memory: the same shards, plus the whole model gathered in bf16 (not 2 x the largest
    # module); the optimizer step on 1/8 of the parameters in both
    memory = {"weights_bytes": 4e9, "gradients_bytes": 4e9, "optimizer_state_bytes": 8e9,
              "activations_bytes": 10e9, "total_bytes": 26e9}
    shards = [("a.weight", int(3e9)), ("b.weight", int(1e9))]
    m = memory_per_gpu(memory, shards, "fsdp-grad-op", 8, gathered_bytes=2e9)
    assert m["total_bytes"] == pytest.approx(16e9 / 8 + 10e9 + 2e9)
    assert zero2["communication"]["optimizer_s"] == full["communication"]["optimizer_s"]


def test_no_overlap_and_batch_norm_groups_add_to_the_exposed_time():
    analysis, params = _resnet18_on_h100()
    nvlink, ndr = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]
    base = scale_out(analysis, params, ScaleConfig(gpus=16), nvlink, ndr)
    late = scale_out(analysis, params, ScaleConfig(gpus=16, overlap=False), nvlink, ndr)
    # no overlap (Horovod after the backward): ResNet-18's 46.8 MB of gradients in one 64 MiB
    # fusion buffer (DDP's overlap uses three buckets), its all-reduce exposed whole, and so
    # are the copies into and out of it
    comm = late["communication"]
    assert comm["overlap"] is False
    assert comm["buckets"] == 1 and base["communication"]["buckets"] == 3
    assert comm["bucket_bytes"] == [sum(b for _, b in params)]
    assert late["exposed_comm_s"] == pytest.approx(comm["comm_s"] + comm["bucket_copy_s"])
    assert late["exposed_comm_s"] > base["exposed_comm_s"]
    assert late["per_gpu_samples_per_s"] < base["per_gpu_samples_per_s"]
    # synchronised batch norm in pairs: ResNet-18's 20 batch norms each exchange their sums in
    # the forward and the backward, 2 (g - 1) = 2 ring steps of NVLink's 2 us: 20 x 2 x 2 x 2 us
    grouped = scale_out(analysis, params, ScaleConfig(gpus=16, bn_group=2), nvlink, ndr)
    assert grouped["communication"]["bn_sync_s"] == pytest.approx(160e-6)
    assert grouped["exposed_comm_s"] == pytest.approx(base["exposed_comm_s"] + 160e-6)
    # one GPU has no partner: nothing to exchange
    one = scale_out(analysis, params, ScaleConfig(gpus=1, bn_group=2), nvlink, ndr)
    assert one["communication"]["bn_sync_s"] == 0.0
    with pytest.raises(DlperfError, match="--bn-group 16"):
        ScaleConfig(gpus=16, bn_group=16)
    # groups tile a node: 3 GPUs do not divide 8 (2, 4 and 8 do; 3 divides a 6-GPU node)
    with pytest.raises(DlperfError, match="--bn-group 3: .*divisor of 8"):
        ScaleConfig(gpus=16, bn_group=3)
    assert ScaleConfig(gpus=12, gpus_per_node=6, bn_group=3).bn_group == 3


def test_bucket_cap_sizes_ddp_s_all_reduces():
    # ResNet-18's 46.8 MB (11,689,512 fp32 gradients) by DDP's bucket_cap_mb: 100 MiB holds
    # them all, so the one all-reduce waits for the end of the backward and is exposed whole;
    # 5 MiB (given, the first bucket is 5 MiB too) gives more, smaller buckets than the
    # default's 3 (1 MiB first, then 25 MiB)
    analysis, params = _resnet18_on_h100()
    nvlink, ndr = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]
    total = sum(b for _, b in params)
    assert total == 11_689_512 * 4
    one = scale_out(analysis, params, ScaleConfig(gpus=8, bucket_cap_mb=100), nvlink, ndr)
    comm = one["communication"]
    assert comm["bucket_bytes"] == [total]
    from dlperf.analysis.nccl import collective

    assert comm["exposed_s"] == pytest.approx(
        collective("allreduce", total, 8, 8, 370e9, "nvlink", None, gen=2).seconds)
    small = scale_out(analysis, params, ScaleConfig(gpus=8, bucket_cap_mb=5), nvlink, ndr)
    sizes = small["communication"]["bucket_bytes"]
    assert sum(sizes) == total and len(sizes) > 3
    assert all(b >= 5 * MiB for b in sizes[:-1])  # each closes once it holds 5 MiB
    # the default is DDP's: 1 MiB, then 25 MiB
    assert scale_out(analysis, params, ScaleConfig(gpus=8), nvlink, ndr)[
        "communication"]["buckets"] == 3
    with pytest.raises(DlperfError, match="--bucket-cap-mb and --grad-as-bucket-view shape"):
        ScaleConfig(gpus=8, strategy="fsdp", bucket_cap_mb=25)
    with pytest.raises(DlperfError, match="--grad-as-bucket-view shape DDP's"):
        ScaleConfig(gpus=8, strategy="fsdp", bucket_view=True)
    # gradient_as_bucket_view: no copies in and out of the buckets (4 x 46.8 MB of traffic at
    # the H100's streaming bandwidth in the default), and no second copy of the gradients
    base = scale_out(analysis, params, ScaleConfig(gpus=8), nvlink, ndr)
    view = scale_out(analysis, params, ScaleConfig(gpus=8, bucket_view=True), nvlink, ndr)
    assert view["communication"]["bucket_copy_s"] == 0.0
    assert base["communication"]["bucket_copy_s"] == pytest.approx(
        4 * total / analysis.efficiency.bandwidth(analysis.device))
    assert view["exposed_comm_s"] == pytest.approx(
        base["exposed_comm_s"] - base["communication"]["bucket_copy_s"])
    assert base["memory_per_gpu"]["total_bytes"] - view["memory_per_gpu"]["total_bytes"] == \
        pytest.approx(total)
    with pytest.raises(DlperfError, match="positive number of MiB"):
        ScaleConfig(gpus=8, bucket_cap_mb=float("nan"))

def test_nccl_algo_and_proto_reach_every_collective_of_the_step():
    analysis, params = _resnet18_on_h100()
    node, net = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]
    free = scale_out(analysis, params, ScaleConfig(gpus=512), node, net)
    assert free["communication"]["nccl"] == "tree/LL128"  # NCCL's own pick at 64 nodes
    # NCCL_ALGO=Ring NCCL_PROTO=Simple: a flat ring of 1,022 steps, slower than the tree
    ring = scale_out(analysis, params, ScaleConfig(gpus=512, nccl_algo="Ring",
                                                   nccl_proto="Simple"), node, net)
    assert ring["communication"]["nccl"] == "ring/Simple"
    assert ring["communication"]["comm_s"] > free["communication"]["comm_s"]
    # FSDP's all-gathers have no tree: NCCL_ALGO=Tree fails them, with the flag named
    with pytest.raises(DlperfError, match="--nccl-algo.*no way to run allgather"):
        scale_out(analysis, params, ScaleConfig(gpus=16, strategy="fsdp", nccl_algo="tree"),
                  node, net)


def test_expected_maximum_of_normals_against_closed_forms_and_sampling():
    # closed forms: E[max of 2] = 1/sqrt(pi), E[max of 3] = 3 / (2 sqrt(pi)); tabulated (Harter,
    # 1961): 1.16296 for 5, 1.53875 for 10
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-6)
    assert expected_max_normal(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), abs=1e-6)
    assert expected_max_normal(5) == pytest.approx(1.16296, abs=1e-5)
    assert expected_max_normal(10) == pytest.approx(1.53875, abs=1e-5)
    # independently, by sampling: the mean maximum of 8 and of 512 normals over 100,000 draws
    # (standard error ~0.002)
    g = torch.Generator().manual_seed(0)
    for n in (8, 512):
        sampled = torch.randn(100_000, n, generator=g).amax(dim=1).mean().item()
        assert expected_max_normal(n) == pytest.approx(sampled, abs=0.01)
    values = [expected_max_normal(n) for n in (2, 8, 64, 4096)]
    assert values == sorted(values) and 3.5 < values[-1] < 3.7  # grows like sqrt(2 ln n)


def test_every_synchronous_step_waits_for_the_slowest_gpu():
    analysis, params = _resnet18_on_h100()
    nvlink, ndr = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]
    one = scale_out(analysis, params, ScaleConfig(gpus=1, step_cv=0.02), nvlink, ndr)
    assert one["straggler_s"] == 0.0 and one["scaling_efficiency"] == 1.0
    # 8 GPUs, each step spread 2%: the step waits 0.02 x 1.4236 of one GPU's step for the
    # slowest, on top of the exposed communication
    still = scale_out(analysis, params, ScaleConfig(gpus=8, step_cv=0.0), nvlink, ndr)
    spread = scale_out(analysis, params, ScaleConfig(gpus=8, step_cv=0.02), nvlink, ndr)
    assert still["straggler_s"] == 0.0
    assert spread["straggler_s"] == pytest.approx(one["single_gpu_step_s"] * 0.02 * 1.42360,
                                                  rel=1e-4)
    assert spread["step_s"] == pytest.approx(still["step_s"] + spread["straggler_s"])
    assert spread["exposed_comm_s"] == pytest.approx(still["exposed_comm_s"])
    # the default is the fitted spread; the loss grows with the GPU count
    default = scale_out(analysis, params, ScaleConfig(gpus=8), nvlink, ndr)
    assert default["step_cv"] == STEP_CV
    curve = scaling_curve(analysis, params, ScaleConfig(gpus=1, step_cv=0.02), nvlink, ndr)
    waits = [c["straggler_s"] for c in curve]
    assert waits == sorted(waits) and waits[0] == 0.0
    with pytest.raises(DlperfError, match="--step-cv 0.7"):
        ScaleConfig(gpus=8, step_cv=0.7)


def test_the_shipped_step_spread_is_the_fitted_one():
    # benchmarks/fit_straggler.py's saved fit: the grid's best cv is STEP_CV, every source held
    # out picks a cv within a grid step or two of it, and the fit improves the clean rows'
    # scaling and relative scaling in-sample and held out by source
    from conftest import ROOT

    saved = json.loads((ROOT / "benchmarks/results/straggler-fit.json").read_text())["results"]
    assert saved["fitted_cv"] == STEP_CV
    clean = saved["clean"]
    assert all(abs(h["cv"] - STEP_CV) <= 0.005 for h in clean["held_out_by_source"].values())
    assert clean["median_abs_error"] < clean["median_abs_error_cv0"]
    assert clean["held_out_median_abs_error"] < clean["median_abs_error_cv0"]
    assert saved["flagged"]["median_abs_error"] < saved["flagged"]["median_abs_error_cv0"]


@pytest.mark.slow
def test_the_input_side_benchmark_runs_and_predicts_as_the_model_does(tmp_path):
    # benchmarks/bench_input_side_cpu.py --quick on a generated corpus: real decoding in 1 and
    # 2 barrier-synchronised processes; every row's prediction is the model's own
    import subprocess
    import sys

    from conftest import ROOT
    from imagegen import make_folder

    corpus = make_folder(tmp_path / "c", classes=2, per_class=40, size=(120, 160))
    out = tmp_path / "input.json"
    script = ROOT / "benchmarks" / "bench_input_side_cpu.py"
    run = subprocess.run([sys.executable, str(script), str(corpus), str(out), "--quick"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    data = json.loads(out.read_text())
    rows = data["results"]["rows"]
    assert [(r["ranks"], r["gpu_demand"]) for r in rows] == [(1, 0.5), (1, 2.0), (2, 0.5),
                                                              (2, 2.0)]
    for r in rows:
        assert r["img_per_s_per_rank"] > 0
        slower = 32 / min(r["gpu_img_per_s"], r["host_img_per_s_predicted"])
        wait = slower * STEP_CV * expected_max_normal(r["ranks"])
        assert r["predicted_img_per_s"] == pytest.approx(32 / (slower + wait))
    # a corpus with less than one batch per rank is refused, not spun on forever
    small = make_folder(tmp_path / "s", classes=1, per_class=5, size=(64, 64))
    run = subprocess.run([sys.executable, str(script), str(small), str(out), "--quick"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "needs at least 64" in run.stderr


def test_roce_200g_is_a_200_gbe_nic_per_gpu():
    """MosaicML's A100 tables ran on '1600 Gbps node-node interconnect (RoCE)' for 8 GPUs:
    one 200 Gb/s NIC per GPU. Hand-computed: 200e9 / 8 bytes x 0.92 (NCCL over RDMA, the
    network presets' estimate) = 23.0 GB/s busbw per GPU, half of roce-400g's 46.0."""
    roce = PRESETS["roce-200g"]
    assert roce.scope == "network" and roce.nccl == "net"
    assert roce.bus_bandwidth == pytest.approx(23.0e9)
    assert roce.bus_bandwidth * 2 == pytest.approx(PRESETS["roce-400g"].bus_bandwidth)
    assert roce.latency_s == PRESETS["roce-400g"].latency_s  # Ethernet's, not InfiniBand's


def test_ddp_broadcasts_the_buffers_before_every_forward():
    # DistributedDataParallel(broadcast_buffers=True), torch's default: before a forward that
    # follows a synchronised backward it broadcasts the module's buffers from rank 0, per dtype
    # one flattened tensor, then copies each back (c10d broadcast_coalesced)
    import torchvision

    import dlperf
    from dlperf.analysis.nccl import collective
    from dlperf.analysis.scaling import buffer_broadcast_s, module_buffers

    model = torchvision.models.resnet50()
    # 53 batch norms over 26,560 channels: running mean and variance, 2 x 26,560 x 4 B, and a
    # batch count each (int64)
    buffers = module_buffers(model)
    assert buffers == (("float32", 106, 212480), ("int64", 53, 424))
    a100, hdr = PRESETS["nvlink3-a100"], PRESETS["ib-hdr"]
    # 8 GPUs, the GPU not waiting for the CPU: two broadcasts (NCCL's ring, LL) and 161
    # kernels (159 copies, a cat per dtype) at 0.5 us each
    b = buffer_broadcast_s(buffers, 8, 8, a100, hdr, 1, 0.5e-6, 0.0)
    two = sum(collective("broadcast", n, 8, 8, a100.bus_bandwidth, "nvlink", None, 1).seconds
              for n in (212480, 424))
    assert b["kernels"] == 161 and b["broadcast_s"] == pytest.approx(two)
    assert b["seconds"] == pytest.approx(two + 161 * 0.5e-6)
    # after a host synchronisation (GradScaler's wait) the GPU waits for the CPU's 161 issues,
    # 10 us each, which outlast the broadcasts: 1.61 ms
    assert buffer_broadcast_s(buffers, 8, 8, a100, hdr, 1, 0.5e-6, 10e-6)["seconds"] == (
        pytest.approx(1.61e-3))
    # on 1,024 GPUs the ring's latency, one step per GPU, is the larger: 1,256.9 us for the FP32
    # buffers alone (tests/test_nccl.py)
    big = buffer_broadcast_s(buffers, 1024, 8, a100, hdr, 1, 0.5e-6, 10e-6)
    assert big["broadcast_s"] > 1.25e-3 and big["seconds"] > 1.61e-3

    # In a scale-out the forward waits for it: exposed, and removed by broadcast_buffers=False
    analysis = dlperf.analyze(model, (64, 3, 224, 224), device="a100-80gb", dtype="bf16",
                              train=True)
    params = [(n, p.numel() * 4) for n, p in model.named_parameters()]
    cfg = ScaleConfig(gpus=1024, buffers=buffers, step_cv=0.0)
    on = scale_out(analysis, params, cfg, a100, hdr)
    off = scale_out(analysis, params, dataclasses.replace(cfg, broadcast_buffers=False), a100,
                    hdr)
    bb = on["communication"]["buffer_broadcast"]
    assert "buffer_broadcast" not in off["communication"]
    # bf16 without a scaler: the CPU runs ahead, so the broadcasts and the copies' GPU time
    assert bb["host_issue_s"] == 0.0
    assert bb["seconds"] == pytest.approx(bb["broadcast_s"] + 161 * analysis.efficiency.launch_s)
    assert on["exposed_comm_s"] - off["exposed_comm_s"] == pytest.approx(bb["seconds"])
    assert on["step_s"] - off["step_s"] == pytest.approx(bb["seconds"])
    # FSDP broadcasts no buffers
    fsdp = scale_out(analysis, params, dataclasses.replace(cfg, strategy="fsdp"), a100, hdr)
    assert "buffer_broadcast" not in fsdp["communication"]


def test_analyze_no_broadcast_buffers_is_ddp_s_flag(capsys):
    # the report names the broadcast where it costs a step's 1% and says how to drop it
    from conftest import run_cli

    code, out, err = run_cli(["analyze", "resnet50", "--device", "a100-80gb", "--batch-size",
                              "128", "--dtype", "bf16", "--train", "--gpus", "4096",
                              "--interconnect", "nvlink3-a100,ib-hdr"], capsys)
    assert code == 0, err
    text = " ".join(out.split())
    assert "DDP's broadcast of 159 buffers before every forward" in text
    assert "broadcast_buffers=False" in text
    code, out, err = run_cli(["analyze", "resnet50", "--device", "a100-80gb", "--batch-size",
                              "128", "--dtype", "bf16", "--train", "--gpus", "4096",
                              "--interconnect", "nvlink3-a100,ib-hdr", "--no-broadcast-buffers"],
                             capsys)
    assert code == 0 and "broadcast of 159 buffers" not in " ".join(out.split())
    code, _, err = run_cli(["analyze", "resnet50", "--no-broadcast-buffers"], capsys)
    assert code == 2 and "add --gpus N" in err
    code, _, err = run_cli(["analyze", "resnet50", "--gpus", "8", "--strategy", "fsdp",
                            "--no-broadcast-buffers"], capsys)
    assert code == 2 and "--no-broadcast-buffers is DDP's broadcast_buffers" in err
