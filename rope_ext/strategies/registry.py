"""The strategy registry: how a strategy declares itself, one protocol per kind, and where each name comes from.

A strategy is a function registered under a name with :func:`register`, together with its parameters as
:class:`Param` (default, type, meaning, accepted range). That declaration is the one place a parameter lives:
:func:`rope_ext.strategies.scaling.resolve` validates configs against it, :mod:`rope_ext.strategies.targets` derives parameters from
a target length through it, and the Hydra schemas of ``evals`` are generated from it.

There are three kinds of strategy, each with its own function signature (a :class:`typing.Protocol` below):

- ``frequencies`` (:class:`FrequencyFn`): new inverse frequencies and a cos/sin factor, the shape of
  transformers' ``ROPE_INIT_FUNCTIONS`` (catalogue: :mod:`rope_ext.strategies.frequency`; ``compose``: :mod:`rope_ext.strategies.scaling`);
- ``query`` (:class:`QueryScaleFn`): a factor on the query at each position, applied inside attention through
  rope_ext's attention hook (:mod:`rope_ext.attention.hook`); the frequencies stay the model's own
  (catalogue: :mod:`rope_ext.strategies.query_scaling`);
- ``attention`` (:class:`PositionRuleFn`): a :class:`rope_ext.strategies.position_rule.PositionRule`, which relative position
  each (query, key) pair sees, that the patcher assembles attention from (:mod:`rope_ext.attention.assembled`)
  (catalogue: :mod:`rope_ext.strategies.attention_level`).

Every name (and alias) is registered once: a second registration from another place is an error naming both
places (:func:`where`); the same module imported again is none.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Union

if TYPE_CHECKING:
    import torch

    from .position_rule import PositionRule


class ScalingError(ValueError):
    """A scaling configuration that cannot be applied (bad name, parameter or value). Args: the one-line message.
    A ValueError; :func:`resolve` and the patcher raise it, the command line prints its message alone.

    >>> from rope_ext import resolve
    >>> resolve({"name": "linear", "factor": -1})
    Traceback (most recent call last):
    ...
    rope_ext.strategies.registry.ScalingError: scaling 'linear': factor=-1 must be >= 1 (1 = no scaling)
    """


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

    Args: the fields below. ``coerce(strategy, key, value)`` returns the value checked (an int becomes a float
    where a float is declared) and raises ScalingError (one line, naming the strategy and key) for a value out of
    bounds or of another type.

    >>> factor = Param(1.0, minimum=1.0, doc="the scale factor")
    >>> factor.coerce("linear", "factor", 4)
    4.0
    >>> factor.coerce("linear", "factor", 0.5)
    Traceback (most recent call last):
    ...
    rope_ext.strategies.registry.ScalingError: scaling 'linear': factor=0.5 must be >= 1 (1 = no scaling)
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


class FrequencyFn(Protocol):
    """``kind="frequencies"``: ``fn(params, dim, base, seq_len) -> (inv_freq, attention_factor)``.

    ``params`` the resolved parameters, ``dim`` the rotary dimension d, ``base`` the RoPE base b, ``seq_len``
    the current sequence length (dynamic strategies; None = at most the trained length). Returns the d/2
    inverse frequencies and the factor the rotary module multiplies cos/sin by (sqrt(1/t) in YaRN)."""

    def __call__(self, params: dict, dim: int, base: float, seq_len: int | None, /) -> tuple[torch.Tensor, float]: ...


class QueryScaleFn(Protocol):
    """``kind="query"``: ``fn(params, positions) -> factors``.

    ``positions`` a LongTensor of 0-based query positions; ``factors`` a float tensor of the same shape: the
    query at each position is multiplied by its factor inside attention (the frequencies stay the model's own)."""

    def __call__(self, params: dict, positions: torch.Tensor, /) -> torch.Tensor: ...


class PositionRuleFn(Protocol):
    """``kind="attention"``: ``fn(params) -> PositionRule``: the relative position each query-key pair sees
    (:class:`rope_ext.strategies.position_rule.PositionRule`); at most one per model."""

    def __call__(self, params: dict, /) -> PositionRule: ...


class TargetFn(Protocol):
    """How a parameter follows from a target length: ``fn(params so far, trained L, target N) -> (value, why)``
    (:mod:`rope_ext.strategies.targets`)."""

    def __call__(self, params: dict, trained: int, target: int, /) -> tuple[Any, str]: ...


# The kinds of strategy and the signature each kind's function has.
KIND_PROTOCOLS: dict[str, type] = {"frequencies": FrequencyFn, "query": QueryScaleFn, "attention": PositionRuleFn}
KINDS = tuple(KIND_PROTOCOLS)
StrategyFn = Union[FrequencyFn, QueryScaleFn, PositionRuleFn]


@dataclass(frozen=True)
class Strategy:
    """A registered strategy: its function, declared parameters, cross-parameter check and dynamic flag.

    ``kind`` is ``frequencies``, ``query`` or ``attention``; ``fn`` has that kind's signature
    (:data:`KIND_PROTOCOLS`: :class:`FrequencyFn`, :class:`QueryScaleFn`, :class:`PositionRuleFn`)."""

    name: str
    fn: StrategyFn
    params: Mapping[str, Param]
    check: Callable[[dict], None] = field(default=lambda p: None)
    dynamic: Callable[[dict], bool] = field(default=lambda p: False)
    kind: str = "frequencies"
    # how parameters follow from a target length: {key: fn(params so far, trained L, target N) -> (value, why)},
    # applied in order to the keys a config leaves unset (rope_ext.strategies.targets.for_target)
    targets: Mapping[str, TargetFn] = field(default_factory=dict)
    # defaults that follow from the trained context (DCA's chunk 3L/4 ...), filled in by resolve so that a run
    # records and labels the values it used: fn(params) -> {key: value}
    context_defaults: Callable[[dict], dict] = field(default=lambda p: {})


STRATEGIES: dict[str, Strategy] = {}
ALIASES: dict[str, str] = {}


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
    """Decorator: add ``fn(params, dim, base, seq_len) -> (inv_freq, attention_factor)`` to the registry
    (:class:`FrequencyFn`), or with ``kind="query"`` a query-scaling ``fn(params, positions) -> factors``
    (:class:`QueryScaleFn`), or with ``kind="attention"`` a ``fn(params) -> PositionRule`` (:class:`PositionRuleFn`,
    :mod:`rope_ext.strategies.attention_level`). ``targets``: how some of its parameters follow from a target length
    (:mod:`rope_ext.strategies.targets`); each must be a declared parameter.

    Args: ``name`` (and ``aliases``) the names it is resolved by, ``params`` its :class:`Param` declarations,
    ``check`` a ``fn(params)`` raising ScalingError for a bad combination, ``dynamic`` a ``fn(params) -> bool`` (its
    frequencies follow the sequence length), ``context_defaults`` a ``fn(params) -> dict`` of values that follow
    from the trained context. Returns the decorator (which returns ``fn`` unchanged). Raises ValueError for an
    unknown ``kind``, a ``targets`` key not declared, or a name another function already registered.

    >>> from rope_ext import default_inv_freq, frequencies
    >>> @register("half", params={"factor": Param(2.0, minimum=1.0)})
    ... def half(params, dim, base, seq_len):
    ...     return default_inv_freq(dim, base) / params["factor"], 1.0
    >>> frequencies({"name": "half"}, 4, 10000.0)[0].tolist()
    [0.5, 0.004999999888241291]
    >>> del STRATEGIES["half"]  # the example's own, taken out again
    """
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


# The trained context L: the parameter most strategies share; resolve fills it from the model when unset.
TRAINED = Param(None, int, "trained context L (default: the model's)", minimum=1, required=True)
