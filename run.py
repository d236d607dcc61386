"""rope_ext entry point: compose model x scaling x eval x data with Hydra, run the eval, write results.

    python run.py scaling=yarn scaling.factor=2 eval.lengths=[4096,16384]
    python run.py -m scaling=none,ntk,yarn scaling.factor=2,4
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from evals import EVALS, USER_ERRORS, check
from evals.config import register_configs
from evals.context import EvalContext, job_description, scaling_label
from evals.results import Results, find_finished, job_key
from evals.tracking import Tracker, sweep_group

log = logging.getLogger("rope_ext")
register_configs()


def run(cfg: DictConfig) -> dict:
    """Run one job: check the config, run the eval on the patched model, return its summary."""
    check(cfg)
    out_dir = Path(cfg.output_dir or HydraConfig.get().runtime.output_dir)
    config = OmegaConf.to_container(cfg, resolve=True)
    results = Results(out_dir, config)
    key = results.set("job_key", job_key(job_description(cfg)))
    finished = None if cfg.force else find_finished(key, cfg.resume_from, exclude=out_dir)
    if finished:
        print(f"skip: the same job finished in {finished.parent} (force=true reruns it)")
        return report(cfg, results.resume(finished), out_dir)
    tracker = Tracker(cfg.logger, config, out_dir, f"{cfg.model.name}-{scaling_label(cfg)}-{cfg.eval.name}", sweep_group())
    status = "failed"
    try:
        with EvalContext(cfg, results, tracker) as ctx:
            summary = EVALS[cfg.eval.name](cfg.eval, ctx)
        status = "done"
        results.update("summary", summary)
    finally:
        results.finish(status)
        tracker.artifact(out_dir / "results.json", f"results-{out_dir.name}")
        tracker.finish()
    return report(cfg, summary, out_dir)


def report(cfg: DictConfig, summary: dict, out_dir: Path) -> dict:
    """Print the job's summary as a short table and return it."""
    print(f"\n{cfg.model.name} | {scaling_label(cfg)} | {cfg.eval.name}  ->  {out_dir}")
    for key, value in summary.items():
        print(f"  {key:<40} {value:.4g}" if isinstance(value, float) else f"  {key:<40} {value}")
    return summary


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        run(cfg)
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
