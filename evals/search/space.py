"""The search space of one strategy: from its registration unless the user gives ranges.

- Declared: every parameter whose ``rope_ext.Param`` has ``search`` -- a ``(low, high)`` range (log scale when
  ``log``) or ``"monotone"`` -- and that the command line does not fix (``scaling.factor=2`` fixes it).
- With ``target=``: the declared factor range of a strategy whose factor sets its reach (a static frequency
  strategy covers trained x factor) starts at target / trained, as a smaller factor cannot reach the target
  (:func:`rope_ext.strategies.targets.reaching_factor`); said in one line.
- Given: any strategy parameter (``scaling.<name>``) in Hydra's sweep syntax -- ``interval(a,b)``
  (``tag(log,interval(a,b))`` on a log scale), ``range(a,b[,step])``, ``choice(...)`` or ``a,b,c`` -- on the
  command line or in ``hydra.sweeper.params``; its range must lie inside the parameter's declared bounds (checked
  here, before any trial).
- ``"monotone"`` (LongRoPE, Ding et al. 2024, arXiv 2402.13753): d/2 factors with f_i >= 1, f_i <= f_{i+1}, the
  first n-hat equal to 1, at most 1.25 x the extension asked for (the paper's upper bound s x 1.25). Sampled as
  n-hat, the largest factor ``top`` in [1, upper] (log scale) and d/2 steps x_i in [0, 1] that share out its
  logarithm: f_i = top ** (sum_{n-hat <= j <= i} x_j / sum_{j >= n-hat} x_j). Every sample is valid, the largest
  factor is searched in its own right (not pinned at the bound), one step alone is PI's flat shape and one large
  step a jump (the shape NTK-by-parts draws).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import rope_ext
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep

from ..core.errors import ConfigError

LONGROPE_UPPER = 1.25  # LongRoPE's search bound for a factor: s x 1.25


@dataclass(frozen=True)
class Scalar:
    """One searched value: a float or int range, or a set of choices."""

    key: str
    kind: str  # float | int | categorical
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple = ()
    declared: bool = True  # from the registration (else given by the user)

    @property
    def size(self) -> int:
        return 1

    def names(self) -> list[str]:
        return [self.key]

    def suggest(self, trial):
        if self.kind == "categorical":
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.key, float(self.low), float(self.high), step=self.step, log=self.log)

    def probe(self, default):
        """A value to check the job with before any trial: the default when it lies in the range."""
        if self.kind == "categorical":
            return default if default in self.choices else self.choices[0]
        if isinstance(default, (int, float)) and not isinstance(default, bool) and self.low <= default <= self.high:
            return default
        middle = (self.low * self.high) ** 0.5 if self.log else (self.low + self.high) / 2
        return int(round(middle)) if self.kind == "int" else middle

    def describe(self) -> str:
        if self.kind == "categorical":
            return f"{self.key} in {list(self.choices)}"
        return (
            f"{self.key} in [{self.low:g}, {self.high:g}]"
            + (" (log)" if self.log else "")
            + (f" step {self.step:g}" if self.step else "")
        )


@dataclass(frozen=True)
class MonotoneFactors:
    """d/2 per-dimension factors under LongRoPE's constraints (module docstring)."""

    key: str
    pairs: int  # d/2
    upper: float
    declared: bool = True

    @property
    def size(self) -> int:
        return self.pairs + 2

    def suggest(self, trial) -> list[float]:
        n_hat = trial.suggest_int(f"{self.key}.n_hat", 0, self.pairs - 1)
        top = trial.suggest_float(f"{self.key}.top", 1.0, self.upper, log=True)
        steps = [trial.suggest_float(f"{self.key}.x{i:02d}", 0.0, 1.0) for i in range(self.pairs)]
        return monotone_factors(n_hat, top, steps)

    def names(self) -> list[str]:
        """The values Optuna samples for these factors (what ``hydra.sweeper.enqueue`` may set)."""
        return [f"{self.key}.n_hat", f"{self.key}.top", *(f"{self.key}.x{i:02d}" for i in range(self.pairs))]

    def probe(self, default) -> list[float]:
        return [1.0] * self.pairs

    def describe(self) -> str:
        return (
            f"{self.key}: {self.pairs} factors, 1 <= f_i <= f_i+1 <= top <= {self.upper:g} (log), the first n_hat = 1"
        )


def monotone_factors(n_hat: int, top: float, steps: list[float]) -> list[float]:
    """Factors >= 1, non-decreasing, the first ``n_hat`` equal to 1, the last ``top`` (all 1 when no step climbs)."""
    kept = [0.0] * n_hat + [max(0.0, float(x)) for x in steps[n_hat:]]
    total, climbed, factors = sum(kept), 0.0, []
    for step in kept:
        climbed += step
        # f_i = top ** (share of the climb done by dimension i)
        factors.append(round(float(top) ** (climbed / total), 6) if total > 0 else 1.0)
    return factors


def monotone_steps(factors: list[float]) -> tuple[int, float, list[float]]:
    """The inverse of :func:`monotone_factors` for factors 1 <= f_i <= f_i+1: (n_hat, top, steps) with top the last
    factor and steps x_i = log_top(f_i / f_i-1), so a known shape (PI, NTK-by-parts, a searched YaRN) can be
    enqueued as the start of a per-dimension search (``scaling.factors.n_hat``, ``.top``, ``.x00``...)."""
    top = float(factors[-1])
    if top <= 1.0:
        return len(factors) - 1, 1.0, [0.0] * len(factors)
    climbed = [math.log(f) / math.log(top) for f in factors]
    return sum(f == 1.0 for f in factors), top, [max(0.0, b - a) for a, b in zip([0.0, *climbed], climbed)]


