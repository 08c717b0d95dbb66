"""`dlperf analyze | devices | probe`: one parser, one subcommand per stage.

User mistakes (DlperfError, bad flags) print one line and exit 2; bugs keep their traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from dlperf.errors import DlperfError

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not a usage dump (brief: bad input -> one clear line)
        raise DlperfError(f"{self.prog}: {message} (see {self.prog} --help)")


def _int_at_least(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
    return value


def _positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def _batch_size(text: str) -> int:
    value = _int_at_least(text, 1, "a positive integer")
    if value > 1 << 24:  # tensor sizes overflow long before; no GPU holds such a batch
        raise argparse.ArgumentTypeError(f"expected at most {1 << 24:,}, got {value:,}")
    return value


def _nonnegative_int(text: str) -> int:
    return _int_at_least(text, 0, "an integer >= 0")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dlperf",
        description="Make deep-learning training on NVIDIA Tensor Core GPUs fast, and explain why "
                    "it is slow. Start with `dlperf analyze resnet50 --train`.")
    from dlperf import __version__

    parser.add_argument("--version", action="version", version=f"dlperf {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    a = sub.add_parser(
        "analyze", help="per-layer roofline of a model on a GPU (no GPU needed)",
        description="Apply NVIDIA's performance guide to every kernel of a model, forward and "
                    "(with --train) backward: FLOPs (2 per multiply-add), bytes moved, arithmetic "
                    "intensity, compute- or memory-bound, Tensor Core alignment, tile and wave "
                    "quantization, predicted time. Runs on meta tensors: no GPU, no memory.")
    a.add_argument("model", help="torchvision name (resnet50, vit_b_16, ...), gpt, or "
                                 "path/to/file.py:factory returning an nn.Module")
    a.add_argument("--device", default="h100-sxm",
                   help="GPU preset (see `dlperf devices`), a spec file from `dlperf probe` "
                        "(.json/.toml), or cpu for a fresh probe of this machine; several, "
                        "comma-separated, to compare them (the first gets the full table) "
                        "[h100-sxm]")
    a.add_argument("--batch-size", type=_batch_size, default=None,
                   help="samples per step [256 for image models, 8 for gpt]")
    a.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16",
                   help="bf16/fp16: mixed precision as torch.autocast runs it; fp32: no autocast")
    a.add_argument("--tf32", action="store_true", help="with --dtype fp32: GEMMs on TF32 Tensor Cores")
    a.add_argument("--precision", choices=("mixed", "half"), default="mixed",
                   help="with --dtype fp16/bf16: mixed = torch.autocast (fp32 weights, per-op "
                        "casts, softmax/norms in fp32); half = the model cast to the dtype "
                        "(model.half(): no casts, everything and the optimizer state in half) "
                        "[mixed]")
    a.add_argument("--train", action="store_true",
                   help="also the loss and backward pass (dgrad and wgrad)")
    a.add_argument("--channels-last", action="store_true",
                   help="model and input in NHWC (channels_last) memory format")
    a.add_argument("--optimizer", choices=("auto", "sgd", "adamw", "none"), default="auto",
                   help="parameter update counted in a --train step [auto: adamw for gpt and "
                        "token models, sgd otherwise]")
    a.add_argument("--input-shape", help="per-sample shape without batch: C,H,W (3,224,224) or "
                                         "FEATURES for non-image models")
    a.add_argument("--input-dtype", choices=("float32", "int64"), default=None,
                   help="input element type: int64 for token ids (embedding models) "
                        "[float32; int64 for gpt]")
    a.add_argument("--num-classes", type=_positive_int, help="classifier outputs (torchvision)")
    a.add_argument("--measure", action="store_true",
                   help="also run the step for real on this machine (--device cpu, or a GPU "
                        "preset when that GPU is present) and show measured beside predicted "
                        "time per kernel")
    a.add_argument("--measure-steps", type=_positive_int, default=3,
                   help="timed steps for --measure, after one warm-up step [3]")
    a.add_argument("--json", metavar="PATH", help="write the full result as JSON")
    a.add_argument("--html", metavar="PATH",
                   help="write a self-contained HTML report with the roofline plot")
    a.add_argument("--top", type=_positive_int, default=25, help="rows in the table [25]")
    a.add_argument("--macs", action="store_true", help="show multiply-accumulates, not FLOPs")
    g = a.add_argument_group("gpt (built-in GPT-style decoder)")
    g.add_argument("--layers", type=_positive_int, default=12, help="decoder blocks [12]")
    g.add_argument("--d-model", type=_positive_int, default=768,
                   help="hidden size, a multiple of --heads [768]")
    g.add_argument("--heads", type=_positive_int, default=12, help="attention heads [12]")
    g.add_argument("--vocab", type=_positive_int, default=50257,
                   help="vocabulary size (the LM head's width) [50257]")
    g.add_argument("--seq-len", type=_positive_int, default=1024,
                   help="tokens per sequence (the input shape) [1024]")

    d = sub.add_parser("devices", help="list the GPU presets and their datasheet figures",
                       description="List device presets: SMs, memory bandwidth, dense peak "
                                   "FLOP/s per math unit and ops:byte ratios, with each source.")
    d.add_argument("--json", metavar="PATH", nargs="?", const="-", default=None,
                   help="write every preset as JSON to PATH (all fields, sparse peaks and "
                        "sources); without PATH, print it")

    data = sub.add_parser("data", help="prepare and verify datasets for the input pipeline",
                          description="Dataset tools for dlperf's input pipeline.")
    dsub = data.add_subparsers(dest="data_command", metavar="ACTION", parser_class=_Parser)
    dp = dsub.add_parser("prepare", help="image folder -> tar shards + index",
                         description="Write an ImageNet-layout folder (or a .csv list) as tar "
                                     "shards in webdataset naming (KEY.jpg + KEY.cls) with an "
                                     "index of byte offsets and DALI's .idx per shard; "
                                     "optionally re-encode smaller "
                                     "(--max-side), which makes decoding several times cheaper. "
                                     "JPEGs are rewritten losslessly (same pixels) with restart "
                                     "markers so random crops decode only the data under them. "
                                     "Unreadable files are skipped and reported.")
    dp.add_argument("src", help="image folder (ROOT/CLASS/IMAGE) or a path,label .csv")
    dp.add_argument("dst", help="empty output folder")
    dp.add_argument("--shard-size", default="1GB", help="bytes of images per shard [1GB]")
    dp.add_argument("--max-side", type=_positive_int, default=None,
                    help="shrink images so the longer side is at most this, re-encoding them")
    dp.add_argument("--quality", type=_positive_int, default=90,
                    help="JPEG quality when re-encoding [90]")
    dp.add_argument("--threads", type=_positive_int, default=None,
                    help="decode/re-encode threads [every CPU]; the output is the same for any")
    dp.add_argument("--json", metavar="PATH", default=None,
                    help="also write the summary (samples, shards, skipped and changed files) "
                         "to this JSON file")
    dp.add_argument("--restart-px", type=_nonnegative_int, default=32,
                    help="rewrite JPEGs losslessly with restart markers at most this many pixels "
                         "apart in each row, so random crops decode only the data under them "
                         "[32]; 0 stores JPEGs byte for byte")
    dt = dsub.add_parser("toy", help="write a small learnable dataset (train/ and val/)",
                         description="Write a small JPEG dataset that a tiny CNN learns in "
                                     "seconds: try `dlperf train --recipe tiny data=DST/train "
                                     "val_data=DST/val`.")
    dt.add_argument("dst", help="folder to create")
    dt.add_argument("--classes", type=_positive_int, default=4,
                    help="classes (sub-folders), each a different pattern [4]")
    dt.add_argument("--per-class", type=_positive_int, default=40,
                    help="training images per class; val/ gets a quarter as many [40]")
    dc = dsub.add_parser("corpus", help="make an ImageNet-like benchmark corpus (no download)",
                         description="Write ImageNet-like JPEGs (about 500x420, baseline 4:2:0, "
                                     "~100 KB each, in class folders) made from the photograph "
                                     "matplotlib ships: random crops and sizes, a tint per "
                                     "class, sensor-like noise. Deterministic for a seed; decodes "
                                     "at the speed of real ImageNet-like photos.")
    dc.add_argument("dst", help="folder to create")
    dc.add_argument("--images", type=_positive_int, default=320, help="JPEGs to write [320]")
    dc.add_argument("--classes", type=_positive_int, default=10,
                    help="class folders (images are dealt out in turn) [10]")
    dc.add_argument("--seed", type=_nonnegative_int, default=0,
                    help="the same seed gives the same bytes [0]")
    dv = dsub.add_parser("verify", help="check a prepared dataset: index vs tar, decode all",
                         description="Check every index entry (and each shard's DALI .idx) "
                                     "against its tar members and decode every sample; exit 1 "
                                     "when anything is wrong.")
    dv.add_argument("dst", help="folder written by `dlperf data prepare`")
    dv.add_argument("--threads", type=_positive_int, default=None,
                    help="decoding threads [every CPU]; the report is the same for any")
    dv.add_argument("--json", metavar="PATH", default=None,
                    help="also write the report (samples, shards, notes, problems) to this "
                         "JSON file")
    di = dsub.add_parser("inspect", help="which decode path each file takes, and what to fix",
                         description="Read every file's header (no decoding) and count the "
                                     "decode path dlperf's loader takes for a training crop: "
                                     "restart-marker cut, region decode, progressive, rotated, "
                                     "Pillow, bad; then say which command fixes what.")
    di.add_argument("src", help="image folder, path,label .csv, or prepared shards")
    di.add_argument("--size", type=_positive_int, default=224, help="training crop size [224]")
    di.add_argument("--limit", type=_positive_int, default=None,
                    help="inspect only the first N samples [all]")
    di.add_argument("--json", metavar="PATH", default=None,
                    help="also write the report to this JSON file")

    bench = sub.add_parser("bench", help="measure one optimisation at a time",
                           description="Benchmarks: a baseline plus one change, side by side.")
    bsub = bench.add_subparsers(dest="bench_command", metavar="WHAT", parser_class=_Parser)
    bd = bsub.add_parser("data", help="input pipeline vs torchvision (and DALI if installed)",
                         description="Throughput of dlperf's input pipeline against torchvision's "
                                     "ImageFolder/DataLoader and DALI's CPU pipeline on a JPEG "
                                     "corpus, same train transform, rounds interleaved, medians. "
                                     "Saves JSON (hardware, versions, commit, config) and a PNG.")
    bd.add_argument("data", nargs="?", default=None,
                    help="ImageNet-layout JPEG folder [dlperf's own benchmark corpus, made once "
                         "in the cache: see `dlperf data corpus`]")
    bd.add_argument("--threads", type=_positive_int, default=2, help="dlperf threads [2]")
    bd.add_argument("--workers", type=int, default=2, help="torchvision DataLoader workers [2]")
    bd.add_argument("--rounds", type=_positive_int, default=7, help="timed blocks each [7]")
    bd.add_argument("--ladder", action="store_true",
                    help="instead: dlperf's own CPU path built up one speed-up at a time (full "
                         "decode -> fast IDCT -> DCT scaling -> region decode -> restart markers "
                         "-> shards -> threads), each rung the previous plus one change "
                         "[results in data-ladder.json]")
    bd.add_argument("--batch-size", type=_positive_int, default=64,
                    help="images per batch in every pipeline [64]")
    bd.add_argument("--out", default=None,
                    help="result JSON; the PNG goes beside it [benchmarks/results/data-cpu.json "
                         "(data-ladder.json with --ladder) in a dlperf checkout, else in the "
                         "current folder]")

    t = sub.add_parser("train", help="train a classifier with the record ResNet-50 recipe",
                       description="Train with mixed precision, NHWC, the dlperf input pipeline "
                                   "and data parallelism (torchrun --nproc_per_node N -m dlperf "
                                   "train ...). Start from a recipe or a TOML file and override "
                                   "any setting as key=value. Checkpoints are atomic; the same "
                                   "command resumes from the newest one. Exit codes: 0 done, "
                                   "2 bad input, 3 too many non-finite steps, 75 stopped by "
                                   "SIGTERM/SIGUSR1 after checkpointing.")
    t.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="settings to change, e.g. epochs=2 data=path/to/folder batch_size=64")
    src = t.add_mutually_exclusive_group()
    src.add_argument("--recipe", default="resnet50-90ep",
                     help="resnet50-90ep, resnet50-fast or tiny [resnet50-90ep]")
    src.add_argument("--config", help="TOML file (optional recipe = \"name\" plus settings)")
    t.add_argument("--resume", default="auto",
                   help="auto (newest complete checkpoint in out_dir), never, or a .pt path [auto]")
    t.add_argument("--show-config", action="store_true", help="print the resolved config and exit")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--json", metavar="PATH", default=None,
                   help="also write the run's summary to this JSON file (it is always in "
                        "out_dir/summary.json)")
    t.add_argument("--no-mfu", action="store_true",
                   help="skip the model FLOP utilisation figure (on a CPU its ceiling comes from "
                        "a probe of this machine, ~10 s once, then cached)")

    bt = bsub.add_parser("train", help="the recipe's speed-ups one at a time (a ladder)",
                         description="Training-step throughput of a model as each speed-up is "
                                     "added (fp32 NCHW baseline, + channels_last, + bf16 "
                                     "autocast, + torch.compile with --compile), synthetic data, "
                                     "medians after warm-up, with model FLOP utilisation.")
    bt.add_argument("--model", default="resnet50",
                    help="torchvision name, tiny, timm:NAME or file.py:factory [resnet50]")
    bt.add_argument("--image-size", type=_positive_int, default=128,
                    help="square input size in pixels [128]")
    bt.add_argument("--batch-size", type=_positive_int, default=16, help="images per step [16]")
    bt.add_argument("--steps", type=_positive_int, default=6, help="timed steps per rung [6]")
    bt.add_argument("--warmup", type=_positive_int, default=3, help="warm-up steps per rung [3]")
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
        bk.add_argument("--repeats", type=_positive_int, default=7,
                        help="rounds over every shape; each shape's time is the median of its "
                             "rounds [7]")
        bk.add_argument("--out", default=None,
                        help=f"result JSON; the PNG goes beside it [benchmarks/results/"
                             f"{kind}-cpu.json (or {kind}-gpu.json) in a dlperf checkout, else "
                             "the current folder]")

    p = sub.add_parser("probe", help="measure this machine's matmul/conv FLOP/s and bandwidth",
                       description="Measure matmul (and conv) FLOP/s per dtype and copy bandwidth "
                                   "on this machine (GPU if present, else CPU), print them beside "
                                   "the datasheet preset, and save a spec file for "
                                   "`dlperf analyze --device PATH`.")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="what to measure [auto: cuda if present, else cpu]")
    p.add_argument("--quick", action="store_true",
                   help="small sizes: ~10 s on a 2-core CPU (the full probe ~1 min)")
    p.add_argument("--sweep", action="store_true",
                   help="also time generic layers (convolutions, linear, BN+ReLU, residual "
                        "adds) and fit the efficiency model to this machine: the spec file then "
                        "predicts real layers, not just peaks")
    p.add_argument("--compare", default=None,
                   help="preset to print beside the measurement (default: the preset matching "
                        "this GPU's name; none on CPU)")
    p.add_argument("--out", default="dlperf-probe.json", help="spec file to write [dlperf-probe.json]")
    return parser


def _console():
    """Rich console; 160 columns when output is not a terminal (logs, CI) so tables stay legible."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=160)


