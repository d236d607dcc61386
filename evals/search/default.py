"""The one length a search compares its settings at, and the setting it sets its best against.

- The length: the objective's length (the longest, for several objectives); ``target=`` or ``verdict.target``, when
  given, must name the same one (a search optimising at one length and answering at another is refused). Every trial's verdict answers at it (``verdict.target=<length>`` is added to a trial's
  overrides when neither is given), so a search's trials are judged at one length, not each at its own
  trained x factor.
- The published default for that length: the strategy's parameters as ``target=<length>`` sets them up
  (:func:`rope_ext.strategies.targets.for_target`: YaRN's factor = length / trained, its published betas), its registered values
  elsewhere; a cos/sin factor left unset (YaRN's 0.1 ln s + 1, LongRoPE's sqrt(1 + ln s / ln L)) is the one the
  strategy applies, read from its own frequencies. Tried first as trial 0 when every searched value has one inside
  its range; otherwise none, and the line says why.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from ..core.config.lengths import parse_length
from . import objective as objectives_of
from . import space as spaces

ATTENTION = "attention_factor"  # a strategy's cos/sin factor: unset means the one the strategy computes


def judged_length(cfg, trained: int) -> tuple[int | None, str]:
    """(the length every trial is judged at, where it comes from); (None, "") without an objective length. A
    ``target=`` or ``verdict.target`` other than the objective's length (the longest of several) is a ConfigError:
    the search would optimise at one length and answer at another."""
    from ..core.errors import ConfigError
    from ..core.job.target import parse_target

    texts = OmegaConf.to_container(cfg, resolve=True).get("objective")
    texts = [texts] if isinstance(texts, str) else list(texts or [])
    lengths = [int(m.group(2)) for m in map(objectives_of.AT.match, map(str, texts)) if m]
    longest = max(lengths, default=None)
    target, given = parse_target(cfg, trained), cfg.verdict.get("target")
    if target is not None:
        length, source = target, f"target={cfg.get('target')}"
    elif given is not None:
        length, source = parse_length(given, trained, "verdict.target"), f"verdict.target={given}"
    elif longest is None:
        return None, ""
    else:
        return longest, f"objective={texts[lengths.index(longest)]}"
    if longest is not None and longest != length:
        objective = texts[lengths.index(longest)]
        metric, key = objective.split("@")[0], source.split("=")[0]
        tokens = "" if source.endswith(f"={length}") else f" ({length} tokens)"
        raise ConfigError(
            f"objective={objective} and {source}{tokens} are two lengths; a search optimises and is judged at one: "
            f"objective={metric}@{length} with {source}, or no {key} (the search is then judged at {longest})"
        )
    return length, source


def published(strategy, scaling: dict, space: list, trained: int, length: int, slots) -> tuple[dict | None, str]:
    """(the published default of the searched values for ``length`` as {key: value}, how it was set up), or
    (None, why there is none). ``scaling``: the search's fixed scaling config; ``slots``: the scaled layers'
    rotary geometry (for a cos/sin factor the strategy computes)."""
    import rope_ext
    from rope_ext.strategies.targets import for_target

    names = [dim.key.split(".", 1)[1] for dim in space]
    for dim in space:
        if not isinstance(dim, spaces.Scalar):
            return None, f"{dim.key} is a per-dimension list with no published value"
    config = {**scaling, **dict.fromkeys(names)}  # the searched values unset: the target and the registry set them
    try:
        derived = for_target(config, trained, length)
        values = {k: p.default for k, p in strategy.params.items()} | {
            k: v for k, v in rope_ext.resolve(derived.config, trained).params.items() if v is not None
        }
    except rope_ext.ScalingError as err:
        return None, str(err)
    if values.get(ATTENTION) is None and ATTENTION in names and slots:
        scaled = rope_ext.select_slots(slots, values.get("layer_types") or "auto")
        geometry = scaled[0] if scaled else slots[0]
        resolved = rope_ext.resolve({"name": strategy.name, **values}, trained)
        values[ATTENTION] = float(resolved.frequencies(geometry.dim, geometry.base)[1])
    setting = {}
    for dim, name in zip(space, names):
        value = values.get(name)
        if value is None:
            return None, f"{name} has no published value"
        if dim.kind == "categorical":
            inside = value in dim.choices
        else:
            inside = isinstance(value, (int, float)) and not isinstance(value, bool) and dim.low <= value <= dim.high
        if not inside:
            return None, f"its {name}={shown(value)} lies outside the searched {dim.describe()}"
        setting[dim.key] = value
    why = "; ".join(f"{key}={shown(value)} ({reason})" for key, (value, reason) in derived.why.items())
    return setting, why


def shown(value) -> str:
    """A value as the search's lines show it."""
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)
