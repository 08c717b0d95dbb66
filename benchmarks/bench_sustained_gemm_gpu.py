"""Issue #14's H100 lead, measured on one GPU: does a large bf16 GEMM hold its rate when it runs
for many seconds (a power-limited clock), and what does a copy running beside it (the local
traffic of an overlapped FSDP collective, NCCL's kernels) take from it?

MosaicML's MPT runs on H100s, costed in the precision they ran in, ran their GEMMs at 0.578 of
the Tensor Core peak where the same script's A100 runs fit the single-GPU table's 0.779
(benchmarks/README.md, "Hopper's own GEMM share"); the Hopper presets now carry that fitted
share. Short GEMM benchmarks reach more of an H100's peak, so the share holds something beyond
cuBLAS's kernels. This script measures the two candidates:

1. the GEMMs of an MPT-13B block at 4,096 tokens (x [4096, 5120] by the QKV, output and MLP
   weights), issued back to back for ``--seconds``: achieved TFLOP/s and the SM clock each
   half second (the clock through pynvml, nvidia-smi, or not at all), first second against
   the last half;
2. the same GEMMs with a second stream copying ``--copy-mib`` MiB back and forth the whole time
   (a collective's reads and writes of HBM and the SMs its kernels hold): the GEMMs' rate
   against case 1's;
3. beside both, dlperf's prediction for the same GEMMs on the GPU's preset (``--preset``, or
   the one its name matches), with the preset's own GEMM share and with the single-GPU table's:
   which of the two the sustained rate lands near says how much of the fitted share is the
   GPU alone.

Usage: python benchmarks/bench_sustained_gemm_gpu.py OUT.json [--seconds 20] [--copy-mib 256]
       [--tokens 4096] [--d-model 5120] [--preset NAME]
On a machine without a GPU it runs on the CPU in fp32 at a size given (a check of the script,
not a measurement: a CPU has no such clock or streams).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _clock_reader(device_index: int):
    """A function returning the SM clock in MHz now, or None where nothing can read it."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        return lambda: float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
    except Exception:  # noqa: BLE001 - no pynvml, or no NVML: try the command line
        pass
    if shutil.which("nvidia-smi"):
        def smi() -> float | None:
            out = subprocess.run(["nvidia-smi", "-i", str(device_index), "--query-gpu=clocks.sm",
                                  "--format=csv,noheader,nounits"], capture_output=True,
                                 text=True, timeout=5)
            try:
                return float(out.stdout.strip().splitlines()[0])
            except (ValueError, IndexError):
                return None
        return smi
    return lambda: None


def _shapes(tokens: int, d: int) -> list[tuple[int, int, int]]:
    """(M, N, K) of one MPT block's forward GEMMs: QKV, output projection, MLP up and down."""
    return [(tokens, 3 * d, d), (tokens, d, d), (tokens, 4 * d, d), (tokens, d, 4 * d)]


def predicted_tflops(preset: str, tokens: int, d: int) -> dict:
    """dlperf's TFLOP/s for the GEMM set on ``preset`` in bf16: with the preset's efficiency
    (a Hopper preset's own GEMM share) and with the single-GPU table's (FITTED)."""
    from dataclasses import replace

    from dlperf.analysis.costs import Cost
    from dlperf.analysis.gemm import GemmShape
    from dlperf.analysis.roofline import predict
    from dlperf.hardware.efficiency import FITTED, efficiency_for
    from dlperf.hardware.specs import get_device

    spec = get_device(preset)
    own = efficiency_for(spec)
    flops = sum(2 * m * n * k for m, n, k in _shapes(tokens, d))

    def rate(eff) -> float:
        seconds = 0.0
        for m, n, k in _shapes(tokens, d):
            cost = Cost(op="mm", module="gemm", module_type="Linear", phase="forward",
                        kind="gemm", dtype="bf16", flops=2 * m * n * k,
                        bytes=2 * (m * k + k * n + m * n), gemm=GemmShape(m, n, k))
            p = predict(cost, spec, efficiency=eff)
            seconds += p.time_s
        return flops / seconds / 1e12

    return {"preset": preset, "tensor_gemm_own": own.tensor_gemm,
            "tensor_gemm_table": FITTED.tensor_gemm,
            "tflops_own_share": rate(own),
            "tflops_table_share": rate(replace(own, tensor_gemm=FITTED.tensor_gemm))}


