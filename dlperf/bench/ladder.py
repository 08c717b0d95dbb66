"""`dlperf bench train`: the recipe's speed-ups measured one at a time (a cumulative ladder).

Each rung is the previous one plus one change (a cumulative ladder of single changes; on a GPU, compile replaces
the CUDA-graphs rung, as the two are exclusive), all in one process on
synthetic data, timed as the median of training steps after warm-up steps (forward, loss,
backward, optimizer step; synchronised on a GPU). Model FLOP utilisation uses dlperf's own FLOP
count of the model and this machine's measured ceiling for the rung's math unit.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass

import torch

from dlperf.train.recipes import TrainConfig


@dataclass(frozen=True)
class LadderConfig:
    model: str = "resnet50"
    image_size: int = 128
    batch_size: int = 16
    warmup: int = 3
    steps: int = 6
    compile: bool = False
    device: str = "auto"


RUNGS = [
    ("fp32 NCHW eager (baseline)", dict(dtype="fp32", channels_last=False)),
    ("+ channels_last", dict(channels_last=True)),
    ("+ bf16 autocast", dict(dtype="bf16")),
]


def step_parts(cfg: TrainConfig, lcfg: LadderConfig, device: torch.device):
    """The trainer's step for this rung: the same model build, speed-ups, optimizer and step
    parts (``train.step.build_parts``) as `dlperf train` with ``cfg``, on one process; with
    CUDA graphs, the trainer's GraphedStep around it."""
    from dlperf.models.registry import build_classifier
    from dlperf.train import speedups
    from dlperf.train.graphs import GraphedStep
    from dlperf.train.metrics import RunLog
    from dlperf.train.optim import build_optimizer
    from dlperf.train.step import build_parts

    torch.manual_seed(0)
    model = speedups.apply(build_classifier(lcfg.model, 1000), cfg, device)
    run_model = speedups.maybe_compile(model, cfg)
    parts = build_parts(cfg, model, run_model, build_optimizer(model, cfg, device), device,
                        RunLog(None))  # RunLog(None): the no-op log
    graphed = GraphedStep(parts, warmup=1) if cfg.cuda_graphs else None
    return parts, graphed


def _time_steps(cfg: TrainConfig, lcfg: LadderConfig, device: torch.device, progress=None):
    """Median-ready step times of ``step.train_step`` (the step `dlperf train` runs), each
    synchronised on a GPU; the first step's time is the compile time when compiling."""
    from dlperf.train.step import train_step

    parts, graphed = step_parts(cfg, lcfg, device)
    x = torch.randn(lcfg.batch_size, 3, lcfg.image_size, lcfg.image_size, device=device)
    if cfg.channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (lcfg.batch_size,), device=device)
    times, compile_s = [], 0.0
    for i in range(lcfg.warmup + lcfg.steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        if graphed is not None:
            graphed(x, y)
        else:
            train_step(parts, [(x, y)], i)
            parts.scaler.update()
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if i == 0 and cfg.compile:
            compile_s = dt
        if i >= lcfg.warmup:
            times.append(dt)
        if progress:
            progress()
    return times, compile_s


def predicted_img_per_s(lcfg: LadderConfig, cfg: TrainConfig, spec, on_gpu: bool
                        ) -> float | None:
    """What `dlperf analyze` predicts for this rung on ``spec`` (issue #11: every measured rung
    beside its prediction). Eager rungs are the analysed step as is; the CUDA-graphs rung drops
    the predicted launch overhead (rule launch-overhead); the compile rung is the step as
    torch.compile(model) fuses it (``--fusion compile``, analysis/compiled.py). None when the
    model cannot be analysed."""
    if spec is None:
        return None
    try:
        from dlperf.analysis.api import AnalysisConfig, analyze_model
        from dlperf.models.registry import build_classifier

        with torch.device("meta"):
            model = build_classifier(lcfg.model, 1000, meta=True)
        acfg = AnalysisConfig(model=lcfg.model, dtype=cfg.dtype, tf32=cfg.tf32 and on_gpu,
                              input_shape=(lcfg.batch_size, 3, lcfg.image_size, lcfg.image_size),
                              train=True, channels_last=cfg.channels_last, device=spec.name,
                              optimizer="sgd", fusion="compile" if cfg.compile else "none")
        analysis = analyze_model(model, acfg, spec)
    except Exception:  # a model the analyzer cannot capture: no prediction, never a failed run
        return None
    step = analysis.totals()["predicted_time_s"]
    saving = {f.rule: f.saving_s for f in analysis.findings}
    if cfg.cuda_graphs:
        step -= saving.get("launch-overhead", 0.0)
    return lcfg.batch_size / step if step > 0 else None


def run(lcfg: LadderConfig, progress=None) -> dict:
    from dlperf.train.distributed import setup
    from dlperf.train.metrics import device_spec, flops_per_image, utilisation

    device = setup(lcfg.device).device
    rungs = list(RUNGS)
    if device.type == "cuda":  # one launch per step instead of ~1,000 (needs a GPU)
        rungs.append(("+ CUDA graphs (whole step)", dict(cuda_graphs=True)))
    if lcfg.compile:  # exclusive with cuda_graphs: compile replaces it (reduce-overhead adds graphs)
        rungs.append(("+ torch.compile" + (" (instead of CUDA graphs)" if device.type == "cuda"
                                           else ""), dict(compile="default", cuda_graphs=False)))
    cfg = TrainConfig(model=lcfg.model, zero_init_residual=False, tf32=True)
    rows = []
    spec_and_source = device_spec(device)  # one probe on a CPU, shared by every rung
    for name, change in rungs:
        cfg = dataclasses.replace(cfg, **change)
        times, compile_s = _time_steps(cfg, lcfg, device, progress)
        med = statistics.median(times)
        img_s = lcfg.batch_size / med
        fpi = flops_per_image(lcfg.model, 1000, lcfg.image_size, cfg.dtype)
        use = utilisation(fpi * img_s, device, cfg.dtype, spec_and_source) if fpi else {}
        predicted = predicted_img_per_s(lcfg, cfg, spec_and_source[0], device.type == "cuda")
        rows.append({"rung": name, "config": {k: getattr(cfg, k) for k in
                                              ("dtype", "channels_last", "compile",
                                               "cuda_graphs")},
                     "step_median_s": med, "step_s": times, "img_per_s": img_s,
                     "compile_s": compile_s, "flops_per_image": fpi,
                     "peak_flops": use.get("peak_flops"),
                     "peak_source": use.get("peak_source", spec_and_source[1]),
                     "mfu": use.get("mfu"),
                     "predicted_img_per_s": predicted, "prediction_source": spec_and_source[1],
                     "measured_over_predicted": img_s / predicted if predicted else None})
    base = rows[0]["img_per_s"]
    for r in rows:
        r["speedup_vs_baseline"] = r["img_per_s"] / base
    return {"rungs": rows, "device": str(device), "config": dataclasses.asdict(lcfg)}
