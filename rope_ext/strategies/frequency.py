"""The frequency strategies: pure functions (params, d, b, seq_len) -> (inv_freq, attention_factor).

Notation: d = rotary dimension, b = base (rope_theta), s = factor, L = trained context
(``original_max_position``), theta_i = b^(-2i/d) for i = 0 .. d/2-1, wavelength lambda_i = 2*pi / theta_i.
Every strategy returns the d/2 inverse frequencies and the factor the rotary module multiplies cos/sin
by (the "attention factor", sqrt(1/t) in YaRN): the signature :class:`rope_ext.strategies.registry.FrequencyFn`, the shape
of transformers' ``ROPE_INIT_FUNCTIONS``. Each is registered with its parameters, defaults and how they follow
from a target length (:func:`rope_ext.strategies.registry.register`).

- ``none``          the model's own RoPE (Su et al. 2021, RoFormer, arXiv 2104.09864).
- ``linear``/``pi`` positional interpolation, theta/s (Chen et al. 2023, arXiv 2306.15595).
- ``ntk``           NTK-aware base change b*s^(d/(d-2)) (bloc97, 2023, reddit.com/r/LocalLLaMA/comments/14lz7j5).
- ``base``          base enlargement / ABF: a new base set directly (Xiong et al. 2023, arXiv 2309.16039).
- ``dynamic_ntk``   NTK base recomputed from the current length (emozilla, 2023, reddit.com/r/LocalLLaMA/comments/14mrgpr).
- ``yarn``          NTK-by-parts ramp + attention temperature (Peng et al. 2023, arXiv 2309.00071).
- ``ntk_by_parts``  the YaRN ramp without the temperature (same paper, section 3.2).
- ``llama3``        Llama-3.1 low/high-frequency factors (Meta 2024, arXiv 2407.21783; transformers ``llama3``).
- ``longrope``      per-dimension short/long factor lists (Ding et al. 2024, arXiv 2402.13753).
- ``mixed``         user-given per-dimension factors, as a list or as bands of dimensions/wavelengths.
- ``p_rope``        keep the highest-frequency fraction of pairs, theta = 0 for the rest (Barbero et al. 2024, arXiv 2410.06205).

The other kinds live apart: query scaling (``logn``) in :mod:`rope_ext.strategies.query_scaling`, attention-level
strategies in :mod:`rope_ext.strategies.attention_level`, and ``compose`` (stages in order) in :mod:`rope_ext.strategies.scaling`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .registry import TRAINED, Param, ScalingError, register
from .rope import default_inv_freq, wavelengths

if TYPE_CHECKING:
    import torch

FACTOR = Param(2.0, float, "scale s = target length / trained length", minimum=1.0, search=(1.0, 16.0), log=True)


def factor_for_target(p: dict, trained: int, target: int) -> tuple[float, str]:
    # s = N / L: the positions up to the target map into the trained range
    return target / trained, f"target / trained = {target} / {trained}"


FACTOR_TARGET = {"factor": factor_for_target}


@register(
    "none", params={"factor": Param(None, float, "accepted and ignored, so a factor sweep can include the baseline")}
)
def none(p, dim, base, seq_len):
    """The model's own RoPE: theta_i = b^(-2i/d). ``factor`` is accepted and ignored, so a sweep over
    factors can include the baseline (``-m scaling=none,yarn scaling.factor=2,4``)."""
    return default_inv_freq(dim, base), 1.0


@register("linear", params={"factor": FACTOR}, targets=FACTOR_TARGET, aliases=("pi",))
def linear(p, dim, base, seq_len):
    """Positional interpolation: positions / s, i.e. theta_i / s."""
    return default_inv_freq(dim, base) / p["factor"], 1.0


def ntk_base(base: float, factor: float, dim: int) -> float:
    # NTK-aware: b' = b * s^(d/(d-2)) so the lowest frequency is interpolated by exactly s
    return base * factor ** (dim / (dim - 2))


@register("ntk", params={"factor": FACTOR}, targets=FACTOR_TARGET)
def ntk(p, dim, base, seq_len):
    """NTK-aware scaling: base enlarged to b * s^(d/(d-2))."""
    return default_inv_freq(dim, ntk_base(base, p["factor"], dim)), 1.0


@register("base", params={"base": Param(None, float, "the new base b'", above=1.0, required=True)})
def base_enlargement(p, dim, base, seq_len):
    """Adjusted base frequency (ABF): theta_i = b_new^(-2i/d)."""
    return default_inv_freq(dim, p["base"]), 1.0


@register(
    "dynamic_ntk",
    params={"factor": FACTOR, "original_max_position": TRAINED},
    dynamic=lambda p: True,
    targets=FACTOR_TARGET,
)
def dynamic_ntk(p, dim, base, seq_len):
    """Dynamic NTK: at length n > L, b' = b * ((s*n/L) - (s-1))^(d/(d-2)); below L the original."""
    s, trained = p["factor"], p["original_max_position"]
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
    import torch

    low = correction_dim(beta_fast, dim, base, trained)
    high = correction_dim(beta_slow, dim, base, trained)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    return torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)


