"""Terminal table for an Analysis (rich); the JSON comes from Analysis.to_dict()."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from dlperf.analysis.html import dtype_label, fp8_label, memory_parts, memory_total
from dlperf.analysis.liveness import peak_total
from dlperf.hardware.track_record import (describe_context_parallel,
                                          describe_expert_parallel, describe_kvstore,
                                          describe_memory, describe_memory_pressure,
                                          describe_tensor_parallel)
from dlperf.hardware.track_record import describe as describe_record
from dlperf.term import new_console, styled
from dlperf.units import gib, seconds, si


def _gemm_text(c) -> str:
    if c.gemm is None:
        return ""
    g = c.gemm
    text = f"{g.m}x{g.n}x{g.k}"
    return f"{text} x{g.batch}" if g.batch > 1 else text


def _limit_text(p) -> str | Text:
    """What sets the predicted time, shown only where it is not what ``bound`` suggests (a
    memory-bound kernel limited by its quantised math, or by launch cost)."""
    expected = {"compute": "math", "memory": "memory"}.get(p.bound)
    return "" if p.limited_by == expected else Text(p.limited_by, style="magenta")


def rate(value: float) -> str:
    """A throughput with the digits it needs: 0.18 stays 0.18, 1,234.5 becomes 1,235."""
    if value >= 100 or value == 0:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def render(analysis, console: Console | None = None, top: int = 25, macs: bool = False) -> None:
    console = console or new_console()
    totals = analysis.totals()
    work = "MACs" if macs else "FLOPs"
    scale = 0.5 if macs else 1.0
    console.print(_kernel_table(analysis, top, macs))
    console.print(
        styled("[bold]Predicted step[/]: {} = [bold]{} samples/s[/]",
               seconds(totals["predicted_time_s"]), rate(totals["samples_per_s"]))
        + (styled(" ([bold]{} tokens/s[/])", rate(totals["tokens_per_s"]))
           if "tokens_per_s" in totals else "")
        + f" at batch {analysis.batch_size}; "
        f"{si(totals['flops'] * scale)}{work} ({'MACs' if macs else '2 FLOPs per multiply-add'}), "
        f"{si(totals['bytes'], 'B')} moved, {totals['kernels']} kernels.")
    _print_record(describe_record(analysis.device, analysis.config), console)
    phases = ", ".join(f"{k} {seconds(v)}" for k, v in totals["time_by_phase_s"].items())
    console.print(
        f"Time split: math-limited {seconds(totals['compute_time_s'])}, memory-limited "
        f"{seconds(totals['memory_time_s'])}, "
        + (f"NCHW transposes {seconds(totals['nchw_transpose_time_s'])}, "
           if totals["nchw_transpose_time_s"] else "")
        + f"launch {seconds(totals['launch_time_s'])}"
        + (f", GPU waiting for the CPU to issue kernels {seconds(totals['host_wait_s'])}"
           if totals.get("host_wait_s", 0) > 0.02 * totals["predicted_time_s"] else "")
        + "; "
        f"memory-bound kernels take {totals['memory_bound_time_share']:.0%} of the time "
        f"while GEMMs hold {totals['gemm_flops_share']:.0%} of the FLOPs. By phase: {phases}.")
    _notes(analysis, console)


def _kernel_table(analysis, top: int, macs: bool) -> Table:
    """The top kernels by predicted time, with the guide's columns."""
    cfg, spec = analysis.config, analysis.device
    total_time = analysis.totals()["predicted_time_s"] or 1.0
    work = "MACs" if macs else "FLOPs"
    scale = 0.5 if macs else 1.0
    table = Table(title=f"Top {top} kernels by predicted time: {cfg.model}, batch "
                        f"{analysis.batch_size}, {dtype_label(cfg, spec, fp8=False)}"
                        f"{' (half model)' if cfg.precision == 'half' else ''}"
                        f"{' (FSDP mixed precision)' if cfg.precision == 'fsdp' else ''}"
                        f"{fp8_label(cfg)}, "
                        f"{'train' if cfg.train else 'inference'} on {spec.display_name}",
                  title_justify="left", header_style="bold")
    for col, just in (("layer", "left"), ("op", "left"), ("phase", "left"),
                      ("GEMM MxNxK", "right"), (work, "right"), ("bytes", "right"),
                      ("FLOP/B", "right"), ("bound", "left"), ("limit", "left"),
                      ("TC-aligned", "left"),
                      ("tile x wave", "right"), ("time", "right"), ("share", "right")):
        # op names stay whole (people grep for them); everything else may fold
        table.add_column(col, justify=just, overflow="fold", no_wrap=col == "op")
    ranked = sorted(analysis.predictions, key=lambda p: -p.time_s)[:top]
    for p in ranked:
        c = p.cost
        aligned = "" if p.aligned is None else (
            "yes" if p.aligned else Text("no: " + ",".join(d.upper() for d in p.misaligned),
                                         style="red"))
        bound = Text("memory", style="yellow") if p.bound == "memory" else p.bound
        intensity = "inf" if p.intensity == float("inf") else f"{p.intensity:.3g}"
        table.add_row(c.module or "(model)", c.op, c.phase, _gemm_text(c),
                      si(c.flops * scale), si(c.bytes, "B"), intensity, bound,
                      _limit_text(p), aligned,
                      f"{p.quantization_efficiency:.0%}" if p.quantization else "",
                      seconds(p.time_s), f"{p.time_s / total_time:.1%}")
    return table


