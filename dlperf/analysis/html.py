"""A self-contained HTML report: the roofline plot (inline SVG, no scripts), totals, findings
and the kernel table. Opens offline in any browser; nothing is fetched."""

from __future__ import annotations

import html
import math

from dlperf.analysis.liveness import peak_total
from dlperf.hardware.track_record import (describe_context_parallel,
                                          describe_expert_parallel, describe_kvstore,
                                          describe_memory_pressure, describe_tensor_parallel)
from dlperf.units import gib, seconds, si


# the parts of a GPU's memory at the scale-out (scaling.memory_per_gpu), in the order shown
MEMORY_PARTS = (("weights_bytes", "weights"), ("gradients_bytes", "gradients"),
                ("ddp_bucket_bytes", "DDP's buckets"),
                ("half_gradients_bytes", "bf16 gradients"),
                ("optimizer_state_bytes", "optimizer state"),
                ("gathered_bytes", "gathered parameters"), ("activations_bytes", "activations"))


def memory_parts(memory: dict) -> str:
    """": weights 6.12 GiB, gradients 11.9 GiB, ...": what a GPU's memory at the scale-out is
    made of, the parts it holds (none: ""); under a GiB in MiB."""
    def size(nbytes: float) -> str:
        return gib(nbytes) if nbytes >= 2**30 else f"{nbytes / 2**20:.3g} MiB"

    shown = [f"{name} {size(memory[key])}" for key, name in MEMORY_PARTS if memory.get(key)]
    if "total_bytes" in memory and peak_total(memory) != memory["total_bytes"]:
        # (liveness.with_peak: the activations at the step's busiest moment; the activations
        # are the last part shown, even at rest none)
        if not memory.get("activations_bytes"):
            shown.append("activations 0 B")
        shown[-1] += (f" at rest, {size(memory['activations_peak_bytes'])} at the peak"
                      + (f" ({memory['peak_at']})" if memory.get("peak_at") else ""))
    return f": {', '.join(shown)}" if shown else ""


def memory_total(memory: dict) -> str:
    """"~61.2 GiB at the step's peak (52.5 GiB at rest)": what a GPU needs, judged at the peak
    of its step's tensors (liveness.with_peak) beside the end of the forward's total; one
    figure where the two agree or the peak is not known."""
    total, peak = memory["total_bytes"], peak_total(memory)
    if peak == total:
        return f"~{gib(total)}"
    return f"~{gib(peak)} at the step's peak ({gib(total)} at rest)"


def _record_html(analysis) -> str:
    """dlperf's track record on this GPU (hardware/track_record.py), under the totals."""
    from dlperf.hardware.track_record import describe

    record = describe(analysis.device, analysis.config)
    if not record:
        return ""
    return _record_p(*record)


def _record_p(text: str, warn: bool) -> str:
    """A track record's line: highlighted when it is systematic, grey otherwise."""
    style = "background:#fff3cd;padding:4px" if warn else "color:#555"
    return f'<p class="record" style="{style}">{html.escape(text)}</p>'


def fp8_label(cfg) -> str:
    """', FP8 linear layers (<recipe> scaling)' under --fp8, else ''."""
    fp8 = getattr(cfg, "fp8", None)
    if fp8 in ("tensorwise", "rowwise"):  # torchao's float8 layers (models/float8.py)
        return f", torchao float8 linear layers ({fp8} scaling)"
    return f", FP8 linear layers ({fp8} scaling)" if fp8 else ""


def dtype_label(cfg, spec, fp8: bool = True) -> str:
    """The math the step runs in, as the reports title it: '+tf32' only where the device has
    TF32 (on a V100 or a Turing card torch's allow_tf32 changes nothing: FP32 on CUDA cores);
    the FP8 layers' recipe under --fp8 (``fp8``: False for a caller that places it itself)."""
    fp8 = fp8_label(cfg) if fp8 else ""
    if not cfg.tf32:
        return cfg.dtype + fp8
    return (f"{cfg.dtype} +tf32" if "tf32" in spec.peak
            else f"{cfg.dtype} (no TF32 on this device)") + fp8

