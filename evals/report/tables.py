"""The report's tables as text: the job table (one row per job, its columns in order), the verdict table
flattened to one column per length, markdown and CSV, and the verdict tables printed at a sweep's end."""

from __future__ import annotations

import csv
import io
import math
import re

from ..core.measure import by_metric, measured_value
from ..core.decision.verdict_text import format_table, word
from .judge import flatten
from .load import job_info


FIXED_COLUMNS = ["model", "weights", "data", "eval", "strategy", "state", "target", "verdict", "effective_length"]


def length_order(column: str):
    """Sort key of a ``metric@length`` column: by name, then by length as a number."""
    match = re.search(r"@(\d+)$", column)
    return (column[: match.start()], int(match.group(1))) if match else (column, -1)


def job_row(job: dict, verdict: dict | None) -> dict:
    """One job as a table row: who it is, its answer, what it measured (declared metrics by length)."""
    info, config = job_info(job), job.get("config") or {}
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


def varying_fields(jobs: list[dict]) -> dict[int, dict]:
    """Per job, the compared fields whose values differ between runs of the same model and eval: the
    columns that say why two rows are not compared."""
    groups: dict[tuple, list[int]] = {}
    for index, job in enumerate(jobs):
        for eval_name in job.get("compare") or {}:
            groups.setdefault((job_info(job).get("model_label"), eval_name), []).append(index)
    found: dict[int, dict] = {}
    for (_, eval_name), members in groups.items():
        flats = {i: flatten((jobs[i].get("compare") or {}).get(eval_name) or {}) for i in members}
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


def job_columns(rows: list[dict]) -> list[str]:
    """The job table's columns: who, verdicts by length, measurements by length, the rest, where."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    verdicts = sorted((k for k in keys if k.startswith("verdict@")), key=length_order)
    measured = sorted((k for k in keys if "@" in k and not k.startswith("verdict@")), key=length_order)
    tail = ["compared", "elapsed_s", "dir", "key", "error"]
    rest = [
        k
        for k in keys
        if k not in FIXED_COLUMNS
        and k not in measured
        and k not in verdicts
        and k not in tail
        and k not in ("trained", "role")
    ]
    return FIXED_COLUMNS + verdicts + measured + rest + tail


def format_cell(value) -> str:
    """A table cell: floats to 4 significant digits, NaN and None empty."""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}"
    return "" if value is None else str(value)


def markdown_table(rows: list[dict], columns: list[str]) -> list[str]:
    """``rows`` as the lines of a markdown table."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(format_cell(r.get(c)).replace("|", "/") for c in columns) + " |" for r in rows]


def csv_text(rows: list[dict], columns: list[str]) -> str:
    """``rows`` as CSV text with a header (keys outside ``columns`` left out)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


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


def flat_verdict_rows(answer: list[dict]) -> list[dict]:
    """The answer rows (judge.verdict_rows) as table rows: one ``verdict@<length>`` column per length any has."""
    lengths = sorted({L for r in answer for L in r["verdicts"]})
    return [
        {
            **{k: r[k] for k in ("model", "data", "eval", "strategy", "trained", "target")},
            **{f"verdict@{L}": word(r["verdicts"][L]) if L in r["verdicts"] else "" for L in lengths},
            "verdict": word(r["verdict"]) if r["target"] else "",
            "effective_length": r["effective_length"],
            "reference": r["reference"],
        }
        for r in answer
    ]
