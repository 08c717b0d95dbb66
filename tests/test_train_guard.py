"""Non-finite step skipping without a host sync (dlperf/train/guard.py): the device-side skip in
fused SGD, LARS and the EMA, and whole runs in deferred mode against step mode."""

import copy
import json
from pathlib import Path

import pytest
import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from dlperf.errors import DlperfError
from dlperf.train import checkpoint as ckpt
from dlperf.train.guard import EMA, NonFinite, prepare_deferred
from dlperf.train.loop import train
from dlperf.train.optim import LARS
from dlperf.train.metrics import RunLog
from dlperf.train.recipes import TrainConfig
from conftest import toy_split
from test_train import NAN_MODEL, _cfg


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return toy_split(tmp_path_factory, per_class=24, val_per_class=8)


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5),
                               torch.nn.Linear(5, 3))


def _grads(model, seed):
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)


def test_ema_matches_torch_reference_and_keep_zero_is_a_no_op():
    model = _model()
    ours, ref = EMA(model, 0.9), AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9),
                                               use_buffers=True)
    for seed in range(4):  # the first update copies, the rest average (buffers too)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)))
        model(torch.randn(8, 6))  # moves BatchNorm's running stats
        ours.update_parameters(model)
        ref.update_parameters(model)
    for (k, a), (_, b) in zip(ours.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), k
    before = copy.deepcopy(ours.state_dict())
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3)
    ours.keep = torch.tensor(0.0)
    ours.update_parameters(model)
    after = ours.state_dict()
    for k in before:
        if k != "n_averaged":
            assert torch.equal(before[k], after[k]), k
    ours.keep = torch.tensor(1.0)  # keep == 1: the same bits as the scalar update
    ref.update_parameters(model)
    ours.update_parameters(model)
    for (k, a), (_, b) in zip(ours.state_dict().items(), ref.state_dict().items()):
        if k != "n_averaged":
            assert torch.equal(a, b), k


def test_fused_sgd_skips_on_device_and_a_skipped_first_step_leaves_zero_momentum():
    a, b = _model(), _model()
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4,
                            fused=True)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4,
                            fused=True)
    prepare_deferred(opt_a)
    start = [p.detach().clone() for p in a.parameters()]
    _grads(a, 1)
    opt_a.grad_scale, opt_a.found_inf = None, torch.tensor(1.0)  # skipped first step
    opt_a.step()
    for p, p0 in zip(a.parameters(), start):
        assert torch.equal(p, p0)
        assert torch.count_nonzero(opt_a.state[p]["momentum_buffer"]) == 0
    opt_a.found_inf = torch.tensor(0.0)
    for opt, model in ((opt_a, a), (opt_b, b)):  # then the same step on both
        _grads(model, 2)
        opt.step()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)  # 0.9 * 0 + g == g: exactly the first-step result


@pytest.mark.parametrize("found", [None, 0.0, 1.0])
def test_lars_found_inf(found):
    a, b = _model(), _model()
    opt_a = LARS(a.parameters(), lr=0.5, momentum=0.9, weight_decay=1e-4)
    opt_b = LARS(b.parameters(), lr=0.5, momentum=0.9, weight_decay=1e-4)
    for step in range(3):
        _grads(a, step)
        _grads(b, step)
        opt_a.step()  # reference: no found_inf attribute at all
        if found is not None and step == 2:
            opt_b.found_inf = torch.tensor(found)
        elif found is not None:
            opt_b.found_inf = torch.tensor(0.0)
        before = [p.detach().clone() for p in b.parameters()]
        momentum = [opt_b.state[p]["momentum_buffer"].clone() for p in b.parameters()
                    if "momentum_buffer" in opt_b.state[p]]
        opt_b.step()
    for p, q, p0 in zip(a.parameters(), b.parameters(), before):
        if found == 1.0:  # the last step was skipped: weights and momentum as they were
            assert torch.equal(q, p0)
        else:
            assert torch.equal(p, q)
    if found == 1.0:
        after = [opt_b.state[p]["momentum_buffer"] for p in b.parameters()]
        assert len(momentum) == len(after)
        assert all(torch.equal(m0, m1) for m0, m1 in zip(momentum, after))


