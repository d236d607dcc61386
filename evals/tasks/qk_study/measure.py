"""Measuring for ``eval=qk_study``: the model's own queries and keys captured in one forward, and the statistics
computed from them (:mod:`evals.tasks.qk_study` says what is studied and why).

- :func:`capture_layers`: every attention layer's q and k exactly as RoPE rotates them, through rope_ext's
  attention hook (``rope_ext.capture``), optionally with the q/k biases ablated (:mod:`evals.core.projection_bias`);
- :func:`study_layer`: per layer x head x rotary pair, mean, variance and energy of q and k; per head the
  empirical (FFT cross-correlation, ``rope_ext.strategies.analysis``) and mean-field relative-position score profiles, with
  the model's frequencies and the job's scaling; locality; the share of q/k energy beyond Liu et al. 2023's
  critical dimension (arXiv 2310.05209) and in the pairs a strategy changes; on a model with q/k biases (Qwen2.5,
  arXiv 2412.15115) how much of the means the biases are;
- :func:`claims`: the conjecture's claims (tinymind blog, 2024-10-13) as rank correlations across heads with
  p-values (scipy);
- the per-layer, per-strategy and per-dimension rows and the summary the eval reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import rope_ext
from rope_ext.strategies import analysis

from ...core import projection_bias as biases
from ...core.scoring.nll import layer_progress

if TYPE_CHECKING:
    import torch


# -- one layer -----------------------------------------------------------------------------------------------


@dataclass
class Layer:
    index: int
    layer_type: str | None
    base: float
    window: int  # the distances this layer can attend to (sliding window or trained context)
    heads: list[dict]
    pairs: list[dict]
    usage: torch.Tensor  # (heads, P) energy share per rotary pair
    wavelength: torch.Tensor  # (P,) of the model's frequencies
    slot: Any
    profiles: dict  # name -> (heads, distances) binned profile rows source
    changed: torch.Tensor  # (P,) bool: pairs the job's scaling changes


def slot_frequencies(slot, width: int, scaling: rope_ext.Scaling | None = None, seq_len: int | None = None):
    """(theta over all ``width`` / 2 pairs, factor) of ``slot``: the model's own RoPE (``scaling`` None) or the
    strategy's, on the slot's rotating pairs (its dim and base) with the pairs it holds at frequency 0 (proportional
    RoPE) appended still, as the patcher keeps them (rope_ext.patch)."""
    import torch

    if scaling is None:
        theta, factor = rope_ext.default_inv_freq(slot.dim, slot.base), 1.0
    else:
        theta, factor = scaling.frequencies(slot.dim, slot.base, seq_len=seq_len)
    still = width // 2 - len(theta)
    return (torch.cat([theta, theta.new_zeros(still)]) if still > 0 else theta), factor


def _frequency_sets(cap, scaling: rope_ext.Scaling, scaled: set, max_distance: int):
    """(model's theta, factor) and (the strategy's theta, factor) for this layer's slot."""
    slot, width = cap.slot, 2 * len(cap.inv_freq)
    is_scaled = slot in scaled
    if is_scaled and scaling.scales_frequencies:
        own = slot_frequencies(slot, width)
        strategy = slot_frequencies(slot, width, scaling, max_distance)
    else:
        own = strategy = (cap.inv_freq, cap.attention_factor)
    return own, strategy, is_scaled


def _changed(own: torch.Tensor, strategy: torch.Tensor) -> torch.Tensor:
    ratio = strategy.double() / own.double()
    return (ratio - 1).abs() > 1e-4


