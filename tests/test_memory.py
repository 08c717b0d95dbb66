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
    # (judged at the step's peak: the activations at its busiest moment, at least those saved)
    assert m["activations_peak_bytes"] >= m["activations_bytes"]
    per_sample = m["activations_peak_bytes"] / 2048
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


def _rec(index, module, phase, ins, outs, size):
    from dlperf.analysis.capture import OpRecord, TensorMeta

    def meta(k):
        return TensorMeta((size[k],), "int8", (1,), k)  # one byte an element: size bytes

    return OpRecord(index=index, op="op", module=module, module_type="M", phase=phase,
                    inputs=tuple(meta(k) for k in ins), outputs=tuple(meta(k) for k in outs))


def test_liveness_peak_by_hand():
    # a block that makes 1 (100 B) from the input 0 (10 B) and 2 (1,000 B) from 1; the root
    # makes 3 (5 B) from 2; the block's backward reads 3 and 1 and makes 4 (50 B); the weight
    # 9 (1 MB) is read but never counted. Alive: r0 0+1 = 110, r1 1+2 = 1,100, r2 1+2+3 =
    # 1,105, r3 1+3+4 = 155: the peak is 1,105 B at r2
    from dlperf.analysis import liveness

    size = {0: 10, 1: 100, 2: 1000, 3: 5, 4: 50, 9: 10 ** 6}
    records = [_rec(0, "blocks.0.fc", "forward", (0, 9), (1,), size),
               _rec(1, "blocks.0.act", "forward", (1,), (2,), size),
               _rec(2, "loss", "forward", (2,), (3,), size),
               _rec(3, "blocks.0.fc", "dgrad", (3, 1, 9), (4,), size)]
    assert liveness.peak(records, param_keys={9}) == {"bytes": 1105, "record": 2}
    # checkpointing blocks.0: 1 is made and read inside the block's forward only, so it is
    # freed after r1 and made again for the backward (r3); 2 crosses into the root and lives
    # on: r1 1,100, r2 2+3 = 1,005, r3 1+3+4 = 155: the peak 1,100 B at r1
    blocks = frozenset({"blocks.0"})
    assert liveness.peak(records, {9}, blocks) == {"bytes": 1100, "record": 1}
    # a selective policy that keeps 1: as without checkpointing
    assert liveness.peak(records, {9}, blocks, kept={1}) == {"bytes": 1105, "record": 2}


def test_liveness_of_what_megatrons_selective_recompute_frees_and_holds():
    # blocks.0.norm makes 1 (100 B) from the input 0 (10 B), blocks.0.fc makes 2 (1,000 B)
    # from 1, the loss 3 (5 B) from 2, and fc's backward reads 3 and 1 and makes 4 (50 B).
    # Eager (as test_liveness_peak_by_hand): r0 110, r1 1,100, r2 1+2+3 = 1,105 (the peak),
    # r3 1+3+4 = 155
    from dlperf.analysis import liveness

    size = {0: 10, 1: 100, 2: 1000, 3: 5, 4: 50, 9: 10 ** 6}
    records = [_rec(0, "blocks.0.norm", "forward", (0,), (1,), size),
               _rec(1, "blocks.0.fc", "forward", (1, 9), (2,), size),
               _rec(2, "loss", "forward", (2,), (3,), size),
               _rec(3, "blocks.0.fc", "dgrad", (3, 1, 9), (4,), size)]
    assert liveness.peak(records, {9}) == {"bytes": 1105, "record": 2}
    # output-discarding recompute of the norm: 1 is freed after fc's forward (r1) and made
    # again for fc's backward (r3): r1 1,100 (the peak), r2 2+3 = 1,005, r3 1+3+4 = 155
    assert liveness.peak(records, {9}, remade={1}) == {"bytes": 1100, "record": 1}
    # a checkpoint that holds the input 0 until 1 is done with: 0 lives to r3 as well:
    # r1 0+1+2 = 1,110 (the peak), r2 0+2+3 = 1,015, r3 0+1+3+4 = 165
    assert liveness.peak(records, {9}, remade={1},
                         held={0: frozenset({1})}) == {"bytes": 1110, "record": 1}
    # a remade key that no backward record reads (a fused kernel's saved output) is made
    # again at its saving module's first backward record: 1 saved by blocks.0.fc, whose
    # backward (r3) reads only 3: r3 1+3+4 = 155 again, and never alive over r2
    records[3] = _rec(3, "blocks.0.fc", "dgrad", (3, 9), (4,), size)
    assert liveness.peak(records, {9}, saved={1: "blocks.0.fc"}, remade={1},
                         held={0: frozenset({1})}) == {"bytes": 1110, "record": 1}
    assert liveness._intervals(records, frozenset({9}), frozenset(), frozenset(),
                               {1: "blocks.0.fc"}, frozenset({1}))[1] == [(0, 1), (3, 3)]


