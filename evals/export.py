"""Export what a run found to the engines that serve models (:mod:`rope_ext.export`): transformers' ``config.json``,
vLLM, SGLang, llama.cpp.

    python -m evals.export RUN_DIR --to vllm              # a finished job
    python -m evals.export SWEEP_DIR --to vllm            # the best recommended strategy vLLM can serve
    python -m evals.export SEARCH_DIR --to llama.cpp      # a search's best trial
    python -m evals.export scaling=yarn target=4x model=qwen25 --to sglang   # overrides, as run.py takes them

A sweep exports the best of its recommended strategies (its ranked answer, report_ranking.csv) that the engine can
serve, and says in one line (stderr) which and why: ``dca is best overall but vllm cannot serve it (...); exporting
yarn-factor2, x1.021 [1.004, 1.038] of dca``; none of them: one line, exit 2.

The context exported is the length the job's verdict judged (:func:`evals.core.run.deploy.judged`: the target, or
the largest yes length where the target was not evaluated), said in one line (stderr) when it is not a yes; from
overrides, the target (``target=4x``: 4 x the trained context, for every strategy). The commands name the model the
job ran. Every finished job also gets a ``deploy/`` folder (:func:`evals.core.run.deploy.write_deploy`): one file per
engine, and README.md opening with the verdict and saying what an engine cannot express. Bad input (an unfinished run, an unknown engine, a bad override) is one line and
exit 2, before any model is read.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import rope_ext
from rope_ext.export import ENGINES, Unsupported, geometry

from .core.decision.engines import ratio_text, reasons_text, setup
from .core.run.deploy import export_for, judged, models_of, render
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
    """The finished job a directory stands for: itself, or a search's best trial (a sweep: :func:`sweep_choice`)."""
    if (path / "results.json").is_file():
        return path
    if (path / "search.json").is_file():
        best = json.loads((path / "search.json").read_text()).get("best") or []
        if not best or not best[0].get("dir"):
            raise ConfigError(f"{path}: the search has no best trial yet (no feasible finished trial)")
        return Path(best[0]["dir"])
    raise ConfigError(
        f"{path} is neither a run (results.json), a search (search.json) nor a sweep with a report (report_ranking.csv)"
    )


def _job_of(sweep: Path, strategy: str) -> Path:
    for results in sorted(sweep.glob("*/results.json")):
        data = json.loads(results.read_text())
        job = data.get("job") or {}
        if data.get("status") == "done" and job.get("scaling") == strategy and job.get("role", "job") == "job":
            return results.parent
    raise ConfigError(f"{sweep}: no finished job of the recommended {strategy} found in the sweep")


def _ratio(row: dict) -> str:
    """``x1.021 [1.004, 1.038]`` from a report_ranking.csv row: against the best recommended strategy (the interval
    simultaneous, as the ranking gives it)."""
    value = lambda key: float(row[key]) if row.get(key) not in (None, "") else None  # noqa: E731
    return ratio_text({"ratio": value("vs_top"), "low": value("vs_top_ci95_low"), "high": value("vs_top_ci95_high")})