def test_deferred_run_skips_the_same_steps_as_step_mode(toy, tmp_path):
    f = tmp_path / "flaky.py"
    f.write_text(NAN_MODEL.replace("{BAD}", "{2, 3}"))
    results = {}
    for mode in ("step", "deferred"):
        out = tmp_path / mode
        cfg = _cfg(toy, out, model=f"{f}:make", epochs=1, val_data="none", checkpoint_every=1,
                   keep_last=10, ema_decay=0.9, nonfinite_check=mode, deterministic=True)
        summary = train(cfg, resume=None, progress=False, mfu=False)
        assert summary["skipped_steps"] == 2
        results[mode] = {c.step: ckpt.load(c.path) for c in ckpt.complete(out / "checkpoints")}
        events = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
        bad = [e for e in events if e["kind"] == "nonfinite"]
        # step mode: one event per skipped step; deferred: one per check that found skips,
        # here the checkpoint after each step, so also one per skipped step
        assert len(bad) == 2, bad
    for mode, states in results.items():
        w = "net.conv1.weight"
        assert torch.equal(states[2]["model"][w], states[4]["model"][w]), mode
        assert torch.equal(states[2]["ema"]["module.net.conv1.weight"],
                           states[4]["ema"]["module.net.conv1.weight"]), mode
        assert not torch.equal(states[4]["model"][w], states[5]["model"][w]), mode
    # fused (deferred) vs foreach (step) SGD kernels: the same arithmetic up to rounding
    last = max(results["step"])
    for key, value in results["step"][last]["model"].items():
        torch.testing.assert_close(results["deferred"][last]["model"][key], value,
                                   rtol=1e-5, atol=1e-6, msg=key)


def test_deferred_persistent_nonfinite_stops_at_the_next_check(toy, tmp_path):
    f = tmp_path / "bad.py"
    f.write_text(NAN_MODEL.replace("{BAD}", "set(range(1000))"))
    cfg = _cfg(toy, tmp_path / "m", model=f"{f}:make", epochs=1, val_data="none",
               max_nonfinite_steps=3, nonfinite_check="deferred", log_every=5)
    with pytest.raises(NonFinite, match=r"5 consecutive steps .* at step 5"):
        train(cfg, resume=None, progress=False, mfu=False)
    assert not ckpt.complete(Path(tmp_path / "m" / "checkpoints"))


def test_nonfinite_check_config():
    assert TrainConfig().nonfinite_mode("cuda") == "deferred"
    assert TrainConfig().nonfinite_mode("cpu") == "step"
    assert TrainConfig(fused_optimizer=False).nonfinite_mode("cuda") == "step"
    assert TrainConfig(nonfinite_check="deferred").nonfinite_mode("cpu") == "deferred"
    with pytest.raises(DlperfError, match="nonfinite_check must be"):
        TrainConfig(nonfinite_check="never")
    with pytest.raises(DlperfError, match="needs fused_optimizer=true"):
        TrainConfig(nonfinite_check="deferred", fused_optimizer=False)


# ---------------------------------------------------------------- CUDA graphs (train/graphs.py)
def _sgd_pair(kind):
    a, b = _model(), _model()
    if kind == "lars":
        return a, b, LARS(a.parameters(), lr=0.5, momentum=0.9), LARS(b.parameters(), lr=0.5,
                                                                      momentum=0.9)
    make = lambda m: torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9,  # noqa: E731
                                     weight_decay=1e-4, fused=True)
    return a, b, make(a), make(b)


