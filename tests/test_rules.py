"""The checklist findings: each fires on the case it is for, with a quantified gain."""

import pytest
from torch import nn

import dlperf
from dlperf.analysis.gemm import GemmShape, best_quantization


def _rules(analysis):
    return {f.rule: f for f in analysis.findings}


def test_fp32_gets_mixed_precision_and_tf32_advice():
    a = dlperf.analyze("resnet18", (32, 3, 112, 112), device="a100-80gb", dtype="fp32")
    found = [f for f in a.findings if f.rule == "mixed-precision"]
    assert len(found) == 2
    step = a.totals()["predicted_time_s"]
    # bf16 Tensor Cores (312 TF/s) vs FP32 CUDA cores (19.5): a big, but bounded, saving
    assert 0.3 * step < found[0].saving_s < step
    assert "autocast" in found[0].message and "TF32" in found[1].message
    # The estimate agrees with a real bf16 analysis of the same model within 10% (6% today: this
    # step is host-bound and autocast adds a few cast kernels the estimate does not list)
    bf16 = dlperf.analyze("resnet18", (32, 3, 112, 112), device="a100-80gb", dtype="bf16")
    assert step - found[0].saving_s == pytest.approx(bf16.totals()["predicted_time_s"], rel=0.10)


def test_bf16_has_no_mixed_precision_finding():
    a = dlperf.analyze("resnet18", (32, 3, 112, 112), device="a100-80gb", dtype="bf16")
    assert "mixed-precision" not in _rules(a)


def test_nchw_pays_transposes_and_channels_last_removes_them():
    nchw = dlperf.analyze("resnet50", (64, 3, 224, 224), device="h100-sxm", train=True)
    nhwc = dlperf.analyze("resnet50", (64, 3, 224, 224), device="h100-sxm", train=True,
                          channels_last=True)
    finding = _rules(nchw)["channels-last"]
    assert finding.saving_s > 0 and "channels_last" in finding.message
    assert "channels-last" not in _rules(nhwc)
    assert all(p.transpose_time_s == 0 for p in nhwc.predictions)
    # Same math either way; NHWC is faster by about the transposes the finding names.
    t_nchw = nchw.totals()["predicted_time_s"]
    t_nhwc = nhwc.totals()["predicted_time_s"]
    assert nchw.totals()["flops"] == nhwc.totals()["flops"]
    assert t_nchw - t_nhwc == pytest.approx(finding.saving_s, rel=0.02)


def test_fusion_finding_names_the_elementwise_ops():
    a = dlperf.analyze("resnet50", (64, 3, 224, 224), device="h100-sxm", train=True,
                       channels_last=True)
    f = _rules(a)["fusion"]
    assert "threshold_backward" in f.message and f.saving_s > 0
    memory_time = sum(p.time_s for p in a.predictions if p.bound == "memory")
    assert f.saving_s < memory_time
    assert "--fusion bn-act" in f.message  # a network with batch norms: their stack


def test_fusion_finding_points_a_decoder_at_megatron_s_kernels():
    from dlperf.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(layers=2, d_model=256, heads=4, vocab=512, seq_len=128,
                          attention="math", dropout=0.1))
    import torch

    a = dlperf.analyze(model, (8, 128), device="a100-80gb", dtype="bf16", train=True,
                       input_dtype=torch.long)
    f = _rules(a)["fusion"]
    assert "--fusion megatron" in f.message and "bn-act" not in f.message


def test_alignment_finding_pads_the_bad_dimension():
    model = nn.Sequential(nn.Linear(100, 1024), nn.ReLU(), nn.Linear(1024, 1000))
    a = dlperf.analyze(model, (1024, 100), device="a100-80gb", dtype="fp16", train=True)
    f = _rules(a)["alignment"]
    assert "K=100->104" in f.message or "M=100->104" in f.message or "N=100->104" in f.message
    assert f.layers == ("0",)
    assert f.saving_s > 0


def test_wave_quantization_prefers_full_waves():
    # The guide's A100 case at the model's own tile choice: 1536 columns fill waves better than
    # 1537 (one extra column forces a 13th tile column for every tile row).
    full = best_quantization(GemmShape(2304, 1536, 4096), 108)
    over = best_quantization(GemmShape(2304, 1537, 4096), 108)
    assert full.efficiency > over.efficiency
    assert full.efficiency == pytest.approx(1.0)