def study_layer(cap, cfg, scaling, scaled, trained, max_distance, generator) -> Layer:
    import torch

    q, k = cap.query[0], cap.key[0]  # (H, n, d), (Hkv, n, d): as RoPE received them
    heads, n, d = q.shape
    group = heads // k.shape[0]
    kv_of = torch.arange(heads) // group
    rotary = 2 * len(cap.pairs[0])
    zq = analysis.complex_pairs(q, cap.pairs)  # (H, n, P)
    zk = analysis.complex_pairs(k, cap.pairs)[kv_of]
    if d > rotary:  # dims RoPE leaves alone (partial rotary): pairs with theta = 0 and no imaginary part
        zq = torch.cat([zq, torch.complex(q[..., rotary:].double(), torch.zeros_like(q[..., rotary:].double()))], -1)
        zk = torch.cat(
            [zk, torch.complex(k[..., rotary:].double(), torch.zeros_like(k[..., rotary:].double()))[kv_of]], -1
        )
    pad = torch.zeros(d - rotary, dtype=torch.float64)
    (own, own_factor), (strategy, strategy_factor), is_scaled = _frequency_sets(cap, scaling, scaled, max_distance)
    theta_own, theta_strategy = torch.cat([own.double(), pad]), torch.cat([strategy.double(), pad])
    scale = float(cap.scaling if cap.scaling is not None else d**-0.5)
    window = int(min(trained, cap.call.kwargs.get("sliding_window") or trained))

    mu_q, mu_k = zq.mean(1), zk.mean(1)  # (H, P')
    energy_q, energy_k = (zq.abs() ** 2).mean(1), (zk.abs() ** 2).mean(1)
    corr = analysis.cross_correlation(zq, zk)  # (H, n, P')
    counts = torch.arange(n, 0, -1, dtype=torch.float64)
    empirical = {"none": analysis.profile_from_correlation(corr, theta_own, own_factor) * scale}
    if is_scaled and scaling.name != "none":
        empirical["strategy"] = analysis.profile_from_correlation(corr, theta_strategy, strategy_factor) * scale
    del corr
    mean_field = {"none": analysis.mean_field_profile(mu_q, mu_k, theta_own, max_distance, own_factor) * scale}
    if is_scaled and scaling.name != "none":
        profile = analysis.mean_field_profile(mu_q, mu_k, theta_strategy, max_distance, strategy_factor) * scale
        factors = scaling.query_factors(torch.arange(max_distance))
        mean_field["strategy"] = profile * factors.double() if factors is not None else profile

    # spread of the logits over random causal token pairs (the rotated vectors the model scores)
    query_idx = torch.randint(1, n, (cfg.pair_samples,), generator=generator)
    key_idx = (torch.rand(cfg.pair_samples, generator=generator) * query_idx).long()
    rq, rk = cap.call.query[0].float(), cap.call.key[0].float()[kv_of]
    logits = (rq[:, query_idx] * rk[:, key_idx]).sum(-1) * scale  # (H, samples)
    logit_std = logits.std(-1)

    empirical_window = min(window, n)
    local = analysis.locality(empirical["none"], cfg.near, empirical_window, counts)
    local_mf = analysis.locality(mean_field["none"], cfg.near, window)
    far_mf = analysis.window_mean(mean_field["none"], window // 2, window)
    beyond = {
        name: (analysis.window_mean(p, trained, max_distance) - far_mf) if max_distance > trained else None
        for name, p in mean_field.items()
    }

    bias = _bias_terms(cap, mu_q, mu_k, kv_of, theta_own, own_factor, scale, window, cfg.near)
    P = len(cap.inv_freq)
    usage = (energy_q * energy_k).sqrt()  # (H, P'): Barbero et al.'s frequency usage, q and k together
    usage = usage / usage.sum(-1, keepdim=True)
    wavelength = analysis.wavelengths(own.double())
    beyond_critical = usage[:, :P][:, wavelength >= trained].sum(-1)
    changed = _changed(own, strategy)
    mean_dot = (mu_q * mu_k.conj()).real
    a2 = own_factor**2
    head_rows = []
    for h in range(heads):
        variance_q = float((energy_q[h] - mu_q[h].abs() ** 2).sum() / energy_q[h].sum())
        variance_k = float((energy_k[h] - mu_k[h].abs() ** 2).sum() / energy_k[h].sum())
        row = {
            "layer": cap.layer,
            "layer_type": cap.slot.layer_type,
            "head": h,
            "kv_head": int(kv_of[h]),
            "base": cap.slot.base,
            "window": window,
            "mean_q_norm": float(mu_q[h].abs().pow(2).sum().sqrt()),
            "mean_k_norm": float(mu_k[h].abs().pow(2).sum().sqrt()),
            "mean_dot": float(mean_dot[h].sum()) * scale * a2,  # mean-field score at distance 0 (logits)
            "mean_norm": float(mu_q[h].abs().pow(2).sum().sqrt() * mu_k[h].abs().pow(2).sum().sqrt()) * scale * a2,
            "variance_share_q": variance_q,
            "variance_share_k": variance_k,
            "logit_std": float(logit_std[h]),
            "locality": float(local[h]),
            "locality_meanfield": float(local_mf[h]),
            "beyond_meanfield_none": None if beyond["none"] is None else float(beyond["none"][h]),
            "beyond_meanfield_strategy": None if beyond.get("strategy") is None else float(beyond["strategy"][h]),
            "energy_beyond_critical": float(beyond_critical[h]),
            "energy_changed": float(usage[h, :P][changed].sum()),
        }
        row["alignment"] = row["mean_dot"] / row["mean_norm"] if row["mean_norm"] > 0 else 0.0
        row["relative_locality"] = row["locality"] / row["logit_std"] if row["logit_std"] > 0 else None
        row["class"] = "local" if row["locality"] >= cfg.local_threshold else "global"
        if bias is not None:
            row.update({key: float(values[h]) if torch.isfinite(values[h]) else None for key, values in bias.items()})
        head_rows.append(row)

    pair_rows = []
    for tensor, z, mu, energy, count in (
        ("q", zq, mu_q, energy_q, heads),
        ("k", zk[::group], mu_k[::group], energy_k[::group], heads // group),
    ):
        variance = energy - mu.abs() ** 2
        for h in range(count):
            for i in range(P):
                pair_rows.append(
                    {
                        "layer": cap.layer,
                        "layer_type": cap.slot.layer_type,
                        "tensor": tensor,
                        "head": h,
                        "pair": i,
                        "theta": float(own[i]),
                        "wavelength": float(wavelength[i]),
                        "wavelength_over_context": float(wavelength[i]) / trained,
                        "mean_a": float(mu[h, i].real),
                        "mean_b": float(mu[h, i].imag),
                        "mean_norm": float(mu[h, i].abs()),
                        "variance": float(variance[h, i]),
                        "energy": float(energy[h, i]),
                        "changed_by_strategy": bool(changed[i]),
                    }
                )
    profiles = {"empirical": empirical, "mean_field": mean_field, "counts": counts}
    return Layer(
        cap.layer,
        cap.slot.layer_type,
        cap.slot.base,
        window,
        head_rows,
        pair_rows,
        usage[:, :P].float(),
        wavelength.float(),
        cap.slot,
        profiles,
        changed,
    )


def _pairs_of(x: torch.Tensor, pairs, d: int) -> torch.Tensor:
    """(..., d) -> complex pairs, with any dims RoPE leaves alone as pairs of their own (theta = 0)."""
    import torch

    z = analysis.complex_pairs(x, pairs)
    rotary = 2 * len(pairs[0])
    if d > rotary:
        z = torch.cat([z, torch.complex(x[..., rotary:].double(), torch.zeros_like(x[..., rotary:].double()))], -1)
    return z


def _share(mu: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The share of the mean along the bias, Re<mu, b> / |mu|^2 (1: the mean is the bias; 0: none of it); NaN
    where |mu| is below 0.1% of the size of the bias and of W.x's mean (q and k centred): no share is defined."""
    import torch

    size = (mu.abs() ** 2).sum(-1)
    share = (mu * b.conj()).real.sum(-1) / size.clamp_min(1e-300)
    return torch.where(size > 1e-6 * ((b.abs() ** 2).sum(-1) + ((mu - b).abs() ** 2).sum(-1)), share, torch.nan)


def _bias_terms(cap, mu_q, mu_k, kv_of, theta, factor, scale, window, near) -> dict | None:
    """Per head, what the q and k biases are of the means (None: the layer has no q or k bias): their norms, the
    norms of the means of W.x (mu - b), the shares of the means along them, and the mean-field locality of the
    biases alone (b_q R_r b_k) and of W.x's means alone."""
    heads, d = mu_q.shape[0], cap.query.shape[-1]
    b_q, b_k = (biases.layer_bias(cap.call.module, t) for t in ("q", "k"))
    if b_q is None or b_k is None or b_q.numel() != heads * d:
        return None
    b_q = _pairs_of(b_q.double().cpu().view(heads, d), cap.pairs, d)
    b_k = _pairs_of(b_k.double().cpu().view(-1, d), cap.pairs, d)[kv_of]

    def local(zq, zk):
        return analysis.locality(analysis.mean_field_profile(zq, zk, theta, window, factor) * scale, near, window)

    return {
        "bias_q_norm": b_q.abs().pow(2).sum(-1).sqrt(),
        "bias_k_norm": b_k.abs().pow(2).sum(-1).sqrt(),
        "wx_q_norm": (mu_q - b_q).abs().pow(2).sum(-1).sqrt(),
        "wx_k_norm": (mu_k - b_k).abs().pow(2).sum(-1).sqrt(),
        "bias_share_q": _share(mu_q, b_q),
        "bias_share_k": _share(mu_k, b_k),
        "locality_bias": local(b_q, b_k),
        "locality_wx": local(mu_q - b_q, mu_k - b_k),
    }


def capture_layers(model, ids: torch.Tensor, cfg, scaling, scaled: set, trained: int, max_distance: int):
    """(each attention layer studied in one forward over ``ids`` (1, n), what the bias ablation did): q and k
    captured as RoPE received them, with ``cfg.ablate_bias`` applied for the forward and restored after."""
    import torch

    generator = torch.Generator().manual_seed(cfg.seed)
    layers: list[Layer] = []

    def on_layer(cap) -> None:
        layers.append(study_layer(cap, cfg, scaling, scaled, trained, max_distance, generator))

    with biases.ablated(
        model, cfg.ablate_bias, cfg.ablate_mode, lambda m: m.base_model(input_ids=ids, use_cache=False)
    ) as ablation:
        with (
            rope_ext.capture(model, on_layer),
            torch.inference_mode(),
            layer_progress(model, f"qk capture {cfg.tokens} tok"),
        ):
            model.base_model(input_ids=ids, use_cache=False)
    return layers, ablation


# -- across heads: the conjecture --------------------------------------------------------------------------------


def _verdict(rho: float, p: float, expected: int, n: int) -> str:
    if n < 4 or not math.isfinite(rho):
        return "too few heads"
    if p >= 0.05:
        return "not significant"
    return "holds" if rho * expected > 0 else "contradicted"


def _spearman(x, y, expected: int) -> dict:
    from scipy import stats

    pairs = [(a, b) for a, b in zip(x, y) if a is not None and b is not None and math.isfinite(a) and math.isfinite(b)]
    if len(pairs) < 4 or len({a for a, _ in pairs}) < 2 or len({b for _, b in pairs}) < 2:
        return {"rho": None, "p": None, "n": len(pairs), "verdict": "too few heads"}
    result = stats.spearmanr([a for a, _ in pairs], [b for _, b in pairs])
    rho, p = float(result.statistic), float(result.pvalue)
    return {"rho": rho, "p": p, "n": len(pairs), "verdict": _verdict(rho, p, expected, len(pairs))}


def claims(heads: list[dict]) -> dict:
    """The conjecture's claims across heads (Spearman rank correlations; Mann-Whitney for the sign)."""
    from scipy import stats

    same = [h for h in heads if h["mean_dot"] > 0]
    opposite = [h for h in heads if h["mean_dot"] < 0]
    found = {
        # same-sign means: a larger |mean| decays more
        "mean_predicts_decay": _spearman([h["mean_norm"] for h in same], [h["locality"] for h in same], +1),
        # signed: the mean-field score at distance 0 (positive: same sign) orders the decay
        "signed_mean_orders_decay": _spearman([h["mean_dot"] for h in heads], [h["locality"] for h in heads], +1),
        # a larger share of variance weakens the decay relative to the logits' spread
        "variance_weakens_decay": _spearman(
            [(h["variance_share_q"] + h["variance_share_k"]) / 2 for h in heads],
            [h["relative_locality"] for h in heads],
            -1,
        ),
        # the means alone reproduce the measured decay
        "mean_field_explains_decay": _spearman(
            [h["locality_meanfield"] for h in heads], [h["locality"] for h in heads], +1
        ),
    }
    rising = [h for h in opposite if h["locality"] < 0]
    entry = {
        "heads_opposite": len(opposite),
        "heads_same": len(same),
        "opposite_rising": len(rising),
        "fraction_rising": len(rising) / len(opposite) if opposite else None,
        "p": None,
    }
    if len(opposite) >= 2 and len(same) >= 2:
        entry["p"] = float(
            stats.mannwhitneyu(
                [h["locality"] for h in opposite], [h["locality"] for h in same], alternative="less"
            ).pvalue
        )
    if entry["p"] is None:
        entry["verdict"] = "too few heads"
    elif entry["p"] < 0.05 and entry["fraction_rising"] > 0.5:
        entry["verdict"] = "holds"
    elif entry["p"] < 0.05:
        entry["verdict"] = "partly: opposite-sign heads decay less, but most do not rise"
    else:
        entry["verdict"] = "not significant"
    found["opposite_means_rise"] = entry
    if any(h.get("locality_bias") is not None for h in heads):  # a model with q/k biases: do they set the decay?
        found["bias_sets_decay"] = _spearman(
            [h.get("locality_bias") for h in heads], [h["locality"] for h in heads], +1
        )
    return found


# -- per layer, per strategy, per dimension: the rows the eval reports -------------------------------------------


def bias_summary(heads: list[dict]) -> dict:
    """Means over heads of the bias terms (nothing for a model without q/k biases)."""
    keys = (
        "bias_share_q",
        "bias_share_k",
        "bias_q_norm",
        "bias_k_norm",
        "wx_q_norm",
        "wx_k_norm",
        "locality_bias",
        "locality_wx",
    )
    found = {}
    for key in keys:
        values = [h[key] for h in heads if h.get(key) is not None]
        if values:
            found[key] = sum(values) / len(values)
    return found


def layer_rows(layers: list[Layer], trained: int) -> list[dict]:
    """Per layer: the share of local heads, the mean locality, the critical pair and the energy beyond it, the
    energy in the pairs the job's scaling changes, and the bias shares (a model with q/k biases)."""
    rows = []
    for layer in layers:
        local = sum(h["class"] == "local" for h in layer.heads)
        rows.append(
            {
                "layer": layer.index,
                "layer_type": layer.layer_type,
                "base": layer.base,
                "window": layer.window,
                "heads": len(layer.heads),
                "local_fraction": local / len(layer.heads),
                "global_fraction": 1 - local / len(layer.heads),
                "mean_locality": sum(h["locality"] for h in layer.heads) / len(layer.heads),
                "critical_pair": int((layer.wavelength < trained).sum()),
                "pairs": len(layer.wavelength),
                "energy_beyond_critical": float(layer.usage[:, layer.wavelength >= trained].sum(-1).mean()),
                "energy_changed": float(layer.usage[:, layer.changed].sum(-1).mean()),
                **{k: v for k, v in bias_summary(layer.heads).items() if k.startswith("bias_share")},
            }
        )
    return rows


def strategy_rows(layers: list[Layer], job_scaling, compare: list, scaled: set, slots, max_distance: int) -> list[dict]:
    """Per strategy (the job's, then ``eval.compare``'s) and layer: the pairs it changes and their energy share."""
    rows = []
    for scaling in [job_scaling, *compare]:
        chosen = scaled if scaling is job_scaling else set(rope_ext.select_slots(slots, scaling.layer_types))
        for layer in layers:
            width = 2 * len(layer.wavelength)
            own = slot_frequencies(layer.slot, width)[0]
            inv_freq = (
                slot_frequencies(layer.slot, width, scaling, max_distance)[0]
                if (layer.slot in chosen and scaling.scales_frequencies)
                else own
            )
            changed = _changed(own, inv_freq)
            rows.append(
                {
                    "strategy": scaling.label,
                    "layer": layer.index,
                    "layer_type": layer.layer_type,
                    "pairs_changed": int(changed.sum()),
                    "energy_changed": float(layer.usage[:, changed].sum(-1).mean()),
                    "queries_scaled": scaling.scales_query and layer.slot in chosen,
                }
            )
    return rows


def dimension_rows(layers: list[Layer], scaling, trained: int, max_distance: int) -> list[dict]:
    """Per layer type and base: the per-dimension table of the job's scaling (``rope_ext.strategies.analysis``) with the
    energy share the layers of that kind put in each pair."""
    import torch

    rows = []
    for (layer_type, base), members in {
        (l.layer_type, l.base): [m for m in layers if (m.layer_type, m.base) == (l.layer_type, l.base)] for l in layers
    }.items():
        dim = members[0].slot.dim  # the rotating pairs (those held at frequency 0 have no wavelength to scale)
        table = analysis.dimension_table(scaling.frequencies(dim, base, seq_len=max_distance)[0], base, trained)
        share = torch.stack([m.usage.mean(0) for m in members]).mean(0)
        rows += [
            {"layer_type": layer_type, "base": base, **row, "energy_share": float(share[row["pair"]])} for row in table
        ]
    return rows


def summarize(heads: list[dict], found: dict, layers: list[dict], strategies: list[dict]) -> dict:
    """The job's summary: heads, local share, mean locality, each claim's verdict (rho, p), the energy beyond the
    critical dimension, the bias terms' means, and per strategy the mean energy share of the pairs it changes."""
    summary = {
        "heads": len(heads),
        "local_fraction": sum(h["class"] == "local" for h in heads) / len(heads),
        "mean_locality": sum(h["locality"] for h in heads) / len(heads),
    }
    for name, result in found.items():
        summary[f"claim/{name}"] = result["verdict"]
        if "rho" in result:
            summary[f"claim/{name}/rho"] = result["rho"]
        summary[f"claim/{name}/p"] = result["p"]
    summary["energy_beyond_critical"] = sum(r["energy_beyond_critical"] for r in layers) / len(layers)
    summary.update(bias_summary(heads))
    for row in strategies:
        summary.setdefault(f"energy_changed/{row['strategy']}", []).append(row["energy_changed"])
    for key in [k for k in summary if k.startswith("energy_changed/")]:
        summary[key] = sum(summary[key]) / len(summary[key])
    return summary