def _write_result(path: str | None, result: dict, console) -> None:
    """The `--json PATH` convention: every command that has a result writes it there."""
    if path is None:
        return
    from dlperf.report import write_json_atomic

    write_json_atomic(path, result)
    console.print(f"Wrote {path}")


def _output_file(path: str | None, flag: str) -> None:
    """Refuse an output path that cannot be written, before minutes of work are spent."""
    if path is None:
        return
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        raise DlperfError(f"{flag} {path}: is a folder; give a file name")
    if not p.parent.exists():
        raise DlperfError(f"{flag} {path}: folder {p.parent} does not exist")


def _cmd_analyze(args) -> int:
    import torch

    _output_file(args.json, "--json")
    _output_file(args.html, "--html")

    from dlperf.analysis.api import AnalysisConfig, capture_costs, predict_on
    from dlperf.analysis.report import render, render_comparison
    from dlperf.models.registry import build_model, parse_input_shape
    from dlperf.report import write_json_atomic

    console = _console()
    gpt = None
    if args.model == "gpt":
        from dlperf.models.gpt import GPTConfig

        try:
            gpt = GPTConfig(layers=args.layers, d_model=args.d_model, heads=args.heads,
                            vocab=args.vocab, seq_len=args.seq_len)
        except ValueError as exc:
            raise DlperfError(str(exc)) from None
    names = [d.strip() for d in args.device.split(",") if d.strip()]
    if not names:
        raise DlperfError("--device: give a preset, a spec file or cpu")
    if len(names) > 1 and args.measure:
        raise DlperfError("--measure needs a single --device")
    specs = []
    for name in names:
        if name == "cpu":
            from dlperf.hardware.probe import ProbeConfig, probe

            with console.status("probing this CPU's ceilings (--device cpu)..."):
                specs.append(probe(ProbeConfig(device="cpu", quick=True))[0])
        else:
            from dlperf.hardware.specs import get_device

            specs.append(get_device(name))
    if args.dtype == "bf16":  # before the capture, so a comparison never stops half printed
        lacking = [s.name for s in specs if s.peak_flops("bf16") is None]
        if lacking:
            raise DlperfError(f"{', '.join(lacking)} has no bf16 math: use --dtype fp16 or fp32, "
                              "or leave it out of --device")
    spec = specs[0]
    model, model_input = build_model(args.model, gpt=gpt, num_classes=args.num_classes)
    sample_shape = (parse_input_shape(args.input_shape) if args.input_shape is not None
                     else model_input.shape)
    batch = args.batch_size or (8 if model_input.kind == "tokens" else 256)
    tokens = (args.input_dtype or ("int64" if model_input.kind == "tokens" else "")) == "int64"
    cfg = AnalysisConfig(model=args.model, input_shape=(batch, *sample_shape), dtype=args.dtype,
                         tf32=args.tf32, train=args.train, channels_last=args.channels_last,
                         device=spec.name, tokens=tokens and len(sample_shape) == 1,
                         optimizer=(("adamw" if tokens else "sgd") if args.optimizer == "auto"
                                    else args.optimizer), precision=args.precision)
    if args.tf32 and args.dtype != "fp32":
        raise DlperfError("--tf32 applies to --dtype fp32 only (bf16/fp16 already use Tensor Cores)")
    input_dtype = {"float32": torch.float32, "int64": torch.long}.get(args.input_dtype,
                                                                      model_input.dtype)
    costs, uncounted, seconds, memory = capture_costs(model, cfg, input_dtype)  # once for all
    analysis = predict_on(costs, uncounted, cfg, spec, seconds, memory=memory)
    render(analysis, console, top=args.top, macs=args.macs)
    result = analysis.to_dict()
    if len(specs) > 1:
        others = [analysis] + [predict_on(costs, uncounted, cfg, s, seconds, memory=memory)
                               for s in specs[1:]]
        result["comparison"] = render_comparison(others, console)
    if args.measure:
        result["measurement"] = _measure(args, cfg, spec, gpt, input_dtype, console).to_dict()
    if args.json:
        from dlperf.bench.results import environment

        # machine, versions and commit beside the numbers (a --measure run is a benchmark)
        write_json_atomic(args.json, {**result, "environment": environment()})
        console.print(f"Wrote {args.json}")
    if args.html:
        from dlperf.analysis.html import render_html
        from dlperf.report import write_text_atomic

        write_text_atomic(args.html, render_html(analysis))
        console.print(f"Wrote {args.html}")
    return 0


