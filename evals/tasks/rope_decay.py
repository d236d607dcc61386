"""Analytic RoPE studies for the configured strategy on the model's RoPE geometry; no weights needed.

- Long-distance decay (Su et al. 2021, RoFormer, arXiv 2104.09864, section 3.4.3): E[q^T R_r k] against
  distance r, exactly (``rope_ext.strategies.analysis.expected_decay``): for q = k = ones, and for Gaussian q, k with
  the configured means and std, whose mean curve is the all-ones curve times mu_q * mu_k (Barbero et al.
  2024, arXiv 2410.06205: zero means, no decay) with a spread that does not depend on r. Log-scale
  distance, the unscaled RoPE of the same model beside the strategy, trained and target lengths marked;
  the decay strength, where the curve first rises again, and the decay's signal-to-noise ratio.
- Base bound (Su 2024, kexue.fm/archives/10122; Men et al. 2024, arXiv 2405.14591): the smallest base
  keeping sum_i cos(m theta_i) >= 0 for all m < L, as a curve over L (log-log) beside Men et al.'s published
  points (head dim 128) and power-law fit, with the model's base and the strategy's effective base
  (the base of plain RoPE with the same slowest frequency) marked. The bound is computed at the model's head dim
  and its own lengths (doublings from trained/4 to the longest of trained and target; ``eval.bound_contexts``
  overrides them); bounds are cached per (dim, L).
- Per-dimension table and plot of the strategy: wavelength, lambda/L, factor and regime of every pair
  (``removed``: theta = 0, p-RoPE), and the largest angle the pair turns through at the largest relative
  position a query of ``max_distance`` tokens sees, over the largest it turned through in training (> 1:
  angles never trained). A query-scaling strategy (log-n) changes no frequency: its query factor at
  lengths around the trained one is reported instead.
- Attention-level strategies (Self-Extend, DCA, ReRoPE, STRING, LM-Infinite: ``rope_ext.strategies.attention_level``): their
  effective relative-position map (the position each (query, key) pair sees, as a heatmap over a sequence
  of ``max_distance`` tokens, and for its last query against distance), and the expected decay that query
  sees: the curve at the mapped positions (gaps where a pair is not attended, LM-Infinite), times the
  rule's query factor (ReRoPE's log n) and cos/sin factor squared (STRING).

The geometry is that of the rotary slots the strategy scales (on Gemma-3: the global layers, base 1e6),
read from the model's config; ``eval.head_dim`` / ``eval.base`` override it.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, List, Optional

import rope_ext
from rope_ext.strategies import analysis

from ..core.files import cache_dir, read_cache, write_cache
from ..core.config.fields import option
from ..core.errors import UserError, scaling_errors_as_user_errors
from ..core.plots import pyplot
from ..core.registry import register_eval

if TYPE_CHECKING:
    import torch

# Men et al. 2024 (arXiv 2405.14591), head dim 128: published lower bounds (Table 1) and the figure's fit
MEN_ET_AL_POINTS = {1024: 4.3e3, 4096: 2.7e4, 32768: 6.4e5}
MEN_ET_AL_FIT = (0.0424, 1.628)  # base >= 0.0424 * L^1.628


class RopeDecayError(UserError):
    pass


@dataclass
class RopeDecayConfig:
    name: str = "rope_decay"
    head_dim: Optional[int] = option(None, minimum=2)  # None: the scaled slots' rotary dimension
    base: Optional[float] = option(None, above=1)  # None: the scaled slots' base
    max_distance: int = option(65536, minimum=128)
    vectors: List[Any] = field(
        default_factory=lambda: [
            {"label": "ones"},
            {"label": "gauss_mean0", "q_mean": 0.0, "k_mean": 0.0, "std": 1.0},
            {"label": "gauss_mean1", "q_mean": 1.0, "k_mean": 1.0, "std": 1.0},
            {"label": "gauss_opposite", "q_mean": 1.0, "k_mean": -1.0, "std": 1.0},
        ]
    )
    points: int = option(256, minimum=16)  # distances per curve in the table and figures (log-spaced)
    # None: the model's own lengths, doublings from trained/4 up to the longest of trained and target (bound_contexts)
    bound_contexts: Optional[List[int]] = option(None, minimum=1, nonempty=True)


def check_config(cfg, job) -> None:
    if cfg.head_dim is not None and cfg.head_dim % 2:
        raise RopeDecayError(f"eval.head_dim={cfg.head_dim} must be even (RoPE rotates pairs of dimensions)")
    labels = []
    for k, vec in enumerate(cfg.vectors):
        if "label" not in vec or set(vec) - {"label", "q_mean", "k_mean", "std"}:
            raise RopeDecayError(f"eval.vectors[{k}]={dict(vec)} needs a label and only q_mean, k_mean, std")
        if not vec.get("std", 1.0) > 0:
            raise RopeDecayError(f"eval.vectors[{k}].std={vec.get('std')} must be > 0")
        labels.append(vec["label"])
    if len(set(labels)) != len(labels):
        raise RopeDecayError(f"eval.vectors labels {labels} must be distinct")
    for _, dim, base in geometries(cfg, job):
        with scaling_errors_as_user_errors():
            job.scaling.frequencies(dim, base, cfg.max_distance)


def geometries(cfg, job) -> list[tuple[str | None, int, float]]:
    """(layer type, rotary dim, base) of each distinct geometry the strategy scales, overrides applied."""
    slots = job.scaled if job.scaled else job.model.slots
    found = {(s.dim, s.base): s.layer_type for s in slots}
    return [(layer, cfg.head_dim or dim, float(cfg.base or base)) for (dim, base), layer in found.items()]


def bound_contexts(cfg, trained: int, target: int | None) -> list[int]:
    """The contexts the base bound is computed at: ``eval.bound_contexts``, else the model's own lengths -- doublings
    from trained/4 up to the longest of the trained context and the target (a bound search at a length the model
    never runs, or at another head dim, took minutes and said nothing of this model)."""
    if cfg.bound_contexts:
        return sorted(set(cfg.bound_contexts))
    longest, contexts = max(trained, target or 0), []
    context = max(1, trained // 4)
    while context < longest:
        contexts.append(context)
        context *= 2
    return [*contexts, longest]


def base_bounds(dim: int, contexts: list[int]) -> dict[int, float]:
    """The base lower bound per context, computed once per (dim, context) on this machine."""
    path = cache_dir() / "base_bounds.json"
    known = read_cache(path, _bounds, "base lower bounds") or {}
    found, new = {}, False
    for L in contexts:
        key = f"{dim}/{L}"
        if key not in known:
            print(
                f"rope_decay: the base lower bound at head dim {dim} and {L} tokens: the smallest RoPE base keeping "
                f"sum_i cos(m theta_i) >= 0 up to {L} (Men et al. 2024), computed once, then cached in {path}",
                file=sys.stderr,
                flush=True,
            )
            known[key], new = analysis.base_lower_bound(dim, L), True
        found[L] = known[key]
    if new:
        write_cache(path, json.dumps(known, indent=1, sort_keys=True))
    return found


def _bounds(path) -> dict[str, float]:
    """The cached bounds: {"<dim>/<context>": base}, else an error (damaged)."""
    known = json.loads(path.read_text())
    if not isinstance(known, dict) or not all(isinstance(v, (int, float)) for v in known.values()):
        raise ValueError("not a {dim/context: base} mapping")
    return known


def log_distances(max_distance: int, points: int) -> torch.Tensor:
    import torch

    return torch.unique(torch.logspace(0, math.log10(max_distance - 1), points).round().long())


def target_length(scaling, trained: int) -> int | None:
    factor = scaling.params.get("factor") if scaling.name != "none" else None
    return int(trained * factor) if factor and factor > 1 else None


def decay_figure(curves: dict, vectors: list, trained: int, target: int | None, title: str):
    """One panel per q/k distribution; one line (mean) and band (+/- 1 sd) per strategy; log distance."""
    plt = pyplot()

    fig, axes = plt.subplots(1, len(vectors), figsize=(4.2 * len(vectors), 3.6), squeeze=False)
    for ax, vec in zip(axes[0], vectors):
        for label, by_vector in curves.items():
            x, mean, sd = by_vector[vec["label"]]
            (line,) = ax.plot(x, mean, linewidth=1.3, label=label)
            if any(sd):
                ax.fill_between(
                    x,
                    [m - s for m, s in zip(mean, sd)],
                    [m + s for m, s in zip(mean, sd)],
                    color=line.get_color(),
                    alpha=0.15,
                    linewidth=0,
                )
        ax.axvline(trained, color="grey", linestyle="--", linewidth=1, label=f"trained {trained}")
        if target:
            ax.axvline(target, color="black", linestyle=":", linewidth=1, label=f"target {target}")
        ax.set_xscale("log")
        ax.set(
            xlabel="relative distance r",
            title=vec["label"]
            + (
                "" if "q_mean" not in vec else f" (mu_q={vec['q_mean']}, mu_k={vec['k_mean']}, s={vec.get('std', 1.0)})"
            ),
        )
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("E[q . R_r k]  (band: +/- 1 sd)")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def bound_figure(bounds: dict[int, float], dim: int, marks: dict[str, float]):
    """The base lower bound over context length (log-log), the published points (d=128, whatever the model's
    head dim: their values are constants, no d=128 search is run), and bases marked."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    contexts = sorted(bounds)
    ax.plot(contexts, [bounds[L] for L in contexts], marker="o", label=f"lower bound, d={dim} (this run)")
    published = [L for L in sorted(MEN_ET_AL_POINTS) if contexts[0] / 2 <= L <= contexts[-1] * 2]
    ax.scatter(
        published,
        [MEN_ET_AL_POINTS[L] for L in published],
        marker="^",
        color="black",
        zorder=3,
        label="Men et al. 2024, d=128 (published)",
    )
    a, k = MEN_ET_AL_FIT
    ax.plot(
        contexts, [a * L**k for L in contexts], color="black", linewidth=0.8, alpha=0.5, label=f"their fit {a}·L^{k}"
    )
    for (label, base), color in zip(marks.items(), ("tab:green", "tab:red")):
        ax.axhline(base, linestyle=":", linewidth=1.4, color=color, label=f"{label}: {base:.3g}")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="context length L",
        ylabel="smallest base with sum cos(m theta) >= 0",
        title="RoPE base lower bound (Men et al. 2024)",
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def dimension_figure(table: list[dict], trained: int, title: str):
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.plot([r["wavelength"] for r in table], [r["factor"] for r in table], marker=".")
    ax.axvline(trained, color="grey", linestyle="--", linewidth=1, label=f"trained {trained}")
    ax.set(
        xscale="log",
        xlabel="wavelength of the pair (tokens, unscaled)",
        ylabel="theta / theta' (interpolation)",
        title=title,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def seen_positions(rule, length: int, distances: torch.Tensor):
    """The relative position the last query of a ``length``-token sequence sees at each distance (float64),
    whether it attends there, and the rule's factor on that query's scores (query factor x cos/sin factor^2)."""
    import torch

    last = torch.tensor(length - 1)
    position, seen = rule.relative(last, last - distances)
    factor = rule.rotary_scale**2 * (float(rule.query_scale(last)) if rule.query_scale is not None else 1.0)
    return position, seen, factor


def map_figure(rule, length: int, trained: int, title: str, grid: int = 256):
    """Left: the relative position each (query m, key n) pair sees, over L, on a grid (white: not attended).
    Right: what the last query sees against its distance to the key, beside plain RoPE."""
    import torch

    plt = pyplot()

    points = torch.linspace(0, length - 1, grid).round().long()
    position, seen = rule.relative(points[:, None], points[None, :])
    shown = (position / trained).masked_fill(~seen, float("nan")).numpy()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.5, 4.2))
    image = left.imshow(shown, origin="upper", extent=(0, length, length, 0), cmap="viridis", interpolation="nearest")
    fig.colorbar(image, ax=left, label="relative position seen / trained L")
    left.set(xlabel="key position n", ylabel="query position m", title="position each pair sees")
    left.tick_params(axis="x", labelrotation=30)
    distance = torch.arange(length)
    last, attended, _ = seen_positions(rule, length, distance)
    right.plot(distance[attended], last[attended], linewidth=1.2, label=rule.name)
    right.plot([0, length], [0, length], color="grey", linewidth=0.8, linestyle=":", label="plain RoPE")
    right.axhline(trained, color="grey", linestyle="--", linewidth=1, label=f"trained {trained}")
    right.set(xlabel="distance m - n (last query)", ylabel="relative position seen", title="the last query")
    right.grid(alpha=0.3)
    right.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def largest_position(scaling, length: int, queries: int = 512) -> float:
    """The largest relative position any of ``queries`` evenly spread queries (the last among them) of a
    ``length``-token sequence sees: length - 1 without an attention-level rule."""
    import torch

    rule = scaling.position_rule()
    if rule is None:
        return float(length - 1)
    best = 0.0
    for m in torch.linspace(0, length - 1, queries).round().long().unique().tolist():
        position, seen = rule.relative(torch.tensor(m), torch.arange(m + 1))
        best = max(best, float(position[seen].max()))
    return best


