"""NCCL's tuner model (analysis/nccl.py), by hand from src/graph/tuning.cc's constants."""

from __future__ import annotations

import pytest

from dlperf.analysis.nccl import collective, generation


def test_one_node_large_all_reduce_is_a_simple_ring():
    # 1 GB over 8 H100s at 370 GB/s busbw. Ring Simple: 370 x 8/14 = 211.43 GB/s of algorithm
    # bandwidth, 1e9 B / 211.43e3 = 4,729.7 us; latency 8.4 + 14 steps x 3.4 = 56.0 us:
    # 4,785.7 us. LL128 (0.92 x the bandwidth, 14 + 14 x 1.9 us) is 5,181.6 us; the tree
    # (0.92 / 2 of the bus bandwidth) 5,875 us.
    c = collective("allreduce", 1e9, 8, 8, 370e9, "nvlink", None, gen=2)
    assert (c.algorithm, c.protocol) == ("ring", "Simple")
    assert c.seconds == pytest.approx(4785.7e-6, rel=1e-4)
    # the bus bandwidth read back (nccl-tests: algbw x 2(n-1)/n), less the latency: 370 GB/s
    assert 1e9 / (c.seconds - 56e-6) * 14 / 8 == pytest.approx(370e9, rel=1e-6)


def test_one_node_small_all_reduce_takes_the_low_latency_protocol():
    # 1 MB: ring LL moves half the bytes per transfer (min(Hopper's 141 GB/s, 370/2) x 8/14 =
    # 80.57 GB/s: 12.41 us) at 6.6 + 14 x 0.6 = 15.0 us of latency: 27.41 us, against 45.7 us
    # for LL128 and 60.7 us for Simple
    c = collective("allreduce", 1e6, 8, 8, 370e9, "nvlink", None, gen=2)
    assert (c.algorithm, c.protocol) == ("ring", "LL")
    assert c.seconds == pytest.approx(27.41e-6, rel=1e-3)


def test_across_many_nodes_the_tree_wins_and_the_nics_bound_the_bandwidth():
    # 51 MB (ResNet-50's fp16 gradients) over 3,584 H100s, 448 nodes of 8, NDR at 46 GB/s a
    # GPU: bus bandwidth min(370, 8 x 46 = 368) = 368 GB/s. Tree LL128: 368 x 0.92 x 120/128
    # / 2 = 158.7 GB/s, x 0.9 (NCCL's correction at 2^19 x 64 B) = 142.8 GB/s: 357.1 us;
    # latency 14 + 2 (7 x 1.25 + floor(log2 448) = 8 x 8.5) = 167.5 us: 524.6 us. A flat ring
    # would pay 2 x 3,583 steps of latency.
    c = collective("allreduce", 51e6, 3584, 8, 370e9, "nvlink", 46e9, gen=2)
    assert (c.algorithm, c.protocol) == ("tree", "LL128")
    assert c.seconds == pytest.approx(524.6e-6, rel=1e-3)


def test_two_dgx1_nodes_ring_at_their_four_nics():
    # 16 V100s in 2 DGX-1s (NVLink 123.3 GB/s; 4 EDR NICs for 8 GPUs: 5.75 GB/s a GPU): bus
    # bandwidth min(123.3, 8 x 5.75 = 46) = 46 GB/s (nccl-tests#29: 48 GB/s measured). 1 GB,
    # ring Simple: 46 x 16/30 = 24.53 GB/s, 40,761 us; latency (8.4 + 28 x max(3.4, 3 x 1) +
    # 2 x 14) x 1.9 (Volta's ring plateau) = 250.0 us: 41,011 us
    c = collective("allreduce", 1e9, 16, 8, 123.3e9, "nvlink", 5.75e9, gen=0)
    assert (c.algorithm, c.protocol) == ("ring", "Simple")
    assert c.seconds == pytest.approx(41011e-6, rel=1e-4)


def test_one_gpu_per_node_all_gathers_take_pat():
    # 64 KB gathered over 64 nodes of one GPU: PAT 8 + floor(log2 64) x 14 / 3.5 + 64 x 2.8 =
    # 211.2 us + 65,536 / (0.75 x 46e3) = 1.90 us: 213.1 us; the ring's 63 network steps cost
    # 6.6 + 63 x 5 = 321.6 us even with LL
    c = collective("allgather", 65536, 64, 1, 370e9, "nvlink", 46e9, gen=2)
    assert (c.algorithm, c.protocol) == ("pat", "Simple")
    assert c.seconds == pytest.approx(213.1e-6, rel=1e-3)
    # a reduce-scatter of 8 GPUs in one node: a ring, (n-1)/n of the bytes at the bus bandwidth
    rs = collective("reducescatter", 8e9, 8, 8, 370e9, "nvlink", None, gen=2)
    assert rs.algorithm == "ring"
    assert rs.seconds == pytest.approx(8e9 * 7 / 8 / 370e9 + (8.4 + 7 * 3.4) * 1e-6, rel=1e-4)


def test_pcie_hosts_get_no_ll128_and_one_gpu_nothing():
    # through the host NCCL turns LL128 off; whatever size, the protocol is LL or Simple
    for nbytes in (1e3, 1e6, 1e8, 1e10):
        assert collective("allreduce", nbytes, 8, 8, 28e9, "pci", None, gen=1).protocol != "LL128"
    assert collective("allreduce", 1e9, 1, 8, 370e9, "nvlink").seconds == 0.0
    with pytest.raises(ValueError):
        collective("alltoall", 1e9, 8, 8, 370e9, "nvlink")


