"""The eval registry: one decorator per eval declares everything about it.

    @register_eval("perplexity", config=PerplexityConfig, error=PerplexityError, check=check_config,
                   needs=("model", "data"), metrics=(Metric("ppl", lower_is_better=True, verdict=True), ...))
    def evaluate(cfg, ctx) -> dict: ...

The name (``conf/eval/<name>.yaml`` composes against the schema registered under it), the config
dataclass, the early check (``check(cfg, job)``, run before any model or data is loaded), the user-error
class, what the eval needs (``model``: weights; ``data``: documents; ``geometry``: the model's RoPE
shape read from its config), the metrics it reports per length (their direction, and whether the verdict
judges them), ``resolve(cfg)`` filling what its lengths decide before the job key is taken,
``reference(cfg)`` adapting its config for the unscaled reference run, ``report(name, runs, label)`` giving
its own figures to the report, and -- for an eval made of others, the suite -- ``parts(cfg)``. ``EVALS``,
the Hydra eval schemas, the suite's options, the user-error handling, the job key, the comparison with a
reference, the verdict and the report are all derived from here; nothing else names an eval (modelled on
lm-evaluation-harness's ``api/registry.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

from .errors import UserError

NEEDS = frozenset({"model", "data", "geometry"})


@dataclass(frozen=True)
class Metric:
    """A number an eval reports per length as ``<name>@L`` in its summary.

    ``lower_is_better``: its direction; ``verdict``: the verdict judges it against the unscaled model
    (lower-is-better ones within ``verdict.tolerance``, higher-is-better ones by ``verdict.retained``);
    ``count``: the summary key (``<count>@L``) saying how many tokens, trials or samples a value rests on,
    which must match the reference's for a comparison; ``interval``: whether ``<name>_ci95_low@L`` and
    ``<name>_ci95_high@L`` are reported; ``label``: how tables and figures name it; ``log``: drawn on a log
    axis; ``bounds``: the range its values live in (accuracies 0-1, RULER scores 0-100), the axis range and, for a
    higher-is-better metric, what makes its paired comparison a proportion's (evals/core/stats.py); ``nll``: its units
    are NLL sums, so two runs compare as exp of their paired mean difference (a perplexity ratio); ``unit``: what
    its values average over (``token block``, ``prompt``, ``sample``: evals/core/measure.py)."""

    name: str
    lower_is_better: bool = False
    verdict: bool = False
    count: str | None = None
    interval: bool = False
    label: str = ""
    log: bool = False
    bounds: tuple | None = None
    nll: bool = False
    unit: str = ""

    def declared(self, eval_name: str) -> dict:
        """What results.json records of it (the report and the verdict read this, not the registry)."""
        return {
            **asdict(self),
            "eval": eval_name,
            "label": self.label or self.name,
            "bounds": list(self.bounds) if self.bounds else None,
        }


@dataclass(frozen=True)
class EvalSpec:
    name: str
    run: Callable  # run(cfg, ctx) -> summary dict
    config: type  # its structured-config dataclass
    error: type[UserError]
    check: Callable | None  # check(cfg, job) before any work; raises ``error``
    needs: frozenset | Callable  # or needs(cfg) -> names, when it depends on the config
    metrics: tuple | Callable = ()  # Metric declarations, or metrics(cfg) -> them (names that follow the config)
    resolve: Callable | None = None  # resolve(cfg): fill, in place, what the resolved lengths decide
    reference: Callable | None = None  # reference(cfg): adapt, in place, the config of an unscaled reference run
    parts: Callable | None = None  # parts(cfg) -> [(eval name, its config)] for an eval made of others
    report: Callable | None = None  # report(name, runs, label) -> {figure name: figure}: its section of the report

    def needs_for(self, cfg) -> frozenset:
        """What this eval needs for ``cfg`` (e.g. a passkey needs no data; the suite: its evals' union)."""
        needs = frozenset(self.needs(cfg)) if callable(self.needs) else self.needs
        if needs - NEEDS:
            raise ValueError(f"eval '{self.name}' needs {sorted(needs - NEEDS)}, not among {sorted(NEEDS)}")
        return needs

    def parts_of(self, cfg) -> list[tuple["EvalSpec", object]]:
        """(eval, config) of each eval this one runs: itself, or a suite's members."""
        if self.parts is None:
            return [(self, cfg)]
        return [(EVALS[name], part) for name, part in self.parts(cfg)]

    def metrics_for(self, cfg) -> tuple[Metric, ...]:
        """The per-length metrics this eval declares for ``cfg`` (a suite: those of its members)."""
        if self.parts is not None:
            return tuple(m for spec, part in self.parts_of(cfg) for m in spec.metrics_for(part))
        return tuple(self.metrics(cfg) if callable(self.metrics) else self.metrics)


EVALS: dict[str, EvalSpec] = {}


def register_eval(
    name: str,
    *,
    config: type,
    error: type[UserError] = UserError,
    check: Callable | None = None,
    needs=("model", "data"),
    metrics=(),
    resolve: Callable | None = None,
    reference: Callable | None = None,
    parts: Callable | None = None,
    report: Callable | None = None,
):
    """Decorator registering ``fn(cfg, ctx) -> summary`` as the eval ``name``."""
    if not issubclass(error, UserError):
        raise ValueError(f"eval '{name}': error must be a UserError subclass, got {error}")
    if not callable(needs) and set(needs) - NEEDS:
        raise ValueError(f"eval '{name}': needs must be among {sorted(NEEDS)}, got {sorted(needs)}")

    def deco(fn: Callable) -> Callable:
        from rope_ext.strategies.registry import where

        if name in EVALS and where(EVALS[name].run) != where(fn):  # the same module imported again is no conflict
            raise ValueError(f"eval name '{name}' is registered twice: by {where(EVALS[name].run)} and by {where(fn)}")
        EVALS[name] = EvalSpec(
            name,
            fn,
            config,
            error,
            check,
            needs if callable(needs) else frozenset(needs),
            metrics if callable(metrics) else tuple(metrics),
            resolve,
            reference,
            parts,
            report,
        )
        return fn

    return deco
