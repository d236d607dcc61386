"""What a search leaves in its sweep directory, in the sweep's report and in W&B.

- ``search_trials.csv``: one row per trial -- its state, the objective values, the constrained values and whether
  the trial is feasible, the values it tried (per-dimension factors as their list), its job directory, the error
  of a failed trial.
- ``search.json``: the objective with its directions, the constraints, the space, the best trial (the Pareto front
  for several objectives), the counts.
- ``conf/scaling/<strategy>_searched.yaml`` (several objectives: ``<strategy>_pareto<trial>.yaml``): the best
  setting as a scaling option: ``python run.py hydra.searchpath=[file://<sweep dir>/conf] scaling=yarn_searched``,
  or copied into ``conf/scaling/``.
- Figures (PNG and SVG), Optuna's own plots: the objective by trial, parameter importances (fANOVA), parallel
  coordinates of the most important parameters and, for several objectives, the Pareto front; they go into the
  sweep's report (:func:`report_section`) and, with the table and the best values, into one W&B run of the sweep's
  group (job type ``search``).
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from omegaconf import OmegaConf

from ..core.files import atomic_write
from ..core.run.output import save_figure, write_csv
from .objective import constraint_values

RESULT = "search.json"
FIGURES = ("search_history", "search_importance", "search_parallel", "search_pareto")


def feasible(trial) -> bool:
    return all(v <= 0 for v in trial.user_attrs.get("constraints") or [])


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
        f"{_values(trial.user_attrs.get('reported'))}.\n"
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


# Parameter importances (fANOVA over a random forest of the finished trials) and the parallel-coordinate plot ordered
# by them describe the sampler's first draws, not the parameters, below this many finished trials -- and below two
# per searched value
MIN_TRIALS_FOR_IMPORTANCE = 10


def importance_budget(search) -> int:
    return max(MIN_TRIALS_FOR_IMPORTANCE, 2 * sum(dim.size for dim in search.space))


def figures(search, study) -> dict:
    """Optuna's plots of the study (matplotlib): the history always; importances and the parallel coordinates from
    :func:`importance_budget` finished trials on (said in one line when fewer); a plot Optuna cannot draw is left
    out. Trials that miss the constraints are grey, with a legend entry saying so."""
    import matplotlib

    matplotlib.use("Agg")
    import optuna.visualization.matplotlib as plots

    objective = search.objectives[0]
    kwargs = {} if len(search.objectives) == 1 else {"target": lambda t: t.values[0], "target_name": objective.key}
    found = {}
    complete = sum(t.state.name == "COMPLETE" for t in study.trials)
    enough = complete >= importance_budget(search)
    draw = {"search_history": lambda: plots.plot_optimization_history(study, **kwargs)}
    if enough:
        draw["search_importance"] = lambda: plots.plot_param_importances(study, **kwargs)
    else:
        print(
            f"search: no importance or parallel-coordinate figure from {complete} finished trial(s): importances "
            f"(fANOVA) need at least {importance_budget(search)} ({MIN_TRIALS_FOR_IMPORTANCE}, and 2 per searched "
            f"value); below that they describe the sampler's first draws, not the parameters"
        )
    if len(search.objectives) > 1:  # the trade-off itself: every trial on the first two objectives, the front marked
        draw["search_pareto"] = lambda: plots.plot_pareto_front(
            study,
            targets=lambda t: t.values[:2],
            target_names=[o.key for o in search.objectives[:2]],
            constraints_func=constraint_values if search.constraints else None,
        )
    for name, plot in draw.items():
        try:
            found[name] = plot()
        except Exception as err:  # noqa: BLE001 -- e.g. importances need two finished trials
            print(f"search: no {name} figure ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})")
    try:
        if not enough:
            raise _NotDrawn
        import optuna

        important = list(
            optuna.importance.get_param_importances(study, **{k: v for k, v in kwargs.items() if k == "target"})
        )[:8]
        found["search_parallel"] = plots.plot_parallel_coordinate(study, params=important, **kwargs)
    except _NotDrawn:
        pass
    except Exception as err:  # noqa: BLE001
        print(
            f"search: no search_parallel figure ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
        )
    for name, axes in found.items():
        axes = axes.flat[0] if hasattr(axes, "flat") else axes
        retitle(axes, f"{name.removeprefix('search_')}: {search.strategy.name}, {objective.direction} {objective.key}")
        if name == "search_history":
            log_scale_if_wide(axes)
        if name == "search_parallel":  # long parameter names side by side: slanted, smaller, so they do not overlap
            for label in axes.get_xticklabels():
                label.set_rotation(25)
                label.set_horizontalalignment("right")
                label.set_fontsize("small")
            axes.figure.subplots_adjust(bottom=0.22, left=0.16)
        if search.constraints and any(t.state.name == "COMPLETE" and not feasible(t) for t in study.trials):
            legend_infeasible(axes)
        found[name] = axes.figure
    return found


class _NotDrawn(Exception):
    pass


def legend_infeasible(axes) -> None:
    """A legend entry for the grey points Optuna draws for trials that miss the constraints."""
    from matplotlib.lines import Line2D

    handles, labels = axes.get_legend_handles_labels()
    handles.append(Line2D([], [], marker="o", linestyle="", color="#cccccc", label="infeasible (misses a constraint)"))
    axes.legend(handles=handles, loc="best", fontsize="small")


def retitle(axes, title: str) -> None:
    """Our title in place of Optuna's, whichever slot it used (the importance plot titles on the left)."""
    for loc in ("left", "right"):
        axes.set_title("", loc=loc)
    axes.set_title(title)