def _measure(args, cfg, spec, gpt, input_dtype, console):
    import torch
    from rich.progress import Progress

    from dlperf.analysis.measure import MeasureConfig, measure
    from dlperf.analysis.report import render_measurement
    from dlperf.models.registry import build_model

    if args.device == "cpu":
        device = "cpu"
    elif torch.cuda.is_available():
        device = "cuda"
    else:
        raise DlperfError(f"--measure runs the model here, and no CUDA GPU is visible for "
                          f"--device {args.device}; use --device cpu to measure this CPU")
    model, _ = build_model(args.model, gpt=gpt, num_classes=args.num_classes, real=True)
    mcfg = MeasureConfig(steps=args.measure_steps)
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"measuring on {device}", total=mcfg.steps + mcfg.warmup)
        result = measure(model, cfg, spec, device, input_dtype, mcfg,
                         progress=lambda: bar.advance(task))
    render_measurement(result, console, top=args.top)
    return result


def _cmd_devices(args) -> int:
    from rich.table import Table

    from dlperf.hardware.specs import MATH_UNITS, PRESETS

    if args.json:
        import json

        presets = [s.to_dict() for s in PRESETS.values()]
        if args.json == "-":
            print(json.dumps(presets, indent=1))
        else:
            from dlperf.report import write_json_atomic

            _output_file(args.json, "--json")
            write_json_atomic(args.json, presets)
            print(f"Wrote {args.json}")
        return 0

    table = Table(title="Device presets (dense peaks; sparse figures are never used)",
                  title_justify="left", header_style="bold")
    for col in ("name", "device", "SMs", "HBM GB/s", *(f"{u} TF/s" for u in MATH_UNITS),
                "bf16/fp16 ops:B"):
        table.add_column(col, justify="left" if col in ("name", "device") else "right")
    for spec in PRESETS.values():
        tc = spec.ops_per_byte("bf16") or spec.ops_per_byte("fp16")
        table.add_row(spec.name, spec.display_name, str(spec.sm_count),
                      f"{spec.mem_bandwidth / 1e9:,.0f}",
                      *(f"{spec.peak[u] / 1e12:,.1f}" if u in spec.peak else "-" for u in MATH_UNITS),
                      f"{tc:.1f}" if tc else "-")
    console = _console()
    console.print(table)
    console.print("cpu: measured on this machine by `dlperf probe` (or `analyze --device cpu`). "
                  "`dlperf devices --json` shows each preset's datasheet address (field source).")
    return 0


