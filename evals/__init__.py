"""The evals of rope_ext and the machinery that runs them as jobs.

Each eval is one module that registers itself (``evals.core.registry.register_eval``) with its config
dataclass, early check, user-error class and needs, plus one ``conf/eval/<name>.yaml``:

- ``perplexity``  perplexity by length, prefix and sliding protocols (evals/perplexity.py)
- ``needle``, ``passkey``  retrieval grids over lengths x depths (evals/retrieval.py, prompts: evals/haystack.py)
- ``rope_decay``  the analytic RoPE studies, no weights (evals/rope_decay.py)
- ``qk_study``    the model's own q and k: per-pair statistics, score profiles, the decay conjecture (evals/qk_study.py)
- ``lm_eval``     lm-evaluation-harness tasks on the patched model (evals/lm_harness.py)
- ``ruler``       RULER's synthetic tasks offline, from lm-eval's generators and scoring (evals/ruler.py)
- ``suite``       several of them on one loaded model (evals/suite.py)

``evals/core/`` holds the job machinery: config schemas, the job model, runner, models, data, output
sink, tracking, plots. ``load_evals()`` imports the built-in evals and any modules named in
``$ROPE_EXT_PLUGINS`` (comma-separated), whose ``register``/``register_eval`` calls add strategies and evals.
"""

from __future__ import annotations

import importlib
import os

from .core.errors import UserError
from .core.registry import EVALS, register_eval

BUILTIN = ("perplexity", "retrieval", "rope_decay", "qk_study", "lm_harness", "ruler", "suite")

__all__ = ["EVALS", "UserError", "load_evals", "register_eval"]


def load_evals() -> dict:
    """Import the built-in evals and the plugins of ``$ROPE_EXT_PLUGINS``; returns the registry."""
    for name in BUILTIN:
        importlib.import_module(f"{__name__}.{name}")
    for module in filter(None, (m.strip() for m in os.environ.get("ROPE_EXT_PLUGINS", "").split(","))):
        importlib.import_module(module)
    return EVALS
