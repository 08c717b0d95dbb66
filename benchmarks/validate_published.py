"""dlperf's predictions against published, measured single-GPU training throughputs (issue #11).

Reads benchmarks/validation/published_training.csv (each row: model, image size (the sequence
length for token models such as bert-large), batch, GPU preset, precision, layout, optimizer,
what the source measured in samples/s, a class and a flag), predicts every row from the device's
datasheet preset and the shipped efficiency model (dlperf/hardware/efficiency.py; its
held-out errors come from benchmarks/fit_efficiency.py), and prints and saves the table with the
error per row, per class and per device.

The error of a row is predicted / measured - 1 (positive: dlperf says faster than measured).
Rows flagged ``suspect`` or ``input-bound?`` are shown but kept out of the "clean" summary.

Usage: python benchmarks/validate_published.py [CSV] [OUT.json] [--only=ID,ID]
       [--set=COLUMN=VALUE ...]   (another reading: a column set on every row, e.g.
       --set=optimizer_impl= costs every update fused; it needs its own OUT.json)
       [--fitted=NAME=VALUE ...] [--efficiency=[DEVICE:]NAME=VALUE ...]   (an experiment's
       efficiency model: a shared parameter of efficiency.FITTED replaced, presets' own entries
       still winning; or one set over a preset's own, every preset's without DEVICE:. Also
       its own OUT.json, whose config.efficiency_edits records the edit)
"""

from __future__ import annotations

import csv
import io
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CSV = ROOT / "benchmarks/validation/published_training.csv"
DEFAULT_OUT = ROOT / "benchmarks/results/validation-published.json"
# precision column -> (dtype, TF32 GEMMs, dlperf precision mode). fp16-o2: apex amp O2 (the
# model cast to fp16, LayerNorm and softmax included; FP32 master weights in the optimizer),
# dlperf's --precision half. bf16-fsdp: FSDP's mixed precision (bf16 parameters gathered and
# computed with, no autocast; fp32 master weights, optimizer and gradient reduction:
# torchtitan's FSDP2, Composer's DEFAULT with llm-foundry's low-precision LayerNorm), dlperf's
# --precision fsdp.
PRECISIONS = {"amp": ("fp16", False, "mixed"), "fp32": ("fp32", False, "mixed"),
              "tf32": ("fp32", True, "mixed"), "bf16": ("bf16", False, "mixed"),
              "fp16-o2": ("fp16", False, "half"), "bf16-fsdp": ("bf16", False, "fsdp")}


def commented_csv(path: Path) -> list[dict]:
    """The rows of a validation table whose header lines ("# ...") cite its sources."""
    text = "".join(line for line in path.read_text().splitlines(keepends=True)
                   if not line.startswith("#"))
    return list(csv.DictReader(io.StringIO(text)))


def read_rows(path: Path) -> list[dict]:
    rows = commented_csv(path)
    for row in rows:
        row["batch"], row["image_size"] = int(row["batch"]), int(row["image_size"])
        row["measured_img_s"] = float(row["measured_img_s"])
        if row["precision"] not in PRECISIONS:
            raise SystemExit(f"{path}: {row['id']}: unknown precision {row['precision']!r}")
    return rows


def set_columns(rows: list[dict], values: dict[str, str]) -> list[dict]:
    """``rows`` with each COLUMN of ``values`` set to its VALUE on every row (blank: None):
    another reading of a table (``--set``, here, in validate_scaling.py and fit_efficiency.py).
    A name that is not a column is refused."""
    for key in values:
        if rows and key not in rows[0]:
            raise SystemExit(f"--set {key}: not a column of the table")
    return [{**r, **{k: v or None for k, v in values.items()}} for r in rows]