def test_split_k_fills_the_gpu_for_weight_gradients():
    # ResNet-50 layer4 wgrad: M=512, N=1024, K=256*7*7=12,544 -> only 16 output tiles of
    # 256x128 for 108 SMs; splitting K keeps the SMs busy.
    q = best_quantization(GemmShape(512, 1024, 12_544), 108)
    assert q.split_k > 1 and q.wave_efficiency > 0.9


def test_launch_overhead_flagged_for_tiny_batches():
    a = dlperf.analyze("resnet18", (2, 3, 32, 32), device="h100-sxm", train=True)
    assert "launch-overhead" in _rules(a)


def test_tf32_convolutions_read_nchw_without_transposes():
    # The shipped model charges NCHW transposes around FP16/BF16 Tensor Core convolutions and
    # none to TF32 ones (Efficiency.tf32_nchw = 0: the published TF32 NCHW rows fit without;
    # tests/test_tf32_layout.py covers the term a user can set).
    tf32 = dlperf.analyze("resnet18", (8, 3, 112, 112), device="a100-80gb", dtype="fp32",
                          tf32=True)
    fp16 = dlperf.analyze("resnet18", (8, 3, 112, 112), device="a100-80gb", dtype="fp16")
    assert any(p.unit == "tf32" for p in tf32.predictions)
    assert all(p.transpose_time_s == 0 for p in tf32.predictions)
    assert "channels-last" not in _rules(tf32)
    assert any(p.transpose_time_s > 0 for p in fp16.predictions)


def test_mixed_precision_with_tf32_compares_against_tf32_and_only_when_it_pays():
    # ResNet-50 at batch 64 on an A100: Tensor Core math either way; bf16 halves the traffic
    a = dlperf.analyze("resnet50", (64, 3, 224, 224), device="a100-80gb", dtype="fp32",
                       tf32=True)
    found = [f for f in a.findings if f.rule == "mixed-precision"]
    assert len(found) == 1 and "TFLOP/s TF32" in found[0].message  # 312 vs 156, not vs 19.5
    assert "156 TFLOP/s TF32" in found[0].message and found[0].saving_s > 0
    # ResNet-18 at batch 32, 112 px: a host-bound step (10 us of CPU per kernel) where
    # autocast's extra cast kernels cost more than the faster math saves: no advice to switch
    b = dlperf.analyze("resnet18", (32, 3, 112, 112), device="a100-80gb", dtype="fp32",
                       tf32=True)
    assert b.totals()["host_wait_s"] > 0
    assert not [f for f in b.findings if f.rule == "mixed-precision"]


def _conv_passes(device):
    """The forward, dgrad and wgrad predictions of an fp16 NCHW 1x1 convolution, 64 -> 256
    channels at 56x56, batch 8, trained under autocast on ``device`` (behind another
    convolution, so that it has a data gradient)."""
    model = nn.Sequential(nn.Conv2d(64, 64, 1, bias=False), nn.Conv2d(64, 256, 1, bias=False))
    a = dlperf.analyze(model, (8, 64, 56, 56), device=device, dtype="fp16", train=True)
    convs = [p for p in a.predictions if p.cost.op.startswith("convolution")
             and p.cost.kind == "gemm" and p.cost.module == "1"]
    return {p.cost.phase: p for p in convs}, a.efficiency


@pytest.mark.parametrize("device, forward_bytes, tensors", [
    # x = 8 x 64 x 56 x 56 fp16 = 3,211,264 B; y = 8 x 256 x 56 x 56 fp16 = 12,845,056 B.
    # Volta: cuDNN transposes x in and y back out (2 kernels): 16,056,320 B, each read + written.
    ("v100-sxm2", 3_211_264 + 12_845_056, 2),
    # Ampere and later: sm80 kernels write y in NCHW from the epilogue; only x is transposed.
    ("a100-80gb", 3_211_264, 1),
    ("h100-sxm", 3_211_264, 1)])