def log_scale_if_wide(axes, span: float = 10.0) -> None:
    """A log objective axis when the values span more than ``span``x (a few bad perplexities would squeeze the
    trials that matter into the bottom of a linear axis)."""
    values = [y for c in axes.collections for y in c.get_offsets()[:, 1].tolist()]
    values += [y for line in axes.lines for y in line.get_ydata()]
    if values and min(values) > 0 and max(values) / min(values) > span:
        axes.set_yscale("log")


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
            f"- trial {b['trial']}: {_values(b.get('reported') or b['values'])}"
            + _met(b, result)
            + f"; {_setting(b['scaling'])}; config {b['config']}"
            for b in result["best"]
        ] or ["- no feasible finished trial"]
        others = [(_against(o), o) for o in result.get("given") or []]
        others += [("closest to the constraints", result["closest"])] if result.get("closest") else []
        for says, other in others:
            if not any(b["trial"] == other["trial"] for b in result["best"]):
                lines.append(
                    f"- {says}, trial {other['trial']}: {_values(other['reported'])}"
                    + _met(other, result)
                    + f"; {_setting(other['scaling'])}"
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


def summary_lines(result: dict) -> list[str]:
    """What the search found, for the terminal: the best feasible trial, whether it and the setting it is set
    against (the published default, or the settings given) met the constraints, and the best's paired ratio to
    that setting with its 95% interval; or that no trial met the constraints and the closest one."""
    given = [g for g in result.get("given") or [] if g["trial"] not in {b["trial"] for b in result["best"]}]
    lines = []
    for best in result["best"]:
        lines.append(
            f"search: best: trial {best['trial']}, {_values(best['reported'])}{_met(best, result)} "
            f"({_setting(best['scaling'])})"
        )
    if not result["best"] and result.get("closest"):
        closest = result["closest"]
        lines.append(
            f"search: no trial met the constraints ({'; '.join(result['constraints'])}); the closest: trial "
            f"{closest['trial']}, {_values(closest['reported'])} ({_setting(closest['scaling'])})"
        )
    elif not result["best"]:
        lines.append("search: no feasible finished trial")
    for g in given:
        lines.append(
            f"search: against {_against_short(result, g['trial'])}, trial {g['trial']}: {_values(g['reported'])}"
            f"{_met(g, result)} "
            f"({_setting(g['scaling'])})"
        )
    for best in result["best"]:
        if any(g["trial"] == best["trial"] for g in result.get("given") or []):
            lines.append(f"search: the best is trial {best['trial']}, {_against_short(result, best['trial'])} itself")
    lines += [f"search: {line}" for line in gain_lines(result)]
    return lines


def gain_lines(result: dict) -> list[str]:
    """The best against each setting it is set against: ``trial 3 against the published default (trial 0): ppl@512
    x0.912 [0.88, 0.95] (95%, t over paired documents, n=3): better``."""
    lines = []
    names = {g["trial"]: _against_short(result, g["trial"]) for g in result.get("given") or []}
    for best in result["best"]:
        for number, compared in (best.get("versus") or {}).items():
            for key, c in compared.items():
                interval = (
                    f" [{c['low']:.5g}, {c['high']:.5g}] (95%, {c['method']}, n={c['n']})"
                    if c.get("low") is not None and c.get("high") is not None
                    else " (no interval: too few units to pair)"
                )
                lines.append(
                    f"best (trial {best['trial']}) against {names.get(int(number), 'trial ' + number)} "
                    f"(trial {number}): {key} x{c['ratio']:.5g}{interval}: {_reading(c)}"
                )
    return lines


def comparison_summary(result: dict) -> dict:
    """The W&B summary keys of the setting the best is set against and of the best's paired ratio to it."""
    found = {}
    for g in result.get("given") or []:
        prefix = "default" if g.get("role") == "default" else f"given{g['trial']}"
        found |= {f"{prefix}/{k}": v for k, v in (g.get("reported") or {}).items()}
        found |= {f"{prefix}/trial": g["trial"], f"{prefix}/feasible": g["feasible"]}
    for best in result["best"][:1]:
        for number, compared in (best.get("versus") or {}).items():
            other = next((g for g in result.get("given") or [] if str(g["trial"]) == number), {})
            prefix = "default" if other.get("role") == "default" else f"given{number}"
            for key, c in compared.items():
                found |= {f"best_vs_{prefix}/{key}/{part}": c.get(part) for part in ("ratio", "low", "high")}
    return found


def _reading(c: dict) -> str:
    """What a paired ratio says: better or worse when its interval excludes 1, else not distinguishable."""
    if c.get("low") is None or c.get("high") is None:
        return "undecided"
    if c["low"] <= 1 <= c["high"]:
        return "not distinguishable at this sample"
    return "better" if (c["high"] < 1) != c["maximize"] else "worse"


def _met(entry: dict, result: dict) -> str:
    if not result.get("constraints"):
        return ""
    return ", meets the constraints" if entry.get("feasible", True) else ", misses the constraints"


def _against(entry: dict) -> str:
    if entry.get("role") == "default":
        return "against the published default"
    return "against a setting given (hydra.sweeper.enqueue)"


def _against_short(result: dict, trial: int) -> str:
    entry = next((g for g in result.get("given") or [] if g["trial"] == trial), {})
    return "the published default" if entry.get("role") == "default" else "the given setting"


def _values(reported: dict | None) -> str:
    return ", ".join(f"{k} = {v:.5g}" for k, v in (reported or {}).items() if v is not None)


def _setting(scaling: dict) -> str:
    shown = {
        k: (f"{v:.4g}" if isinstance(v, float) else v)
        for k, v in scaling.items()
        if not isinstance(v, list) and v is not None
    }
    return ", ".join(f"{k}={v}" for k, v in shown.items())
