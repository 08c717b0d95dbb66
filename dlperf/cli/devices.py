"""`dlperf devices`: the GPU presets and their datasheet figures."""

from __future__ import annotations

from dlperf.cli.common import new_console, output_file


def add_parser(sub) -> None:
    """`dlperf devices`."""
    d = sub.add_parser("devices", help="list the GPU presets and their datasheet figures",
                       description="List device presets: SMs, memory bandwidth, dense peak "
                                   "FLOP/s per math unit and ops:byte ratios, with each source.")
    d.add_argument("--json", metavar="PATH", nargs="?", const="-", default=None,
                   help="write every preset as JSON to PATH (all fields, sparse peaks and "
                        "sources); without PATH, print it")
    d.add_argument("--interconnects", action="store_true",
                   help="list the interconnect presets instead (NVLink, PCIe, InfiniBand, "
                        "Ethernet: NCCL all-reduce bus bandwidth per GPU, with sources) that "
                        "`dlperf analyze --gpus N --interconnect` uses")


def run(args) -> int:
    from rich.table import Table
    from rich.text import Text

    from dlperf.hardware import interconnect
    from dlperf.hardware.specs import MATH_UNITS, PRESETS

    if args.interconnects and not args.json:
        table = Table(title="Interconnect presets (NCCL all-reduce bus bandwidth per GPU)",
                      title_justify="left", header_style="bold")
        for col in ("name", "interconnect", "scope", "busbw GB/s", "latency", "source"):
            table.add_column(col, justify="right" if col == "busbw GB/s" else "left",
                             overflow="fold")
        for ic in interconnect.PRESETS.values():
            # over NCCL the latency is its tuner's (analysis/nccl.py), per algorithm and protocol
            latency = (f"NCCL's tuner ({ic.nccl})" if ic.nccl
                       else f"{ic.latency_s * 1e6:g} µs a step")
            table.add_row(ic.name, ic.display_name, ic.scope, f"{ic.bus_bandwidth / 1e9:,.0f}",
                          latency, ic.source)
        new_console().print(table)
        return 0
    if args.json:
        import json

        from dlperf.hardware.track_record import load

        presets = ([s.to_dict() for s in interconnect.PRESETS.values()] if args.interconnects
                   else [{**s.to_dict(), "track_record": load().get(s.name)}
                         for s in PRESETS.values()])
        if args.json == "-":
            print(json.dumps(presets, indent=1))
        else:
            from dlperf.files import write_json_atomic

            output_file(args.json, "--json")
            write_json_atomic(args.json, presets)
            print(f"Wrote {args.json}")
        return 0

    table = Table(title="Device presets (dense peaks; sparse figures are never used)",
                  title_justify="left", header_style="bold")
    from dlperf.hardware.track_record import SYSTEMATIC, load

    for col in ("name", "device", "SMs", "DRAM GB/s", *(f"{u} TF/s" for u in MATH_UNITS),
                "bf16/fp16 ops:B", "record"):
        table.add_column(col, justify="left" if col in ("name", "device") else "right")
    for spec in PRESETS.values():
        tc = spec.ops_per_byte("bf16") or spec.ops_per_byte("fp16")
        # dlperf's record on published runs (hardware/track_record.py): runs, median pred/meas
        rec = load().get(spec.name, {}).get("all")
        record = "-" if not rec else f"{rec['rows']} runs, {rec['median']:.2f}x"
        if rec and abs(rec["median"] - 1) > SYSTEMATIC:
            record = Text(record, style="yellow")
        table.add_row(spec.name, spec.display_name, str(spec.sm_count),
                      f"{spec.mem_bandwidth / 1e9:,.0f}",
                      *(f"{spec.peak[u] / 1e12:,.1f}" if u in spec.peak else "-"
                        for u in MATH_UNITS),
                      f"{tc:.1f}" if tc else "-", record)
    console = new_console()
    console.print(table)
    console.print("cpu: measured on this machine by `dlperf probe` (or `analyze --device cpu`). "
                  "`dlperf devices --json` shows each preset's datasheet address (field source). "
                  "record: published training runs dlperf was checked against on that GPU and "
                  "the median of predicted / measured throughput (benchmarks/README.md).")
    return 0
