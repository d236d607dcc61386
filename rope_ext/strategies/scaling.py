"""A validated scaling: a config resolved once against the registry into a frozen :class:`Scaling`.

:func:`resolve` turns a config mapping (``{"name": "yarn", "factor": 4}``) into a :class:`Scaling`: the name
with aliases resolved, every parameter checked against its :class:`rope_ext.strategies.registry.Param` declaration,
defaults and the trained context filled in. Everything downstream (the patcher, the analyses, the exports)
takes that value without validating again. A scaling knows what it changes -- the frequencies, the query inside
attention, or which relative position each pair sees -- from its strategy's kind (:mod:`rope_ext.strategies.registry`).

``compose`` applies stages in order, e.g. ``base`` then ``linear``, or ``yarn`` then ``logn``, or ``yarn`` then
``dca`` (Qwen2.5-1M's recipe): a :class:`Compose`, a scaling made of scalings. Its frequencies are the stages'
applied in turn, its query factors their product, its position rule the one of its attention-level stage
(at most one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from .registry import STRATEGIES, Param, ScalingError, Strategy, register, resolve_name
from .rope import default_inv_freq, effective_base

if TYPE_CHECKING:
    import torch

# Keys a scaling config may carry that belong to the patcher, not to any strategy (see slots.select_slots).
PATCH_KEYS = {"layer_types": "auto"}


def _short(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Scaling:
    """A validated scaling: strategy name, every parameter (defaults and trained context filled in), the
    layer types it applies to, and whether its frequencies follow the sequence length. Built once by
    :func:`resolve` (construct it through that, never directly); its methods never validate again.

    Args: ``name`` the registered name, ``params`` every parameter, ``layer_types`` (``auto``, ``all`` or names),
    ``dynamic``. ``frequencies(dim, base, seq_len=None)`` returns the (dim/2,) inverse frequencies and the attention
    factor; ``label`` a short name with the parameters that differ from the defaults; ``to_dict()`` the config again.
    Raises nothing once built.

    >>> s = resolve({"name": "yarn", "factor": 4}, trained_context=64)
    >>> s.label, s.factor, s.params["original_max_position"]
    ('yarn-factor4', 4.0, 64)
    >>> s.frequencies(4, 10000.0)[0].shape
    torch.Size([2])
    """

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
        return self.name != "none" and self.strategy.kind == "frequencies"

    @property
    def scales_query(self) -> bool:
        """Whether queries are scaled inside attention (a query-scaling strategy, or a compose holding one)."""
        return self.strategy.kind == "query"

    @property
    def scales_attention(self) -> bool:
        """Whether attention is assembled from a position rule (an attention-level strategy, alone or composed)."""
        return self.strategy.kind == "attention"

    def position_rule(self):
        """The :class:`rope_ext.strategies.position_rule.PositionRule` of its attention-level strategy (of the one stage of a
        ``compose`` that has one), built once; None when it has none."""
        if self.strategy.kind != "attention":
            return None
        if "rule" not in self._computed:
            self._computed["rule"] = self.strategy.fn(self.params)
        return self._computed["rule"]

    @property
    def factor(self) -> float | None:
        """The extension factor s it declares (target length / trained length): its ``factor`` parameter, the
        largest of a ``compose``'s stages; None when it has none (``none`` ignores its own)."""
        return None if self.name == "none" else self.params.get("factor")

    def frequencies(self, dim: int, base: float, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
        """Inverse frequencies (d/2,) and attention factor on a rotary dim ``dim`` with base ``base`` (a
        query-scaling strategy: the unscaled theta_i = b^(-2i/d) and 1)."""
        import torch

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
        import torch

        if not self.scales_query:
            return None
        return self.strategy.fn(self.params, positions).to(torch.float32)

    def effective(self) -> dict:
        """What changes the frequencies: the parameters (nested for compose) and the layer types; ``none``
        is just its name (it ignores its factor and changes no layer)."""
        if self.name == "none":
            return {"name": "none"}
        return {"name": self.name, **self.params, "layer_types": self.layer_types}

    def to_dict(self) -> dict:
        """A plain config mapping that :func:`resolve` turns back into this value."""
        return {"name": self.name, **self.params, "layer_types": self.layer_types}

    @property
    def label(self) -> str:
        """e.g. ``yarn-factor2``, ``yarn-factor2-beta_fast16``, ``base-base1e+06``, ``none``: the name, then
        every parameter that differs from its registered default (the trained context left out)."""
        if self.name == "none":
            return "none"
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

    @classmethod
    def _resolve_nested(cls, params: dict, trained_context: int | None) -> None:
        """Resolve the scalings a scaling holds, in ``params`` (a plain strategy holds none)."""


@dataclass(frozen=True)
class Compose(Scaling):
    """A ``compose`` scaling: its stages (each a resolved :class:`Scaling`) applied in order. The frequencies go
    stage by stage (:func:`compose`), query factors multiply, and the position rule is that of its one
    attention-level stage. It scales what any of its stages scales; its factor is the largest of theirs."""

    @property
    def stages(self) -> list[Scaling]:
        return self.params["stages"]

    @property
    def scales_frequencies(self) -> bool:
        return any(stage.scales_frequencies for stage in self.stages)

    @property
    def scales_query(self) -> bool:
        return any(stage.scales_query for stage in self.stages)

    @property
    def scales_attention(self) -> bool:
        return any(stage.scales_attention for stage in self.stages)

    def position_rule(self):
        return next((s.position_rule() for s in self.stages if s.scales_attention), None)

    @property
    def factor(self) -> float | None:
        return max((s.factor for s in self.stages if s.factor), default=None)

    def query_factors(self, positions: torch.Tensor) -> torch.Tensor | None:
        import torch

        if not self.scales_query:
            return None
        factors = torch.ones(positions.shape, dtype=torch.float32, device=positions.device)
        for stage in self.stages:
            stage_factors = stage.query_factors(positions)
            if stage_factors is not None:
                factors = factors * stage_factors
        return factors

    def effective(self) -> dict:
        return {**super().effective(), "stages": [s.effective() for s in self.stages]}

    def to_dict(self) -> dict:
        return {**super().to_dict(), "stages": [s.to_dict() for s in self.stages]}

    @property
    def label(self) -> str:
        return "compose[" + ",".join(stage.label for stage in self.stages) + "]"

    @classmethod
    def _resolve_nested(cls, params: dict, trained_context: int | None) -> None:
        """Each stage resolved (with the same trained context); at most one attention-level stage."""
        params["stages"] = [resolve(stage, trained_context) for stage in _stages(params["stages"])]
        attention = [stage.label for stage in params["stages"] if stage.scales_attention]
        if len(attention) > 1:
            raise ScalingError(
                f"scaling 'compose': stages {' and '.join(attention)} both change which relative "
                "position each query-key pair sees; compose at most one attention-level method "
                "with frequency and query-scaling strategies"
            )


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


# The scalings made of scalings, by registered name; every other name resolves to a plain Scaling.
SCALING_TYPES: dict[str, type[Scaling]] = {"compose": Compose}


def resolve(scaling: "Mapping | Scaling", trained_context: int | None = None) -> Scaling:
    """Validate a scaling config once: name (aliases resolved), parameters against the registration,
    defaults filled in, ``original_max_position`` set to ``trained_context`` where a strategy takes it
    and it is unset. Unset (None) keys mean "use the default". Args: ``scaling`` a mapping with ``name`` (or a
    Scaling), ``trained_context`` the model's trained length. Returns a :class:`Scaling`. Raises ScalingError (one
    line) for an unknown name or a bad parameter.

    >>> s = resolve({"name": "linear", "factor": 4}, trained_context=4096)
    >>> s.name, s.params["factor"]
    ('linear', 4.0)
    >>> resolve({"name": "linaer"})
    Traceback (most recent call last):
    ...
    rope_ext.strategies.registry.ScalingError: unknown scaling name 'linaer'. Valid: ... Did you mean 'linear'?
    """
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
    scaling_type = SCALING_TYPES.get(name, Scaling)  # Compose for "compose"
    scaling_type._resolve_nested(params, trained_context)
    try:
        strategy.check(params)
    except ScalingError as err:
        raise ScalingError(str(err).replace("scaling:", f"scaling '{name}':", 1)) from None
    if params.get("original_max_position") is not None:  # the values used, not null, in results and labels
        params.update({k: v for k, v in strategy.context_defaults(params).items() if params.get(k) is None})
    return scaling_type(name, params, layer_types, bool(strategy.dynamic(params)))


def frequencies(scaling: "Mapping | Scaling", head_dim: int, base: float, seq_len: int | None = None):
    """Inverse frequencies (d/2,) and attention factor for ``scaling`` on a rotary dim ``head_dim``.

    ``scaling`` is a :class:`Scaling` or a mapping with ``name`` and the strategy's parameters (resolved
    here); ``head_dim`` the rotary dim, ``base`` RoPE's base; ``seq_len`` is the current sequence length (dynamic
    strategies; None = at most the trained length). Returns ``(inv_freq, attention_factor)``: a (head_dim/2,) float
    tensor and a float. Raises ScalingError (one line) for a config :func:`resolve` refuses.

    >>> inv_freq, factor = frequencies({"name": "linear", "factor": 2}, 4, 10000.0)
    >>> inv_freq.tolist(), factor
    ([0.5, 0.004999999888241291], 1.0)
    """
    return resolve(scaling).frequencies(head_dim, base, seq_len)
