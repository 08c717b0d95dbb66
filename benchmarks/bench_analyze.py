"""How fast is `dlperf analyze`? (issue #2 performance goals; a benchmark, not a test)

1. torchvision resnet50, forward + backward, batch 256, bf16, whole analysis (capture, costs,
   roofline, rules): goal <= 1 s on the 2-core CI-class machine. Measured side by side with
   torch.utils.flop_counter on the same meta model (FLOPs only), as a ratio.
2. A 7B-parameter GPT (32 layers, d_model 4096, 32 heads, seq 4096, vocab 32000), training
   step: goal <= 10 s and < 1 GB peak RSS.

Cold = first call in a fresh process (includes lazy imports and PyTorch's first-dispatch
caches); warm = median of the following calls. Run: `make bench-analyze`.
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torchvision
from torch.utils.flop_counter import FlopCounterMode

import dlperf
from dlperf.provenance import save_result
from dlperf.models.gpt import GPT, GPTConfig

OUT = Path(__file__).resolve().parent / "results"
REPEATS = 5


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def timed(fn, repeats=REPEATS):
    t0 = time.perf_counter()
    first = fn()
    cold = time.perf_counter() - t0
    warm = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        warm.append(time.perf_counter() - t0)
    return first, cold, statistics.median(warm), warm


def flop_counter_resnet50(batch):
    with torch.device("meta"):
        model = torchvision.models.resnet50()
    x = torch.empty(batch, 3, 224, 224, device="meta")
    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    return counter.get_total_flops()


def main() -> int:
    rss_after_imports = rss_mb()
    batch = 256
    analysis, cold, warm, warm_all = timed(
        lambda: dlperf.analyze("resnet50", (batch, 3, 224, 224), device="h100-sxm",
                               dtype="bf16", train=True))
    fc_flops, fc_cold, fc_warm, fc_all = timed(lambda: flop_counter_resnet50(batch))
    resnet = {
        "dlperf_cold_s": cold, "dlperf_warm_median_s": warm, "dlperf_warm_s": warm_all,
        "flop_counter_cold_s": fc_cold, "flop_counter_warm_median_s": fc_warm,
        "flop_counter_warm_s": fc_all,
        "dlperf_over_flop_counter_warm": warm / fc_warm,
        "kernels": analysis.totals()["kernels"],
        "flops": analysis.totals()["flops"], "flop_counter_flops": fc_flops,
        "predicted_step_s": analysis.totals()["predicted_time_s"],
        "goal_s": 1.0, "goal_met_warm": warm <= 1.0, "goal_met_cold": cold <= 1.0,
    }
    print(f"resnet50 b{batch} train: cold {cold:.2f} s, warm {warm:.2f} s "
          f"(flop_counter FLOPs only: warm {fc_warm:.2f} s)")
    # issue #14: `--gpus` reuses the analysis; its curve (1..4,096 GPUs) may add <= 10%
    from dlperf.analysis.scaling import ScaleConfig, scale_out_and_curve
    from dlperf.hardware.interconnect import PRESETS

    with torch.device("meta"):
        model = torchvision.models.resnet50()
    params = [(n, p.numel() * 4) for n, p in model.named_parameters()]
    node, net = PRESETS["nvlink4-h100"], PRESETS["ib-ndr"]
    scale_cfg = ScaleConfig(gpus=64)
    def scale(an, ps, c):  # what `analyze --gpus` runs
        return scale_out_and_curve(an, ps, c, node, net)

    _, _, scale_warm, _ = timed(lambda: scale(analysis, params, scale_cfg))
    resnet.update(scale_out_warm_median_s=scale_warm, scale_out_over_analysis=scale_warm / warm,
                  scale_out_goal=0.10, scale_out_goal_met=scale_warm / warm <= 0.10)
    print(f"--gpus 64 (one scale + the 13-point curve): {scale_warm * 1e3:.1f} ms, "
          f"{scale_warm / warm:.1%} of the analysis")

    cfg = GPTConfig(layers=32, d_model=4096, heads=32, vocab=32000, seq_len=4096)
    with torch.device("meta"):
        gpt = GPT(cfg)
    params = sum(p.numel() for p in gpt.parameters())
    rss_before = rss_mb()
    gpt_an, gcold, gwarm, gwarm_all = timed(
        lambda: dlperf.analyze(gpt, (1, cfg.seq_len), device="h100-sxm", dtype="bf16",
                               train=True, input_dtype=torch.long), repeats=2)
    peak = rss_mb()
    t = gpt_an.totals()
    gpt_res = {
        "parameters": params, "cold_s": gcold, "warm_median_s": gwarm, "warm_s": gwarm_all,
        "peak_rss_mb": peak, "rss_after_imports_mb": rss_after_imports,
        "rss_growth_during_gpt_mb": peak - rss_before, "kernels": t["kernels"],
        "flops": t["flops"], "predicted_step_s": t["predicted_time_s"],
        "tokens_per_s": t["tokens_per_s"], "goal_s": 10.0, "goal_rss_mb": 1024,
        "goal_met": gcold <= 10.0 and peak < 1024,
    }
    print(f"GPT 7B ({params / 1e9:.2f} B params) seq 4096 train: cold {gcold:.2f} s, warm "
          f"{gwarm:.2f} s, peak RSS {peak:.0f} MB (after imports {rss_after_imports:.0f} MB)")
    # the same <= 10% for FSDP, whose curve walks the step unit by unit at every scale
    gpt_params = [(n, p.numel() * 4) for n, p in gpt.named_parameters()]
    fsdp_cfg = ScaleConfig(gpus=512, strategy="fsdp")
    _, _, fsdp_warm, _ = timed(lambda: scale(gpt_an, gpt_params, fsdp_cfg), repeats=2)
    gpt_res.update(fsdp_scale_out_warm_median_s=fsdp_warm,
                   fsdp_scale_out_over_analysis=fsdp_warm / gwarm,
                   fsdp_scale_out_goal_met=fsdp_warm / gwarm <= 0.10)
    print(f"--gpus 512 --strategy fsdp (one scale + the curve): {fsdp_warm * 1e3:.1f} ms, "
          f"{fsdp_warm / gwarm:.1%} of the analysis")
    # The whole command as a user runs it: interpreter start, torch import, analysis, table, JSON.
    cli = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "dlperf", "analyze", "resnet50", "--device",
                            "h100-sxm", "--batch-size", "256", "--dtype", "bf16", "--train",
                            "--json", f"{tmp}/r.json"], check=True, capture_output=True)
            cli.append(time.perf_counter() - t0)
    resnet["cli_process_median_s"] = statistics.median(cli)
    resnet["cli_process_s"] = cli
    print(f"`dlperf analyze resnet50 --train` whole process: median {statistics.median(cli):.2f} s")
    path = OUT / "analyze-speed.json"
    save_result(path, "analyze-speed", {
        "resnet50": {"batch": batch, "input": [3, 224, 224], "dtype": "bf16", "train": True,
                     "device": "h100-sxm", "repeats": REPEATS},
        "gpt": {**cfg.__dict__, "batch": 1, "dtype": "bf16", "train": True, "repeats": 2},
    }, {"resnet50": resnet, "gpt_7b": gpt_res})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