def efficiency_edits(fitted: list[str], devices: list[str]) -> dict | None:
    """An experiment's edit of the efficiency model from the command line (None: none), so its
    numbers come from a repository command at a clean commit rather than from an uncommitted
    edit of dlperf/hardware: ``--fitted NAME=VALUE`` replaces a shared parameter as an edit of
    efficiency.FITTED would (a preset's own entries, such as the V100's or the Hopper GEMM
    share, still win); ``--efficiency [DEVICE:]NAME=VALUE`` sets one over the preset's own
    entries, as ``dlperf analyze --efficiency`` does (every preset without ``DEVICE:``).
    Returns {"fitted": {name: value}, "devices": {preset or "*": {name: value}}}; a bad name,
    value or preset stops with one line."""
    if not fitted and not devices:
        return None
    from dlperf.errors import DlperfError
    from dlperf.hardware.efficiency import parse_overrides
    from dlperf.hardware.specs import get_device

    try:
        per_device: dict[str, list[str]] = {}
        for item in devices:
            head, sep, rest = item.partition(":")
            name, item = (get_device(head.strip()).name, rest) if sep and "=" not in head \
                else ("*", item)
            per_device.setdefault(name, []).append(item)
        return {"fitted": parse_overrides(fitted, "--fitted"),
                "devices": {name: parse_overrides(items) for name, items in
                            sorted(per_device.items())}}
    except DlperfError as exc:
        raise SystemExit(str(exc)) from None


def edited_spec(name: str, edits: dict | None):
    """The preset ``name`` with ``edits``' per-device entries over its own (efficiency_edits)."""
    from dataclasses import replace

    from dlperf.hardware.specs import get_device

    spec = get_device(name)
    if not edits:
        return spec
    own = {**edits["devices"].get("*", {}), **edits["devices"].get(spec.name, {})}
    return replace(spec, efficiency={**(spec.efficiency or {}), **own}) if own else spec


def edited_efficiency(spec, cfg, edits: dict | None):
    """The efficiency model a row runs under ``edits`` (None without: predict_on's own)."""
    from dlperf.hardware.efficiency import efficiency_for

    return efficiency_for(spec, cfg.attention_kernel, fitted=edits["fitted"]) if edits else None


def _before_sdpa(row: dict) -> bool:
    """The source ran PyTorch 1.x, before F.scaled_dot_product_attention (2.0): timm's
    attention was then q @ k^T, softmax and @ v as separate kernels with the scores in memory.
    timm's published benchmark files name the version (``-pt112-``)."""
    return "-pt1" in row["source"]


def _unfuse_attention(model) -> None:
    """timm's attention modules choose SDPA or the explicit path by their ``fused_attn``
    attribute; set it as the source's timm had it."""
    for module in model.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = False


def csv_bool(value, default: bool) -> bool:
    """A true/false column of the tables: blank or absent is ``default``; a row that
    validate_scaling.read_rows already parsed holds a bool."""
    if isinstance(value, bool):
        return value
    if not value:
        return default
    if value not in ("true", "false"):
        raise ValueError(f"expected true, false or blank, not {value!r}")
    return value == "true"


def te_tp_impl(fp8: str | None) -> str | None:
    """The decoder's tp_impl for a row's fp8 column: "te" for TransformerEngine's recipes
    (models/fp8.py: te.Linear layers), None (the preset's) otherwise."""
    from dlperf.models.fp8 import RECIPES as TE_RECIPES

    return "te" if fp8 in TE_RECIPES else None


