"""RoPE scaling strategies as pure functions: parameters -> (inv_freq, attention_factor).

Notation (shared/REFERENCES.md): d = rotary dimension, b = base (rope_theta), s = factor,
L = trained context (``original_max_position``), theta_i = b^(-2i/d) for i = 0 .. d/2-1,
wavelength lambda_i = 2*pi / theta_i. Every strategy returns the d/2 inverse frequencies and the
factor the rotary module multiplies cos/sin by (the "attention factor", sqrt(1/t) in YaRN).

Implemented (one registry, the shape of transformers' ``ROPE_INIT_FUNCTIONS``):
- ``none``          the model's own RoPE (Su et al. 2021, RoFormer).
- ``linear``/``pi`` positional interpolation, theta/s (Chen et al. 2023, arXiv 2306.15595).
- ``ntk``           NTK-aware base change b*s^(d/(d-2)) (bloc97, 2023).
- ``base``          base enlargement / ABF: a new base set directly (Xiong et al. 2023, arXiv 2309.16039).
- ``dynamic_ntk``   NTK base recomputed from the current length (emozilla, 2023).
- ``yarn``          NTK-by-parts ramp + attention temperature (Peng et al. 2023, arXiv 2309.00071).
- ``ntk_by_parts``  the YaRN ramp without the temperature (same paper, section 3.2).
- ``llama3``        Llama-3.1 low/high-frequency factors (Meta 2024; transformers ``llama3``).
- ``longrope``      per-dimension short/long factor lists (Ding et al. 2024, arXiv 2402.13753).
- ``mixed``         user-given per-dimension factors, as a list or as bands of dimensions/wavelengths.
- ``compose``       stages applied in order, e.g. ``base`` then ``linear``.

Each function takes ``(params, dim, base, seq_len)`` where ``params`` has already been validated
against the strategy's declared parameters by :func:`frequencies`.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

StrategyFn = Callable[[dict, int, float, "int | None"], "tuple[torch.Tensor, float]"]


class ScalingError(ValueError):
    """A scaling configuration that cannot be applied (bad name, parameter or value)."""


@dataclass(frozen=True)
class Strategy:
    """A registered strategy: its function, its parameters with defaults, and whether it is dynamic."""

    fn: StrategyFn
    params: Mapping[str, Any]
    required: tuple[str, ...] = ()
    dynamic: Callable[[dict], bool] = field(default=lambda p: False)
    doc: str = ""


STRATEGIES: dict[str, Strategy] = {}
ALIASES: dict[str, str] = {}
# Keys a scaling config may carry that belong to the patcher or the run, not to any strategy.
NON_STRATEGY_KEYS = frozenset({"name", "layer_types"})


def register(name: str, *, params: Mapping[str, Any], required=(), dynamic=None, aliases=()):
    def deco(fn: StrategyFn) -> StrategyFn:
        STRATEGIES[name] = Strategy(
            fn, dict(params), tuple(required), dynamic or (lambda p: False), (fn.__doc__ or "").strip()
        )
        for alias in aliases:
            ALIASES[alias] = name
        return fn

    return deco


def default_inv_freq(dim: int, base: float) -> torch.Tensor:
    # theta_i = b^(-2i/d), in float32 exactly as transformers computes it
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim
    return 1.0 / (base**exponent)


def wavelengths(inv_freq: torch.Tensor) -> torch.Tensor:
    # lambda_i = 2*pi / theta_i: tokens per full rotation of dimension pair i
    return 2 * math.pi / inv_freq


def _check_factor(name: str, factor: float) -> None:
    if factor is None or not (factor >= 1.0):
        raise ScalingError(f"scaling '{name}': factor={factor!r} must be >= 1 (1 = no scaling)")


@register("none", params={"factor": None})
def none(p, dim, base, seq_len):
    """The model's own RoPE: theta_i = b^(-2i/d). ``factor`` is accepted and ignored, so a sweep over
    factors can include the baseline (``-m scaling=none,yarn scaling.factor=2,4``)."""
    return default_inv_freq(dim, base), 1.0


@register("linear", params={"factor": 2.0}, aliases=("pi",))
def linear(p, dim, base, seq_len):
    """Positional interpolation: positions / s, i.e. theta_i / s."""
    _check_factor("linear", p["factor"])
    return default_inv_freq(dim, base) / p["factor"], 1.0


def ntk_base(base: float, factor: float, dim: int) -> float:
    # NTK-aware: b' = b * s^(d/(d-2)) so the lowest frequency is interpolated by exactly s
    return base * factor ** (dim / (dim - 2))


@register("ntk", params={"factor": 2.0})
def ntk(p, dim, base, seq_len):
    """NTK-aware scaling: base enlarged to b * s^(d/(d-2))."""
    _check_factor("ntk", p["factor"])
    return default_inv_freq(dim, ntk_base(base, p["factor"], dim)), 1.0


@register("base", params={"base": None}, required=("base",))
def base_enlargement(p, dim, base, seq_len):
    """Adjusted base frequency (ABF): theta_i = b_new^(-2i/d)."""
    new_base = p["base"]
    if not (new_base > 1.0):
        raise ScalingError(f"scaling 'base': base={new_base!r} must be > 1")
    return default_inv_freq(dim, float(new_base)), 1.0


@register(
    "dynamic_ntk",
    params={"factor": 2.0, "original_max_position": None},
    required=("original_max_position",),
    dynamic=lambda p: True,
)
def dynamic_ntk(p, dim, base, seq_len):
    """Dynamic NTK: at length n > L, b' = b * ((s*n/L) - (s-1))^(d/(d-2)); below L the original."""
    s, trained = p["factor"], p["original_max_position"]
    _check_factor("dynamic_ntk", s)
    n = max(seq_len or trained, trained)
    return default_inv_freq(dim, base * ((s * n / trained) - (s - 1)) ** (dim / (dim - 2))), 1.0


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    # YaRN attention temperature: sqrt(1/t) = 0.1 * ln(s) + 1 (times mscale for DeepSeek variants)
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def correction_dim(rotations: float, dim: int, base: float, trained: int) -> float:
    # dimension whose wavelength fits `rotations` full turns in L: d*ln(L/(2*pi*r)) / (2*ln b)
    return dim * math.log(trained / (rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_ramp(dim: int, base: float, trained: int, beta_fast: float, beta_slow: float, truncate: bool):
    """Ramp over i < d/2: 0 where a pair is extrapolated (high frequency), 1 where interpolated."""
    low = correction_dim(beta_fast, dim, base, trained)
    high = correction_dim(beta_slow, dim, base, trained)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    return torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)


YARN_PARAMS = {
    "factor": 2.0,
    "original_max_position": None,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": True,
}


def _by_parts(p, dim, base, factor):
    # theta' = theta/s * ramp + theta * (1 - ramp)
    ramp = yarn_ramp(dim, base, p["original_max_position"], p["beta_fast"], p["beta_slow"], p["truncate"])
    theta = default_inv_freq(dim, base)
    return theta / factor * ramp + theta * (1 - ramp)


@register("ntk_by_parts", params=YARN_PARAMS, required=("original_max_position",))
def ntk_by_parts(p, dim, base, seq_len):
    """NTK-by-parts: interpolate long-wavelength pairs, keep short ones, linear ramp between."""
    _check_factor("ntk_by_parts", p["factor"])
    return _by_parts(p, dim, base, p["factor"]), 1.0


@register(
    "yarn",
    params={**YARN_PARAMS, "attention_factor": None, "mscale": None, "mscale_all_dim": None, "dynamic": False},
    required=("original_max_position",),
    dynamic=lambda p: bool(p["dynamic"]),
)
def yarn(p, dim, base, seq_len):
    """YaRN: NTK-by-parts frequencies + cos/sin scaled by 0.1*ln(s) + 1.

    With ``dynamic: true`` the factor follows the length, s = max(1, n/L) (the yarn repo's
    DynamicYaRN), and ``factor`` is ignored.
    """
    factor = p["factor"]
    if p["dynamic"]:
        factor = max(1.0, (seq_len or 0) / p["original_max_position"])
    _check_factor("yarn", factor)
    attention = p["attention_factor"]
    if attention is None:
        if p["mscale"] and p["mscale_all_dim"]:
            attention = yarn_mscale(factor, p["mscale"]) / yarn_mscale(factor, p["mscale_all_dim"])
        else:
            attention = yarn_mscale(factor)
    return _by_parts(p, dim, base, factor), float(attention)


@register(
    "llama3",
    params={"factor": 8.0, "original_max_position": None, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    required=("original_max_position",),
)
def llama3(p, dim, base, seq_len):
    """Llama-3.1: lambda > L/low -> theta/s; lambda < L/high -> theta; smooth blend between."""
    s, trained = p["factor"], p["original_max_position"]
    low, high = p["low_freq_factor"], p["high_freq_factor"]
    _check_factor("llama3", s)
    if not high > low > 0:
        raise ScalingError(f"scaling 'llama3': need high_freq_factor > low_freq_factor > 0, got {high} and {low}")
    theta = default_inv_freq(dim, base)
    wavelen = wavelengths(theta)
    # smooth = (L/lambda - low) / (high - low), clamped to [0, 1]; theta' = (1-smooth)*theta/s + smooth*theta
    smooth = ((trained / wavelen - low) / (high - low)).clamp(0, 1)
    return (1 - smooth) * theta / s + smooth * theta, 1.0


def _factor_list(name: str, key: str, values, dim: int) -> torch.Tensor:
    if values is None or len(values) != dim // 2:
        got = "none" if values is None else f"{len(values)} values"
        raise ScalingError(f"scaling '{name}': {key} needs d/2 = {dim // 2} values (one per dimension pair), got {got}")
    factors = torch.tensor([float(v) for v in values], dtype=torch.float32)
    if not bool((factors > 0).all()):
        raise ScalingError(f"scaling '{name}': {key} values must be > 0, got {values}")
    return factors


@register(
    "longrope",
    params={
        "short_factor": None,
        "long_factor": None,
        "factor": None,
        "original_max_position": None,
        "attention_factor": None,
    },
    required=("short_factor", "long_factor", "original_max_position"),
    dynamic=lambda p: True,
)
def longrope(p, dim, base, seq_len):
    """LongRoPE: theta_i / f_i with f = short list when n <= L, long list beyond; attention sqrt(1+ln s/ln L)."""
    trained = p["original_max_position"]
    use_long = seq_len is not None and seq_len > trained
    key = "long_factor" if use_long else "short_factor"
    factors = _factor_list("longrope", key, p[key], dim)
    attention = p["attention_factor"]
    if attention is None:
        s = p["factor"]
        if s is None:
            raise ScalingError("scaling 'longrope': set factor (target length / L) or attention_factor")
        # attention factor sqrt(1 + ln(s) / ln(L)), 1 when not extending
        attention = 1.0 if s <= 1 else math.sqrt(1 + math.log(s) / math.log(trained))
    return default_inv_freq(dim, base) / factors, float(attention)


def band_factors(bands, dim: int, base: float) -> torch.Tensor:
    """Per-pair factors from bands: each band names dims [start, end) or a wavelength range and a factor."""
    wavelen = wavelengths(default_inv_freq(dim, base))
    factors = torch.full((dim // 2,), float("nan"))
    for k, band in enumerate(bands):
        band = dict(band)
        if "factor" not in band:
            raise ScalingError(f"scaling 'mixed': band {k} has no factor: {band}")
        if "dims" in band:
            start, end = band["dims"]
            if not 0 <= start < end <= dim // 2:
                raise ScalingError(f"scaling 'mixed': band {k} dims={[start, end]} must satisfy 0 <= start < end <= {dim // 2}")
            members = torch.zeros(dim // 2, dtype=torch.bool)
            members[start:end] = True
        else:
            lo = band.get("min_wavelength") or 0.0
            hi = band.get("max_wavelength") or float("inf")
            members = (wavelen >= lo) & (wavelen < hi)
        overlap = members & ~factors.isnan()
        if bool(overlap.any()):
            raise ScalingError(f"scaling 'mixed': band {k} overlaps earlier bands at pairs {overlap.nonzero().flatten().tolist()}")
        factors[members] = float(band["factor"])
    missing = factors.isnan()
    if bool(missing.any()):
        raise ScalingError(f"scaling 'mixed': bands leave pairs {missing.nonzero().flatten().tolist()} uncovered (d/2 = {dim // 2})")
    return factors


@register("mixed", params={"factors": None, "bands": None, "attention_factor": 1.0})
def mixed(p, dim, base, seq_len):
    """Per-dimension frequencies theta_i / f_i, from a factor list or from bands (seed 001's channels)."""
    if (p["factors"] is None) == (p["bands"] is None):
        raise ScalingError("scaling 'mixed': give exactly one of factors (a list of d/2) or bands")
    if p["factors"] is not None:
        factors = _factor_list("mixed", "factors", p["factors"], dim)
    else:
        factors = band_factors(p["bands"], dim, base)
        if not bool((factors > 0).all()):
            raise ScalingError("scaling 'mixed': band factors must be > 0")
    return default_inv_freq(dim, base) / factors, float(p["attention_factor"])


def effective_base(inv_freq: torch.Tensor, dim: int) -> float | None:
    """The base b with inv_freq = b^(-2i/d), or None when the frequencies are not of that form."""
    if abs(float(inv_freq[0]) - 1.0) > 1e-6 or len(inv_freq) < 2:
        return None
    candidate = float(inv_freq[1]) ** (-dim / 2)
    return candidate if torch.allclose(default_inv_freq(dim, candidate), inv_freq, rtol=1e-4) else None


@register("compose", params={"stages": None}, required=("stages",), dynamic=lambda p: any(is_dynamic(s) for s in p["stages"]))
def compose(p, dim, base, seq_len):
    """Stages in order: each sees the base left by the previous ones; per-pair ratios and factors multiply."""
    inv_freq, attention, current_base = default_inv_freq(dim, base), 1.0, base
    for stage in p["stages"]:
        stage_inv, stage_attention = frequencies(stage, dim, current_base, seq_len)
        # each stage rescales pair i by stage_inv / theta(current base)
        inv_freq = inv_freq * stage_inv / default_inv_freq(dim, current_base)
        attention *= stage_attention
        current_base = effective_base(inv_freq, dim) or current_base
    return inv_freq, attention


def resolve_name(name: str) -> str:
    """The registered name for ``name`` (aliases resolved), or a ScalingError listing the valid ones."""
    if name in STRATEGIES:
        return name
    if name in ALIASES:
        return ALIASES[name]
    valid = sorted([*STRATEGIES, *ALIASES])
    close = difflib.get_close_matches(str(name), valid, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    raise ScalingError(f"unknown scaling name '{name}'. Valid: {', '.join(valid)}.{hint}")


def validate(scaling: Mapping) -> dict:
    """Check a scaling config and return its parameters with defaults filled in (None values = unset)."""
    scaling = {k: v for k, v in dict(scaling).items() if v is not None}
    if "name" not in scaling:
        raise ScalingError(f"scaling config has no 'name': {scaling}")
    name = resolve_name(scaling["name"])
    strategy = STRATEGIES[name]
    given = {k: v for k, v in scaling.items() if k not in NON_STRATEGY_KEYS}
    unknown = sorted(set(given) - set(strategy.params))
    if unknown:
        valid = ", ".join(sorted(strategy.params)) or "(none)"
        raise ScalingError(f"scaling '{name}' does not take {', '.join(unknown)}. Its parameters: {valid}")
    params = {**strategy.params, **given}
    missing = [k for k in strategy.required if params.get(k) is None]
    if missing:
        raise ScalingError(f"scaling '{name}' needs {', '.join(missing)}")
    if name == "compose":
        params["stages"] = [dict(s) for s in params["stages"]]
        for stage in params["stages"]:
            validate(stage)
    return {"name": name, **params}


def with_trained_context(scaling: Mapping, trained: int) -> dict:
    """``scaling`` with ``original_max_position`` set to ``trained`` wherever a strategy takes it and it is unset."""
    scaling = dict(scaling)
    takes_it = "original_max_position" in STRATEGIES[resolve_name(scaling.get("name"))].params
    if takes_it and scaling.get("original_max_position") is None:
        scaling["original_max_position"] = int(trained)
    if scaling.get("stages"):
        scaling["stages"] = [with_trained_context(stage, trained) for stage in scaling["stages"]]
    return scaling


def effective(scaling: Mapping) -> dict:
    """The parameters that change the frequencies: validated, without parameters a strategy ignores."""
    params = validate(scaling)
    return {"name": "none"} if params["name"] == "none" else params


def is_dynamic(scaling: Mapping) -> bool:
    """Whether the strategy's frequencies depend on the current sequence length."""
    params = validate(scaling)
    return STRATEGIES[params["name"]].dynamic(params)


def frequencies(scaling: Mapping, head_dim: int, base: float, seq_len: int | None = None):
    """Inverse frequencies (d/2,) and attention factor for ``scaling`` on a rotary dim ``head_dim``.

    ``scaling`` is a mapping with ``name`` and the strategy's parameters; ``seq_len`` is the current
    sequence length (used by dynamic strategies; None means "at most the trained length").
    """
    if head_dim <= 0 or head_dim % 2:
        raise ScalingError(f"rotary dimension must be a positive even number, got head_dim={head_dim}")
    if not base > 0:
        raise ScalingError(f"RoPE base must be > 0, got {base}")
    params = validate(scaling)
    inv_freq, attention = STRATEGIES[params["name"]].fn(params, head_dim, float(base), seq_len)
    return inv_freq.to(torch.float32), float(attention)
