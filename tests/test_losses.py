"""The loss forms (models/losses.py): numerics, what the capture charges for each, and the
memory peak each leaves (analysis/liveness.py)."""

import pytest
import torch
import torch.nn.functional as F

from dlperf.models.losses import LOSSES, cross_entropy, fused_cross_entropy


def test_the_fused_kernel_is_cross_entropy_and_its_gradient_in_float64():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 37, generator=gen, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 37, (64,), generator=gen)
    ref = x.detach().clone().requires_grad_(True)
    loss, expected = fused_cross_entropy(x, t), F.cross_entropy(ref, t)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    (loss * 3).backward()
    (expected * 3).backward()
    torch.testing.assert_close(x.grad, ref.grad, rtol=1e-10, atol=1e-12)
    # on BF16 logits: the gradient in BF16, the loss in FP32 arithmetic (close to float64's)
    xb = x.detach().bfloat16().requires_grad_(True)
    lb = fused_cross_entropy(xb, t)
    lb.backward()
    assert lb.dtype == torch.float32 and xb.grad.dtype == torch.bfloat16
    assert lb.item() == pytest.approx(F.cross_entropy(xb.detach().double(), t).item(), rel=1e-6)


def test_every_form_computes_the_same_loss():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(32, 50, generator=gen).bfloat16()
    t = torch.randint(0, 50, (32,), generator=gen)
    exact = F.cross_entropy(x.double(), t).item()
    for form in LOSSES:
        assert cross_entropy(x, t, form).item() == pytest.approx(exact, rel=1e-2)
    with pytest.raises(ValueError, match="choose fp32, half, fused"):
        cross_entropy(x, t, "bf16")


def _capture(form: str, precision: str = "fsdp", metrics: int = 0):
    from dlperf.analysis.api import AnalysisConfig, capture_costs
    from dlperf.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(layers=2, d_model=64, heads=4, vocab=512, seq_len=32))
    cfg = AnalysisConfig(model="gpt", input_shape=(4, 32), dtype="bf16", precision=precision,
                         train=True, tokens=True, optimizer="none", loss=form,
                         train_metrics=metrics)
    costs, _, _, memory = capture_costs(model, cfg, torch.long)
    return costs, memory


def _loss_analysis(form: str, precision: str = "fsdp"):
    costs, memory = _capture(form, precision)
    return [c for c in costs if c.module == "loss"], memory


def test_what_each_form_moves_by_hand():
    # T = 4 x 32 = 128 tokens over V = 512 classes, BF16 logits: N = 65,536 logits
    n, rows = 128 * 512, 128
    fused, _ = _loss_analysis("fused")
    by_op = {c.op: c for c in fused}
    # fused: the forward reads the logits (2 B) and the int64 targets, writes the loss and a
    # log-sum-exp a row (FP32); the backward reads the loss's gradient, the logits, the
    # targets and the log-sum-exp, and writes the logits' gradient (2 B): two kernels in all
    assert sorted(c.op for c in fused if c.kind != "fill") == [
        "fused_cross_entropy", "fused_cross_entropy_backward"]
    assert by_op["fused_cross_entropy"].bytes == n * 2 + rows * 8 + 4 + rows * 4
    assert by_op["fused_cross_entropy_backward"].bytes == 4 + n * 2 + rows * 8 + rows * 4 + n * 2
    # fp32: the cast (2 B read, 4 written), the log-softmax (4 + 4), its backward (4 + 4 + 4)
    # and the cast of the gradient back (4 + 2), besides the NLL's: 28 B a logit more than the
    # fused form's 4, the NLL's backward writing 4 more (its zero fill)
    fp32, _ = _loss_analysis("fp32")
    big = sum(c.bytes for c in fp32 if c.bytes >= n)
    assert big - (n * 4 + rows * 12) == pytest.approx(n * (6 + 8 + 12 + 6), rel=0.01)
    # half: the same passes in BF16, no casts
    half, _ = _loss_analysis("half")
    assert not any(c.op == "_to_copy" for c in half)
    assert {c.dtype for c in half if c.op.startswith("_log_softmax")} == {"bf16"}