W, H, PAD_L, PAD_B, PAD_T, PAD_R = 760, 460, 70, 50, 20, 20
COLORS = {"compute": "#1f77b4", "memory": "#d62728", "none": "#999999"}


def _log_scale(lo: float, hi: float, a: float, b: float):
    llo, lhi = math.log10(lo), math.log10(hi)

    def f(v: float) -> float:
        return a + (math.log10(max(v, lo)) - llo) / (lhi - llo) * (b - a)

    return f


def _frame(fy, y_lo: float, y_hi: float) -> list[str]:
    """An SVG plot's opening, its frame, and the y axis's decades (log scale ``fy``)."""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           'font-family="sans-serif" font-size="11">',
           f'<rect x="{PAD_L}" y="{PAD_T}" width="{W - PAD_L - PAD_R}" '
           f'height="{H - PAD_T - PAD_B}" fill="none" stroke="#888"/>']
    decade = y_lo
    while decade <= y_hi * 1.001:
        y = fy(decade)
        out.append(f'<line x1="{PAD_L}" y1="{y:.1f}" x2="{W - PAD_R}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{PAD_L - 4}" y="{y + 4:.1f}" text-anchor="end">{si(decade)}</text>')
        decade *= 10
    return out


def roofline_svg(analysis) -> str:
    spec = analysis.device
    preds = [p for p in analysis.predictions if p.cost.flops > 0 and p.cost.bytes > 0 and p.time_s]
    units = sorted({p.unit for p in preds} | {"fp32"}, key=lambda u: spec.peak_flops(u) or 0)
    top_peak = max(spec.peak_flops(u) or 0 for u in units)
    xs = [p.intensity for p in preds] or [1.0]
    x_lo = 10 ** math.floor(math.log10(max(min(xs), 1e-2)))
    x_hi = 10 ** math.ceil(math.log10(max(max(xs), spec.ops_per_byte(units[-1]) or 1) * 2))
    y_hi = 10 ** math.ceil(math.log10(top_peak * 1.5))
    achieved = [p.cost.flops / p.time_s for p in preds] or [top_peak / 1e3]
    # Six decades below the top peak is enough: slower kernels (a scalar loss division) sit on
    # the bottom edge instead of squashing the plot.
    y_lo = 10 ** math.floor(math.log10(max(min(min(achieved), x_lo * spec.mem_bandwidth),
                                           top_peak / 1e6)))
    fx = _log_scale(x_lo, x_hi, PAD_L, W - PAD_R)
    fy = _log_scale(y_lo, y_hi, H - PAD_B, PAD_T)
    out = _frame(fy, y_lo, y_hi)
    decade = x_lo
    while decade <= x_hi * 1.001:
        x = fx(decade)
        out.append(f'<line x1="{x:.1f}" y1="{PAD_T}" x2="{x:.1f}" y2="{H - PAD_B}" stroke="#eee"/>'
                   f'<text x="{x:.1f}" y="{H - PAD_B + 14}" text-anchor="middle">{decade:g}</text>')
        decade *= 10
    out.append(f'<text x="{(W + PAD_L) / 2}" y="{H - 12}" text-anchor="middle">arithmetic '
               'intensity (FLOP/byte)</text>'
               f'<text x="16" y="{H / 2}" transform="rotate(-90 16 {H / 2})" '
               'text-anchor="middle">FLOP/s (predicted)</text>')
    for unit in units:  # one roof per math unit: min(peak, intensity x bandwidth)
        peak = spec.peak_flops(unit)
        ridge = peak / spec.mem_bandwidth
        pts = [(x_lo, x_lo * spec.mem_bandwidth), (ridge, peak), (x_hi, peak)]
        path = " ".join(f"{fx(a):.1f},{fy(b):.1f}" for a, b in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="#333" stroke-width="1.5"/>'
                   f'<text x="{W - PAD_R - 4}" y="{fy(peak) - 4:.1f}" text-anchor="end">'
                   f'{unit} peak {si(peak)}FLOP/s, ridge {ridge:.0f} FLOP/B</text>')
    total = sum(p.time_s for p in preds) or 1.0
    for p in sorted(preds, key=lambda p: -p.time_s):
        r = 2 + 10 * math.sqrt(p.time_s / total)
        label = html.escape(f"{p.cost.module or '(model)'} {p.cost.op} {p.cost.phase}: "
                            f"{p.intensity:.3g} FLOP/B, {seconds(p.time_s)}")
        out.append(f'<circle cx="{fx(p.intensity):.1f}" '
                   f'cy="{fy(max(p.cost.flops / p.time_s, y_lo)):.1f}" '
                   f'r="{r:.1f}" fill="{COLORS[p.bound]}" fill-opacity="0.45" '
                   f'stroke="{COLORS[p.bound]}"><title>{label}</title></circle>')
    out.append("</svg>")
    return "".join(out)


