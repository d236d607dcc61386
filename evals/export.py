"""Export what a run found to the engines that serve models (:mod:`rope_ext.export`): transformers' ``config.json``,
vLLM, SGLang, llama.cpp.

    python -m evals.export RUN_DIR --to vllm              # a finished job
    python -m evals.export SWEEP_DIR --to transformers    # the sweep's recommended strategy (its ranked answer)
    python -m evals.export SEARCH_DIR --to llama.cpp      # a search's best trial
    python -m evals.export scaling=yarn target=4x model=qwen25 --to sglang   # overrides, as run.py takes them

Every finished job also gets a ``deploy/`` folder (:func:`evals.core.deploy.write_deploy`): one file per engine, and README.md with
what an engine cannot express. Bad input (an unfinished run, an unknown engine, a bad override) is one line and
exit 2, before any model is read.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import rope_ext
from rope_ext.export import ENGINES, Unsupported, export, geometry

from .core.deploy import render
from .core.errors import ConfigError, UserError


def _results(run_dir: Path) -> dict:
    path = run_dir / "results.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"{run_dir} has no readable results.json ({type(err).__name__}): give a finished run's "
            f"directory, a sweep's or a search's"
        ) from None
    if data.get("status") != "done":
        raise ConfigError(f"{run_dir} is not a finished run (status {data.get('status')}): export what finished")
    return data


def run_of(path: Path) -> Path:
    """The finished job a directory stands for: itself, a search's best trial, or a sweep's recommended strategy."""
    if (path / "results.json").is_file():
        return path
    if (path / "search.json").is_file():
        best = json.loads((path / "search.json").read_text()).get("best") or []
        if not best or not best[0].get("dir"):
            raise ConfigError(f"{path}: the search has no best trial yet (no feasible finished trial)")
        return Path(best[0]["dir"])
    ranking = path / "report_ranking.csv"
    if ranking.is_file():
        rows = list(csv.DictReader(ranking.open()))
        chosen = next((r for r in rows if r.get("answer") == "recommended"), None)
        if chosen is None:
            raise ConfigError(
                f"{path}: the sweep recommends no strategy (report_answer.txt says why); export one of "
                f"its job directories instead"
            )
        for results in sorted(path.glob("*/results.json")):
            data = json.loads(results.read_text())
            if (
                data.get("status") == "done"
                and (data.get("job") or {}).get("scaling") == chosen["strategy"]
                and (data.get("job") or {}).get("role", "job") == "job"
            ):
                return results.parent
        raise ConfigError(f"{path}: no finished job of the recommended {chosen['strategy']} found in the sweep")
    raise ConfigError(
        f"{path} is neither a run (results.json), a search (search.json) nor a sweep with a report (report_ranking.csv)"
    )


def from_run(run_dir: Path):
    """(scaling, geometry, model config dict) of a finished job, its model's geometry read again (no weights)."""
    from omegaconf import OmegaConf

    from .core.models import resolve_model

    data = _results(run_dir)
    config = data["config"]
    scaling_cfg = {k: v for k, v in config["scaling"].items() if k not in ("label", "derived")}
    model = resolve_model(OmegaConf.create(config["model"]), geometry=True, weights=False)
    scaling = rope_ext.resolve(scaling_cfg, model.trained_context)
    return scaling, geometry(model.config, scaling, model.slots, model.trained_context), model.config.to_dict()


def from_overrides(overrides: list[str]):
    """(scaling, geometry, model config dict) of the job ``python run.py <overrides>`` would run (``target=`` applied)."""
    from hydra import compose, initialize_config_dir

    from . import load_evals
    from .core.config.store import config_dir, register_configs
    from .core.job import parse_scaling, parse_target
    from .core.models import resolve_model

    load_evals()
    register_configs()
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from .cli import composition_error

    try:
        with initialize_config_dir(str(config_dir()), version_base="1.3"):
            cfg = compose("config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(composition_error(err)) from None
    parse_target(cfg)
    model = resolve_model(cfg.model, geometry=True, weights=False)
    scaling, _, _ = parse_scaling(cfg.scaling, model, None, parse_target(cfg, model.trained_context))
    return scaling, geometry(model.config, scaling, model.slots, model.trained_context), model.config.to_dict()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evals.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", nargs="+", help="a run, sweep or search directory; or run.py overrides")
    parser.add_argument("--to", required=True, help=f"the engine: {', '.join(ENGINES)}")
    args = parser.parse_args(argv)
    try:
        if args.to not in ENGINES:
            raise ConfigError(f"--to {args.to} is not an engine rope_ext exports to; valid: {', '.join(ENGINES)}")
        first = Path(args.source[0])
        if len(args.source) == 1 and "=" not in args.source[0]:
            if not first.exists():
                raise ConfigError(
                    f"{first} does not exist: give a run, sweep or search directory, or overrides "
                    f"(scaling=yarn target=4x)"
                )
            run_dir = run_of(first)
            scaling, geo, model_config = from_run(run_dir)
        else:
            scaling, geo, model_config = from_overrides(args.source)
        found = export(scaling, geo, args.to, model_config)
    except Unsupported as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (UserError, rope_ext.ScalingError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(render(args.to, found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