def sweep_choice(sweep: Path, engine: str):
    """(scaling, geometry, model config, why): of a sweep's recommended strategies (report_ranking.csv, in their
    ranked order), the best one ``engine`` can serve, and one line saying which and why; Unsupported (one line) when
    it can serve none of them."""
    rows = list(csv.DictReader((sweep / "report_ranking.csv").open()))
    recommended = [r for r in rows if r.get("answer") == "recommended"]
    if not recommended:
        raise ConfigError(
            f"{sweep}: the sweep recommends no strategy (report_answer.txt says why); export one of "
            f"its job directories instead"
        )
    first = recommended[0]
    skipped = []
    for row in recommended:
        if (row["model"], row["target"]) != (first["model"], first["target"]):
            continue  # the answer for the first model and target only
        scaling, geo, model_config, context, models, _ = from_run(_job_of(sweep, row["strategy"]))
        try:
            found = export_for(scaling, geo, engine, model_config, context, models)
        except Unsupported as err:
            skipped.append((row["strategy"], str(err)))
            continue
        where = f"at {first['target']} on {first['model']}"
        if not skipped:
            return found, f"exporting {row['strategy']}: the best recommended strategy {where}"
        names = ", ".join(s for s, _ in skipped)
        higher = (
            f"{names} is best overall but {engine} cannot serve it"
            if len(skipped) == 1
            else (f"{names} rank higher but {engine} cannot serve them")
        )
        reasons = reasons_text(skipped)
        return found, f"{higher} ({reasons}); exporting {row['strategy']}, {_ratio(row)} of {first['strategy']} {where}"
    raise Unsupported(f"none of the recommended methods of {sweep} can be served by {engine}: " + reasons_text(skipped))


def from_run(run_dir: Path):
    """(scaling, geometry, model config dict, context, models, verdict line) of a finished job, its model's geometry
    read again (no weights): the context its verdict judged (:func:`evals.core.run.deploy.judged`), the model its
    commands name."""
    results = _results(run_dir)
    context, said, yes = judged(results.get("verdict"))
    return (*setup(results["config"]), context, models_of(results["config"].get("model")), None if yes else said)


def from_overrides(overrides: list[str]):
    """(scaling, geometry, model config dict, context, models) of the job ``python run.py <overrides>`` would run
    (``target=`` applied; the context: the target, else what the scaling covers)."""
    from hydra import compose, initialize_config_dir

    from . import load_evals
    from .core.config.store import config_dir, register_configs
    from .core.job.target import parse_scaling, parse_target
    from .core.inputs.models import resolve_model

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
    target = parse_target(cfg, model.trained_context)
    scaling, _, _ = parse_scaling(cfg.scaling, model, None, target)
    geo = geometry(model.config, scaling, model.slots, model.trained_context)
    from omegaconf import OmegaConf

    models = models_of(OmegaConf.to_container(cfg.model, resolve=True))
    return scaling, geo, model.config.to_dict(), target, models


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evals.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", nargs="+", help="a run, sweep or search directory; or run.py overrides")
    parser.add_argument("--to", required=True, help=f"the engine: {', '.join(ENGINES)}")
    args = parser.parse_args(argv)
    try:
        engine = next((e for e in ENGINES if e == args.to.lower()), None)  # any case: --to VLLM is vllm
        if engine is None:
            raise ConfigError(f"--to {args.to} is not an engine rope_ext exports to; valid: {', '.join(ENGINES)}")
        args.to = engine
        first = Path(args.source[0])
        stray = [s for s in args.source if "=" not in s and not s.startswith("~")]
        if len(args.source) > 1 and stray:  # Hydra would read a directory as an override it cannot parse
            raise ConfigError(
                f"{stray[0]} is not an override (key=value), and a directory is exported alone: give one run, sweep "
                f"or search directory, or run.py overrides (scaling=yarn target=4x)"
            )
        if len(args.source) == 1 and "=" not in args.source[0]:
            if not first.exists():
                raise ConfigError(
                    f"{first} does not exist: give a run, sweep or search directory, or overrides "
                    f"(scaling=yarn target=4x)"
                )
            if (first / "report_ranking.csv").is_file() and not any(
                (first / name).is_file() for name in ("results.json", "search.json")
            ):  # a sweep: the best of its recommended strategies this engine serves
                found, why = sweep_choice(first, args.to)
                print(why, file=sys.stderr)
            else:
                scaling, geo, model_config, context, models, said = from_run(run_of(first))
                found = export_for(scaling, geo, args.to, model_config, context, models)
                if said:
                    print(said, file=sys.stderr)
        else:
            scaling, geo, model_config, context, models = from_overrides(args.source)
            found = export_for(scaling, geo, args.to, model_config, context, models)
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