def probe_device(spec) -> str:
    """The torch device a probe's spec was measured on."""
    return "cpu" if spec.name == "cpu" else "cuda"


def _cmd_probe(args) -> int:
    from rich.progress import Progress
    from rich.table import Table

    from dlperf.hardware.probe import ProbeConfig, probe, probe_task_count
    from dlperf.hardware.specs import get_device
    from dlperf.report import write_json_atomic

    _output_file(args.out, "--out")  # before minutes of measuring
    cfg = ProbeConfig(device=args.device, quick=args.quick)
    preset = get_device(args.compare) if args.compare else None
    if preset is None and args.device != "cpu":
        import torch

        from dlperf.hardware.specs import match_preset

        if torch.cuda.is_available():  # print the datasheet beside what we measure
            preset = match_preset(torch.cuda.get_device_name())
    console = _console()
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("measuring", total=probe_task_count(cfg))
        spec, measurements = probe(cfg, progress=lambda: bar.advance(task))
    table = Table(title=f"Measured ceilings: {spec.display_name}", title_justify="left")
    for col in ("kind", "unit", "shape", "measured", "preset" if preset else ""):
        if col:
            table.add_column(col)
    for m in measurements:
        if m.kind == "copy":
            value = f"{m.value / 1e9:,.1f} GB/s"
            ref = f"{preset.mem_bandwidth / 1e9:,.0f} GB/s" if preset else None
        elif m.kind in ("launch", "host"):
            value, ref = f"{m.value * 1e6:.2f} µs/op", None
        else:
            value = f"{m.value / 1e12:,.3f} TFLOP/s"
            ref = (f"{preset.peak[m.unit] / 1e12:,.1f} TFLOP/s" if preset and m.unit in preset.peak
                   else None)
        table.add_row(m.kind, m.unit, m.shape, value, *([ref or "-"] if preset else []))
    console.print(table)
    from dlperf.bench.results import environment

    sweep = None
    if args.sweep:
        import dataclasses

        from dlperf.analysis.calibrate import CLASS_PARAMS, cases, sweep as run_sweep

        with Progress(console=console, transient=True) as bar:
            task = bar.add_task("sweeping layers", total=len(cases(args.quick)))
            overrides, rows, fitted = run_sweep(spec, str(probe_device(spec)), quick=args.quick,
                                                progress=lambda: bar.advance(task))
        spec = dataclasses.replace(spec, efficiency={**spec.efficiency, **overrides})
        sweep = {"fit": fitted, "kernels": rows}
        console.print(
            f"Sweep ({fitted['kernels']} kernels, median |error| after the fit "
            f"{fitted['median_abs_error']:.0%}): GEMMs {fitted['math']:.0%} and convolutions "
            f"{fitted['conv']:.0%} of the probed peak, half rate at M={fitted['gemm_m0']:.0f} "
            f"N={fitted['gemm_n0']:.0f} K={fitted['gemm_k0']:.0f}; streaming kernels "
            f"{fitted['memory']:.0%} of the copy bandwidth, and of that "
            + ", ".join(f"{c.replace('_', ' ')} {fitted[c]:.0%}" for c in CLASS_PARAMS)
            + f"; {fitted['launch_s'] * 1e6:.1f} µs per kernel.")
    write_json_atomic(args.out, {"spec": spec.to_dict(),
                                 "measurements": [m.to_dict() for m in measurements],
                                 **({"sweep": sweep} if sweep else {}),
                                 "environment": environment()})
    console.print(f"Wrote {args.out}; use it with `dlperf analyze MODEL --device {args.out}`.")
    return 0