def scaling_svg(curve: list[dict]) -> str:
    """`--gpus`: total throughput against GPUs (log-log) with the ideal line, and each point's
    scaling efficiency; points where something other than compute limits the step are red."""
    n = [row["gpus"] for row in curve]
    total = [row["total_samples_per_s"] for row in curve]
    ideal = [curve[0]["per_gpu_samples_per_s"] * g for g in n]
    fx = _log_scale(n[0], n[-1], PAD_L, W - PAD_R)
    y_lo = 10 ** math.floor(math.log10(min(total)))
    y_hi = 10 ** math.ceil(math.log10(max(ideal)))
    fy = _log_scale(y_lo, y_hi, H - PAD_B, PAD_T)
    out = _frame(fy, y_lo, y_hi)
    for g in n:
        out.append(f'<text x="{fx(g):.1f}" y="{H - PAD_B + 14}" text-anchor="middle">{g:,}</text>')
    out.append('<polyline fill="none" stroke="#999" stroke-dasharray="4 3" points="'
               + " ".join(f"{fx(g):.1f},{fy(v):.1f}" for g, v in zip(n, ideal)) + '"/>')
    out.append('<polyline fill="none" stroke="#1f77b4" points="'
               + " ".join(f"{fx(g):.1f},{fy(v):.1f}" for g, v in zip(n, total)) + '"/>')
    for row in curve:
        color = "#1f77b4" if row["limited_by"] == "compute" else "#d62728"
        x, y = fx(row["gpus"]), fy(row["total_samples_per_s"])
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}"><title>'
                   f'{row["gpus"]:,} GPUs: {row["total_samples_per_s"]:,.0f}/s, '
                   f'{row["scaling_efficiency"]:.1%}, limited by {html.escape(row["limited_by"])}'
                   f'</title></circle><text x="{x + 4:.1f}" y="{y + 14:.1f}">'
                   f'{row["scaling_efficiency"]:.0%}</text>')
    out.append(f'<text x="{(W + PAD_L) / 2}" y="{H - 12}" text-anchor="middle">GPUs (same '
               'per-GPU batch)</text>'
               f'<text x="16" y="{H / 2}" transform="rotate(-90 16 {H / 2})" '
               'text-anchor="middle">samples/s, all GPUs (dashed: perfect scaling)</text></svg>')
    return "".join(out)


