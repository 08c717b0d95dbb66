"""Depthwise convolutions' backward on this CPU: which oneDNN kernel runs, and how fast (issue #11).

In MobileNetV3's training step on a 2-core CPU the backward of its 5x5 depthwise convolutions
was predicted 3-5x too fast and that of its 3x3 ones 1.3-2.2x too slow, on two different hosts
(benchmarks/README.md, the seventh and eighth runs), while every forward was within 0.6-1.2x:
one share of the math rate for all depthwise backward kernels (``depthwise_backward``) could not
follow them. This script times the two halves of a depthwise ``convolution_backward`` apart (the
data gradient alone, then the weight gradient alone, through ``aten.convolution_backward``'s
output mask) over kernel sizes, strides and sizes, and records which implementation oneDNN
picked for each (its verbose log, read in a child process: ``ONEDNN_VERBOSE`` must be set
before oneDNN starts). What it showed on the 2-core AVX2 EPYC of 2026-12-01: oneDNN's JIT
depthwise kernel (``jit_dw``) computes every data gradient and the weight gradient of 3x3
windows; for 5x5 and 7x7 windows the weight gradient falls back to its GEMM-based convolution
(``gemm:jit``), one small GEMM per image and channel, several times slower per FLOP. That is
what ``depthwise_wgrad_wide`` in dlperf/hardware/efficiency.py models.

Usage: python benchmarks/bench_depthwise_cpu.py [REPEATS]  (about 10 seconds on 2 cores)
Writes benchmarks/results/depthwise-cpu.json.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parent / "results" / "depthwise-cpu.json"
# (kernel, stride, input size, channels, batch): MobileNet/EfficientNet/ConvNeXt-like windows
LAYERS = [(3, 1, 56, 96, 8), (3, 1, 14, 96, 8), (3, 1, 4, 960, 8), (3, 2, 28, 144, 8),
          (3, 2, 14, 96, 8), (5, 1, 14, 96, 8), (5, 1, 14, 96, 4), (5, 1, 14, 96, 16),
          (5, 1, 14, 192, 8), (5, 1, 7, 96, 8), (5, 1, 28, 96, 8), (5, 1, 4, 960, 8),
          (5, 1, 4, 960, 2), (5, 2, 28, 96, 8), (7, 1, 14, 96, 8), (7, 1, 7, 384, 8)]


def _tensors(k, s, hw, c, n):
    torch.manual_seed(0)
    x, w = torch.randn(n, c, hw, hw), torch.randn(c, 1, k, k)
    y = torch.nn.functional.conv2d(x, w, None, s, k // 2, 1, c)
    return x, w, torch.randn_like(y), y.shape[2] * y.shape[3]


def _backward(gy, x, w, k, s, c, mask):
    return torch.ops.aten.convolution_backward(gy, x, w, None, [s, s], [k // 2, k // 2], [1, 1],
                                               False, [0, 0], c, mask)


def _median_s(f, repeats: int) -> float:
    from dlperf.hardware.probe import _timer

    return statistics.median(_timer(torch.device("cpu"))(f, repeats, 1))


def implementations() -> dict[str, dict[str, str]]:
    """oneDNN's implementation per layer and pass, from its verbose log in a child process
    (matched on the problem each line describes: oneDNN's stdio buffer and Python's
    interleave in no fixed order)."""
    code = ("import sys; sys.path.insert(0, %r); import bench_depthwise_cpu as b\n"
            "for layer in b.LAYERS:\n"
            "    k, s, hw, c, n = layer\n"
            "    x, w, gy, _ = b._tensors(*layer)\n"
            "    for mask in ([True, False, False], [False, True, False]):\n"
            "        b._backward(gy, x, w, k, s, c, mask)\n" % str(Path(__file__).parent))
    log = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "ONEDNN_VERBOSE": "1"}, check=True).stdout
    return parse_verbose(log)


def parse_verbose(log: str) -> dict[str, dict[str, str]]:
    """{"kernel x stride x size x channels x batch": {"dgrad"|"wgrad": implementation}} from
    oneDNN's verbose lines of depthwise backward convolutions."""
    passes = {"backward_data": "dgrad", "backward_weights": "wgrad"}
    out: dict[str, dict[str, str]] = {}
    for line in log.splitlines():
        fields = line.split(",")
        # onednn_verbose,v1,primitive,exec,cpu,convolution,IMPLEMENTATION,PROP_KIND,...,PROBLEM
        if "exec" not in fields or "convolution" not in fields:
            continue
        at = fields.index("convolution")
        problem = next((f for f in fields if f.startswith("g") and "mb" in f), "")
        m = re.match(r"g(\d+)mb(\d+)_ic\d+oc\d+_ih(\d+)oh\d+kh(\d+)sh(\d+)", problem)
        if m and fields[at + 2] in passes:
            c, n, hw, k, s = m.groups()
            key = "x".join((k, s, hw, c, n))
            out.setdefault(key, {})[passes[fields[at + 2]]] = fields[at + 1]
    return out


def main(argv: list[str]) -> int:
    from dlperf.provenance import save_result

    repeats = int(argv[0]) if argv else 7
    impl = implementations()
    rows = []
    for layer in LAYERS:
        k, s, hw, c, n = layer
        x, w, gy, out_px = _tensors(*layer)
        flops = 2 * n * c * out_px * k * k  # each pass: one multiply-add per output and tap
        row = {"kernel": k, "stride": s, "size": hw, "channels": c, "batch": n,
               "flops_per_pass": flops}
        for name, mask in (("dgrad", [True, False, False]), ("wgrad", [False, True, False])):
            t = _median_s(lambda: _backward(gy, x, w, k, s, c, mask), repeats)
            row[f"{name}_s"] = t
            row[f"{name}_gflops"] = flops / t / 1e9
            row[f"{name}_impl"] = impl.get("x".join(map(str, layer)), {}).get(name, "?")
        rows.append(row)
        print(f"{k}x{k} s{s} {c}@{hw} batch {n}: dgrad {row['dgrad_s'] * 1e3:.3f} ms "
              f"({row['dgrad_gflops']:.1f} GFLOP/s, {row['dgrad_impl']}), wgrad "
              f"{row['wgrad_s'] * 1e3:.3f} ms ({row['wgrad_gflops']:.1f} GFLOP/s, "
              f"{row['wgrad_impl']})")

    def rates(pred):
        return [r["wgrad_gflops"] for r in rows if pred(r)]
    summary = {"wgrad_gflops_median_3x3": statistics.median(rates(lambda r: r["kernel"] == 3)),
               "wgrad_gflops_median_wider": statistics.median(rates(lambda r: r["kernel"] > 3)),
               "dgrad_gflops_median": statistics.median(r["dgrad_gflops"] for r in rows),
               "wgrad_impl_by_kernel": {str(k): sorted({r["wgrad_impl"] for r in rows
                                                        if r["kernel"] == k}) for k in (3, 5, 7)},
               "dgrad_impls": sorted({r["dgrad_impl"] for r in rows})}
    print(json.dumps(summary, indent=1))
    save_result(OUT, "depthwise-backward-cpu",
                {"layers": LAYERS, "repeats": repeats, "threads": torch.get_num_threads(),
                 "onednn": torch.backends.mkldnn.is_available()},
                {"rows": rows, "summary": summary})
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
