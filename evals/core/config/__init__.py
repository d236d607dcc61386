"""The configuration: structured configs, their checks, and what Hydra's ConfigStore holds.

- :mod:`.fields`: :func:`option` (a field with its accepted values and its role in the job key),
  :func:`check_options`, :func:`identity_fields`.
- :mod:`.lengths`: length fields (``4096``, ``2x``, ``target``) and their resolution to tokens.
- :mod:`.structured`: the hand-written structured configs (``Config``, ``ModelConfig``, ``DataConfig``,
  ``LoggerConfig``, ``VerdictConfig``).
- :mod:`.schemas`: the schemas generated from the registries (one per strategy, the suite's).
- :mod:`.store`: ConfigStore registration (schemas, and the options that need no YAML) and ``config_dir()``.
- :mod:`.resolvers`: the OmegaConf resolvers the YAMLs use (registered when this package is imported).

Value ranges and choices are declared on the fields with :func:`option` and checked by :func:`check_options`
before any work starts (a misspelled key or a wrong type already fails at composition).
"""

from . import resolvers  # noqa: F401 -- registers the resolvers the YAMLs use
from .fields import check_options, identity_fields, not_an_option, option
from .lengths import LENGTH, check_lengths, length_fields, lengths, parse_length, resolve_lengths
from .schemas import scaling_schema, scaling_schema_name, suite_schema
from .store import ABOUT, config_dir, register_configs
from .structured import AUSTEN_BOOKS, Config, DataConfig, LoggerConfig, ModelConfig, VerdictConfig

__all__ = [
    "ABOUT",
    "AUSTEN_BOOKS",
    "Config",
    "DataConfig",
    "LENGTH",
    "LoggerConfig",
    "ModelConfig",
    "VerdictConfig",
    "check_lengths",
    "check_options",
    "config_dir",
    "identity_fields",
    "length_fields",
    "lengths",
    "not_an_option",
    "option",
    "parse_length",
    "register_configs",
    "resolve_lengths",
    "scaling_schema",
    "scaling_schema_name",
    "suite_schema",
]
