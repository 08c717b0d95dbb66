"""What published measurements say about dlperf's predictions on each GPU preset (issue #11).

A prediction is only as good as its record on the hardware it is made for. dlperf is checked
against published training throughputs (benchmarks/validation/*.csv, scored by
benchmarks/validate_published.py and validate_scaling.py into benchmarks/results/); this module
condenses those saved results per device, and per class of workload, into
``track_record.json`` next to it (written by ``python benchmarks/track_record.py``), so every
prediction on a preset is printed with how far dlperf's predictions on that GPU have landed
from measurements: a user sees "RTX A6000: 6 runs, 0.83-1.15x, median 1.10x" beside the number,
not only in a README. The numbers are never typed in by hand: a test rebuilds the file from the
saved results and compares.

A ratio is predicted / measured throughput (above 1: dlperf said faster than measured).
"""

from __future__ import annotations

import json
import statistics
from functools import cache
from pathlib import Path

PATH = Path(__file__).with_name("track_record.json")
# the scale-out part (``build_scale_out``), written beside it by the same script
SCALE_OUT_PATH = Path(__file__).with_name("scale_out_record.json")
# |median - 1| above this: the record is shown as a warning, not as a plain note
SYSTEMATIC = 0.08

# source id prefix -> publisher, as the record names them
PUBLISHERS = (("dle-", "NVIDIA DeepLearningExamples"), ("nvidia-", "NVIDIA"),
              ("lambda", "Lambda"), ("timm-", "timm"), ("skb-", "skb"),
              ("llm-foundry", "MosaicML llm-foundry"), ("torchtitan-", "PyTorch torchtitan"),
              ("mlperf-", "MLCommons MLPerf"))

CLASS_NAMES = {"cnn-amp": "CNNs in mixed precision", "cnn-fp32-tf32": "CNNs in FP32/TF32",
               "transformer-amp": "transformers in half precision",
               "transformer-fp32-tf32": "transformers in FP32/TF32",
               "decoder": "decoder LLMs (FSDP, per GPU)"}


def publisher(source: str) -> str:
    return next((name for prefix, name in PUBLISHERS if source.startswith(prefix)), source)


def _summary(ratios: list[float], sources: set[str]) -> dict:
    return {"rows": len(ratios), "median": round(statistics.median(ratios), 3),
            "low": round(min(ratios), 3), "high": round(max(ratios), 3),
            "publishers": sorted({publisher(s) for s in sources})}


def build(published: list[dict], scaling: list[dict]) -> dict:
    """The record per device from the rows of results/validation-published.json (single GPU:
    ``ratio``) and results/validation-scaling.json (decoder LLM rows: ``per_gpu_ratio``); clean
    rows only. {device: {"all": summary, "classes": {class: summary}}}."""
    by_device: dict[str, dict[str, list[tuple[float, str]]]] = {}
    for r in published:
        if r.get("flag") == "clean":
            by_device.setdefault(r["device"], {}).setdefault(r["class"], []).append(
                (r["ratio"], r["source"]))
    for r in scaling:
        if r.get("flag") == "clean" and r["model"].startswith(("mpt-", "gpt")):
            by_device.setdefault(r["device"], {}).setdefault("decoder", []).append(
                (r["per_gpu_ratio"], r["source"]))
    out = {}
    for device, classes in sorted(by_device.items()):
        single = [x for cls, xs in classes.items() if cls != "decoder" for x in xs]
        entry = {"classes": {cls: _summary([x for x, _ in xs], {s for _, s in xs})
                             for cls, xs in sorted(classes.items())}}
        if single:
            entry["all"] = _summary([x for x, _ in single], {s for _, s in single})
        out[device] = entry
    return out


@cache
def load() -> dict:
    try:
        return json.loads(PATH.read_text())
    except FileNotFoundError:
        return {}


def workload_class(config) -> str:
    """The class of published rows an analysis belongs to (AnalysisConfig)."""
    if config.model.startswith(("gpt", "mpt-")):
        return "decoder"
    kind = "transformer" if config.tokens or "vit" in config.model or "swin" in config.model \
        else "cnn"
    return f"{kind}-{'amp' if config.dtype in ('fp16', 'bf16') else 'fp32-tf32'}"


def _phrase(s: dict) -> str:
    runs = "run" if s["rows"] == 1 else "runs"
    spread = (f"{s['low']:.2f}x" if s["low"] == s["high"]
              else f"{s['low']:.2f}-{s['high']:.2f}x, median {s['median']:.2f}x")
    return f"{s['rows']} published {runs} ({', '.join(s['publishers'])}) predicted at {spread}"


def describe(spec, config, record: dict | None = None) -> tuple[str, bool] | None:
    """One line on dlperf's record on ``spec`` for this kind of workload, and whether it is
    systematic enough to warn about; None for measured profiles (``dlperf probe``: they are
    this machine, not a preset)."""
    if spec.measured:
        return None
    entry = (load() if record is None else record).get(spec.name)
    if not entry:
        text = (f"No published training run on {spec.display_name} is in dlperf's per-GPU "
                "record yet: read this prediction as the datasheet's, unvalidated.")
        return (text + (f" {spec.caveat}" if spec.caveat else ""), bool(spec.caveat))
    cls = workload_class(config)
    parts, warn = [], False
    if "all" in entry:
        parts.append(f"{_phrase(entry['all'])} the measured rate")
        warn = abs(entry["all"]["median"] - 1) > SYSTEMATIC
    if cls in entry["classes"]:
        s = entry["classes"][cls]
        parts.append(f"{CLASS_NAMES[cls]}: {s['rows']} "
                     f"{'run' if s['rows'] == 1 else 'runs'}, median {s['median']:.2f}x")
        warn = warn or (s["rows"] >= 3 and abs(s["median"] - 1) > SYSTEMATIC)
    text = f"Track record on {spec.display_name}: " + "; ".join(parts) + "."
    if spec.caveat:
        text += f" {spec.caveat}"
    fp8 = getattr(config, "fp8", None)
    from dlperf.models.float8 import RECIPES as FLOAT8_RECIPES  # (torchao's: torch-side)

    line = ((describe_float8(recipe=fp8) if fp8 in FLOAT8_RECIPES else describe_fp8())
            if fp8 else None)
    if line:
        text += f" {line}"
    kernels = describe_kernels(spec, config)
    if kernels:
        text, warn = f"{text} {kernels}", True
    return text, warn


# the record a prediction fed by the host's JPEG decode is read through, by the pipeline that
# decoded (`analyze --loader`; the scaling table's loader column)
HOST_DECODE = {"torch": "host_decode", "dali-cpu": "host_decode_dali"}


