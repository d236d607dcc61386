"""RoPE scaling strategies as pure functions: parameters -> (inv_freq, attention_factor).

Notation: d = rotary dimension, b = base (rope_theta), s = factor, L = trained context
(``original_max_position``), theta_i = b^(-2i/d) for i = 0 .. d/2-1, wavelength lambda_i = 2*pi / theta_i.
Every strategy returns the d/2 inverse frequencies and the factor the rotary module multiplies cos/sin
by (the "attention factor", sqrt(1/t) in YaRN).

Implemented (one registry, the shape of transformers' ``ROPE_INIT_FUNCTIONS``):
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
- ``logn``          query scaling beyond L growing with log n (Su 2021, kexue.fm/archives/8823; Qwen logn-attn; Llama-4).
- ``compose``       stages applied in order, e.g. ``base`` then ``linear``, or ``yarn`` then ``logn``.

Most strategies change frequencies. A *query-scaling* strategy (``kind="query"``, e.g. ``logn``) changes none:
its function maps query positions to factors the query is multiplied by inside attention, which the
patcher applies through rope_ext's attention hook (:mod:`rope_ext.attention`); it composes with any
frequency strategy through ``compose``. An *attention-level* strategy (``kind="attention"``: Self-Extend,
DCA, ReRoPE, STRING, LM-Infinite, in :mod:`rope_ext.positions`) changes which relative position each
(query, key) pair sees: its function returns a :class:`rope_ext.positions.PositionRule` that the patcher
assembles attention from (:mod:`rope_ext.assembled`); at most one per model, composable with the others.

A strategy registers its parameters as :class:`Param` (default, type, meaning, accepted range); that
declaration is the one place they live: :func:`resolve` validates against it, and the Hydra schemas of
``evals`` are generated from it. :func:`resolve` turns a config mapping into a frozen :class:`Scaling`
once; everything downstream (the patcher, the analyses) takes that value without validating again.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

StrategyFn = Callable[[dict, int, float, "int | None"], "tuple[torch.Tensor, float]"]
TargetFn = Callable[[dict, int, int], "tuple[Any, str]"]


class ScalingError(ValueError):
    """A scaling configuration that cannot be applied (bad name, parameter or value)."""


@dataclass(frozen=True)
class Param:
    """A strategy parameter: its default, type, meaning and the values it accepts.

    ``type`` is float, int, bool, str or list; ``minimum`` is an inclusive lower bound and ``above`` an
    exclusive one, ``maximum`` an inclusive upper bound (numbers); floats must be finite; a str takes one
    of ``choices``. ``required`` parameters have no usable default.

    ``search``: where a parameter search looks by default (``python run.py -m hydra/sweeper=optuna``): a
    ``(low, high)`` range inside the accepted bounds, sampled on a log scale when ``log``; or ``"monotone"`` for
    a list of d/2 per-dimension factors searched under LongRoPE's constraints (arXiv 2402.13753: >= 1,
    non-decreasing with the dimension, the first n-hat dimensions left alone). None: not searched unless asked.
    """

    default: Any = None
    type: type = float
    doc: str = ""
    minimum: float | None = None
    above: float | None = None
    required: bool = False
    maximum: float | None = None
    choices: tuple | None = None
    search: tuple | str | None = None
    log: bool = False

    def coerce(self, strategy: str, key: str, value: Any) -> Any:
        """``value`` checked against this declaration (ints become floats where a float is declared)."""
        where = f"scaling '{strategy}': {key}={value!r}"
        if self.type is bool:
            if not isinstance(value, bool):
                raise ScalingError(f"{where} must be true or false")
            return value
        if self.type is list:
            if not isinstance(value, (list, tuple)):
                raise ScalingError(f"{where} must be a list")
            return list(value)
        if self.type is str:
            if not isinstance(value, str) or (self.choices is not None and value not in self.choices):
                raise ScalingError(f"{where} must be one of {', '.join(self.choices or ())}")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ScalingError(f"{where} must be a number")
        if self.type is int:
            if float(value) != int(value):
                raise ScalingError(f"{where} must be a whole number")
            value = int(value)
        else:
            value = float(value)
            if not math.isfinite(value):
                raise ScalingError(f"{where} must be a finite number")
        why = self.why(value)
        if why:
            raise ScalingError(
                f"{where} {why}" + (" (1 = no scaling)" if key == "factor" and "must be >=" in why else "")
            )
        return value

    def why(self, value: Any) -> str | None:
        """Why ``value`` is not one this declaration accepts (its choices, its numeric bounds), or None. The one
        rule for accepted values: strategy parameters and eval options (``evals.core.config.option``) alike."""
        if self.choices is not None:
            return None if value in self.choices else f"is not one of {', '.join(map(str, self.choices))}"
        bounds = [(self.minimum, ">="), (self.above, ">"), (self.maximum, "<=")]
        if all(bound is None for bound, _ in bounds):
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return "must be a finite number"
        for bound, op in bounds:
            if bound is not None and not {">=": value >= bound, ">": value > bound, "<=": value <= bound}[op]:
                return f"must be {op} {bound:g}"
        return None


@dataclass(frozen=True)
class Strategy:
    """A registered strategy: its function, declared parameters, cross-parameter check and dynamic flag.

    ``kind`` is ``frequencies`` (``fn(params, dim, base, seq_len) -> (inv_freq, attention_factor)``) or
    ``query`` (``fn(params, positions) -> factors``: the query at each position is multiplied by its
    factor inside attention; the frequencies stay the model's own) or ``attention`` (``fn(params) ->
    PositionRule``: the relative position each query-key pair sees)."""

    name: str
    fn: StrategyFn
    params: Mapping[str, Param]
    check: Callable[[dict], None] = field(default=lambda p: None)
    dynamic: Callable[[dict], bool] = field(default=lambda p: False)
    kind: str = "frequencies"
    # how parameters follow from a target length: {key: fn(params so far, trained L, target N) -> (value, why)},
    # applied in order to the keys a config leaves unset (rope_ext.targets.for_target)
    targets: Mapping[str, TargetFn] = field(default_factory=dict)
    # defaults that follow from the trained context (DCA's chunk 3L/4 ...), filled in by resolve so that a run
    # records and labels the values it used: fn(params) -> {key: value}
    context_defaults: Callable[[dict], dict] = field(default=lambda p: {})


STRATEGIES: dict[str, Strategy] = {}
ALIASES: dict[str, str] = {}
# Keys a scaling config may carry that belong to the patcher, not to any strategy (see slots.select_slots).
PATCH_KEYS = {"layer_types": "auto"}


KINDS = ("frequencies", "query", "attention")


def register(
    name: str,
    *,
    params: Mapping[str, Param],
    check=None,
    dynamic=None,
    aliases=(),
    kind="frequencies",
    targets: Mapping[str, TargetFn] | None = None,
    context_defaults: Callable[[dict], dict] | None = None,
):
    """Decorator: add ``fn(params, dim, base, seq_len) -> (inv_freq, attention_factor)`` to the registry, or
    with ``kind="query"`` a query-scaling ``fn(params, positions) -> factors`` (positions: a LongTensor of
    0-based query positions; factors: a float tensor of the same shape), or with ``kind="attention"`` a
    ``fn(params) -> PositionRule`` (:mod:`rope_ext.positions`). ``targets``: how some of its parameters follow
    from a target length (:mod:`rope_ext.targets`); each must be a declared parameter."""
    if kind not in KINDS:
        raise ValueError(f"strategy '{name}': kind must be one of {KINDS}, got {kind!r}")
    undeclared = sorted(set(targets or {}) - set(params))
    if undeclared:
        raise ValueError(f"strategy '{name}': targets names undeclared parameters {undeclared}")

    def deco(fn: StrategyFn) -> StrategyFn:
        for taken in (name, *aliases):
            owner = STRATEGIES.get(ALIASES.get(taken, taken))
            if owner is not None and where(owner.fn) != where(fn):  # the same module imported again is no conflict
                raise ValueError(
                    f"strategy name '{taken}' is registered twice: by {where(owner.fn)} and by {where(fn)}"
                )
        STRATEGIES[name] = Strategy(
            name,
            fn,
            dict(params),
            check or (lambda p: None),
            dynamic or (lambda p: False),
            kind,
            dict(targets or {}),
            context_defaults or (lambda p: {}),
        )
        for alias in aliases:
            ALIASES[alias] = name
        return fn

    return deco


def where(fn: Callable) -> str:
    """``file:line`` of a registered function (a registry's duplicate-name error names both)."""
    code = getattr(fn, "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code else repr(fn)


def default_inv_freq(dim: int, base: float) -> torch.Tensor:
    # theta_i = b^(-2i/d), in float32 exactly as transformers computes it
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim
    return 1.0 / (base**exponent)


def wavelengths(inv_freq: torch.Tensor) -> torch.Tensor:
    # lambda_i = 2*pi / theta_i: tokens per full rotation of dimension pair i (inf for theta = 0)
    return 2 * math.pi / inv_freq


FACTOR = Param(2.0, float, "scale s = target length / trained length", minimum=1.0, search=(1.0, 16.0), log=True)
TRAINED = Param(None, int, "trained context L (default: the model's)", minimum=1, required=True)


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


LOGN_FORMS = ("su", "llama4")


def check_logn(p: dict) -> None:
    if p["form"] == "su" and p["original_max_position"] < 2:
        raise ScalingError(
            f"scaling: form su needs original_max_position >= 2 (log base L), got {p['original_max_position']}"
        )


@register(
    "logn",
    params={
        "form": Param(
            "su",
            str,
            "su: max(1, log n / log L); llama4: 1 + attn_scale * log1p(floor(n / floor_scale))",
            choices=LOGN_FORMS,
        ),
        "original_max_position": TRAINED,
        "attn_scale": Param(0.1, float, "llama4 form: the slope of the log term", above=0.0),
        "floor_scale": Param(None, int, "llama4 form: n is counted in steps of floor_scale (default: L)", minimum=1),
    },
    check=check_logn,
    kind="query",
)
def logn(p, positions):
    """Log-n query scaling ("entropy invariance", Su 2021, kexue.fm/archives/8823): the query at 0-based
    position m, which sees n = m + 1 tokens, is multiplied by

    - ``su``: max(1, log n / log L) -- log_L n beyond the trained length L, 1 within it (Qwen's
      ``use_logn_attn``: ``math.log(i, seq_length) if i > seq_length else 1`` for i = n);
    - ``llama4``: 1 + attn_scale * log1p(floor(n / floor_scale)) (transformers' Llama-4
      ``attn_temperature_tuning``, floor_scale 8192 and attn_scale 0.1 there; here floor_scale defaults
      to L): 1 for the first L - 1 queries; the query at m = L - 1, the last of the trained length, already
      sees n = L and is scaled, as in Llama-4.

    >>> p = {"form": "llama4", "original_max_position": 8192, "attn_scale": 0.1, "floor_scale": None}
    >>> [round(f, 4) for f in logn(p, torch.tensor([0, 8190, 8191, 16383])).tolist()]
    [1.0, 1.0, 1.0693, 1.1099]
    >>> [round(f, 4) for f in logn({**p, "form": "su"}, torch.tensor([8190, 8191, 16383])).tolist()]
    [1.0, 1.0, 1.0769]
    """
    n = positions.double() + 1
    trained = p["original_max_position"]
    if p["form"] == "su":
        factors = (n.log() / math.log(trained)).clamp(min=1.0)
    else:
        floor_scale = p["floor_scale"] or trained
        factors = torch.log1p(torch.floor(n / floor_scale)) * p["attn_scale"] + 1.0
    return factors.float()


def effective_base(inv_freq: torch.Tensor, dim: int) -> float | None:
    """The base b with inv_freq = b^(-2i/d), or None when the frequencies are not of that form."""
    if abs(float(inv_freq[0]) - 1.0) > 1e-6 or len(inv_freq) < 2:
        return None
    candidate = float(inv_freq[1]) ** (-dim / 2)
    return candidate if torch.allclose(default_inv_freq(dim, candidate), inv_freq, rtol=1e-4) else None


@register(
    "compose",
    params={"stages": Param(None, list, "scaling configs applied in order", required=True)},
    dynamic=lambda p: any(stage.dynamic for stage in p["stages"]),
)
def compose(p, dim, base, seq_len):
    """Stages in order: each sees the base left by the previous ones; per-pair ratios and factors multiply."""
    inv_freq, attention, current_base = default_inv_freq(dim, base), 1.0, base
    for stage in p["stages"]:
        if not stage.scales_frequencies:
            continue  # none, or a query-scaling stage
        stage_inv, stage_attention = stage.frequencies(dim, current_base, seq_len)
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


def _short(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Scaling:
    """A validated scaling: strategy name, every parameter (defaults and trained context filled in), the
    layer types it applies to, and whether its frequencies follow the sequence length. Built once by
    :func:`resolve`; its methods never validate again."""

    name: str
    params: dict
    layer_types: Any = "auto"
    dynamic: bool = False
    _computed: dict = field(default_factory=dict, compare=False, repr=False)  # (dim, base) -> static frequencies

    @property
    def strategy(self) -> Strategy:
        return STRATEGIES[self.name]

    @property
    def scales_frequencies(self) -> bool:
        """Whether the patcher replaces frequencies (not for ``none``, query-scaling and attention-level ones)."""
        if self.name == "compose":
            return any(stage.scales_frequencies for stage in self.params["stages"])
        return self.name != "none" and self.strategy.kind == "frequencies"

    @property
    def scales_query(self) -> bool:
        """Whether queries are scaled inside attention (a query-scaling strategy, or a compose holding one)."""
        if self.name == "compose":
            return any(stage.scales_query for stage in self.params["stages"])
        return self.strategy.kind == "query"

    @property
    def scales_attention(self) -> bool:
        """Whether attention is assembled from a position rule (an attention-level strategy, alone or composed)."""
        if self.name == "compose":
            return any(stage.scales_attention for stage in self.params["stages"])
        return self.strategy.kind == "attention"

    def position_rule(self):
        """The :class:`rope_ext.positions.PositionRule` of its attention-level strategy (of the one stage of a
        ``compose`` that has one), built once; None when it has none."""
        if self.name == "compose":
            return next((s.position_rule() for s in self.params["stages"] if s.scales_attention), None)
        if self.strategy.kind != "attention":
            return None
        if "rule" not in self._computed:
            self._computed["rule"] = self.strategy.fn(self.params)
        return self._computed["rule"]

    @property
    def factor(self) -> float | None:
        """The extension factor s it declares (target length / trained length): its ``factor`` parameter, the
        largest of a ``compose``'s stages; None when it has none (``none`` ignores its own)."""
        if self.name == "compose":
            return max((s.factor for s in self.params["stages"] if s.factor), default=None)
        return None if self.name == "none" else self.params.get("factor")

    def frequencies(self, dim: int, base: float, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
        """Inverse frequencies (d/2,) and attention factor on a rotary dim ``dim`` with base ``base`` (a
        query-scaling strategy: the unscaled theta_i = b^(-2i/d) and 1)."""
        if dim <= 0 or dim % 2:
            raise ScalingError(f"rotary dimension must be a positive even number, got head_dim={dim}")
        if not base > 1:
            raise ScalingError(f"RoPE base must be > 1, got {base}")
        if self.strategy.kind in ("query", "attention"):
            return default_inv_freq(dim, float(base)), 1.0
        if seq_len is None and (dim, float(base)) in self._computed:  # computed once: validated, then applied
            inv_freq, attention = self._computed[(dim, float(base))]
            return inv_freq.clone(), attention
        inv_freq, attention = self.strategy.fn(self.params, dim, float(base), seq_len)
        inv_freq, attention = inv_freq.to(torch.float32), float(attention)
        if seq_len is None:
            self._computed[(dim, float(base))] = (inv_freq.clone(), attention)
        return inv_freq, attention

    def query_factors(self, positions: torch.Tensor) -> torch.Tensor | None:
        """Factors (float32, shape of ``positions``) the query at each 0-based position is multiplied by, or
        None when this scaling scales no query (compose: the product of its query stages)."""
        if not self.scales_query:
            return None
        if self.name == "compose":
            factors = torch.ones(positions.shape, dtype=torch.float32, device=positions.device)
            for stage in self.params["stages"]:
                stage_factors = stage.query_factors(positions)
                if stage_factors is not None:
                    factors = factors * stage_factors
            return factors
        return self.strategy.fn(self.params, positions).to(torch.float32)

    def effective(self) -> dict:
        """What changes the frequencies: the parameters (nested for compose) and the layer types; ``none``
        is just its name (it ignores its factor and changes no layer)."""
        if self.name == "none":
            return {"name": "none"}
        params = {k: ([s.effective() for s in v] if k == "stages" else v) for k, v in self.params.items()}
        return {"name": self.name, **params, "layer_types": self.layer_types}

    def to_dict(self) -> dict:
        """A plain config mapping that :func:`resolve` turns back into this value."""
        params = {k: ([s.to_dict() for s in v] if k == "stages" else v) for k, v in self.params.items()}
        return {"name": self.name, **params, "layer_types": self.layer_types}

    @property
    def label(self) -> str:
        """e.g. ``yarn-factor2``, ``yarn-factor2-beta_fast16``, ``base-base1e+06``, ``none``: the name, then
        every parameter that differs from its registered default (the trained context left out)."""
        if self.name == "none":
            return "none"
        if self.name == "compose":
            return "compose[" + ",".join(stage.label for stage in self.params["stages"]) + "]"
        parts = [self.name]
        for key, param in self.strategy.params.items():
            value = self.params.get(key)
            if key == "original_max_position" or value is None:
                continue
            if key in ("factor", "base", "fraction") or value != param.default:
                parts.append(f"{key}{_short(value)}" if not isinstance(value, list) else f"{key}[{len(value)}]")
        if self.layer_types != "auto":
            types = self.layer_types if isinstance(self.layer_types, str) else "+".join(self.layer_types)
            parts.append(f"layers_{types}")
        return "-".join(parts)


def resolve(scaling: "Mapping | Scaling", trained_context: int | None = None) -> Scaling:
    """Validate a scaling config once: name (aliases resolved), parameters against the registration,
    defaults filled in, ``original_max_position`` set to ``trained_context`` where a strategy takes it
    and it is unset. Unset (None) keys mean "use the default"."""
    if isinstance(scaling, Scaling):
        if trained_context is None:
            return scaling
        scaling = scaling.to_dict()
    config = {k: v for k, v in dict(scaling).items() if v is not None}
    if "name" not in config:
        raise ScalingError(f"scaling config has no 'name': {config}")
    name = resolve_name(config.pop("name"))
    layer_types = config.pop("layer_types", PATCH_KEYS["layer_types"])
    if not isinstance(layer_types, str):
        layer_types = list(layer_types)
    strategy = STRATEGIES[name]
    unknown = sorted(set(config) - set(strategy.params))
    if unknown:
        valid = ", ".join(strategy.params) or "(none)"
        raise ScalingError(f"scaling '{name}' does not take {', '.join(unknown)}. Its parameters: {valid}")
    params = {}
    for key, param in strategy.params.items():
        value = config.get(key, param.default)
        if key == "original_max_position" and value is None:
            value = trained_context
        params[key] = None if value is None else param.coerce(name, key, value)
    missing = [key for key, param in strategy.params.items() if param.required and params[key] is None]
    if missing:
        raise ScalingError(f"scaling '{name}' needs {', '.join(missing)}")
    if name == "compose":
        params["stages"] = [resolve(stage, trained_context) for stage in _stages(params["stages"])]
        attention = [stage.label for stage in params["stages"] if stage.scales_attention]
        if len(attention) > 1:
            raise ScalingError(
                f"scaling 'compose': stages {' and '.join(attention)} both change which relative "
                "position each query-key pair sees; compose at most one attention-level method "
                "with frequency and query-scaling strategies"
            )
    try:
        strategy.check(params)
    except ScalingError as err:
        raise ScalingError(str(err).replace("scaling:", f"scaling '{name}':", 1)) from None
    if params.get("original_max_position") is not None:  # the values used, not null, in results and labels
        params.update({k: v for k, v in strategy.context_defaults(params).items() if params.get(k) is None})
    return Scaling(name, params, layer_types, bool(strategy.dynamic(params)))


def _stages(stages: list) -> list:
    """A compose's stages, each a scaling config (a mapping with a name, or a Scaling); at least one."""
    example = "e.g. stages=[{name: yarn, factor: 2}, {name: logn}]"
    if not stages:
        raise ScalingError(f"scaling 'compose' needs at least one stage, {example}")
    for stage in stages:
        if not isinstance(stage, Scaling) and not hasattr(stage, "keys"):
            raise ScalingError(
                f"scaling 'compose': stage {stage!r} is not a scaling config; write each stage as "
                f"{{name: <strategy>, <its parameters>}}, {example}"
            )
    return stages


def frequencies(scaling: "Mapping | Scaling", head_dim: int, base: float, seq_len: int | None = None):
    """Inverse frequencies (d/2,) and attention factor for ``scaling`` on a rotary dim ``head_dim``.

    ``scaling`` is a :class:`Scaling` or a mapping with ``name`` and the strategy's parameters (resolved
    here); ``seq_len`` is the current sequence length (dynamic strategies; None = at most the trained length).
    """
    return resolve(scaling).frequencies(head_dim, base, seq_len)
