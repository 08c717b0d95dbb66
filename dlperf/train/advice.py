"""What a finished run's numbers say to change next: the performance guide's checklist applied
to a measured run (pure function of the summary and the config; shown by the CLI and saved in
summary.json as ``advice``).
"""

from __future__ import annotations

from dlperf.train.recipes import TrainConfig

DATA_BOUND = 0.10  # share of the wall time spent waiting for data that makes a run input-bound
LOW_MFU_GPU = 0.30


def advice(summary: dict, cfg: TrainConfig, device_type: str) -> list[str]:
    """One line per finding, most important first; empty when nothing stands out."""
    lines = []
    wait = summary.get("data_wait_share") or 0.0
    if wait > DATA_BOUND and cfg.data != "synthetic":
        fixes = ("re-encode smaller shards (`dlperf data prepare SRC DST --max-side 256`), raise "
                 "`threads`, or decode on the GPU (`data_backend=gpu`).")
        if summary.get("data_source") == "files":  # the lossless step comes first
            fixes = (f"`dlperf data inspect {cfg.data}` shows which files cost what; write "
                     "them as shards first (`dlperf data prepare SRC DST`: the same pixels, with "
                     "restart markers that let each crop decode only the data under it, "
                     "1.3-1.4x faster on ImageNet-like photos); then " + fixes)
        lines.append(
            f"input-bound: {wait:.0%} of the time went waiting for data; the model alone ran "
            f"at {summary.get('compute_img_per_s', 0):,.0f} img/s. " + fixes[0].upper()
            + fixes[1:])
    if device_type == "cuda":
        if cfg.dtype == "fp32":
            lines.append("fp32 on a Tensor Core GPU: `dtype=bf16` (or fp16) is the guide's "
                         "first and largest win.")
        if not cfg.channels_last:
            lines.append("NCHW convolutions on Tensor Cores pay for layout transposes: "
                         "`channels_last=true`.")
        if summary.get("nonfinite_check") == "step":
            lines.append("the non-finite check syncs with the host every step: "
                         "`nonfinite_check=deferred` keeps the GPU fed.")
        if not cfg.compile and not cfg.cuda_graphs:
            lines.append("each step launches every kernel from Python: `cuda_graphs=true` or "
                         "`compile=default|reduce-overhead` (compile also fuses the memory-bound "
                         "layers).")
        mfu = summary.get("mfu")
        if mfu is not None and mfu < LOW_MFU_GPU:
            lines.append(f"model FLOP utilisation {mfu:.0%}: see which layers are memory-bound "
                         f"or misaligned with `dlperf analyze {cfg.model} --train --batch-size "
                         f"{cfg.batch_size} --dtype {cfg.dtype}"
                         f"{' --channels-last' if cfg.channels_last else ''} --measure`.")
    if summary.get("skipped_steps"):
        lines.append(f"{summary['skipped_steps']} steps were skipped for a non-finite loss or "
                     "gradient: lower `lr_per_256`, lengthen `warmup_epochs`, or set "
                     "`max_grad_norm`.")
    return lines
