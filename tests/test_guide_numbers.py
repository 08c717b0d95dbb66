"""The performance guide's own worked numbers, reproduced exactly (arithmetic in comments)."""

import pytest

from dlperf.analysis.capture import OpRecord, TensorMeta
from dlperf.analysis.costs import (conv_flops, elementwise_intensity, gemm_bytes, linear_gemm,
                                   record_costs)
from dlperf.analysis.gemm import GemmShape, quantize, wave_efficiency
from dlperf.analysis.roofline import predict
from dlperf.analysis.costs import Cost
from dlperf.hardware.specs import PRESETS

V100 = PRESETS["v100-sxm2"]


def test_v100_fp16_ops_per_byte():
    # 125 TFLOP/s FP16 Tensor Core / 900 GB/s = 138.89 FLOP/B
    assert V100.ops_per_byte("fp16") == pytest.approx(138.9, abs=0.05)


def _linear_cost(batch):
    shape = linear_gemm(batch, 1024, 4096)
    return Cost(module="fc", module_type="Linear", op="mm", phase="forward", kind="gemm",
                flops=shape.flops, bytes=gemm_bytes(shape, 2), dtype="fp16", gemm=shape)


def test_linear_1024_to_4096_batch_512_is_math_bound():
    # M=4096 outputs, N=512 batch, K=1024 inputs.
    # FLOPs = 2*4096*512*1024 = 4,294,967,296
    # bytes = 2*(4096*1024 + 1024*512 + 4096*512) = 2*6,815,744 = 13,631,488
    # intensity = 315.08 > 138.9 -> math-bound
    cost = _linear_cost(512)
    assert (cost.gemm.m, cost.gemm.n, cost.gemm.k) == (4096, 512, 1024)
    assert cost.flops == 4_294_967_296
    assert cost.bytes == 13_631_488
    p = predict(cost, V100)
    assert p.intensity == pytest.approx(315.08, abs=0.01)
    assert p.bound == "compute"


def test_linear_batch_1_is_memory_bound():
    # FLOPs = 2*4096*1*1024 = 8,388,608; bytes = 2*(4096*1024 + 1024 + 4096) = 8,398,848
    # intensity = 0.9988 ~ 1 < 138.9 -> memory-bound
    p = predict(_linear_cost(1), V100)
    assert p.intensity == pytest.approx(0.9988, abs=1e-4)
    assert p.bound == "memory"


def _record(op, inputs, outputs, args=(), pointwise=False):
    def meta(shape, dtype, key):
        stride, acc = [], 1
        for s in reversed(shape):
            stride.insert(0, acc)
            acc *= s
        return TensorMeta(tuple(shape), dtype, tuple(stride), key)

    return OpRecord(index=0, op=op, module="m", module_type="M", phase="forward",
                    inputs=tuple(meta(s, d, i) for i, (s, d) in enumerate(inputs)),
                    outputs=tuple(meta(s, d, 100 + i) for i, (s, d) in enumerate(outputs)),
                    args=args, pointwise=pointwise)


def test_relu_intensity_quarter():
    # ReLU in FP16: 1 op per element, 2 bytes read + 2 bytes written -> 1/4 = 0.25 FLOP/B
    assert elementwise_intensity(1, 4) == 0.25
    shape = (64, 256, 56, 56)
    [cost] = record_costs(_record("relu", [(shape, "fp16")], [(shape, "fp16")], pointwise=True))
    assert cost.intensity == 0.25
    assert predict(cost, V100).bound == "memory"


def test_max_pool_3x3_intensity():
    # 3x3 max-pool, stride 1, same-size output, FP16: 9 ops per output, 2 B in + 2 B out
    # -> 9 / 4 = 2.25 FLOP/B
    shape = (64, 256, 56, 56)
    rec = _record("max_pool2d", [(shape, "fp16")], [(shape, "fp16")],
                  args=("<tensor>", (3, 3), (1, 1), (1, 1)))
    [cost] = record_costs(rec)
    assert cost.intensity == 2.25


@pytest.mark.parametrize("m,n,k,expected", [
    # 8192x128x8192 FP16: 2*8192*128*8192 / (2*(8192*8192 + 8192*128 + 8192*128)) = 124.12
    (8192, 128, 8192, 124.1),
    # 8192^3 FP16: 2*8192^3 / (2*3*8192^2) = 8192/3 = 2730.7
    (8192, 8192, 8192, 2730.7),
])
def test_gemm_intensity(m, n, k, expected):
    shape = GemmShape(m, n, k)
    intensity = shape.flops / gemm_bytes(shape, 2)
    assert intensity == pytest.approx(expected, abs=0.05)
    cost = Cost(module="", module_type="", op="mm", phase="forward", kind="gemm",
                flops=shape.flops, bytes=gemm_bytes(shape, 2), dtype="fp16", gemm=shape)
    # 124.1 < 138.9: memory-bound on V100; 2730 > 138.9: math-bound
    assert predict(cost, V100).bound == ("memory" if expected < 138.9 else "compute")


def test_a100_wave_quantization_example():
    # M=2304, N=1536, 256x128 tiles: 9 x 12 = 108 tiles = exactly one wave on 108 SMs.
    full = quantize(2304, 1536, (256, 128), sm_count=108)
    assert full.tiles == 108 and full.waves == 1 and full.wave_efficiency == 1.0
    # N=1537 needs 13 tile columns: 117 tiles -> 2 waves, 117/216 = 54.2% utilisation.
    over = quantize(2304, 1537, (256, 128), sm_count=108)
    assert over.tiles == 117 and over.waves == 2
    assert over.wave_efficiency == pytest.approx(0.5417, abs=1e-4)
    assert wave_efficiency(117, 108) == pytest.approx(117 / 216)


def test_resnet50_conv1_macs():
    # conv1: 7x7, 3 -> 64, stride 2, 224 -> 112: MACs = 112*112 * 64 * 3*7*7
    #      = 12,544 * 64 * 147 = 118,013,952
    assert conv_flops(1, 3, 64, 112 * 112, 49) // 2 == 118_013_952
    import dlperf

    a = dlperf.analyze("resnet50", (1, 3, 224, 224), device="v100-sxm2", dtype="fp16",
                       train=False)
    conv1 = [p.cost for p in a.predictions if p.cost.module == "conv1" and p.cost.kind == "gemm"]
    assert len(conv1) == 1 and conv1[0].flops // 2 == 118_013_952