def _warn_native(console) -> None:
    from dlperf.data.native import warning

    line = warning()
    if line:
        console.print(f"[yellow]warning:[/] {line}")


def _cmd_data_inspect(args, console) -> int:
    from rich.progress import Progress
    from rich.table import Table

    from dlperf.data.inspect import MEANING, PATHS, InspectConfig, inspect
    from dlperf.data.sources import open_source

    source = open_source(args.src)
    _warn_native(console)
    cfg = InspectConfig(size=args.size, limit=args.limit)
    total = len(source) if cfg.limit is None else min(cfg.limit, len(source))
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"reading {total:,} headers", total=total)
        report = inspect(source, cfg, progress=lambda: bar.advance(task))
    table = Table(title=f"{args.src}: decode paths of {report['samples']:,} samples")
    for col in ("path", "files", "share", "mean KB", "what the loader does"):
        table.add_column(col, justify="right" if col in ("files", "share", "mean KB") else "left")
    for path in PATHS:
        count = report["paths"][path]
        if count:
            table.add_row(path, f"{count:,}", f"{count / report['samples']:.1%}",
                          f"{report['mean_kb'][path]:,.0f}", MEANING[path])
    console.print(table)
    if report["median_short_side"]:
        console.print(f"median image: {report['median_megapixels']:.2f} MP, short side "
                      f"{report['median_short_side']:,.0f} px (training crops of {args.size} px)")
    for line in report["advice"] or ["nothing to fix: every file takes the cheapest path."]:
        console.print(f"- {line}")
    if args.json:
        from dlperf.report import write_json_atomic

        write_json_atomic(args.json, report)
        console.print(f"Wrote {args.json}")
    return 0


