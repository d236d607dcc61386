"""The evals of rope_ext, the machinery that runs them as jobs, and the app around them.

- ``tasks/`` holds the evals and nothing else: each module there (or package, with its private helpers beside it)
  registers itself with ``register_eval``: its name, config dataclass, early check, user-error class, needs, the
  metrics it reports per length and, if it has one, its section of the report; plus ``conf/eval/<name>.yaml`` to set
  values. The built-in ones -- ``perplexity/`` (LongPPL's key tokens beside it), ``retrieval/`` (needle and passkey,
  prompts in its ``haystack.py``), ``ruler.py``, ``lm_harness.py``, ``rope_decay.py``, ``qk_study/`` (measure,
  present), ``suite.py`` -- are discovered, not listed: a module dropped there that registers nothing fails
  tests/test_run.py.
- ``core/`` is the job machinery, one folder per job: ``config/`` (schemas), ``inputs/`` (the model resolved
  once and loaded, the data, what an eval gets), ``decision/`` (the verdict, the ranked answer), ``job/`` (the job
  parsed once), ``run/`` (the runner, the reference search, the output sink, tracking); beside them what all share
  (the eval registry, measurements, errors, files, progress, plots) and what the evals share: ``scoring/`` (NLL,
  OOM, cost), ``stats.py`` (intervals), ``planning.py`` (the advice of an inconclusive verdict),
  ``projection_bias.py`` (q/k/v biases ablated for an eval).
- ``setup/`` holds the set-up tools ``make setup`` runs: the books fetched, GGUF chunks joined.
- The app: ``cli.py`` (the Hydra app behind ``run.py`` and ``rope-ext``), ``report/`` (``python -m
  evals.report``), ``search/`` (a search over a strategy's parameters, ``-m hydra/sweeper=optuna``), ``export.py``
  (``python -m evals.export``), ``models.py`` (``python -m evals.models``), ``families.py`` and ``family_table.py``
  (the compatibility survey, docs/models.md) and ``lm_eval_tasks/`` (lm-eval's task YAMLs).

``load_evals()`` imports every module of ``tasks/`` and any modules named in ``$ROPE_EXT_PLUGINS``
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
from . import tasks

__all__ = ["EVALS", "Measurement", "Metric", "UserError", "load_evals", "register_eval", "token_blocks"]


def load_evals() -> dict:
    """Import every module of ``tasks/`` (each registers its evals) and the plugins of ``$ROPE_EXT_PLUGINS``;
    returns the registry."""
    for module in pkgutil.iter_modules(tasks.__path__):
        importlib.import_module(f"{tasks.__name__}.{module.name}")
    for module in filter(None, (m.strip() for m in os.environ.get("ROPE_EXT_PLUGINS", "").split(","))):
        importlib.import_module(module)
    return EVALS