@pytest.mark.parametrize("kind", ["sgd", "lars"])
def test_tensor_learning_rates_read_in_place_match_float_ones(kind):
    # A replayed graph reads the lr from device memory that the scheduler fill_s; the updates
    # must be exactly those of plain float learning rates.
    from dlperf.train.graphs import tensor_learning_rates

    a, b, opt_a, opt_b = _sgd_pair(kind)
    tensor_learning_rates(opt_b, torch.device("cpu"))
    lr_tensor = opt_b.param_groups[0]["lr"]
    sched_a = torch.optim.lr_scheduler.LambdaLR(opt_a, lambda s: 0.7 ** s)
    sched_b = torch.optim.lr_scheduler.LambdaLR(opt_b, lambda s: 0.7 ** s)
    for step in range(5):
        for model, opt, sched in ((a, opt_a, sched_a), (b, opt_b, sched_b)):
            _grads(model, step)
            opt.found_inf = torch.tensor(0.0)
            opt.grad_scale = None
            opt.step()
            del opt.found_inf, opt.grad_scale
            sched.step()
        assert opt_b.param_groups[0]["lr"] is lr_tensor  # same memory, new value
        assert lr_tensor.item() == pytest.approx(0.5 * 0.7 ** (step + 1))
    for p, q in zip(a.parameters(), b.parameters()):
        if kind == "sgd":  # the fused kernel reads a float32 lr either way: the same bits
            assert torch.equal(p, q)
        else:  # LARS: p - u * lr against p.add_(u, alpha=-lr) (a fused multiply-add)
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_checkpointed_learning_rates_are_floats_and_the_optimizer_keeps_its_tensors():
    from dlperf.train.graphs import float_learning_rates, tensor_learning_rates

    _, b, _, opt = _sgd_pair("sgd")
    tensor_learning_rates(opt, torch.device("cpu"))
    state = float_learning_rates(opt.state_dict())
    assert all(type(g["lr"]) is float for g in state["param_groups"])
    assert isinstance(opt.param_groups[0]["lr"], torch.Tensor)
    fresh = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9, fused=True)
    fresh.load_state_dict(state)
    assert fresh.param_groups[0]["lr"] == 0.5


def test_graphed_step_eager_fallback_trains_like_the_plain_step():
    # capture=False runs the graph's body eagerly: the same update as the loop's own path.
    from dlperf.train.graphs import GraphedStep
    from dlperf.train.guard import StepGuard
    from dlperf.train.step import StepParts


    results = []
    for graphed in (False, True):
        model, _, opt, _ = _sgd_pair("sgd")
        prepare_deferred(opt)
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        guard = StepGuard("deferred", 3, scaler, torch.device("cpu"), RunLog(None))
        loss_fn = torch.nn.CrossEntropyLoss()
        parts = StepParts(model, model, loss_fn, opt, scaler, guard, None, None,
                          torch.device("cpu"))
        step = GraphedStep(parts, capture=False)
        g = torch.Generator().manual_seed(0)
        for _ in range(4):
            x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
            if graphed:
                loss, norm, applied = step(x, y)
                assert bool(applied) and torch.isfinite(norm)
            else:
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(model(x), y)
                loss.backward()
                norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
                guard.step(opt, model, None, loss.detach().float(), norm, 0)
        results.append([p.detach().clone() for p in model.parameters()])
    for p, q in zip(*results):
        assert torch.equal(p, q)


def test_the_capture_tolerates_the_input_threads_cuda_calls(monkeypatch):
    # The GPU input path decodes in its own thread on its own stream while the step is
    # captured; in the default "global" mode any CUDA call of that thread invalidated the
    # capture (cudaErrorStreamCaptureInvalidated on the H200 run of 2026-12-04). The capture
    # must be thread_local. Checked here with a stand-in for torch.cuda.graph that records its
    # arguments and runs the body eagerly.
    from dlperf.train import graphs
    from dlperf.train.guard import StepGuard
    from dlperf.train.step import StepParts

    seen = []

    class FakeGraph:
        def pool(self):
            return "pool"

    class FakeCapture:
        def __init__(self, graph, pool=None, stream=None, capture_error_mode="global"):
            seen.append((pool, capture_error_mode))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", FakeCapture)
    model, _, opt, _ = _sgd_pair("sgd")
    prepare_deferred(opt)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    guard = StepGuard("deferred", 3, scaler, torch.device("cpu"), RunLog(None))
    parts = StepParts(model, model, torch.nn.CrossEntropyLoss(), opt, scaler, guard, None,
                      None, torch.device("cpu"))
    step = graphs.GraphedStep(parts, capture=False)
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    graph, static_x, _, (loss, norm, applied) = step._capture(x, y)
    step._capture(x, y)  # a second shape's capture shares the first one's pool
    assert seen == [(None, "thread_local"), ("pool", "thread_local")]
    assert torch.equal(static_x, x) and static_x is not x
    assert torch.isfinite(loss) and bool(applied)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_a_capture_beside_a_thread_doing_cuda_work(toy, tmp_path):
    # What the GPU input path does during the capture: another thread allocating and
    # synchronising its own stream. The run must capture and train.
    import threading

    stop = threading.Event()

    def busy():
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            while not stop.is_set():
                torch.empty(1 << 20, device="cuda").fill_(1.0)
                stream.synchronize()

    worker = threading.Thread(target=busy, daemon=True)
    worker.start()
    try:
        summary = train(_cfg(toy, tmp_path / "c", epochs=1, device="cuda", dtype="fp32",
                             cuda_graphs=True), resume=None, progress=False, mfu=False)
    finally:
        stop.set()
        worker.join()
    assert summary["steps"] > 0


