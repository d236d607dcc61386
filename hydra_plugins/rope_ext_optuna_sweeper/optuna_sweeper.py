"""The Sweeper class Hydra instantiates for ``hydra/sweeper=optuna``. Hydra imports every plugin module at start-up,
so this one imports nothing heavy: the search (Optuna included) is loaded when a sweep starts."""

from typing import Any, List, Optional

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf


class OptunaSweeper(Sweeper):
    def __init__(self, **conf: Any) -> None:
        super().__init__()
        self.conf = OmegaConf.create(conf)
        self.hydra_context: Optional[HydraContext] = None
        self.config: Optional[DictConfig] = None
        self.launcher = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: List[str]) -> Any:
        from evals.search.study import Search

        return Search(self, arguments).run()
