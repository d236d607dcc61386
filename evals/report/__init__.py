"""A local comparison report over any number of runs and sweeps (no W&B needed), answering the question a
user comes with: does each strategy keep the model working at each length, against the unscaled model?

    python -m evals.report multirun/2026-11-22/20-30-00 [more dirs ...] [--out DIR] [--tolerance 0.1] [--retained 0.85]

Reads every results.json under the given directories -- one row per job identity (its key; a resumed copy
of a finished job is the same row), failed / interrupted / dead / running jobs and unreadable files listed
with their reasons -- and writes into ``--out`` (default: the first directory):

- the verdict of every job (evals/core/verdict.py, the rule a job applies at its end): each strategy judged
  against the unscaled run *comparable* with it -- same model, data content, protocol, documents, tokens
  scored, stride ... (the job's comparison key, recorded in results.json); a run with no comparable
  unscaled run is named with what differs, never compared silently; a reference from other code or
  package versions is used with a note. The thresholds are the runs' own (``verdict.*``) unless given here.
- ``report.md``, ``report.csv`` (one row per job: measurements, verdicts, what was compared) and
  ``report_verdict.csv``; short-context retention; the agreement between metrics across strategies beyond
  the trained context (Spearman and Pearson, scipy).
- figures (PNG and SVG): each declared metric by length, one line per run in its strategy's colour, with
  its interval, the trained and target lengths, and a value / unscaled panel with the verdict's limit;
  retrieval heatmaps on one colour scale; the expected RoPE decay of every strategy.
- ``report.html``: all of it in one self-contained page (opens offline) with interactive charts.

It also runs at the end of every multirun (``ReportCallback``, conf/hydra/default.yaml): the verdict table is
printed, the report is logged to W&B as a run of the sweep's group, and the sweep exits non-zero when one
of its own jobs did not finish.
"""

from __future__ import annotations

import argparse
import base64
import csv
import html
import io
import math
import os
import re
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

from hydra.experimental.callback import Callback

from ..core.files import atomic_write, unwritable
from ..core.figures import describe, metric_figure, reference_of, rows_of
from .charts import SCRIPT as CHART_SCRIPT
from .charts import STYLE as CHART_STYLE
from .charts import length_chart
from ..core.output import save_figure
from ..core.plots import Curve
from ..core.rundir import SWEEP, load_results, state
from ..core.measure import by_metric, measured_value
from ..core.ranking import format_group, rank
from ..core.ranking import table as ranking_table
from ..core.verdict import DEFAULTS, Reference, format_table, judge, own_reference, reference_from, word
from ..search import is_search
from ..search.outputs import report_section

FIXED = ["model", "weights", "data", "eval", "strategy", "state", "target", "verdict", "effective_length"]


def load_jobs(dirs) -> list[dict]:
    """Every results.json under ``dirs`` (each read once) with its directory and state; a file that cannot be
    read, or is not a rope_ext result, is kept as an ``unreadable`` entry with the reason."""
    jobs, seen = [], set()
    for root in dirs:
        for path in sorted(Path(root).glob("**/results.json")):
            if path.resolve() in seen:
                continue
            seen.add(path.resolve())
            data, why = load_results(path)
            if data is None:
                jobs.append({"dir": path.parent, "state": "unreadable", "error": {"message": f"results.json {why}"}})
                continue
            data["dir"], data["state"] = path.parent, state(data)
            jobs.append(data)
    return jobs


def one_per_identity(jobs: list[dict]) -> list[dict]:
    """One job per key: a finished original over a resumed copy over an unfinished attempt."""
    rank = {"done": 0, "running": 2, "interrupted": 3, "dead": 3, "failed": 4}
    best: dict[str, dict] = {}
    keyless = []
    for job in jobs:
        key = (job.get("job") or {}).get("key")
        if key is None:
            keyless.append(job)
            continue
        score = (rank.get(job["state"], 5), "resumed_from" in job)
        if key not in best or score < best[key]["_score"]:
            best[key] = {**job, "_score": score}
    return [*best.values(), *keyless]


def _info(job: dict) -> dict:
    return job.get("job") or {}


def _flat(tree, prefix: str = "") -> dict:
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    found = {}
    for key, value in tree.items():
        found.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return found


def differences(a: dict, b: dict, eval_name: str) -> list[str]:
    """What differs between two jobs' compared fields for ``eval_name`` (``eval.documents: 2 vs 1``)."""
    fa, fb = _flat((a.get("compare") or {}).get(eval_name) or {}), _flat((b.get("compare") or {}).get(eval_name) or {})
    found = []
    for key in sorted(set(fa) | set(fb)):
        if fa.get(key) != fb.get(key):
            va, vb = (
                str(v) if not isinstance(v, str) or len(v) < 40 else v[:12] + "..." for v in (fa.get(key), fb.get(key))
            )
            found.append(f"{key}: {va} vs {vb}")
    return found


