"""``eval=qk_study``: the model's own queries and keys, and the seeds' decay conjecture tested on them.

The notes this project grew from end on a conjecture (tinymind blog, 2024-10-13,
github.com/Paul33333/tinymind-blog): RoPE's long-distance decay depends on the distribution of q and k --
same-sign means decay more as |mean| grows, opposite-sign means give a rise, a larger variance weakens
it -- so a trained model, with its own q/k means per layer and head, has heads that decay and look
locally and heads that barely decay and look globally. Barbero et al. 2024 ("Round and round we go!",
arXiv 2410.06205) found Gemma using the highest frequencies for positional heads and the lowest as
semantic channels. Here, on real text:

- every attention layer's q and k are captured exactly as RoPE rotates them (after any q/k norm, per
  head, GQA as it is) through rope_ext's attention hook (``rope_ext.capture``), in one forward of
  ``eval.tokens`` tokens of document ``eval.document``;
- per layer x head x rotary pair: mean, variance and energy of q and k (the pair z = x_a + i x_b);
- per head, its relative-position score profile in logits (the softmax scale applied): the empirical one,
  E over token pairs at distance r of <R_m q_m, R_n k_n>, from the FFT cross-correlation of every
  pair (``rope_ext.analysis``; r < tokens), and the mean-field one mu_q R_r mu_k from the measured
  means (any r), with the model's frequencies (``none``) and with the job's scaling (beyond the trained
  context L too; a query-scaling strategy multiplies the score at r by its factor for a query at r);
- locality = mean score over r in [1, near] minus mean over [W/2, W) (W: the trained context, the
  sliding window of sliding layers, and for the empirical profile the tokens captured); a head is local
  when its locality is at least ``eval.local_threshold`` logits (e^1 = 2.7x the attention weight);
- the conjecture's claims as rank correlations across heads with p-values (scipy), and per layer the
  energy share of the pairs whose wavelength exceeds L (past Liu et al. 2023's critical dimension,
  arXiv 2310.05209) and of the pairs each strategy in ``eval.compare`` (and the job's) changes;
- on a model with q/k projection biases (Qwen2.5, arXiv 2412.15115): per head how much of mu_q and mu_k the
  bias is (its norm, the norm of the mean of W.x, and the share of the mean along the bias), the mean-field
  locality of the biases alone, and the claim that they set the decay; ``eval.ablate_bias=[q,k]`` measures
  everything again with the biases zeroed, or (``eval.ablate_mode=center``) with q and k centred to mean 0
  (the variance-only control; :mod:`evals.bias`), restored after the eval.

Capture runs on the model as the job patches it (``scaling=none``: the model's own RoPE); the
profiles compare the frequencies it was trained with against the strategy's on the same q and k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, List, Optional

import rope_ext
import torch
from rope_ext import analysis

from .core.config import option
from .core.data import document_count
from .core.errors import UserError, scaling_errors_as_user_errors
from .core.models import check_attention_hook
from .core.plots import matrix_heatmaps, plt
from .core.registry import register_eval
from .scoring.nll import layer_progress
from . import bias as biases


class QKStudyError(UserError):
    pass


@dataclass
class QKStudyConfig:
    name: str = "qk_study"
    tokens: int = option(4096, minimum=64)  # tokens of real text in the one captured forward
    document: int = option(0, minimum=0)  # which document of the data (books: 0 = Emma)
    max_distance: Optional[int] = option(None, minimum=2)  # mean-field profiles up to here (null: 2 x trained context)
    near: int = option(16, minimum=1)  # locality: mean score over distances 1..near ...
    local_threshold: float = option(1.0, minimum=0)  # ... minus the far mean, in logits; >= this: a local head
    bins: int = option(64, minimum=8)  # log-spaced distance bins of the profile table and plots
    plot_heads: int = option(3, minimum=1)  # most local and most global heads plotted
    pair_samples: int = option(4096, minimum=64)  # random token pairs for the spread of a head's logits
    compare: List[Any] = field(
        default_factory=lambda: [
            {"name": "linear", "factor": 2.0},
            {"name": "ntk", "factor": 2.0},
            {"name": "yarn", "factor": 2.0},
            {"name": "p_rope", "fraction": 0.75},
        ]
    )  # strategies whose changed pairs are weighed by the energy there
    seed: int = 0
    ablate_bias: List[str] = option(
        [], choices=tuple(biases.PROJECTIONS)
    )  # biases changed for the study (evals/bias.py)
    ablate_mode: str = option("zero", choices=biases.MODES)  # zero: b -> 0; center: b -> b - mean (q/k mean 0)


def _resolve_compare(cfg, job) -> list[rope_ext.Scaling]:
    with scaling_errors_as_user_errors():
        return [rope_ext.resolve(dict(entry), job.trained_context) for entry in cfg.compare]


def check_config(cfg, job) -> None:
    count = document_count(job.data_cfg)
    if count is not None and cfg.document >= count:
        raise QKStudyError(f"eval.document={cfg.document} but the data has {count} documents (0..{count - 1})")
    window = min(cfg.tokens, job.trained_context)
    if not cfg.near < window // 2:
        raise QKStudyError(
            f"eval.near={cfg.near} must be below half of min(eval.tokens, trained context) = {window // 2} "
            "(the far window is its second half)"
        )
    for k, entry in enumerate(cfg.compare):
        if not hasattr(entry, "get") or "name" not in entry:
            raise QKStudyError(f"eval.compare[{k}]={entry!r} must be a scaling config with a name")
    for scaling in _resolve_compare(cfg, job):
        for slot in job.model.slots or ():
            with scaling_errors_as_user_errors():
                scaling.frequencies(slot.dim, slot.base)
    check_attention_hook(job.model, "eval=qk_study captures q and k inside attention")
    biases.check(cfg.ablate_bias, job.model, "eval.ablate_bias", QKStudyError)


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


def _frequency_sets(cap, scaling: rope_ext.Scaling, scaled: set, max_distance: int):
    """(model's theta, factor) and (the strategy's theta, factor) for this layer's slot."""
    slot, dim = cap.slot, 2 * len(cap.inv_freq)
    is_scaled = slot in scaled
    if is_scaled and scaling.scales_frequencies:
        own = (rope_ext.default_inv_freq(dim, slot.base), 1.0)
        strategy = scaling.frequencies(dim, slot.base, seq_len=max_distance)
    else:
        own = strategy = (cap.inv_freq, cap.attention_factor)
    return own, strategy, is_scaled