def capture_rows(rows: list[dict], progress=None, footprints: list | None = None
                 ) -> list[tuple]:
    """(row, config, costs, uncounted, seconds) per row; one capture per (model, size, batch,
    precision, layout, optimizer), shared by every device that row shape appears on.
    ``footprints``: a list to append each row's one-GPU memory footprint to
    (``capture_costs``' fourth result)."""
    from dlperf.analysis.api import AnalysisConfig, capture_costs
    from dlperf.models.float8 import gather_shares
    from dlperf.models.gpt import (PRESETS, default_attention_kernel, default_loss,
                                   default_train_metrics, gpt_config)
    from dlperf.models.registry import build_model

    captures: dict[tuple, tuple] = {}
    models: dict[str, tuple] = {}
    out = []
    for row in rows:
        dtype, tf32, precision = PRECISIONS[row["precision"]]
        checkpointing = bool(row.get("activation_checkpointing"))
        policy = row.get("checkpoint_policy") or "full"
        every = int(row.get("checkpoint_every") or 1)  # every n-th block checkpointed
        # the batch-norm stack (analysis/fusion.py) and CUDA graphs: optional columns
        fusion = row.get("fusion") or "none"
        graphs = csv_bool(row.get("cuda_graphs"), False)
        fused = not _before_sdpa(row)
        # how torch.optim ran the update (optional column; blank: fused, dlperf's default)
        impl = row.get("optimizer_impl") or "fused"
        # whose rotary-embedding kernels a Llama row ran (optional column; blank: the preset's,
        # torchtitan's complex multiply)
        rope = row.get("rope") or None
        # torchao's float8 layers (optional columns, multi-GPU tables: models/float8.py): the
        # recipe, and whether FSDP gathered their weights in FP8 (then each GPU cast its shard)
        # (TransformerEngine's recipes, delayed or current: te.Linear layers, models/fp8.py,
        # built as tp_impl "te", the form those layers take in dlperf's decoder)
        fp8 = row.get("fp8") or None
        gathered = csv_bool(row.get("fp8_all_gather"), False)
        # how the run computed its loss (optional column; blank: the preset's, else fp32)
        loss = row.get("loss") or default_loss(row["model"])
        # the cross-entropy train metrics its trainer evaluated a micro-batch (optional column;
        # blank: the preset's, else none)
        metrics = (int(row["train_metrics"]) if row.get("train_metrics") not in (None, "")
                   else default_train_metrics(row["model"]))
        shards = (min(row["gpus"], row["gpus_per_node"]) if row.get("strategy") == "hsdp"
                  else row.get("gpus"))  # the GPUs sharing one copy of the weights
        shares = gather_shares(shards, int(row.get("grad_accum") or 1)) if gathered else {}
        key = (row["model"], fused, checkpointing, policy, every, row["image_size"],
               row["batch"], dtype, precision, row["layout"], row["optimizer"], fusion, impl,
               rope, fp8, tuple(sorted(shares.items())), loss, metrics)
        # a GPT preset is built for the row's sequence length (its learned positions)
        gpt = gpt_config(row["model"], seq_len=row["image_size"], rope=rope, fp8=fp8,
                         fp8_all_gather=gathered or None, tp_impl=te_tp_impl(fp8)) \
            if row["model"] in PRESETS else None
        if (row["model"], fused, gpt) not in models:
            model, model_input = build_model(row["model"], gpt=gpt)
            if not fused:
                _unfuse_attention(model)
            models[row["model"], fused, gpt] = model, model_input
        model, model_input = models[row["model"], fused, gpt]
        tokens = model_input.kind == "tokens"  # image_size is then the sequence length
        cfg = AnalysisConfig(model=row["model"], dtype=dtype, tf32=tf32, train=True,
                             input_shape=(row["batch"], row["image_size"]) if tokens else
                             (row["batch"], 3, row["image_size"], row["image_size"]),
                             channels_last=row["layout"] == "nhwc", optimizer=row["optimizer"],
                             device=row["device"], precision=precision, tokens=tokens,
                             activation_checkpointing=checkpointing,
                             checkpoint_policy=policy, checkpoint_every=every,
                             fusion=fusion, cuda_graphs=graphs,
                             optimizer_impl=impl,
                             # the fused attention kernel of the row's stack (optional
                             # column; blank: the preset's, else PyTorch's FlashAttention-2)
                             attention_kernel=row.get("attention_kernel")
                             or default_attention_kernel(row["model"]), fp8=fp8,
                             loss=loss, train_metrics=metrics, **shares)
        if key not in captures:
            captures[key] = capture_costs(model, cfg, model_input.dtype)
        out.append((row, cfg, *captures[key][:3]))
        if footprints is not None:
            footprints.append(captures[key][3])
        if progress:
            progress()
    return out


def predict_rows(rows: list[dict], progress=None, captured=None, efficiency=None,
                 edits: dict | None = None) -> list[dict]:
    """Each row with its prediction from the device preset (and ``efficiency``: default, the
    shipped model of dlperf/hardware/efficiency.py; ``edits``: an experiment's edit of it,
    efficiency_edits)."""
    from dlperf.analysis.api import predict_on

    out = []
    for row, cfg, costs, uncounted, seconds in captured or capture_rows(rows, progress):
        spec = edited_spec(row["device"], edits)
        analysis = predict_on(costs, uncounted, cfg, spec, seconds,
                              efficiency=efficiency or edited_efficiency(spec, cfg, edits))
        totals = analysis.totals()
        predicted = totals["samples_per_s"]
        out.append({**row, "predicted_img_s": predicted,
                    "ratio": predicted / row["measured_img_s"],
                    "memory_bound_time_share": totals["memory_bound_time_share"],
                    "uncounted_ops": sum(uncounted.values())})
    return out


