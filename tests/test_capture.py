"""Capture: autocast emulation, phases, module attribution, no mutation of the user's model."""

import torch
import torchvision
from torch import nn

import dlperf
from dlperf.analysis.capture import capture


def _resnet_records(dtype=None, train=True, channels_last=False):
    with torch.device("meta"):
        model = torchvision.models.resnet18()
    x = torch.empty(4, 3, 64, 64, device="meta")
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return capture(model, (x,), train=train, autocast_dtype=dtype).records


def test_autocast_runs_convs_in_bf16_and_casts_weights_once():
    records = _resnet_records(torch.bfloat16)
    convs = [r for r in records if r.op == "convolution"]
    assert convs and all(r.inputs[0].dtype == "bf16" and r.inputs[1].dtype == "bf16"
                         for r in convs)
    # CUDA autocast casts each fp32 weight to bf16 once per forward (cached) and the fp32 input
    # once: 20 conv weights + the fc weight and bias + the input -> forward fp32->bf16 copies.
    casts = [r for r in records if r.op == "_to_copy" and r.phase == "forward"
             and r.inputs[0].dtype == "fp32" and r.outputs[0].dtype == "bf16"]
    assert len(casts) == 20 + 2 + 1


def test_fp32_capture_has_no_casts():
    records = _resnet_records(None)
    assert not [r for r in records if r.op == "_to_copy"]
    assert all(r.inputs[0].dtype == "fp32" for r in records if r.op == "convolution")


def test_autocast_fp32_list_ops_run_in_fp32():
    # layer_norm and softmax are on CUDA autocast's fp32 list: a bf16 input is cast up.
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 64)
            self.ln = nn.LayerNorm(64)

        def forward(self, x):
            return torch.softmax(self.ln(self.fc(x)), dim=-1)

    with torch.device("meta"):
        model = M()
    recs = capture(model, (torch.empty(8, 64, device="meta"),), train=False,
                   autocast_dtype=torch.bfloat16).records
    by_op = {r.op: r for r in recs}
    assert by_op["addmm"].outputs[0].dtype == "bf16"
    assert by_op["native_layer_norm"].inputs[0].dtype == "fp32"
    assert by_op["_softmax"].outputs[0].dtype == "fp32"


def test_backward_ops_attributed_to_their_module_and_phase():
    records = _resnet_records(None)
    bwd = [r for r in records if r.op == "convolution_backward"]
    assert {r.module for r in bwd} == {r.module for r in records if r.op == "convolution"}
    relu_bwd = [r for r in records if r.op == "threshold_backward"]
    assert relu_bwd and all(r.module.endswith("relu") for r in relu_bwd)
    assert all(r.phase in ("dgrad", "wgrad") for r in records if r.op == "threshold_backward")
    fc = [r for r in records if r.module == "fc" and r.op == "mm"]
    assert sorted(r.phase for r in fc) == ["dgrad", "wgrad"]


def test_inference_capture_has_no_backward():
    records = _resnet_records(None, train=False)
    assert {r.phase for r in records} == {"forward"}


def test_channels_last_input_stays_nhwc():
    records = _resnet_records(torch.bfloat16, train=False, channels_last=True)
    conv = next(r for r in records if r.op == "convolution")
    assert conv.inputs[0].channels_last


def test_user_model_is_not_touched():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    a = dlperf.analyze(model, (2, 3, 16, 16), device="a100-80gb", train=True)
    assert a.totals()["flops"] > 0
    assert not model.training and not model[1].training  # eval mode restored
    for k, v in model.state_dict().items():
        assert v.device.type == "cpu" and torch.equal(v, before[k])