def _notes(analysis, console) -> None:
    """Memory per device, the ops:byte ratios, the efficiency model, uncounted ops, findings."""
    spec = analysis.device
    ratio = spec.ops_per_byte("fp32")
    units = sorted({p.unit for p in analysis.predictions if p.cost.kind in ("gemm", "fused")})
    ratios = ", ".join(f"{u} {spec.ops_per_byte(u):.1f}" for u in units if spec.ops_per_byte(u))
    memory = analysis.memory_report()
    if memory and memory["total_bytes"]:
        cap = f" of {gib(memory['device_bytes'])}" if memory["device_bytes"] else ""
        verdict = styled(" [bold red]does not fit[/]") if memory["fits"] is False else ""
        console.print(
            Text(f"Memory per device: {memory_total(memory)}{cap}") + verdict + f" (weights "
            f"{gib(memory['weights_bytes'])}, gradients {gib(memory['gradients_bytes'])}, "
            f"optimizer state {gib(memory['optimizer_state_bytes'])}, activations saved for "
            f"the backward {gib(memory['activations_bytes'])}"
            + (f"; the step's tensors hold {gib(memory['activations_peak_bytes'])} at its peak"
               + (f" ({memory['peak_at']})" if memory.get("peak_at") else "")
               if peak_total(memory) != memory["total_bytes"] else "")
            + "; workspaces and the allocator's cache come on top).")
    console.print(f"Ops:byte ratio of {spec.display_name}: {ratios}"
                  f"{'; ' if ratios else ''}fp32 (CUDA cores) {ratio:.1f} FLOP/B.")
    eff = analysis.efficiency
    if eff is not None and not spec.measured:
        winograd = (f" (an NCHW 3x3 convolution under cuDNN's Winograd: {eff.winograd:.0%} of "
                    "its math time)" if eff.winograd < 1 else "")
        console.print(
            f"Efficiency model ({eff.source or 'hardware/efficiency.py'}): GEMMs "
            f"{eff.tensor_gemm:.0%} and convolutions {eff.tensor_conv:.0%} of Tensor Core peak "
            f"after tile/wave losses, fused attention ({analysis.config.attention_kernel}) "
            f"{eff.math('attention'):.0%}, FP32 {eff.cuda_core:.0%}"
            f"{winograd}; memory "
            f"{eff.bandwidth(spec) / 1e9:,.0f} GB/s achieved of {spec.mem_bandwidth / 1e9:,.0f} "
            f"(depthwise {eff.depthwise:.0%} of that); {eff.launch_s * 1e6:.2g} us GPU and "
            f"{eff.host_s * 1e6:.2g} us CPU per kernel.", style="dim")
    if analysis.uncounted:
        items = ", ".join(f"{op} x{n}" for op, n in sorted(analysis.uncounted.items()))
        console.print(styled("[yellow]Uncounted ops (no cost rule, not in the totals)[/]: {}",
                             items))
    if analysis.findings:
        console.print(styled("[bold]What the guide says to do[/]:"))
        for f in analysis.findings:
            gain = f" (saves ~{seconds(f.saving_s)} per step)" if f.saving_s > 0 else ""
            console.print(f"  - [{f.rule}] {f.message}{gain}")