def build_scale_out(scaling: list[dict]) -> dict:
    """dlperf's record on published multi-GPU runs (results/validation-scaling.json rows), for
    the scale-out report (issue #14). A ratio is dlperf's scaling over the measured one:

    * ``one_node``: scaling efficiency against the same system's one-GPU rate, on clean rows
      whose GPUs all sit in one node (what the communication model and the host side decide
      there), and the measured efficiencies' range; ``by_device``: the same per GPU preset;
    * ``across_nodes``: the per-GPU rate at N GPUs over the same run's at the source's smallest
      published scale (relative scaling; ``base_gpus_low``, ``base_gpus_high`` and
      ``base_one_node``, how many of those bases are one node) on rows spanning nodes,
      whatever their flag, as long as their step is predicted compute-bound: the flags of those rows (a network the source does not name, an HBM2e
      H100, an assumed decode rate) bear on the absolute rate, not on what is lost from one
      node to many, which is what the ratio measures. ``flags`` lists them;
    * ``host_decode``: as ``one_node``, on the runs whose JPEGs the host's CPU decoded
      (``decode`` cpu) through torch's DataLoader (``loader`` torch; rows saved before the
      column count as such), whatever their flag (every such row assumes a per-core rate no
      source publishes): the record a prediction with ``--decode cpu`` is read through, since
      these runs lose what the clean ones (synthetic data, DALI's GPU pipeline) do not;
      ``host_decode_dali``: the same for DALI's CPU pipeline (``loader`` dali-cpu: C++
      threads, no worker processes), which lost far less on the same systems (NVIDIA's 20.06
      ConvNets tables): ``--decode cpu --loader dali-cpu`` reads through it."""
    one: list[tuple[float, float, str]] = []
    by_device: dict[str, list[tuple[float, float, str]]] = {}
    host: dict[str, list[tuple[float, float, str]]] = {loader: [] for loader in HOST_DECODE}
    across: list[tuple[float, int, str]] = []
    bases: list[tuple[int, bool]] = []  # (GPUs, one node) of each across-node row's base
    base_of = {r["id"]: (r["gpus"], r["gpus"] <= r["gpus_per_node"]) for r in scaling
               if "id" in r}
    flags: set[str] = set()
    for r in scaling:
        nodes = -(-r["gpus"] // r["gpus_per_node"])
        if nodes == 1 and r["gpus"] > 1 and r.get("efficiency_ratio") is not None:
            row = (r["efficiency_ratio"], r["measured_efficiency"], r["source"])
            if r.get("flag") == "clean":
                one.append(row)
                by_device.setdefault(r["device"], []).append(row)
            loader = r.get("loader", "torch")
            if r.get("decode") == "cpu" and loader in host:
                host[loader].append(row)
        if nodes > 1 and r.get("relative_ratio") is not None and r["limited_by"] == "compute":
            across.append((r["relative_ratio"], r["gpus"], r["source"]))
            bases.append(base_of.get(r.get("relative_base"), (8, True)))
            if r.get("flag") != "clean":
                flags.add(r["flag"].split(":")[0])

    def one_node(rows):
        return {**_summary([x for x, _, _ in rows], {s for _, _, s in rows}),
                **_quartiles([x for x, _, _ in rows]),
                "measured_low": round(min(m for _, m, _ in rows), 3),
                "measured_high": round(max(m for _, m, _ in rows), 3)}

    out: dict = {}
    if one:
        out["one_node"] = one_node(one)
        out["by_device"] = {d: one_node(rows) for d, rows in sorted(by_device.items())}
    for loader, rows in host.items():
        if rows:
            out[HOST_DECODE[loader]] = one_node(rows)
    if across:
        out["across_nodes"] = {**_summary([x for x, _, _ in across], {s for _, _, s in across}),
                               **_quartiles([x for x, _, _ in across]),
                               "gpus_low": min(g for _, g, _ in across),
                               "gpus_high": max(g for _, g, _ in across),
                               "base_gpus_low": min(g for g, _ in bases),
                               "base_gpus_high": max(g for g, _ in bases),
                               "base_one_node": sum(one for _, one in bases),
                               "flags": sorted(flags)}
    return out


def _quartiles(ratios: list[float]) -> dict:
    """The middle half of the ratios (first and third quartiles; the ratios themselves when
    there are fewer than four)."""
    if len(ratios) < 4:
        return {"q1": round(min(ratios), 3), "q3": round(max(ratios), 3)}
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return {"q1": round(q1, 3), "q3": round(q3, 3)}


# a GPU's own one-node record is used for its band from this many runs on (else all GPUs')
BAND_MIN_RUNS = 4


def efficiency_band(efficiency: float, nodes: int, device: str | None = None,
                    record: dict | None = None, host_decode: bool = False,
                    loader: str = "torch") -> tuple[float, float] | None:
    """A predicted scaling efficiency read through the record: where the middle half of the
    published runs' predicted/measured ratios would put it (one node: ``device``'s own
    one-node record when it has ``BAND_MIN_RUNS`` runs, else every GPU's; ``host_decode``:
    the runs fed by the host's JPEG decode through ``loader``'s pipeline instead, when there
    are that many; across nodes, that and the across-node record's quartiles multiplied: what
    was lost on one node, then from one node to many). None without a record."""
    record = load_scale_out() if record is None else record
    one = record.get("by_device", {}).get(device)
    host = record.get(HOST_DECODE[loader]) if host_decode else None
    if host and host["rows"] >= BAND_MIN_RUNS:
        one = host
    elif not one or one["rows"] < BAND_MIN_RUNS:
        one = record.get("one_node")
    if not one:
        return None
    low, high = efficiency / one["q3"], efficiency / one["q1"]
    across = record.get("across_nodes")
    if nodes > 1 and across:
        low, high = low / across["q3"], high / across["q1"]
    return low, high


@cache
def load_scale_out() -> dict:
    try:
        return json.loads(SCALE_OUT_PATH.read_text())
    except FileNotFoundError:
        return {}


def describe_scale_out(spec, record: dict | None = None, host_decode: bool = False,
                       loader: str = "torch") -> tuple[str, bool] | None:
    """One line on dlperf's record on published multi-GPU runs, with this GPU's own where it
    has one (and, for ``host_decode``, the runs whose host decoded the JPEGs through
    ``loader``'s pipeline), and whether it is systematic enough to warn about (median off by
    more than ``SYSTEMATIC``); None for a measured profile or when no run has been checked."""
    record = load_scale_out() if record is None else record
    if spec.measured or not record:
        return None
    parts, warn = [], False
    if "one_node" in record:
        s = record["one_node"]
        part = (f"on one node, {s['rows']} published runs ({', '.join(s['publishers'])}) "
                f"measured {s['measured_low']:.1%}-{s['measured_high']:.1%} of their one-GPU "
                f"rate, and dlperf's efficiency was {s['low']:.2f}-{s['high']:.2f}x theirs, "
                f"median {s['median']:.2f}x")
        mine = record.get("by_device", {}).get(spec.name)
        if mine:
            part += (f" ({spec.display_name}: {mine['rows']} "
                     f"{'run' if mine['rows'] == 1 else 'runs'}, median {mine['median']:.2f}x)")
            warn = abs(mine["median"] - 1) > SYSTEMATIC
        parts.append(part)
    if "across_nodes" in record:
        s = record["across_nodes"]
        # (a record saved before the bases were: every run against its rate on 8)
        base_low, base_high = s.get("base_gpus_low", 8), s.get("base_gpus_high", 8)
        base = (f"{base_low:,}" if base_low == base_high else
                f"{base_low:,}-{base_high:,} GPUs (one node for "
                f"{s.get('base_one_node', s['rows'])} of them)")
        parts.append(f"across nodes, {s['rows']} runs of {s['gpus_low']:,}-{s['gpus_high']:,} "
                     f"GPUs against their rate on {base}: {s['low']:.2f}-{s['high']:.2f}x, median "
                     f"{s['median']:.2f}x (dlperf models the communication and the wait "
                     f"for the slowest GPU, not what these runs lost beyond them)")
        warn = warn or abs(s["median"] - 1) > SYSTEMATIC
    if host_decode and HOST_DECODE[loader] in record:
        s = record[HOST_DECODE[loader]]
        pipeline = " in DALI's CPU pipeline" if loader == "dali-cpu" else ""
        parts.append(f"with the host's CPU decoding the JPEGs{pipeline}, as here, "
                     f"{s['rows']} runs ({', '.join(s['publishers'])}) measured "
                     f"{s['measured_low']:.1%}-"
                     f"{s['measured_high']:.1%} of one GPU and dlperf's efficiency was "
                     f"{s['low']:.2f}-{s['high']:.2f}x theirs, median {s['median']:.2f}x "
                     "(each with a per-core decode rate assumed, not published)")
        warn = warn or abs(s["median"] - 1) > SYSTEMATIC
    return "Track record, scale-out: " + "; ".join(parts) + ".", warn


def build_tensor_parallel(result: dict, megatron: dict | None = None,
                          megatron2022: dict | None = None, narayanan: dict | None = None,
                          megatron_core: dict | None = None, llama3: dict | None = None,
                          async_tp: dict | None = None, deepspeed: dict | None = None) -> dict:
    """The scale-out record's tensor-parallel entry from ``benchmarks/validate_tp.py``'s saved
    results (their "results"): KempnerForge's, each TP run's rate per GPU over the FSDP run on
    as many GPUs, measured and predicted, as the losses TP costs; ``megatron``'s (2020), each
    TP=N run's model FLOP/s per GPU over the TP=1 run's of the same system, predicted over
    measured; ``megatron2022``'s, the paper's sequence parallelism with selective recompute
    over full recompute, measured and predicted; and the pipelined runs of it and of
    ``narayanan`` (2021), dlperf's rate over the measured one; ``megatron_core``'s (2024),
    each run's predicted teraFLOP/s per GPU over the measured in the reading its file holds
    consistent (its "consistent" rows); ``llama3``'s (Llama 3 405B, 2024), in the stack
    reading of Megatron-Core's (--tp-impl te) with micro-batches of one sequence: the 8K rows'
    rate, their fall from 8,192 to 16,384 GPUs, and the context-parallel row's rate under
    both FLOP counts (and under the eager reading); ``async_tp``'s (torchtitan, 2025), PyTorch's
    async tensor parallelism over the vanilla form on the same runs, measured and predicted;
    ``deepspeed``'s (Megatron-DeepSpeed's BLOOM-176B and MT-NLG 530B), dlperf's rate over the
    measured one as DeepSpeed's BF16_Optimizer runs them (--deepspeed-bf16) and as
    Megatron-LM's own stack would."""
    pairs = result["tp_over_fsdp"]
    measured = [1 - p["measured"] for p in pairs]
    predicted = [1 - p["predicted"] for p in pairs]
    entry = {"runs": len(pairs), "source": "KempnerForge's Llama 3 8B on H200s, TP 2 and 4 "
                                           "inside 4-GPU nodes, torch.compile, 2026",
             "measured_loss_low": min(measured), "measured_loss_high": max(measured),
             "predicted_loss_low": min(predicted), "predicted_loss_high": max(predicted),
             "ratio_high": max(p["ratio"] for p in pairs)}
    if megatron is not None:
        ratios = [p["ratio"] for p in megatron["tp_over_tp1"]]
        entry["megatron"] = {
            "runs": len(ratios), "ratio_low": min(ratios), "ratio_high": max(ratios),
            "source": "Megatron-LM's GPT, 1B-8B on TP 1-8 inside DGX-2 and DGX A100 nodes, "
                      "alone and 128 replicas data parallel, no sequence parallelism, 2020"}
    # every pipelined run's predicted rate over its measured one (both files' "ratio")
    piped = [r["ratio"] for r in (megatron2022 or {}).get("iterations", []) if r["pp"] > 1]
    piped += [r["ratio"] for r in (narayanan or {}).get("rows", [])]
    if megatron2022 is not None:
        speedups = megatron2022["speedups"]
        entry["megatron_2022"] = {
            "measured_low": min(x["measured"] for x in speedups),
            "measured_high": max(x["measured"] for x in speedups),
            "predicted_low": min(x["predicted"] for x in speedups),
            "predicted_high": max(x["predicted"] for x in speedups),
            "source": "Megatron-LM's 22B-1T GPTs on TP=8, up to 64 pipeline stages (2022)"}
    if megatron_core is not None:
        ratios = sorted(r["ratio"] for r in megatron_core["consistent"])
        gpus = [r["gpus"] for r in megatron_core["consistent"]]
        entry["megatron_core"] = {
            "runs": len(ratios), "ratio_low": ratios[0], "ratio_high": ratios[-1],
            "median": statistics.median(ratios),
            "gpus_low": min(gpus), "gpus_high": max(gpus),
            "source": "Megatron-Core's 1.7B-462B GPTs on H100s (2024)"}
    if llama3 is not None:
        entry["llama3"] = _llama3_entry(llama3)
    if async_tp is not None:
        def span(gains: list[dict]) -> dict:
            return {"runs": len(gains),
                    "measured_low": min(g["measured"] for g in gains),
                    "measured_high": max(g["measured"] for g in gains),
                    "predicted_low": min(g["predicted"] for g in gains),
                    "predicted_high": max(g["predicted"] for g in gains)}

        gains = async_tp["async_over_vanilla"]
        entry["async"] = {
            **span([g for g in gains if g.get("fp8") is None]),
            "source": "torchtitan's Llama 3.1 8B and 70B on 64-256 H100s, FSDP x TP 8 (2025)"}
        # the same runs with torchao's float8 layers: async's gain, and dlperf's rates over
        # the measured ones, by recipe (the BF16 rows' beside them)
        rows = async_tp.get("rows", [])
        for recipe in [r for r in ("tensorwise", "rowwise")
                       if any(g.get("fp8") == r for g in gains)]:
            rates = [r["ratio"] for r in rows if r.get("fp8") == recipe]
            entry["async"].setdefault("float8", {})[recipe] = {
                **span([g for g in gains if g.get("fp8") == recipe]),
                "rate_low": min(rates), "rate_high": max(rates)}
        bf16 = [r["ratio"] for r in rows if r.get("fp8") is None]
        if bf16:
            entry["async"].update(rate_low=min(bf16), rate_high=max(bf16))
    if deepspeed is not None:
        rows = deepspeed["rows"]
        ours = [r for r in rows if r["reading"] == "deepspeed-bf16"]
        other = [r["ratio"] for r in rows if r["reading"] != "deepspeed-bf16"]
        entry["megatron_deepspeed"] = {
            "runs": len(ours), "rate_low": min(r["ratio"] for r in ours),
            "rate_high": max(r["ratio"] for r in ours),
            "without_low": min(other), "without_high": max(other),
            "gpus_low": min(r["gpus"] for r in ours), "gpus_high": max(r["gpus"] for r in ours),
            "source": "Megatron-DeepSpeed's BLOOM-176B and MT-NLG 530B on A100s (2021-22)"}
    entry["sources"] = 1 + sum(x is not None for x in (megatron, megatron2022, narayanan,
                                                       megatron_core, llama3, async_tp,
                                                       deepspeed))
    if piped:
        gpus = [r["gpus"] for r in (megatron2022 or {}).get("iterations", []) if r["pp"] > 1]
        gpus += [r["gpus"] for r in (narayanan or {}).get("rows", [])]
        entry["pipelined"] = {"runs": len(piped), "rate_low": min(piped),
                              "rate_high": max(piped), "gpus_low": min(gpus),
                              "gpus_high": max(gpus)}
    return entry


def _llama3_entry(result: dict) -> dict:
    """``build_tensor_parallel``'s Llama 3 entry from validate_tp.py's tp-llama3-405b.json."""
    def rows(stack: str, cp: bool) -> list[dict]:
        return [r for r in result["rows"] if r["stack"] == stack and r["micro_batch"] == 1
                and (r["cp"] > 1) == cp]

    eight = rows("overlapped", False)
    first = next(r for r in eight if r["gpus"] == min(x["gpus"] for x in eight))
    fall = [x for x in result["relative"] if x["stack"] == "overlapped"
            and x["micro_batch"] == 1 and x["count"] == "causal" and "over 8,192" in x["measure"]]
    (cp,) = rows("overlapped", True)
    eager = rows("eager", True)
    return {"source": "Llama 3 405B's pre-training on 8,192-16,384 H100s (2024)",
            "rate_low": min(r["ratio_causal"] for r in eight),
            "rate_high": max(r["ratio_full"] for r in eight),
            "fall_measured": fall[0]["measured"], "fall_predicted": fall[0]["predicted"],
            "cp_causal": cp["ratio_causal"], "cp_full": cp["ratio_full"],
            "cp_seq": cp["seq"], "cp": cp["cp"], "cp_gpus": cp["gpus"],
            "cp_eager_low": min(r["ratio_causal"] for r in eager),
            "cp_eager_high": max(r["ratio_full"] for r in eager),
            # the 8K run's memory a GPU (it ran in 80 GB without recompute) and the part of it
            # that is the stage's whole FP32 gradients
            "memory_bytes": first["memory_per_gpu_bytes"],
            "gradient_bytes": first["gradient_bytes_per_gpu"]}


def _megatron_2022(m: dict) -> str:
    """describe_tensor_parallel's sentence on Korthikanti et al.'s runs."""
    def span(lo: float, hi: float) -> str:
        return f"{lo:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}x"

    return (f"On {m['source']} (run as --tp-impl megatron --fusion megatron), sequence "
            "parallelism with selective recompute ran "
            f"{span(m['measured_low'], m['measured_high'])} as fast as full recompute without "
            f"it, and dlperf predicts {span(m['predicted_low'], m['predicted_high'])}. ")


def _pipelined(p: dict) -> str:
    """describe_tensor_parallel's sentence on the pipelined runs (--pp)."""
    return (f"{p['runs']} pipelined Megatron-LM runs (--pp; {p['gpus_low']:,}-"
            f"{p['gpus_high']:,} GPUs) ran at {1 / p['rate_high']:.2f}-{1 / p['rate_low']:.2f}x "
            "dlperf's rate. ")


def _deepspeed(m: dict) -> str:
    """describe_tensor_parallel's sentence on Megatron-DeepSpeed's runs."""
    return (f"On {m['source']} ({m['runs']} runs, {m['gpus_low']:,}-{m['gpus_high']:,} GPUs; "
            f"run as --deepspeed-bf16), dlperf predicted {m['rate_low']:.2f}-"
            f"{m['rate_high']:.2f}x the measured rate ({m['without_low']:.2f}-"
            f"{m['without_high']:.2f}x read as Megatron-LM's own stack, without DeepSpeed's "
            "FP32 accumulation after every micro-batch). ")


def _megatron_core(m: dict) -> str:
    """describe_tensor_parallel's sentence on Megatron-Core's 2024 runs."""
    return (f"On {m['source']} ({m['runs']} runs, {m['gpus_low']:,}-{m['gpus_high']:,} GPUs; "
            "run as --tp-impl te --distributed-optimizer, interleaved pipelines with "
            f"--pp-overlap-p2p), dlperf predicted {m['ratio_low']:.2f}-{m['ratio_high']:.2f}x "
            f"the measured rate (median {m['median']:.2f}x). ")


def _llama3(m: dict) -> str:
    """describe_tensor_parallel's sentence on Llama 3 405B's runs."""
    return (f"On {m['source']} (TP 8 x PP 16, run as --tp-impl te with micro-batches of one "
            f"sequence), dlperf predicted {m['rate_low']:.2f}-{m['rate_high']:.2f}x the 8K "
            f"rows' rate and a fall to {m['fall_predicted']:.3f} of it from 8,192 to 16,384 "
            f"GPUs where {m['fall_measured']:.3f} was measured"
            + (f"; it puts {m['memory_bytes'] / 2**30:.0f} GiB on each GPU of a run that fit "
               f"in 80 GB without recompute, {m['gradient_bytes'] / 2**30:.0f} GiB of it the "
               "stage's FP32 gradients held whole through the micro-batches (the paper "
               "accumulates them in FP32 and shards them, not saying when)"
               if "memory_bytes" in m else "") + ". ")


def _async(m: dict) -> str:
    """describe_tensor_parallel's sentences on PyTorch's async tensor parallelism, and on
    torchao's float8 layers under it where the record has them."""
    text = (f"On {m['source']}, async TP (--tp-impl torch-async) ran "
            f"{m['measured_low']:.2f}-{m['measured_high']:.2f}x as fast as vanilla TP where "
            f"dlperf predicts {m['predicted_low']:.2f}-{m['predicted_high']:.2f}x (it takes "
            "the fused collectives' overlap as perfect). ")
    float8 = m.get("float8", {})
    if not float8:
        return text
    gains = "; ".join(f"{recipe} {g['measured_low']:.2f}-{g['measured_high']:.2f}x, "
                      f"predicted {g['predicted_low']:.2f}-{g['predicted_high']:.2f}x"
                      for recipe, g in float8.items())
    rates = ", ".join(f"{recipe} {g['rate_low']:.2f}-{g['rate_high']:.2f}x"
                      for recipe, g in float8.items())
    return text + (f"With torchao's float8 layers (--fp8) on the same runs async TP gained "
                   f"{gains}; dlperf's rates with float8 are {rates} the measured ones"
                   + (f" (BF16: {m['rate_low']:.2f}-{m['rate_high']:.2f}x, on the 500 W "
                      "HBM2e H100s no preset models)" if "rate_low" in m else "")
                   + (", and the table itself calls its vanilla-TP rowwise rate low for a "
                      "reason being fixed (torchtitan#1207)" if "rowwise" in float8 else "")
                   + ". ")


# how the FP8 record names the GPUs of its rows
DEVICE_NAMES = {"h100-sxm": "H100s", "h200": "H200s", "b200": "B200s", "gb200": "GB200s",
                "b300": "B300s", "gb300": "GB300s"}
# and the sources of its TransformerEngine rows (validation/published_scaling.csv, fp8
# delayed or current: te.Linear layers outside Megatron-Core)
TE_SOURCES = {"llm-foundry-mpt-fp8": "MosaicML's runs with TransformerEngine 0.10's te.Linear "
                                     "layers (delayed scaling, Composer, 2023)"}


def build_fp8(result: dict, scaling: dict | None = None, mxfp8: dict | None = None) -> dict:
    """The scale-out record's entry on FP8 training (``analyze --fp8``), from validate_tp.py's
    tp-megatron-bridge-fp8.json: each published row's measured rate and dlperf's FP8
    prediction over it (cuDNN's attention as read for Megatron-Core), and the FP8 gain over
    BF16 dlperf predicts for the same configuration; with ``scaling`` (validate_scaling.py's
    results), its TransformerEngine rows (``fp8`` delayed or current: MosaicML's te.Linear
    runs) and their FP8 / BF16 pairs, measured and predicted; with ``mxfp8``
    (tp-megatron-bridge-mxfp8.json), the MXFP8 rows: measured, predicted over it, and the
    same layout's per-tensor prediction over it."""
    from dlperf.models.fp8 import RECIPES as TE_RECIPES

    te_rows = [r for r in (scaling or {}).get("rows", []) if r.get("fp8") in TE_RECIPES]
    te_pairs = [p for p in (scaling or {}).get("float8_pairs", [])
                if p.get("recipe") in TE_RECIPES]
    return {"source": "Megatron-Bridge's Llama 3 pre-training on DGX H100s, DGX B200s, GB200s "
                      "and GB300s in FP8 with current scaling (NeMo 25.11-26.06)",
            "te_linear": {"rows": [{"id": r["id"], "model": r["model"], "recipe": r["fp8"],
                                    "source": r["source"], "device": r["device"],
                                    "gpus": r["gpus"], "measured": r["measured_per_gpu"],
                                    "ratio": r["per_gpu_ratio"]} for r in te_rows],
                          "pairs": [{"fp8": p["float8"], "bf16": p["bf16"],
                                     "recipe": p["recipe"],
                                     "measured_speedup": p["measured_speedup"],
                                     "predicted_speedup": p["predicted_speedup"],
                                     "ratio": p["ratio"]} for p in te_pairs]},
            "rows": [{"row": r["row"], "model": r["model"], "gpus": r["gpus"],
                      "device": r.get("device", "h100-sxm"),
                      "measured": r["measured_tokens_per_s_per_gpu"],
                      "containers": [m["container"] for m in r["measured"]],
                      "ratio": r["fp8_mcore"]["ratio"],
                      "ratio_cudnn": (r.get("fp8_cudnn") or {}).get("ratio"),
                      "predicted_gain": r["predicted_fp8_gain"]} for r in result["rows"]],
            "cudnn_attention": result.get("cudnn_attention"),
            **({"mxfp8": {
                "source": "Megatron-Bridge's Llama 3 70B and Llama 3.1 405B pre-training in "
                          "MXFP8 on GB300s and GB200s (NeMo 26.02-26.06)",
                "rows": [{"row": r["row"], "model": r["model"], "gpus": r["gpus"],
                          "device": r["device"], "tp": r["tp"],
                          "measured": r["measured_tokens_per_s_per_gpu"],
                          "containers": [m["container"] for m in r["measured"]],
                          "ratio": r["mxfp8"]["ratio"],
                          "ratio_current": r["fp8_current"]["ratio"],
                          "predicted_over_current": r["predicted_mx_over_current"]}
                         for r in mxfp8["rows"]]}} if mxfp8 else {})}


def describe_fp8(record: dict | None = None) -> str | None:
    """What the published runs say of ``analyze --fp8`` (printed under every FP8 prediction);
    None when the record has no FP8 entry."""
    record = load_scale_out() if record is None else record
    f = record.get("fp8")
    if not f or not f["rows"]:
        return None
    by_model: dict[tuple, list[dict]] = {}
    for r in f["rows"]:
        by_model.setdefault((r["model"], r["gpus"], r.get("device", "h100-sxm")), []).append(r)
    parts = []
    for (model, gpus, device), rows in by_model.items():
        ratios = " and ".join(f"{r['ratio']:.2f}x" for r in rows)
        parts.append(f"{model} on {gpus:,} {DEVICE_NAMES.get(device, device)} {ratios}")
    gains = [r["predicted_gain"] for r in f["rows"]]
    cudnn = [r["ratio_cudnn"] for r in f["rows"] if r.get("ratio_cudnn") is not None]
    share = f.get("cudnn_attention")
    te = f.get("te_linear") or {"rows": [], "pairs": []}
    sources = ["one", "two", "three", "four"][min(len({r["source"] for r in te["rows"]}), 3)]
    text = (f"FP8 (--fp8) is checked against {sources} published "
            f"source{'s' if sources != 'one' else ''}. {f['source']}, run as "
            f"--tp-impl te: dlperf predicted {'; '.join(parts)} the measured rate"
            + (f", and the H100 rows {min(cudnn):.2f}-{max(cudnn):.2f}x with the attention "
               f"kernel at cuDNN's own speed (--efficiency attention={share}): the newer the "
               "stack, the faster its attention, and the more of an FP8 step it is"
               if cudnn and share else "")
            + f". {_ultra_against_gb200(f['rows'], 'model')}"
            f"dlperf's FP8 gain over BF16 for those runs, {min(gains):.2f}-"
            f"{max(gains):.2f}x, has no published BF16 run of the same configuration to check "
            "it against.")
    mx = f.get("mxfp8")
    if mx and mx["rows"]:
        devices = sorted({r["device"] for r in mx["rows"]}, reverse=True)
        per_device = "; ".join(
            f"{DEVICE_NAMES.get(d, d)} {_span([r['ratio'] for r in mx['rows'] if r['device'] == d])}x"
            for d in devices)
        tps = sorted({r["tp"] for r in mx["rows"]})
        text += (f" MXFP8 (--fp8 mxfp8), held out: {mx['source']}, at tensor parallelism "
                 f"{_span_int(tps)}: dlperf predicted {per_device} the measured rate "
                 f"({_count(len(mx['rows']), 'row')}; per-tensor FP8 on the same layouts "
                 f"{_span([r['ratio_current'] for r in mx['rows']])}x), and MXFP8 "
                 f"{_span([r['predicted_over_current'] for r in mx['rows']])}x as fast as "
                 "per-tensor FP8 there, which no published pair checks.")
    for source in sorted({r["source"] for r in te["rows"]}):
        rows = [r for r in te["rows"] if r["source"] == source]
        pairs = [p for p in te["pairs"]
                 if any(r["id"] == p["fp8"] for r in rows)]
        models = sorted({r["model"] for r in rows}, key=lambda m: (len(m), m))
        gpus = sorted({(r["gpus"], r["device"]) for r in rows})
        where = " and ".join(f"{n} {DEVICE_NAMES.get(d, d)}" for n, d in gpus)
        text += (f" {TE_SOURCES.get(source, source)}: {' and '.join(models)} on {where} "
                 f"({_count(len(rows), 'run')}), dlperf predicted "
                 f"{_span([r['ratio'] for r in rows])}x the measured rate")
        if pairs:
            measured = [p["measured_speedup"] for p in pairs]
            predicted = [p["predicted_speedup"] for p in pairs]
            text += (f", and FP8's speed-up over the same BF16 run (the same micro-batches; "
                     f"{_count(len(pairs), 'pair')}) measured {_span(measured)}x, "
                     f"predicted {_span(predicted)}x "
                     f"({_span([p['ratio'] for p in pairs])}x the measured gain)")
        text += "."
    return text


def build_float8(result: dict, device_run: dict | None = None) -> dict:
    """The scale-out record's entry on torchao's float8 training (``analyze --fp8
    tensorwise|rowwise``), from validate_scaling.py's results: each float8 row's recipe,
    measured rate and dlperf's prediction over it, and each published float8 / BF16 pair's
    speed-up, measured and predicted; with ``device_run`` (a saved ``bench_compile_gpu.py
    --fp8`` result, a lent GPU's), the same speed-ups measured by dlperf itself."""
    from dlperf.models.float8 import RECIPES as FLOAT8_RECIPES  # (TE's rows: build_fp8)

    rows = [r for r in result["rows"] if r.get("fp8") in FLOAT8_RECIPES]
    own = []
    if device_run is not None:
        res, gpu = device_run["results"], device_run["environment"].get("gpu")
        own = [{"recipe": recipe, "gpu": gpu, "preset": res["preset"],
                "measured_speedup": res[f"measured_{name}_speedup"],
                "predicted_speedup": res[f"predicted_{name}_speedup"]}
               for name, recipe in (("float8", "tensorwise"), ("rowwise", "rowwise"))
               if f"measured_{name}_speedup" in res]
    return {"device_pairs": own,
            "rows": [{"id": r["id"], "recipe": r["fp8"], "source": r["source"],
                      "device": r["device"], "gpus": r["gpus"], "tokens": r["image_size"],
                      "flag": r["flag"],
                      "measured": r["measured_per_gpu"], "ratio": r["per_gpu_ratio"]}
                     for r in rows],
            "pairs": [{"float8": p["float8"], "bf16": p["bf16"],
                       "recipe": p.get("recipe", "tensorwise"),
                       "measured_speedup": p["measured_speedup"],
                       "predicted_speedup": p["predicted_speedup"], "ratio": p["ratio"]}
                      for p in result["float8_pairs"]
                      if p.get("recipe", "tensorwise") in FLOAT8_RECIPES]}


def describe_float8(record: dict | None = None, recipe: str = "tensorwise") -> str | None:
    """What the published runs say of ``analyze --fp8 <recipe>`` (torchao's float8; printed
    under every such prediction); None when the record has no row of that recipe."""
    record = load_scale_out() if record is None else record
    f = record.get("float8") or {"rows": [], "pairs": []}
    rows = [r for r in f["rows"] if r.get("recipe", "tensorwise") == recipe]
    if not rows:
        return None
    # by GPU: torchtitan's and torchao's H100s are a power-limited HBM2e part (flag
    # hbm2e-500w in validation/published_scaling.csv), slower than the preset they run on
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["device"], r["flag"] == "hbm2e-500w"), []).append(r)
    parts = []
    for (device, limited), group in sorted(groups.items(), key=lambda g: -len(g[1])):
        gpus = ("power-limited HBM2e H100s" if limited
                else DEVICE_NAMES.get(device, device))
        parts.append(f"{_span([r['ratio'] for r in group])}x "
                     + ("the measured rate " if not parts else "")
                     + f"of the {len(group)} on {gpus} "
                     f"({', '.join(sorted({r['source'] for r in group}))})")
    runs = "run" if len(rows) == 1 else "runs"
    text = (f"torchao float8 (--fp8 {recipe}) is checked against {len(rows)} published "
            f"Llama 3 8B {runs}: dlperf predicted {' and '.join(parts)}")
    pairs = [p for p in f["pairs"] if p.get("recipe", "tensorwise") == recipe]
    if pairs:
        measured = [p["measured_speedup"] for p in pairs]
        predicted = [p["predicted_speedup"] for p in pairs]
        text += (f"; float8's speed-up over the same compiled BF16 run, measured "
                 f"{_span(measured)}x, predicted {_span(predicted)}x")
    for own in (p for p in f.get("device_pairs", []) if p["recipe"] == recipe):
        text += (f"; on the {own['gpu']} lent to dlperf (a 4-block Llama stack compiled per "
                 f"block), measured {own['measured_speedup']:.2f}x, predicted "
                 f"{own['predicted_speedup']:.2f}x")
    if recipe == "rowwise":  # (models/float8.py: the GEMMs' rates are not the recipe's own)
        text += (" (dlperf charges the rowwise recipe's GEMM kernels, PyTorch's rowwise "
                 "CUTLASS kernel and cuBLAS without fast accumulation, at cuBLAS's FP8 rate)")
    return text + "."


