"""The figures the README gives for ``--optimizer-impl`` and for ``--decode cpu``'s band,
predicted and saved with the environment (no GPU: these are dlperf's predictions).

ResNet-50, batch 256, fp16 autocast, channels_last, on the A100 80 GB preset: the step with the
update fused, foreach and for-loop, the ``[optimizer]`` finding of the for-loop step; then that
step on 8 GPUs of a DGX A100 fed by NVIDIA's CPU loader (16 workers per GPU, 16 cores per GPU,
215 img/s per core, as the validation table's nvidia-pt-a100-x8-amp row) with the efficiency
read through the host-decode record.
Usage: python benchmarks/optimizer_impl_costs.py [OUT.json]
(default: benchmarks/results/optimizer-impl-rn50-a100.json)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks/results/optimizer-impl-rn50-a100.json"
SHAPE = (256, 3, 224, 224)
DEVICE = "a100-80gb"


def main(argv: list[str]) -> int:
    import torchvision

    import dlperf
    from dlperf.analysis.scaling import ScaleConfig, module_buffers, scale_out
    from dlperf.hardware.interconnect import get_interconnect
    from dlperf.hardware.track_record import efficiency_band
    from dlperf.provenance import save_result

    out = Path(argv[0]) if argv else OUT
    steps, findings, analyses = {}, {}, {}
    for impl in ("fused", "foreach", "for-loop"):
        a = dlperf.analyze("resnet50", SHAPE, device=DEVICE, dtype="fp16", train=True,
                           channels_last=True, optimizer_impl=impl)
        analyses[impl] = a
        steps[impl] = a.totals()["predicted_time_s"]
        findings[impl] = [f.to_dict() for f in a.findings if f.rule == "optimizer"]
    model = torchvision.models.resnet50()
    params = [(n, p.numel() * 4) for n, p in model.named_parameters()]
    # (with DDP's broadcast of the batch norms' buffers before every forward, as
    # `analyze --gpus` counts it)
    cfg = ScaleConfig(gpus=8, decode="cpu", data_cores_per_gpu=16,
                      decode_img_per_s_per_core=215, loader_workers_per_gpu=16,
                      buffers=module_buffers(model))
    here = scale_out(analyses["for-loop"], params, cfg, get_interconnect("nvlink3-a100"),
                     get_interconnect("ib-hdr"))
    band = efficiency_band(here["scaling_efficiency"], 1, DEVICE, host_decode=True)
    results = {"step_s": steps, "optimizer_findings": findings,
               "for_loop_on_8_gpus": {
                   "scaling_efficiency": here["scaling_efficiency"],
                   "per_gpu_samples_per_s": here["per_gpu_samples_per_s"],
                   "optimizer_host_s": here["communication"]["optimizer_host_s"],
                   "efficiency_band_host_decode": list(band) if band else None,
                   "efficiency_band_clean": list(efficiency_band(here["scaling_efficiency"], 1,
                                                                 DEVICE) or []),
                   "measured_scaling": 2077.6 / 2470}}
    save_result(out, "optimizer-impl-rn50-a100",
                {"model": "resnet50", "input_shape": list(SHAPE), "device": DEVICE,
                 "dtype": "fp16", "channels_last": True, "scale": cfg.__dict__}, results)
    for impl, s in steps.items():
        print(f"{impl:9s} {s * 1e3:.1f} ms")
    e = results["for_loop_on_8_gpus"]
    print(f"8 GPUs, for-loop: {e['scaling_efficiency']:.1%}, read as "
          f"{band[0]:.1%}-{band[1]:.1%} (host decode); measured {e['measured_scaling']:.1%}")
    print(f"Wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
