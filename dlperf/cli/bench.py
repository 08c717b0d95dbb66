"""`dlperf bench`: one optimisation at a time, measured (the input pipeline against
torchvision/DALI/FFCV, the training-step ladder, the guide's GEMM and convolution figures)."""

from __future__ import annotations

from dlperf.cli.common import (Parser, default_corpus, new_console, positive_int,
                               result_path, warn_native)
from dlperf.errors import DlperfError


def add_parser(sub) -> None:
    """`dlperf bench data | train | gemm | conv`."""
    bench = sub.add_parser("bench", help="measure one optimisation at a time",
                           description="Benchmarks: a baseline plus one change, side by side.")
    bsub = bench.add_subparsers(dest="bench_command", metavar="WHAT", parser_class=Parser)
    bd = bsub.add_parser("data", help="input pipeline vs torchvision (and DALI if installed)",
                         description="Throughput of dlperf's input pipeline against torchvision's "
                                     "ImageFolder/DataLoader and DALI's CPU pipeline on a JPEG "
                                     "corpus, same train transform, rounds interleaved, medians. "
                                     "Saves JSON (hardware, versions, commit, config) and a PNG.")
    bd.add_argument("data", nargs="?", default=None,
                    help="ImageNet-layout JPEG folder [dlperf's own benchmark corpus, made once "
                         "in the cache: see `dlperf data corpus`]")
    bd.add_argument("--threads", type=positive_int, default=2, help="dlperf threads [2]")
    bd.add_argument("--workers", type=int, default=2, help="torchvision DataLoader workers [2]")
    bd.add_argument("--rounds", type=positive_int, default=7, help="timed blocks each [7]")
    bd.add_argument("--ladder", action="store_true",
                    help="instead: dlperf's own CPU path built up one speed-up at a time (full "
                         "decode -> fast IDCT -> DCT scaling -> region decode -> restart markers "
                         "-> shards -> threads), each rung the previous plus one change "
                         "[results in data-ladder.json]")
    bd.add_argument("--batch-size", type=positive_int, default=64,
                    help="images per batch in every pipeline [64]")
    bd.add_argument("--out", default=None,
                    help="result JSON; the PNG goes beside it [benchmarks/results/data-cpu.json "
                         "(data-ladder.json with --ladder) in a dlperf checkout, else in the "
                         "current folder]")

    bt = bsub.add_parser("train", help="the recipe's speed-ups one at a time (a ladder)",
                         description="Training-step throughput of a model as each speed-up is "
                                     "added (fp32 NCHW baseline, + channels_last, + bf16 "
                                     "autocast, + torch.compile with --compile), synthetic data, "
                                     "medians after warm-up, with model FLOP utilisation.")
    bt.add_argument("--model", default="resnet50",
                    help="torchvision name, tiny, timm:NAME or file.py:factory [resnet50]")
    bt.add_argument("--image-size", type=positive_int, default=128,
                    help="square input size in pixels [128]")
    bt.add_argument("--batch-size", type=positive_int, default=16, help="images per step [16]")
    bt.add_argument("--steps", type=positive_int, default=6, help="timed steps per rung [6]")
    bt.add_argument("--warmup", type=positive_int, default=3, help="warm-up steps per rung [3]")
    bt.add_argument("--compile", action="store_true", help="add a torch.compile rung (slow on CPU)")
    bt.add_argument("--out", default=None,
                    help="result JSON; the PNG goes beside it [benchmarks/results/train-ladder.json "
                         "in a dlperf checkout, else ./train-ladder.json]")

    for kind, what in (("gemm", "GEMM throughput: K around a multiple of 8 (alignment), N "
                                "across tile and wave boundaries, square sizes 512 vs 520"),
                       ("conv", "convolutions: the ResNet stem with 3/4/8 input channels, 3x3 "
                                "layers at channel counts around 64, NCHW vs NHWC")):
        bk = bsub.add_parser(kind, help=f"the performance guide's {kind.upper()} figures on this "
                                        "device, measured and predicted",
                             description=f"{what}: measured on this device (median of repeats) "
                                         "with dlperf's prediction for the same shapes drawn over "
                                         "it. Saves JSON (hardware, versions, commit, config) "
                                         "and a PNG.")
        bk.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                        help="where to measure [auto: cuda if present, else cpu]")
        bk.add_argument("--dtype", default="auto", choices=("auto", "fp32", "tf32", "bf16", "fp16"),
                        help="operand type [auto: fp16 on a GPU, as the guide's figures; fp32 on "
                             "a CPU]")
        bk.add_argument("--spec", default=None,
                        help="what the predictions use: a preset or a `dlperf probe` file [the "
                             "preset matching this GPU; on a CPU a quick probe of it]")
        bk.add_argument("--quick", action="store_true", help="tiny sizes: seconds, for a smoke test")
        bk.add_argument("--repeats", type=positive_int, default=7,
                        help="rounds over every shape; each shape's time is the median of its "
                             "rounds [7]")
        bk.add_argument("--out", default=None,
                        help=f"result JSON; the PNG goes beside it [benchmarks/results/"
                             f"{kind}-cpu.json (or {kind}-gpu.json) in a dlperf checkout, else "
                             "the current folder]")


