"""The evals of rope_ext, the machinery that runs them as jobs, and the app around them.

- Each eval is a module (or a package, with its private helpers beside it) that registers itself with
  ``register_eval``: its name, config dataclass, early check, user-error class, needs, the metrics it reports
  per length and, if it has one, its section of the report; plus ``conf/eval/<name>.yaml`` to set values. The built-in
  ones -- ``perplexity/`` (LongPPL's key tokens beside it), ``retrieval/`` (needle and passkey, prompts in its
  ``haystack.py``), ``ruler.py``, ``lm_harness.py``, ``rope_decay.py``, ``qk_study/`` (measure, present), ``suite.py`` -- are
  discovered, not listed; ``scoring/`` (NLL, OOM, cost) and ``stats.py`` are what they share.
- ``core/`` is the job machinery, one folder per job: ``config/`` (schemas), ``inputs/`` (the model resolved
  once and loaded, the data, what an eval gets), ``decision/`` (the verdict, the ranked answer), ``job/`` (the job
  parsed once), ``run/`` (the runner, the reference search, the output sink, tracking); beside them what all share
  (the eval registry, measurements, errors, files, progress, plots).
- ``setup/`` holds the set-up tools ``make setup`` runs: the books fetched, GGUF chunks joined.
- The app: ``cli.py`` (the Hydra app behind ``run.py`` and ``rope-ext``), ``report/`` (``python -m
  evals.report``) and ``search/`` (a search over a strategy's parameters, ``-m hydra/sweeper=optuna``).

``load_evals()`` imports every eval of this package and any modules named in ``$ROPE_EXT_PLUGINS``
(comma-separated), whose ``register``/``register_eval`` calls add strategies and evals. Loading them imports no
torch, transformers, matplotlib, lm-eval or W&B: each module imports those where it computes, so the command line
is parsed and checked -- ``--help`` and every one-line bad-input error -- before anything only a running job needs
is imported (tests/test_run.py runs them and looks at ``sys.modules``).
"""

from __future__ import annotations

import importlib
import os
import pkgutil

from .core.errors import UserError
from .core.measure import Measurement, token_blocks
from .core.registry import EVALS, Metric, register_eval

APP = (
    "cli",
    "report",
    "lm_eval_tasks",
    "core",
    "search",
    "setup",
    "families",
    "family_table",
    "models",
    "planning",
)  # not evals: nothing of theirs registers

__all__ = ["EVALS", "Measurement", "Metric", "UserError", "load_evals", "register_eval", "token_blocks"]


def load_evals() -> dict:
    """Import the evals of this package (each registers itself) and the plugins of ``$ROPE_EXT_PLUGINS``;
    returns the registry."""
    for module in pkgutil.iter_modules(__path__):
        if module.name not in APP:
            importlib.import_module(f"{__name__}.{module.name}")
    for module in filter(None, (m.strip() for m in os.environ.get("ROPE_EXT_PLUGINS", "").split(","))):
        importlib.import_module(module)
    return EVALS
