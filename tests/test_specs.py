"""Device presets: datasheet consistency, user spec files, GPU-name matching."""

import json

import pytest

from dlperf.errors import DlperfError
from dlperf.hardware.specs import PRESETS, DeviceSpec, get_device, load_spec_file, match_preset


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_consistent(name):
    s = PRESETS[name]
    assert s.source.startswith("https://")
    assert s.sm_count > 0 and s.mem_bandwidth > 1e11 and s.peak["fp32"] > 1e12
    # Tensor Core rates exceed the FP32 CUDA-core rate (GeForce GA102's dense TF32 only equals
    # it: 35.6 TFLOP/s both, its FP32 pipes being doubled); FP16 and BF16 match where both exist.
    for unit in ("tf32", "fp16", "bf16", "fp8", "int8"):
        if unit in s.peak:
            assert s.peak[unit] >= s.peak["fp32"] if unit == "tf32" else \
                s.peak[unit] > s.peak["fp32"]
    if "bf16" in s.peak:
        assert s.peak["bf16"] == s.peak["fp16"]
    # dense and sparse never mix: a sparse figure is 2x its dense one (within 2%: the L40S
    # datasheet itself gives 362.05 dense and 733 sparse BF16 TFLOP/s)
    for unit, sparse in s.sparse_peak.items():
        assert sparse == pytest.approx(2 * s.peak[unit], rel=0.02)


def test_guide_alignment_rule_fields():
    assert all(s.tc_alignment_bytes == 16 for s in PRESETS.values())
    assert PRESETS["a100-80gb"].tc_best_alignment_bytes == 128


@pytest.mark.parametrize("gpu,preset", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("NVIDIA A10", "a10"), ("Tesla T4", "t4"),
    ("NVIDIA L4", "l4"), ("NVIDIA L40S", "l40s"), ("Tesla V100-SXM2-32GB", "v100-sxm2"),
    ("NVIDIA B200", "b200"), ("NVIDIA GeForce RTX 3090", "rtx3090"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"), ("NVIDIA RTX 6000 Ada Generation", "rtx6000-ada"),
    ("NVIDIA RTX A6000", "rtx-a6000"), ("Quadro RTX 8000", "quadro-rtx8000"),
    ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"), ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
    ("NVIDIA GH200 480GB", "gh200"), ("NVIDIA A40", "a40"), ("NVIDIA A30", "a30"),
    ("NVIDIA L40", "l40"), ("Tesla V100-PCIE-32GB", "v100-pcie"),
    ("Tesla V100-PCIE-16GB", "v100-pcie"), ("Tesla V100-SXM2-16GB", "v100-sxm2-16gb"),
    ("NVIDIA B300 SXM6 AC", "b300"), ("NVIDIA GB300", "gb300"), ("NVIDIA GB200", "gb200"),
])
def test_match_preset_by_cuda_name(gpu, preset):
    assert match_preset(gpu).name == preset


def test_unknown_gpu_name_matches_nothing():
    assert match_preset("NVIDIA GeForce GTX 1080 Ti") is None
    assert match_preset("Quadro RTX 6000") is None  # Turing, not the RTX 6000 Ada


# Tensor Core FLOPs per SM per clock, dense, by architecture and accumulation (the whitepapers'
# per-SM figures): Turing 8 Tensor Cores x 64 FMA = 1,024 FP16 FLOP; GA102 and AD102 4 x 128
# FMA = 1,024 with FP16 accumulation, half that with FP32 accumulation on GeForce parts (and on
# the L40-class RTX 6000 Ada); GA100 4 x 256 FMA = 2,048. FP32 lanes per SM: 64 (Turing, GA100)
# or 128 (GA102, AD102), 2 FLOP per FMA. TF32 runs at half the FP16 rate of the same part.
# Each preset's datasheet peaks must equal SMs x boost clock x these.
@pytest.mark.parametrize("name,fp16_per_sm_clock,fp32_per_sm_clock", [
    ("quadro-rtx8000", 1024, 128), ("rtx3090", 512, 256), ("rtx-a6000", 1024, 256),
    ("a10", 1024, 256), ("rtx4090", 512, 256), ("rtx6000-ada", 512, 256),
    ("a100-pcie-40gb", 2048, 128), ("a100-pcie-80gb", 2048, 128), ("a40", 1024, 256),
    ("a30", 2048, 128), ("l40", 512, 256), ("v100-pcie", 1024, 128),
    ("v100-sxm2-16gb", 1024, 128),
])
def test_tensor_peaks_follow_from_sms_and_clock(name, fp16_per_sm_clock, fp32_per_sm_clock):
    s = PRESETS[name]
    sm_clocks = s.sm_count * s.boost_clock_mhz * 1e6
    assert s.peak["fp16"] == pytest.approx(sm_clocks * fp16_per_sm_clock, rel=0.01)
    assert s.peak["fp32"] == pytest.approx(sm_clocks * fp32_per_sm_clock, rel=0.01)
    if "tf32" in s.peak:
        assert s.peak["tf32"] == pytest.approx(s.peak["fp16"] / 2, rel=0.01)
    else:  # Turing and Volta: no TF32, FP32 training on CUDA cores
        assert name in ("quadro-rtx8000", "v100-pcie", "v100-sxm2-16gb")


def test_aliases_and_case():
    assert get_device("H100").name == "h100-sxm"
    assert get_device("A100_80GB").name == "a100-80gb"
    with pytest.raises(DlperfError, match="did you mean"):
        get_device("a100-80")


def test_spec_round_trip(tmp_path):
    spec = PRESETS["l4"]
    path = tmp_path / "l4.json"
    path.write_text(json.dumps(spec.to_dict()))
    assert load_spec_file(path) == spec
    # a probe result file ({"spec": ...}) loads too
    path.write_text(json.dumps({"spec": spec.to_dict(), "measurements": []}))
    assert load_spec_file(path) == spec


@pytest.mark.parametrize("bad,needle", [
    ({"name": "x", "sm_count": 1, "mem_bandwidth": 1e12}, "missing device field(s) peak"),
    ({"name": "x", "sm_count": 0, "mem_bandwidth": 1e12, "peak": {"fp32": 1e12}},
     "sm_count must be a positive number"),
    ({"name": "x", "sm_count": 1, "mem_bandwidth": 1e12, "peak": {"fp32": -1}},
     "must be a positive FLOP/s number"),
    ({"name": "x", "sm_count": 1, "mem_bandwidth": 1e12, "peak": {"fp32": 1e12}, "colour": 1},
     "unknown device field(s) colour"),
])
def test_bad_spec_files_are_refused_with_the_field(tmp_path, bad, needle):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(DlperfError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load_spec_file(path)


def test_not_json(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text("{nope")
    with pytest.raises(DlperfError, match="not a valid device spec file"):
        load_spec_file(path)


def test_v100_has_no_bf16():
    assert PRESETS["v100-sxm2"].peak_flops("bf16") is None
    assert isinstance(PRESETS["v100-sxm2"], DeviceSpec)