def _cmd_data(args) -> int:
    from rich.progress import Progress

    from dlperf.data.prepare import PrepareConfig, parse_size, prepare, verify
    from dlperf.data.sources import ShardSource, open_source

    console = _console()
    _output_file(getattr(args, "json", None), "--json")  # before minutes of work
    if args.data_command == "prepare":
        cfg = PrepareConfig(shard_bytes=parse_size(args.shard_size), max_side=args.max_side,
                            quality=args.quality, threads=args.threads or 0,
                            restart_px=args.restart_px)
        source = open_source(args.src)
        _warn_native(console)
        with Progress(console=console) as bar:
            task = bar.add_task(f"writing shards from {len(source):,} images", total=len(source))
            summary = prepare(source, args.dst, cfg, progress=lambda: bar.advance(task))
        if summary["already"]:
            console.print(f"{args.dst} already holds this prepare of {args.src} with the same "
                          f"settings ({summary['samples']:,} samples in {summary['shards']} "
                          "shards): nothing to do.")
            _write_result(args.json, summary, console)
            return 0
        console.print(f"Wrote {summary['samples']:,} samples in {summary['shards']} shards to "
                      f"{args.dst} ({summary['output_bytes'] / 2**20:,.1f} MiB from "
                      f"{summary['input_bytes'] / 2**20:,.1f} MiB) in {summary['seconds']:.1f} s; "
                      f"{summary['restart_markers']:,} JPEGs carry restart markers (lossless "
                      "rewrite: random crops decode only the data under them).")
        for label, rows in (("[yellow]skipped[/]", summary["bad"]),
                            ("[cyan]changed[/]", summary["changed"])):
            for name, reason in rows[:20]:
                console.print(f"  {label} {name}: {reason}")
            if len(rows) > 20:
                console.print(f"  ... {len(rows) - 20} more in {args.dst}/prepare-report.json")
        _write_result(args.json, summary, console)
        return 0
    if args.data_command == "corpus":
        from dlperf.data.corpus import CorpusConfig, make_corpus

        cfg = CorpusConfig(images=args.images, classes=args.classes, seed=args.seed)
        with Progress(console=console, transient=True) as bar:
            task = bar.add_task("writing JPEGs", total=cfg.images)
            s = make_corpus(args.dst, cfg, progress=lambda: bar.advance(task))
        console.print(f"Wrote {s['images']} JPEGs in {s['classes']} classes to {args.dst} "
                      f"(mean {s['mean_bytes'] / 1e3:,.0f} KB, {s['mean_width']:.0f}x"
                      f"{s['mean_height']:.0f}); try: dlperf bench data {args.dst}")
        return 0
    if args.data_command == "toy":
        from pathlib import Path

        from dlperf.data.toy import make_toy_split

        if Path(args.dst).exists() and any(Path(args.dst).iterdir()):
            raise DlperfError(f"{args.dst}: not empty; choose a new folder")
        try:
            train_dir, val_dir = make_toy_split(args.dst, args.per_class, args.classes)
        except OSError as exc:
            raise DlperfError(f"{args.dst}: cannot write there ({exc.strerror}); choose a "
                              "folder you can write") from None
        console.print(f"Wrote {train_dir} and {val_dir}; try: dlperf train --recipe tiny "
                      f"data={train_dir} val_data={val_dir} num_classes={args.classes}")
        return 0
    if args.data_command == "inspect":
        return _cmd_data_inspect(args, console)
    if args.data_command == "verify":
        n = len(ShardSource(args.dst))
        with Progress(console=console) as bar:
            task = bar.add_task("verifying", total=n)
            result = verify(args.dst, progress=lambda: bar.advance(task), threads=args.threads)
        for note in result["notes"]:
            console.print(f"  [yellow]note[/] {note}")
        for where, problem in result["problems"][:20]:
            console.print(f"  [red]problem[/] {where}: {problem}")
        if len(result["problems"]) > 20:
            console.print(f"  ... {len(result['problems']) - 20} more problems")
        ok = not result["problems"]
        console.print(f"{'OK' if ok else 'FAILED'}: {result['samples']:,} samples in "
                      f"{result['shards']} shards, {len(result['problems'])} problems.")
        _write_result(args.json, result, console)
        return 0 if ok else 1
    raise DlperfError("dlperf data: choose an action: prepare, verify, inspect, corpus or toy "
                      "(see dlperf data --help)")


def _default_corpus():
    """dlperf's own benchmark corpus, made (once) with a status line."""
    from dlperf.data.corpus import default_corpus

    with _console().status("making dlperf's benchmark corpus (once per machine)..."):
        return default_corpus()


def _result_path(out: str | None, name: str):
    """--out, checked before minutes of benchmarking; by default the checkout's
    benchmarks/results/NAME when run from one, else NAME in the current folder."""
    from pathlib import Path

    if out is None:
        results = Path("benchmarks") / "results"
        return results / name if results.is_dir() else Path(name)
    path = Path(out)
    if not path.parent.exists():
        raise DlperfError(f"{path}: folder {path.parent} does not exist")
    return path


