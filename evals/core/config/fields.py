"""Declaring a structured-config field's accepted values, and checking a config node against them.

:func:`option` declares a dataclass field with the values it accepts (choices or numeric bounds, as a
``rope_ext.Param``) and what it does to a result (``key``/``compare``); :func:`check_options` checks a node
against those declarations before any work starts (:func:`not_an_option` words an unknown key);
:func:`identity_fields` is a node without the fields that do not identify a job (``key``) or a comparison
(``compare``).
"""

from __future__ import annotations

from dataclasses import field, fields
from typing import Any

from omegaconf import MISSING, OmegaConf

from ..errors import ConfigError


def option(
    default: Any = MISSING,
    *,
    choices=None,
    minimum=None,
    maximum=None,
    above=None,
    nonempty=False,
    compare: bool = True,
    key: bool = True,
):
    """A dataclass field with the values it accepts -- ``choices``, or numeric bounds (``minimum`` and
    ``maximum`` inclusive, ``above`` exclusive) -- declared as a ``rope_ext.Param``, the one rule strategy
    parameters use too. For a list, every item is checked (and, with ``nonempty``, there must be one).

    What the field does to a result: ``key=False`` -- it changes no number the eval measures (it only says
    how results are judged or what runs around the job), so it is left out of the job key; ``compare=False``
    -- it does not change the number measured *at a given length* (the lengths themselves, chunk sizes,
    which extra metrics run), so runs that differ in it are still compared length by length."""
    from rope_ext import Param

    accepts = Param(
        None if default is MISSING or isinstance(default, (list, dict)) else default,
        choices=choices,
        minimum=minimum,
        maximum=maximum,
        above=above,
    )
    meta = {"accepts": accepts, "nonempty": nonempty, "compare": compare and key, "key": key}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def not_an_option(full_key: str, key: str, schema: type) -> str:
    """The one line for a key the schema does not have: the key as the user wrote it, what is valid, the
    closest valid one."""
    import difflib

    valid = [f.name for f in fields(schema) if f.name not in ("name", "defaults")]
    close = difflib.get_close_matches(str(key), valid, n=1)
    hint = f" Did you mean {close[0]}?" if close else ""
    return f"{full_key} is not an option here; valid: {', '.join(valid)}.{hint}"


def check_options(node, schema: type, path: str) -> None:
    """Every key of ``node`` known to the schema (``+eval.<key>=`` adds keys past Hydra's struct check) and
    every field with declared choices or bounds checked; the first bad one is a ConfigError naming
    ``path.field``, the value, and what is valid."""
    known = {spec.name for spec in fields(schema)}
    for key in node.keys() if hasattr(node, "keys") else ():
        if key not in known and key != "defaults":
            raise ConfigError(not_an_option(f"{path}.{key}", key, schema))
    for spec in fields(schema):
        meta = spec.metadata
        if not meta or spec.name not in node or meta.get("lengths"):
            continue
        value = node[spec.name]
        if value is None:
            continue
        items = list(value) if OmegaConf.is_list(value) or isinstance(value, (list, tuple)) else [value]
        for item in items:
            why = meta["accepts"].why(item) if meta.get("accepts") else None
            if why:
                shown = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
                what = f"each value {why}" if len(items) != 1 or shown is not item else why
                raise ConfigError(f"{path}.{spec.name}={shown!r}: {what}")
        if meta.get("nonempty") and not items:
            raise ConfigError(f"{path}.{spec.name} is empty")


def identity_fields(schema: type, node, role: str) -> dict:
    """``node`` as a plain dict without the fields whose ``role`` (``key`` or ``compare``) is off; nested
    structured configs are filtered by their own fields."""
    import dataclasses

    plain = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
    found = {}
    for name, value in plain.items():
        spec = next((f for f in fields(schema) if f.name == name), None)
        if spec is not None and spec.metadata.get(role) is False:
            continue
        nested = (
            spec.type
            if spec is not None and isinstance(spec.type, type) and dataclasses.is_dataclass(spec.type)
            else None
        )
        if nested is None and spec is not None and spec.default_factory is not dataclasses.MISSING:
            made = spec.default_factory()
            nested = type(made) if dataclasses.is_dataclass(made) else None
        found[name] = identity_fields(nested, value, role) if nested and isinstance(value, dict) else value
    return found
