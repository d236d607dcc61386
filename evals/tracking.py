"""Experiment tracking with Weights & Biases (mode auto: online with an API key, else offline).

A tracker failure never stops a run: the first error is reported once, later calls do nothing,
and the local results stay complete.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)
MODES = ("auto", "online", "offline", "disabled")


def _has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path.home() / ".netrc"
    return netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore")


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"scaling": {"name": "yarn"}} -> {"scaling.name": "yarn"}, so W&B can group and filter by key."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def sweep_group() -> str | None:
    """The W&B group of a Hydra multirun job: its sweep directory, e.g. ``sweep-2026-11-22_20-30-00``."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized() or HydraConfig.get().mode.name != "MULTIRUN":
        return None
    parts = Path(HydraConfig.get().sweep.dir).parts[-2:]
    return "sweep-" + "_".join(parts)


class Tracker:
    def __init__(self, cfg, run_config: dict, run_dir: Path, name: str, group: str | None):
        self.run = None
        if cfg.mode not in MODES:
            raise ValueError(f"logger.mode={cfg.mode!r} is not one of {', '.join(MODES)}")
        mode = ("online" if _has_api_key() else "offline") if cfg.mode == "auto" else cfg.mode
        if cfg.name == "none" or mode == "disabled":
            return
        self._guard("start", self._start, cfg, mode, run_config, run_dir, name, group)

    def _start(self, cfg, mode, run_config, run_dir, name, group):
        import wandb

        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            group=cfg.group or group,
            tags=list(cfg.tags),
            name=name,
            mode=mode,
            dir=str(cfg.dir or run_dir),
            config=flatten(run_config),
            reinit="finish_previous",
        )

    def _guard(self, what, fn, *args):
        try:
            fn(*args)
        except Exception as err:  # a tracker must never take the run down
            log.error("W&B %s failed (%s: %s); continuing with local results only", what, type(err).__name__, err)
            self.run = None

    def summary(self, values: dict) -> None:
        if self.run is not None:
            self._guard("summary", self.run.summary.update, values)

    def log(self, values: dict) -> None:
        if self.run is not None:
            self._guard("log", self.run.log, values)

    def table(self, key: str, rows: list[dict], line: tuple[str, str] | None = None) -> None:
        """Log rows as a W&B table; with ``line=(x, y)`` also as a W&B line chart of y against x."""
        if self.run is not None and rows:
            self._guard("table", self._table, key, rows, line)

    def _table(self, key, rows, line):
        import wandb

        columns = list(dict.fromkeys(k for row in rows for k in row))
        table = wandb.Table(columns=columns, data=[[row.get(c) for c in columns] for row in rows])
        logged = {key: table}
        if line:
            logged[f"{key}_chart"] = wandb.plot.line(table, line[0], line[1], title=f"{key}: {line[1]} vs {line[0]}")
        self.run.log(logged)

    def image(self, key: str, path: Path) -> None:
        if self.run is not None:
            self._guard("image", self._image, key, path)

    def _image(self, key, path):
        import wandb

        self.run.log({key: wandb.Image(str(path))})

    def artifact(self, path: Path, name: str) -> None:
        if self.run is not None:
            self._guard("artifact", self._artifact, path, name)

    def _artifact(self, path, name):
        import wandb

        artifact = wandb.Artifact(name, type="results")
        artifact.add_file(str(path))
        self.run.log_artifact(artifact)

    def finish(self) -> None:
        if self.run is not None:
            self._guard("finish", self.run.finish)
            self.run = None
