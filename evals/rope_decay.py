"""Analytic RoPE studies of the seed notes, for the configured strategy; no model weights needed.

- Long-distance decay (seeds 000 and 002): q^T R_r k against distance r for q = k = ones and for
  Gaussian q, k with the configured means and std; the curve's decay strength and where it first
  rises again (``rope_ext.analysis``). Compared with the unscaled RoPE of the same model.
- Base bound (seed 004; Su 2024; Men et al. 2024): the smallest base keeping sum_i cos(m theta_i) >= 0
  for all m < L, per context L, against the model's base.
- Per-dimension table of the strategy: wavelength, lambda/L, factor and regime of every pair.
"""

from __future__ import annotations

import rope_ext
from rope_ext import analysis

from .plots import line_plot


def evaluate(cfg, ctx) -> dict:
    dim, base = ctx.rope_geometry()
    dim, base = cfg.head_dim or dim, float(cfg.base or base)
    trained = ctx.trained_context
    strategies = {"none": {"name": "none"}, ctx.scaling_label: ctx.scaling}
    curves, rows, summary = {}, [], {"rotary_dim": dim, "base": base}
    for label, scaling in strategies.items():
        inv_freq, attention = rope_ext.frequencies(scaling, dim, base, seq_len=cfg.max_distance)
        for vec in cfg.vectors:
            vec = dict(vec)
            score = analysis.decay_curve(
                inv_freq, cfg.max_distance, q_mean=vec.get("q_mean"), k_mean=vec.get("k_mean"),
                std=vec.get("std", 1.0), attention_factor=attention, seed=cfg.seed,
            )
            key = f"{label}/{vec['label']}"
            summary[f"decay_strength/{key}"] = analysis.decay_strength(score)
            summary[f"first_rise/{key}"] = analysis.first_rise(score)
            step = max(1, cfg.max_distance // 2048)
            curves[key] = (list(range(0, cfg.max_distance, step)), (score[::step] / score.abs().max()).tolist())
            rows += [{"strategy": label, "vectors": vec["label"], "distance": d, "score": float(score[d])}
                     for d in range(0, cfg.max_distance, step)]
    ctx.results.table("rope_decay", rows)
    for vec in cfg.vectors:
        name = vec["label"]
        line_plot(ctx.results.dir / f"rope_decay_{name}.png",
                  {k: v for k, v in curves.items() if k.endswith(f"/{name}")},
                  xlabel="relative distance", ylabel="score / max |score|",
                  title=f"RoPE long-distance decay, d={dim}, base={base:g} ({name})", vline=trained, vlabel="trained")

    bounds = [{"context": L, "rotary_dim": dim, "base_lower_bound": analysis.base_lower_bound(dim, L), "model_base": base}
              for L in cfg.bound_contexts]
    for row in bounds:
        row["model_base_ok"] = base >= row["base_lower_bound"]
    ctx.results.table("base_bound", bounds)
    supported = [r["context"] for r in bounds if r["model_base_ok"]]
    summary["base_bound_max_context"] = max(supported) if supported else None

    inv_freq, _ = rope_ext.frequencies(ctx.scaling, dim, base, seq_len=None)
    table = analysis.dimension_table(inv_freq, base, trained)
    ctx.results.table("dimensions", table)
    for regime in ("extrapolated", "blended", "interpolated"):
        summary[f"pairs_{regime}"] = sum(r["regime"] == regime for r in table)
    ctx.results.update("metrics", {"rope_decay": summary})
    ctx.tracker.summary(summary)
    ctx.tracker.table("rope_decay/base_bound", bounds, line=("context", "base_lower_bound"))
    ctx.tracker.table("rope_decay/dimensions", table)
    return summary
