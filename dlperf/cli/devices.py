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


def run(args) -> int:
    from rich.table import Table

    from dlperf.hardware.specs import MATH_UNITS, PRESETS

    if args.json:
        import json

        presets = [s.to_dict() for s in PRESETS.values()]
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
    for col in ("name", "device", "SMs", "HBM GB/s", *(f"{u} TF/s" for u in MATH_UNITS),
                "bf16/fp16 ops:B"):
        table.add_column(col, justify="left" if col in ("name", "device") else "right")
    for spec in PRESETS.values():
        tc = spec.ops_per_byte("bf16") or spec.ops_per_byte("fp16")
        table.add_row(spec.name, spec.display_name, str(spec.sm_count),
                      f"{spec.mem_bandwidth / 1e9:,.0f}",
                      *(f"{spec.peak[u] / 1e12:,.1f}" if u in spec.peak else "-" for u in MATH_UNITS),
                      f"{tc:.1f}" if tc else "-")
    console = new_console()
    console.print(table)
    console.print("cpu: measured on this machine by `dlperf probe` (or `analyze --device cpu`). "
                  "`dlperf devices --json` shows each preset's datasheet address (field source).")
    return 0