@pytest.mark.parametrize("overrides,message", [
    (dict(cuda_graphs=True, compile="default"), "cuda_graphs and compile are exclusive"),
    (dict(cuda_graphs=True, dtype="fp16"), "does not support fp16"),
    (dict(cuda_graphs=True, grad_accum=2, batch_size=64), "needs grad_accum=1"),
    (dict(cuda_graphs=True, nonfinite_check="step"), "needs nonfinite_check=deferred"),
    (dict(cuda_graphs=True, fused_optimizer=False), "needs fused_optimizer=true"),
])
def test_cuda_graphs_config_refusals(overrides, message):
    with pytest.raises(DlperfError, match=message):
        TrainConfig(**overrides)
    assert TrainConfig(cuda_graphs=True).nonfinite_mode("cuda") == "deferred"


def test_cuda_graphs_without_a_gpu_is_one_clear_error(toy, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    cfg = _cfg(toy, tmp_path / "g", cuda_graphs=True, epochs=1)
    with pytest.raises(DlperfError, match="cuda_graphs=true needs a CUDA GPU"):
        train(cfg, resume=None, progress=False, mfu=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_cuda_graph_replays_train_like_eager(toy, tmp_path):
    eager = train(_cfg(toy, tmp_path / "e", epochs=2, device="cuda", dtype="fp32",
                       deterministic=True, nonfinite_check="deferred"),
                  resume=None, progress=False, mfu=False)
    graphs = train(_cfg(toy, tmp_path / "c", epochs=2, device="cuda", dtype="fp32",
                        deterministic=True, cuda_graphs=True),
                   resume=None, progress=False, mfu=False)
    a, _ = ckpt.load_latest(tmp_path / "e" / "checkpoints")
    b, _ = ckpt.load_latest(tmp_path / "c" / "checkpoints")
    for key, value in a["model"].items():
        torch.testing.assert_close(b["model"][key], value, rtol=1e-4, atol=1e-5, msg=key)
    assert graphs["eval"]["top1"] == pytest.approx(eager["eval"]["top1"], abs=0.05)


def test_a_scheduler_that_assigns_floats_still_reaches_the_captured_lr():
    # Older LRSchedulers replace a tensor lr by a float; the graph would keep reading the old
    # tensor. keep_learning_rates_in_place writes the value into it and restores it.
    from dlperf.train.graphs import keep_learning_rates_in_place, tensor_learning_rates

    _, _, _, opt = _sgd_pair("sgd")
    captured = tensor_learning_rates(opt, torch.device("cpu"))
    opt.param_groups[0]["lr"] = 0.125  # what such a scheduler does
    keep_learning_rates_in_place(opt, captured)
    assert opt.param_groups[0]["lr"] is captured[0] and captured[0].item() == 0.125


def test_gradient_norm_against_float64_and_clipping_on_the_device():
    from dlperf.train.guard import gradient_norm

    model = _model()
    _grads(model, 3)
    grads = [p.grad.clone() for p in model.parameters()]
    ref = torch.cat([g.double().flatten() for g in grads]).norm().item()
    norm = gradient_norm(model)
    assert norm.item() == pytest.approx(ref, rel=1e-6)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))  # untouched
    limit = ref / 4
    gradient_norm(model, limit)
    clipped = torch.cat([p.grad.double().flatten() for p in model.parameters()]).norm().item()
    assert clipped == pytest.approx(limit, rel=1e-5)
    with pytest.raises(DlperfError, match="max_grad_norm must be positive"):
        TrainConfig(max_grad_norm=0.0)


