"""Evals for rope_ext. Each is a function ``evaluate(eval_cfg, ctx) -> summary dict`` registered in
``EVALS`` under the name its config (``conf/eval/<name>.yaml``) carries."""

from __future__ import annotations

from rope_ext import ScalingError

from . import harness, needle, perplexity, rope_decay
from .data import SOURCES, DataError
from .haystack import HaystackError
from .models import ModelLoadError


def suite(cfg, ctx) -> dict:
    """Run the evals named in ``cfg.run`` on the same patched model; their summaries merged."""
    summary = {}
    for name in cfg.run:
        summary.update(EVALS[name](cfg[name], ctx))
    return summary


def check_suite(cfg) -> None:
    unknown = [name for name in cfg.run if name not in EVALS or name == "suite" or cfg.get(name) is None]
    if unknown or not cfg.run:
        valid = [name for name in EVALS if name != "suite" and cfg.get(name) is not None]
        raise ConfigError(f"eval.run={list(cfg.run)} has unknown {unknown or 'nothing'}; valid: {', '.join(valid)}")
    for name in cfg.run:
        if name in CHECKS:
            CHECKS[name](cfg[name])


EVALS = {"perplexity": perplexity.evaluate, "rope_decay": rope_decay.evaluate, "needle": needle.evaluate,
         "passkey": needle.evaluate, "lm_eval": harness.evaluate, "suite": suite}
CHECKS = {"perplexity": perplexity.check_config, "needle": needle.check_config, "passkey": needle.check_config,
          "lm_eval": harness.check_config, "suite": check_suite}


class ConfigError(ValueError):
    """A config value that cannot work, found before any work starts."""


USER_ERRORS = (ScalingError, ModelLoadError, DataError, ConfigError, perplexity.PerplexityError, HaystackError,
               harness.HarnessError)


def check(cfg) -> None:
    """Fail early, with the bad value and the valid choices, before any model or data is loaded."""
    import rope_ext

    from .context import scaling_dict
    from .models import check_model_config
    from .tracking import MODES

    if cfg.eval.name not in EVALS:
        raise ConfigError(f"eval.name={cfg.eval.name!r} is not one of {', '.join(EVALS)}")
    rope_ext.validate(scaling_dict(cfg))
    if cfg.eval.name in CHECKS:
        CHECKS[cfg.eval.name](cfg.eval)
    if cfg.data.source not in SOURCES:
        raise ConfigError(f"data.source={cfg.data.source!r} is not one of {', '.join(SOURCES)}")
    check_model_config(cfg.model)
    if cfg.logger.mode not in MODES:
        raise ConfigError(f"logger.mode={cfg.logger.mode!r} is not one of {', '.join(MODES)}")