def criteria_from(jobs: list[dict], tolerance: float | None, retained: float | None) -> dict:
    """The verdict thresholds: given here, else the ones most of the runs were judged with, else the defaults."""
    stored = Counter(
        tuple(sorted(((j.get("verdict") or {}).get("criteria") or {}).items())) for j in jobs if j.get("verdict")
    )
    criteria = dict(stored.most_common(1)[0][0]) if stored else dict(DEFAULTS)
    if tolerance is not None:
        criteria["tolerance"] = tolerance
    if retained is not None:
        criteria["retained"] = retained
    return criteria


def judge_all(jobs: list[dict], criteria: dict) -> tuple[dict[int, dict], dict[int, Reference | None], list[str]]:
    """({index: verdict}, {index: the reference used}, warnings) for every finished job that declares metrics:
    each against the comparable unscaled runs among ``jobs``."""
    unscaled = [j for j in jobs if j["state"] == "done" and _info(j).get("scaling") == "none"]
    verdicts, references, warnings = {}, {}, []
    for index, job in enumerate(jobs):
        info, declared = _info(job), job.get("declared") or {}
        if job["state"] != "done" or not any(d.get("verdict") for d in declared.values()):
            continue
        measured, missing = job.get("measurements") or [], None
        if not measured:  # a run from before measurements were recorded with their units
            warnings.append(
                f"{info.get('model_label')} {info.get('scaling')} ({job['dir']}): recorded without per-unit "
                f"measurements (an older rope_ext); re-run it to judge it"
            )
            continue
        if info.get("scaling") == "none":
            reference = own_reference(measured)
        else:
            reference = reference_from(unscaled, info.get("compare") or {}, info.get("environment"))
            if reference is None:
                missing = _why_not_compared(job, unscaled)
                if info.get("role") != "reference":
                    warnings.append(
                        f"{info.get('model_label')} {info.get('scaling')} ({info.get('eval')}, {job['dir']}): {missing}"
                    )
        for note in reference.notes if reference is not None else []:
            warnings.append(f"{info.get('model_label')} {info.get('scaling')} ({job['dir']}): {note}")
        verdicts[index] = judge(
            measured,
            declared,
            reference,
            info.get("trained_context") or 0,
            info.get("target_length"),
            criteria,
            missing,
        )
        references[index] = reference
    return verdicts, references, warnings


def _why_not_compared(job: dict, unscaled: list[dict]) -> str:
    """Why a scaled job has no reference here: no unscaled run of its model and eval, or what differs."""
    info = _info(job)
    same_model = [
        u
        for u in unscaled
        if _info(u).get("model_label") == info.get("model_label")
        and set(_info(u).get("compare") or {}) & set(info.get("compare") or {})
    ]
    if not same_model:
        return "no unscaled run of this model with this eval among the reports' directories: no verdict"
    other = same_model[0]
    eval_name = next(iter(set(_info(other).get("compare") or {}) & set(info.get("compare") or {})))
    diff = differences(job, other, eval_name) or ["their comparison keys differ"]
    return f"not compared with the unscaled run in {other['dir']}, which measured other things ({'; '.join(diff[:4])})"


def _length_key(column: str):
    match = re.search(r"@(\d+)$", column)
    return (column[: match.start()], int(match.group(1))) if match else (column, -1)


def job_row(job: dict, verdict: dict | None) -> dict:
    """One job as a table row: who it is, its answer, what it measured (declared metrics by length)."""
    info, config = _info(job), job.get("config") or {}
    row = {
        "model": info.get("model_label") or (config.get("model") or {}).get("name"),
        "weights": info.get("weights"),
        "data": info.get("data"),
        "eval": info.get("eval"),
        "strategy": info.get("scaling"),
        "state": job["state"],
        "target": info.get("target_length"),
        "trained": info.get("trained_context"),
        "role": info.get("role", "job"),
    }
    if verdict is not None:
        summary = verdict["summary"]
        row["verdict"] = word(summary.get("verdict_state")) if summary.get("target_length") else ""
        row["effective_length"] = summary.get("effective_length")
        row.update({f"verdict@{r['length']}": word(r["state"]) for r in verdict["lengths"]})
    declared = job.get("declared") or {}  # an unfinished run: what it measured before it stopped
    for name, by_length in by_metric(job.get("measurements") or []).items():
        if name in declared:
            row.update({f"{name}@{L}": measured_value(r) for L, r in by_length.items()})
    row["compared"] = ",".join(f"{k}:{v[:8]}" for k, v in sorted((info.get("compare") or {}).items()))
    row["elapsed_s"] = (job.get("timings") or {}).get("elapsed_s")
    row["dir"] = str(job["dir"])
    row["key"] = info.get("key")
    row["error"] = ((job.get("error") or {}).get("message") or "") if job["state"] != "done" else ""
    return row