# beta_fast/beta_slow: transformers reads 0 (or a missing value) as "use the default 32 / 1"; here 0 is
# rejected instead, so a value in a config always means what it says.
YARN_PARAMS = {
    "factor": FACTOR,
    "original_max_position": TRAINED,
    "beta_fast": Param(
        32.0,
        float,
        "rotations over L below which a pair starts to be interpolated",
        above=0.0,
        search=(8.0, 128.0),
        log=True,
    ),  # ranges apart, so every sample has beta_fast > beta_slow
    "beta_slow": Param(
        1.0, float, "rotations over L below which a pair is fully interpolated", above=0.0, search=(0.25, 4.0), log=True
    ),
    "truncate": Param(True, bool, "round the ramp's ends to whole dimensions (transformers' truncate)"),
}


def check_betas(p: dict) -> None:
    if not p["beta_fast"] > p["beta_slow"]:
        raise ScalingError(
            f"scaling: beta_fast={p['beta_fast']:g} must be > beta_slow={p['beta_slow']:g} "
            "(fast pairs turn more often over L than slow ones)"
        )


def _by_parts(p, dim, base, factor):
    # theta' = theta/s * ramp + theta * (1 - ramp)
    ramp = yarn_ramp(dim, base, p["original_max_position"], p["beta_fast"], p["beta_slow"], p["truncate"])
    theta = default_inv_freq(dim, base)
    return theta / factor * ramp + theta * (1 - ramp)


@register("ntk_by_parts", params=YARN_PARAMS, check=check_betas, targets=FACTOR_TARGET)
def ntk_by_parts(p, dim, base, seq_len):
    """NTK-by-parts: interpolate long-wavelength pairs, keep short ones, linear ramp between."""
    return _by_parts(p, dim, base, p["factor"]), 1.0


@register(
    "yarn",
    params={
        **YARN_PARAMS,
        "attention_factor": Param(None, float, "cos/sin factor (default 0.1 ln s + 1)", above=0.0, search=(0.8, 1.6)),
        "mscale": Param(None, float, "DeepSeek mscale", above=0.0),
        "mscale_all_dim": Param(None, float, "DeepSeek mscale_all_dim", above=0.0),
        "dynamic": Param(False, bool, "factor follows the length: s = max(1, n/L)"),
    },
    check=check_betas,
    dynamic=lambda p: bool(p["dynamic"]),
    targets=FACTOR_TARGET,
)
def yarn(p, dim, base, seq_len):
    """YaRN: NTK-by-parts frequencies + cos/sin scaled by 0.1*ln(s) + 1.

    With ``dynamic: true`` the factor follows the length, s = max(1, n/L) (the yarn repo's
    DynamicYaRN), and ``factor`` is ignored.
    """
    factor = p["factor"]
    if p["dynamic"]:
        factor = max(1.0, (seq_len or 0) / p["original_max_position"])
    attention = p["attention_factor"]
    if attention is None:
        if p["mscale"] and p["mscale_all_dim"]:
            attention = yarn_mscale(factor, p["mscale"]) / yarn_mscale(factor, p["mscale_all_dim"])
        else:
            attention = yarn_mscale(factor)
    return _by_parts(p, dim, base, factor), float(attention)