def _changed(own: torch.Tensor, strategy: torch.Tensor) -> torch.Tensor:
    ratio = strategy.double() / own.double()
    return (ratio - 1).abs() > 1e-4


def study_layer(cap, cfg, scaling, scaled, trained, max_distance, generator) -> Layer:
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
    z = analysis.complex_pairs(x, pairs)
    rotary = 2 * len(pairs[0])
    if d > rotary:
        z = torch.cat([z, torch.complex(x[..., rotary:].double(), torch.zeros_like(x[..., rotary:].double()))], -1)
    return z


def _share(mu: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The share of the mean along the bias, Re<mu, b> / |mu|^2 (1: the mean is the bias; 0: none of it); NaN
    where |mu| is below 0.1% of the size of the bias and of W.x's mean (q and k centred): no share is defined."""
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


# -- outputs -----------------------------------------------------------------------------------------------------


def _edges(limit: int, bins: int) -> list[int]:
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


def _bias_summary(heads: list[dict]) -> dict:
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


def _grid(layers: list[Layer], key: str) -> list[list[float]]:
    width = max(len(layer.heads) for layer in layers)
    return [
        [float("nan") if row.get(key) is None else row[key] for row in layer.heads]
        + [float("nan")] * (width - len(layer.heads))
        for layer in layers
    ]


@register_eval(
    "qk_study", config=QKStudyConfig, error=QKStudyError, check=check_config, needs=("model", "data", "geometry")
)
def evaluate(cfg, ctx) -> dict:
    """Per layer, head and rotary pair: q/k statistics, score profiles, locality, and the conjecture's claims."""
    documents = ctx.documents(count=cfg.document + 1)
    longest = max((len(d.ids) for d in documents), default=0)
    if cfg.document >= len(documents):
        raise QKStudyError(
            f"eval.document={cfg.document} but the data has {len(documents)} documents (0..{len(documents) - 1})"
        )
    doc = documents[cfg.document]
    if cfg.tokens > len(doc.ids):
        raise QKStudyError(
            f"eval.tokens={cfg.tokens} exceeds document {cfg.document} ({doc.name}: {len(doc.ids)} tokens; "
            f"the longest has {longest}); use fewer tokens or another eval.document"
        )
    trained = ctx.trained_context
    max_distance = cfg.max_distance or 2 * trained
    compare = _resolve_compare(cfg, ctx.job)
    model = ctx.model()
    slots = ctx.job.model.slots  # found and selected once, when the job was parsed
    scaled = set(ctx.job.scaled or ())  # None: scaling=none patches nothing
    generator = torch.Generator().manual_seed(cfg.seed)
    layers: list[Layer] = []

    def on_layer(cap) -> None:
        layers.append(study_layer(cap, cfg, ctx.scaling, scaled, trained, max_distance, generator))

    ids = doc.ids[: cfg.tokens].to(next(model.parameters()).device)[None]
    with biases.ablated(
        model, cfg.ablate_bias, cfg.ablate_mode, lambda m: m.base_model(input_ids=ids, use_cache=False)
    ) as ablation:
        with (
            rope_ext.capture(model, on_layer),
            torch.inference_mode(),
            layer_progress(model, f"qk capture {cfg.tokens} tok"),
        ):
            model.base_model(input_ids=ids, use_cache=False)
    heads = [row for layer in layers for row in layer.heads]
    title = f"{ctx.title}, {cfg.tokens} tokens of {doc.name}"

    found = claims(heads)
    layer_rows = []
    for layer in layers:
        local = sum(h["class"] == "local" for h in layer.heads)
        layer_rows.append(
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
                **{k: v for k, v in _bias_summary(layer.heads).items() if k.startswith("bias_share")},
            }
        )
    strategy_rows = []
    for scaling in [ctx.scaling, *compare]:
        chosen = scaled if scaling is ctx.scaling else set(rope_ext.select_slots(slots, scaling.layer_types))
        for layer in layers:
            dim = 2 * len(layer.wavelength)
            own = rope_ext.default_inv_freq(dim, layer.base)
            inv_freq = (
                scaling.frequencies(dim, layer.base, seq_len=max_distance)[0]
                if (layer.slot in chosen and scaling.scales_frequencies)
                else own
            )
            changed = _changed(own, inv_freq)
            strategy_rows.append(
                {
                    "strategy": scaling.label,
                    "layer": layer.index,
                    "layer_type": layer.layer_type,
                    "pairs_changed": int(changed.sum()),
                    "energy_changed": float(layer.usage[:, changed].sum(-1).mean()),
                    "queries_scaled": scaling.scales_query and layer.slot in chosen,
                }
            )
    dimension_rows = []
    for (layer_type, base), members in {
        (l.layer_type, l.base): [m for m in layers if (m.layer_type, m.base) == (l.layer_type, l.base)] for l in layers
    }.items():
        dim = 2 * len(members[0].wavelength)
        table = analysis.dimension_table(ctx.scaling.frequencies(dim, base, seq_len=max_distance)[0], base, trained)
        share = torch.stack([m.usage.mean(0) for m in members]).mean(0)
        dimension_rows += [
            {"layer_type": layer_type, "base": base, **row, "energy_share": float(share[row["pair"]])} for row in table
        ]

    edges = _edges(max_distance, cfg.bins)
    rows, curves = profile_rows(layers, edges)
    ctx.output.table("qk_heads", heads)
    ctx.output.table("qk_layers", layer_rows)
    ctx.output.table("qk_pairs", [row for layer in layers for row in layer.pairs])
    ctx.output.table("qk_profiles", rows)
    ctx.output.table("qk_strategies", strategy_rows)
    ctx.output.table("qk_dimensions", dimension_rows)
    ctx.output.figure(
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
    label = ctx.scaling.label
    ctx.output.figure(
        "qk_profiles_local",
        profile_figure(ranked[::-1][:k], curves, f"Most local heads: {title}", trained, cfg.tokens, label),
    )
    ctx.output.figure(
        "qk_profiles_global",
        profile_figure(ranked[:k], curves, f"Most global heads: {title}", trained, cfg.tokens, label),
    )
    ctx.output.figure("qk_energy", energy_figure(layers, trained, f"Frequency usage (Barbero et al.): {title}"))
    ctx.output.figure("qk_claims", claims_figure(heads, f"Does the q/k mean predict the decay? {title}"))

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
    summary["energy_beyond_critical"] = sum(r["energy_beyond_critical"] for r in layer_rows) / len(layer_rows)
    summary.update(_bias_summary(heads))
    for row in strategy_rows:
        summary.setdefault(f"energy_changed/{row['strategy']}", []).append(row["energy_changed"])
    for key in [k for k in summary if k.startswith("energy_changed/")]:
        summary[key] = sum(summary[key]) / len(summary[key])
    ctx.output.metrics(
        "qk_study",
        {
            "claims": found,
            "layers": layer_rows,
            "tokens": cfg.tokens,
            "document": doc.name,
            "max_distance": max_distance,
            "ablation": ablation,
            **summary,
        },
    )
    return summary
