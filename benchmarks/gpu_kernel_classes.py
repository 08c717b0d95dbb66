"""Where a GPU step's predicted time is right and where it is wrong, by kernel class (issue #14's
single-GPU base, issue #11's model).

A prediction can match a measured step by cancellation: one class of kernels predicted too
fast, another too slow. The published tables only give whole steps, so they cannot tell; a lent
GPU's ``dlperf analyze --measure`` times every kernel. This script reads those per-kernel
measurements (one JSON per precision and layout, from scripts/device_check.sh or a short call)
and sums measured and predicted time per class:

* convolutions, forward / data gradient / weight gradient (cuDNN);
* batch norm forward and backward;
* elementwise kernels that stream their bytes (ReLU, its backward, the residual add), with the
  bandwidth they achieved (the guide's minimum bytes over the measured time) beside the rate
  the model gives them;
* pooling, and the rest.

Beside the classes, each run's memory-bound kernels by the model's memory class (and the GPT of
the same device run's step 3, from analyses.json), with the bandwidth each achieved, and the
streaming class split by op (``stream_ops``: elementwise, casts, strided copies).
It also reads the layout contrasts the per-kernel files hold: per convolution pass, what NCHW
costs over channels_last in TF32, bf16 and strict FP32, beside what the model charges (the
NCHW transposes of dlperf/analysis/roofline.py), and the speed-up ladder's TF32
channels_last rung.

Usage: python benchmarks/gpu_kernel_classes.py [DEVICE_RESULTS_DIR] [OUT.json] [--as-measured]
The predictions are the model's as it is now (each configuration analysed again on the meta
device), so a measurement keeps scoring the shipped model; --as-measured keeps the ones the
measurement was taken with.
Default: benchmarks/results/device-h200-2026-12-04-2 -> benchmarks/results/h200-kernel-classes.json
(+ .png). Reads r50-<precision>-<layout>.json (and resnet50-bf16-cl.json as bf16-cl), or where
one is missing the same run gathered in analyses.json as resnet50_layout_<precision>_<layout>.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = ROOT / "benchmarks/results/device-h200-2026-12-04-2"
DEFAULT_OUT = ROOT / "benchmarks/results/h200-kernel-classes.json"
# configuration name -> file in the device folder
FILES = {"tf32-nchw": "r50-tf32-nchw.json", "tf32-cl": "r50-tf32-cl.json",
         "bf16-nchw": "r50-bf16-nchw.json", "bf16-cl": "resnet50-bf16-cl.json",
         "fp32-nchw": "r50-fp32-nchw.json", "fp32-cl": "r50-fp32-cl.json",
         # fp16 (cuDNN's batch norm, where bf16 runs PyTorch's own): device_check.sh step 3
         # gathers them from the next GPU on (none on the first two H200s)
         "fp16-nchw": "r50-fp16-nchw.json", "fp16-cl": "r50-fp16-cl.json"}
CONV_PASSES = ("conv forward", "conv dgrad", "conv wgrad")
CLASSES = (*CONV_PASSES, "batch norm forward", "batch norm backward", "elementwise (stream)",
           "pooling", "other")
# The layout contrasts: (precision, NCHW config, channels_last config)
LAYOUTS = (("tf32", "tf32-nchw", "tf32-cl"), ("bf16", "bf16-nchw", "bf16-cl"),
           ("fp32", "fp32-nchw", "fp32-cl"), ("fp16", "fp16-nchw", "fp16-cl"))


def layer_group(layer: dict) -> str:
    """The group (``CLASSES``) of one analysed layer, from its ``kind``, ``phase``,
    ``math_class`` and ``memory_class`` in ``dlperf analyze --json``: a CNN step's coarser
    groups than ``dlperf.analysis.measure.kernel_class``'s (convolutions by pass, batch norm
    by direction), which results saved before that class existed can still be read into."""
    if layer["kind"] == "gemm" and layer["op"].startswith("convolution"):
        return {"forward": "conv forward", "dgrad": "conv dgrad", "wgrad": "conv wgrad"}[
            layer["phase"]]
    memory = layer.get("memory_class")
    if memory == "channel-norm":
        return "batch norm forward"
    if memory == "channel-norm-backward":
        return "batch norm backward"
    if layer["kind"] == "memory" and memory == "stream":
        return "elementwise (stream)"
    if memory in ("window", "window-backward"):
        return "pooling"
    return "other"


def _occurrences(layers: list[dict]):
    """Each layer keyed by (module, phase, kind, n-th such): the analysed and the measured lists
    of one run name the same kernels, in the same order, but may differ in op names."""
    seen: Counter = Counter()
    for layer in layers:
        key = (layer["module"], layer["phase"], layer["kind"])
        yield (*key, seen[key]), layer
        seen[key] += 1


def current_layers(result: dict) -> list[dict]:
    """The per-kernel analysis of ``result``'s configuration by the model as it is now
    (``dlperf analyze`` on the meta device: the capture is device-independent), so that a
    measurement taken with an older model is scored against the shipped one."""
    from dlperf.analysis.api import analyze

    cfg = result["config"]
    return analyze(cfg["model"], tuple(cfg["input_shape"]), device=cfg["device"],
                   dtype=cfg["dtype"], train=cfg["train"], tf32=cfg["tf32"],
                   channels_last=cfg["channels_last"], optimizer=cfg["optimizer"],
                   precision=cfg["precision"], loss=cfg["loss"],
                   train_metrics=cfg["train_metrics"]).to_dict()["layers"]


def matched(result: dict, layers: list[dict] | None = None):
    """(analysed layer or None, measured layer) for each measured kernel of ``result``: the
    analysis is ``layers`` (``current_layers``) where given, else the result's own."""
    analysed = dict(_occurrences(layers or result["layers"]))
    for key, m in _occurrences(result["measurement"]["layers"]):
        yield analysed.get(key), m


