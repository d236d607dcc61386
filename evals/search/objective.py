"""What a search optimises and what a trial must meet, checked against what the job reports before any trial runs.

- An objective is ``<metric>@<length>`` (or a list of them: a multi-objective search, whose answer is the Pareto
  front). The metric is one the eval declares (``evals.core.registry.Metric``): its direction is the declaration's
  ``lower_is_better``, never guessed from the name. ``<metric>_retention@L`` (L up to the trained context) is the
  short-context retention the verdict computes against the unscaled model (``evals/core/decision/verdict.py``: 1 = nothing
  lost, so higher is better); it needs ``verdict.baseline=true``, so the reference exists.
- A constraint is ``<metric>@<length>>=<number>`` or ``<=``, e.g. LongRoPE2's short-context guard
  ``ppl_retention@4096>=0.98`` (Shang et al. 2025, arXiv 2502.20082). Its value for Optuna is <= 0 when met.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..core.errors import ConfigError
from ..core.decision.verdict import AT

RETENTION = "_retention"
CONSTRAINT = re.compile(r"^\s*(?P<target>[^<>=\s]+@\d+)\s*(?P<op>>=|<=)\s*(?P<bound>[-+0-9.eE]+)\s*$")


@dataclass(frozen=True)
class Target:
    """One summary value a trial reports: ``<metric>@<length>``, and whether higher is better."""

    key: str
    metric: str
    length: int
    maximize: bool

    @property
    def direction(self) -> str:
        return "maximize" if self.maximize else "minimize"

    def value(self, summary: dict | None) -> float | None:
        value = (summary or {}).get(self.key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        return float(value)


@dataclass(frozen=True)
class Constraint:
    target: Target
    op: str  # ">=" or "<="
    bound: float

    @property
    def text(self) -> str:
        return f"{self.target.key}{self.op}{self.bound:g}"

    def violation(self, summary: dict | None) -> float | None:
        """<= 0 when met (Optuna's convention), the amount by which it is missed otherwise; None when not reported."""
        value = self.target.value(summary)
        if value is None:
            return None
        return self.bound - value if self.op == ">=" else value - self.bound


def target(text, job, where: str) -> Target:
    """``<metric>@<length>`` checked against the job: a metric its eval declares (or that metric's retention) at a
    length it evaluates; a ConfigError naming the value, why and what is valid otherwise."""
    declared = job.declared()
    lengths = job_lengths(job)
    valid = (
        f"the eval {job.eval.name} reports {', '.join(sorted(declared)) or 'no per-length metric'} at "
        f"{lengths}, and <metric>{RETENTION}@L for L <= {job.trained_context}"
    )
    match = AT.match(str(text).strip())
    if not declared:
        raise ConfigError(
            f"{where}={text}: the eval {job.eval.name} declares no per-length metric before it runs, "
            f"so nothing can be searched on it; search on perplexity, needle, passkey or ruler"
        )
    if not match:
        raise ConfigError(f"{where}={text} is not <metric>@<length>; {valid}")
    name, length = match.group(1), int(match.group(2))
    base = name[: -len(RETENTION)] if name.endswith(RETENTION) else None
    if name not in declared and base not in declared:
        raise ConfigError(f"{where}={text}: no job of this search reports {name}; {valid}")
    if length not in lengths:
        raise ConfigError(
            f"{where}={text}: the job evaluates {lengths}, not {length}; add {length} to the eval's lengths"
        )
    if name not in declared:
        if length > job.trained_context:
            raise ConfigError(
                f"{where}={text}: retention is measured up to the trained context "
                f"({job.trained_context}), not at {length}"
            )
        if not job.verdict.baseline:
            raise ConfigError(f"{where}={text}: retention needs the unscaled reference; set verdict.baseline=true")
        return Target(f"{name}@{length}", name, length, maximize=True)
    return Target(f"{name}@{length}", name, length, maximize=not declared[name]["lower_is_better"])


def job_lengths(job) -> list[int]:
    from ..core.run.reference_search import reference_lengths

    return reference_lengths(job)


def objectives(cfg, job) -> list[Target]:
    """The objectives of ``cfg.objective`` (one, or a list), checked against ``job``."""
    given = cfg.get("objective")
    if given is None or given == [] or given == "":
        raise ConfigError(
            "objective is not set: a search needs objective=<metric>@<length>, e.g. objective=ppl@16384 "
            "(or a list for a multi-objective search)"
        )
    items = list(given) if not isinstance(given, str) and hasattr(given, "__iter__") else [given]
    found = [target(item, job, "objective") for item in items]
    if len({t.key for t in found}) != len(found):
        raise ConfigError(f"objective={items} names one value twice")
    return found


def constraints(cfg, job) -> list[Constraint]:
    """The constraints of ``cfg.constraints``, checked against ``job``."""
    found = []
    for text in cfg.get("constraints") or []:
        match = CONSTRAINT.match(str(text))
        if not match:
            raise ConfigError(
                f"constraints: {text!r} is not <metric>@<length>>=<number> or <=, e.g. "
                f'"ppl_retention@4096>=0.98" (quoted on the command line)'
            )
        try:
            bound = float(match.group("bound"))
        except ValueError:
            raise ConfigError(f"constraints: {text!r}: {match.group('bound')} is not a number") from None
        found.append(Constraint(target(match.group("target"), job, "constraints"), match.group("op"), bound))
    return found


def constraint_values(trial) -> list[float]:
    """A finished trial's constraint values for Optuna (<= 0 when met; a trial that reported none fails them)."""
    return list(trial.user_attrs.get("constraints") or [1.0])


def feasible(trial) -> bool:
    """Whether a trial met every constraint (its recorded values all <= 0)."""
    return all(v <= 0 for v in trial.user_attrs.get("constraints") or [])
