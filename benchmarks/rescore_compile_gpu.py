"""A lent GPU's torch.compile measurement (benchmarks/bench_compile_gpu.py, step 0d of
scripts/device_check.sh) scored again by the model as it is now, with the attention kernel the
measuring stack ran (issue #14).

The measurement is kept as taken; only the prediction beside it is redone: the saved config's
Llama stack analysed on its preset, its attention at the kernel PyTorch's SDPA picks with the
torch and cuDNN versions the result's environment recorded (``efficiency.sdpa_kernel``),
and at FlashAttention-2's share for comparison, beside the prediction saved with the
measurement. The first lent H200 (torch 2.11, cuDNN 9.19) ran cuDNN's attention there, while
the saved prediction had timed FlashAttention-2's (at 0.322 of the peak, the presets' share
then; 0.262 since).

Usage: python benchmarks/rescore_compile_gpu.py [analyses.json] [OUT.json]
Default: benchmarks/results/device-h200-2026-12-04/analyses.json (its compile_speedup) ->
benchmarks/results/h200-compile-rescored.json
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_IN = ROOT / "benchmarks/results/device-h200-2026-12-04/analyses.json"
DEFAULT_OUT = ROOT / "benchmarks/results/h200-compile-rescored.json"


def measured_stack_kernel(result: dict) -> str:
    """The attention kernel the measuring stack's SDPA ran on its preset's GPU."""
    from dlperf.hardware.efficiency import sdpa_kernel
    from dlperf.hardware.specs import get_device

    env = result["environment"]
    return sdpa_kernel(get_device(result["config"]["preset"]), env["torch"], env.get("cudnn"),
                       environ={})[0]


def rescore(result: dict) -> dict:
    """The measured eager and compiled steps against the prediction at the measuring stack's
    attention kernel and at FlashAttention-2's."""
    from dlperf.provenance import load_sibling

    bench = load_sibling(__file__, "bench_compile_gpu")
    cfg = result["config"]
    args = types.SimpleNamespace(**{k: cfg[k] for k in ("layers", "d_model", "heads", "kv_heads",
                                                        "ffn", "vocab", "tokens", "rope")})
    measured = result["results"]
    kernel = measured_stack_kernel(result)
    out = {"measured_eager_s": measured["eager_s"], "measured_compiled_s": measured["compiled_s"],
           "measuring_stack_kernel": kernel,
           # the prediction saved beside the measurement (the model and kernel of its day)
           "predicted_when_measured": {
               "eager_s": measured["predicted_eager_s"],
               "compiled_s": measured["predicted_compiled_s"],
               "eager_predicted_over_measured": measured["predicted_eager_s"] / measured["eager_s"],
               "compiled_predicted_over_measured": (measured["predicted_compiled_s"]
                                                    / measured["compiled_s"])},
           "by_kernel": {}}
    for name in dict.fromkeys((kernel, "flash2")):
        classes: dict = {}
        pred = bench.predicted(bench.gpt_config(args), cfg["batch"], cfg["preset"], "bf16",
                               name, classes=classes)
        out["by_kernel"][name] = {
            "predicted_eager_s": pred["none"], "predicted_compiled_s": pred["compile-blocks"],
            "eager_predicted_over_measured": pred["none"] / measured["eager_s"],
            "compiled_predicted_over_measured": pred["compile-blocks"] / measured["compiled_s"],
            "predicted_speedup": pred["none"] / pred["compile-blocks"],
            "measured_speedup": measured["eager_s"] / measured["compiled_s"],
            "predicted_ms_by_class": classes}
    return out


def main(argv: list[str]) -> int:
    from dlperf.provenance import save_result

    in_path = Path(argv[0]) if argv else DEFAULT_IN
    out_path = Path(argv[1]) if len(argv) > 1 else DEFAULT_OUT
    result = json.loads(in_path.read_text())["compile_speedup"]
    out = rescore(result)
    then = out["predicted_when_measured"]
    print(f"as predicted when measured: eager {then['eager_s'] * 1e3:.1f} ms "
          f"({then['eager_predicted_over_measured']:.2f}x), compiled "
          f"{then['compiled_s'] * 1e3:.1f} ms ({then['compiled_predicted_over_measured']:.2f}x)")
    for name, r in out["by_kernel"].items():
        print(f"attention {name:7s}: eager predicted {r['predicted_eager_s'] * 1e3:.1f} ms "
              f"({r['eager_predicted_over_measured']:.2f}x the measured "
              f"{out['measured_eager_s'] * 1e3:.1f}), compiled "
              f"{r['predicted_compiled_s'] * 1e3:.1f} ms "
              f"({r['compiled_predicted_over_measured']:.2f}x), speed-up "
              f"{r['predicted_speedup']:.3f} against {r['measured_speedup']:.3f}")
    save_result(out_path, "h200-compile-rescored",
                {"measurement": str(in_path.relative_to(ROOT) if in_path.is_relative_to(ROOT)
                                    else in_path),
                 "measured_with": {k: result["environment"].get(k)
                                   for k in ("torch", "cudnn", "cuda", "gpu", "git_commit")},
                 "stack": result["config"]}, out)
    print(f"Wrote {out_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
