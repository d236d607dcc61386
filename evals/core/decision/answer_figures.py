"""The figures of the answer, drawn from results alone: for each metric an eval declares (evals/core/registry.py
``Metric``), its value by length for one job (at the end of the job) or for many (the report), with its 95%
interval, the trained context and the target marked, and -- where an unscaled reference exists -- a lower
panel of value / reference with the verdict's limit (evals/core/decision/verdict.py), so a reader sees where and by
how much each strategy passes. Nothing here knows an eval by name."""

from __future__ import annotations

from ..measure import by_metric, measured_value
from ..plots import Curve, length_figure
from .reference import Reference

SHOWN_FIELDS = (
    "protocol",
    "stride",
    "documents",
    "min_document_tokens",
    "haystack",
    "depths",
    "trials",
    "limit",
    "tasks",
)


def rows_of(measurements: list[dict], metric: str) -> list[dict]:
    """[{"length", "value", "ci95_low", "ci95_high"}] of ``metric`` from a job's measurement records."""
    found = by_metric(measurements).get(metric, {})
    return [
        {"length": L, "value": measured_value(r), "ci95_low": r.get("low"), "ci95_high": r.get("high")}
        for L, r in sorted(found.items())
        if measured_value(r) is not None
    ]


def reference_of(reference: Reference | None, metric: str, lengths, trained: int) -> dict[int, float]:
    """{L: the unscaled value the verdict compares L with} -- the same length up to T, T beyond it."""
    if reference is None:
        return {}
    found = {}
    for L in lengths:
        value = reference.value(metric, L if L <= trained else trained)
        if value:
            found[L] = value
    return found


def describe(compare_fields: dict) -> str:
    """A short account of what was measured (protocol, documents, depths, trials ...) from a job's compared fields."""
    parts = []
    for eval_name, fields in (compare_fields or {}).items():
        shown = [
            f"{k}={_short(v)}" for k, v in (fields.get("eval") or {}).items() if k in SHOWN_FIELDS and v is not None
        ]
        data = (fields.get("data") or {}).get("name")
        parts.append(", ".join([eval_name + (f" on {data}" if data else ""), *shown]))
    return "; ".join(parts)


def _short(value) -> str:
    if isinstance(value, list):
        return "[" + ",".join(map(str, value[:6])) + (",..." if len(value) > 6 else "") + "]"
    return str(value)


def metric_figure(metric: dict, curves: list[Curve], *, trained: int, target: int | None, criteria: dict, title: str):
    """One declared metric by length, one curve per job, with the verdict's ratio panel where references exist."""
    lower = metric["lower_is_better"]
    limit = 1 + criteria["tolerance"] if lower else criteria["retained"]
    ratio = (
        {"label": f"÷ unscaled ({'≤' if lower else '≥'} {limit:g} passes)", "limit": limit}
        if metric.get("verdict")
        else None
    )
    bounds = metric.get("bounds")
    margin = 0.05 * (bounds[1] - bounds[0]) if bounds else 0
    return length_figure(
        curves,
        "value",
        ylabel=metric["label"] + (" (band: 95% interval)" if metric.get("interval") else ""),
        title=title,
        band=("ci95_low", "ci95_high"),
        logy=bool(metric.get("log")),
        ylim=(bounds[0] - margin, bounds[1] + margin) if bounds else None,
        trained=trained,
        target=target,
        ratio=ratio,
    )


def job_figures(
    label: str,
    strategy: str,
    measurements: list[dict],
    declared: dict,
    reference: Reference | None,
    trained: int,
    target: int | None,
    criteria: dict,
    subtitle: str,
) -> dict:
    """{<metric>_by_length: figure} for one job's declared metrics."""
    figures = {}
    for name, metric in declared.items():
        rows = rows_of(measurements, name)
        if not rows:
            continue
        curve = Curve(label, strategy, rows, reference_of(reference, name, [r["length"] for r in rows], trained))
        figures[f"{name}_by_length"] = metric_figure(
            metric,
            [curve],
            trained=trained,
            target=target,
            criteria=criteria,
            title=f"{metric['label']} by length: {label}\n{subtitle}",
        )
    return figures
