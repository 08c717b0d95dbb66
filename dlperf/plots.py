"""Pictures of results (PNG, matplotlib's Agg backend, written atomically).

matplotlib is a dependency, but pictures are a courtesy: every function returns None instead of
failing when it cannot draw, so no run or benchmark is ever lost to a plotting problem.
"""

from __future__ import annotations

import csv
from pathlib import Path

from dlperf.files import write_atomic


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display), or None when it cannot be imported."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_figure(fig, path: str | Path) -> Path:
    """Save ``fig`` as PNG atomically (files.write_atomic: temp file, fsync, rename)."""
    return write_atomic(path, lambda f: fig.savefig(f, format="png"), binary=True)


def bar_chart(path: str | Path, names: list[str], values: list[float], labels: list[str],
              xlabel: str, colors: list[str] | None = None, headroom: float = 1.25,
              goals: tuple[float, ...] = ()) -> Path | None:
    """The one horizontal bar chart of dlperf's benchmarks: a bar per name (top to bottom) with
    its label at the bar's end, optional goal lines; None when matplotlib cannot draw."""
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(8.5, 0.45 * len(names) + 1.4), dpi=120)
    bars = ax.barh(names, values, color=colors or "#1f77b4")
    for bar, label in zip(bars, labels):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {label}",
                va="center", fontsize=8)
    for goal in goals:
        ax.axvline(goal, color="#d62728", ls="--", lw=1)
        ax.text(goal, -0.6, f" goal {goal:,.0f}", color="#d62728", fontsize=8)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.tick_params(axis="y", labelsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max([*values, *goals]) * headroom)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return Path(path)


def predicted_vs_measured(path: str | Path, points: list[tuple[str, float, float, bool]],
                          xlabel: str, ylabel: str, title: str, band: float = 0.15
                          ) -> Path | None:
    """The validation scatter: (group, measured, predicted, clean) points, log-log, one colour
    per group, flagged points hollow, the identity line and +-``band`` dotted; beside it the
    same points as predicted / measured against measured, where a few percent show (on the
    log-log scatter they vanish into the diagonal). More than ten groups take tab20's colours
    (the default cycle repeats after ten) and a legend outside the axes."""
    plt = pyplot()
    if plt is None or not points:
        return None
    groups = sorted({p[0] for p in points})
    colours = (plt.get_cmap("tab20").colors if len(groups) > 10
               else [f"C{i}" for i in range(10)])
    fig, (ax, ratio) = plt.subplots(1, 2, figsize=(14.5, 5.6))
    for i, group in enumerate(groups):
        colour = colours[i % len(colours)]
        for clean in (True, False):
            pts = [p for p in points if p[0] == group and p[3] == clean]
            if not pts:
                continue
            style = {"s": 22, "facecolors": colour if clean else "none", "edgecolors": colour}
            ax.scatter([p[1] for p in pts], [p[2] for p in pts],
                       label=group + ("" if clean else " (flagged)"), **style)
            ratio.scatter([p[1] for p in pts], [p[2] / p[1] for p in pts], **style)
    lo = min(min(p[1], p[2]) for p in points) * 0.8
    hi = max(max(p[1], p[2]) for p in points) * 1.25
    for k, style in ((1.0, "-"), (1 + band, ":"), (1 / (1 + band), ":")):
        ax.plot([lo, hi], [lo * k, hi * k], "k" + style, lw=0.8)
        ratio.axhline(k, color="k", ls=style, lw=0.8)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel=xlabel,
           ylabel=ylabel, title=title)
    ratio.set(xscale="log", yscale="log", xlim=(lo, hi), xlabel=xlabel,
              ylabel="predicted / measured", title=f"the same, as a ratio (dotted: +-{band:.0%})")
    from matplotlib.ticker import FormatStrFormatter  # (ratios as 0.9, 1, 1.2: not 10^0)

    ratio.yaxis.set_major_formatter(FormatStrFormatter("%.2g"))
    ratio.yaxis.set_minor_formatter(FormatStrFormatter("%.2g"))
    fig.legend(*ax.get_legend_handles_labels(), loc="center left", bbox_to_anchor=(0.83, 0.5),
               fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0, 0.83, 1))
    save_figure(fig, path)
    plt.close(fig)
    return Path(path)


def ladder_chart(result: dict, path: str | Path) -> Path | None:
    """`dlperf bench train`: img/s per rung, with the speed-up over the baseline and the MFU."""
    rungs = result["rungs"]
    labels = [f"{r['img_per_s']:,.1f} ({r['speedup_vs_baseline']:.2f}x"
              + (f", MFU {r['mfu']:.0%})" if r.get("mfu") is not None else ")") for r in rungs]
    return bar_chart(path, [r["rung"] for r in rungs], [r["img_per_s"] for r in rungs], labels,
                     f"training images/s on {result.get('device', '?')} (median step; one "
                     "change per rung)", headroom=1.45)


def read_epochs_csv(path: str | Path) -> list[dict]:
    """Rows of a run's epochs.csv as floats (blank cells dropped), the last row of each epoch
    kept (a resumed run may have redone one)."""
    rows: dict[int, dict] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            values = {}
            for key, text in row.items():
                try:
                    values[key] = float(text)
                except (TypeError, ValueError):
                    continue
            if "epoch" in values:
                rows[int(values["epoch"])] = values
    return [rows[k] for k in sorted(rows)]


def training_curves(rows: list[dict], path: str | Path, title: str = "") -> Path | None:
    """A run's epochs: train loss, eval top-1/top-5, learning rate, throughput."""
    plt = pyplot()
    if plt is None or not rows:
        return None
    epochs = [r["epoch"] + 1 for r in rows]

    def series(key):
        return [(e, r[key]) for e, r in zip(epochs, rows) if key in r]

    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 2, figsize=(9, 6), dpi=110)
    panels = [(axes[0][0], ["loss"], "train loss (mean over applied steps)"),
              (axes[0][1], ["top1", "top5"], "eval accuracy"),
              (axes[1][0], ["lr"], "learning rate at epoch end"),
              (axes[1][1], ["img_per_s"], "images/s (cumulative)")]
    for ax, keys, label in panels:
        drawn = 0
        for key in keys:
            points = series(key)
            if points:
                ax.plot(*zip(*points), marker="o", ms=3, label=key)
                drawn += 1
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("epoch", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=8)
        if len(keys) > 1 and drawn:
            ax.legend(fontsize=8)
    axes[0][1].set_ylim(0, 1.02)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return Path(path)
