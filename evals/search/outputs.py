"""What a search leaves in its sweep directory, in the sweep's report and in W&B.

- ``search_trials.csv``: one row per trial -- its state, the objective values, the constrained values and whether
  the trial is feasible, the values it tried (per-dimension factors as their list), its job directory, the error
  of a failed trial.
- ``search.json``: the objective with its directions, the constraints, the space, the best trial (the Pareto front
  for several objectives), the counts.
- ``conf/scaling/<strategy>_searched.yaml`` (several objectives: ``<strategy>_pareto<trial>.yaml``): the best
  setting as a scaling option: ``python run.py hydra.searchpath=[file://<sweep dir>/conf] scaling=yarn_searched``,
  or copied into ``conf/scaling/``.
- Figures (PNG and SVG), Optuna's own plots (:mod:`evals.search.figures`): the objective by trial, parameter
  importances (fANOVA), parallel coordinates of the most important parameters and, for several objectives, the
  Pareto front; they go into the sweep's report (:func:`report_section`) and, with the table and the best values,
  into one W&B run of the sweep's group (job type ``search``). The words the terminal and the report say about
  them: :mod:`evals.search.summary`.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from omegaconf import OmegaConf

from ..core.files import atomic_write
from ..core.run.output import save_figure, write_csv
from .figures import FIGURES, figures
from .objective import feasible
from .summary import against, comparison_summary, gain_lines, met, shown_setting, shown_values

RESULT = "search.json"


def best_trials(search, study) -> list:
    """The best feasible finished trial (one objective), or the feasible Pareto front (several)."""
    done = [t for t in study.trials if t.state.name == "COMPLETE" and feasible(t)]
    signs = [1 if t.maximize else -1 for t in search.objectives]
    score = lambda t: [s * v for s, v in zip(signs, t.values)]  # noqa: E731 -- higher is better on every axis
    if len(signs) == 1:
        return [max(done, key=score)] if done else []
    dominated = lambda a, b: all(x <= y for x, y in zip(score(a), score(b))) and score(a) != score(b)  # noqa: E731
    return [t for t in done if not any(dominated(t, other) for other in done)]


def trial_rows(search, study) -> list[dict]:
    rows = []
    for trial in study.trials:
        reported = trial.user_attrs.get("reported") or {}
        row = {"trial": trial.number, "state": trial.state.name.lower()}
        row.update({t.key: reported.get(t.key) for t in search.objectives})
        row.update({c.text: reported.get(c.target.key) for c in search.constraints})
        row["feasible"] = feasible(trial) if trial.state.name == "COMPLETE" else None
        row.update(dict(o.split("=", 1) for o in trial.user_attrs.get("overrides") or []))
        row["dir"], row["error"] = trial.user_attrs.get("dir"), trial.user_attrs.get("error")
        rows.append(row)
    return rows


def best_scaling(search, trial) -> dict:
    """The scaling of ``trial`` as its job ran it: composed from its overrides, resolved against the model."""
    import rope_ext

    cfg = search.compose(search.fixed + list(trial.user_attrs.get("overrides") or []))
    resolved = rope_ext.resolve(OmegaConf.to_container(cfg.scaling, resolve=True), search.trained).to_dict()
    return {
        k: v
        for k, v in resolved.items()
        if k != "name"
        and not (k == "layer_types" and v == "auto")
        and not (k == "original_max_position" and v == search.trained)
    }


def enqueued(trial, trials) -> bool:
    """A setting the user gave (``hydra.sweeper.enqueue``) or the published default, or the re-run of one a killed
    search cut off."""
    if "retry_of" in trial.user_attrs:
        return enqueued(trials[trial.user_attrs["retry_of"]], trials)
    return "fixed_params" in trial.system_attrs


def role(trial, trials) -> str:
    """``default`` (the published default the search enqueued) or ``given`` (hydra.sweeper.enqueue)."""
    if "retry_of" in trial.user_attrs:
        return role(trials[trial.user_attrs["retry_of"]], trials)
    return trial.user_attrs.get("role") or "given"


def reference(search, trial, trials=()) -> dict:
    """A finished trial to set the best against: its reported values, whether it met the constraints, its setting."""
    return {
        "trial": trial.number,
        "role": role(trial, trials) if trials else "given",
        "reported": trial.user_attrs.get("reported"),
        "feasible": feasible(trial),
        "scaling": best_scaling(search, trial),
    }


def _measured(trial) -> tuple[dict, dict]:
    """(the metrics the trial's job declared, {metric: {length: record}}) from its results.json."""
    from ..core.measure import by_metric
    from ..core.run.rundir import read_results

    where = trial.user_attrs.get("dir")
    results = read_results(Path(where) / "results.json") if where else None
    return (results or {}).get("declared") or {}, by_metric((results or {}).get("measurements") or [])


def versus(search, trial, other) -> dict:
    """``trial`` against ``other`` on each objective's metric at its length (a retention: the metric itself), paired
    on the units both measured (:func:`evals.core.decision.paired.paired_ratio`, the verdict's intervals):
    ``{"<metric>@<L>": {"ratio", "low", "high", "n", "method", "maximize"}}``; a value neither interval rests on is
    left out."""
    from ..core.decision.paired import paired_ratio
    from .objective import RETENTION

    declared, own = _measured(trial)
    _, theirs = _measured(other)
    found = {}
    for target in search.objectives:
        metric = target.metric.removesuffix(RETENTION)
        a, b = own.get(metric, {}).get(target.length), theirs.get(metric, {}).get(target.length)
        if metric not in declared or not a or not b:
            continue
        paired = paired_ratio(declared[metric], a, b)
        if paired["ratio"] is None or not paired["shared"]:
            continue
        found[f"{metric}@{target.length}"] = {
            **{k: paired[k] for k in ("ratio", "low", "high", "n", "method")},
            "maximize": not declared[metric].get("lower_is_better", True),
        }
    return found


def write_config(search, trial, name: str) -> Path:
    values = best_scaling(search, trial)
    head = (
        f"# Found by a search (evals/search) in {search.sweep_dir}: trial {trial.number}, "
        f"{shown_values(trial.user_attrs.get('reported'))}.\n"
        f"# Use: python run.py hydra.searchpath=[file://{search.sweep_dir.resolve() / 'conf'}] scaling={name}\n"
        f"# or copy this file into conf/scaling/.\n"
    )
    body = OmegaConf.to_yaml(
        OmegaConf.create({"defaults": [{"/schema/scaling@_here_": search.strategy.name}, "_self_"], **values})
    )
    path = search.sweep_dir / "conf" / "scaling" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, head + body)
    return path


