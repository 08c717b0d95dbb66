"""Rerun dlperf's scale-out prediction for every row of a table of published multi-GPU results.

For each row: one GPU's training step analysed from the datasheet preset (the same capture as
validate_published.py), then ``analysis/scaling.scale_out`` on the row's GPU count, nodes,
interconnects, strategy and input side. Reported per row: predicted vs measured samples/s per
GPU (which carries the single-GPU model's error too) and, where the table has the one-GPU
figure of the same system, predicted vs measured scaling efficiency (the scale-out model alone).

Usage: python benchmarks/validate_scaling.py [TABLE.csv] [OUT.json]
(default: benchmarks/validation/published_scaling.csv -> benchmarks/results/validation-scaling.json)
Another reading of one source's assumptions, to its own OUT.json:
    python benchmarks/validate_scaling.py TABLE OUT --source NAME [--interconnect OLD=NEW]
        [--set COLUMN=VALUE]
An experiment's efficiency model, to its own OUT.json (validate_published.efficiency_edits):
    python benchmarks/validate_scaling.py TABLE OUT [--fitted NAME=VALUE ...]
        [--efficiency [DEVICE:]NAME=VALUE ...]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CSV = ROOT / "benchmarks/validation/published_scaling.csv"
DEFAULT_OUT = ROOT / "benchmarks/results/validation-scaling.json"
INTS = ("image_size", "batch", "gpus", "gpus_per_node", "grad_accum")
FLOATS = ("data_cores_per_gpu", "decode_img_s_per_core", "measured_per_gpu", "measured_single")
# blank: unknown workers; the preset's train metrics (models/gpt.py PRESET_TRAIN_METRICS), else 0
OPTIONAL_INTS = ("loader_workers_per_gpu", "train_metrics")


def read_rows(path: Path) -> list[dict]:
    from dlperf.analysis.costs import OPTIMIZER_IMPLS
    from dlperf.analysis.fusion import FUSIONS
    from dlperf.analysis.scaling import KVSTORES
    from dlperf.hardware.efficiency import ATTENTION_KERNELS
    # the host's JPEG pipeline of a decode-cpu row: torch's DataLoader (worker processes
    # running torchvision on PIL) or DALI's CPU pipeline (--data-backend dali-cpu: C++ threads)
    from dlperf.hardware.track_record import HOST_DECODE as LOADERS
    from dlperf.models.float8 import RECIPES as FLOAT8_RECIPES
    from dlperf.models.fp8 import RECIPES as TE_RECIPES
    from dlperf.models.gpt import ROPE_FORMS
    from dlperf.models.loss_forms import LOSSES
    from dlperf.provenance import load_sibling

    vp = load_sibling(__file__, "validate_published")

    rows = vp.commented_csv(path)
    for row in rows:
        for key in INTS:
            row[key] = int(row[key])
        for key in FLOATS:
            row[key] = float(row[key]) if row.get(key) else None
        for key in OPTIONAL_INTS:
            row[key] = int(row[key]) if row.get(key) else None
        value = row["activation_checkpointing"]
        # every-N: every N-th block fully checkpointed (fms-fsdp, torchtitan's layer mode)
        every = value.removeprefix("every-")
        if value not in ("true", "false", "selective-op", "selective-attention") and not (
                value.startswith("every-") and every.isdigit() and int(every) >= 1):
            raise SystemExit(f"{path}: {row['id']}: activation_checkpointing must be true, "
                             f"false, selective-op, selective-attention or every-N, not "
                             f"{value!r}")
        row["activation_checkpointing"] = value != "false"
        row["checkpoint_policy"] = value if value.startswith("selective") else "full"
        row["checkpoint_every"] = int(every) if value.startswith("every-") else 1
        # FSDP's reduce_dtype (optional column; blank: the gradients' own dtype)
        row["reduce_dtype"] = row.get("reduce_dtype") or None
        # the fused attention kernel (optional column; blank: flash2, PyTorch's SDPA)
        row["attention_kernel"] = row.get("attention_kernel") or None
        if row["attention_kernel"] not in (None, *ATTENTION_KERNELS):
            raise SystemExit(f"{path}: {row['id']}: attention_kernel must be one of "
                             f"{', '.join(ATTENTION_KERNELS)} or blank (flash2)")
        # how the run computed its loss (optional column; blank: the preset's, else fp32)
        row["loss"] = row.get("loss") or None
        if row["loss"] not in (None, *LOSSES):
            raise SystemExit(f"{path}: {row['id']}: loss must be one of {', '.join(LOSSES)} "
                             "or blank (the preset's, else fp32)")
        if (row["train_metrics"] or 0) < 0:
            raise SystemExit(f"{path}: {row['id']}: train_metrics must be 0 or more, or blank "
                             "(the preset's, else 0)")
        # whose rotary-embedding kernels (optional column; blank: the preset's, complex)
        row["rope"] = row.get("rope") or None
        if row["rope"] not in (None, *ROPE_FORMS):
            raise SystemExit(f"{path}: {row['id']}: rope must be one of "
                             f"{', '.join(ROPE_FORMS)} or blank (complex)")
        # optional columns (blank: eager PyTorch, no graphs, DDP's overlap, no batch-norm groups)
        row["fusion"] = row.get("fusion") or "none"
        if row["fusion"] not in FUSIONS:
            raise SystemExit(f"{path}: {row['id']}: fusion must be one of {', '.join(FUSIONS)}")
        for key, default in (("cuda_graphs", False), ("overlap", True),
                             ("broadcast_buffers", True)):
            try:
                row[key] = vp.csv_bool(row.get(key), default)
            except ValueError:
                raise SystemExit(f"{path}: {row['id']}: {key} must be true, false or blank "
                                 f"(blank: {str(default).lower()})") from None
        row["bn_group"] = int(row.get("bn_group") or 1)
        # torch.optim's implementation where the run's software is known (blank: fused)
        row["optimizer_impl"] = row.get("optimizer_impl") or "fused"
        if row["optimizer_impl"] not in OPTIMIZER_IMPLS:
            raise SystemExit(f"{path}: {row['id']}: optimizer_impl must be one of "
                             f"{', '.join(OPTIMIZER_IMPLS)} or blank (fused)")
        # NCCL_ALGO / NCCL_PROTO of the run, when its NCCL lacked some (blank: all of today's)
        for key in ("nccl_algo", "nccl_proto"):
            row[key] = row.get(key) or None
        # MXNet's device kvstore where the run reduced with it (blank: NCCL)
        row["kvstore"] = row.get("kvstore") or None
        if row["kvstore"] not in (None, *KVSTORES):
            raise SystemExit(f"{path}: {row['id']}: kvstore must be one of "
                             f"{', '.join(KVSTORES)} or blank (NCCL)")
        # torchao's float8 layers (blank: none) and FSDP's float8 all-gather of their weights
        # (or TransformerEngine's te.Linear layers: delayed or current scaling, models/fp8.py)
        row["fp8"] = row.get("fp8") or None
        if row["fp8"] not in (None, *FLOAT8_RECIPES, *TE_RECIPES):
            raise SystemExit(f"{path}: {row['id']}: fp8 must be one of "
                             f"{', '.join(FLOAT8_RECIPES + TE_RECIPES)} or blank")
        try:
            row["fp8_all_gather"] = vp.csv_bool(row.get("fp8_all_gather"), False)
        except ValueError:
            raise SystemExit(f"{path}: {row['id']}: fp8_all_gather must be true, false or "
                             "blank (false)") from None
        if row["fp8_all_gather"] and (row["fp8"] is None
                                      or row["strategy"] not in ("fsdp", "hsdp")):
            raise SystemExit(f"{path}: {row['id']}: fp8_all_gather needs fp8 and an FSDP "
                             "strategy")
        # whose pipeline decoded on the host (optional column; blank with decode cpu: torch's
        # DataLoader, Python worker processes; dali-cpu: DALI's CPU pipeline, C++ threads)
        row["loader"] = row.get("loader") or ("torch" if row["decode"] == "cpu" else None)
        if row["loader"] not in (None, *LOADERS) or (row["loader"] and row["decode"] != "cpu"):
            raise SystemExit(f"{path}: {row['id']}: loader must be one of {', '.join(LOADERS)} "
                             "with decode cpu, or blank (torch's DataLoader with decode cpu)")
    return rows


def capture(rows: list[dict]) -> list[tuple]:
    """(row, config, costs, uncounted, seconds, gradient params) per row: the expensive half,
    done once (validate_published.capture_rows shares captures between rows)."""
    from dlperf.provenance import load_sibling

    vp = load_sibling(__file__, "validate_published")
    from dlperf.analysis.gemm import state_element_bytes
    from dlperf.analysis.scaling import module_buffers
    from dlperf.models.float8 import float8_parameters
    from dlperf.models.gpt import PRESETS, gpt_config
    from dlperf.models.registry import build_model

    single = [{**r, "optimizer": r.get("optimizer") or "sgd",
               "measured_img_s": r["measured_per_gpu"]} for r in rows]
    footprints: list = []  # each row's one-GPU memory footprint, filled by capture_rows
    captured = vp.capture_rows(single, footprints=footprints)
    out = []
    for row, (_, cfg, costs, uncounted, seconds), footprint in zip(rows, captured,
                                                                   footprints):
        gpt = (gpt_config(row["model"], seq_len=row["image_size"], rope=row["rope"],
                          fp8=row["fp8"], fp8_all_gather=row["fp8_all_gather"] or None,
                          tp_impl=vp.te_tp_impl(row["fp8"]))
               if row["model"] in PRESETS else None)
        model, _ = build_model(row["model"], gpt=gpt)
        grad_bytes = state_element_bytes(cfg.precision)
        params = [(n, p.numel() * grad_bytes) for n, p in model.named_parameters()]
        # the weights FSDP gathers in FP8 (torchao's float8 all-gather; a set) and the
        # one-GPU footprint scale_out shards (both left out of the results)
        row["fp8_gathered"] = float8_parameters(model)
        row["footprint"] = footprint
        row["buffers"] = module_buffers(model)  # what DDP broadcasts before every forward
        out.append((row, cfg, costs, uncounted, seconds, params))
    return out


def score(captured: list[tuple], efficiency=None, step_cv: float | None = None,
          kvstore_op_s: float | None = None, sm_share: float | None = None,
          edits: dict | None = None) -> list[dict]:
    """Each row with dlperf's scale-out prediction (``efficiency``: default, the shipped one;
    ``step_cv``: the spread of one GPU's step, default scaling.STEP_CV; ``kvstore_op_s``: the
    device kvstore's cost per operation, default scaling.MXNET_KVSTORE_OP_S; ``sm_share``: the
    share of the SMs a collective holds, default none: scaling.contention_s; ``edits``: an
    experiment's edit of the efficiency model, validate_published.efficiency_edits)."""
    from dlperf.analysis.api import predict_on
    from dlperf.analysis.scaling import ScaleConfig, collective_sms, scale_out
    from dlperf.hardware.interconnect import get_interconnect
    from dlperf.provenance import load_sibling

    vp = load_sibling(__file__, "validate_published")
    out = []
    for row, cfg, costs, uncounted, seconds, params in captured:
        spec = vp.edited_spec(row["device"], edits)
        analysis = predict_on(costs, uncounted, cfg, spec, seconds,
                              efficiency=efficiency or vp.edited_efficiency(spec, cfg, edits),
                              memory=row.get("footprint"))
        node, network = (get_interconnect(n.strip()) for n in row["interconnect"].split(","))
        scale = ScaleConfig(gpus=row["gpus"], gpus_per_node=row["gpus_per_node"],
                            strategy=row["strategy"], grad_accum=row["grad_accum"],
                            decode=row["decode"], data_cores_per_gpu=row["data_cores_per_gpu"],
                            decode_img_per_s_per_core=row["decode_img_s_per_core"],
                            loader_workers_per_gpu=row["loader_workers_per_gpu"],
                            overlap=row["overlap"],
                            bn_group=row["bn_group"], step_cv=step_cv,
                            nccl_algo=row["nccl_algo"], nccl_proto=row["nccl_proto"],
                            kvstore=row["kvstore"], reduce_dtype=row["reduce_dtype"],
                            kvstore_op_s=kvstore_op_s if row["kvstore"] else None,
                            fp8_gathered=row.get("fp8_gathered", frozenset()),
                            buffers=row.get("buffers", ()),
                            broadcast_buffers=row["broadcast_buffers"],
                            collective_sms=(0 if sm_share is None else
                                            collective_sms(analysis.device, sm_share)))
        r = scale_out(analysis, params, scale, node, network)
        # token models: the table gives tokens/s per GPU
        per_sample = row["image_size"] if cfg.tokens else 1
        predicted = r["per_gpu_samples_per_s"] * per_sample
        measured_eff = (row["measured_per_gpu"] / row["measured_single"]
                        if row["measured_single"] else None)
        step_samples = row["batch"] * row["grad_accum"] * per_sample
        out.append({**{k: v for k, v in row.items()
                       if k not in ("fp8_gathered", "footprint", "buffers")},
                    "predicted_per_gpu": predicted,
                    "per_gpu_ratio": predicted / row["measured_per_gpu"],
                    "predicted_efficiency": r["scaling_efficiency"],
                    "measured_efficiency": measured_eff,
                    "efficiency_ratio": (r["scaling_efficiency"] / measured_eff
                                         if measured_eff else None),
                    "measured_added_ms": (added_ms(step_samples, row["measured_per_gpu"],
                                                   row["measured_single"])
                                          if measured_eff else None),
                    "predicted_added_ms": (added_ms(step_samples, predicted,
                                                    predicted / r["scaling_efficiency"])
                                           if measured_eff else None),
                    "limited_by": r["limited_by"], "exposed_comm_s": r["exposed_comm_s"],
                    # what each GPU holds, by kind, at rest and at the step's peak
                    # (liveness.with_peak; validate_memory.py)
                    "memory_per_gpu": r["memory_per_gpu"],
                    "straggler_s": r["straggler_s"], "step_s": r["step_s"],
                    "kvstore_ops": r["communication"].get("engine_ops"),
                    # the collectives the step runs, hidden or not (FSDP's on every
                    # micro-batch): their share of the step is what overlap must hide
                    "comm_s_per_step": r["communication"]["comm_s"]
                    * (row["grad_accum"] if row["strategy"] != "ddp" else 1)})
    return out