def classes(result: dict, layers: list[dict] | None = None) -> dict:
    """Measured and predicted seconds, kernels and bytes per class for one per-kernel result;
    the predictions from ``layers`` (``current_layers``) where given, else as measured."""
    out = {c: {"measured_s": 0.0, "predicted_s": 0.0, "kernels": 0, "bytes": 0,
               "transpose_s": 0.0} for c in CLASSES}
    unmatched = 0
    for layer, m in matched(result, layers):
        if layer is None:
            unmatched += 1
            continue
        c = out[layer_group(layer)]
        c["measured_s"] += m["measured_time_s"]
        c["predicted_s"] += layer["predicted_time_s"]
        c["kernels"] += 1
        c["bytes"] += layer["bytes"]
        c["transpose_s"] += layer.get("transpose_time_s", 0.0)
    for c in out.values():
        c["predicted_over_measured"] = (c["predicted_s"] / c["measured_s"]
                                        if c["measured_s"] else None)
    stream = out["elementwise (stream)"]
    return {"config": {k: result["config"][k] for k in ("dtype", "tf32", "channels_last")}
            | {"batch": result["config"]["input_shape"][0]},
            "by_class": out, "unmatched_kernels": unmatched,
            "measured_s": sum(c["measured_s"] for c in out.values()),
            "predicted_s": sum(c["predicted_s"] for c in out.values()),
            "stream_achieved_bytes_per_s": (stream["bytes"] / stream["measured_s"]
                                            if stream["measured_s"] else None),
            "stream_model_bytes_per_s": (stream["bytes"] / stream["predicted_s"]
                                         if stream["predicted_s"] else None)}


def memory_classes(result: dict, layers: list[dict] | None = None) -> dict:
    """Per memory class of the model's (hardware/efficiency.py: stream, channel-norm, norm,
    reduction-backward, transcendental, gelu-tanh, window, ...), the memory-bound and copy
    kernels' bytes, measured and predicted seconds, and the bandwidth each achieved against the
    one the model gave them (the guide's minimum bytes over the time); predictions as in
    ``classes``."""
    return _memory_kernels(result, layers, lambda layer: layer.get("memory_class") or "stream")


def stream_ops(result: dict, layers: list[dict] | None = None) -> dict:
    """The ``stream`` class of ``memory_classes`` split by op (add, relu, _to_copy, clone,
    stack, ...): the model streams them all at one rate, which a GPU need not. On the lent
    H200 a ResNet-50's elementwise kernels streamed 4.1 TB/s, while the GPT of the same run
    cast its FP32 activations to bf16 at 2.7 TB/s (``_to_copy``) and ran its attention
    backward's layout copies (``stack`` of dq, dk, dv; a transposing ``clone``) at 1.0-1.3, so
    that its stream class averaged 2.35 (results/h200-kernel-classes.json)."""
    return _memory_kernels(result, layers, lambda layer: layer["op"] if (
        layer.get("memory_class") or "stream") == "stream" else None)