def test_dropout_is_captured_as_cuda_runs_it():
    # Issue #11 defect 2: on meta tensors at::dropout took its CPU decomposition (bernoulli_ +
    # div_ + mul, the mask at the input's dtype); CUDA runs one native_dropout (read x, write y
    # and a bool mask) and one native_dropout_backward. Linear 64 -> 64 at batch 32 in fp16
    # (autocast): x is 32*64*2 = 4,096 B; forward reads 4,096, writes y 4,096 + mask 2,048 =
    # 10,240 B; backward reads dy 4,096 + mask 2,048, writes dx 4,096 = 10,240 B.
    import torch.nn.functional as F

    import dlperf

    class Functional(nn.Module):
        def __init__(self, how):
            super().__init__()
            self.fc, self.how = nn.Linear(64, 64), how

        def forward(self, x):
            y = self.fc(x)
            if self.how == "F":
                return F.dropout(y, 0.1, self.training)
            if self.how == "torch":
                return torch.dropout(y, 0.1, self.training)
            return F.dropout(y, 0.1, self.training, inplace=True)

    for model in (nn.Sequential(nn.Linear(64, 64), nn.Dropout(0.1)), Functional("F"),
                  Functional("torch")):
        a = dlperf.analyze(model, (32, 64), device="h100-sxm", dtype="fp16", train=True)
        ops = {p.cost.op: p for p in a.predictions}
        assert "bernoulli_" not in ops and "div_" not in ops and not a.uncounted
        assert ops["native_dropout"].cost.bytes == 10_240
        assert ops["native_dropout_backward"].cost.bytes == 10_240
        assert ops["native_dropout"].cost.kernels == ops["native_dropout_backward"].cost.kernels == 1
    # inference: no kernel at all; in place: ATen's decomposition on CUDA too
    a = dlperf.analyze(nn.Sequential(nn.Linear(64, 64), nn.Dropout(0.1)), (32, 64),
                       device="h100-sxm", dtype="fp16", train=False)
    assert not any("dropout" in p.cost.op or p.cost.op == "bernoulli_" for p in a.predictions)
    a = dlperf.analyze(Functional("inplace"), (32, 64), device="h100-sxm", dtype="fp16")
    assert "native_dropout" not in {p.cost.op for p in a.predictions}


def test_half_model_precision_has_no_casts_and_half_everything():
    # Issue #11 defect 3: --dtype fp16 always meant autocast. A model cast with model.half()
    # (apex O2 style without master weights) runs no per-op casts, LayerNorm and softmax in
    # fp16, and keeps its SGD state in fp16: 5 x 2 B per parameter instead of 5 x 4 B.
    import dlperf

    model = nn.Sequential(nn.Linear(64, 128), nn.LayerNorm(128), nn.Softmax(-1),
                          nn.Linear(128, 16))
    params = 64 * 128 + 128 + 2 * 128 + 128 * 16 + 16  # 10,640
    mixed = dlperf.analyze(model, (32, 64), device="h100-sxm", dtype="fp16", train=True)
    half = dlperf.analyze(model, (32, 64), device="h100-sxm", dtype="fp16", train=True,
                          precision="half")
    # (none but the loss's: the logits upcast to fp32, as trainers do: capture._default_loss)
    ops = lambda a: {p.cost.op for p in a.predictions if p.cost.module != "loss"}  # noqa: E731
    assert "_to_copy" in ops(mixed) and "_to_copy" not in ops(half)
    norm = lambda a: next(p for p in a.predictions if p.cost.op == "native_layer_norm")  # noqa: E731
    assert norm(mixed).cost.dtype == "fp32" and norm(half).cost.dtype == "fp16"
    # (the mixed fp16 step also runs GradScaler's unscale before it: costs.grad_scaler_cost)
    step = lambda a: next(p for p in a.predictions if p.cost.op.endswith("_step"))  # noqa: E731
    assert step(mixed).cost.bytes == 20 * params and step(half).cost.bytes == 10 * params
    assert all(p.cost.dtype in ("fp16", "int64", "bool") for p in half.predictions
               if p.cost.kind == "gemm")
    assert half.totals()["bytes"] < mixed.totals()["bytes"]
    assert half.config.precision == "half" and half.to_dict()["config"]["precision"] == "half"
    import pytest

    from dlperf.errors import DlperfError

    with pytest.raises(DlperfError, match="needs --dtype fp16 or bf16"):
        dlperf.analyze(model, (32, 64), dtype="fp32", precision="half")


