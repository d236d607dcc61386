"""The ``hydra/sweeper=optuna`` config (``hydra.sweeper.*``); the objective and constraints are top-level keys."""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class OptunaSweeperConf:
    _target_: str = "hydra_plugins.rope_ext_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    n_trials: int = 20  # finished trials the study should hold (a re-run continues to this number)
    n_jobs: int = 1  # trials launched together (a parallel launcher runs them at once: hydra/launcher=joblib)
    sampler: str = (
        "auto"  # auto (TPE; CMA-ES for > 8 unconstrained values and one objective) | tpe | cmaes | random | nsga2
    )
    seed: Optional[int] = 0  # the sampler's seed (plus the trials already in the study, so a resumed study draws anew)
    study_name: str = "rope_ext"
    storage: Optional[str] = None  # default: sqlite:///<sweep dir>/optuna.db
    params: Optional[Dict[str, str]] = None  # ranges in Hydra's sweep syntax, as on the command line
    # settings tried first, e.g. [{scaling.factor: 2, scaling.beta_fast: 32}]; null: the strategy's published default
    # for the search's length (as target=<length> sets it up, where the ranges hold it: evals/search/default.py), so
    # the best is set against it; [] tries none
    enqueue: Optional[List[Any]] = None


ConfigStore.instance().store(group="hydra/sweeper", name="optuna", node=OptunaSweeperConf, provider="rope_ext")