def _cmd_bench_train(args) -> int:
    from rich.progress import Progress
    from rich.table import Table

    from dlperf.bench.ladder import LadderConfig, run
    from dlperf.bench.results import save_result

    out = _result_path(args.out, "train-ladder.json")
    lcfg = LadderConfig(model=args.model, image_size=args.image_size, batch_size=args.batch_size,
                        warmup=args.warmup, steps=args.steps, compile=args.compile)
    console = _console()
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("timing training steps", total=None)
        result = run(lcfg, progress=lambda: bar.advance(task))
    table = Table(title=f"{lcfg.model}, batch {lcfg.batch_size}, {lcfg.image_size} px, "
                        f"{result['device']}: training step, one change per rung",
                  title_justify="left")
    for col in ("rung", "img/s", "vs baseline", "predicted", "measured/pred", "MFU", "ceiling"):
        table.add_column(col, justify="left" if col in ("rung", "ceiling") else "right")
    for r in result["rungs"]:
        pred = r["predicted_img_per_s"]
        table.add_row(r["rung"], f"{r['img_per_s']:.1f}", f"{r['speedup_vs_baseline']:.2f}x",
                      f"{pred:.1f}" if pred else "-",
                      f"{r['measured_over_predicted']:.2f}" if pred else "-",
                      f"{r['mfu']:.0%}" if r["mfu"] is not None else "-", r["peak_source"])
    console.print(table)
    config = result.pop("config")
    save_result(out, "train-ladder", config, result)
    from dlperf.plots import ladder_chart

    png = ladder_chart(result, out.with_suffix(".png"))
    console.print(f"Wrote {out}" + (f" and {png}" if png else ""))
    return 0


def _bench_data_ladder(cfg, out) -> int:
    from rich.progress import Progress
    from rich.table import Table

    from dlperf.bench.data import plot_ladder, run_ladder
    from dlperf.bench.results import save_result

    console = _console()
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("measuring the ladder", total=None)
        result = run_ladder(cfg, progress=lambda: bar.advance(task))
    table = Table(title=f"dlperf CPU path on {cfg.data}, one speed-up per rung",
                  title_justify="left")
    for col in ("rung", "img/s", "vs previous", "vs first"):
        table.add_column(col, justify="left" if col == "rung" else "right")
    for r in result["rungs"]:
        table.add_row(r["rung"], f"{r['img_per_s']:,.0f}", f"{r['vs_previous']:.2f}x",
                      f"{r['vs_baseline']:.2f}x")
    console.print(table)
    if not result["roi_decoder"]:
        console.print("dlperf's C extension is not built here: the region and restart-marker "
                      "rungs fall back to whole-image decoding")
    config = result.pop("config")
    save_result(out, "data-ladder", config, result)
    png = plot_ladder({**result, "config": config}, out.with_suffix(".png"))
    console.print(f"Wrote {out}" + (f" and {png}" if png else ""))
    return 0


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

    with _console().status("probing this CPU's ceilings for the predictions (--spec to skip)..."):
        return probe(ProbeConfig(device="cpu", quick=True))[0]


def _cmd_bench_kernels(args) -> int:
    from rich.progress import Progress
    from rich.table import Table

    from dlperf.bench.kernels import KernelBenchConfig, plot, point_count, resolve_dtype, run
    from dlperf.bench.results import save_result
    from dlperf.hardware.probe import resolve_device

    cfg = KernelBenchConfig(kind=args.bench_command, device=args.device, dtype=args.dtype,
                            quick=args.quick, repeats=args.repeats)
    device = resolve_device(args.device)
    gpu = device.type == "cuda"
    resolve_dtype(cfg, gpu)  # a wrong --dtype is refused before any probing
    out = _result_path(args.out, f"{cfg.kind}-{'gpu' if gpu else 'cpu'}.json")
    spec = _kernel_spec(args, device)
    console = _console()
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"measuring {cfg.kind} shapes", total=point_count(cfg, gpu))
        result = run(cfg, spec, progress=lambda: bar.advance(task))
    table = Table(title=f"dlperf bench {cfg.kind}: {result['device']}, {result['dtype']}; "
                        f"predicted with {spec.name}", title_justify="left")
    for col in ("sweep", "points", "median |pred/meas-1|", "max"):
        table.add_column(col, justify="left" if col == "sweep" else "right")
    for s in result["series"]:
        table.add_row(s["title"], str(s["points"]), f"{s['median_abs_error']:.0%}",
                      f"{s['max_abs_error']:.0%}")
    console.print(table)
    table = Table(title="The guide's contrasts: speed-up of the first over the second",
                  title_justify="left")
    for col in ("contrast", "measured", "predicted"):
        table.add_column(col, justify="left" if col == "contrast" else "right")
    for c in result["contrasts"]:
        table.add_row(c["contrast"], f"{c['measured_speedup']:.2f}x",
                      f"{c['predicted_speedup']:.2f}x")
    console.print(table)
    config = result.pop("config")
    save_result(out, f"bench-{cfg.kind}", config, result)
    png = plot(result, out.with_suffix(".png"))
    console.print(f"Wrote {out}" + (f" and {png}" if png else ""))
    return 0