def run(seconds: float, copy_mib: int, tokens: int, d: int, device, dtype) -> dict:
    import torch

    gen = torch.Generator(device="cpu").manual_seed(0)
    mats = [(torch.randn(m, k, generator=gen).to(device, dtype),
             torch.randn(k, n, generator=gen).to(device, dtype)) for m, n, k in _shapes(tokens, d)]
    flops = sum(2 * m * n * k for m, n, k in _shapes(tokens, d))
    cuda = device.type == "cuda"
    clock = _clock_reader(device.index or 0) if cuda else (lambda: None)

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def gemm_series(copying: bool) -> list[dict]:
        src = dst = stream = None
        if copying and cuda:
            n = copy_mib * 2**20 // 2
            src = torch.empty(n, dtype=torch.bfloat16, device=device)
            dst = torch.empty_like(src)
            stream = torch.cuda.Stream(device)
        series, start = [], time.perf_counter()
        while time.perf_counter() - start < seconds:
            t0, reps = time.perf_counter(), 0
            while time.perf_counter() - t0 < 0.5:
                if stream is not None:
                    with torch.cuda.stream(stream):  # the copy beside the GEMMs, queued ahead
                        for _ in range(4):
                            dst.copy_(src)
                            src.copy_(dst)
                for a, b in mats:
                    a @ b
                reps += 1
                sync()
            elapsed = time.perf_counter() - t0
            series.append({"t_s": round(t0 - start, 3), "tflops": flops * reps / elapsed / 1e12,
                           "sm_clock_mhz": clock()})
        return series

    for _ in range(3):  # warm-up: cuBLAS's heuristics and the first launches
        for a, b in mats:
            a @ b
    sync()
    alone = gemm_series(False)
    beside = gemm_series(True) if cuda else []

    def summary(series: list[dict]) -> dict | None:
        if not series:
            return None
        half = series[len(series) // 2:]
        clocks = [s["sm_clock_mhz"] for s in half if s["sm_clock_mhz"]]
        return {"first_tflops": series[0]["tflops"],
                "last_half_median_tflops": statistics.median(s["tflops"] for s in half),
                "last_half_median_clock_mhz": statistics.median(clocks) if clocks else None,
                "samples": len(series)}

    out = {"alone": {"summary": summary(alone), "series": alone},
           "beside_copy": {"summary": summary(beside), "series": beside}}
    a, b = summary(alone), summary(beside)
    out["derived"] = {
        "sustained_over_first": (a["last_half_median_tflops"] / a["first_tflops"]
                                 if a and a["first_tflops"] else None),
        "beside_copy_over_alone": (b["last_half_median_tflops"] / a["last_half_median_tflops"]
                                   if a and b else None)}
    return out


def main(argv: list[str]) -> int:
    import torch

    from dlperf.provenance import save_result

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--copy-mib", type=int, default=256)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--d-model", type=int, default=5120)
    p.add_argument("--preset", help="the dlperf preset to predict the GEMMs on (default: the "
                   "one the GPU's name matches; none on a CPU)")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    res = run(args.seconds, args.copy_mib, args.tokens, args.d_model, device, dtype)
    res["device"] = torch.cuda.get_device_name(0) if cuda else "cpu"
    if not cuda:
        res["note"] = "no GPU: the script ran on the CPU in fp32 (a check, not a measurement)"
    preset = args.preset
    if preset is None and cuda:
        from dlperf.hardware.specs import match_preset

        matched = match_preset(res["device"])
        preset = matched.name if matched else None
    res["predicted"] = predicted_tflops(preset, args.tokens, args.d_model) if preset else None
    alone = res["alone"]["summary"]
    if res["predicted"] and alone:
        sustained = alone["last_half_median_tflops"]
        res["derived"]["sustained_over_predicted_own_share"] = (
            sustained / res["predicted"]["tflops_own_share"])
        res["derived"]["sustained_over_predicted_table_share"] = (
            sustained / res["predicted"]["tflops_table_share"])
    save_result(args.out, "sustained-gemm-gpu",
                {"seconds": args.seconds, "copy_mib": args.copy_mib, "tokens": args.tokens,
                 "d_model": args.d_model, "dtype": str(dtype), "preset": preset}, res)
    d = res["derived"]
    print(f"{res['device']}: sustained/first {d['sustained_over_first']}, "
          f"beside a copy/alone {d['beside_copy_over_alone']}, sustained/predicted "
          f"{d.get('sustained_over_predicted_own_share')} (own share), "
          f"{d.get('sustained_over_predicted_table_share')} (table's)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