def _varying(jobs: list[dict]) -> dict[int, dict]:
    """Per job, the compared fields whose values differ between runs of the same model and eval: the
    columns that say why two rows are not compared."""
    groups: dict[tuple, list[int]] = {}
    for index, job in enumerate(jobs):
        for eval_name in job.get("compare") or {}:
            groups.setdefault((_info(job).get("model_label"), eval_name), []).append(index)
    found: dict[int, dict] = {}
    for (_, eval_name), members in groups.items():
        flats = {i: _flat((jobs[i].get("compare") or {}).get(eval_name) or {}) for i in members}
        keys = set().union(*flats.values())
        for key in sorted(keys):
            values = {str(flats[i].get(key)) for i in members}
            if len(values) > 1:
                for i in members:
                    value = flats[i].get(key)
                    found.setdefault(i, {})[f"{eval_name}:{key}"] = (
                        value if not isinstance(value, str) or len(value) < 40 else value[:16] + "..."
                    )
    return found


def _columns(rows: list[dict]) -> list[str]:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    verdicts = sorted((k for k in keys if k.startswith("verdict@")), key=_length_key)
    measured = sorted((k for k in keys if "@" in k and not k.startswith("verdict@")), key=_length_key)
    tail = ["compared", "elapsed_s", "dir", "key", "error"]
    rest = [
        k
        for k in keys
        if k not in FIXED and k not in measured and k not in verdicts and k not in tail and k not in ("trained", "role")
    ]
    return FIXED + verdicts + measured + rest + tail


def _fmt(value) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}"
    return "" if value is None else str(value)


def _group(row) -> tuple:
    return row["model"], row["weights"], row["data"], row["eval"]


def retention(jobs: list[dict], verdicts: dict[int, dict]) -> list[dict]:
    """Each strategy's metrics at lengths up to the trained context relative to its comparable unscaled run
    (evals/core/verdict.py's rule: 1 = nothing lost)."""
    found = []
    for index, verdict in verdicts.items():
        info = _info(jobs[index])
        if info.get("scaling") == "none":
            continue
        kept = {k: v for k, v in verdict["summary"].items() if "_retention@" in k}
        if kept:
            found.append(
                {
                    "model": info.get("model_label"),
                    "data": info.get("data"),
                    "eval": info.get("eval"),
                    "strategy": info.get("scaling"),
                    **kept,
                }
            )
    return found


