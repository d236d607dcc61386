"""PNG plots of the eval results (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def line_plot(path: Path, series: dict[str, tuple[list, list]], *, xlabel: str, ylabel: str, title: str,
              logx: bool = False, logy: bool = False, vline: float | None = None, vlabel: str = "") -> Path:
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
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def heatmap(path: Path, grid: list[list[float]], lengths: list[int], depths: list[float], *, title: str,
            trained: int | None = None) -> Path:
    """Accuracy heatmap: rows = depths, columns = lengths, cells annotated with their value."""
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(lengths), 1.2 + 0.5 * len(depths)))
    image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(lengths)), [f"{L}{'*' if trained and L > trained else ''}" for L in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:.2f}" for d in depths])
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=8)
    ax.set(xlabel="context length (tokens; * beyond trained)", ylabel="needle depth", title=title)
    fig.colorbar(image, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