def test_each_forms_peak_by_hand():
    # at the loss's backward, on top of what autograd saved in the model: fp32, three FP32
    # copies of the logits (the log-softmax's output, the NLL's gradient of it, the gradient
    # written); half, the same three in BF16; fused, the BF16 logits it keeps, the BF16
    # gradient it writes, the log-sum-exp and targets (128 x (4 + 8) B) and the loss's
    # gradient it reads (a 4-byte scalar)
    n = 128 * 512
    extra = {"fp32": 3 * n * 4, "half": 3 * n * 2, "fused": 2 * n * 2 + 128 * 12 + 4}
    for form, expected in extra.items():
        _, memory = _loss_analysis(form)
        assert memory["activations_peak_bytes"] - memory["activations_bytes"] == expected, form
    # under autocast the fp32 form is autocast's own: the same three FP32 copies
    _, mixed = _loss_analysis("fp32", precision="mixed")
    assert mixed["activations_peak_bytes"] - mixed["activations_bytes"] == 3 * n * 4


def test_presets_default_to_their_runs_loss_and_the_cli_takes_one(capsys):
    from conftest import run_cli

    from dlperf.models.gpt import default_loss

    assert default_loss("mpt-125m") == "fused" and default_loss("llama3-8b") == "fp32"
    code, out, err = run_cli(["analyze", "gpt2", "--train", "--batch-size", "2", "--loss",
                              "fused", "--top", "1"], capsys)
    assert code == 0, err
    fused = float(" ".join(out.split()).split("Memory per device: ~")[1].split()[0])
    code, out, err = run_cli(["analyze", "gpt2", "--train", "--batch-size", "2", "--top", "1"],
                             capsys)
    assert code == 0, err
    default = float(" ".join(out.split()).split("Memory per device: ~")[1].split()[0])
    assert fused < default  # GPT-2's 50,257-wide logits: FP32 copies against BF16 ones
    code, out, err = run_cli(["analyze", "gpt2", "--loss", "bf16"], capsys)
    assert code == 2 and "--loss" in err
    # under autocast cross_entropy is FP32 whatever the logits: --loss half is refused there
    code, out, err = run_cli(["analyze", "gpt2", "--train", "--batch-size", "2", "--loss",
                              "half"], capsys)
    assert code == 2 and "--loss half: under autocast" in err
    assert len(err.strip().splitlines()) == 1
    code, out, err = run_cli(["analyze", "gpt2", "--train", "--batch-size", "2", "--loss",
                              "half", "--precision", "fsdp"], capsys)
    assert code == 0, err


def test_train_metrics_by_hand():
    # Composer's two train metrics (capture._train_metrics): after the backward, each casts the
    # BF16 logits to FP32 (2 B read, 4 written a logit), log-softmaxes the copy (4 + 4) and
    # takes the NLL; nothing saved for a backward. N = 4 x 32 tokens x 512 classes
    n = 128 * 512
    plain, plain_memory = _capture("fp32")
    costs, memory = _capture("fp32", metrics=2)
    metrics = [c for c in costs if c.module == "metrics"]
    assert [c.op for c in metrics if c.kind != "fill"] == [
        "_to_copy", "_log_softmax", "nll_loss_forward"] * 2
    assert {c.phase for c in metrics} == {"forward"}
    last_gradient = max(i for i, c in enumerate(costs) if c.phase in ("dgrad", "wgrad"))
    assert min(costs.index(c) for c in metrics) > last_gradient
    by_op = {c.op: c.bytes for c in metrics}
    assert by_op["_to_copy"] == n * (2 + 4) and by_op["_log_softmax"] == n * (4 + 4)
    # the step's other kernels are the same ones
    assert [(c.op, c.bytes) for c in costs if c.module != "metrics"] == [
        (c.op, c.bytes) for c in plain]
    # nothing more saved for the backward; the metrics read the BF16 logits after it, so they
    # are alive through it: the fp32 loss's peak (at its log-softmax's backward, where its own
    # cast had freed them) grows by them, N x 2 B
    assert memory["activations_bytes"] == plain_memory["activations_bytes"]
    assert memory["activations_peak_bytes"] - plain_memory["activations_peak_bytes"] == n * 2