def _cmd_bench(args) -> int:
    if args.bench_command == "train":
        return _cmd_bench_train(args)
    if args.bench_command in ("gemm", "conv"):
        return _cmd_bench_kernels(args)
    if args.bench_command != "data":
        raise DlperfError("dlperf bench: choose what to measure: data, train, gemm or conv "
                          "(see dlperf bench --help)")
    from rich.progress import Progress

    from dlperf.bench.data import DataBenchConfig, plot, run
    from dlperf.bench.results import save_result

    cfg = DataBenchConfig(data=args.data or str(_default_corpus()), batch_size=args.batch_size, threads=args.threads,
                          workers=args.workers, rounds=args.rounds)
    console = _console()
    _warn_native(console)
    if args.ladder:
        return _bench_data_ladder(cfg, _result_path(args.out, "data-ladder.json"))
    out = _result_path(args.out, "data-cpu.json")
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("benchmarking pipelines", total=None)
        result = run(cfg, progress=lambda: bar.advance(task))
    config = result.pop("config")
    save_result(out, "data-cpu", config, result)
    png = plot({**result, "config": config}, out.with_suffix(".png"))
    for name, rate in result["img_per_s"].items():
        console.print(f"{name:32s} {rate:8,.0f} img/s")
    r = result["ratios"]
    console.print(f"dlperf vs torchvision {r['dlperf_vs_torchvision']:.2f}x; thread scaling "
                  f"{r['thread_scaling']:.2f}x; vs DALI "
                  + (f"{r['dlperf_vs_dali_measured']:.2f}x (measured)" if r["dlperf_vs_dali_measured"]
                     else f"{r['dlperf_vs_dali_notes_anchor']:.2f}x (against DALI's 921 img/s "
                          "measured earlier on this kind of machine; DALI not installed here)"))
    console.print(f"restart markers (lossless rewrite, what `data prepare` stores): "
                  f"{r['restart_markers_vs_raw_folder']:.2f}x the raw folder"
                  + (f", {r['restart_markers_vs_dali_same_files']:.2f}x DALI on the same files"
                     if r["restart_markers_vs_dali_same_files"] else "")
                  + (f"; prepared shards {r['prepared_shards_vs_dali_raw_folder']:.2f}x DALI"
                     if r["prepared_shards_vs_dali_raw_folder"] else ""))
    if r["dlperf_vs_ffcv"]:
        console.print(f"vs FFCV (its own .beton, q90): raw folder {r['dlperf_vs_ffcv']:.2f}x, "
                      f"prepared shards {r['prepared_shards_vs_ffcv']:.2f}x, max-side shards "
                      f"{r['shards_vs_ffcv_same_max_side']:.2f}x FFCV at the same max side")
    console.print(f"Wrote {out}" + (f" and {png}" if png else ""))
    return 0


def _cmd_train(args) -> int:
    import json

    from dlperf.train.recipes import apply_overrides, get_recipe, load_config_file, parse_overrides

    cfg = load_config_file(args.config) if args.config else get_recipe(args.recipe)
    cfg = apply_overrides(cfg, parse_overrides(args.overrides))
    if args.show_config:
        print(json.dumps(cfg.to_dict(), indent=1))
        return 0
    _output_file(args.json, "--json")
    if cfg.data != "synthetic":
        from pathlib import Path

        if not Path(cfg.data).exists():
            raise DlperfError(f"data={cfg.data}: not found (an image folder, .csv or shard "
                              "folder, or data=synthetic)")
    from dlperf.train.loop import EXIT_NONFINITE, EXIT_PREEMPTED, NonFinite, Preempted, train

    console = _console()
    resume = None if args.resume == "never" else args.resume
    try:
        summary = train(cfg, resume=resume, progress=not args.no_progress, console=console,
                        mfu=not args.no_mfu)
    except Preempted as exc:
        print(f"dlperf: {exc}", file=sys.stderr)
        return EXIT_PREEMPTED
    except NonFinite as exc:
        print(f"dlperf: error: {exc}", file=sys.stderr)
        return EXIT_NONFINITE
    if os.environ.get("RANK", "0") != "0":
        return 0  # under torchrun, rank 0 reports
    _write_result(args.json, summary, console)
    if summary.get("already_finished"):
        return 0  # said so already
    parts = [f"{summary['img_per_s']:,.1f} img/s ({summary['compute_img_per_s']:,.1f} compute-only)",
             f"data wait {summary['data_wait_share']:.0%}"]
    if summary.get("mfu") is not None:
        parts.append(f"MFU {summary['mfu']:.0%} of {summary['peak_source']}")
    if summary["eval"]:
        parts.append(f"top-1 {summary['eval']['top1']:.2%}, top-5 {summary['eval']['top5']:.2%}")
    if summary["skipped_steps"]:
        parts.append(f"{summary['skipped_steps']} non-finite steps skipped")
    if summary["time_to_target_s"] is not None:
        parts.append(f"target reached in {summary['time_to_target_s']:.1f} s")
    console.print(f"Done: {summary['steps']} steps; " + "; ".join(parts) +
                  f". Logs and checkpoints in {cfg.out_dir}")
    for line in summary.get("advice", []):
        console.print(f"  next: {line}", highlight=False)
    return 0


COMMANDS = {"analyze": _cmd_analyze, "devices": _cmd_devices, "probe": _cmd_probe,
            "data": _cmd_data, "bench": _cmd_bench, "train": _cmd_train}


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra:
            # `dlperf train --no-progress epochs=2`: KEY=VALUE after an option is still an
            # override (argparse alone only takes positionals before the first option)
            overrides = [e for e in extra if "=" in e and not e.startswith("-")]
            unknown = [e for e in extra if e not in overrides] if args.command == "train" else extra
            if unknown:  # name only what is wrong, not the overrides around it
                prog = " ".join(["dlperf", *([args.command] if args.command else [])])
                raise DlperfError(f"{prog}: unrecognized arguments: {' '.join(unknown)} "
                                  f"(see {prog} --help)")
            args.overrides = [*args.overrides, *overrides]
        if not args.command:
            parser.print_help()
            return EXIT_USAGE
        return COMMANDS[args.command](args)
    except DlperfError as exc:
        print(f"dlperf: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("dlperf: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