def _print_record(record: tuple[str, bool] | None, console) -> None:
    """dlperf's published track record line: yellow where it is flagged systematic, else dim."""
    if record:
        text, warn = record
        console.print(text, style="yellow" if warn else "dim")


def render_scaling(here: dict, curve: list[dict], node, network, console,
                   tokens_per_sample: int | None = None,
                   record: tuple[str, bool] | None = None,
                   band: tuple[float, float] | None = None) -> None:
    """`analyze --gpus`: the requested scale in a line, then the curve from 1 to 4,096 GPUs,
    then dlperf's scale-out record (``record``: track_record.describe_scale_out's line) and the
    requested scale's efficiency read through it (``band``: track_record.efficiency_band).
    ``tokens_per_sample``: a token model's sequence length; rates are then tokens/s, what
    language-model runs publish."""
    comm = here["communication"]
    scale = tokens_per_sample or 1
    unit = "tokens/s" if tokens_per_sample else "samples/s"
    sharded = comm.get("param_gather_s") is not None  # DDP under the distributed optimizer
    above = (" (above 100%: each GPU updates only its shard of the optimizer state)"
             if here["scaling_efficiency"] > 1.0 and (comm["strategy"] != "ddp" or sharded)
             else "")
    deepspeed = comm.get("deepspeed_bf16")
    strategy = comm["strategy"].upper() + (
        " as DeepSpeed's BF16_Optimizer (its fp32 gradients all-reduced, the update sharded)"
        if deepspeed else " with the distributed optimizer" if sharded else "")
    tp = comm.get("tensor_parallel")
    pipe = comm.get("pipeline")
    cp = comm.get("context_parallel")
    ep = comm.get("expert_parallel")
    ways = here["ranks_per_replica"]
    layout = ", ".join(
        ([f"{tp['tp']}-way tensor parallel in the node"] if tp else [])
        + ([f"{ep['ep']}-way expert parallel "
            + ("in the node" if ep["in_node"] else "across nodes")] if ep else [])
        + ([f"{cp['cp']}-way context parallel "
            + ("in the node" if cp["in_node"] else "across nodes")] if cp else [])
        + ([f"{pipe['pp']} pipeline stages" + (f" of {pipe['virtual']} virtual chunks"
                                               if pipe["virtual"] > 1 else "")] if pipe else [])
        + [f"{strategy} over {here['gpus'] // ways:,} replicas" if ways > 1 else strategy])
    reference = (f"its {ways} ranks without their collectives"
                 + (" and the pipeline's bubble" if pipe else "") if ways > 1 else "one GPU")
    console.print(
        styled("[bold]On {} GPUs[/]", f"{here['gpus']:,}")
        + f" ({here['nodes']:,} node(s); {node.display_name}"
        + (f", then {network.display_name}" if here["nodes"] > 1 else "") + f"; "
        f"{layout}): {rate(here['per_gpu_samples_per_s'] * scale)} {unit} per "
        f"GPU, {rate(here['total_samples_per_s'] * scale)} in all, "
        f"{here['scaling_efficiency']:.1%} of {reference}{above}; "
        + (f"tensor-parallel "
           + ("all-gathers and reduce-scatters " if tp.get("sequence_parallel", True)
              else "all-reduces ")
           + f"{tp['collectives_per_micro_batch']:,} of {gib(tp['bytes_each'])} per micro-batch"
           + (f" (NCCL: {tp['nccl']})" if tp.get("nccl") else "")
           + (f", {seconds(tp['exposed_s'])} a step, none hidden; "
              if not tp.get("beside_gemms") else
              f", {seconds(tp.get('busy_s', 0.0))} a step, of which {tp['beside_gemms']:,} "
              + ("beside the forward's and backward's GEMMs (TransformerEngine's)"
                 if tp.get("forward_overlap") else "beside the backward's GEMMs (Megatron's)")
              + f", {seconds(tp['exposed_s'])} exposed; ")
           if tp else "")
        + (f"context-parallel {'ring sends' if cp['comm'] == 'p2p' else 'all-gathers and reduce-scatters'}"
           f" of K and V {cp['exchanges_per_micro_batch']:,} of {gib(cp['kv_bytes_each'])} "
           f"per micro-batch" + (f" (NCCL: {cp['nccl']})" if cp.get("nccl") else "")
           + f", {seconds(cp['busy_s'])} a step, "
           + (f"beside the attention kernels, {seconds(cp['exposed_s'])} exposed; "
              if cp["comm"] == "p2p" else "none hidden; ") if cp else "")
        + (f"expert-parallel all-to-alls (tokens to their experts and back"
           + (f"; {ep['dispatcher']}'s: a token once to each GPU and node of its experts"
              if ep.get("dispatcher", "alltoall") != "alltoall" else "") + ") "
           f"{ep['alltoalls_per_micro_batch']:,} of {gib(ep['bytes_each'])} per micro-batch, "
           f"{seconds(ep['exposed_s'])} a step, none hidden"
           + (f", the experts' gradients reduced over {eg['replicas']:,} replicas"
              if (eg := comm.get("expert_gradients")) and eg["replicas"] > 1 else
              ", no reduction of the experts' gradients (each replica holds its own)"
              if eg else "") + "; " if ep else "")
        + (f"pipeline bubble {seconds(pipe['bubble_s'])} a step ({pipe['micro_batches']} "
           f"micro-batches; the slowest stage is stage {pipe.get('slowest_stage', 0)}), "
           f"{pipe['p2p_transfers']:,} point-to-point sends of {gib(pipe['p2p_bytes_each'])} "
           f"{'between nodes' if pipe['p2p_between_nodes'] else 'inside the node'}, "
           f"{seconds(pipe['p2p_s'])}"
           + (f" ({seconds(pipe['p2p_exposed_s'])} exposed beside the chunks)"
              if pipe.get("p2p_overlap") else "")
           + (f", the tied embedding's all-reduce between the first and last stage "
              f"{seconds(pipe['tied_embedding_allreduce_s'])}"
              if pipe.get("tied_embedding_allreduce_s") else "") + "; " if pipe else "")
        + ("data-parallel communication " if tp or pipe or cp or ep else "communication ")
        + f"{seconds(comm.get('comm_s', 0.0))} per "
        f"{'micro-batch' if comm['strategy'] != 'ddp' and here['grad_accum'] > 1 else 'step'}"
        + (f" (NCCL: {comm['nccl']} for the largest "
           f"{'bucket' if comm['strategy'] == 'ddp' else 'unit'})" if comm.get("nccl") else
           f" (MXNet's device kvstore: {comm['keys']:,} gradients, {comm['engine_ops']:,} "
           f"engine operations at {comm['op_s'] * 1e6:.2f} us, not beside the backward)"
           if comm.get("kvstore") else "")
        + f", {seconds(here['exposed_comm_s'])} exposed"
          f"{' in all' if tp or pipe or cp or ep else ''}"
        + (f", {seconds(here['contention_s'])} of compute slowed beside the hidden rest "
           f"({comm['contention']['sms']} SMs held by NCCL)"
           if here.get("contention_s", 0.0) > 0 else "")
        + (f", {seconds(here['straggler_s'])} waiting for the slowest GPU (step spread "
           f"{here['step_cv']:.1%})" if here["straggler_s"] else "")
        + (f"; DeepSpeed's cast and add of every gradient into its fp32 buffer after each "
           f"micro-batch {seconds(deepspeed['accumulate_s'])} a step, on one GPU as on many"
           if deepspeed else "")
        + (f"; the update's launches after GradScaler's wait "
           f"{seconds(comm['optimizer_host_s'])} a step, on one GPU as on many"
           if comm.get("optimizer_host_s", 0.0) > 0.01 * here["step_s"] else "")
        + (f"; of the exposed, DDP's broadcast of {bb['tensors']} buffers before every forward "
           f"{seconds(bb['seconds'])} (DistributedDataParallel(..., forward_sync_buffers=False), "
           "broadcast_buffers=False before torch 2.13, removes it; the buffers, batch norm's "
           "running statistics, then differ by GPU until synchronised, e.g. by SyncBatchNorm)"
           if (bb := comm.get("buffer_broadcast")) and bb["seconds"] > 0.01 * here["step_s"]
           else "")
        + f"; limited by {here['limited_by']}"
        + (f" (decoding on the GPUs, --decode gpu, would lift it to "
           f"{rate(here['gpu_decode_samples_per_s'] * scale)} {unit} per GPU before the "
           f"decode's own GPU time; on the host it needs "
           f"{here['host_cores_needed_per_gpu']:.1f} cores per GPU at this rate)"
           if here["input_bound"] else "")
        + (Text(f"; memory per GPU {memory_total(here['memory_per_gpu'])}")
           + (styled(" [bold red](does not fit)[/]") if here["memory_per_gpu"].get("fits") is False
              else "") + memory_parts(here["memory_per_gpu"])
           if here.get("memory_per_gpu") else "") + ".")
    if (here.get("memory_per_gpu") or {}).get("fits") is False and tokens_per_sample and not tp:
        console.print("It does not fit at this scale, and more data-parallel GPUs do not shrink "
                      "a GPU's activations: --activation-checkpointing keeps only the blocks' "
                      "inputs, a smaller --batch-size fewer of them, and for gpt and its "
                      "presets --tp N (tensor and sequence parallel inside the node) or --cp "
                      "N (each sequence over N GPUs) splits them N ways.", style="yellow")
    if tokens_per_sample and here.get("memory_per_gpu") and (mem_record := describe_memory()):
        console.print(mem_record, style="yellow")  # (validate_memory.py's published peaks)
    if here.get("memory_per_gpu") and (full := describe_memory_pressure(here["memory_per_gpu"])):
        console.print(full, style="yellow")  # (the published runs that filled their GPUs)
    if cp:  # what the one published context-parallel run says (or that none has checked it)
        console.print(describe_context_parallel(), style="yellow")
    if ep:
        console.print(describe_expert_parallel(), style="yellow")
    if comm.get("kvstore") and (kv_record := describe_kvstore()):  # (fit_kvstore.py's runs)
        console.print(kv_record, style="yellow")
    tp_record = describe_tensor_parallel() if tp else None
    if tp_record:  # what the published tensor-parallel runs say of this model (validate_tp.py)
        console.print(tp_record, style="yellow")
    crowded = here.get("loader_processes_per_core")
    if crowded and crowded > 1:
        console.print(f"The loaders' workers outnumber the node's cores {crowded:.1f} to 1: the "
                      "training processes wait for a core every step, which this prediction "
                      "does not charge (5-10% a step measured with 2 decode threads a core, "
                      "benchmarks/README.md); fewer --loader-workers or decoding on the GPU "
                      "avoids it.", style="yellow")
    table = Table(title="Scaling, same per-GPU batch", title_justify="left", header_style="bold")
    per = "tokens/s" if tokens_per_sample else "/s"
    for col in ("GPUs", "nodes", f"per GPU {per}", f"total {per}", "efficiency", "exposed comm",
                "slowest GPU", "limit"):
        table.add_column(col, justify="left" if col == "limit" else "right")
    for row in curve:
        table.add_row(f"{row['gpus']:,}", f"{row['nodes']:,}",
                      rate(row["per_gpu_samples_per_s"] * scale),
                      rate(row["total_samples_per_s"] * scale), f"{row['scaling_efficiency']:.1%}",
                      seconds(row["exposed_comm_s"]), seconds(row["straggler_s"]),
                      row["limited_by"])
    console.print(table)
    _print_record(record, console)
    if band:
        console.print(f"Read through that record, {here['scaling_efficiency']:.1%} of one GPU on "
                      f"{here['gpus']:,} GPUs is {band[0]:.1%}-{band[1]:.1%} (the middle half of "
                      "the published runs' ratios).")