def added_ms(step_samples: float, rate: float, single_rate: float) -> float:
    """What going from one GPU to N adds to a step, in ms: a step of ``step_samples`` per GPU
    (samples or tokens) at the N-GPU ``rate`` per GPU against ``single_rate``. The scaling
    loss in the unit a trace shows it: a stack's fixed cost per step reads the same at every
    batch size, a percentage does not."""
    return 1e3 * step_samples * (1 / rate - 1 / single_rate)


def predict(rows: list[dict], edits: dict | None = None) -> list[dict]:
    return score(capture(rows), edits=edits)


# the columns that say what software a row ran, beside its model, batch and strategy: two rows
# of one source that differ in any of them are different runs, not one run at two scales
RUN_STACK = ("layout", "optimizer", "decode", "loader", "fusion", "cuda_graphs", "overlap",
             "bn_group", "optimizer_impl", "kvstore", "reduce_dtype", "rope", "attention_kernel",
             "fp8", "fp8_all_gather", "loss", "train_metrics")


def add_relative_scaling(rows: list[dict]) -> None:
    """Where a source published the same model on the same GPU at several GPU counts (same
    per-GPU batch, precision, strategy and checkpointing), the per-GPU throughput of each row
    relative to the smallest count, measured and predicted: the scale-out model's own error,
    free of the single-GPU prediction's (which cancels only where the two runs ran the same
    software: the same fusion, float8 recipe, loss and the rest of RUN_STACK, so a compiled
    row is compared with the compiled row on fewer GPUs, never with the eager one). Rows at
    the smallest count (two systems of one GPU model, e.g. a DGX-1 with 16 and with 32 GB) are
    not compared, and neither is a row flagged suspect (a measurement its own source's runs
    contradict): as a base it would skew every figure of its group. The system is part of
    the group (interconnect and GPUs per node): a DGX-2's 16 GPUs are compared with its own 4,
    not with a DGX-1's."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("flag", "").startswith("suspect"):
            r["relative_measured"] = r["relative_predicted"] = r["relative_ratio"] = None
            continue
        key = (r["source"], r["model"], r["device"], r.get("interconnect"),
               r.get("gpus_per_node"), r["image_size"], r["batch"], r["precision"],
               r["strategy"], r["activation_checkpointing"],
               r.get("checkpoint_policy"), r.get("checkpoint_every"),
               *(r.get(column) for column in RUN_STACK))
        groups.setdefault(key, []).append(r)
    for group in groups.values():
        base = min(group, key=lambda r: r["gpus"])
        for r in group:
            if r["gpus"] == base["gpus"]:  # the base, or another system at the same count
                r["relative_measured"] = r["relative_predicted"] = r["relative_ratio"] = None
                continue
            r["relative_base"] = base["id"]
            r["relative_measured"] = r["measured_per_gpu"] / base["measured_per_gpu"]
            r["relative_predicted"] = r["predicted_per_gpu"] / base["predicted_per_gpu"]
            r["relative_ratio"] = r["relative_predicted"] / r["relative_measured"]


COMPILED_SUFFIX = "-compile"
# a float8 row's id and its BF16 sibling's: torchao's (tensorwise, rowwise) compiled runs
# replace the sibling's "-compile"; TransformerEngine's (delayed, current) add "-fp8" to it
FLOAT8_SUFFIXES = (("-float8", COMPILED_SUFFIX), ("-rowwise", COMPILED_SUFFIX), ("-fp8", ""))


def compile_pairs(rows: list[dict]) -> list[dict]:
    """Each compiled row beside its eager sibling (the same id without "-compile", the source
    having run both): torch.compile's speed-up as published and as predicted, and their
    ratio, which leaves out what the two rows share (the GPU's shares, the network)."""
    return [{"compiled": r["id"], "eager": base["id"], "fusion": r["fusion"], **gain}
            for r, base, gain in _pairs(rows, COMPILED_SUFFIX, "")]


def float8_pairs(rows: list[dict]) -> list[dict]:
    """Each FP8 row beside its BF16 sibling (FLOAT8_SUFFIXES: the id with "-compile" for
    "-float8" or "-rowwise", torchao's; without "-fp8", TransformerEngine's): FP8's speed-up
    as published and as predicted, and their ratio."""
    return [{"float8": r["id"], "bf16": base["id"], "recipe": r["fp8"],
             "fp8_all_gather": r["fp8_all_gather"], **gain}
            for suffix, sibling in FLOAT8_SUFFIXES
            for r, base, gain in _pairs(rows, suffix, sibling)]


def _pairs(rows: list[dict], suffix: str, sibling: str) -> list[tuple]:
    """(row, its sibling, the speed-up measured and predicted and their ratio) for each row
    whose id ends in ``suffix`` and whose sibling (``suffix`` replaced by ``sibling``) the
    table holds."""
    by_id = {r["id"]: r for r in rows}
    out = []
    for r in rows:
        base = by_id.get(r["id"].removesuffix(suffix) + sibling)
        if not r["id"].endswith(suffix) or base is None:
            continue
        measured = r["measured_per_gpu"] / base["measured_per_gpu"]
        predicted = r["predicted_per_gpu"] / base["predicted_per_gpu"]
        out.append((r, base, {"measured_speedup": measured, "predicted_speedup": predicted,
                              "ratio": predicted / measured}))
    return out


def summarize(rows: list[dict]) -> dict:
    def stats(group, key):
        values = [r[key] for r in group if r.get(key) is not None]
        return ({"rows": len(values),
                 "median_abs_error": statistics.median(abs(v - 1) for v in values),
                 "median_ratio": statistics.median(values),
                 "max_abs_error": max(abs(v - 1) for v in values)} if values else None)

    def block(group):
        return {"per_gpu": stats(group, "per_gpu_ratio"),
                "efficiency": stats(group, "efficiency_ratio"),
                "relative_scaling": stats(group, "relative_ratio")}

    clean = [r for r in rows if r["flag"] == "clean"]
    out = {"all": block(rows), "clean": block(clean)}
    for strategy in sorted({r["strategy"] for r in rows}):
        for device in sorted({r["device"] for r in rows if r["strategy"] == strategy}):
            group = [r for r in rows if r["strategy"] == strategy and r["device"] == device]
            out[f"{strategy} {device}"] = block(group)
    return out


def reread(rows: list[dict], source: str | None, interconnects: list[str],
           settings: list[str]) -> list[dict]:
    """Another reading of a source's assumptions: its rows only (``source``), each
    interconnect preset OLD read as NEW (``interconnects``: "OLD=NEW"), and parsed columns set
    outright (``settings``: "COLUMN=VALUE", blank for None): e.g. a network a source states as
    one figure read per GPU instead of per node, or FSDP's reduce_dtype as fp32."""
    if source is not None:
        rows = [r for r in rows if r["source"] == source]
        if not rows:
            raise SystemExit(f"--source {source}: no row of the table has it")
    for pair in interconnects + settings:
        if "=" not in pair:
            raise SystemExit(f"{pair!r}: give OLD=NEW (--interconnect) or COLUMN=VALUE (--set)")
    swaps = dict(p.split("=", 1) for p in interconnects)
    for r in rows:
        if swaps:
            r["interconnect"] = ",".join(swaps.get(n.strip(), n.strip())
                                         for n in r["interconnect"].split(","))
    from dlperf.provenance import load_sibling

    return load_sibling(__file__, "validate_published").set_columns(
        rows, dict(p.split("=", 1) for p in settings))


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table", nargs="?", type=Path, default=DEFAULT_CSV)
    parser.add_argument("out", nargs="?", type=Path, default=None)
    parser.add_argument("--source", help="score this source's rows only")
    parser.add_argument("--interconnect", action="append", default=[], metavar="OLD=NEW",
                        help="read every OLD interconnect preset as NEW (repeatable)")
    parser.add_argument("--set", action="append", default=[], metavar="COLUMN=VALUE",
                        help="set a column of every row (blank VALUE: none; repeatable)")
    parser.add_argument("--fitted", action="append", default=[], metavar="NAME=VALUE",
                        help="replace a shared parameter of efficiency.FITTED (presets' own "
                             "entries still win; repeatable)")
    parser.add_argument("--efficiency", action="append", default=[],
                        metavar="[DEVICE:]NAME=VALUE",
                        help="set a parameter over a preset's own entries, as `dlperf analyze "
                             "--efficiency` (every preset's without DEVICE:; repeatable)")
    args = parser.parse_args(argv)
    csv_path = args.table
    from dlperf.provenance import load_sibling

    edits = load_sibling(__file__, "validate_published").efficiency_edits(args.fitted,
                                                                          args.efficiency)
    reading = args.source or args.interconnect or args.set or edits
    if args.out is None and reading:
        raise SystemExit("another reading of the table needs its own OUT.json (the default "
                         "is the whole table's results)")
    out_path = args.out or DEFAULT_OUT
    rows = predict(reread(read_rows(csv_path), args.source, args.interconnect, args.set),
                   edits)
    add_relative_scaling(rows)
    print(f"{'id':26s} {'GPUs':>5s} {'meas/GPU':>9s} {'pred/GPU':>9s} {'ratio':>6s} "
          f"{'meas eff':>8s} {'pred eff':>8s}  limit / flag")
    for r in rows:
        meas_eff = f"{r['measured_efficiency']:.1%}" if r["measured_efficiency"] else "-"
        print(f"{r['id']:26s} {r['gpus']:5d} {r['measured_per_gpu']:9,.0f} "
              f"{r['predicted_per_gpu']:9,.0f} {r['per_gpu_ratio']:6.2f} {meas_eff:>8s} "
              f"{r['predicted_efficiency']:8.1%}  {r['limited_by']} / {r['flag']}")
    summary = summarize(rows)
    for name, block in summary.items():
        parts = [f"{key} {v['rows']} rows: median |error| {v['median_abs_error']:.1%} "
                 f"(pred/meas {v['median_ratio']:.2f}), worst {v['max_abs_error']:.1%}"
                 for key, v in block.items() if v]
        print(f"{name:22s} " + "; ".join(parts))
    pairs = compile_pairs(rows)
    if pairs:
        print("torch.compile's speed-up, published and predicted (compiled / eager per GPU):")
    for p in pairs:
        print(f"  {p['compiled']:34s} {p['fusion']:15s} measured {p['measured_speedup']:.3f}"
              f"  predicted {p['predicted_speedup']:.3f}  ratio {p['ratio']:.3f}")
    fp8_pairs = float8_pairs(rows)
    if fp8_pairs:
        print("FP8's speed-up, published and predicted (FP8 / BF16 per GPU, the same run "
              "otherwise: torchao's rows compiled, TransformerEngine's as they ran):")
    for p in fp8_pairs:
        print(f"  {p['float8']:34s} {p['recipe']:10s} measured {p['measured_speedup']:.3f}"
              f"  predicted {p['predicted_speedup']:.3f}  ratio {p['ratio']:.3f}")
    from dlperf.provenance import save_result

    save_result(out_path, "validation-scaling",
                {"csv": str(csv_path.relative_to(ROOT) if csv_path.is_relative_to(ROOT)
                            else csv_path), "source": args.source,
                 "interconnect": args.interconnect, "set": args.set,
                 "efficiency_edits": edits},
                {"rows": rows, "summary": summary, "compile_pairs": pairs,
                 "float8_pairs": fp8_pairs})
    from dlperf.plots import predicted_vs_measured

    picture = predicted_vs_measured(
        out_path.with_suffix(".png"),
        [(f"{r['strategy']} {r['device']}", r["measured_per_gpu"], r["predicted_per_gpu"],
          r["flag"] == "clean") for r in rows],
        "measured per GPU (published: img/s, or tokens/s for decoders)",
        "dlperf predicted per GPU (datasheet)",
        "dlperf vs published multi-GPU training (dotted: +-15%)")
    print(f"Wrote {out_path}" + (f" and {picture}" if picture else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
