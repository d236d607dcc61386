"""The report's figures: each declared metric by length (a paper figure and an interactive chart per model and
comparison key) and the sections each eval adds (retrieval heatmaps, decay, ...), saved as PNG and SVG."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from ..core.decision.answer_figures import describe, metric_figure, reference_of, rows_of
from ..core.files import atomic_write
from ..core.run.output import save_figure
from ..core.plots import Curve
from .charts import length_chart
from .load import job_info


def run_label(job: dict, jobs: list[dict]) -> str:
    """The strategy and model; the directory when two jobs would read the same."""
    info = job_info(job)
    label = f"{info.get('model_label')} {info.get('scaling')}"
    twins = [j for j in jobs if f"{job_info(j).get('model_label')} {job_info(j).get('scaling')}" == label]
    return label if len(twins) == 1 else f"{label} ({job['dir'].name})"


def metric_figures(jobs: list[dict], verdicts: dict, references: dict, criteria: dict) -> tuple[dict, list[str]]:
    """({name: figure}, [interactive chart HTML]) -- each declared metric by length, one figure per model and
    comparison key (runs that measured other things are never drawn as if comparable)."""
    groups: dict[tuple, list[int]] = {}
    for index in verdicts:
        job = jobs[index]
        info = job_info(job)
        if info.get("role", "job") != "job":
            continue
        for name, metric in (job.get("declared") or {}).items():
            if rows_of(job.get("measurements") or [], name):
                key = (name, info.get("model_label"), (info.get("compare") or {}).get(metric.get("eval")))
                groups.setdefault(key, []).append(index)
    figures, charts = {}, []
    counts: Counter = Counter()
    for (name, model, _), members in groups.items():
        first = jobs[members[0]]
        metric = first["declared"][name]
        trained = job_info(first).get("trained_context")
        targets = {job_info(jobs[i]).get("target_length") for i in members}
        target = targets.pop() if len(targets) == 1 else None
        curves = []
        for i in members:
            rows = rows_of(jobs[i].get("measurements") or [], name)
            curves.append(
                Curve(
                    run_label(jobs[i], [jobs[m] for m in members]),
                    (jobs[i].get("config") or {}).get("scaling", {}).get("name", "none"),
                    rows,
                    reference_of(references.get(i), name, [r["length"] for r in rows], trained),
                )
            )
        subtitle = describe({metric.get("eval"): (first.get("compare") or {}).get(metric.get("eval")) or {}})
        title = f"{metric['label']} by length: {model}\n{subtitle}"
        counts[name] += 1
        figure_name = f"{name}_by_length" + (f"_{counts[name]}" if counts[name] > 1 else "")
        figures[figure_name] = metric_figure(
            metric, curves, trained=trained, target=target, criteria=criteria, title=title
        )
        charts.append(
            length_chart(
                title.replace("\n", " -- "),
                [
                    {
                        "label": c.label,
                        "strategy": c.strategy,
                        "reference": c.reference,
                        "points": [(r["length"], r["value"], r.get("ci95_low"), r.get("ci95_high")) for r in c.rows],
                    }
                    for c in curves
                ],
                ylabel=metric["label"],
                log=bool(metric.get("log")),
                trained=trained,
                target=target,
                bounds=metric.get("bounds"),
                limit=(1 + criteria["tolerance"] if metric["lower_is_better"] else criteria["retained"])
                if metric.get("verdict")
                else None,
            )
        )
    return figures, charts


def section_figures(jobs: list[dict]) -> dict:
    """The figures each eval's registration adds to the report (``report=``: retrieval heatmaps, the decay of
    every strategy, ...), from the finished runs it measured; reference runs left out."""
    from .. import load_evals

    shown = [j for j in jobs if j["state"] == "done" and job_info(j).get("role", "job") == "job"]
    figures = {}
    for name, spec in load_evals().items():
        if spec.report is not None:
            figures.update(spec.report(name, shown, lambda job: run_label(job, shown)))
    return figures


def save_figures(figures: dict, out: Path) -> tuple[list[Path], dict[str, bytes]]:
    """Each figure as ``report_<name>.png`` and ``.svg`` in ``out``: (the paths written, {name: PNG bytes})."""
    written, images = [], {}
    for name, fig in figures.items():
        for suffix, data in save_figure(fig, dpi=110).items():
            path = out / f"report_{name}.{suffix}"
            atomic_write(path, data)
            written.append(path)
            if suffix == "png":
                images[name] = data
    return written, images