def check_llama3(p: dict) -> None:
    if not p["high_freq_factor"] > p["low_freq_factor"]:
        raise ScalingError(
            f"scaling 'llama3': high_freq_factor={p['high_freq_factor']:g} must be > "
            f"low_freq_factor={p['low_freq_factor']:g}"
        )


@register(
    "llama3",
    params={
        "factor": Param(2.0, float, "scale s = target / L (Llama-3.1 ships 8: 8192 -> 131072)", minimum=1.0),
        "original_max_position": TRAINED,
        "low_freq_factor": Param(
            1.0, float, "wavelengths above L/low are interpolated by s", above=0.0, search=(0.25, 2.0), log=True
        ),
        "high_freq_factor": Param(
            4.0, float, "wavelengths below L/high are kept", above=0.0, search=(2.5, 32.0), log=True
        ),
    },
    check=check_llama3,
    targets=FACTOR_TARGET,
)
def llama3(p, dim, base, seq_len):
    """Llama-3.1: lambda > L/low -> theta/s; lambda < L/high -> theta; smooth blend between."""
    s, trained = p["factor"], p["original_max_position"]
    low, high = p["low_freq_factor"], p["high_freq_factor"]
    theta = default_inv_freq(dim, base)
    wavelen = wavelengths(theta)
    # smooth = (L/lambda - low) / (high - low), clamped to [0, 1]; theta' = (1-smooth)*theta/s + smooth*theta
    smooth = ((trained / wavelen - low) / (high - low)).clamp(0, 1)
    return (1 - smooth) * theta / s + smooth * theta, 1.0


def _factor_list(name: str, key: str, values, dim: int) -> torch.Tensor:
    import torch

    if values is None or len(values) != dim // 2:
        got = "none" if values is None else f"{len(values)} values"
        raise ScalingError(f"scaling '{name}': {key} needs d/2 = {dim // 2} values (one per dimension pair), got {got}")
    try:
        factors = torch.tensor([float(v) for v in values], dtype=torch.float32)
    except (TypeError, ValueError):
        raise ScalingError(f"scaling '{name}': {key} must be numbers, got {list(values)}") from None
    if not bool((factors > 0).all() & factors.isfinite().all()):
        raise ScalingError(f"scaling '{name}': {key} values must be finite and > 0, got {list(values)}")
    return factors


def check_longrope(p: dict) -> None:
    if p["factor"] is None and p["attention_factor"] is None:
        raise ScalingError("scaling 'longrope': set factor (target length / L) or attention_factor")