def test_nchw_transposes_by_gpu_generation(device, forward_bytes, tensors):
    passes, eff = _conv_passes(device)
    from dlperf.hardware.specs import get_device

    bw = eff.bandwidth(get_device(device))
    fwd = passes["forward"]
    assert fwd.transpose_time_s == pytest.approx(2 * forward_bytes / bw, rel=1e-9)
    assert fwd.kernels - fwd.cost.kernels == tensors
    # dgrad reads dy (= y's size) and writes dx (= x's size): the mirror image of the forward
    dgrad_bytes = 12_845_056 + (3_211_264 if tensors == 2 else 0)
    assert passes["dgrad"].transpose_time_s == pytest.approx(2 * dgrad_bytes / bw, rel=1e-9)
    # wgrad reads dy and x, writes only the (small) weight gradient: both inputs, every GPU
    wgrad = passes["wgrad"]
    assert wgrad.transpose_time_s == pytest.approx(2 * (12_845_056 + 3_211_264) / bw, rel=1e-9)
    assert wgrad.kernels - wgrad.cost.kernels == 2


def test_fp32_channels_last_names_the_winograd_it_loses():
    # FP32 on a V100's CUDA cores: cuDNN's Winograd algorithms take NCHW only, so the NHWC
    # step is slower by the 3x3 convolutions' lost Winograd share (the skb rows measured 310
    # img/s NHWC against 374 NCHW); the finding names that difference, NCHW has none
    nchw = dlperf.analyze("resnet18", (32, 3, 112, 112), device="v100-sxm2", dtype="fp32",
                          train=True)
    nhwc = dlperf.analyze("resnet18", (32, 3, 112, 112), device="v100-sxm2", dtype="fp32",
                          train=True, channels_last=True)
    finding = _rules(nhwc)["winograd-layout"]
    assert "winograd-layout" not in _rules(nchw) and "channels-last" not in _rules(nhwc)
    assert "NCHW" in finding.message and "layer1.0.conv1" in finding.layers
    t_nchw = nchw.totals()["predicted_time_s"]
    t_nhwc = nhwc.totals()["predicted_time_s"]
    assert t_nhwc > t_nchw
    assert t_nhwc - t_nchw == pytest.approx(finding.saving_s, rel=0.02)


def test_head_padding_finding_prices_flash_attention_2_s_padded_heads():
    # heads of 80 (d_model 640 / 8) run FlashAttention-2's 96-wide kernel: 1 - 80/96 = 17% of the
    # attention math is padding; heads of 64 (640 / 10) run its own size and find nothing
    import torch

    from dlperf.models.gpt import GPT, GPTConfig

    def analysis(heads: int, kernel: str):
        model = GPT(GPTConfig(layers=2, d_model=640, heads=heads, vocab=512, seq_len=4096))
        return dlperf.analyze(model, (2, 4096), device="a100-80gb", dtype="bf16", train=True,
                              input_dtype=torch.long, attention_kernel=kernel)

    padded = analysis(8, "flash2")
    f = _rules(padded)["head-padding"]
    assert "heads of 80 in flash2's 96-wide kernel (17% of their math is padding" in f.message
    attention = [p for p in padded.predictions if p.math_class == "attention"]
    assert len(attention) == 4 and all(p.cost.head_dim == 80 for p in attention)
    # the saving: each kernel's time without the padding (compute-bound here: 96/80 of it)
    want = sum(max(p.math_time_s, p.memory_time_s) - max(p.math_time_s * 80 / 96,
                                                         p.memory_time_s) for p in attention)
    assert f.saving_s == pytest.approx(want) and f.saving_s > 0
    assert "head-padding" not in _rules(analysis(10, "flash2"))
    assert "head-padding" not in _rules(analysis(8, "cudnn"))  # (not charged for cuDNN)
    # llm-foundry's Triton kernel computes the heads of 80 in 128-wide blocks (38% padding) and
    # is built for powers of two; heads of 64 pad nothing there either
    triton = _rules(analysis(8, "triton-2023"))["head-padding"]
    assert ("heads of 80 in triton-2023's 128-wide kernel (38% of their math is padding; it is "
            "built for heads of powers of two from 16 to 128)") in triton.message
    assert triton.saving_s > f.saving_s
    assert "head-padding" not in _rules(analysis(10, "triton-2023"))
