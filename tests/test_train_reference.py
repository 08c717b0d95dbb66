"""Slow, obvious references for the trainer's speed-ups (issue #13): each fast path against
the plain computation it replaces."""

import torch
import torchvision

from dlperf.train.speedups import pad_stem_to_4


def test_stem_padded_3_to_4_gives_the_same_outputs_for_a_zero_4th_channel():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).double().eval()
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    want = model(x)
    padded = pad_stem_to_4(model)
    stem = padded.conv1
    assert stem.in_channels == 4 and torch.count_nonzero(stem.weight[:, 3]) == 0
    got = padded(torch.cat([x, torch.zeros(2, 1, 64, 64, dtype=torch.float64)], dim=1))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


GN_MODEL = '''
from dlperf.models.tiny import TinyResNet

def make():
    return TinyResNet(4, norm="gn")  # no batch statistics: micro-batches see what the batch sees
'''


def test_grad_accum_2_equals_grad_accum_1_at_the_same_global_batch(tmp_path):
    from dlperf.train import checkpoint as ckpt
    from dlperf.train.loop import train
    from dlperf.train.recipes import apply_overrides, tiny
    from dlperf.data.toy import make_toy

    toy = make_toy(tmp_path / "toy", per_class=8)
    factory = tmp_path / "gn.py"
    factory.write_text(GN_MODEL)
    weights = {}
    for accum in (1, 2):
        out = tmp_path / f"accum{accum}"
        cfg = apply_overrides(tiny(), dict(model=f"{factory}:make", data=str(toy),
                                           val_data="none", out_dir=str(out), epochs=1,
                                           batch_size=16, grad_accum=accum, threads=2,
                                           deterministic=True))
        train(cfg, resume=None, progress=False, mfu=False)
        weights[accum] = ckpt.load_latest(out / "checkpoints")[0]["model"]
    assert weights[1].keys() == weights[2].keys()
    for key in weights[1]:  # the same images, the same mean gradient, summed in another order
        torch.testing.assert_close(weights[2][key], weights[1][key], rtol=1e-5, atol=1e-6)


