"""A target length instead of parameters: "make my model work at N tokens" set up strategy by strategy.

Each strategy declares in its registration how its parameters follow from the trained context L and the
target N (``register(..., targets={key: fn})``): the factor s = N / L for the frequency strategies (PI, NTK,
dynamic NTK, YaRN, NTK-by-parts, Llama-3, LongRoPE); Self-Extend's window W = L/8 and the smallest group size G
with W + (N - W) / G <= 2L/3 (the LongLM README's rule, datamllab/LongLM); DCA's chunk 3L/4 and local window L/16
(HKUNLP/ChunkLlama); ReRoPE's window L/8 and Leaky ReRoPE's k so the farthest pair stays within L (bojone/rerope);
STRING's offset so every relative position stays below L (An et al. 2024, arXiv 2410.18745); LM-Infinite's
local span L (Han et al. 2023, arXiv 2308.16137). :func:`for_target` applies them to the keys a config leaves
unset -- an explicit value always wins -- and :func:`shortfalls` says, from the strategy itself (its factor,
its position rule), where a setting cannot reach a length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .registry import STRATEGIES, ScalingError, resolve_name
from .scaling import Scaling, resolve


class TargetError(ScalingError):
    """A strategy that cannot be set up for the target: below the trained context, a rule with no valid setting, or
    an explicit value that does not reach it."""


@dataclass(frozen=True)
class Derived:
    """A scaling config set up for a target: the config (unset keys filled in) and, per derived key, its value
    and why."""

    config: dict
    why: dict  # key -> (value, reason)

    def lines(self, name: str) -> list[str]:
        return [f"{name}.{key}={_short(value)}  ({reason})" for key, (value, reason) in self.why.items()]


def _short(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def derives(name: str) -> tuple[str, ...]:
    """The parameters of strategy ``name`` that a target sets (those it leaves to their defaults are not listed)."""
    return tuple(STRATEGIES[resolve_name(name)].targets)


def for_target(config: Mapping, trained: int, target: int) -> Derived:
    """``config`` (a scaling mapping) with every parameter its strategy derives from ``target`` filled in where it
    is unset (None); a ScalingError when the target is not one the strategy can be set up for (below the trained
    context for a strategy that only extends, or a rule with no valid setting)."""
    config = dict(config)
    name = resolve_name(config.get("name"))
    strategy = STRATEGIES[name]
    if not strategy.targets:
        return Derived(config, {})
    if target < trained:
        raise TargetError(
            f"target={target} is below the trained context {trained}: '{name}' only extends a model's "
            f"context; give a target >= {trained} (e.g. 2x)"
        )
    params = {
        key: config.get(key) if config.get(key) is not None else param.default
        for key, param in strategy.params.items()
        if key not in strategy.targets
    }
    params["original_max_position"] = config.get("original_max_position") or trained
    why = {}
    for key, rule in strategy.targets.items():
        if config.get(key) is not None:
            params[key] = config[key]
            continue
        try:
            value, reason = rule(params, trained, target)
        except TargetError:
            raise
        except ScalingError as err:  # a rule with no valid setting for this target
            raise TargetError(str(err)) from None
        params[key] = config[key] = value
        why[key] = (value, reason)
    return Derived(config, why)


def reaching_factor(config: Mapping, trained: int, target: int) -> float | None:
    """The smallest ``factor`` with which the strategy of ``config`` (a scaling mapping, unset keys at their defaults)
    reaches ``target`` where its factor sets its reach -- a static frequency strategy covers trained x factor
    (:func:`shortfalls`) -- else None (a dynamic strategy, one without a factor, an attention-level rule)."""
    strategy = STRATEGIES[resolve_name(config.get("name"))]
    if strategy.kind != "frequencies" or "factor" not in strategy.params or target <= trained:
        return None
    params = {k: config.get(k) if config.get(k) is not None else p.default for k, p in strategy.params.items()}
    return None if strategy.dynamic(params) else target / trained


def shortfalls(scaling: Scaling, trained: int, length: int) -> list[str]:
    """Why ``scaling`` cannot do what it is for at ``length`` tokens on a model trained on ``trained``, read from the
    strategy itself: a static frequency strategy whose factor covers less than the length; an attention-level rule
    whose last query sees relative positions beyond what the model covers (trained x factor). Empty: it reaches."""
    found = []
    factor = scaling.factor or 1.0
    if length <= trained or scaling.name == "none":
        return found
    if scaling.scales_frequencies and not scaling.dynamic and scaling.factor and length > trained * factor * (1 + 1e-9):
        found.append(
            f"scaling '{scaling.label}' covers {round(trained * factor)} tokens ({trained} x factor {factor:g}), "
            f"not {length}: positions beyond are extrapolated; scaling.factor={length / trained:g} covers it"
        )
    rule = scaling.position_rule()
    if rule is not None:
        import torch

        position, seen = rule.relative(torch.tensor(length - 1), torch.arange(length))
        reach = float(position[seen].max()) if bool(seen.any()) else 0.0
        if reach > trained * factor:  # LM-Infinite's global tokens at distance L itself are by design
            found.append(
                f"scaling '{scaling.label}': at {length} tokens the last query sees relative positions up to "
                f"{reach:.0f}, beyond the {round(trained * factor)} the model covers (trained {trained}"
                + (f" x factor {factor:g}" if factor != 1 else "")
                + ")"
            )
    return found


def set_up(config: Mapping, trained: int, target: int) -> tuple[Scaling, Derived]:
    """The scaling for ``target``: derived (:func:`for_target`), resolved, and checked to reach the target --
    an explicit setting that does not is a ScalingError naming it."""
    derived = for_target(config, trained, target)
    scaling = resolve(derived.config, trained)
    problems = shortfalls(scaling, trained, target)
    if problems:
        given = [k for k in derives(scaling.name) if k not in derived.why]
        hint = (
            f"; the target sets {', '.join(derives(scaling.name))} when left unset (given: {', '.join(given)})"
            if given
            else ""
        )
        raise TargetError(f"target={target} cannot be reached: {problems[0]}{hint}")
    return scaling, derived
