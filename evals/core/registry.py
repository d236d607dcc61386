"""The eval registry: one decorator per eval declares everything about it.

    @register_eval("perplexity", config=PerplexityConfig, error=PerplexityError, check=check_config,
                   needs=("model", "data"))
    def evaluate(cfg, ctx) -> dict: ...

The name (``conf/eval/<name>.yaml`` composes against the schema registered under it), the config
dataclass, the early check (``check(cfg, job)``, run before any model or data is loaded), the user-error
class, and what the eval needs (``model``: weights; ``data``: documents; ``geometry``: the model's RoPE
shape read from its config). ``EVALS``, the Hydra eval schemas, the suite's options and the user-error
handling are all derived from here (modelled on lm-evaluation-harness's ``api/registry.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .errors import UserError

NEEDS = frozenset({"model", "data", "geometry"})


@dataclass(frozen=True)
class EvalSpec:
    name: str
    run: Callable  # run(cfg, ctx) -> summary dict
    config: type  # its structured-config dataclass
    error: type[UserError]
    check: Callable | None  # check(cfg, job) before any work; raises ``error``
    needs: frozenset | Callable  # or needs(cfg) -> names, when it depends on the config
    doc: str = ""

    def needs_for(self, cfg) -> frozenset:
        """What this eval needs for ``cfg`` (e.g. a passkey needs no data; the suite: its evals' union)."""
        needs = frozenset(self.needs(cfg)) if callable(self.needs) else self.needs
        if needs - NEEDS:
            raise ValueError(f"eval '{self.name}' needs {sorted(needs - NEEDS)}, not among {sorted(NEEDS)}")
        return needs


EVALS: dict[str, EvalSpec] = {}


def register_eval(name: str, *, config: type, error: type[UserError] = UserError, check: Callable | None = None,
                  needs=("model", "data")):
    """Decorator registering ``fn(cfg, ctx) -> summary`` as the eval ``name``."""
    if not issubclass(error, UserError):
        raise ValueError(f"eval '{name}': error must be a UserError subclass, got {error}")
    if not callable(needs) and set(needs) - NEEDS:
        raise ValueError(f"eval '{name}': needs must be among {sorted(NEEDS)}, got {sorted(needs)}")

    def deco(fn: Callable) -> Callable:
        EVALS[name] = EvalSpec(name, fn, config, error, check, needs if callable(needs) else frozenset(needs),
                               (fn.__doc__ or "").strip())
        return fn

    return deco
