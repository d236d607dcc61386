"""Judging the loaded jobs (evals/core/decision/verdict.py's rule, the one a job applies at its end): the thresholds, each
job's verdict against its comparable unscaled run, why a scaled job has none (what differs), and what the
verdicts say -- the answer rows and short-context retention."""

from __future__ import annotations

from collections import Counter

from ..core.decision.reference import Reference, own_reference, reference_from
from ..core.decision.verdict import DEFAULTS, judge
from .load import job_info


def flatten(tree, prefix: str = "") -> dict:
    """A nested dict as one level of dotted keys (``eval.documents``)."""
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    found = {}
    for key, value in tree.items():
        found.update(flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return found


def differences(a: dict, b: dict, eval_name: str) -> list[str]:
    """What differs between two jobs' compared fields for ``eval_name`` (``eval.documents: 2 vs 1``)."""
    fa, fb = (
        flatten((a.get("compare") or {}).get(eval_name) or {}),
        flatten((b.get("compare") or {}).get(eval_name) or {}),
    )
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


def dropped_lines(job: dict) -> list[str]:
    """What a job's numbers leave out (evals/core/run/output.py ``Output.dropped``), a line each, naming the job."""
    info = job_info(job)
    return [
        f"{info.get('model_label')} {info.get('scaling')} ({job['dir']}): dropped {d.get('what')}: {d.get('why')}"
        for d in job.get("dropped") or []
    ]


def judge_all(jobs: list[dict], criteria: dict) -> tuple[dict[int, dict], dict[int, Reference | None], list[str]]:
    """({index: verdict}, {index: the reference used}, warnings) for every finished job that declares metrics:
    each against the comparable unscaled runs among ``jobs``."""
    unscaled = [j for j in jobs if j["state"] == "done" and job_info(j).get("scaling") == "none"]
    verdicts, references, warnings = {}, {}, []
    for index, job in enumerate(jobs):
        info, declared = job_info(job), job.get("declared") or {}
        warnings += dropped_lines(job)
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
        verdicts[index] = judge(
            measured,
            declared,
            reference,
            info.get("trained_context") or 0,
            info.get("target_length"),
            criteria,
            missing,
        )
        for note in (verdicts[index].get("reference") or {}).get("notes", []):  # the reference's and the verdict's
            warnings.append(f"{info.get('model_label')} {info.get('scaling')} ({job['dir']}): {note}")
        references[index] = reference
    return verdicts, references, warnings


def _why_not_compared(job: dict, unscaled: list[dict]) -> str:
    """Why a scaled job has no reference here: no unscaled run of its model and eval, or what differs."""
    info = job_info(job)
    same_model = [
        u
        for u in unscaled
        if job_info(u).get("model_label") == info.get("model_label")
        and set(job_info(u).get("compare") or {}) & set(info.get("compare") or {})
    ]
    if not same_model:
        return "no unscaled run of this model with this eval among the reports' directories: no verdict"
    other = same_model[0]
    eval_name = next(iter(set(job_info(other).get("compare") or {}) & set(info.get("compare") or {})))
    diff = differences(job, other, eval_name) or ["their comparison keys differ"]
    return f"not compared with the unscaled run in {other['dir']}, which measured other things ({'; '.join(diff[:4])})"


def shown_state(row: dict) -> str:
    """A length's state as the tables show it: ``reference`` where the unscaled job is its own reference there."""
    judged = [c for c in row.get("checks") or [] if not c["second_look"] and c["state"] != "skip"]
    return "reference" if judged and all(c.get("reference_itself") for c in judged) else row["state"]


def verdict_rows(jobs: list[dict], verdicts: dict[int, dict]) -> list[dict]:
    """The answer table: one row per judged job (reference runs left out), lengths as columns."""
    rows = []
    for index, verdict in verdicts.items():
        info = job_info(jobs[index])
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
                "verdicts": {r["length"]: shown_state(r) for r in verdict["lengths"]},
                "reasons": {r["length"]: r["reason"] for r in verdict["lengths"]},
                "verdict": next(
                    (shown_state(r) for r in verdict["lengths"] if r["length"] == verdict["target"]),
                    summary.get("verdict_state"),
                ),
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


def retention(jobs: list[dict], verdicts: dict[int, dict]) -> list[dict]:
    """Each strategy's metrics at lengths up to the trained context relative to its comparable unscaled run
    (evals/core/decision/verdict.py's rule: 1 = nothing lost)."""
    found = []
    for index, verdict in verdicts.items():
        info = job_info(jobs[index])
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