def test_training_with_gradient_clipping_logs_the_norm(toy, tmp_path):
    out = tmp_path / "clip"
    summary = train(_cfg(toy, out, epochs=1, max_grad_norm=0.5, log_every=2), resume=None,
                    progress=False, mfu=False)
    assert summary["steps"] == 96 // 16
    steps = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()
             if json.loads(x)["kind"] == "step"]
    assert steps and all(s["grad_norm"] > 0 for s in steps)


@pytest.mark.parametrize("mode", ["step", "deferred"])
def test_a_skip_on_any_rank_is_a_skip_on_every_rank(mode):
    # Locally finite, but another rank saw an infinite loss: the `agree` collective says skip.
    from dlperf.train.guard import StepGuard


    model, _, opt, _ = _sgd_pair("sgd")
    prepare_deferred(opt)
    before = [p.detach().clone() for p in model.parameters()]
    _grads(model, 0)
    guard = StepGuard(mode, 5, torch.amp.GradScaler("cpu", enabled=False), torch.device("cpu"),
                      RunLog(None), agree=lambda flag: torch.ones_like(flag))
    applied = guard.step(opt, model, None, torch.tensor(1.0), torch.tensor(2.0), 0)
    assert not bool(applied)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))


def test_the_loops_graphed_branch_trains_exactly_like_the_plain_one(toy, tmp_path,
                                                                    monkeypatch):
    # On the CPU the graphed step runs its body eagerly (no capture); the loop's wiring around
    # it (static outputs, scheduler, guard, EMA, checkpoints) must give the very same weights.
    from dlperf.train import graphs

    common = dict(epochs=2, deterministic=True, nonfinite_check="deferred", ema_decay=0.9,
                  max_grad_norm=5.0)
    train(_cfg(toy, tmp_path / "plain", **common), resume=None, progress=False, mfu=False)
    monkeypatch.setattr(graphs, "graph_capture_supported", lambda device: True)
    train(_cfg(toy, tmp_path / "graphed", cuda_graphs=True, **common), resume=None,
          progress=False, mfu=False)
    a, _ = ckpt.load_latest(tmp_path / "plain" / "checkpoints")
    b, _ = ckpt.load_latest(tmp_path / "graphed" / "checkpoints")
    for part in ("model", "ema"):
        for key, value in a[part].items():
            assert torch.equal(b[part][key], value), (part, key)


def test_the_deferred_step_reads_nothing_back_from_the_device(toy, tmp_path,
                                                              monkeypatch):
    # Every read of a tensor's value on the host (.item(), bool(), float(), int(), .tolist())
    # is a device sync on a GPU. On the CPU they are cheap, but counting them per call site
    # shows whether any happens every step: none may, in dlperf's own code.
    import collections
    import sys as _sys

    counts = collections.Counter()

    def counting(name):
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, **kwargs):
            frame = _sys._getframe(1)
            if "/dlperf/" in frame.f_code.co_filename.replace("\\\\", "/"):
                counts[f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}"] += 1
            return original(self, *args, **kwargs)
        return wrapper

    for name in ("item", "__bool__", "__float__", "__int__", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, counting(name))
    summary = train(_cfg(toy, tmp_path / "s", epochs=2, val_data="none", log_every=1000,
                         nonfinite_check="deferred", ema_decay=0.9, max_grad_norm=5.0),
                    resume=None, progress=False, mfu=False)
    steps = summary["steps"]
    assert steps == 12
    per_step = {site: n for site, n in counts.items() if n >= steps}
    assert not per_step, per_step
    assert counts  # the epoch-end reads were seen, so the counting itself works