def write(search, study) -> list[Path]:
    """Everything above into the sweep directory (and W&B); the paths written."""
    rows = trial_rows(search, study)
    best = best_trials(search, study)
    written = [write_csv(search.sweep_dir / "search_trials.csv", rows)]
    configs = [
        write_config(
            search,
            t,
            f"{search.strategy.name}_searched"
            if len(search.objectives) == 1
            else f"{search.strategy.name}_pareto{t.number}",
        )
        for t in best
    ]
    written_here = re.compile(rf"{re.escape(search.strategy.name)}_(searched|pareto\d+)\.yaml")
    for stale in (search.sweep_dir / "conf" / "scaling").glob("*.yaml"):
        if written_here.fullmatch(stale.name) and stale not in configs:  # an earlier best this study no longer holds
            stale.unlink()
    states = [t.state.name for t in study.trials]
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    result = {
        "strategy": search.strategy.name,
        "objective": [t.key for t in search.objectives],
        "directions": [t.direction for t in search.objectives],
        "constraints": [c.text for c in search.constraints],
        "space": [s.describe() for s in search.space],
        "sampler": search.sampler_name,
        "trials": len(states),
        "complete": states.count("COMPLETE"),
        "failed": states.count("FAIL"),
        "best": [
            {
                "trial": t.number,
                "values": dict(zip([o.key for o in search.objectives], t.values)),
                "reported": t.user_attrs.get("reported"),
                "scaling": best_scaling(search, t),
                "dir": t.user_attrs.get("dir"),
                "config": str(path),
            }
            for t, path in zip(best, configs)
        ],
        # what the best is set against: the published default for the search's length, or the settings the user
        # gave (hydra.sweeper.enqueue)
        "given": [reference(search, t, study.trials) for t in done if enqueued(t, study.trials)],
        # no feasible trial: the one closest to meeting the constraints, so the user sees how far off it is
        "closest": None
        if best or not search.constraints or not done
        else reference(search, min(done, key=lambda t: sum(max(0.0, v) for v in t.user_attrs["constraints"]))),
        "length": search.length,  # every trial judged there (its verdict target)
    }
    against = {t.number: t for t in done if enqueued(t, study.trials)}
    for entry, trial in zip(result["best"], best):
        entry["feasible"] = feasible(trial)
        # the best against each setting it is set against: the paired ratio with its 95% interval
        entry["versus"] = {
            str(number): versus(search, trial, other) for number, other in against.items() if number != trial.number
        }
    atomic_write(search.sweep_dir / RESULT, json.dumps(result, indent=2, default=str))
    written += [search.sweep_dir / RESULT, *configs]
    images = {}
    for name, fig in figures(search, study).items():
        for suffix, data in save_figure(fig).items():
            atomic_write(search.sweep_dir / f"{name}.{suffix}", data)
            written.append(search.sweep_dir / f"{name}.{suffix}")
        images[name] = search.sweep_dir / f"{name}.png"
    track(search, rows, result, images, configs)
    return written


