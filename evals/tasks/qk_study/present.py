"""Presenting for ``eval=qk_study``: the tables and figures of what :mod:`evals.tasks.qk_study.measure` found.

- the score profiles binned over log-spaced distances (the ``qk_profiles`` table and the curves the profile
  figures draw);
- figures: per-layer x head heatmaps (locality, mean-field locality, mu_q.mu_k, the k bias's share), the score
  profiles of the most local and most global heads (measured and mean-field, the model's frequencies and the
  job's scaling), frequency usage per rotary pair (Barbero et al. 2024, arXiv 2410.06205), and the conjecture's
  claims as scatter plots;
- :func:`write_outputs`: every table and figure of the job, in the order the eval writes them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
import math

from rope_ext.strategies import analysis

from ...core.plots import matrix_heatmaps, pyplot
from .measure import Layer

if TYPE_CHECKING:
    import torch


def _edges(limit: int, bins: int) -> list[int]:
    import torch

    edges = sorted({0, 1, *(int(round(x)) for x in torch.logspace(0, math.log10(limit), bins + 1).tolist())})
    return [e for e in edges if e < limit] + [limit]


def _binned(profile: torch.Tensor, edges: list[int], weights: torch.Tensor | None = None) -> list[list[float | None]]:
    """(H, D) profile -> per head, the (weighted) mean over each [edges[j], edges[j+1]) within D."""
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        out.append(
            analysis.window_mean(profile, lo, hi, weights).tolist() if lo < profile.shape[-1] else [None] * len(profile)
        )
    return [list(column) for column in zip(*out)]


def profile_rows(layers: list[Layer], edges: list[int]) -> tuple[list[dict], dict]:
    rows, curves = [], {}
    centres = [math.sqrt(max(lo, 0.5) * hi) if lo else 0 for lo, hi in zip(edges[:-1], edges[1:])]
    for layer in layers:
        binned = {
            f"{kind}_{name}": _binned(profile, edges, layer.profiles["counts"] if kind == "empirical" else None)
            for kind in ("empirical", "mean_field")
            for name, profile in layer.profiles[kind].items()
        }
        for h in range(len(layer.heads)):
            curves[(layer.index, h)] = {key: values[h] for key, values in binned.items()}
            for j, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
                rows.append(
                    {
                        "layer": layer.index,
                        "head": h,
                        "distance_from": lo,
                        "distance_to": hi,
                        "distance": centres[j],
                        **{key: values[h][j] for key, values in binned.items()},
                    }
                )
    return rows, {"centres": centres, "curves": curves}


def profile_figure(heads: list[dict], curves: dict, title: str, trained: int, tokens: int, strategy: str):
    plt = pyplot()

    fig, axes = plt.subplots(1, len(heads), figsize=(4.2 * len(heads), 3.6), squeeze=False)
    styles = {
        "empirical_none": ("C0", "-", "measured, none"),
        "empirical_strategy": ("C3", "-", f"measured, {strategy}"),
        "mean_field_none": ("C0", "--", "mean field, none"),
        "mean_field_strategy": ("C3", "--", f"mean field, {strategy}"),
    }
    for ax, head in zip(axes[0], heads):
        data = curves["curves"][(head["layer"], head["head"])]
        for key, (colour, style, label) in styles.items():
            if key in data:
                points = [(x, y) for x, y in zip(curves["centres"], data[key]) if y is not None and x > 0]
                ax.plot(
                    [x for x, _ in points], [y for _, y in points], color=colour, linestyle=style, label=label, lw=1.3
                )
        ax.axvline(trained, color="grey", linestyle=":", lw=1, label=f"trained {trained}")
        ax.axvline(tokens, color="grey", linestyle="-.", lw=0.8, label=f"captured {tokens}")
        ax.set_xscale("log")
        ax.set(
            title=f"layer {head['layer']} head {head['head']}: locality {head['locality']:.2f}",
            xlabel="distance (tokens)",
            ylabel="score (logits)",
        )
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def energy_figure(layers: list[Layer], trained: int, title: str):
    import torch

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4.2))
    groups: dict = {}
    for layer in layers:
        groups.setdefault((layer.layer_type, layer.base), []).append(layer)
    for g, ((layer_type, base), members) in enumerate(groups.items()):
        for layer in members:
            ax.plot(layer.wavelength, layer.usage.mean(0), color=f"C{g}", alpha=0.15, lw=0.8)
        mean = torch.stack([layer.usage.mean(0) for layer in members]).mean(0)
        label = f"{layer_type or 'all layers'} (base {base:g}), mean of {len(members)} layers"
        ax.plot(members[0].wavelength, mean, color=f"C{g}", lw=2, label=label)
    ax.axvline(trained, color="grey", linestyle="--", lw=1, label=f"trained context {trained}")
    ax.set_xscale("log")
    ax.set(xlabel="wavelength 2π/θ of the rotary pair (tokens)", ylabel="share of q·k energy", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def claims_figure(heads: list[dict], title: str):
    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    colours = [h["layer"] for h in heads]
    for ax, key, xlabel in (
        (axes[0], "mean_dot", "mean-field score at distance 0, μq·μk (logits)"),
        (axes[1], "locality_meanfield", "mean-field locality (logits)"),
    ):
        points = ax.scatter([h[key] for h in heads], [h["locality"] for h in heads], c=colours, cmap="viridis", s=14)
        ax.axhline(0, color="grey", lw=0.8)
        ax.axvline(0, color="grey", lw=0.8)
        ax.set(xlabel=xlabel, ylabel="measured locality (logits)")
        ax.grid(alpha=0.3)
    fig.colorbar(points, ax=axes.tolist(), label="layer")
    fig.suptitle(title)
    return fig


def _grid(layers: list[Layer], key: str) -> list[list[float]]:
    width = max(len(layer.heads) for layer in layers)
    return [
        [float("nan") if row.get(key) is None else row[key] for row in layer.heads]
        + [float("nan")] * (width - len(layer.heads))
        for layer in layers
    ]


def write_outputs(
    output,
    cfg,
    layers: list[Layer],
    heads: list[dict],
    tables: dict,
    title: str,
    trained: int,
    max_distance: int,
    label: str,
) -> None:
    """The job's tables (``qk_heads``, ``qk_layers``, ``qk_pairs``, ``qk_profiles``, ``qk_strategies``,
    ``qk_dimensions``) and figures through ``output``; ``tables``: the layer, strategy and dimension rows."""
    edges = _edges(max_distance, cfg.bins)
    rows, curves = profile_rows(layers, edges)
    output.table("qk_heads", heads)
    output.table("qk_layers", tables["layers"])
    output.table("qk_pairs", [row for layer in layers for row in layer.pairs])
    output.table("qk_profiles", rows)
    output.table("qk_strategies", tables["strategies"])
    output.table("qk_dimensions", tables["dimensions"])
    output.figure(
        "qk_heatmaps",
        matrix_heatmaps(
            [
                ("measured locality (logits)", _grid(layers, "locality")),
                ("mean-field locality", _grid(layers, "locality_meanfield")),
                ("μq·μk (logits)", _grid(layers, "mean_dot")),
                *(
                    [("share of μk that is the k bias", _grid(layers, "bias_share_k"))]
                    if heads[0].get("bias_share_k") is not None
                    else []
                ),
            ],
            xlabel="head",
            ylabel="layer",
            suptitle=title,
        ),
    )
    ranked = sorted(heads, key=lambda h: h["locality"])
    k = min(cfg.plot_heads, len(ranked))
    output.figure(
        "qk_profiles_local",
        profile_figure(ranked[::-1][:k], curves, f"Most local heads: {title}", trained, cfg.tokens, label),
    )
    output.figure(
        "qk_profiles_global",
        profile_figure(ranked[:k], curves, f"Most global heads: {title}", trained, cfg.tokens, label),
    )
    output.figure("qk_energy", energy_figure(layers, trained, f"Frequency usage (Barbero et al.): {title}"))
    output.figure("qk_claims", claims_figure(heads, f"Does the q/k mean predict the decay? {title}"))
