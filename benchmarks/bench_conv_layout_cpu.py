"""Convolution layouts on this CPU, forward and backward apart, FP32 and bf16 (issue #11).

`dlperf bench conv` times forward convolutions; a training step also runs their backward, and
on a CPU the two need not favour the same layout: oneDNN's emulated bf16 runs other code than
FP32 (see hardware/efficiency.py, ``by_dtype``), and the sweep's bf16 pass fits channels_last
only. This script times, for a few ResNet-like layers, the forward and the backward (data and
weight gradients, one ``convolution_backward``) in NCHW and in channels_last, FP32 and under
bf16 autocast, median of repeats, so what dlperf says about layouts on a CPU rests on a saved
measurement rather than a check by hand.

Usage: python benchmarks/bench_conv_layout_cpu.py [REPEATS]  (about a minute on 2 cores)
Writes benchmarks/results/conv-layout-cpu.json.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parent / "results" / "conv-layout-cpu.json"
# (input channels, output channels, kernel, spatial size), batch 8
LAYERS = [(64, 64, 3, 56), (256, 64, 1, 56), (256, 256, 3, 14)]
BATCH = 8


def time_layer(cin: int, cout: int, k: int, hw: int, channels_last: bool, dtype: torch.dtype,
               repeats: int) -> dict:
    """Median forward and backward seconds of one convolution (behind a leaf input that needs
    its gradient, as every convolution but a network's first)."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(cin, cout, k, padding=k // 2, bias=False)
    x = torch.randn(BATCH, cin, hw, hw)
    if channels_last:
        conv = conv.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    forward, backward = [], []
    for i in range(repeats + 1):  # the first round warms up (oneDNN primitive creation)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            y = conv(x)
        t1 = time.perf_counter()
        y.backward(torch.ones_like(y))
        t2 = time.perf_counter()
        conv.zero_grad(set_to_none=True)
        x.grad = None
        if i:
            forward.append(t1 - t0)
            backward.append(t2 - t1)
    return {"forward_s": statistics.median(forward), "backward_s": statistics.median(backward)}


def main(argv: list[str]) -> int:
    from dlperf.provenance import save_result

    repeats = int(argv[0]) if argv else 5
    rows = []
    for cin, cout, k, hw in LAYERS:
        for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            t = {layout: time_layer(cin, cout, k, hw, layout == "channels_last", dtype, repeats)
                 for layout in ("nchw", "channels_last")}
            row = {"layer": f"{k}x{k} {cin}->{cout}@{hw}", "dtype": dtype_name, **{
                f"{layout}_{phase}": t[layout][f"{phase}_s"]
                for layout in t for phase in ("forward", "backward")}}
            row["nchw_over_channels_last_forward"] = row["nchw_forward"] / row[
                "channels_last_forward"]
            row["nchw_over_channels_last_backward"] = row["nchw_backward"] / row[
                "channels_last_backward"]
            row["nchw_over_channels_last_step"] = (
                (row["nchw_forward"] + row["nchw_backward"])
                / (row["channels_last_forward"] + row["channels_last_backward"]))
            rows.append(row)
            print(f"{row['layer']:18s} {dtype_name}: NCHW / channels_last forward "
                  f"{row['nchw_over_channels_last_forward']:.2f}x, backward "
                  f"{row['nchw_over_channels_last_backward']:.2f}x, both "
                  f"{row['nchw_over_channels_last_step']:.2f}x "
                  f"(channels_last {row['channels_last_forward'] * 1e3:.1f} + "
                  f"{row['channels_last_backward'] * 1e3:.1f} ms)", flush=True)
    save_result(OUT, "conv-layout-cpu", {"layers": LAYERS, "batch": BATCH, "repeats": repeats,
                                         "threads": torch.get_num_threads()}, {"rows": rows})
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