def _memory_kernels(result: dict, layers, key) -> dict:
    """The memory-bound and copy kernels of ``result`` summed by ``key(layer)`` (None: left
    out), with the bandwidth each group achieved and the one the model gave it."""
    out: dict = {}
    for layer, m in matched(result, layers):
        if layer is None or layer["kind"] not in ("memory", "copy", "transpose"):
            continue
        group = key(layer)
        if group is None:
            continue
        c = out.setdefault(group, {"kernels": 0, "bytes": 0, "measured_s": 0.0,
                                   "predicted_s": 0.0})
        c["kernels"] += 1
        c["bytes"] += layer["bytes"]
        c["measured_s"] += m["measured_time_s"]
        c["predicted_s"] += layer["predicted_time_s"]
    for c in out.values():
        c["achieved_bytes_per_s"] = c["bytes"] / c["measured_s"] if c["measured_s"] else None
        c["model_bytes_per_s"] = c["bytes"] / c["predicted_s"] if c["predicted_s"] else None
    return out


def layout_contrasts(runs: dict) -> list[dict]:
    """Per precision and convolution pass: NCHW's measured and predicted cost over channels_last
    (seconds per step, both runs at the same batch and bytes)."""
    out = []
    for precision, nchw, cl in LAYOUTS:
        if nchw not in runs or cl not in runs:
            continue
        a, b = runs[nchw]["by_class"], runs[cl]["by_class"]
        for p in CONV_PASSES:
            out.append({"precision": precision, "pass": p,
                        "nchw_measured_s": a[p]["measured_s"], "cl_measured_s": b[p]["measured_s"],
                        "measured_extra_s": a[p]["measured_s"] - b[p]["measured_s"],
                        "nchw_predicted_s": a[p]["predicted_s"],
                        "cl_predicted_s": b[p]["predicted_s"],
                        "predicted_extra_s": a[p]["predicted_s"] - b[p]["predicted_s"]})
    return out


def ladder_layout(path: Path) -> dict | None:
    """The speed-up ladder's TF32 channels_last rung: measured and predicted gain over NCHW."""
    if not path.exists():
        return None
    rungs = json.loads(path.read_text())["results"]["rungs"]
    base, cl = rungs[0], rungs[1]
    return {"nchw_img_s": base["img_per_s"], "cl_img_s": cl["img_per_s"],
            "measured_gain": cl["img_per_s"] / base["img_per_s"],
            "predicted_gain": cl["predicted_img_per_s"] / base["predicted_img_per_s"],
            "rungs": [base["rung"], cl["rung"]]}


def plot(runs: dict, path: Path) -> Path | None:
    from dlperf.plots import pyplot, save_figure

    plt = pyplot()
    if plt is None:
        return None
    names = [c for c in CLASSES if c != "other"]
    fig, ax = plt.subplots(figsize=(10, 4.8), dpi=120)
    width = 0.8 / len(runs)
    for i, (name, run) in enumerate(runs.items()):
        ratios = [run["by_class"][c]["predicted_over_measured"] or 0 for c in names]
        ax.bar([x + i * width for x in range(len(names))], ratios, width, label=name)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(names))], names, rotation=20,
                  ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_yticks([0.25, 0.5, 1, 2, 4], ["0.25", "0.5", "1", "2", "4"])
    ax.minorticks_off()
    ax.set_ylabel("predicted / measured time (log)", fontsize=9)
    ax.set_title("ResNet-50 training step by kernel class: the model against the GPU's kernels",
                 fontsize=10)
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