def render_html(analysis, top: int = 50, scale_out: dict | None = None) -> str:
    """The report; with ``scale_out`` (what `analyze --gpus` computed) also the scaling plot."""
    cfg, spec, t = analysis.config, analysis.device, analysis.totals()
    esc = html.escape
    rows = []
    for p in sorted(analysis.predictions, key=lambda p: -p.time_s)[:top]:
        c = p.cost
        gemm = f"{c.gemm.m}x{c.gemm.n}x{c.gemm.k}" + (f" x{c.gemm.batch}" if c.gemm and
                                                      c.gemm.batch > 1 else "") if c.gemm else ""
        aligned = "" if p.aligned is None else ("yes" if p.aligned else
                                                "no: " + ",".join(p.misaligned).upper())
        rows.append(
            f"<tr><td>{esc(c.module or '(model)')}</td><td>{esc(c.op)}</td><td>{c.phase}</td>"
            f"<td>{gemm}</td><td>{si(c.flops)}</td><td>{si(c.bytes, 'B')}</td>"
            f"<td>{'inf' if math.isinf(p.intensity) else f'{p.intensity:.3g}'}</td>"
            f"<td class='{p.bound}'>{p.bound}</td><td>{p.limited_by}</td><td>{aligned}</td>"
            f"<td>{f'{p.quantization_efficiency:.0%}' if p.quantization else ''}</td>"
            f"<td>{seconds(p.time_s)}</td><td>{p.time_s / t['predicted_time_s']:.1%}</td></tr>")
    findings = "".join(f"<li><b>{esc(f.rule)}</b>: {esc(f.message)}"
                       f"{f' <i>(saves ~{seconds(f.saving_s)} per step)</i>' if f.saving_s > 0 else ''}"
                       "</li>" for f in analysis.findings)
    uncounted = ", ".join(f"{esc(op)} x{n}" for op, n in sorted(analysis.uncounted.items()))
    rate = (f"{t['samples_per_s']:,.0f} samples/s"
            + (f" ({t['tokens_per_s']:,.0f} tokens/s)" if "tokens_per_s" in t else ""))
    title = (f"dlperf analyze: {cfg.model}, batch {cfg.input_shape[0]}, "
             f"{dtype_label(cfg, spec)}{', channels_last' if cfg.channels_last else ''}, "
             f"{'train' if cfg.train else 'inference'} on {spec.display_name}")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #222; }}