# what a pair of rows shares, as _ultra_against_gb200 names it
_WORK = {"model": "model", "config": "configuration"}


def _ultra_against_gb200(rows: list[dict], key: str) -> str:
    """A sentence on the GB300s' rates against the GB200s' where the record has both for the
    same ``key`` (a model, a configuration): measured and predicted, each the GB300's over the
    GB200's (the presets' peaks are the same), or "" where it has no such pair. ``rows``: the
    record's rows, with their device, "measured" rate and "ratio" (predicted / measured)."""
    by = {(r[key], r["device"]): r for r in rows if r.get("device") in ("gb200", "gb300")}
    pairs = [(by[(k, "gb300")], by[(k, "gb200")]) for k, d in by if d == "gb300"
             and (k, "gb200") in by]
    if not pairs:
        return ""
    measured = [u["measured"] / b["measured"] for u, b in pairs]
    predicted = [u["measured"] * u["ratio"] / (b["measured"] * b["ratio"]) for u, b in pairs]
    return (f"GB300s ran {_span(measured)}x as fast as GB200s on the same "
            f"{_WORK.get(key, key)} ({_count(len(pairs), 'pair')}) where dlperf "
            f"predicts {_span(predicted)}x: their datasheets give both the same dense FP8 and "
            "BF16 peaks and 8 TB/s (the GB300 runs at 1,400 W against 1,200), so read a GB300 "
            f"rate as up to {max(m / p for m, p in zip(measured, predicted)):.2f}x pessimistic "
            "beside a GB200's. ")