def render_measurement(m, console: Console | None = None, top: int = 25) -> None:
    """Measured beside predicted, per kernel, largest measured first."""
    console = console or new_console()
    t = m.totals()
    table = Table(title=f"Measured on {m.device} (median of {m.steps} steps) vs predicted for "
                        f"{m.analysis.device.display_name}", title_justify="left",
                  header_style="bold")
    for col, just in (("layer", "left"), ("op", "left"), ("phase", "left"), ("kind", "left"),
                      ("predicted", "right"), ("measured", "right"), ("measured/predicted", "right"),
                      ("share", "right")):
        table.add_column(col, justify=just, overflow="fold")
    rows = sorted(zip(m.analysis.predictions, m.measured_s), key=lambda pm: -pm[1])[:top]
    for p, measured in rows:
        ratio = f"{measured / p.time_s:.2f}x" if p.time_s else ""
        table.add_row(p.cost.module or "(model)", p.cost.op, p.cost.phase, p.cost.kind,
                      seconds(p.time_s), seconds(measured), ratio,
                      f"{measured / t['measured_s']:.1%}" if t["measured_s"] else "")
    console.print(table)
    kinds = ", ".join(f"{k} {v['measured_s'] / v['predicted_s']:.2f}x"
                      for k, v in t["by_kind"].items() if v["predicted_s"] > 0)
    console.print(
        styled("[bold]Measured[/]") + f" {seconds(t['measured_s'])} in costed kernels "
        f"(+{seconds(t['free_ops_s'])} in view/metadata ops) vs predicted {seconds(t['predicted_s'])}: "
        f"{t['measured_over_predicted']:.2f}x; by kind: {kinds}. Time-weighted median per-kernel "
        f"error {t['weighted_median_abs_error']:.0%}. Measured {t['measured_samples_per_s']:,.1f} "
        "samples/s (kernel time only).")
    classes = sorted(((k, v) for k, v in t.get("by_class", {}).items()
                      if v["predicted_s"] > 0 and v["measured_s"] >= 0.02 * t["measured_s"]),
                     key=lambda kv: -kv[1]["measured_s"])
    if classes:
        console.print(styled("[bold]By class[/]") + " (measured/predicted; memory classes: "
                      "bandwidth achieved, the model's): " + ", ".join(
                          f"{k} {v['measured_s'] / v['predicted_s']:.2f}x"
                          + (f" ({si(v['achieved_bytes_per_s'], 'B/s')}, "
                             f"{si(v['model_bytes_per_s'], 'B/s')})"
                             if v.get("achieved_bytes_per_s") else "")
                          for k, v in classes) + ".")


