"""Experiment tracking with Weights & Biases (mode auto: online with an API key, else offline).

A tracker failure never stops a run: the first error is reported once, later calls do nothing, and the
local results stay complete. When W&B cannot start (unreachable, bad key), later jobs of the same
process do not wait for it again: the process remembers and runs them with local results only.
W&B is quiet: one line says where the run is and how to sync it.

One W&B run per job: the run id is recorded in the job's ``results.json`` before W&B starts, and a job resumed in
place (after an interrupt, a kill or a failure) continues that run (``resume="allow"``) instead of starting a second
one. Offline, W&B cannot append to a run on disk (wandb/wandb#2423): the resumed attempt writes a new
``offline-run-*-<id>`` folder with the same id and the complete results, and the interrupted attempt's folder is
moved out of ``wandb/`` into ``wandb-superseded/`` (kept, but not synced as a second run).
"""

from __future__ import annotations

import logging
import math
import os
import secrets
from pathlib import Path

log = logging.getLogger(__name__)
_UNAVAILABLE: list[str] = []  # why W&B could not start earlier in this process (then: no more tries)


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


def sweep_group(sweep_dir: str | Path | None = None) -> str | None:
    """The W&B group of a Hydra multirun: ``sweep-`` and the sweep directory's last two path parts, e.g.
    ``sweep-2026-11-22_20-30-00`` (``hydra.sweep.dir=multirun/readme_ppl``: ``sweep-multirun_readme_ppl``);
    None for a single run."""
    if sweep_dir is None:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized() or HydraConfig.get().mode.name != "MULTIRUN":
            return None
        sweep_dir = HydraConfig.get().sweep.dir
    return "sweep-" + "_".join(Path(sweep_dir).parts[-2:])


def _supersede(current: Path, run_id: str) -> None:
    """Move the earlier offline attempts of run ``run_id`` (beside ``current``, this attempt's folder) out of
    ``wandb/``: W&B cannot continue them offline, and synced they would be a second run of the same job."""
    earlier = [p for p in current.parent.glob(f"offline-run-*-{run_id}") if p.name != current.name]
    if not earlier:
        return
    kept = current.parent.parent / SUPERSEDED
    kept.mkdir(exist_ok=True)
    for path in earlier:
        path.rename(kept / path.name)
    print(
        f"W&B: continues the interrupted attempt's run {run_id}; its offline folder moved to {kept} "
        "(offline runs cannot be appended to: this run holds the job's complete results)"
    )


def _finite(value) -> bool:
    return value is not None and not (isinstance(value, float) and not math.isfinite(value))


SUPERSEDED = "wandb-superseded"  # where a resumed job's earlier offline attempts go (beside its wandb/)


def enabled(cfg) -> bool:
    """Whether the logger config ``cfg`` asks for W&B at all."""
    return cfg.name != "none" and cfg.mode != "disabled"


def new_run_id() -> str:
    """A fresh W&B run id (lower-case letters and digits, as W&B makes them)."""
    return secrets.token_hex(6)


class Tracker:
    def __init__(
        self,
        cfg,
        run_config: dict,
        run_dir: Path,
        name: str,
        group: str | None,
        tags=(),
        job_type=None,
        run_id: str | None = None,
    ):
        """``run_id``: the job's W&B run (continued when it exists; see the module docstring)."""
        self.run = None
        mode = ("online" if _has_api_key() else "offline") if cfg.mode == "auto" else cfg.mode
        if not enabled(cfg) or mode == "disabled":
            return
        if _UNAVAILABLE:
            log.warning(
                "W&B skipped: it could not start earlier in this process (%s); local results only", _UNAVAILABLE[0]
            )
            return
        self._guard(
            "start", self._start, cfg, mode, run_config, run_dir, name, group, [*cfg.tags, *tags], job_type, run_id
        )
        if self.run is None:
            _UNAVAILABLE.append(f"mode {mode}")

    def _start(self, cfg, mode, run_config, run_dir, name, group, tags, job_type, run_id):
        import wandb

        self.run = wandb.init(
            id=run_id,
            resume="allow" if run_id else None,
            project=cfg.project,
            entity=cfg.entity,
            group=cfg.group or group,
            tags=list(dict.fromkeys(tags)),
            job_type=job_type,
            name=name,
            mode=mode,
            dir=str(cfg.dir or run_dir),
            config=flatten(run_config),
            reinit="finish_previous",
            settings=wandb.Settings(init_timeout=float(cfg.init_timeout), silent=True, console="off"),
        )
        where = (
            self.run.url
            if mode == "online"
            else f"offline in {Path(self.run.dir).parent} (`wandb sync {Path(self.run.dir).parent}`)"
        )
        print(f"W&B: {name}, {where}")
        if mode == "offline" and run_id:
            _supersede(Path(self.run.dir).parent, run_id)

    def _guard(self, what, fn, *args):
        try:
            fn(*args)
        except Exception as err:  # a tracker must never take the run down
            log.error(
                "W&B %s failed (%s: %s); continuing with local results only",
                what,
                type(err).__name__,
                str(err).splitlines()[0] if str(err) else "",
            )
            if self.run is not None and what != "start":
                return
            self.run = None

    def summary(self, values: dict) -> None:
        if self.run is not None and values:
            self._guard("summary", self.run.summary.update, {k: v for k, v in values.items() if v is not None})

    def curve(self, name: str, step: str, rows: list[dict], at=None) -> None:
        """Each row's numbers as history against ``step`` (one W&B line per run over e.g. length); the run's
        summary of each then holds its value at ``step == at`` (the target length), not the last row's."""
        if self.run is not None and rows:
            self._guard("curve", self._curve, name, step, rows, at)

    def _curve(self, name, step, rows, at):
        self.run.define_metric(step)
        metrics = sorted(
            {
                k
                for row in rows
                for k, v in row.items()
                if k != step and isinstance(v, (int, float)) and not isinstance(v, bool)
            }
        )
        for metric in metrics:
            self.run.define_metric(f"{name}/{metric}", step_metric=step)
        for row in rows:
            values = {f"{name}/{m}": row[m] for m in metrics if _finite(row.get(m))}
            if values:
                self.run.log({step: row[step], **values})
        target = next((row for row in rows if row[step] == at), None)
        for metric in metrics:  # the last row is not the answer: the value at the target (or none) is
            key = f"{name}/{metric}"
            if target is not None and _finite(target.get(metric)):
                self.run.summary[key] = target[metric]
            elif key in self.run.summary.keys():
                del self.run.summary[key]

    def table(self, name: str, rows: list[dict]) -> None:
        if self.run is not None and rows:
            self._guard("table", self._table, name, rows)

    def _table(self, name, rows):
        import wandb

        columns = list(dict.fromkeys(k for row in rows for k in row))
        self.run.log({name: wandb.Table(columns=columns, data=[[row.get(c) for c in columns] for row in rows])})

    def image(self, name: str, path: Path) -> None:
        if self.run is not None:
            self._guard("image", self._image, name, path)

    def _image(self, name, path):
        import wandb

        self.run.log({name: wandb.Image(str(path))})

    def artifact(self, path: Path, name: str) -> None:
        if self.run is not None:
            self._guard("artifact", self._artifact, path, name)

    def _artifact(self, path, name):
        import wandb

        artifact = wandb.Artifact(name, type="results")
        artifact.add_file(str(path))
        self.run.log_artifact(artifact)

    def finish(self, exit_code: int = 0) -> None:
        if self.run is not None:
            self._guard("finish", self.run.finish, exit_code)
            self.run = None
