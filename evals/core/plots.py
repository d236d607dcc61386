"""Figures of the eval results (matplotlib, headless). Each function returns a figure; the output sink
(``Output.figure``) writes it as ``<name>.png`` and sends it to the tracker under the same name."""

from __future__ import annotations

import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def task_heatmap(grid, lengths, tasks, *, title: str, trained: int | None = None):
    """Scores 0-100 as a heatmap: rows = tasks (RULER's, and their average), columns = lengths, cells annotated."""
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 + 0.9 * len(lengths)), 1.2 + 0.36 * len(tasks)))
    image = _heatmap_on(ax, grid, lengths, list(tasks), title, trained, vmax=100, ylabel=None, wrap=48, fontsize=9,
                        cell=lambda value: "" if value != value else f"{value:.0f}")
    fig.colorbar(image, ax=ax, fraction=0.046)
    fig.tight_layout()
    return fig


def line_plot(series: dict[str, tuple[list, list]], *, xlabel: str, ylabel: str, title: str,
              logx: bool = False, logy: bool = False, vline: float | None = None, vlabel: str = ""):
    """One figure with a line per series {label: (x, y)}; an optional vertical marker (e.g. trained length)."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, (x, y) in series.items():
        ax.plot(x, y, marker="o" if len(x) <= 32 else None, markersize=4, linewidth=1.4, label=label)
    if vline is not None:
        ax.axvline(vline, color="grey", linestyle="--", linewidth=1, label=vlabel)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _heatmap_on(ax, grid, lengths, rows: list[str], title, trained, *, vmax: float = 1, ylabel: str | None = "needle depth",
                wrap: int = 28, fontsize: int = 8, cell=lambda value: f"{value:.2f}"):
    """grid[row][length] on ``ax`` (scale 0..vmax, red to green), each cell annotated with ``cell(value)``."""
    image = ax.imshow(grid, vmin=0, vmax=vmax, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(lengths)), [f"{L}{'*' if trained and L > trained else ''}" for L in lengths])
    ax.set_yticks(range(len(rows)), rows)
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            ax.text(j, i, cell(value), ha="center", va="center", fontsize=8)
    ax.set(xlabel="context length (* beyond trained)")
    if ylabel:
        ax.set(ylabel=ylabel)
    ax.set_title(textwrap.fill(title, wrap), fontsize=fontsize)
    return image


def heatmaps(panels: list[tuple[str, list[list[float]], list[int], list[float], int | None]]):
    """Accuracy heatmaps side by side, one panel per (title, grid[depth][length], lengths, depths, trained)."""
    width = sum(max(2.6, 1.2 + 0.9 * len(p[2])) for p in panels)
    height = 1.4 + 0.5 * max(len(p[3]) for p in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(width, height), squeeze=False)
    for ax, (title, grid, lengths, depths, trained) in zip(axes[0], panels):
        image = _heatmap_on(ax, grid, lengths, [f"{d:.2f}" for d in depths], title, trained)
    fig.colorbar(image, ax=axes[0].tolist(), fraction=0.046)
    return fig


def heatmap(grid, lengths, depths, *, title: str, trained: int | None = None):
    """One accuracy heatmap: rows = depths, columns = lengths, cells annotated."""
    return heatmaps([(title, grid, lengths, depths, trained)])


def length_figure(curves: list[tuple[str, list[dict], int | None]], y: str, *, ylabel: str, title: str,
                  band: tuple[str, str] | None = None, logy: bool = False, ylim=None):
    """A metric against context length (log2 axis), one line per (label, rows, trained length); an interval
    band from the rows' ``band`` columns where every row has them; the trained lengths marked."""
    fig, ax = plt.subplots(figsize=(8, 4.6))
    for label, rows, _ in curves:
        rows = [r for r in rows if r.get(y) is not None]
        x = [r["length"] for r in rows]
        line, = ax.plot(x, [r[y] for r in rows], marker="o", markersize=4, linewidth=1.4, label=label)
        if band and any(r.get(band[0]) is not None for r in rows):  # where a row has no interval, a gap
            nan = float("nan")
            ax.fill_between(x, [nan if r.get(band[0]) is None else r[band[0]] for r in rows],
                            [nan if r.get(band[1]) is None else r[band[1]] for r in rows], color=line.get_color(),
                            alpha=0.18, linewidth=0)
            ax.errorbar([xi for xi, r in zip(x, rows) if r.get(band[0]) is not None],
                        [r[y] for r in rows if r.get(band[0]) is not None],
                        yerr=[[r[y] - r[band[0]] for r in rows if r.get(band[0]) is not None],
                              [r[band[1]] - r[y] for r in rows if r.get(band[0]) is not None]],
                        fmt="none", ecolor=line.get_color(), capsize=3, linewidth=1)
    for trained in sorted({t for *_, t in curves if t}):
        ax.axvline(trained, color="grey", linestyle="--", linewidth=1, label=f"trained {trained}")
    ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    if ylim:
        ax.set_ylim(*ylim)
    ax.set(xlabel="context length (tokens)", ylabel=ylabel, title=title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def matrix_heatmaps(panels: list[tuple[str, list[list[float]]]], *, xlabel: str, ylabel: str, suptitle: str = ""):
    """Side-by-side heatmaps of matrices {title: grid[row][column]}, each with its own colour scale, centred
    on 0 when it holds both signs (blue below, red above)."""
    import numpy as np

    rows = max(len(grid) for _, grid in panels)
    columns = max(max((len(r) for r in grid), default=1) for _, grid in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(1.6 + (1.2 + 0.35 * columns) * len(panels), 1.6 + 0.22 * rows),
                             squeeze=False)
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