def main(argv: list[str]) -> int:
    from dlperf.errors import DlperfError
    from dlperf.provenance import save_result

    as_measured = "--as-measured" in argv
    argv = [a for a in argv if a != "--as-measured"]
    folder = Path(argv[0]) if argv else DEFAULT_DIR
    out_path = Path(argv[1]) if len(argv) > 1 else DEFAULT_OUT
    runs, memory, ops, environment = {}, {}, {}, None
    gathered = folder / "analyses.json"  # scripts/device_check.sh step 3 gathers them there
    gathered = json.loads(gathered.read_text()) if gathered.exists() else {}
    for name, file in FILES.items():
        f = folder / file
        result = (json.loads(f.read_text()) if f.exists()
                  else gathered.get("resnet50_layout_" + name.replace("-", "_")))
        if result:
            layers = None if as_measured else current_layers(result)
            runs[name] = classes(result, layers)
            memory[name] = memory_classes(result, layers)
            ops[name] = stream_ops(result, layers)
            environment = environment or result.get("environment")
    if not runs:
        raise DlperfError(f"{folder}: no per-kernel results ({', '.join(FILES.values())}); run "
                          "`dlperf analyze resnet50 --measure --json ...` on a GPU first")
    if gathered.get("gpt_350m_bf16"):  # the decoder of step 3: its memory kernels, by class
        # (as measured: its configuration does not record the GPT's shape to analyse again)
        memory["gpt-350m-bf16"] = memory_classes(gathered["gpt_350m_bf16"])
        ops["gpt-350m-bf16"] = stream_ops(gathered["gpt_350m_bf16"])
    contrasts = layout_contrasts(runs)
    ladder = ladder_layout(folder / "train-ladder-gpu.json")
    for name, run in runs.items():
        print(f"{name:10s} batch {run['config']['batch']:4d}: measured {run['measured_s'] * 1e3:6.1f} "
              f"ms, predicted {run['predicted_s'] * 1e3:6.1f} ms")
        for c, v in run["by_class"].items():
            if v["measured_s"]:
                print(f"    {c:22s} {v['measured_s'] * 1e3:7.2f} ms measured, "
                      f"{v['predicted_s'] * 1e3:7.2f} predicted ({v['predicted_over_measured']:.2f}x)")
        if run["stream_achieved_bytes_per_s"]:
            print(f"    elementwise kernels: {run['stream_achieved_bytes_per_s'] / 1e12:.2f} TB/s "
                  f"achieved, {run['stream_model_bytes_per_s'] / 1e12:.2f} TB/s in the model")
    for c in contrasts:
        print(f"NCHW over channels_last, {c['precision']} {c['pass']}: measured "
              f"{c['measured_extra_s'] * 1e3:+.2f} ms, predicted {c['predicted_extra_s'] * 1e3:+.2f}")
    for name, classes_ in memory.items():
        print(f"{name}: memory-bound kernels by class, TB/s achieved (model): " + ", ".join(
            f"{c} {v['achieved_bytes_per_s'] / 1e12:.2f} ({v['model_bytes_per_s'] / 1e12:.2f})"
            for c, v in sorted(classes_.items(), key=lambda kv: -kv[1]["measured_s"])
            if v["achieved_bytes_per_s"] and v["model_bytes_per_s"] and v["measured_s"] > 2e-4))
    for name, by_op in ops.items():
        print(f"{name}: streaming kernels by op, TB/s achieved (model): " + ", ".join(
            f"{op} {v['achieved_bytes_per_s'] / 1e12:.2f} ({v['model_bytes_per_s'] / 1e12:.2f})"
            for op, v in sorted(by_op.items(), key=lambda kv: -kv[1]["measured_s"])
            if v["achieved_bytes_per_s"] and v["model_bytes_per_s"] and v["measured_s"] > 2e-4))
    if ladder:
        print(f"ladder {ladder['rungs'][1]!r}: measured {ladder['measured_gain']:.2f}x, "
              f"predicted {ladder['predicted_gain']:.2f}x")
    config = {"folder": str(folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder),
              "files": {k: v for k, v in FILES.items() if k in runs},
              "predictions": ("as measured" if as_measured else
                              "the model at this result's commit (the GPT's as measured)"),
              "measured_on": environment}
    save_result(out_path, "gpu-kernel-classes", config,
                {"runs": runs, "layout_contrasts": contrasts, "ladder_tf32_channels_last": ladder,
                 "memory_classes": memory, "stream_ops": ops})
    png = plot(runs, out_path.with_suffix(".png"))
    print(f"Wrote {out_path}" + (f" and {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