def _record_cell(record: dict | None) -> str | Text:
    """The comparison table's track-record cell: the workload's class where it has 3 runs or
    more, else the device's; yellow where the whole line is flagged systematic."""
    if not record:
        return "-"
    s = record["workload"] if (record["workload"] or {}).get("rows", 0) >= 3 else record["device"]
    if not s:
        return "none published"
    cell = f"{s['rows']} runs, median {s['median']:.2f}x"
    return Text(cell, style="yellow") if record["systematic"] else cell


def render_comparison(analyses: list, console: Console | None = None) -> list[dict]:
    """One model, several devices: predicted step, throughput, what bounds it, the top fix."""
    console = console or new_console()
    cfg = analyses[0].config
    table = Table(title=f"{cfg.model}, batch {analyses[0].batch_size}, {cfg.dtype}, "
                        f"{'train' if cfg.train else 'inference'}: the same kernels on each device",
                  title_justify="left", header_style="bold")
    for col in ("device", "predicted step", "samples/s", "vs first", "memory-bound time",
                "biggest predicted saving", "track record (pred/meas)"):
        table.add_column(col, justify="left" if col in ("device", "biggest predicted saving")
                         else "right", overflow="fold")
    rows = []
    base = analyses[0].totals()["predicted_time_s"]
    for a in analyses:
        t = a.totals()
        best = max(a.findings, key=lambda f: f.saving_s, default=None)
        record = a.track_record()
        rows.append({"device": a.device.name, "attention_kernel": a.config.attention_kernel,
                     "predicted_time_s": t["predicted_time_s"],
                     "samples_per_s": t["samples_per_s"],
                     "memory_bound_time_share": t["memory_bound_time_share"],
                     "top_finding": best.rule if best else None,
                     "top_saving_s": best.saving_s if best else 0.0,
                     "track_record": record})
        table.add_row(a.device.display_name, seconds(t["predicted_time_s"]),
                      f"{t['samples_per_s']:,.0f}", f"{base / t['predicted_time_s']:.2f}x",
                      f"{t['memory_bound_time_share']:.0%}",
                      f"{best.rule} ({seconds(best.saving_s)})" if best else "-",
                      _record_cell(record))
    console.print(table)
    return rows