def test_generations_follow_the_device_presets():
    assert [generation(d) for d in ("v100-sxm2", "t4", "a100-80gb", "rtx4090", "l40s",
                                    "h100-sxm", "h200", "b200")] == [0, 0, 1, 1, 1, 2, 2, 3]


def test_nccl_algo_and_proto_restrict_the_choice_as_the_environment_does():
    from dlperf.analysis.nccl import ALGORITHMS, PROTOCOLS, parse_list

    assert parse_list("Ring", ALGORITHMS, "--nccl-algo") == {"ring"}
    assert parse_list("^tree", ALGORITHMS, "--nccl-algo") == {"ring", "pat"}
    assert parse_list("ll,SIMPLE", PROTOCOLS, "--nccl-proto") == {"LL", "Simple"}
    with pytest.raises(ValueError, match="does not time NCCL's collnetchain"):
        parse_list("COLLNETCHAIN", ALGORITHMS, "--nccl-algo")
    with pytest.raises(ValueError, match="unknown 'rings'"):
        parse_list("rings", ALGORITHMS, "--nccl-algo")
    # 2018's NCCL 2.3 (rings only, no LL128) on 80 DGX-1s: ResNet-50's 51.1 MB of fp16
    # gradients over 640 V100s at min(123.3, 8 x 5.75) = 46 GB/s. Ring LL: min(20.4, 46 / 2)
    # x 640/1278 = 10.22 GB/s, 5,003.3 us; latency 6.6 + 1,120 x max(0.6, 1.0) + 158 x 2.7 =
    # 1,553.2 us: 6,556.5 us. Today's NCCL takes a tree (LL128): under 3 ms.
    b = 25557032 * 2
    old = collective("allreduce", b, 640, 8, 123.3e9, "nvlink", 5.75e9, gen=0,
                     algorithms=frozenset({"ring"}), protocols=frozenset({"LL", "Simple"}))
    assert (old.algorithm, old.protocol) == ("ring", "LL")
    assert old.seconds == pytest.approx(6556.5e-6, rel=1e-3)
    new = collective("allreduce", b, 640, 8, 123.3e9, "nvlink", 5.75e9, gen=0)
    assert new.algorithm == "tree" and new.seconds < 3e-3
    # tree alone has no all-gather: NCCL fails such a call, and so does the model
    with pytest.raises(ValueError, match="no way to run allgather"):
        collective("allgather", 1e9, 16, 8, 370e9, "nvlink", 46e9, gen=2,
                   algorithms=frozenset({"tree"}))


def test_a_broadcast_is_a_ring_whose_latency_grows_with_the_ranks():
    # DDP's buffers of ResNet-50 in FP32 (batch norm's running mean and variance): 212,480 B.
    # 8 A100s (208 GB/s, NVLink, Ampere): a ring of 8 steps (tuning.cc counts a step per rank
    # for a broadcast), algorithm bandwidth = bus bandwidth. LL: min(87.7, 208 / 2) = 87.7 GB/s,
    # 212,480 / 87.7e3 = 2.42 us, latency 6.6 + 8 x 0.6 = 11.4 us: 13.82 us (LL128 30.3 us,
    # Simple 36.6 us)
    c = collective("broadcast", 212480, 8, 8, 208e9, "nvlink", None, gen=1)
    assert (c.algorithm, c.protocol) == ("ring", "LL")
    assert c.seconds == pytest.approx(13.82e-6, rel=1e-3)
    # 1,024 A100s in 128 nodes of 8 (HDR, 23 GB/s a GPU): 1,024 steps, 127 across the network.
    # LL: latency 6.6 + 897 x max(0.6, 1.0 of network overhead) + 127 x 2.7 = 1,246.5 us; the
    # bytes at NCCL's LL ceiling across nodes, 20.4 GB/s: 10.42 us; 1,256.9 us (LL128 2,226 us
    # of latency, Simple 4,836 us)
    many = collective("broadcast", 212480, 1024, 8, 208e9, "nvlink", 23e9, gen=1)
    assert (many.algorithm, many.protocol) == ("ring", "LL")
    assert many.seconds == pytest.approx(1256.9e-6, rel=1e-3)
    # an all-reduce of the same bytes takes the tree, whose latency grows with log2 of the
    # nodes: tree LL, 6.8 + 2 (7 x 0.6 + 7 x 5.0) = 85.2 us, and the bytes at 20.4 / 2 x 0.5
    # (NCCL's correction at 2^11 x 64 B) = 5.1 GB/s, 41.7 us: 126.9 us, a tenth of it
    reduce = collective("allreduce", 212480, 1024, 8, 208e9, "nvlink", 23e9, gen=1)
    assert (reduce.algorithm, reduce.protocol) == ("tree", "LL")
    assert reduce.seconds == pytest.approx(126.9e-6, rel=1e-3)
    # ring is NCCL's only broadcast: no PAT even with one GPU per node
    assert collective("broadcast", 65536, 64, 1, 370e9, "nvlink", 46e9, gen=2).algorithm == "ring"