def agreement(jobs: list[dict]) -> list[dict]:
    """Across finished jobs (same model, weights, data), at each length beyond the trained context: the
    Spearman and Pearson correlation between every two declared quality metrics measured there by at least
    three strategies. Does perplexity rank strategies the way retrieval does on this model?"""
    from scipy import stats

    found = []
    by_group: dict[tuple, list[dict]] = {}
    for job in jobs:
        if job["state"] == "done" and job.get("declared"):
            info = _info(job)
            by_group.setdefault((info.get("model_label"), info.get("weights"), info.get("data")), []).append(job)
    for (model, _, data), members in by_group.items():
        merged: dict[str, dict[str, float]] = {}  # strategy -> metric@L -> value (a suite's evals merge)
        names: list[str] = []
        for job in members:
            declared = job["declared"]
            names += [m for m, d in declared.items() if d.get("verdict") or d.get("lower_is_better")]
            merged.setdefault(_info(job).get("scaling"), {}).update(
                {
                    f"{name}@{L}": measured_value(r)
                    for name, by_length in by_metric(job.get("measurements") or []).items()
                    if name in declared
                    for L, r in by_length.items()
                    if measured_value(r) is not None
                }
            )
        trained = max((_info(j).get("trained_context") or 0) for j in members)
        names = list(dict.fromkeys(names))
        lengths = sorted({int(k.split("@")[1]) for m in merged.values() for k in m if int(k.split("@")[1]) > trained})
        for L in lengths:
            present = [m for m in names if sum(f"{m}@{L}" in v for v in merged.values()) >= 3]
            for i, a in enumerate(present):
                for b in present[i + 1 :]:
                    pairs = [
                        (v[f"{a}@{L}"], v[f"{b}@{L}"]) for v in merged.values() if f"{a}@{L}" in v and f"{b}@{L}" in v
                    ]
                    xs, ys = zip(*pairs)
                    if len(pairs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
                        continue
                    spearman, pearson = stats.spearmanr(xs, ys), stats.pearsonr(xs, ys)
                    found.append(
                        {
                            "model": model,
                            "data": data,
                            "length": L,
                            "metrics": f"{a} vs {b}",
                            "jobs": len(pairs),
                            "spearman": float(spearman.statistic),
                            "spearman_p": float(spearman.pvalue),
                            "pearson": float(pearson.statistic),
                            "pearson_p": float(pearson.pvalue),
                        }
                    )
    return found


def verdict_rows(jobs: list[dict], verdicts: dict[int, dict]) -> list[dict]:
    """The answer table: one row per judged job (reference runs left out), lengths as columns."""
    rows = []
    for index, verdict in verdicts.items():
        info = _info(jobs[index])
        if info.get("role", "job") != "job":
            continue
        summary = verdict["summary"]
        rows.append(
            {
                "model": info.get("model_label"),
                "data": info.get("data"),
                "eval": info.get("eval"),
                "strategy": info.get("scaling"),
                "trained": verdict["trained"],
                "target": verdict["target"],
                "verdicts": {r["length"]: r["state"] for r in verdict["lengths"]},
                "reasons": {r["length"]: r["reason"] for r in verdict["lengths"]},
                "verdict": summary.get("verdict_state"),
                "effective_length": summary.get("effective_length"),
                "reference": ", ".join((verdict.get("reference") or {}).get("sources") or [])
                or verdict.get("missing")
                or "",
            }
        )
    return sorted(
        rows,
        key=lambda r: (str(r["model"]), str(r["data"]), str(r["eval"]), r["strategy"] != "none", str(r["strategy"])),
    )


def verdict_text(rows: list[dict]) -> list[str]:
    """The verdict tables as printed at the end of a sweep (one per model, data and eval)."""
    lines = []
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["model"], row["data"], row["eval"]), []).append(row)
    for (model, data, eval_name), members in groups.items():
        lines += [
            "",
            f"verdict: {model}, {eval_name} on {data} -- does each strategy keep the model working at each "
            f"length? (against the unscaled model on the same tokens)",
            *format_table(members, members[0]["trained"]),
        ]
    return lines


def _label(job: dict, jobs: list[dict]) -> str:
    """The strategy and model; the directory when two jobs would read the same."""
    info = _info(job)
    label = f"{info.get('model_label')} {info.get('scaling')}"
    twins = [j for j in jobs if f"{_info(j).get('model_label')} {_info(j).get('scaling')}" == label]
    return label if len(twins) == 1 else f"{label} ({job['dir'].name})"