def test_lars_follows_its_formula_in_float64():
    """You et al.'s LARS: local rate trust x ||w|| / (||g|| + wd x ||w||) scales (g + wd x w),
    into a momentum buffer; BN and bias parameters (lars_exclude) take plain SGD steps."""
    from dlperf.train.optim import LARS

    torch.manual_seed(0)
    w0 = torch.randn(5, 3, dtype=torch.float64)
    b0 = torch.randn(5, dtype=torch.float64)
    w, b = w0.clone().requires_grad_(), b0.clone().requires_grad_()
    lr, m, wd, trust = 0.5, 0.9, 0.01, 0.02
    opt = LARS([{"params": [w]}, {"params": [b], "lars_exclude": True, "weight_decay": 0.0}],
               lr=lr, momentum=m, weight_decay=wd, trust=trust)
    grads = [(torch.randn(5, 3, dtype=torch.float64), torch.randn(5, dtype=torch.float64))
             for _ in range(2)]
    want_w, want_b, buf_w, buf_b = w0.clone(), b0.clone(), None, None
    for gw, gb in grads:
        w.grad, b.grad = gw.clone(), gb.clone()
        opt.step()
        rate = trust * want_w.norm() / (gw.norm() + wd * want_w.norm())
        step_w = rate * (gw + wd * want_w)
        buf_w = step_w if buf_w is None else m * buf_w + step_w
        buf_b = gb if buf_b is None else m * buf_b + gb
        want_w, want_b = want_w - lr * buf_w, want_b - lr * buf_b
    torch.testing.assert_close(w.detach(), want_w, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(b.detach(), want_b, rtol=1e-12, atol=1e-12)


def test_the_ladder_times_the_step_the_trainer_runs(tmp_path, monkeypatch):
    # Both call step.train_step, with the same kinds of parts: count the calls and the parts
    # each passes (a ladder that built its own step again would not be seen here).
    from dlperf.bench import ladder
    from dlperf.train import loop, step as step_mod
    from dlperf.train.recipes import apply_overrides, tiny
    from dlperf.data.toy import make_toy

    calls = []
    real = step_mod.train_step

    def counting(parts, micro_batches, step, **kw):
        calls.append((type(parts.optimizer).__name__, type(parts.guard).__name__,
                      type(parts.loss_fn).__name__, len(micro_batches)))
        return real(parts, micro_batches, step, **kw)

    monkeypatch.setattr(step_mod, "train_step", counting)
    monkeypatch.setattr(loop, "train_step", counting)
    toy = make_toy(tmp_path / "toy", per_class=4)
    cfg = apply_overrides(tiny(), dict(data=str(toy), val_data="none",
                                       out_dir=str(tmp_path / "run"), epochs=1, batch_size=8,
                                       threads=1))
    loop.train(cfg, resume=None, progress=False, mfu=False)
    trainer_calls = list(calls)
    calls.clear()
    lcfg = ladder.LadderConfig(model="tiny", image_size=32, batch_size=4, warmup=1, steps=1,
                               device="cpu")
    ladder._time_steps(ladder.TrainConfig(model="tiny"), lcfg, torch.device("cpu"))
    assert trainer_calls and len(calls) == 2  # warm-up + one timed step
    assert set(calls) == {trainer_calls[0][:3] + (1,)}


def test_trainer_flops_per_image_are_the_analyzers_and_torch_flop_counters():
    # The MFU's numerator (train.metrics.flops_per_image) is `dlperf analyze`'s FLOP count of
    # one training step, per image; its GEMM part equals torch.utils.flop_counter on a real
    # forward + backward of the same model (convolutions and the classifier).
    from torch.utils.flop_counter import FlopCounterMode

    from dlperf.analysis.api import analyze
    from dlperf.train.metrics import flops_per_image

    fpi = flops_per_image("resnet18", 10, 64, "fp32")
    model = torchvision.models.resnet18(num_classes=10)
    analysis = analyze(model, (2, 3, 64, 64), device="h100-sxm", dtype="fp32", train=True,
                       optimizer="none")
    assert fpi == analysis.totals()["flops"] / 2
    gemm = sum(p.cost.flops for p in analysis.predictions if p.cost.kind == "gemm")
    counter = FlopCounterMode(display=False)
    with counter:
        model(torch.randn(2, 3, 64, 64)).sum().backward()
    # the dgrad of the stem (its input needs no gradient) is neither counted nor run
    assert gemm == counter.get_total_flops()
    assert 1.0 < fpi / (gemm / 2) < 1.1  # elementwise work adds a few percent


def test_speedups_run_in_their_documented_order(monkeypatch):
    # speedups.apply walks speedups.ORDER: flags, zero-init, the stem pad, then channels_last
    # (so the padded stem's new weight is laid out NHWC too), then the device.
    from dlperf.train import speedups
    from dlperf.train.recipes import TrainConfig

    calls = []
    for name in ("backend_flags", "zero_init_residual", "pad_stem_to_4"):
        real = getattr(speedups, name)
        monkeypatch.setattr(speedups, name,
                            lambda *a, _n=name, _r=real: (calls.append(_n), _r(*a))[1])
    cfg = TrainConfig(model="resnet18", zero_init_residual=True, pad_stem_to_4=True,
                      channels_last=True)
    model = speedups.apply(torchvision.models.resnet18(num_classes=10), cfg, torch.device("cpu"))
    assert calls == ["backend_flags", "zero_init_residual", "pad_stem_to_4"]
    assert [n for n in speedups.ORDER if n in calls] == calls
    assert model.conv1.in_channels == 4
    assert model.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    assert float(model.layer1[0].bn2.weight.detach().abs().sum()) == 0.0
