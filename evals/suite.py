"""``eval=suite``: several evals in one job on one loaded, patched model; their summaries merged.

Its schema is derived from the registry (one field per registered eval, each composed from that eval's
YAML), so a new eval is a suite option without an edit here: ``eval=suite eval.run=[perplexity,needle]
eval.needle.lengths=[4096]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from .core.errors import ConfigError
from .core.config import check_options
from .core.job import with_eval
from .core.registry import EVALS, register_eval


@dataclass
class SuiteOptions:
    """The suite's own options (its full schema, with a field per eval, is built by evals.core.config)."""

    name: str = "suite"
    run: List[str] = field(default_factory=lambda: ["perplexity", "needle"])


def check_suite(cfg, job) -> None:
    valid = [name for name in EVALS if name != "suite" and cfg.get(name) is not None]
    unknown = [name for name in cfg.run if name not in valid]
    if unknown or not cfg.run:
        raise ConfigError(f"eval.run={list(cfg.run)} has unknown {unknown or 'nothing'}; valid: {', '.join(valid)}")
    for name in cfg.run:
        spec = EVALS[name]
        check_options(cfg[name], spec.config, f"eval.{name}")
        if spec.check:
            spec.check(cfg[name], with_eval(job, spec, cfg[name]))


def _needs(cfg) -> frozenset:
    return frozenset().union(*(EVALS[name].needs_for(cfg[name]) for name in cfg.run if name in EVALS and cfg.get(name)))


@register_eval("suite", config=SuiteOptions, error=ConfigError, check=check_suite, needs=_needs)
def suite(cfg, ctx) -> dict:
    """Run the evals named in ``eval.run`` on the same patched model; their summaries merged."""
    summary = {}
    for name in cfg.run:
        summary.update(EVALS[name].run(cfg[name], ctx))
    return summary