def track(search, rows: list[dict], result: dict, images: dict, configs: list[Path]) -> None:
    """The search as one W&B run of the sweep's group: objective by trial as history, the trial table, the best
    values and parameters in the summary, the figures, the best configs as an artifact."""
    from ..core.run.tracking import Tracker, sweep_group

    logger = search.config.get("logger")
    if logger is None or logger.get("name") == "none":
        return
    tracker = Tracker(
        logger,
        {"search": result},
        search.sweep_dir / "search",
        f"search-{search.sweep_dir.name}",
        sweep_group(search.sweep_dir),
        tags=["search", f"scaling:{search.strategy.name}"],
        job_type="search",
    )
    if tracker.run is None:
        return
    keys = [t.key for t in search.objectives]
    tracker.curve(
        "search",
        "trial",
        [
            {"trial": r["trial"], **{k: r[k] for k in keys if r.get(k) is not None}}
            for r in rows
            if any(r.get(k) is not None for k in keys)
        ],
    )
    tracker.table(
        "search_trials",
        [
            {k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v)) for k, v in r.items()}
            for r in rows
        ],
    )
    for best in result["best"][:1]:
        tracker.summary(
            {f"best/{k}": v for k, v in best["values"].items()}
            | {f"best/scaling.{k}": (v if not isinstance(v, list) else str(v)) for k, v in best["scaling"].items()}
            | {"best/trial": best["trial"], "best/feasible": best.get("feasible")}
        )
    tracker.summary(comparison_summary(result))
    for name, path in images.items():
        tracker.image(name, path)
    for path in configs:
        tracker.artifact(path, f"search-{search.sweep_dir.name}-{path.stem}")
    tracker.finish(0)


def report_section(dirs) -> tuple[list[str], list[str]]:
    """The search of any directory among ``dirs`` for the sweep's report: (markdown lines, HTML parts with the
    figures embedded); empty when none holds a search."""
    import base64

    md, parts = [], []
    for root in map(Path, dirs):
        path = root / RESULT
        if not path.is_file():
            continue
        result = json.loads(path.read_text())
        goal = " and ".join(f"{d} {k}" for d, k in zip(result["directions"], result["objective"]))
        head = (
            f"{result['strategy']}: {goal}"
            + (f" subject to {', '.join(result['constraints'])}" if result["constraints"] else "")
            + f"; {result['trials']} trials ({result['complete']} finished, "
            f"{result['failed']} failed), {result['sampler']}"
        )
        lines = [
            f"- trial {b['trial']}: {shown_values(b.get('reported') or b['values'])}"
            + met(b, result)
            + f"; {shown_setting(b['scaling'])}; config {b['config']}"
            for b in result["best"]
        ] or ["- no feasible finished trial"]
        others = [(against(o), o) for o in result.get("given") or []]
        others += [("closest to the constraints", result["closest"])] if result.get("closest") else []
        for says, other in others:
            if not any(b["trial"] == other["trial"] for b in result["best"]):
                lines.append(
                    f"- {says}, trial {other['trial']}: {shown_values(other['reported'])}"
                    + met(other, result)
                    + f"; {shown_setting(other['scaling'])}"
                )
        lines += [f"- {line}" for line in gain_lines(result)]
        if result.get("length"):
            lines.append(f"- every trial judged at {result['length']} tokens (its verdict's target)")
        pngs = [root / f"{name}.png" for name in FIGURES if (root / f"{name}.png").is_file()]
        md += [
            "",
            f"## Search ({root})",
            "",
            head,
            "",
            "Best"
            + (" (Pareto front)" if len(result["objective"]) > 1 else "")
            + f"; every trial in {root / 'search_trials.csv'}:",
            "",
            *lines,
            "",
            *[f"![{png.stem}]({png.name})" for png in pngs],
        ]
        parts.append(
            f"<h2>Search ({html.escape(str(root))})</h2><p class=note>{html.escape(head)}</p><ul>"
            + "".join(f"<li>{html.escape(line[2:])}</li>" for line in lines)
            + "</ul>"
            + "".join(
                f'<figure><img alt="{png.stem}" src="data:image/png;base64,'
                f'{base64.b64encode(png.read_bytes()).decode()}"><figcaption>{png.stem}</figcaption></figure>'
                for png in pngs
            )
        )
    return md, parts
