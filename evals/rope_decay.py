"""Analytic RoPE studies for the configured strategy on the model's own RoPE geometry; no weights needed.

- Long-distance decay (Su et al. 2021, RoFormer, arXiv 2104.09864, section 3.4.3): q^T R_r k against
  distance r for q = k = ones, and for Gaussian q, k with the configured means and std (Barbero et al.
  2024, arXiv 2410.06205, showed zero-mean q, k show no decay); the curve's decay strength and where it
  first rises again (``rope_ext.analysis``). Compared with the unscaled RoPE of the same model.
- Base bound (Su 2024, kexue.fm/archives/10122; Men et al. 2024, arXiv 2405.14591): the smallest base
  keeping sum_i cos(m theta_i) >= 0 for all m < L, per context L, against the model's base.
- Per-dimension table of the strategy: wavelength, lambda/L, factor and regime of every pair.

The geometry is that of the rotary slots the strategy scales (on Gemma-3: the global layers, base 1e6),
read from the model's config; ``eval.head_dim`` / ``eval.base`` override it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

import rope_ext
from rope_ext import analysis

from .core.config import option
from .core.errors import UserError, scaling_errors_as_user_errors
from .core.plots import line_plot
from .core.registry import register_eval


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
    seed: int = 0
    bound_contexts: List[int] = option([1024, 2048, 4096, 8192, 16384, 32768], minimum=1, nonempty=True)


def check_config(cfg, job) -> None:
    if cfg.head_dim is not None and cfg.head_dim % 2:
        raise RopeDecayError(f"eval.head_dim={cfg.head_dim} must be even (RoPE rotates pairs of dimensions)")
    labels = []
    for k, vec in enumerate(cfg.vectors):
        if "label" not in vec or set(vec) - {"label", "q_mean", "k_mean", "std"}:
            raise RopeDecayError(f"eval.vectors[{k}]={dict(vec)} needs a label and only q_mean, k_mean, std")
        if vec.get("std", 1.0) is not None and not vec.get("std", 1.0) > 0:
            raise RopeDecayError(f"eval.vectors[{k}].std={vec.get('std')} must be > 0")
        labels.append(vec["label"])
    if len(set(labels)) != len(labels):
        raise RopeDecayError(f"eval.vectors labels {labels} must be distinct")
    for shape in geometries(cfg, job):
        with scaling_errors_as_user_errors():
            job.scaling.frequencies(shape[1], shape[2], cfg.max_distance)


def geometries(cfg, job) -> list[tuple[str | None, int, float]]:
    """(layer type, rotary dim, base) of each distinct geometry the strategy scales, overrides applied."""
    shapes = job.scaled if job.scaled else job.model.shapes
    found = {(s.dim, s.base): s.layer_type for s in shapes}
    return [(layer, cfg.head_dim or dim, float(cfg.base or base)) for (dim, base), layer in found.items()]


def study(cfg, ctx, layer_type: str | None, dim: int, base: float, suffix: str) -> dict:
    trained = ctx.trained_context
    strategies = {"none": rope_ext.resolve({"name": "none"}), ctx.scaling.label: ctx.scaling}
    curves, rows, summary = {}, [], {f"rotary_dim{suffix}": dim, f"base{suffix}": base}
    for label, scaling in strategies.items():
        inv_freq, attention = scaling.frequencies(dim, base, seq_len=cfg.max_distance)
        for vec in cfg.vectors:
            vec = dict(vec)
            score = analysis.decay_curve(inv_freq, cfg.max_distance, q_mean=vec.get("q_mean"), k_mean=vec.get("k_mean"),
                                         std=vec.get("std", 1.0), attention_factor=attention, seed=cfg.seed)
            key = f"{label}/{vec['label']}"
            summary[f"decay_strength/{key}{suffix}"] = analysis.decay_strength(score)
            summary[f"first_rise/{key}{suffix}"] = analysis.first_rise(score)
            step = max(1, cfg.max_distance // 2048)
            curves[key] = (list(range(0, cfg.max_distance, step)), (score[::step] / score.abs().max()).tolist())
            rows += [{"strategy": label, "vectors": vec["label"], "distance": d, "score": float(score[d])}
                     for d in range(0, cfg.max_distance, step)]
    ctx.output.table(f"rope_decay{suffix}", rows)
    for vec in cfg.vectors:
        name = vec["label"]
        ctx.output.figure(f"rope_decay_{name}{suffix}", line_plot(
            {k: v for k, v in curves.items() if k.endswith(f"/{name}")}, xlabel="relative distance",
            ylabel="score / max |score|", title=f"RoPE long-distance decay, d={dim}, base={base:g} ({name})",
            vline=trained, vlabel="trained"))
    bounds = [{"context": L, "rotary_dim": dim, "base_lower_bound": analysis.base_lower_bound(dim, L), "model_base": base}
              for L in cfg.bound_contexts]
    for row in bounds:
        row["model_base_ok"] = base >= row["base_lower_bound"]
    ctx.output.table(f"base_bound{suffix}", bounds)
    supported = [r["context"] for r in bounds if r["model_base_ok"]]
    summary[f"base_bound_max_context{suffix}"] = max(supported) if supported else None
    inv_freq, _ = ctx.scaling.frequencies(dim, base, seq_len=None)
    table = analysis.dimension_table(inv_freq, base, trained)
    ctx.output.table(f"dimensions{suffix}", table)
    for regime in ("extrapolated", "blended", "interpolated"):
        summary[f"pairs_{regime}{suffix}"] = sum(r["regime"] == regime for r in table)
    return summary


@register_eval("rope_decay", config=RopeDecayConfig, error=RopeDecayError, check=check_config, needs=("geometry",))
def evaluate(cfg, ctx) -> dict:
    """Decay curves, base bound and per-dimension table of the strategy on the model's RoPE geometry."""
    summary = {}
    shapes = geometries(cfg, ctx.job)
    for layer_type, dim, base in shapes:
        suffix = f"_{layer_type}" if len(shapes) > 1 and layer_type else ""
        summary.update(study(cfg, ctx, layer_type, dim, base, suffix))
    ctx.output.metrics("rope_decay", summary)
    return summary
