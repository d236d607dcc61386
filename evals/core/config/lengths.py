"""Context lengths in eval configs: a field of lengths (:func:`lengths`) that takes tokens (``4096``),
multiples of the model's trained context (``2x``) or ``target``, and their resolution to tokens when a job is
parsed (:func:`parse_length`, :func:`resolve_lengths`, :func:`check_lengths`).
"""

from __future__ import annotations

import re
from dataclasses import field, fields

from ..errors import ConfigError


LENGTH = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*[x×]\s*$")


def lengths(default: list, *, minimum: int = 1):
    """A list of context lengths: tokens (``4096``), multiples of the model's trained context (``2x``, ``0.5x``) or
    ``target`` (the run's ``target=``), mixable; resolved to tokens per model when the job is parsed
    (:func:`resolve_lengths`).
    Lengths never take part in comparing runs: runs are compared length by length."""
    from rope_ext import Param

    return field(
        default_factory=lambda: list(default),
        metadata={"lengths": True, "accepts": Param(minimum=minimum), "nonempty": True, "compare": False, "key": True},
    )


def parse_length(value, trained: int | None, where: str, target: int | None = None) -> int:
    """``4096`` -> 4096; ``"2x"`` -> 2 * trained (rounded to a whole token); ``"target"`` -> ``target`` (the run's
    ``target=``); anything else a ConfigError. ``trained`` None: the syntax only, before the model is read (a
    multiple is then of 2^20, and the message names no trained context)."""
    context = f"context ({trained})" if trained else "context"
    if isinstance(value, str) and value.strip() == "target":
        if target is None:
            raise ConfigError(
                f"{where} has 'target', but no target= is set: give one (e.g. target=4x) or lengths in "
                f"tokens or multiples of the trained {context}"
            )
        return target
    if isinstance(value, bool):
        raise ConfigError(
            f"{where}={value!r} is not a length: give tokens (4096) or a multiple of the trained {context}, e.g. 2x"
        )
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    match = LENGTH.match(str(value))
    if not match:
        raise ConfigError(
            f"{where}={value!r} is not a length: give tokens (4096) or a multiple of the trained {context}, e.g. 2x"
        )
    return round(float(match.group(1)) * (trained or 1 << 20))


def length_fields(schema: type) -> list[str]:
    return [f.name for f in fields(schema) if f.metadata.get("lengths")]


def resolve_lengths(node, schema: type, trained: int, path: str, target: int | None = None) -> None:
    """Every length field of ``node`` (an eval config) in tokens, in place: ``[1x, 2x, 4x]`` on a model trained
    at 8192 is ``[8192, 16384, 32768]``, ``[1x, target]`` with target=4x ``[8192, 32768]``; each is then checked
    against the field's minimum."""
    for name in length_fields(schema):
        if name not in node or node[name] is None:
            continue
        resolved = [parse_length(v, trained, f"{path}.{name}", target) for v in node[name]]
        node[name] = list(dict.fromkeys(resolved))  # 1x and 8192 on a model trained at 8192 are one length


def check_lengths(node, schema: type, path: str) -> None:
    """Resolved lengths against what their field accepts (after :func:`resolve_lengths`)."""
    for spec in fields(schema):
        if spec.metadata.get("lengths") and spec.name in node and node[spec.name] is not None:
            values = list(node[spec.name])
            if not values:
                raise ConfigError(f"{path}.{spec.name} is empty")
            why = next(filter(None, map(spec.metadata["accepts"].why, values)), None)
            if why:
                raise ConfigError(f"{path}.{spec.name}={values}: each value {why} tokens")