def run(args) -> int:
    if args.bench_command == "train":
        return _train(args)
    if args.bench_command in ("gemm", "conv"):
        return _kernels(args)
    if args.bench_command != "data":
        raise DlperfError("dlperf bench: choose what to measure: data, train, gemm or conv "
                          "(see dlperf bench --help)")
    from dlperf.bench import data, render

    cfg = data.DataBenchConfig(data=args.data or str(default_corpus()),
                               batch_size=args.batch_size, threads=args.threads,
                               workers=args.workers, rounds=args.rounds)
    console = new_console()
    warn_native(console)
    if args.ladder:
        return _measure_and_save(
            console, "measuring the ladder", None, lambda tick: data.run_ladder(cfg, tick),
            result_path(args.out, "data-ladder.json"), "data-ladder",
            data.plot_ladder, keep_config=True,
            show=lambda r: render.data_ladder(r, cfg.data, console))
    return _measure_and_save(
        console, "benchmarking pipelines", None, lambda tick: data.run(cfg, tick),
        result_path(args.out, "data-cpu.json"), "data-cpu", data.plot,
        keep_config=True, show=lambda r: render.data_pipelines(r, console))


def _measure_and_save(console, label: str, total, measure, out, name: str, plot, show,
                      keep_config: bool = False) -> int:
    """Measure with a progress bar, show the result, save it as JSON (with hardware, versions
    and commit) and its picture beside it."""
    from rich.progress import Progress

    from dlperf.provenance import save_result

    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(label, total=total)
        result = measure(lambda: bar.advance(task))
    show(result)
    config = result.pop("config")
    save_result(out, name, config, result)
    png = plot({**result, "config": config} if keep_config else result, out.with_suffix(".png"))
    console.print(f"Wrote {out}" + (f" and {png}" if png else ""))
    return 0


def _train(args) -> int:
    from dlperf.bench import ladder, render
    from dlperf.plots import ladder_chart

    lcfg = ladder.LadderConfig(model=args.model, image_size=args.image_size,
                               batch_size=args.batch_size, warmup=args.warmup, steps=args.steps,
                               compile=args.compile)
    console = new_console()
    return _measure_and_save(
        console, "timing training steps", None, lambda tick: ladder.run(lcfg, tick),
        result_path(args.out, "train-ladder.json"), "train-ladder", ladder_chart,
        show=lambda r: render.train_ladder(r, lcfg, console))


def _kernel_spec(args, device):
    """The spec `dlperf bench gemm|conv` predicts with: --spec, else the preset matching this
    GPU, else (CPU) a quick probe of this machine."""
    from dlperf.hardware.specs import get_device, match_preset

    if args.spec:
        return get_device(args.spec)
    if device.type == "cuda":
        import torch

        name = torch.cuda.get_device_name(device)
        spec = match_preset(name)
        if spec is None:
            raise DlperfError(f"no preset matches {name}: pass --spec with a preset (dlperf "
                              "devices) or a `dlperf probe` file")
        return spec
    from dlperf.hardware.probe import ProbeConfig, probe

    with new_console().status("probing this CPU's ceilings for the predictions (--spec to skip)..."):
        return probe(ProbeConfig(device="cpu", quick=True))[0]


def _kernels(args) -> int:
    from dlperf.bench import kernels, render
    from dlperf.hardware.probe import resolve_device

    cfg = kernels.KernelBenchConfig(kind=args.bench_command, device=args.device,
                                    dtype=args.dtype, quick=args.quick, repeats=args.repeats)
    device = resolve_device(args.device)
    gpu = device.type == "cuda"
    kernels.resolve_dtype(cfg, gpu)  # a wrong --dtype is refused before any probing
    out = result_path(args.out, f"{cfg.kind}-{'gpu' if gpu else 'cpu'}.json")
    spec = _kernel_spec(args, device)
    console = new_console()
    return _measure_and_save(
        console, f"measuring {cfg.kind} shapes", kernels.point_count(cfg, gpu),
        lambda tick: kernels.run(cfg, spec, progress=tick), out, f"bench-{cfg.kind}",
        kernels.plot, show=lambda r: render.kernels(r, cfg.kind, spec.name, console))
