"""Structured-config schemas generated from the registries: one dataclass per registered rope_ext strategy
(:func:`scaling_schema`, from its declared parameters and defaults: ``scaling=linear scaling.beta_fast=32`` fails
at composition and ``--cfg job scaling=yarn`` shows yarn's real defaults) and the suite's (:func:`suite_schema`,
one field per registered eval). Each eval writes its own config dataclass (``evals.core.registry``).

The generated classes live in this module by name (``YarnScaling``, ``SuiteConfig``): launchers pickle configs,
and a worker that unpickles one finds its class here (the module's ``__getattr__`` registers them first).
"""

from __future__ import annotations

import sys
from dataclasses import field, make_dataclass
from typing import Any, List, Optional


_PYTHON_TYPES = {
    float: Optional[float],
    int: Optional[int],
    bool: Optional[bool],
    list: Optional[List[Any]],
    str: Optional[str],
}


def scaling_schema_name(strategy: str) -> str:
    """``dynamic_ntk`` -> ``DynamicNtkScaling``."""
    return "".join(part.title() for part in strategy.split("_")) + "Scaling"


def scaling_schema(strategy) -> type:
    """The structured config of one rope_ext strategy: its name, its declared parameters with their
    defaults, and the patcher's ``layer_types``."""
    from rope_ext.strategies.scaling import PATCH_KEYS

    specs = [("name", str, field(default=strategy.name))]
    for key, param in strategy.params.items():
        # a parameter a target sets stays unset (null: derived from target=, else the registered default)
        default = param.default if param.type is not list and key not in strategy.targets else None
        specs.append((key, _PYTHON_TYPES[param.type], field(default=default)))
    specs += [(key, Any, field(default=value)) for key, value in PATCH_KEYS.items()]
    class_name = scaling_schema_name(strategy.name)
    schema = make_dataclass(class_name, specs)
    schema.__module__ = __name__
    setattr(sys.modules[__name__], class_name, schema)  # importable by name: launchers pickle configs
    return schema


def suite_schema(evals: dict) -> type:
    """``eval=suite``: one field per registered eval, each composed from its ``eval/<name>`` option where there is
    one (a YAML on the search path, or generated: :mod:`evals.core.config.store`; ``optional``: an eval without an
    option leaves its field null)."""
    names = [name for name in evals if name != "suite"]
    specs = [
        (
            "defaults",
            List[Any],
            field(default_factory=lambda: ["_self_", *[{f"optional /eval@{n}": n} for n in names]]),
        ),
        ("name", str, field(default="suite")),
        ("run", List[str], field(default_factory=lambda: ["perplexity", "needle"])),
    ]
    specs += [(name, Any, field(default=None)) for name in names]
    schema = make_dataclass("SuiteConfig", specs)
    schema.__module__ = __name__
    setattr(sys.modules[__name__], "SuiteConfig", schema)
    return schema


def __getattr__(name: str):
    """Schema classes are generated from the registries; a process that unpickles a config (a joblib or
    submitit worker) finds them here by name before anything registered them."""
    if name.endswith("Scaling") or name == "SuiteConfig":
        from evals import load_evals
        from evals.core.registry import EVALS
        from rope_ext import STRATEGIES

        load_evals()
        if name == "SuiteConfig":
            return suite_schema(EVALS)
        for strategy in STRATEGIES.values():
            if scaling_schema_name(strategy.name) == name:
                return scaling_schema(strategy)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