def value_text(value) -> str:
    """A value as a Hydra override writes it."""
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(value_text(v) for v in value) + "]"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, float) else str(value)


def given(override: Override, strategy: rope_ext.strategies.registry.Strategy) -> Scalar:
    """A range the user gave in Hydra's sweep syntax, checked against the declared bounds of a strategy parameter."""
    key, sweep = override.get_key_element(), override.value()
    text = override.input_line or key
    if not key.startswith("scaling."):
        hint = (
            f"; several objectives are a list: {key}=[{','.join(map(str, getattr(sweep, 'list', [])))}]"
            if key in ("objective", "constraints")
            else f"; fix it ({key}=<value>) or compare values in a grid (-m without hydra/sweeper=optuna)"
        )
        raise ConfigError(f"{text}: a search explores the strategy's parameters (scaling.<name>), not {key}{hint}")
    name = key.split(".", 1)[1]
    if name not in strategy.params:
        raise ConfigError(
            f"{text}: scaling '{strategy.name}' does not take {name}; its parameters: {', '.join(strategy.params)}"
        )
    param = strategy.params[name]
    if param.type is list:
        raise ConfigError(
            f"{text}: {name} is a list of per-dimension factors; it is searched "
            f"{'per dimension when not given' if param.search == 'monotone' else 'only as given'}, "
            f"not over a range"
        )
    log = "log" in getattr(sweep, "tags", set())
    if isinstance(sweep, IntervalSweep):
        low, high = sweep.start, sweep.end
        kind = "int" if param.type is int else "float"
        values, scalar = [low, high], Scalar(key, kind, low, high, log=log, declared=False)
    elif isinstance(sweep, RangeSweep):
        values = list(range_values(sweep))
        if not values:
            raise ConfigError(f"{text} is empty")
        kind = "int" if all(float(v).is_integer() for v in values) and param.type is not float else "float"
        scalar = Scalar(key, kind, min(values), max(values), log=log, step=abs(sweep.step), declared=False)
        if log and not (kind == "int" and scalar.step == 1):  # Optuna samples a log scale without a step
            raise ConfigError(
                f"{text}: a log scale takes interval(a,b) (or range(a,b) of an int parameter), not "
                f"range() with a step of {scalar.step:g}"
            )
    elif isinstance(sweep, ChoiceSweep):
        values = list(sweep.list)
        scalar = Scalar(key, "categorical", choices=tuple(values), declared=False)
    else:
        raise ConfigError(f"{text}: a search takes interval(), range(), choice() or a,b,c")
    if scalar.kind != "categorical" and not scalar.low < scalar.high:
        raise ConfigError(f"{text}: the range is empty (low {scalar.low:g} >= high {scalar.high:g})")
    if scalar.log and scalar.kind != "categorical" and scalar.low <= 0:
        raise ConfigError(f"{text}: a log scale needs a positive low end, got {scalar.low:g}")
    for value in values:
        try:
            param.coerce(strategy.name, name, value)
        except rope_ext.ScalingError as err:
            raise ConfigError(
                f"{text}: {value!r} is outside what '{strategy.name}' declares: {str(err).split(': ', 1)[-1]}"
            ) from None
    return scalar


def range_values(sweep: RangeSweep):
    value = sweep.start
    while (sweep.step > 0 and value < sweep.stop) or (sweep.step < 0 and value > sweep.stop):
        yield value
        value += sweep.step


def target_floors(
    strategy: rope_ext.strategies.registry.Strategy,
    scaling: dict,
    skip: set,
    trained: int,
    target: int | None,
    given=None,
) -> tuple[dict, str]:
    """({parameter: its lower bound}, the line saying it) where ``target=`` needs more than the low end of the declared
    range: the factor of a strategy whose factor sets its reach (:func:`rope_ext.strategies.targets.reaching_factor`) -- a
    factor below target / trained cannot reach the target, a trial wasted. ``given``: the target as written."""
    from rope_ext.strategies.targets import reaching_factor

    param = strategy.params.get("factor")
    if target is None or param is None or not isinstance(param.search, tuple) or "scaling.factor" in skip:
        return {}, ""
    low = reaching_factor({**scaling, "name": strategy.name}, trained, target)
    if low is None or low <= param.search[0]:
        return {}, ""
    line = (
        f"search: target={given or target} ({target} tokens) needs scaling.factor >= {low:g} ({target} / trained "
        f"{trained}): the searched factor starts there, not at {param.search[0]:g}"
    )
    return {"factor": low}, line


def declared(
    strategy: rope_ext.strategies.registry.Strategy, skip: set, pairs, extension: float, floors: dict | None = None
) -> list:
    """The strategy's declared search space without the keys in ``skip`` (fixed or given by the user).
    ``pairs()`` gives d/2 of the layers it scales (read only when a per-dimension parameter is searched);
    ``floors``: {parameter: a lower bound above its declared one} (the factor a target needs)."""
    space, floors = [], floors or {}
    for name, param in strategy.params.items():
        key = f"scaling.{name}"
        if param.search is None or key in skip:
            continue
        if param.search == "monotone":
            space.append(MonotoneFactors(key, pairs(), LONGROPE_UPPER * max(1.0, extension)))
        else:
            low, high = param.search
            if floors.get(name) is not None and floors[name] > low:
                if floors[name] > high:
                    raise ConfigError(
                        f"the search for a target needs scaling.{name} >= {floors[name]:g}, beyond its searched range "
                        f"[{low:g}, {high:g}]: give one, e.g. scaling.{name}=tag(log,interval({floors[name]:g},"
                        f"{2 * floors[name]:g}))"
                    )
                low = floors[name]
            space.append(Scalar(key, "int" if param.type is int else "float", low, high, log=param.log))
    return space
