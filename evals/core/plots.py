"""Figures of the eval results (matplotlib, headless), drawn the same way everywhere so a paper can use them.

Conventions: context length on a log2 axis with plain tick labels (``8k``, ``16k``, not ``2^13``); the
trained context (dashed) and the target length (dotted) marked; one fixed colour per strategy (by its
registration order, so ``yarn`` has the same colour in every figure of every run and report; variants of
one strategy, e.g. two factors, differ by line style; the unscaled reference on top, dashed, hollow markers); 95%
intervals as bands; heatmaps with a labelled
colour bar, the trials behind each cell, and one colour scale across the panels compared; a length figure's legend
outside the plotted data, to its right. Each function
returns a figure; the output sink (``Output.figure``) writes it as ``<name>.png`` and ``<name>.svg``.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

STYLES = ("-", "--", ":", "-.")
# a length figure's legend: right of the plot, never over the lines and bands (loc="best" put it on the bands)
REFERENCE_Z = 3.5  # the unscaled line: above the other lines and bands (2), the legend stays above it (5)
OUTSIDE = dict(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def pyplot():
    """matplotlib's pyplot, headless (Agg), imported on first use: loading the evals does not import matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def strategy_colour(name: str):
    """The fixed colour of a strategy: black for ``none``, else by its place in rope_ext's registry (tab20's
    dark shades first, then its light ones)."""
    import rope_ext

    if name in (None, "none"):
        return "black"
    palette = pyplot().get_cmap("tab20").colors
    names = [n for n in rope_ext.STRATEGIES if n != "none"]
    index = names.index(name) if name in names else len(names) + sum(map(ord, str(name))) % 7
    half = len(palette) // 2
    return palette[2 * (index % half) + (index // half) % 2]


def length_label(length: int) -> str:
    """``16384`` -> ``16k``, ``12288`` -> ``12k``, ``1000`` -> ``1000``: a tick a reader takes in at a glance."""
    return f"{length // 1024}k" if length >= 1024 and length % 1024 == 0 else str(length)


def length_axis(ax, lengths, trained: int | None = None, target: int | None = None) -> None:
    """Log2 length axis, ticks at the lengths measured, the trained context and the target marked."""
    from matplotlib import ticker

    ax.set_xscale("log", base=2)
    ticks = sorted(set(lengths))
    if ticks:
        ax.set_xticks(ticks, [length_label(L) for L in ticks])
        ax.xaxis.set_minor_locator(ticker.NullLocator())
    if trained:
        ax.axvline(trained, color="grey", linestyle="--", linewidth=1, label=f"trained {length_label(trained)}")
    if target and target != trained:
        ax.axvline(target, color="black", linestyle=":", linewidth=1.2, label=f"target {length_label(target)}")


@dataclass
class Curve:
    """One line of a length figure: a job's values of a metric by length."""

    label: str
    strategy: str  # the registered strategy name (its colour)
    rows: list  # [{"length": L, <y>: value, <band low>, <band high>}]
    reference: dict = field(default_factory=dict)  # {L: the unscaled value the verdict compares L with}


def _styles(curves: list[Curve]) -> list[tuple]:
    """(colour, line style) per curve: the strategy's colour; its variants in other line styles."""
    seen: dict[str, int] = {}
    styles = []
    for curve in curves:
        n = seen.get(curve.strategy, 0)
        seen[curve.strategy] = n + 1
        styles.append((strategy_colour(curve.strategy), STYLES[n % len(STYLES)]))
    return styles


def length_figure(
    curves: list[Curve],
    y: str,
    *,
    ylabel: str,
    title: str,
    band: tuple[str, str] | None = None,
    logy: bool = False,
    ylim=None,
    trained: int | None = None,
    target: int | None = None,
    ratio: dict | None = None,
):
    """A metric against context length, one line per curve, with an interval band where the rows have one.
    ``ratio`` ({"label", "limit"}) adds a lower panel: each value over the unscaled reference the verdict
    compares it with (the same length up to ``trained``, the trained context beyond), the verdict's limit
    drawn, so a reader sees where a strategy passes."""
    from matplotlib import ticker

    plt = pyplot()

    with_ratio = ratio is not None and any(c.reference for c in curves)
    fig, axes = plt.subplots(
        2 if with_ratio else 1,
        1,
        figsize=(9.5, 6.4 if with_ratio else 4.6),  # the legend to the right of the plot
        sharex=True,
        squeeze=False,
        gridspec_kw={"height_ratios": [2.2, 1]} if with_ratio else None,
    )
    ax = axes[0][0]
    lengths = []
    for curve, (colour, style) in zip(curves, _styles(curves)):
        rows = [r for r in curve.rows if r.get(y) is not None]
        x = [r["length"] for r in rows]
        lengths += x
        # the unscaled reference on top of the strategies (drawn first, it vanished under them up to the trained
        # context, where they agree with it), dashed with hollow markers so the lines beneath show through
        line = dict(marker="o", markersize=4, linewidth=1.5, color=colour, linestyle=style)
        if curve.strategy in (None, "none"):
            line.update(zorder=REFERENCE_Z, linestyle="--" if style == "-" else style, markerfacecolor="white")
        ax.plot(x, [r[y] for r in rows], label=curve.label, **line)
        if band and any(r.get(band[0]) is not None for r in rows):  # where a row has no interval, a gap
            nan = float("nan")
            ax.fill_between(
                x,
                [nan if r.get(band[0]) is None else r[band[0]] for r in rows],
                [nan if r.get(band[1]) is None else r[band[1]] for r in rows],
                color=colour,
                alpha=0.15,
                linewidth=0,
            )
        if with_ratio and curve.reference:
            pairs = [
                (r["length"], r[y] / curve.reference[r["length"]]) for r in rows if curve.reference.get(r["length"])
            ]
            axes[1][0].plot([p[0] for p in pairs], [p[1] for p in pairs], **line)
    length_axis(ax, lengths, trained, target)
    values = [r[y] for c in curves for r in c.rows if r.get(y)]
    if logy and values and max(values) > 2 * min(values):  # a log axis only where the values span a factor of 2
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ticker.LogFormatter(labelOnlyBase=False))
        ax.yaxis.set_minor_formatter(ticker.LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
    if ylim:
        ax.set_ylim(*ylim)
    ax.set(ylabel=ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="major")
    ax.legend(**OUTSIDE)
    if with_ratio:
        low = axes[1][0]
        low.axhline(1.0, color="grey", linewidth=0.8)
        low.axhline(ratio["limit"], color="red", linestyle="--", linewidth=1, label=f"verdict limit {ratio['limit']:g}")
        length_axis(low, lengths)
        for mark, style in ((trained, "--"), (target, ":")):
            if mark:
                low.axvline(mark, color="grey" if style == "--" else "black", linestyle=style, linewidth=1)
        low.set(ylabel=ratio["label"])
        low.grid(alpha=0.3)
        low.legend(**OUTSIDE)
    axes[-1][0].set(xlabel="context length (tokens)")
    fig.tight_layout()
    return fig


def task_heatmap(grid, lengths, tasks, *, title: str, trained: int | None = None, samples: int | None = None):
    """Scores 0-100 as a heatmap: rows = tasks (RULER's, and their average), columns = lengths, cells annotated."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 + 0.9 * len(lengths)), 1.2 + 0.36 * len(tasks)))
    title = f"{title} ({samples} samples per cell)" if samples else title
    image = _heatmap_on(
        ax,
        grid,
        lengths,
        list(tasks),
        title,
        trained,
        vmax=100,
        ylabel=None,
        wrap=48,
        fontsize=9,
        cell=lambda value: "" if value != value else f"{value:.0f}",
    )
    fig.colorbar(image, ax=ax, fraction=0.046, label="score (0-100)")
    fig.tight_layout()
    return fig


def line_plot(
    series: dict[str, tuple[list, list]],
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    logx: bool = False,
    logy: bool = False,
    vline: float | None = None,
    vlabel: str = "",
):
    """One figure with a line per series {label: (x, y)}; an optional vertical marker (e.g. trained length)."""
    from matplotlib import ticker

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, (x, y) in series.items():
        ax.plot(x, y, marker="o" if len(x) <= 32 else None, markersize=4, linewidth=1.4, label=label)
    if vline is not None:
        ax.axvline(vline, color="grey", linestyle="--", linewidth=1, label=vlabel)
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.set_title(title, fontsize=10)
    if logx:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: length_label(int(v))))
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _heatmap_on(
    ax,
    grid,
    lengths,
    rows: list[str],
    title,
    trained,
    *,
    vmax: float = 1,
    ylabel: str | None = "needle depth",
    xlabel: str | None = "context length (* beyond trained)",
    wrap: int = 28,
    fontsize: int = 8,
    cell=lambda value: f"{value:.2f}",
):
    """grid[row][length] on ``ax`` (scale 0..vmax, red to green), each cell annotated with ``cell(value)``."""
    image = ax.imshow(grid, vmin=0, vmax=vmax, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(lengths)), [f"{length_label(L)}{'*' if trained and L > trained else ''}" for L in lengths])
    ax.set_yticks(range(len(rows)), rows)
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            ax.text(j, i, cell(value), ha="center", va="center", fontsize=8)
    if xlabel:
        ax.set(xlabel=xlabel)
    if ylabel:
        ax.set(ylabel=ylabel)
    ax.set_title(textwrap.fill(title, wrap), fontsize=fontsize)
    return image


def heatmaps(
    panels: list[tuple[str, list[list[float]], list[int], list[float], int | None]],
    *,
    trials: int | None = None,
    label: str = "accuracy",
):
    """Accuracy heatmaps side by side on one colour scale, one panel per (title, grid[depth][length], lengths,
    depths, trained); ``trials`` per cell said in the figure's title."""
    plt = pyplot()

    width = sum(max(2.6, 1.2 + 0.9 * len(p[2])) for p in panels)
    height = 2.0 + 0.5 * max(len(p[3]) for p in panels)
    # constrained layout keeps every label inside the figure and off the neighbouring panel; the axis labels are
    # said once (a per-panel x label wider than its panel ran into the next one's, a y label into the previous)
    fig, axes = plt.subplots(1, len(panels), figsize=(width + 1.0, height), squeeze=False, layout="constrained")
    for k, (ax, (title, grid, lengths, depths, trained)) in enumerate(zip(axes[0], panels)):
        image = _heatmap_on(ax, grid, lengths, [f"{d:.2f}" for d in depths], title, trained, xlabel=None)
        if k:
            ax.set_ylabel("")
    fig.colorbar(image, ax=axes[0].tolist(), fraction=0.046, label=f"{label} (one scale, 0-1)")
    said = f"; {trials} trial{'s' if trials != 1 else ''} per cell" if trials else ""
    fig.supxlabel(f"context length (* beyond trained){said}", fontsize=9)
    return fig


def heatmap(grid, lengths, depths, *, title: str, trained: int | None = None, trials: int | None = None):
    """One accuracy heatmap: rows = depths, columns = lengths, cells annotated."""
    return heatmaps([(title, grid, lengths, depths, trained)], trials=trials)


def matrix_heatmaps(panels: list[tuple[str, list[list[float]]]], *, xlabel: str, ylabel: str, suptitle: str = ""):
    """Side-by-side heatmaps of matrices {title: grid[row][column]}, each with its own colour scale, centred
    on 0 when it holds both signs (blue below, red above)."""
    plt = pyplot()

    import numpy as np

    rows = max(len(grid) for _, grid in panels)
    columns = max(max((len(r) for r in grid), default=1) for _, grid in panels)
    fig, axes = plt.subplots(
        1, len(panels), figsize=(1.6 + (1.2 + 0.35 * columns) * len(panels), 1.6 + 0.22 * rows), squeeze=False
    )
    for ax, (title, grid) in zip(axes[0], panels):
        values = np.array(grid, dtype=float)
        finite = values[np.isfinite(values)]
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        if low < 0 < high:
            bound = max(-low, high)
            image = ax.imshow(values, cmap="RdBu_r", vmin=-bound, vmax=bound, aspect="auto")
        else:
            image = ax.imshow(values, cmap="viridis", aspect="auto")
        ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
        fig.colorbar(image, ax=ax, fraction=0.046)
    if suptitle:
        fig.suptitle(suptitle)
    fig.tight_layout()
    return fig