def summarize(rows: list[dict]) -> dict:
    """Median |error| and median signed ratio per group; 'clean' leaves flagged rows out."""
    def stats(group):
        if not group:
            return None
        errors = [abs(r["ratio"] - 1) for r in group]
        return {"rows": len(group), "median_abs_error": statistics.median(errors),
                "median_ratio": statistics.median(r["ratio"] for r in group),
                "max_abs_error": max(errors)}

    clean = [r for r in rows if r["flag"] == "clean"]
    groups = {"all": rows, "clean": clean}
    for field in ("class", "source", "device", "model"):
        for value in sorted({r[field] for r in clean}):
            groups[f"clean {field}={value}"] = [r for r in clean if r[field] == value]
    return {name: stats(group) for name, group in groups.items()}


# the precisions that train in 16 bits (mixed or half), for the mixed-precision pairs
HALF = tuple(name for name, (dtype, _, _) in PRECISIONS.items() if dtype != "fp32")


def _ratio_of_speedups(fast: dict, slow: dict) -> dict:
    measured = fast["measured_img_s"] / slow["measured_img_s"]
    predicted = fast["predicted_img_s"] / slow["predicted_img_s"]
    return {"fast": fast["id"], "slow": slow["id"], "measured": measured,
            "predicted": predicted, "ratio": predicted / measured}


def _pairs(rows: list[dict], tokens: tuple[str, ...]) -> list[list[dict]]:
    """Rows whose ids differ only in ``tokens`` (a row id names its source, model, system and
    setting, e.g. lambda-rn50-h100-sxm-amp / -tf32, timm-nhwc-resnet50-3090-amp / timm-...)."""
    groups = {}
    for r in rows:
        stem = tuple(t for t in r["id"].split("-") if t not in tokens)
        groups.setdefault(stem, []).append(r)
    return [g for _, g in sorted(groups.items()) if len(g) == 2]


def speedups(rows: list[dict]) -> dict:
    """What two of dlperf's fixes buy, predicted against measured, where a source measured a
    model both ways on one system (clean rows only): channels_last over NCHW (same precision)
    and half precision over FP32/TF32 (each at the source's own batch and layout: NVIDIA's
    ConvNets ran AMP in NHWC and TF32 in NCHW). Each pair's ratio is the predicted speed-up
    over the measured one."""
    clean = [r for r in rows if r["flag"] == "clean"]
    layout = [_ratio_of_speedups(*sorted(g, key=lambda r: r["layout"] != "nhwc"))
              for g in _pairs(clean, ("nhwc", "nchw")) if {r["layout"] for r in g} == {
                  "nhwc", "nchw"}]
    precision = {}
    for g in _pairs(clean, ("amp", "fp16", "fp32", "tf32")):
        half = [r for r in g if r["precision"] in HALF]
        full = [r for r in g if r["precision"] not in HALF]
        if len(half) == 1 and len(full) == 1:
            model, source = half[0]["model"], half[0]["source"]
            group = ("bert" if model.startswith("bert") else
                     "lambda-resnet50-nchw" if source.startswith("lambda") else "cnn-other")
            precision.setdefault(group, []).append(_ratio_of_speedups(half[0], full[0]))

    def stats(pairs):
        ratios = [p["ratio"] for p in pairs]
        return {"pairs": len(pairs), "median_ratio": statistics.median(ratios),
                "median_abs_error": statistics.median(abs(x - 1) for x in ratios)}

    every = [p for group in precision.values() for p in group]
    return {"channels_last": {**stats(layout), "rows": layout} if layout else None,
            "mixed_precision": {**stats(every), "by_group": {g: stats(v) for g, v in
                                                            sorted(precision.items())},
                                "rows": every} if every else None}


