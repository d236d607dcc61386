"""``eval=suite``: several evals in one job on one loaded, patched model; their summaries merged.

Its schema is derived from the registry (one field per registered eval, each composed from that eval's
YAML), so a new eval is a suite option without an edit here: ``eval=suite eval.run=[perplexity,needle]
eval.needle.lengths=[4096]``. The job treats each member as a part of its own: options, lengths, checks,
declared metrics and the comparison with a reference are those of the member.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import List

from ..core.config.fields import not_an_option
from ..core.config.schemas import suite_schema
from ..core.errors import ConfigError
from ..core.registry import EVALS, register_eval


@dataclass
class SuiteOptions:
    """The suite's own options (its full schema, with a field per eval, is built by evals.core.config.schemas)."""

    name: str = "suite"
    run: List[str] = field(default_factory=lambda: ["perplexity", "needle"])


def members(cfg) -> list[tuple[str, object]]:
    """(eval name, its config) for each eval of ``eval.run``; an unknown one is a ConfigError."""
    extra = [key for key in cfg.keys() if key not in EVALS and key not in {f.name for f in fields(SuiteOptions)}]
    if extra:
        raise ConfigError(not_an_option(f"eval.{extra[0]}", extra[0], suite_schema(EVALS)))
    valid = [name for name in EVALS if name != "suite" and cfg.get(name) is not None]
    unknown = [name for name in cfg.run if name not in valid]
    if unknown or not cfg.run:
        raise ConfigError(f"eval.run={list(cfg.run)} has unknown {unknown or 'nothing'}; valid: {', '.join(valid)}")
    return [(name, cfg[name]) for name in dict.fromkeys(cfg.run)]


def _needs(cfg) -> frozenset:
    return frozenset().union(*(EVALS[name].needs_for(part) for name, part in members(cfg)))


@register_eval("suite", config=SuiteOptions, error=ConfigError, needs=_needs, parts=members)
def suite(cfg, ctx) -> dict:
    """Run the evals named in ``eval.run`` on the same patched model; their summaries merged."""
    summary = {}
    for name, part in members(cfg):
        summary.update(EVALS[name].run(part, ctx))
    return summary
