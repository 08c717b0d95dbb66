"""The benchmarks' tables for the console (`dlperf bench ...`): what each result shows a person,
kept beside the benchmarks rather than in the command line code."""

from __future__ import annotations

from rich.table import Table


def table(title: str, columns: tuple[str, ...], rows, left: tuple[str, ...] = ()) -> Table:
    """A left-titled table, numbers right-aligned (the columns named in ``left`` excepted)."""
    out = Table(title=title, title_justify="left")
    for col in columns:
        out.add_column(col, justify="left" if col in left else "right")
    for row in rows:
        out.add_row(*row)
    return out


def data_pipelines(result: dict, console) -> None:
    """`dlperf bench data`: img/s per pipeline and the ratios that matter."""
    for name, rate in result["img_per_s"].items():
        console.print(f"{name:32s} {rate:8,.0f} img/s")
    r = result["ratios"]
    console.print(f"dlperf vs torchvision {r['dlperf_vs_torchvision']:.2f}x; thread scaling "
                  f"{r['thread_scaling']:.2f}x; vs DALI "
                  + (f"{r['dlperf_vs_dali_measured']:.2f}x (measured)" if r["dlperf_vs_dali_measured"]
                     else f"{r['dlperf_vs_dali_notes_anchor']:.2f}x (against DALI's 921 img/s "
                          "measured earlier on this kind of machine; DALI not installed here)"))
    console.print(f"restart markers (lossless rewrite, what `data prepare` stores): "
                  f"{r['restart_markers_vs_raw_folder']:.2f}x the raw folder"
                  + (f", {r['restart_markers_vs_dali_same_files']:.2f}x DALI on the same files"
                     if r["restart_markers_vs_dali_same_files"] else "")
                  + (f"; prepared shards {r['prepared_shards_vs_dali_raw_folder']:.2f}x DALI"
                     if r["prepared_shards_vs_dali_raw_folder"] else ""))
    if r["dlperf_vs_ffcv"]:
        console.print(f"vs FFCV (its own .beton, q90): raw folder {r['dlperf_vs_ffcv']:.2f}x, "
                      f"prepared shards {r['prepared_shards_vs_ffcv']:.2f}x, max-side shards "
                      f"{r['shards_vs_ffcv_same_max_side']:.2f}x FFCV at the same max side")


def data_ladder(result: dict, data: str, console) -> None:
    """`dlperf bench data --ladder`: one speed-up per rung of dlperf's CPU path."""
    console.print(table(f"dlperf CPU path on {data}, one speed-up per rung",
                        ("rung", "img/s", "vs previous", "vs first"),
                        ((r["rung"], f"{r['img_per_s']:,.0f}", f"{r['vs_previous']:.2f}x",
                          f"{r['vs_baseline']:.2f}x") for r in result["rungs"]), left=("rung",)))
    if not result["roi_decoder"]:
        console.print("dlperf's C extension is not built here: the region and restart-marker "
                      "rungs fall back to whole-image decoding")


def train_ladder(result: dict, lcfg, console) -> None:
    """`dlperf bench train`: each rung measured, beside its prediction and MFU."""
    rows = []
    for r in result["rungs"]:
        pred = r["predicted_img_per_s"]
        rows.append((r["rung"], f"{r['img_per_s']:.1f}", f"{r['speedup_vs_baseline']:.2f}x",
                     f"{pred:.1f}" if pred else "-",
                     f"{r['measured_over_predicted']:.2f}" if pred else "-",
                     f"{r['mfu']:.0%}" if r["mfu"] is not None else "-", r["peak_source"]))
    console.print(table(f"{lcfg.model}, batch {lcfg.batch_size}, {lcfg.image_size} px, "
                        f"{result['device']}: training step, one change per rung",
                        ("rung", "img/s", "vs baseline", "predicted", "measured/pred", "MFU",
                         "ceiling"), rows, left=("rung", "ceiling")))


def kernels(result: dict, kind: str, spec_name: str, console) -> None:
    """`dlperf bench gemm|conv`: the error per sweep, then the guide's contrasts."""
    console.print(table(f"dlperf bench {kind}: {result['device']}, {result['dtype']}; "
                        f"predicted with {spec_name}",
                        ("sweep", "points", "median |pred/meas-1|", "max"),
                        ((s["title"], str(s["points"]), f"{s['median_abs_error']:.0%}",
                          f"{s['max_abs_error']:.0%}") for s in result["series"]),
                        left=("sweep",)))
    console.print(table("The guide's contrasts: speed-up of the first over the second",
                        ("contrast", "measured", "predicted"),
                        ((c["contrast"], f"{c['measured_speedup']:.2f}x",
                          f"{c['predicted_speedup']:.2f}x") for c in result["contrasts"]),
                        left=("contrast",)))