def render(rows: list[dict], summary: dict) -> str:
    lines = [f"{'id':26s} {'model':20s} {'device':10s} {'prec':5s} {'batch':>5s} "
             f"{'measured':>9s} {'predicted':>9s} {'pred/meas':>9s}  flag"]
    for r in rows:
        lines.append(f"{r['id']:26s} {r['model']:20s} {r['device']:10s} {r['precision']:5s} "
                     f"{r['batch']:5d} {r['measured_img_s']:9,.0f} {r['predicted_img_s']:9,.0f} "
                     f"{r['ratio']:9.2f}  {r['flag']}")
    lines.append("")
    for name, s in summary.items():
        if s:
            lines.append(f"{name:36s} rows {s['rows']:3d}  median |error| "
                         f"{s['median_abs_error']:6.1%}  median pred/meas {s['median_ratio']:.2f}"
                         f"  worst {s['max_abs_error']:6.1%}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    flags = ("--only", "--set=", "--fitted=", "--efficiency=")
    args = [a for a in argv if not a.startswith(flags)]
    only = next((a.split("=", 1)[1] for a in argv if a.startswith("--only=")), None)
    # another reading of the table: --set=COLUMN=VALUE on every row (blank VALUE: none)
    sets = dict(a.removeprefix("--set=").partition("=")[::2] for a in argv
                if a.startswith("--set="))
    # an experiment's efficiency model: --fitted=NAME=VALUE, --efficiency=[DEVICE:]NAME=VALUE
    edits = efficiency_edits([a.removeprefix("--fitted=") for a in argv
                              if a.startswith("--fitted=")],
                             [a.removeprefix("--efficiency=") for a in argv
                              if a.startswith("--efficiency=")])
    csv_path = Path(args[0]) if args else DEFAULT_CSV
    out_path = Path(args[1]) if len(args) > 1 else DEFAULT_OUT
    if (sets or edits) and len(args) < 2:
        raise SystemExit("--set, --fitted and --efficiency read the table another way: give "
                         "CSV and its own OUT.json (the default is the table's own results)")
    rows = set_columns(read_rows(csv_path), sets)
    if only:
        wanted = set(only.split(","))
        rows = [r for r in rows if r["id"] in wanted]
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task(f"predicting {len(rows)} published rows", total=len(rows))
        rows = predict_rows(rows, progress=lambda: bar.advance(task), edits=edits)
    summary = summarize(rows)
    print(render(rows, summary))
    gains = speedups(rows)
    for name, block in gains.items():
        if block:
            print(f"{name} speed-ups, predicted / measured: {block['pairs']} pairs, median "
                  f"{block['median_ratio']:.2f} (median |error| {block['median_abs_error']:.1%})")
            for group, g in block.get("by_group", {}).items():
                print(f"  {group:24s} {g['pairs']:3d} pairs, median {g['median_ratio']:.2f} "
                      f"(median |error| {g['median_abs_error']:.1%})")
    from dataclasses import replace

    from dlperf.hardware.efficiency import FITTED
    from dlperf.provenance import save_result

    config = {"csv": str(csv_path.relative_to(ROOT) if csv_path.is_relative_to(ROOT)
                         else csv_path), "set_columns": sets,
              "efficiency_model": replace(FITTED, **(edits or {}).get("fitted", {})).to_dict(),
              "efficiency_edits": edits,
              "fitted_to_these_rows": "the shipped efficiency parameters were fitted to the "
                                      "clean rows of this table (benchmarks/fit_efficiency.py); "
                                      "its held-out errors are in efficiency-fit.json"}
    save_result(out_path, "validation-published", config, {"rows": rows, "summary": summary,
                                                          "speedups": gains})
    _plot(rows, out_path.with_suffix(".png"))
    print(f"Wrote {out_path} and {out_path.with_suffix('.png')}")
    return 0


def _plot(rows: list[dict], path: Path) -> None:
    """Predicted vs measured, log-log, one colour per class; flagged rows hollow."""
    from dlperf.plots import predicted_vs_measured

    predicted_vs_measured(path, [(r["class"], r["measured_img_s"], r["predicted_img_s"],
                                  r["flag"] == "clean") for r in rows],
                          "measured img/s (published)", "dlperf predicted img/s (datasheet)",
                          "dlperf vs published single-GPU training (dotted: +-15%)")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