def test_train_metrics_finding_defaults_and_cli(capsys):
    from conftest import run_cli

    from dlperf.analysis.api import analyze
    from dlperf.models.gpt import default_train_metrics

    def gpt2(**kw):
        return analyze("gpt2", (8, 1024), device="a100-80gb", precision="fsdp",
                       input_dtype=torch.long, **kw)

    # the finding saves exactly the metrics' kernels (a GPU: no host wait at this size), and
    # the step without them is the step with none
    analysis, plain = gpt2(train_metrics=2), gpt2()
    [finding] = [f for f in analysis.findings if f.rule == "train-metrics"]
    metric_s = sum(p.time_s for p in analysis.predictions if p.cost.module == "metrics")
    assert finding.saving_s == pytest.approx(metric_s, rel=1e-9)
    assert "2 train metrics evaluate" in finding.message and finding.layers == ("metrics",)
    assert not [f for f in plain.findings if f.rule == "train-metrics"]
    assert (analysis.totals()["predicted_time_s"] - plain.totals()["predicted_time_s"]
            == pytest.approx(metric_s, rel=1e-6))
    # torch.compile leaves them eager, as it leaves the loss: outside the compiled module
    compiled = gpt2(train_metrics=2, fusion="compile")
    assert ([p.cost.op for p in compiled.predictions if p.cost.module == "metrics"]
            == [p.cost.op for p in analysis.predictions if p.cost.module == "metrics"])
    # MosaicML's presets computed two, everything else none; none without --train
    assert default_train_metrics("mpt-125m") == 2 and default_train_metrics("gpt2") == 0
    assert analyze("mpt-125m", (1, 128), device="a100-80gb", precision="fsdp",
                   input_dtype=torch.long, train=False).config.train_metrics == 0
    code, out, err = run_cli(["analyze", "gpt2", "--train-metrics", "2"], capsys)
    assert code == 2 and "--train-metrics 2" in err and len(err.strip().splitlines()) == 1
    code, out, err = run_cli(["analyze", "gpt2", "--train", "--batch-size", "2",
                              "--train-metrics", "1", "--top", "1"], capsys)
    assert code == 0, err
    assert "1 train metric evaluates" in " ".join(out.split())


@pytest.mark.slow
def test_inductor_compiles_the_fp32_loss_into_the_fused_form():
    # What ``fused`` stands for under torch.compile (torchtitan compiles its loss): Inductor
    # keeps the BF16 logits and per-row statistics for the backward, not the FP32 copies eager
    # keeps, and the backward writes a BF16 gradient
    def loss_fn(pred, labels):
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))

    pred = torch.randn(2, 64, 256, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 256, (2, 64))
    saved = {}
    for name, fn in (("eager", loss_fn), ("compiled", torch.compile(loss_fn))):
        kept = []
        with torch.autograd.graph.saved_tensors_hooks(
                lambda t: kept.append((t.numel(), t.dtype)) or t, lambda t: t):
            loss = fn(pred, labels)
        loss.backward()
        assert pred.grad.dtype == torch.bfloat16
        saved[name] = [k for k in kept if k[0] == 128 * 256]  # the logit-sized ones
    assert set(saved["eager"]) == {(128 * 256, torch.float32)}  # the log-softmax output
    assert set(saved["compiled"]) == {(128 * 256, torch.bfloat16)}  # the logits themselves