def test_a_training_steps_peak_is_at_least_its_saved_activations():
    # the capture's peak holds at least what autograd keeps at the end of the forward, and
    # full checkpointing lowers it
    from dlperf.analysis.api import AnalysisConfig, capture_costs
    from dlperf.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(layers=4, d_model=64, heads=4, vocab=512, seq_len=32))
    memory = {}
    for ac in (False, True):
        cfg = AnalysisConfig(model="gpt", input_shape=(4, 32), dtype="bf16", precision="fsdp",
                             train=True, tokens=True, optimizer="none",
                             activation_checkpointing=ac)
        memory[ac] = capture_costs(model, cfg, torch.long)[3]
    for m in memory.values():
        assert m["activations_peak_bytes"] >= m["activations_bytes"] > 0
        assert m["peak_bytes"] - m["total_bytes"] == (m["activations_peak_bytes"]
                                                      - m["activations_bytes"])
    assert memory[True]["activations_peak_bytes"] < memory[False]["activations_peak_bytes"]


def test_what_autograd_saved_lives_until_its_modules_backward():
    # 0 (10 B) -> 1 (100 B) in "attn"; 1 is saved by "attn" but its backward (r3) reads only
    # 2 and 3, as a fused kernel's backward reads its saved inputs under no record's key.
    # Without the saved map 1 dies after r1: r1 1+2 = 1,100 (the peak), r2 2+3 = 1,005, r3
    # 2+3+4 = 1,055; with it 1 lives to r3 (attn's last backward record): r3 1,155
    from dlperf.analysis import liveness

    size = {0: 10, 1: 100, 2: 1000, 3: 5, 4: 50}
    records = [_rec(0, "attn", "forward", (0,), (1,), size),
               _rec(1, "mlp", "forward", (1,), (2,), size),
               _rec(2, "loss", "forward", (2,), (3,), size),
               _rec(3, "attn.inner", "dgrad", (3, 2), (4,), size)]
    assert liveness.peak(records) == {"bytes": 1100, "record": 1}
    assert liveness.peak(records, saved={1: "attn"}) == {"bytes": 1155, "record": 3}
    # a module with no backward record: as before
    assert liveness.peak(records, saved={1: "mlp"})["bytes"] == 1100
    # what the kernel alone makes and saves (key 7, 20 B: attention's log-sum-exp, no record)
    # lives over its module's forward and backward, r0 to r3: 1,175
    assert liveness.peak(records, saved={1: "attn", 7: "attn"},
                         saved_sizes={1: 100, 7: 20}) == {"bytes": 1175, "record": 3}


def test_the_loss_runs_in_fp32_and_its_logits_set_the_peak():
    # A language model's loss upcasts its half-precision logits to FP32 (torchtitan, Hugging
    # Face and Megatron all do; autocast does it itself). At the log-softmax's backward three
    # FP32 copies of the T x V logits are alive beside what autograd saved: the log-softmax's
    # output (saved), the NLL's gradient of it, and the gradient being written. Here T = 4 x
    # 32 = 128 tokens, V = 512: 128 x 512 x 4 B = 256 KiB a copy, 768 KiB on top.
    from dlperf.analysis.api import AnalysisConfig, capture_costs
    from dlperf.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(layers=2, d_model=64, heads=4, vocab=512, seq_len=32))
    copy = 128 * 512 * 4
    for precision, dtype in (("fsdp", "bf16"), ("mixed", "bf16"), ("mixed", "fp32")):
        cfg = AnalysisConfig(model="gpt", input_shape=(4, 32), dtype=dtype,
                             precision=precision, train=True, tokens=True, optimizer="none")
        costs, _, _, memory = capture_costs(model, cfg, torch.long)
        loss = [c for c in costs if c.module == "loss"]
        casts = [c for c in loss if c.op == "_to_copy" and c.phase == "forward"]
        # one cast of the logits to FP32 (autocast's own under mixed bf16; none in fp32):
        # read 2 B, write 4 B an element
        assert [c.bytes for c in casts] == ([] if dtype == "fp32" else [128 * 512 * 6])
        assert {c.dtype for c in loss if c.op.startswith("_log_softmax")} == {"fp32"}
        assert memory["activations_peak_bytes"] == memory["activations_bytes"] + 3 * copy
        assert memory["peak_at"] == "loss: _log_softmax_backward_data, dgrad"


def test_whether_a_step_fits_is_judged_at_its_peak():
    from dlperf.analysis.api import Analysis, AnalysisConfig
    from dlperf.hardware.specs import get_device

    spec = get_device("h100-sxm")  # 80 GiB: 85.9 GB
    at_rest = {"weights_bytes": 10e9, "gradients_bytes": 10e9, "optimizer_state_bytes": 20e9,
               "activations_bytes": 30e9, "total_bytes": 70e9}
    cfg = AnalysisConfig(model="m", input_shape=(1, 8))
    assert Analysis(spec, cfg, [], {}, memory=at_rest).memory_report()["fits"] is True
    # 20 GB more in flight at the peak: 90 GB does not fit 85.9
    peaked = {**at_rest, "activations_peak_bytes": 50e9, "peak_bytes": 90e9}
    assert Analysis(spec, cfg, [], {}, memory=peaked).memory_report()["fits"] is False