def metric_figures(jobs: list[dict], verdicts: dict, references: dict, criteria: dict) -> tuple[dict, list[str]]:
    """({name: figure}, [interactive chart HTML]) -- each declared metric by length, one figure per model and
    comparison key (runs that measured other things are never drawn as if comparable)."""
    groups: dict[tuple, list[int]] = {}
    for index in verdicts:
        job = jobs[index]
        info = _info(job)
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
        trained = _info(first).get("trained_context")
        targets = {_info(jobs[i]).get("target_length") for i in members}
        target = targets.pop() if len(targets) == 1 else None
        curves = []
        for i in members:
            rows = rows_of(jobs[i].get("measurements") or [], name)
            curves.append(
                Curve(
                    _label(jobs[i], [jobs[m] for m in members]),
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

    shown = [j for j in jobs if j["state"] == "done" and _info(j).get("role", "job") == "job"]
    figures = {}
    for name, spec in load_evals().items():
        if spec.report is not None:
            figures.update(spec.report(name, shown, lambda job: _label(job, shown)))
    return figures


def _md_table(rows: list[dict], columns: list[str]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(_fmt(r.get(c)).replace("|", "/") for c in columns) + " |" for r in rows]


def _html_table(rows: list[dict], columns: list[str], cls: str = "") -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        f'<tr class="{html.escape(str(r.get("state", "done")))}">'
        + "".join(f'<td class="{_cell_class(r.get(c))}">{html.escape(_fmt(r.get(c)))}</td>' for c in columns)
        + "</tr>"
        for r in rows
    )
    return f'<div class="scroll"><table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _cell_class(value) -> str:
    return (
        {"yes": "yes", "NO": "no", "?": "unknown", "inconclusive": "inconclusive", "recommended": "yes"}.get(value, "")
        if isinstance(value, str)
        else ""
    )


STYLE = (
    """.answer{font-size:15px;background:#eef6ee;border-left:4px solid #2a7a2a;padding:6px 10px} body{font-family:system-ui,sans-serif;margin:20px auto;max-width:1360px;padding:0 12px;color:#222}
.scroll{overflow-x:auto;max-width:100%;margin:8px 0 20px} table{border-collapse:collapse;font-size:12px}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:right;white-space:nowrap} th{background:#f0f0f0;position:sticky;top:0}
td:first-child,th:first-child{position:sticky;left:0;background:#fafafa;text-align:left}
tr.failed td,tr.dead td,tr.interrupted td,tr.unreadable td{background:#fde2e2} tr.running td{background:#fff6d6}
td.yes{background:#dff3df;color:#14601a;font-weight:600} td.no{background:#fbdcdc;color:#9b1c1c;font-weight:600}
td.unknown{background:#eee;color:#666} td.inconclusive{background:#fff1cc;color:#7a5a00} img{max-width:100%;border:1px solid #ddd;margin:6px 0 18px} h2{margin-top:28px}
.note{color:#555;font-size:13px;max-width:1100px} .warn{background:#fff4e5;border:1px solid #f0b070;padding:8px 12px;
font-size:13px} .warn li{margin:3px 0}"""
    + CHART_STYLE
)


def write_report(
    dirs,
    out: Path | None = None,
    tolerance: float | None = None,
    retained: float | None = None,
    print_verdict: bool = False,
) -> list[Path]:
    dirs = [Path(d) for d in dirs]
    out = Path(out or dirs[0])
    loaded = load_jobs(dirs)
    jobs = one_per_identity(loaded)
    if not jobs:
        raise FileNotFoundError(f"no results.json under {', '.join(map(str, dirs))}")
    jobs = sorted(
        jobs,
        key=lambda j: (
            str(_info(j).get("model_label")),
            str(_info(j).get("weights")),
            str(_info(j).get("data")),
            str(_info(j).get("eval")),
            _info(j).get("scaling") != "none",
            str(_info(j).get("scaling")),
        ),
    )
    criteria = criteria_from(jobs, tolerance, retained)
    verdicts, references, warnings = judge_all(jobs, criteria)
    varying = _varying(jobs)
    rows = [{**job_row(job, verdicts.get(i)), **varying.get(i, {})} for i, job in enumerate(jobs)]
    columns = _columns(rows)
    out.mkdir(parents=True, exist_ok=True)
    answer = verdict_rows(jobs, verdicts)
    written = [out / "report.csv", out / "report.md", out / "report.html", out / "report_verdict.csv"]
    atomic_write(written[0], _csv(rows, columns))
    lengths = sorted({L for r in answer for L in r["verdicts"]})
    flat_answer = [
        {
            **{k: r[k] for k in ("model", "data", "eval", "strategy", "trained", "target")},
            **{f"verdict@{L}": word(r["verdicts"][L]) if L in r["verdicts"] else "" for L in lengths},
            "verdict": word(r["verdict"]) if r["target"] else "",
            "effective_length": r["effective_length"],
            "reference": r["reference"],
        }
        for r in answer
    ]
    atomic_write(written[3], _csv(flat_answer, list(flat_answer[0]) if flat_answer else ["model"]))
    ranked = rank(jobs, verdicts)
    ranking_rows = [row for group in ranked for row in ranking_table(group)]
    if ranking_rows:
        written.append(out / "report_ranking.csv")
        atomic_write(written[-1], _csv(ranking_rows, list(dict.fromkeys(k for r in ranking_rows for k in r))))
        written.append(out / "report_answer.txt")
        atomic_write(written[-1], "".join(group["answer"] + "\n" for group in ranked))
    if print_verdict and answer:
        print("\n".join(verdict_text(answer)))
        for group in ranked:
            print("\n" + "\n".join(format_group(group)))
        for warning in warnings:
            print(f"warning: {warning}")

    sections_md, sections_html = [], []
    if warnings:
        sections_md += ["", "## Warnings: what could not be compared", "", *[f"- {w}" for w in warnings]]
        sections_html.append(
            "<h2>Warnings: what could not be compared</h2><div class=warn><ul>"
            + "".join(f"<li>{html.escape(w)}</li>" for w in warnings)
            + "</ul></div>"
        )
    if ranked:
        rule = (
            "Recommended only when every metric measured is yes at the target (short-context checks included); "
            "ordered by the first metric, with the paired ratio to the best and its 95% interval on the units both "
            "measured; strategies whose interval against their group's leader holds 1 share a tie group; cost = "
            "compute time and peak memory relative to the unscaled job of the same evals."
        )
        sections_md += ["", "## The answer: which strategy at the target", "", rule, ""]
        sections_html.append(f"<h2>The answer: which strategy at the target</h2><p class=note>{html.escape(rule)}</p>")
        for group in ranked:
            rows_ = ranking_table(group)
            cols = list(dict.fromkeys(k for r in rows_ for k in r))
            sections_md += [f"**{group['answer']}**", "", *_md_table(rows_, cols), ""]
            sections_html.append(
                f"<p class=answer><b>{html.escape(group['answer'])}</b></p>" + _html_table(rows_, cols, "ranking")
            )
    if answer:
        cols = list(flat_answer[0])
        explain = (
            f"Each strategy at each length paired against the unscaled model on the same units (token blocks "
            f"of each document, prompts, samples): the ratio strategy / unscaled with its 95% interval; lower-is-"
            f"better metrics (ppl, LongPPL) pass at most {1 + criteria['tolerance']:g}, higher-is-better ones "
            f"(retrieval, RULER) at least {criteria['retained']:g} (at the same length up to the trained context, "
            f"at the trained context beyond it; beyond it the short-context checks must hold too). yes = the "
            f"whole interval within the limit, NO = beyond it, inconclusive = it straddles the limit (the reason "
            f"says how many more units would likely decide it). verdict = the answer at the target length; "
            f"effective_length = the largest length up to which every answer is yes. ? = a reference or a "
            f"length is missing (see the reason)."
        )
        sections_md += [
            "",
            "## Verdict: does each strategy keep the model working?",
            "",
            explain,
            "",
            *_md_table(flat_answer, cols),
        ]
        reasons = "".join(
            f"<li><b>{html.escape(str(r['strategy']))}</b> ({html.escape(str(r['eval']))}) at {L}: "
            f"{html.escape(r['reasons'][L])}</li>"
            for r in answer
            for L in sorted(r["reasons"])
            if r["verdicts"][L] != "yes"
        )
        sections_html.append(
            f"<h2>Verdict: does each strategy keep the model working?</h2><p class=note>{html.escape(explain)}"
            f"</p>{_html_table(flat_answer, cols, 'verdict')}"
            + (f"<details><summary>Why not yes</summary><ul class=note>{reasons}</ul></details>" if reasons else "")
        )
    search_md, search_html = report_section(dirs)  # a search's best setting and figures (evals/search)
    # a search's report leads with the search: its trials' own verdicts (at each trial's own target) come after
    sections_md, sections_html = search_md + sections_md, search_html + sections_html
    failed = [r for r in rows if r["state"] not in ("done", "unreachable")]  # unreachable: in the answer
    if failed:
        sections_md += ["", f"## Not finished: {len(failed)} of {len(rows)} jobs", ""]
        sections_md += [f"- {r['state']}: {r['dir']}: {r['error'] or '(no error recorded)'}" for r in failed]
        sections_html.append(
            f"<h2>Not finished: {len(failed)} of {len(rows)} jobs</h2><ul>"
            + "".join(
                f"<li><b>{html.escape(r['state'])}</b>: {html.escape(r['dir'])}: {html.escape(r['error'] or '(no error recorded)')}</li>"
                for r in failed
            )
            + "</ul>"
        )
    kept = retention(jobs, verdicts)
    if kept:
        cols = list(dict.fromkeys(k for r in kept for k in r))
        cols = cols[:4] + sorted(cols[4:], key=_length_key)
        sections_md += [
            "",
            "## Short-context retention (vs the comparable unscaled run; 1 = nothing lost)",
            "",
            *_md_table(kept, cols),
        ]
        sections_html.append(
            "<h2>Short-context retention</h2><p class=note>Each strategy at lengths up to the trained "
            "context relative to the comparable unscaled run (lower-is-better metrics: unscaled/strategy; "
            "accuracies and scores: strategy/unscaled); 1 = nothing lost.</p>" + _html_table(kept, cols)
        )
    agree = agreement(jobs)
    if agree:
        cols = list(agree[0])
        sections_md += ["", "## Agreement between metrics beyond the trained context", "", *_md_table(agree, cols)]
        sections_html.append(
            "<h2>Agreement between metrics beyond the trained context</h2><p class=note>Across the "
            "jobs of one model and data, at each length: does perplexity rank strategies like "
            "retrieval does?</p>" + _html_table(agree, cols)
        )
    figures, charts = metric_figures(jobs, verdicts, references, criteria)
    figures.update(section_figures(jobs))
    images = {}
    for name, fig in figures.items():
        for suffix, data in save_figure(fig, dpi=110).items():
            path = out / f"report_{name}.{suffix}"
            atomic_write(path, data)
            written.append(path)
            if suffix == "png":
                images[name] = data
    title = f"rope_ext report: {', '.join(map(str, dirs))}"
    md = [
        f"# {title}",
        "",
        f"{len(rows)} jobs; one row per job identity.",
        *sections_md,
        "",
        "## Jobs",
        "",
        *_md_table(rows, columns),
        "",
        *[f"![{n}](report_{n}.png)" for n in images],
    ]
    atomic_write(written[1], "\n".join(md) + "\n")
    page = [
        f'<!doctype html><html><head><meta charset=utf-8><meta name=viewport content="width=device-width">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
        f"<p class=note>{len(rows)} jobs; one row per job identity; lengths in order.</p>",
        *sections_html,
    ]
    if charts:
        page += ["<h2>By length (interactive: click a legend entry to hide or show a run, hover a point)</h2>", *charts]
    page += ["<h2>Jobs</h2>", _html_table(rows, columns, "jobs"), "<h2>Figures</h2>"]
    page += [
        f'<figure><img alt="{n}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'
        f"<figcaption>{n} (report_{n}.svg beside this page)</figcaption></figure>"
        for n, data in images.items()
    ]
    atomic_write(written[2], "\n".join(page) + CHART_SCRIPT + "</body></html>\n")
    return written


def _csv(rows: list[dict], columns: list[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


class ReportCallback(Callback):
    """Hydra callback: when a multirun ends, write the report, print the verdict table, log the report to W&B
    as a run of the sweep's group, and make the sweep exit non-zero (1) when any of its own jobs did not
    finish -- after every job has run."""

    def on_multirun_start(self, config, **kwargs) -> None:
        """Mark this sweep's jobs (their processes inherit the variable), so its end judges only its own; count them."""
        os.environ[SWEEP] = uuid.uuid4().hex
        self._jobs = None if is_search(config) else _sweep_size(config) or None
        self._finished, self._since = 0, time.monotonic()

    def on_job_end(self, config, job_return, **kwargs) -> None:
        """Where the sweep is: ``sweep: job 4/6 finished; about 12 min left at the rate measured so far``."""
        jobs = getattr(self, "_jobs", None)
        if not jobs:
            return
        self._finished += 1
        per_job = (time.monotonic() - self._since) / self._finished
        left = jobs - self._finished
        print(
            f"sweep: job {self._finished}/{jobs} finished"
            + (
                f"; about {_minutes(per_job * left)} left at the rate measured so far ({_minutes(per_job)} per job)"
                if left > 0
                else ""
            ),
            flush=True,
        )

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():  # nothing ran (a search stopped by bad input before its first trial)
            return
        try:
            written = write_report([sweep_dir], print_verdict=True)
        except FileNotFoundError as err:
            print(f"report: {err}")
            return
        for path in written:
            if path.suffix != ".svg":
                print(f"report: {path}")
        log_report(config, sweep_dir, written)
        ours = os.environ.get(SWEEP)
        failed = [
            j
            for j in load_jobs([sweep_dir])
            if j["state"] not in ("done", "unreadable", "unreachable") and (j.get("process") or {}).get("sweep") == ours
        ]  # another sweep's running job is not ours
        if failed and not is_search(config):  # a search's failed jobs are failed trials; the search says how it ended
            print(
                f"error: {len(failed)} job(s) of the sweep did not finish; see {sweep_dir / 'report.md'}",
                file=sys.stderr,
            )
            raise SystemExit(1)


def _minutes(seconds: float) -> str:
    return (
        f"{seconds:.0f} s"
        if seconds < 90
        else f"{seconds / 60:.0f} min"
        if seconds < 5400
        else f"{seconds / 3600:.1f} h"
    )


def _uses_target(node) -> bool:
    from omegaconf import DictConfig, ListConfig

    if isinstance(node, DictConfig):
        return any(_uses_target(node.get(k)) for k in node)
    if isinstance(node, ListConfig):
        return any(_uses_target(v) for v in node)
    return isinstance(node, str) and node.strip() == "target"


def _sweep_size(config) -> int:
    """How many jobs a basic sweep launches: the product of its swept values (the command line's and the sweeper's),
    as Hydra expands them (``a,b``, ``choice(...)``, ``range(...)``); 0 when it cannot tell (``glob``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    lines = list(config.hydra.overrides.task)
    given = {line.split("=", 1)[0] for line in lines}
    lines += [f"{key}={value}" for key, value in (config.hydra.sweeper.get("params") or {}).items() if key not in given]
    size = 1
    try:
        for override in OverridesParser.create().parse_overrides(lines):
            if override.is_sweep_override():
                size *= len(list(override.sweep_string_iterator()))
    except Exception:  # noqa: BLE001 -- an estimate only
        return 0
    return size


def target_preflight(config) -> list[str]:
    """Before a sweep's first job (``config``: its first job's, with Hydra's; ``evals.cli`` calls this): a sweep whose
    lengths say ``target`` without ``target=`` is one line and exit 2 (not one failure per job); with a target,
    what the sweep will cost (:mod:`evals.core.budget`)."""
    from ..core.budget import describe, forwards, measured_seconds
    from ..core.errors import ConfigError
    from ..core.job import parse_target
    from ..core.models import resolve_model

    if config.get("target") in (None, ""):
        if _uses_target(config.eval):
            raise ConfigError(
                "this sweep's eval lengths include 'target' but no target= is given: add one, e.g. "
                "python run.py -m experiment=compare target=2x"
            )
        return []
    parse_target(config)
    model = resolve_model(config.model, geometry=False, weights=False)
    target = parse_target(config, model.trained_context)
    books = len(config.data.get("books") or []) or 1
    work = forwards(config.eval, model.trained_context, target, books)
    roots = [*config.get("resume_from", []), config.hydra.sweep.dir]
    jobs = _sweep_size(config)
    return describe(jobs, work, measured_seconds(roots, model.name)) if work and jobs else []


def log_report(config, sweep_dir: Path, written: list[Path]) -> None:
    """The sweep's report as one W&B run of the sweep's group (job type ``report``): the verdict and job tables,
    the figures, and report.html as an artifact."""
    from ..core.tracking import Tracker, sweep_group

    logger = config.get("logger")
    if logger is None or logger.get("name") == "none":
        return
    tracker = Tracker(
        logger,
        {"sweep_dir": str(sweep_dir)},
        sweep_dir,
        f"report-{sweep_dir.name}",
        sweep_group(sweep_dir),
        tags=["report"],
        job_type="report",
    )
    if tracker.run is None:
        return
    by_name = {p.name: p for p in written}
    for name in ("report_ranking.csv", "report_verdict.csv", "report.csv"):
        if name in by_name:
            with open(by_name[name]) as handle:
                rows = list(csv.DictReader(handle))
            tracker.table(name.removesuffix(".csv"), rows)
            if name == "report_verdict.csv":  # the answer per strategy, as summary columns of the group's runs table
                tracker.summary(
                    {f"verdict/{r['eval']}/{r['strategy']}": r["verdict"] for r in rows if r.get("verdict")}
                )
            if name == "report_ranking.csv":  # the ranked answer: each strategy's place and state at the target
                tracker.summary(
                    {f"rank/{r['model']}@{r['target']}/{r['strategy']}": f"{r['rank']}: {r['answer']}" for r in rows}
                )
    if "report_answer.txt" in by_name:  # the one-line answers, first thing in the report run's summary
        tracker.summary({"answer": by_name["report_answer.txt"].read_text().strip()})
    for path in written:
        if path.suffix == ".png":
            tracker.image(path.stem, path)
    if "report.html" in by_name:
        tracker.artifact(by_name["report.html"], f"report-{sweep_dir.name}")
    tracker.finish(0)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evals.report",
        description=__doc__.replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dirs", nargs="+", type=Path, help="run or sweep directories (searched recursively)")
    parser.add_argument("--out", type=Path, help="where to write the report (default: the first directory)")
    parser.add_argument(
        "--tolerance", type=float, help="lower-is-better metrics pass at most (1 + this) x the unscaled value"
    )
    parser.add_argument(
        "--retained", type=float, help="higher-is-better metrics pass at least this x the unscaled value"
    )
    args = parser.parse_args(argv)
    missing = [str(d) for d in args.dirs if not d.is_dir()]
    if missing:
        print(f"error: not a directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    target = args.out if args.out is not None else args.dirs[0]
    problem = unwritable(target)
    if problem:
        print(
            f"error: the report cannot be written to {target}: {problem}; give a writable directory with --out",
            file=sys.stderr,
        )
        return 2
    for name, value, ok in (
        ("--tolerance", args.tolerance, lambda v: v >= 0),
        ("--retained", args.retained, lambda v: 0 < v <= 1),
    ):
        if value is not None and not (math.isfinite(value) and ok(value)):
            print(f"error: {name}={value} is out of range (--tolerance >= 0, 0 < --retained <= 1)", file=sys.stderr)
            return 2
    try:
        for path in write_report(args.dirs, args.out, args.tolerance, args.retained, print_verdict=True):
            print(path)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
