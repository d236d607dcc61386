"""A sweep before it runs: how many jobs it launches, and the preflight of a sweep with a target (``target``
lengths without ``target=`` refused once; with one, what the sweep will cost)."""

from __future__ import annotations


def _uses_target(node) -> bool:
    """Whether any value in the config ``node`` is the length ``target``."""
    from omegaconf import DictConfig, ListConfig

    if isinstance(node, DictConfig):
        return any(_uses_target(node.get(k)) for k in node)
    if isinstance(node, ListConfig):
        return any(_uses_target(v) for v in node)
    return isinstance(node, str) and node.strip() == "target"


def sweep_size(config) -> int:
    """How many jobs a basic sweep launches: the product of its swept values (the command line's and the sweeper's),
    as Hydra expands them (``a,b``, ``choice(...)``, ``range(...)``); 0 when it cannot tell (``glob``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    lines = list(config.hydra.overrides.task)
    given = {line.split("=", 1)[0] for line in lines}
    lines += [f"{key}={value}" for key, value in (config.hydra.sweeper.get("params") or {}).items() if key not in given]
    size = 1
    try:
        for override in OverridesParser.create().parse_overrides(lines):
            if override.is_sweep_override():
                size *= len(list(override.sweep_string_iterator()))
    except Exception:  # noqa: BLE001 -- an estimate only
        return 0
    return size


def target_preflight(config) -> list[str]:
    """Before a sweep's first job (``config``: its first job's, with Hydra's; ``evals.cli`` calls this): a sweep whose
    lengths say ``target`` without ``target=`` is one line and exit 2 (not one failure per job); with a target,
    what the sweep will cost (:mod:`evals.core.run.budget`)."""
    from ..core.run.budget import sweep_budget
    from ..core.run.memory import budget_line
    from ..core.errors import ConfigError
    from ..core.job.target import parse_target
    from ..core.inputs.models import resolve_model

    if config.get("target") in (None, ""):
        if _uses_target(config.eval):
            raise ConfigError(
                "this sweep's eval lengths include 'target' but no target= is given: add one, e.g. "
                "python run.py -m experiment=compare target=2x"
            )
        return []
    parse_target(config)
    model = resolve_model(config.model, geometry=False, weights=False)
    target = parse_target(config, model.trained_context)
    jobs = sweep_size(config)
    lines, work = sweep_budget(config, model, target, jobs) if jobs else ([], [])
    return [*lines, budget_line(config.model, model.config, config.eval, work)] if lines else []
