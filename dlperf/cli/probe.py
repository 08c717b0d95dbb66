"""`dlperf probe`: measure this machine's ceilings (and with --sweep fit the efficiency
model to it) into a spec file `dlperf analyze --device FILE` uses."""

from __future__ import annotations

from dlperf.cli.common import new_console, output_file, probe_device


def add_parser(sub) -> None:
    """`dlperf probe`."""
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
    p.add_argument("--out", default=None,
                   help="file to write [dlperf-probe.json; dlperf-comm.json with --comm]")
    p.add_argument("--comm", action="store_true",
                   help="instead: time all-reduce between --world processes on this host (gloo "
                        "on a CPU, NCCL with a GPU each) and fit NCCL's bus bandwidth and "
                        "latency; the file is an interconnect for `dlperf analyze --gpus N "
                        "--interconnect FILE`")
    p.add_argument("--world", type=int, default=2, help="processes for --comm [2]")


def run(args) -> int:
    if args.comm:
        return _comm(args)
    args.out = args.out or "dlperf-probe.json"
    from rich.progress import Progress
    from rich.table import Table

    from dlperf.hardware.probe import ProbeConfig, probe, probe_task_count
    from dlperf.files import write_json_atomic
    from dlperf.hardware.specs import get_device

    output_file(args.out, "--out")  # before minutes of measuring
    cfg = ProbeConfig(device=args.device, quick=args.quick)
    preset = get_device(args.compare) if args.compare else None
    if preset is None and args.device != "cpu":
        import torch

        from dlperf.hardware.specs import match_preset

        if torch.cuda.is_available():  # print the datasheet beside what we measure
            preset = match_preset(torch.cuda.get_device_name())
    console = new_console()
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
    from dlperf.provenance import environment

    sweep = None
    if args.sweep:
        import dataclasses

        from dlperf.analysis.calibrate import CLASS_PARAMS, sweep as run_sweep, sweep_cases

        with Progress(console=console, transient=True) as bar:
            task = bar.add_task("sweeping layers", total=len(sweep_cases(spec, args.quick)))
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
            + ", ".join(f"{c.replace('_', ' ')} {fitted[c]:.0%}" for c in CLASS_PARAMS
                        if fitted[c] is not None)
            + f"; {fitted['launch_s'] * 1e6:.1f} µs per kernel."
            + (f" Backward convolutions {fitted['conv_backward']:.0%} of the forward's rate."
               if "conv_backward" in fitted["fitted"] else "")
            + (f" Depthwise backward {fitted['depthwise_backward']:.0%} of the GEMMs' rate"
               + (f", weight gradients of windows wider than 3x3 "
                  f"{fitted['depthwise_wgrad_wide']:.1%}"
                  if fitted.get("depthwise_wgrad_wide") is not None else "") + "."
               if "depthwise_backward" in fitted["fitted"] else ""))
        if "bf16" in fitted:
            h = fitted["bf16"]
            console.print(
                f"bf16 pass ({h['kernels']} kernels, median |error| {h['median_abs_error']:.0%})"
                f": GEMMs {h['math']:.0%} and convolutions {h['conv']:.0%} of the probed bf16 "
                f"peak, backward convolutions {h['conv_backward']:.0%} of the forward's rate.")
    write_json_atomic(args.out, {"spec": spec.to_dict(),
                                 "measurements": [m.to_dict() for m in measurements],
                                 **({"sweep": sweep} if sweep else {}),
                                 "environment": environment()})
    console.print(f"Wrote {args.out}; use it with `dlperf analyze MODEL --device {args.out}`.")
    return 0


def _comm(args) -> int:
    """`dlperf probe --comm`: all-reduce times over sizes, the ring fit, an interconnect file."""
    from dlperf.files import write_json_atomic
    from dlperf.hardware.comm_probe import MISFIT_WARN, probe_comm
    from dlperf.provenance import environment
    from dlperf.units import seconds

    out = args.out or "dlperf-comm.json"
    output_file(out, "--out")
    console = new_console()
    with console.status(f"timing all-reduce between {args.world} processes..."):
        ic, m = probe_comm(world=args.world, quick=args.quick)
    for size, t, f in zip(m["sizes_bytes"], m["seconds"], m["fitted_seconds"]):
        console.print(f"  all-reduce {size / 2**10:>9,.0f} KiB: {seconds(t):>9} measured, "
                      f"{seconds(f):>9} fitted")
    console.print(f"{ic.display_name}: bus bandwidth {ic.bus_bandwidth / 1e9:.2f} GB/s, "
                  f"{ic.latency_s * 1e6:.1f} µs per ring step.")
    if m["fit_worst_ratio"] > MISFIT_WARN:
        console.print(f"The fit misses the {m['fit_worst_size_bytes'] / 2**10:,.0f} KiB "
                      f"all-reduce by {m['fit_worst_ratio']:.1f}x: this host's all-reduce "
                      "times are noisy (or not a line in size), and predictions from this file "
                      "carry that error; rerun `dlperf probe --comm` on a quieter machine.",
                      style="yellow")
    write_json_atomic(out, {"interconnect": ic.to_dict(), "measurements": m,
                            "environment": environment()})
    console.print(f"Wrote {out}; use it with `dlperf analyze MODEL --train --gpus N "
                  f"--interconnect {out}`.")
    return 0

