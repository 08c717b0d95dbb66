"""`dlperf data`: prepare and verify datasets for the input pipeline, inspect their decode
paths, and make the benchmark corpus or a toy dataset."""

from __future__ import annotations

from dlperf.cli.common import (Parser, new_console, nonnegative_int, output_file, positive_int,
                               styled, warn_native, write_result)
from dlperf.errors import DlperfError


def add_parser(sub) -> None:
    """`dlperf data prepare | verify | inspect | corpus | toy`."""
    data = sub.add_parser("data", help="prepare and verify datasets for the input pipeline",
                          description="Dataset tools for dlperf's input pipeline.")
    dsub = data.add_subparsers(dest="data_command", metavar="ACTION", parser_class=Parser)
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
    dp.add_argument("--max-side", type=positive_int, default=None,
                    help="shrink images so the longer side is at most this, re-encoding them")
    dp.add_argument("--quality", type=positive_int, default=90,
                    help="JPEG quality when re-encoding [90]")
    dp.add_argument("--threads", type=positive_int, default=None,
                    help="decode/re-encode threads [every CPU]; the output is the same for any")
    dp.add_argument("--json", metavar="PATH", default=None,
                    help="also write the summary (samples, shards, skipped and changed files) "
                         "to this JSON file")
    dp.add_argument("--restart-px", type=nonnegative_int, default=32,
                    help="rewrite JPEGs losslessly with restart markers at most this many pixels "
                         "apart in each row, so random crops decode only the data under them "
                         "[32]; 0 stores JPEGs byte for byte")
    dt = dsub.add_parser("toy", help="write a small learnable dataset (train/ and val/)",
                         description="Write a small JPEG dataset that a tiny CNN learns in "
                                     "seconds: try `dlperf train --recipe tiny data=DST/train "
                                     "val_data=DST/val`.")
    dt.add_argument("dst", help="folder to create")
    dt.add_argument("--classes", type=positive_int, default=4,
                    help="classes (sub-folders), each a different pattern [4]")
    dt.add_argument("--per-class", type=positive_int, default=40,
                    help="training images per class; val/ gets a quarter as many [40]")
    dc = dsub.add_parser("corpus", help="make an ImageNet-like benchmark corpus (no download)",
                         description="Write ImageNet-like JPEGs (about 500x420, baseline 4:2:0, "
                                     "~100 KB each, in class folders) made from the photograph "
                                     "matplotlib ships: random crops and sizes, a tint per "
                                     "class, sensor-like noise. Deterministic for a seed; decodes "
                                     "at the speed of real ImageNet-like photos.")
    dc.add_argument("dst", help="folder to create")
    dc.add_argument("--images", type=positive_int, default=320, help="JPEGs to write [320]")
    dc.add_argument("--classes", type=positive_int, default=10,
                    help="class folders (images are dealt out in turn) [10]")
    dc.add_argument("--seed", type=nonnegative_int, default=0,
                    help="the same seed gives the same bytes [0]")
    dv = dsub.add_parser("verify", help="check a prepared dataset: index vs tar, decode all",
                         description="Check every index entry (and each shard's DALI .idx) "
                                     "against its tar members and decode every sample; exit 1 "
                                     "when anything is wrong.")
    dv.add_argument("dst", help="folder written by `dlperf data prepare`")
    dv.add_argument("--threads", type=positive_int, default=None,
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
    di.add_argument("--size", type=positive_int, default=224, help="training crop size [224]")
    di.add_argument("--limit", type=positive_int, default=None,
                    help="inspect only the first N samples [all]")
    di.add_argument("--json", metavar="PATH", default=None,
                    help="also write the report to this JSON file")


def run(args) -> int:
    actions = {"prepare": _prepare, "verify": _verify, "inspect": _inspect, "corpus": _corpus,
               "toy": _toy}
    if args.data_command not in actions:
        raise DlperfError("dlperf data: choose an action: prepare, verify, inspect, corpus or "
                          "toy (see dlperf data --help)")
    output_file(getattr(args, "json", None), "--json")  # before minutes of work
    return actions[args.data_command](args, new_console())


def _prepare(args, console) -> int:
    """`dlperf data prepare SRC DST`."""
    from rich.progress import Progress

    from dlperf.data.prepare import PrepareConfig, parse_size, prepare
    from dlperf.data.sources import open_source

    cfg = PrepareConfig(shard_bytes=parse_size(args.shard_size), max_side=args.max_side,
                        quality=args.quality, threads=args.threads or 0,
                        restart_px=args.restart_px)
    source = open_source(args.src)
    warn_native(console)
    with Progress(console=console) as bar:
        task = bar.add_task(f"writing shards from {len(source):,} images", total=len(source))
        summary = prepare(source, args.dst, cfg, progress=lambda: bar.advance(task))
    if summary["already"]:
        console.print(f"{args.dst} already holds this prepare of {args.src} with the same "
                      f"settings ({summary['samples']:,} samples in {summary['shards']} "
                      "shards): nothing to do.")
        write_result(args.json, summary, console)
        return 0
    console.print(f"Wrote {summary['samples']:,} samples in {summary['shards']} shards to "
                  f"{args.dst} ({summary['output_bytes'] / 2**20:,.1f} MiB from "
                  f"{summary['input_bytes'] / 2**20:,.1f} MiB) in {summary['seconds']:.1f} s; "
                  f"{summary['restart_markers']:,} JPEGs carry restart markers (lossless "
                  "rewrite: random crops decode only the data under them).")
    for label, rows in (("[yellow]skipped[/]", summary["bad"]),
                        ("[cyan]changed[/]", summary["changed"])):
        for name, reason in rows[:20]:  # file names are the user's: printed as written
            console.print(styled(f"  {label} {{}}: {{}}", name, reason))
        if len(rows) > 20:
            console.print(f"  ... {len(rows) - 20} more in {args.dst}/prepare-report.json")
    write_result(args.json, summary, console)
    return 0


def _corpus(args, console) -> int:
    """`dlperf data corpus DST`."""
    from rich.progress import Progress

    from dlperf.data.corpus import CorpusConfig, make_corpus

    cfg = CorpusConfig(images=args.images, classes=args.classes, seed=args.seed)
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("writing JPEGs", total=cfg.images)
        s = make_corpus(args.dst, cfg, progress=lambda: bar.advance(task))
    console.print(f"Wrote {s['images']} JPEGs in {s['classes']} classes to {args.dst} "
                  f"(mean {s['mean_bytes'] / 1e3:,.0f} KB, {s['mean_width']:.0f}x"
                  f"{s['mean_height']:.0f}); try: dlperf bench data {args.dst}")
    return 0


def _toy(args, console) -> int:
    """`dlperf data toy DST`."""
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


def _verify(args, console) -> int:
    """`dlperf data verify DST`: exit 1 when anything is wrong."""
    from rich.progress import Progress

    from dlperf.data.prepare import verify
    from dlperf.data.sources import ShardSource

    n = len(ShardSource(args.dst))
    with Progress(console=console) as bar:
        task = bar.add_task("verifying", total=n)
        result = verify(args.dst, progress=lambda: bar.advance(task), threads=args.threads)
    for note in result["notes"]:
        console.print(styled("  [yellow]note[/] {}", note))
    for where, problem in result["problems"][:20]:
        console.print(styled("  [red]problem[/] {}: {}", where, problem))
    if len(result["problems"]) > 20:
        console.print(f"  ... {len(result['problems']) - 20} more problems")
    ok = not result["problems"]
    console.print(f"{'OK' if ok else 'FAILED'}: {result['samples']:,} samples in "
                  f"{result['shards']} shards, {len(result['problems'])} problems.")
    write_result(args.json, result, console)
    return 0 if ok else 1


def _inspect(args, console) -> int:
    from rich.progress import Progress
    from rich.table import Table

    from dlperf.data.inspect import MEANING, PATHS, InspectConfig, inspect
    from dlperf.data.sources import open_source

    source = open_source(args.src)
    warn_native(console)
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
        from dlperf.files import write_json_atomic

        write_json_atomic(args.json, report)
        console.print(f"Wrote {args.json}")
    return 0