@register(
    "longrope",
    params={
        "short_factor": Param(None, list, "d/2 factors used up to L", required=True, search="monotone"),
        "long_factor": Param(None, list, "d/2 factors used beyond L", required=True, search="monotone"),
        "factor": Param(2.0, float, "target length / L (sets the attention factor)", minimum=1.0),
        "original_max_position": TRAINED,
        "attention_factor": Param(None, float, "cos/sin factor (default sqrt(1 + ln s / ln L))", above=0.0),
    },
    check=check_longrope,
    dynamic=lambda p: True,
    targets=FACTOR_TARGET,
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
        # attention factor sqrt(1 + ln(s) / ln(L)), 1 when not extending
        attention = 1.0 if s <= 1 else math.sqrt(1 + math.log(s) / math.log(trained))
    return default_inv_freq(dim, base) / factors, float(attention)


def band_factors(bands, dim: int, base: float) -> torch.Tensor:
    """Per-pair factors from bands: each band names dims [start, end) or a wavelength range and a factor."""
    import torch

    wavelen = wavelengths(default_inv_freq(dim, base))
    factors = torch.full((dim // 2,), float("nan"))
    for k, band in enumerate(bands):
        band = dict(band)
        factor = band.get("factor")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not (0 < factor < math.inf):
            raise ScalingError(f"scaling 'mixed': band {k} needs a finite factor > 0: {band}")
        if "dims" in band:
            start, end = band["dims"]
            if not 0 <= start < end <= dim // 2:
                raise ScalingError(
                    f"scaling 'mixed': band {k} dims={[start, end]} must satisfy 0 <= start < end <= {dim // 2}"
                )
            members = torch.zeros(dim // 2, dtype=torch.bool)
            members[start:end] = True
        else:
            lo = band.get("min_wavelength") or 0.0
            hi = band.get("max_wavelength") or float("inf")
            if not lo < hi:
                raise ScalingError(f"scaling 'mixed': band {k} needs min_wavelength < max_wavelength: {band}")
            members = (wavelen >= lo) & (wavelen < hi)
        overlap = members & ~factors.isnan()
        if bool(overlap.any()):
            raise ScalingError(
                f"scaling 'mixed': band {k} overlaps earlier bands at pairs {overlap.nonzero().flatten().tolist()}"
            )
        factors[members] = float(factor)
    missing = factors.isnan()
    if bool(missing.any()):
        raise ScalingError(
            f"scaling 'mixed': bands leave pairs {missing.nonzero().flatten().tolist()} uncovered (d/2 = {dim // 2})"
        )
    return factors


def check_mixed(p: dict) -> None:
    if (p["factors"] is None) == (p["bands"] is None):
        raise ScalingError(
            "scaling 'mixed': give exactly one of factors (a list of d/2) or bands "
            "(conf/scaling/mixed.yaml sets bands: scaling.bands=null to give or search factors)"
        )


@register(
    "mixed",
    params={
        "factors": Param(None, list, "one factor per dimension pair", search="monotone"),
        "bands": Param(None, list, "[{dims: [start, end], factor}] or [{min_wavelength, max_wavelength, factor}]"),
        "attention_factor": Param(1.0, float, "cos/sin factor", above=0.0, search=(0.8, 1.6)),
    },
    check=check_mixed,
)
def mixed(p, dim, base, seq_len):
    """Per-dimension frequencies theta_i / f_i, from a factor list or from bands of dimensions or wavelengths."""
    if p["factors"] is not None:
        factors = _factor_list("mixed", "factors", p["factors"], dim)
    else:
        factors = band_factors(p["bands"], dim, base)
    return default_inv_freq(dim, base) / factors, float(p["attention_factor"])


def p_rope_pairs(fraction: float, dim: int) -> int:
    """How many pairs p-RoPE keeps rotating: floor(p * d/2), as Barbero et al. truncate."""
    return int(math.floor(fraction * (dim // 2) + 1e-9))


@register(
    "p_rope",
    params={
        "fraction": Param(
            0.75,
            float,
            "fraction p of rotary pairs kept (the highest frequencies)",
            above=0.0,
            maximum=1.0,
            search=(0.25, 1.0),
        )
    },
)
def p_rope(p, dim, base, seq_len):
    """p-RoPE (Barbero et al. 2024, "Round and round we go!", arXiv 2410.06205): the floor(p * d/2)
    highest-frequency pairs keep theta_i = b^(-2i/d); the rest get theta = 0 (no rotation: channels
    that carry no position, only content). p = 1 is RoPE."""
    inv_freq = default_inv_freq(dim, base)
    inv_freq[p_rope_pairs(p["fraction"], dim) :] = 0.0
    return inv_freq, 1.0
