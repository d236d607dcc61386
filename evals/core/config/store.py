"""Hydra's ConfigStore: every schema, and the generated option ``eval=suite``.

- ``config_schema`` and ``schema/{model,data,logger}/base``: the hand-written structured configs
  (:mod:`evals.core.config.structured`).
- ``schema/scaling/<strategy>`` and ``schema/eval/<name>``: one per registered strategy (generated,
  :mod:`evals.core.config.schemas`) and eval (the dataclass it registers, ``evals.core.registry``).
- Each option file ``conf/<group>/<option>.yaml`` names its schema first in its defaults list
  (``- /schema/<group>@_here_: <name>``); ``eval=suite`` has no file (:func:`evals.core.config.schemas.suite_schema`).

:func:`config_dir` finds ``conf/`` (shipped inside the package, or the checkout's).
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_store import ConfigStore

from .schemas import scaling_schema, suite_schema
from .structured import Config, DataConfig, LoggerConfig, ModelConfig


def config_dir() -> Path:
    """The ``conf/`` directory: inside the installed package (``pip install .``), else the checkout's."""
    shipped = Path(__file__).resolve().parents[2] / "conf"
    return shipped if shipped.is_dir() else Path(__file__).resolve().parents[3] / "conf"


def register_configs() -> None:
    """Store every schema in Hydra's ConfigStore, from the registries as they are now
    (call again after registering a strategy or an eval of your own)."""
    from rope_ext import STRATEGIES

    from ..registry import EVALS

    store = ConfigStore.instance()
    store.store(name="config_schema", node=Config)
    for group, node in [("model", ModelConfig), ("data", DataConfig), ("logger", LoggerConfig)]:
        store.store(group=f"schema/{group}", name="base", node=node)
    for name, strategy in STRATEGIES.items():
        store.store(group="schema/scaling", name=name, node=scaling_schema(strategy))
    for name, spec in EVALS.items():
        if name != "suite":
            store.store(group="schema/eval", name=name, node=spec.config)
    store.store(group="eval", name="suite", node=suite_schema(EVALS))