def study(cfg, ctx, dim: int, base: float, suffix: str) -> dict:
    import torch

    trained = ctx.trained_context
    target = target_length(ctx.scaling, trained)
    strategies = {"none": rope_ext.resolve({"name": "none"}), ctx.scaling.label: ctx.scaling}
    dense, sampled = torch.arange(cfg.max_distance), log_distances(cfg.max_distance, cfg.points)
    curves, rows, summary = {}, [], {f"rotary_dim{suffix}": dim, f"base{suffix}": base}
    for label, scaling in strategies.items():
        inv_freq, attention = scaling.frequencies(dim, base, seq_len=cfg.max_distance)
        rule = scaling.position_rule()
        dense_at, dense_seen, sampled_at, sampled_seen, factor = dense.double(), None, sampled.double(), None, 1.0
        if rule is not None:  # the positions the last query sees, its factor on the scores
            dense_at, dense_seen, factor = seen_positions(rule, cfg.max_distance, dense)
            sampled_at, sampled_seen, _ = seen_positions(rule, cfg.max_distance, sampled)
        curves[label] = {}
        for vec in cfg.vectors:
            vec = dict(vec)
            moments = dict(
                q_mean=vec.get("q_mean"),
                k_mean=vec.get("k_mean"),
                std=vec.get("std", 1.0),
                attention_factor=attention * math.sqrt(factor),
            )
            mean, _ = analysis.expected_decay(inv_freq, dense_at, **moments)
            if dense_seen is not None and not bool(dense_seen.all()):
                mean = mean[: int((~dense_seen).nonzero()[0])]  # strength and rise over the first attended distances
            key = f"{label}/{vec['label']}"
            flat = float(mean.abs().max()) == 0
            summary[f"decay_strength/{key}{suffix}"] = 0.0 if flat else analysis.decay_strength(mean)
            summary[f"first_rise/{key}{suffix}"] = None if flat else analysis.first_rise(mean)
            at, sd = analysis.expected_decay(inv_freq, sampled_at, **moments)
            if sampled_seen is not None:  # gaps where the pair is not attended
                at = at.masked_fill(~sampled_seen, float("nan"))
            if float(sd[0]) > 0:  # how far the decay stands out of the noise of one q, k draw
                summary[f"decay_snr/{key}{suffix}"] = float((mean[:64].mean() - mean[-len(mean) // 4 :].mean()) / sd[0])
            curves[label][vec["label"]] = (sampled.tolist(), at.tolist(), sd.tolist())
            rows += [
                {
                    "strategy": label,
                    "vectors": vec["label"],
                    "distance": int(d),
                    "position_seen": float(p),
                    "mean": None if math.isnan(m) else float(m),
                    "sd": float(s),
                }
                for d, p, m, s in zip(sampled, sampled_at, at.tolist(), sd)
            ]
    ctx.output.table(f"rope_decay{suffix}", rows)
    title = f"{ctx.title}: d={dim}, base={base:g}"
    ctx.output.figure(
        f"rope_decay_plot{suffix}", decay_figure(curves, [dict(v) for v in cfg.vectors], trained, target, title)
    )

    bounds = base_bounds(dim, bound_contexts(cfg, trained, max(target or 0, ctx.job.target or 0) or None))
    inv_freq, _ = ctx.scaling.frequencies(dim, base, seq_len=None)
    effective = analysis.lowest_frequency_base(inv_freq)
    rows = [
        {
            "context": L,
            "rotary_dim": dim,
            "base_lower_bound": bounds[L],
            "model_base": base,
            "model_base_ok": base >= bounds[L],
            "effective_base": effective,
            "effective_base_ok": None if effective is None else effective >= bounds[L],
        }
        for L in sorted(bounds)
    ]
    ctx.output.table(f"base_bound{suffix}", rows)
    marks = {
        "model base": base,
        **({f"{ctx.scaling.label} effective base": effective} if effective and ctx.scaling.name != "none" else {}),
    }
    ctx.output.figure(f"base_bound_plot{suffix}", bound_figure(bounds, dim, marks))
    supported = [r["context"] for r in rows if r["model_base_ok"]]
    summary[f"base_bound_max_context{suffix}"] = max(supported) if supported else None
    summary[f"effective_base{suffix}"] = effective
    supported = [r["context"] for r in rows if r["effective_base_ok"]]
    summary[f"effective_base_max_context{suffix}"] = max(supported) if supported else None

    table = analysis.dimension_table(inv_freq, base, trained)
    reach = largest_position(ctx.scaling, cfg.max_distance)
    summary[f"max_relative_position{suffix}"] = reach
    for row, scaled, theta in zip(table, inv_freq.double(), rope_ext.default_inv_freq(dim, base).double()):
        # angle turned at the largest position seen over the angle turned in training (each capped at a full turn)
        trained_angle = min(float((trained - 1) * theta), 2 * math.pi)
        row["max_relative_position"] = reach
        row["angle_over_trained"] = min(reach * float(scaled), 2 * math.pi) / trained_angle if trained_angle else None
    summary[f"pairs_unseen_angles{suffix}"] = sum((r["angle_over_trained"] or 0) > 1.001 for r in table)  # 0.1% slack
    ctx.output.table(f"dimensions{suffix}", table)
    ctx.output.figure(
        f"dimensions_plot{suffix}", dimension_figure(table, trained, f"{ctx.scaling.label} per pair, {title}")
    )
    for regime in ("extrapolated", "blended", "interpolated", "removed"):
        summary[f"pairs_{regime}{suffix}"] = sum(r["regime"] == regime for r in table)
    rule = ctx.scaling.position_rule()
    if rule is not None:
        ctx.output.figure(f"position_map{suffix}", map_figure(rule, cfg.max_distance, trained, title))
    if ctx.scaling.scales_query:  # log-n style: not a frequency change; the query factor by length instead
        lengths = torch.tensor([trained // 2, trained, 2 * trained, 4 * trained, 16 * trained])
        factors = ctx.scaling.query_factors(lengths - 1)
        summary.update({f"query_factor@{int(L)}{suffix}": float(f) for L, f in zip(lengths, factors)})
    return summary, curves


def report_figures(name: str, jobs: list[dict], label) -> dict:
    """The report's section: the expected decay of every strategy of the runs (one line each; ``none`` once)
    per q/k distribution."""
    curves, vectors, trained, target = {}, [], None, None
    for job in jobs:
        metrics = (job.get("metrics") or {}).get(name) or {}
        for studied in (metrics.get("studied") or {}).values():
            for strategy, by_vector in studied["curves"].items():
                key = f"none (d={studied['dim']}, base={studied['base']:g})" if strategy == "none" else label(job)
                curves.setdefault(key, by_vector)
                vectors = vectors or [{"label": v} for v in by_vector]
            trained, target = trained or metrics.get("trained_context"), target or metrics.get("target_length")
    return (
        {"decay": decay_figure(curves, vectors, trained, target, "Expected RoPE decay, every strategy")}
        if curves
        else {}
    )


@register_eval(
    "rope_decay",
    config=RopeDecayConfig,
    error=RopeDecayError,
    check=check_config,
    needs=("geometry",),
    report=report_figures,
)
def evaluate(cfg, ctx) -> dict:
    """Expected decay curves, base bound and per-dimension table of the strategy on the model's RoPE geometry."""
    summary, studied = {}, {}
    shapes = geometries(cfg, ctx.job)
    for layer_type, dim, base in shapes:
        suffix = f"_{layer_type}" if len(shapes) > 1 and layer_type else ""
        found, curves = study(cfg, ctx, dim, base, suffix)
        summary.update(found)
        studied[suffix or "all"] = {"dim": dim, "base": base, "curves": curves}
    ctx.output.metrics(
        "rope_decay",
        {
            **summary,
            "studied": studied,
            "trained_context": ctx.trained_context,
            "target_length": target_length(ctx.scaling, ctx.trained_context),
        },
    )
    return summary