table {{ border-collapse: collapse; font-size: 12px; }}
td, th {{ border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: right; }}
td:first-child, td:nth-child(2), td:nth-child(3) {{ text-align: left; }}
.memory {{ color: #d62728; }} .compute {{ color: #1f77b4; }}
.totals span {{ display: inline-block; margin-right: 24px; }}
</style></head><body>
<h2>{esc(title)}</h2>
<p class="totals"><span><b>Predicted step</b> {seconds(t['predicted_time_s'])}</span>
<span><b>{rate}</b></span><span>{si(t['flops'])}FLOP (2 per multiply-add)</span>
<span>{si(t['bytes'], 'B')} moved</span><span>{t['kernels']} kernels</span>
<span>memory-bound time {t['memory_bound_time_share']:.0%}</span></p>
{_record_html(analysis)}
<h3>Roofline</h3>
<p>Each circle is one kernel (area ~ its share of the step; hover for the name); red is
memory-bound, blue compute-bound by the guide's definition (intensity vs the ops:byte ratio).</p>
{roofline_svg(analysis)}
{_scaling_section(scale_out) if scale_out else ''}
<h3>What the guide says to do</h3><ul>{findings or '<li>Nothing above the reporting threshold.</li>'}</ul>
<h3>Top {top} kernels by predicted time</h3>
<table><tr><th>layer</th><th>op</th><th>phase</th><th>GEMM MxNxK</th><th>FLOPs</th><th>bytes</th>
<th>FLOP/B</th><th>bound</th><th>limited by</th><th>TC-aligned</th><th>tile x wave</th><th>time</th>
<th>share</th></tr>
{''.join(rows)}</table>
<p>{('Uncounted ops (no cost rule, not in the totals): ' + uncounted) if uncounted else 'Every op was costed.'}</p>
<p style="color:#888">Model constants and the device's datasheet source are in the JSON
(<code>--json</code>). Predictions are a roofline: max(FLOPs / math rate, bytes / bandwidth) +
launch cost per kernel.</p>
</body></html>
"""


def _scaling_section(scale_out: dict) -> str:
    here = scale_out["at_requested_scale"]
    tp = here["communication"].get("tensor_parallel")
    pipe = here["communication"].get("pipeline")
    cp = here["communication"].get("context_parallel")
    ep = here["communication"].get("expert_parallel")
    ways = here["ranks_per_replica"]
    reference = (f"its {ways} ranks without their collectives"
                 + (" and the pipeline's bubble" if pipe else "") if ways > 1 else "one GPU")
    return (f"<h3>Scale-out</h3><p>On {here['gpus']:,} GPUs"
            + (f" ({ep['ep']}-way expert parallel, "
               f"{ep['alltoalls_per_micro_batch']:,} all-to-alls a micro-batch: "
               f"{ep['exposed_s'] * 1e3:.2f} ms exposed a step)" if ep else "")
            + (f" ({cp['cp']}-way context parallel, K and V by "
               + ("a ring beside the attention kernels" if cp["comm"] == "p2p"
                  else "an all-gather")
               + f": {cp['exposed_s'] * 1e3:.2f} ms exposed a step)" if cp else "")
            + (f" ({tp['tp']}-way tensor parallel in each node"
               + (f"; {tp['beside_gemms']:,} of its collectives a micro-batch beside the "
                  "backward's GEMMs, Megatron's way" if tp.get("beside_gemms") else "")
               + ")" if tp else "")
            + (f" ({pipe['pp']} pipeline stages, {pipe['micro_batches']} micro-batches: "
               f"bubble {pipe['bubble_s'] * 1e3:.2f} ms a step)" if pipe else "")
            + f": {here['per_gpu_samples_per_s']:,.0f} "
            f"samples/s per GPU, {here['total_samples_per_s']:,.0f} in all, "
            f"{here['scaling_efficiency']:.1%} of {reference}; "
            f"{here['exposed_comm_s'] * 1e3:.2f} ms of communication exposed, "
            + (f"{here['contention_s'] * 1e3:.2f} ms of compute slowed beside the hidden rest "
               f"({here['communication']['contention']['sms']} SMs held by NCCL), "
               if here.get("contention_s", 0.0) > 0 else "")
            + f"{here['straggler_s'] * 1e3:.2f} ms waiting for the slowest GPU per step "
            f"(step spread {here['step_cv']:.1%}); limited by "
            f"{html.escape(here['limited_by'])}"
            + (f" (a decode on the GPUs would lift it to "
               f"{here['gpu_decode_samples_per_s']:,.0f} samples/s per GPU; on the host it "
               f"needs {here['host_cores_needed_per_gpu']:.1f} cores per GPU)"
               if here["input_bound"] else "")
            + (f"; memory per GPU {memory_total(m)}"
               + (" (does not fit)" if m.get("fits") is False else "") + memory_parts(m)
               if (m := here.get("memory_per_gpu")) else "")
            + (f". The loaders' workers outnumber the node's cores "
               f"{here['loader_processes_per_core']:.1f} to 1, which this prediction does not "
               "charge" if (here.get("loader_processes_per_core") or 0) > 1 else "")
            + ". Red points: a limit other than compute.</p>"
            + scaling_svg(scale_out["curve"]) + _scale_out_record_html(scale_out)
            + (_record_p(describe_context_parallel(), True) if cp else "")
            + (_record_p(describe_expert_parallel(), True) if ep else "")
            + (_record_p(text, False)
               if here["communication"].get("kvstore") and (text := describe_kvstore()) else "")
            + (_record_p(text, True) if tp and (text := describe_tensor_parallel()) else "")
            + (_record_p(text, True) if (m := here.get("memory_per_gpu"))
               and (text := describe_memory_pressure(m)) else ""))


def _scale_out_record_html(scale_out: dict) -> str:
    """dlperf's record on published multi-GPU runs (hardware/track_record.py), under the plot."""
    record = scale_out.get("track_record")
    if not record:
        return ""
    band = record.get("efficiency_band")
    text = record["text"] + (f" Read through it, the efficiency at this scale is "
                             f"{band[0]:.1%}-{band[1]:.1%}." if band else "")
    return _record_p(text, record["systematic"])

