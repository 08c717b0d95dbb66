"""Issue #12: the step's memory against the device's, so no prediction is for a step that
cannot run."""

import pytest
import torch
from torch import nn

import dlperf
from dlperf.analysis.report import rate


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def _saved_bytes_on_real_tensors(model, x) -> int:
    """Independent reference: autograd's own saved tensors on real CPU tensors, each storage
    once, parameters left out."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return sum(seen.values())


def test_footprint_of_a_small_mlp_by_hand_and_against_autograd():
    model = _mlp()
    a = dlperf.analyze(model, (8, 64), device="a100-80gb", dtype="fp32", optimizer="sgd")
    m = a.memory_report()
    # parameters 64*32 + 32 + 32*10 + 10 = 2,410 -> 9,640 B each for weights, gradients and
    # SGD momentum; activations: the first Linear saves its input (8*64*4 = 2,048 B), ReLU its
    # output, which the second Linear saves too (one storage: 8*32*4 = 1,024 B): 3,072 B
    assert m["parameters"] == 2410
    assert m["weights_bytes"] == m["gradients_bytes"] == m["optimizer_state_bytes"] == 9640
    assert m["activations_bytes"] == 3072 == _saved_bytes_on_real_tensors(
        model, torch.randn(8, 64))
    assert m["total_bytes"] == 3 * 9640 + 3072 and m["fits"] is True
    adamw = dlperf.analyze(model, (8, 64), device="a100-80gb", dtype="fp32", optimizer="adamw")
    assert adamw.memory_report()["optimizer_state_bytes"] == 2 * 9640  # two moments


def test_resnet_activations_match_autograd_on_real_tensors():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    x = torch.randn(2, 3, 64, 64)
    a = dlperf.analyze(model, (2, 3, 64, 64), device="a100-80gb", dtype="fp32")
    assert a.memory_report()["activations_bytes"] == _saved_bytes_on_real_tensors(model, x)
    # bf16 autocast saves 16-bit activations, and the 16-bit copies of the weights that its
    # convolutions read (2 bytes a parameter): at batch 2 the copies dominate
    bf16 = dlperf.analyze(model, (2, 3, 64, 64), device="a100-80gb", dtype="bf16")
    copies = 2 * sum(p.numel() for p in model.parameters() if p.dim() > 1)
    saved = bf16.memory_report()["activations_bytes"]
    assert copies <= saved < copies + a.memory_report()["activations_bytes"]


def test_a_175b_model_on_one_h100_does_not_fit_and_says_how_many_gpus(capsys):
    from dlperf.cli import main

    code = main(["analyze", "gpt", "--layers", "96", "--d-model", "12288", "--heads", "96",
                 "--seq-len", "2048", "--batch-size", "1", "--train", "--device", "h100-sxm",
                 "--top", "1"])
    out = capsys.readouterr().out.replace("\n", " ")
    assert code == 0
    assert "does not fit" in out and "[capacity] Does not fit" in out
    assert "shard them over at least" in out
    assert "0.145 samples/s" in out or " 0 samples/s" not in out  # digits, not a rounded 0


def test_batch_that_fits_is_suggested_when_only_activations_overflow():
    a = dlperf.analyze("resnet50", (2048, 3, 224, 224), device="v100-sxm2", dtype="fp16")
    found = [f for f in a.findings if f.rule == "capacity"]
    m = a.memory_report()
    assert m["fits"] is False and found
    # the suggested batch fits 90% of the device at the measured activations per sample
    batch = int(found[0].message.split("batch ")[1].split()[0])
    per_sample = m["activations_bytes"] / 2048
    static = m["total_bytes"] - m["activations_bytes"]
    assert static + batch * per_sample <= 0.9 * m["device_bytes"]
    assert static + (batch + 1) * per_sample > 0.9 * m["device_bytes"]


@pytest.mark.parametrize("value, text", [(0.18, "0.18"), (12.345, "12.3"), (1234.5, "1,234"),
                                         (0.0, "0")])
def test_rates_keep_their_digits(value, text):
    assert rate(value) == text


def test_attention_saves_what_the_fused_kernel_saves():
    # On meta tensors scaled_dot_product_attention takes the math path, which saves the
    # B x H x T x T probabilities; the CPU's (and CUDA's) fused kernels save q, k, v, the output
    # and the fp32 log-sum-exp. The reference is autograd on real CPU tensors, which run the
    # CPU flash kernel: per layer here q/k/v share the qkv output (2 x 128 x 192 x 4 B), the
    # output 2 x 128 x 64 x 4 B, the log-sum-exp 2 x 4 x 128 x 4 B.
    from dlperf.models.gpt import GPT, gpt_config

    cfg = gpt_config("gpt", layers=2, d_model=64, heads=4, vocab=256, seq_len=128)
    torch.manual_seed(0)
    model = GPT(cfg)
    a = dlperf.analyze(model, (2, 128), device="a100-80gb", dtype="fp32", optimizer="sgd",
                       input_dtype=torch.int64)
    real = _saved_bytes_on_real_tensors(model, torch.randint(0, 256, (2, 128)))
    assert a.memory_report()["activations_bytes"] == real
    # what the capture counted before: the math path, which keeps the probabilities
    # (2 x 4 x 128 x 128 x 4 B = 524,288 B a layer) where the kernel keeps the log-sum-exp
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        math_path = _saved_bytes_on_real_tensors(model, torch.randint(0, 256, (2, 128)))
    assert math_path - real >= 2 * (524_288 - 4_096)


def _checkpointed_gpt():
    from torch.utils.checkpoint import checkpoint

    from dlperf.models.gpt import GPT, gpt_config

    torch.manual_seed(0)
    model = GPT(gpt_config("gpt", layers=2, d_model=64, heads=4, vocab=256, seq_len=128))

    class Checkpointed(nn.Module):  # what a trainer's per-block checkpoint wrapping runs
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, idx):
            m = self.inner
            h = m.tok(idx) + m.pos(torch.arange(idx.shape[1]))
            for block in m.blocks:
                h = checkpoint(block, h, use_reentrant=False)
            return m.head(m.ln_f(h))

    return model, Checkpointed(model)


def test_activation_checkpointing_recomputes_and_keeps_what_torch_checkpoint_does():
    from torch.utils.flop_counter import FlopCounterMode

    model, checkpointed = _checkpointed_gpt()
    x = torch.randint(0, 256, (2, 128))

    def step_flops(m):
        with FlopCounterMode(display=False) as fc:
            m(x).float().sum().backward()
        return fc.get_total_flops()

    def analysis(ac):
        return dlperf.analyze(model, (2, 128), device="a100-80gb", dtype="fp32", optimizer="none",
                              input_dtype=torch.int64, activation_checkpointing=ac)

    plain, ac = analysis(False), analysis(True)
    gemm = [sum(p.cost.flops for p in a.predictions if p.cost.kind == "gemm") for a in (plain, ac)]
    # torch's count of the matmuls, checkpoint replaying each block up to the last tensor its
    # backward needs (the MLP's output projection is not replayed: 2 x 256 x 256 x 64 x 2
    # FLOPs fewer than the whole blocks' forward)
    assert gemm[1] - gemm[0] == step_flops(checkpointed) - step_flops(model) == 33_554_432
    recompute = [i for i, p in enumerate(ac.predictions) if p.cost.phase == "recompute"]
    assert recompute and {ac.predictions[i].cost.module.split(".")[1] for i in recompute} == {"0", "1"}
    # each block's replay runs just before that block's backward
    first_bwd_1 = next(i for i, p in enumerate(ac.predictions)
                       if p.cost.phase in ("dgrad", "wgrad") and p.cost.module.startswith("blocks.1"))
    assert ac.predictions[first_bwd_1 - 1].cost.phase == "recompute"
    assert ac.predictions[first_bwd_1 - 1].cost.module.startswith("blocks.1")
    # memory: what autograd saves with torch's checkpoint on real tensors (outside the blocks,
    # and each block's input, 2 x 128 x 64 x 4 B), plus one block's own activations again
    # during its backward (the blocks are alike: half of what the two save beyond their
    # inputs without checkpointing)
    kept = _saved_bytes_on_real_tensors(checkpointed, x)
    inside = _saved_bytes_on_real_tensors(model, x) - kept
    expected = kept + inside // 2
    assert ac.memory_report()["activations_bytes"] == expected
    assert expected < plain.memory_report()["activations_bytes"]