def test_fsdp_precision_computes_in_half_and_keeps_an_fp32_optimizer():
    # FSDP's mixed precision (torchtitan's FSDP2, Composer's DEFAULT): the gathered bf16
    # parameters run the forward and backward without autocast (no casts; the LayerNorm in
    # bf16, as llm-foundry's low-precision LayerNorm), while the shards keep fp32 master weights
    # and AdamW state: 16 B x 4 per parameter read and written in the update, as under
    # autocast, not the half model's 2 B; the step's memory counts 4-byte weights and state
    import dlperf

    model = nn.Sequential(nn.Linear(64, 128), nn.LayerNorm(128), nn.Linear(128, 16))
    params = 64 * 128 + 128 + 2 * 128 + 128 * 16 + 16  # 10,640
    kw = dict(device="a100-80gb", dtype="bf16", train=True, optimizer="adamw")
    mixed = dlperf.analyze(model, (32, 64), **kw)
    fsdp = dlperf.analyze(model, (32, 64), precision="fsdp", **kw)
    half = dlperf.analyze(model, (32, 64), precision="half", **kw)
    # (no cast but the loss's upcast of the logits to fp32: capture._default_loss)
    ops = lambda a: {p.cost.op for p in a.predictions if p.cost.module != "loss"}  # noqa: E731
    assert "_to_copy" in ops(mixed) and "_to_copy" not in ops(fsdp)
    norm = lambda a: next(p for p in a.predictions if p.cost.op == "native_layer_norm")  # noqa: E731
    assert norm(fsdp).cost.dtype == "bf16" and norm(mixed).cost.dtype == "fp32"
    step = lambda a: next(p for p in a.predictions if p.cost.op.endswith("_step"))  # noqa: E731
    assert step(fsdp).cost.bytes == step(mixed).cost.bytes == 2 * step(half).cost.bytes
    assert fsdp.memory["weights_bytes"] == 4 * params == mixed.memory["weights_bytes"]
    # the forward and backward are the half model's
    body = lambda a: sum(p.cost.bytes for p in a.predictions  # noqa: E731
                         if p.cost.phase != "optimizer")
    assert body(fsdp) == body(half) < body(mixed)
    import pytest

    from dlperf.errors import DlperfError

    with pytest.raises(DlperfError, match="--precision fsdp needs --dtype fp16 or bf16"):
        dlperf.analyze(model, (32, 64), dtype="fp32", precision="fsdp")


def test_attention_output_is_laid_out_as_the_fused_kernels_write_it():
    # flash and memory-efficient attention write O as B x T x H x D and return it transposed,
    # so GPT's `y.transpose(1, 2).reshape(b, t, c)` is a view: no copy kernel in the forward
    from dlperf.models.gpt import GPT, gpt_config

    with torch.device("meta"):
        model = GPT(gpt_config("gpt", layers=1, d_model=64, heads=4, vocab=128, seq_len=32))
    x = torch.zeros(2, 32, dtype=torch.long, device="meta")
    records = capture(model, (x,), train=True).records
    forward_attn = [r for r in records if r.phase == "forward" and r.module == "blocks.0.attn"
                    and r.region is None]
    assert not [r for r in forward_attn if r.op in ("clone", "copy_", "_to_copy")], \
        [r.op for r in forward_attn]
    assert [r for r in records if r.region is not None and r.phase == "forward"]


def test_a_second_capture_of_the_same_model_costs_the_same_step():
    # The backward of a capture leaves .grad on the model's (meta) parameters; a second capture
    # used to accumulate into them (one extra add per parameter). Each capture starts from no
    # gradients, like a step after zero_grad(set_to_none=True), and leaves .grad as it was.
    from dlperf.analysis.api import AnalysisConfig, capture_costs

    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 10))
    cfg = AnalysisConfig(model="mlp", input_shape=(8, 64), dtype="bf16", device="h100-sxm",
                         optimizer="none")
    first = [(c.op, c.phase) for c in capture_costs(model, cfg)[0]]
    second = [(c.op, c.phase) for c in capture_costs(model, cfg)[0]]
    assert first == second
    assert all(p.grad is None for p in model.parameters())
    marker = torch.empty(10, device="meta")
    model[2].bias.grad = marker
    third = [(c.op, c.phase) for c in capture_costs(model, cfg)[0]]
    assert third == first and model[2].bias.grad is marker