def _span_int(values: list[int]) -> str:
    """'2' for one value, '1-4' for a range."""
    return str(min(values)) if min(values) == max(values) else f"{min(values)}-{max(values)}"


def _count(n: int, noun: str) -> str:
    """'1 run', '7 runs'."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _span(values: list[float]) -> str:
    """'1.10' for one value (or equal ones), '1.10-1.25' for a range."""
    lo, hi = f"{min(values):.2f}", f"{max(values):.2f}"
    return lo if lo == hi else f"{lo}-{hi}"


def build_kvstore(fit: dict) -> dict:
    """The scale-out record's entry on MXNet's device kvstore, from benchmarks/fit_kvstore.py's
    kvstore-fit.json: the fitted cost per operation, the rows it was fitted to and the rows
    held out of it (the record blog's DGX-1), each predicted over measured."""
    def rows(role: str) -> list[dict]:
        return [{"id": r["id"], "gpus": r["gpus"], "ratio": r["per_gpu_ratio"],
                 "measured_total": r["total_measured"],
                 "predicted_total": r["total_predicted"]}
                for r in fit["rows"] if r["role"] == role]

    return {"op_s": fit["op_s"], "fit": rows("fit"), "held_out": rows("held out")}


def describe_kvstore(record: dict | None = None) -> str | None:
    """What the published runs say of ``analyze --kvstore device`` (printed under every such
    prediction); None when the record has no kvstore entry."""
    record = load_scale_out() if record is None else record
    k = record.get("kvstore")
    if not k or not k["fit"]:
        return None
    fit = [r["ratio"] for r in k["fit"]]
    held = "; ".join(f"{r['gpus']} GPUs, {r['measured_total']:,.0f} samples/s measured, "
                     f"{r['ratio']:.3f}x" for r in k["held_out"])
    gpus = " and ".join(str(g) for g in sorted({r["gpus"] for r in k["fit"]}))
    return (f"MXNet's device kvstore costs {k['op_s'] * 1e6:.2f} us an engine operation, "
            f"fitted to {len(fit)} runs of NVIDIA's MXNet 18.12 ResNet-50 on a DGX-1 ({gpus} "
            f"V100s; predicted {min(fit):.2f}-{max(fit):.2f}x their rate per GPU, the one-GPU "
            "prediction's error included)"
            + (f"; held out, the record blog's DGX-1 ({held})" if held else "") + ".")


def build_memory(result: dict) -> dict:
    """The scale-out record's entry on memory per GPU, from benchmarks/validate_memory.py's
    validation-memory.json: each published run's logged peak, dlperf's memory per GPU at the
    step's peak over it, and what dlperf left out per token of the step."""
    rows = [{"id": r["id"], "source": r["source"], "measured_gib": r["measured_gib"],
             "predicted_gib": r["predicted_gib"], "ratio": r["ratio"],
             "missing_gib": r["missing_gib"], "kind": r["kind"],
             "tokens": r.get("tokens")} for r in result["rows"]]
    return {"rows": rows, "summary": result["summary"]}


def describe_memory(record: dict | None = None) -> str | None:
    """What published peaks say of the memory per GPU ``analyze --gpus`` shows (printed under
    it for token models); None when the record has no memory entry."""
    record = load_scale_out() if record is None else record
    m = record.get("memory")
    if not m or not m["rows"]:
        return None
    ratios = [r["ratio"] for r in m["rows"]]
    sources = sorted({r["source"] for r in m["rows"]})
    per_token = [r["missing_gib"] * 2 ** 30 / r["tokens"] / 1e6 for r in m["rows"]
                 if r.get("tokens")]
    text = (f"Memory per GPU is judged at the step's peak (the tensors alive at its busiest "
            f"moment, for a language model the loss's logits and their gradient): against "
            f"{len(ratios)} published peaks ({', '.join(sources)}: PyTorch's allocator's "
            f"reserved peak on Llama 3 8B runs) it was {_span(ratios)}x (median "
            f"{m['summary']['median_ratio']:.2f}x) of them")
    if per_token:
        text += (f", {min(per_token):.2f}-{max(per_token):.2f} MB a token of the step short: "
                 "the allocator's cached blocks and fragmentation, FSDP's gradient buffers "
                 "and workspaces are not counted; leave that much free")
    return text + "."


# A run predicted to fill at least this share of its GPU's memory, counting the allocator's
# own share (dlperf's peak over the memory record's median reserved-over-predicted ratio), is
# as full as the published runs that ran well below dlperf's rate; "well below": predicted
# over measured above MISSED_BY (benchmarks/README.md, nineteenth session).
PRESSURE_SHARE = 0.9
MISSED_BY = 1.15


def build_memory_pressure(rows: list[dict], reserved_ratio: float, capacity) -> dict:
    """The scale-out record's entry on runs that fill their GPUs, from validate_scaling.py's
    rows: the clean runs predicted at ``PRESSURE_SHARE`` of the memory or more once the
    allocator's share is added (each run's peak / ``reserved_ratio``, the memory record's
    median, over ``capacity(device)`` bytes) against the rest, and how many of each dlperf
    predicted too fast by more than ``MISSED_BY`` (predicted over measured)."""
    full: list[dict] = []
    rest: list[dict] = []
    for r in rows:
        memory = r.get("memory_per_gpu") or {}
        if r.get("flag") != "clean" or not memory.get("peak_bytes"):
            continue
        cap = capacity(r["device"])  # (only for the rows that count: a preset lookup each)
        if not cap:
            continue
        share = memory["peak_bytes"] / reserved_ratio / cap
        (full if share >= PRESSURE_SHARE else rest).append(r)

    def part(group: list[dict]) -> dict:
        missed = [r for r in group if r["per_gpu_ratio"] > MISSED_BY]
        return {"rows": len(group), "missed": len(missed),
                "median": round(statistics.median(r["per_gpu_ratio"] for r in group), 3)
                if group else None,
                "missed_ids": [r["id"] for r in missed]}

    return {"share": PRESSURE_SHARE, "missed_by": MISSED_BY,
            "reserved_ratio": round(reserved_ratio, 3), "full": part(full), "rest": part(rest)}


def describe_memory_pressure(memory: dict, record: dict | None = None) -> str | None:
    """What the published runs say of a scale-out whose GPUs are full (printed under the
    memory per GPU when its peak, with the allocator's share, reaches the record's share of
    the GPU's memory); None below it, without the record or the GPU's capacity, or when the
    run does not fit at all (the scale-out says so on its own)."""
    record = load_scale_out() if record is None else record
    p = record.get("memory_pressure")
    cap = memory.get("capacity_bytes")
    if (not p or not cap or not p["full"]["rows"] or not memory.get("peak_bytes")
            or memory.get("fits") is False):
        return None
    share = memory["peak_bytes"] / p["reserved_ratio"] / cap
    if share < p["share"]:
        return None
    full, rest = p["full"], p["rest"]
    return (f"Counting the allocator's share (the peak / {p['reserved_ratio']:.2f}), this "
            f"run fills ~{share:.0%} of each GPU's memory. Of the {full['rows']} published "
            f"runs predicted at {p['share']:.0%} or more, dlperf predicted {full['missed']} "
            f"more than {p['missed_by'] - 1:.0%} too fast (median predicted / measured "
            f"{full['median']:.2f}), against {rest['missed']} of the {rest['rows']} below "
            "that: more GPUs (less sharded state on each) or a smaller micro-batch leaves "
            "room.")


def build_kernels(result: dict, path: str) -> dict:
    """The record of a lent GPU's per-kernel measurements (benchmarks/gpu_kernel_classes.py's
    result, ``path`` where it is saved): per precision and layout of ResNet-50's training step,
    dlperf's kernel time over the measured one, its convolutions' and batch norms', the
    elementwise kernels' bandwidth against the model's, NCHW's cost to the convolutions over
    channels_last, and the ladder's measured and predicted channels_last gain in TF32."""
    env = result.get("config", {}).get("measured_on") or {}
    cudnn = env.get("cudnn")
    stack = ", ".join(x for x in (
        f"torch {env['torch'].split('+')[0]}" if env.get("torch") else "",
        f"cuDNN {cudnn // 10000}.{cudnn // 100 % 100}" if isinstance(cudnn, int) else "") if x)

    def ratio(by: dict, names: tuple[str, ...]) -> float | None:
        measured = sum(by[n]["measured_s"] for n in names)
        return round(sum(by[n]["predicted_s"] for n in names) / measured, 3) if measured else None

    runs = {}
    for name, run in result["results"]["runs"].items():
        by = run["by_class"]
        runs[name] = {
            "batch": run["config"]["batch"],
            "kernels": round(run["predicted_s"] / run["measured_s"], 3),
            "convolutions": ratio(by, ("conv forward", "conv dgrad", "conv wgrad")),
            "batch_norm": ratio(by, ("batch norm forward", "batch norm backward")),
            "stream_tb_s": round((run["stream_achieved_bytes_per_s"] or 0) / 1e12, 2),
            "model_stream_tb_s": round((run["stream_model_bytes_per_s"] or 0) / 1e12, 2)}
    layouts = {}
    for c in result["results"]["layout_contrasts"]:
        entry = layouts.setdefault(c["precision"], {"nchw_s": 0.0, "cl_s": 0.0})
        entry["nchw_s"] += c["nchw_measured_s"]
        entry["cl_s"] += c["cl_measured_s"]
    ladder = result["results"].get("ladder_tf32_channels_last")
    return {"gpu": env.get("gpu"), "stack": stack, "model": "resnet50", "source": path,
            "runs": runs,
            "nchw_over_cl_convolutions": {k: round(v["nchw_s"] / v["cl_s"], 3)
                                          for k, v in layouts.items() if v["cl_s"]},
            "ladder_tf32_channels_last": None if not ladder else {
                "measured": round(ladder["measured_gain"], 3),
                "predicted": round(ladder["predicted_gain"], 3)}}


def describe_kernels(spec, config, record: dict | None = None) -> str | None:
    """What a lent GPU measured per kernel for a step like this one (a CNN in TF32, strict FP32
    or bf16, NCHW or channels_last, on a GPU with TF32 Tensor Cores), where its kernel
    time differed from dlperf's by more than ``SYSTEMATIC`` or where channels_last gained what
    dlperf does not predict; None otherwise, for a measured profile, or without the record."""
    if (spec.measured or workload_class(config) not in ("cnn-fp32-tf32", "cnn-amp")
            or not spec.tensor_cores or spec.peak_flops("tf32") is None
            or config.dtype not in ("fp32", "bf16")):  # (fp16 has no record yet)
        return None  # (decided before reading the record: this runs beside every prediction)
    record = load_scale_out() if record is None else record
    k = record.get("kernels")
    if not k:
        return None
    precision = ("tf32" if config.tf32 else "fp32") if config.dtype == "fp32" else "bf16"
    layout = "cl" if config.channels_last else "nchw"
    run = k["runs"].get(f"{precision}-{layout}")
    if run is None:
        return None
    where = f"On a lent {k['gpu']} ({k['stack']}), {k['model']}'s training step in this precision "
    speed = _times(run["kernels"])
    where += ("and layout ran its kernels " + (
        "as fast as dlperf predicted" if speed == "as predicted" else
        f"{speed} than dlperf predicted"))
    parts = []
    if abs(run["kernels"] - 1) > SYSTEMATIC:
        parts.append(f"its convolutions {_times(run['convolutions'])}, batch norm "
                     f"{_times(run['batch_norm'])}, elementwise kernels at "
                     f"{run['stream_tb_s']:.1f} TB/s against the model's "
                     f"{run['model_stream_tb_s']:.1f}")
    gain = k.get("ladder_tf32_channels_last")
    convs = k["nchw_over_cl_convolutions"].get(precision)
    if precision == "tf32" and layout == "nchw" and gain and convs:
        parts.append(f"its NCHW convolutions took {convs:.2f}x the time of channels_last ones "
                     f"and channels_last ran the whole step {gain['measured']:.2f}x faster, "
                     f"where dlperf's shipped model predicts {gain['predicted']:.2f}x (it "
                     "charges TF32 no layout cost; `--efficiency tf32_nchw=0.57` does): use "
                     "channels_last")
    if precision == "fp32":
        parts.append("PyTorch runs cuDNN convolutions in TF32 unless told not to: `--tf32` "
                     "predicts that step")
    if not parts:
        return None
    return where + ": " + "; ".join(parts) + f" ({k['source']})."


def _times(ratio: float | None) -> str:
    """A predicted/measured time ratio as the measured speed it means: '1.62x slower' (the
    kernels took longer than predicted), '1.39x faster', or 'as predicted' within 2%."""
    if ratio is None:
        return "unmeasured"
    if abs(ratio - 1) < 0.02:
        return "as predicted"
    return f"{1 / ratio:.2f}x slower" if ratio < 1 else f"{ratio:.2f}x faster"


def describe_context_parallel(record: dict | None = None) -> str:
    """What published runs say of ``analyze --cp`` (printed under every context-parallel
    prediction): Llama 3 405B's 128K row where the record has it, else that none has checked
    it."""
    record = load_scale_out() if record is None else record
    m = (record.get("tensor_parallel") or {}).get("llama3")
    if m is None:
        return ("Context parallelism is not yet checked against a published run: its "
                "exchanges are timed at the interconnect's rates and the ring's beside equal "
                "attention kernels, as TransformerEngine and Llama 3 describe them.")
    return (f"Context parallelism is checked against one published run, Llama 3 405B at "
            f"{m['cp_seq'] // 1024}K tokens with CP {m['cp']} (all-gather) on "
            f"{m['cp_gpus']:,} H100s: predicted {m['cp_causal']:.2f}x its rate counting the "
            f"causal half of the attention's FLOPs and {m['cp_full']:.2f}x counting the whole "
            "matrix (the paper does not say which), with Megatron-Core's overlapped stack and "
            f"cuDNN's attention; {m['cp_eager_low']:.2f}-{m['cp_eager_high']:.2f}x with "
            "PyTorch's collectives exposed and FlashAttention-2's speed. At long sequences "
            "the attention kernel's speed decides most of the rate: give yours with "
            "--efficiency attention=F.")


def build_expert_parallel(result: dict, bridge: dict | None = None,
                          qwen3: dict | None = None) -> dict:
    """The scale-out record's expert-parallel entry from validate_tp.py's
    tp-megatron-moe.json (its "results"): Megatron-Core's Mixtral 8x7B, predicted over the
    README's TFLOPS in each reading of its pipeline schedule, at the attention share chosen
    for Megatron-Core's 2024 stack (the file's first share) and over all three; from
    tp-megatron-bridge-moe.json (``bridge``) Megatron-Bridge's gpt-oss-120b rows, each at its
    headline attention share ("mcore"), by device; and from tp-megatron-bridge-qwen3.json
    (``qwen3``) its Qwen3 rows in FP8, each against the median of its releases' rates, at the
    headline share and over the three, and with the plain all-to-all in place of its
    dispatcher."""
    rows = result["rows"]
    chosen = rows[0]["attention"]
    at = {r["virtual"]: r["ratio"] for r in rows if r["attention"] == chosen}
    entry = {"source": "Megatron-Core's Mixtral 8x7B on 64 H100s, EP 8 x PP 4 (MCore v0.9 "
                       "README, 2024)",
             "ratio_1f1b": at[1], "ratio_interleaved": at[max(at)],
             "ratio_low": min(r["ratio"] for r in rows),
             "ratio_high": max(r["ratio"] for r in rows)}
    if bridge is not None:
        ratios, over, unknown = {}, {}, []
        for r in bridge["rows"]:
            if "at_400g_nics" in r:  # a network whose NICs the table does not give
                unknown.append({"device": r["device"], "ratio": r["mcore"]["ratio"],
                                "ratio_400g": r["at_400g_nics"]["ratio"]})
                continue
            ratios.setdefault(r["device"], []).append(r["mcore"]["ratio"])
            over.setdefault(r.get("alltoall_over", "network"), []).append(r["mcore"]["ratio"])
        containers = sorted({r["container"] for r in bridge["rows"] if "container" in r},
                            key=lambda c: tuple(int(x) for x in c.split(".")))
        entry["gpt_oss"] = {
            "source": "Megatron-Bridge's gpt-oss-120b (128 experts, top 4) on 64 GPUs"
                      + (f" (NeMo {containers[0]} to {containers[-1]})" if containers else ""),
            "runs": len(bridge["rows"]),
            "unknown_nics": unknown,
            # each row's configuration, rate and ratio, for the GB300s against the GB200s
            "rows": [{"config": f"EP {r['ep']}, micro-batch {r['micro_batch']}, global batch "
                                f"{r['global_batch']}", "device": r["device"],
                      "measured": r["measured_tokens_per_s_per_gpu"],
                      "ratio": r["mcore"]["ratio"]} for r in bridge["rows"] if "ep" in r],
            "by_device": {d: {"low": min(v), "high": max(v)} for d, v in ratios.items()},
            # the rows whose all-to-alls stay on NVLink and those that cross the network
            "by_alltoall": {k: {"low": min(v), "high": max(v), "runs": len(v)}
                            for k, v in over.items()},
            "ratio_low": min(min(v) for v in ratios.values()),
            "ratio_high": max(max(v) for v in ratios.values())}
    if qwen3 is not None:
        entry["qwen3"] = [{
            "row": r["row"], "device": r["device"], "dispatcher": r["dispatcher"],
            "releases": len(r["published"]), "measured": r["measured_tokens_per_s_per_gpu"],
            "ratio": r["mcore"]["ratio"],
            "ratio_low": min(r[k]["ratio"] for k in ("preset", "mcore", "cudnn") if k in r),
            "ratio_high": max(r[k]["ratio"] for k in ("preset", "mcore", "cudnn") if k in r),
            "ratio_alltoall": r["alltoall"]["ratio"],
            # (Blackwell's rows: MXFP8, with per-tensor FP8 on the same GPUs beside it)
            "ratio_fp8_current": (r.get("fp8_current") or {}).get("ratio")}
            for r in qwen3["rows"]]
    return entry


def describe_expert_parallel(record: dict | None = None) -> str:
    """What published runs say of ``analyze --ep`` (printed under every expert-parallel
    prediction): Megatron-Core's Mixtral 8x7B where the record has it, else that none has
    checked it."""
    record = load_scale_out() if record is None else record
    how = ("its all-to-alls are timed at the interconnect's all-reduce bus bandwidth (inside "
           "the node, and the rank's own NIC for the share that leaves it; under "
           "--ep-dispatcher deepep or hybridep each token goes once to each GPU, and across "
           "the network once to each other node, holding one of its experts), every one "
           "exposed, on a router's balanced "
           "load unless --expert-load says otherwise; the experts' batched GEMMs take the GEMM "
           "share of the dense layers")
    m = record.get("expert_parallel")
    if m is None:
        return f"Expert parallelism is not yet checked against a published run: {how}."
    mixtral = (f"{m['source']}: predicted {m['ratio_interleaved']:.2f}x its TFLOPS with one "
               f"block a virtual stage and {m['ratio_1f1b']:.2f}x without interleaving (the "
               f"README does not say which; {m['ratio_low']:.2f}-{m['ratio_high']:.2f}x over "
               "the attention kernel's plausible speeds)")
    g = m.get("gpt_oss")
    if g is None:
        return (f"Expert parallelism is checked against one published figure, {mixtral}. "
                f"One figure, not a record: {how}.")
    devices = "; ".join(f"{DEVICE_NAMES.get(d, d)} {_span([v['low'], v['high']])}x"
                        for d, v in g["by_device"].items())
    nvlink, network = (g.get("by_alltoall", {}).get(k) for k in ("nvlink", "network"))
    where = (f"; the {nvlink['runs']} whose all-to-alls stay on NVLink are the furthest off "
             f"({_span([nvlink['low'], nvlink['high']])}x), so what is missing is the GPUs' own "
             "work, not the network's"
             if nvlink and network and nvlink["low"] > network["high"] else "")
    unknown = "".join(
        f"; the {DEVICE_NAMES.get(u['device'], u['device'])}' row, whose all-to-alls cross "
        f"NICs the table does not give, {u['ratio']:.2f}x on the 800 Gb/s of their datasheet "
        f"and {u['ratio_400g']:.2f}x on 400 Gb/s" for u in g.get("unknown_nics", []))
    ultra = _ultra_against_gb200(g.get("rows", []), "config")
    qwen3 = m.get("qwen3", [])
    fp8 = "".join(
        f"; Megatron-Bridge's {q['row']} ({q['dispatcher']}, the median of {q['releases']} "
        f"releases' rates): predicted {q['ratio']:.2f}x ({q['ratio_low']:.2f}-"
        f"{q['ratio_high']:.2f}x over the attention kernel's plausible speeds), and "
        f"{q['ratio_alltoall']:.2f}x were each copy of a token sent as the plain all-to-all "
        "sends it" for q in qwen3 if q["ratio_fp8_current"] is None)
    mx = [q for q in qwen3 if q["ratio_fp8_current"] is not None]
    if mx:
        fp8 += (f"; its Qwen3-30B-A3B in MXFP8 on one node of 8 (EP 8, HybridEP, the median "
                f"of 3 releases each): predicted "
                + ", ".join(f"{q['ratio']:.2f}x on {DEVICE_NAMES.get(q['device'], q['device'])}"
                            for q in mx)
                + f" ({_span([q['ratio_fp8_current'] for q in mx])}x in per-tensor FP8)")
    return (f"Expert parallelism is checked against {g['runs'] + 1 + len(qwen3)} published "
            f"rates. {mixtral[0].upper()}{mixtral[1:]}; {g['source']}: predicted "
            f"{g['ratio_low']:.2f}-{g['ratio_high']:.2f}x their tokens/s ({devices}), too "
            f"fast{where}{unknown}{fp8}: read a rate of many small experts as up to "
            f"{g['ratio_high']:.1f}x optimistic (not yet explained). {ultra}How: {how}.")


def describe_tensor_parallel(record: dict | None = None) -> str | None:
    """What the published tensor-parallel runs say of ``analyze --tp`` (printed under every
    tensor-parallel prediction), from the scale-out record; None when it has none."""
    record = load_scale_out() if record is None else record
    s = record.get("tensor_parallel")
    if not s:
        return None
    kempner = (f"TP cost {s['measured_loss_low']:.0%}-{s['measured_loss_high']:.0%} of a "
               f"GPU's rate against FSDP on as many GPUs where dlperf predicts "
               f"{s['predicted_loss_low']:.0%}-{s['predicted_loss_high']:.0%}: read the "
               f"tensor-parallel rates of such a stack as up to {s['ratio_high']:.1f}x "
               "optimistic")
    m = s.get("megatron")
    if m is None:
        return (f"Tensor parallelism is the least checked part of this model: in the one "
                f"published source it is checked against ({s['source']}), {kempner}.")
    sources = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven",
               8: "eight", 9: "nine"}.get(s.get("sources", 2), "several")
    return (f"Tensor parallelism is checked against {sources} published sources. {m['source']} "
            f"({m['runs']} runs): each TP=N run's rate per GPU over TP=1's was predicted "
            f"{m['ratio_low']:.2f}-{m['ratio_high']:.2f}x what was measured. "
            + (_megatron_2022(s["megatron_2022"]) if s.get("megatron_2022") else "")
            + (_pipelined(s["pipelined"]) if s.get("pipelined") else "")
            + (_megatron_core(s["megatron_core"]) if s.get("megatron_core") else "")
            + (_llama3(s["llama3"]) if s.get("llama3") else "")
            + (_deepspeed(s["megatron_deepspeed"]) if s.get("megatron_deepspeed") else "")
            + (_async(s["async"]) if s.get("async") else "")
            + f"In {s['source']}, {kempner}.")
