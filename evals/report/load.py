"""Reading the runs a report covers: every results.json under the given directories (unreadable ones kept with
the reason), one job per identity, and the job's identity fields every other part of the report reads."""

from __future__ import annotations

import json
from pathlib import Path

from ..core.run.rundir import load_results, state


def job_info(job: dict) -> dict:
    """The job's identity as results.json records it (model label, scaling, eval, key, ...); {} if none."""
    return job.get("job") or {}


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
    """One job per key: a finished original over a resumed copy over an unfinished attempt. A job rejected before
    it started has no key: its identity is its config (a sweep re-run that rejected it again, before rejected jobs
    were replaced in place, left it twice, in ``<dir>`` and ``<dir>-2``); unreadable files are each kept."""
    rank = {"done": 0, "running": 2, "interrupted": 3, "dead": 3, "failed": 4}
    best: dict[str, dict] = {}
    keyless, rejected = [], {}
    for job in jobs:
        key = (job.get("job") or {}).get("key")
        if key is None and "config" in job:
            rejected.setdefault(json.dumps(job["config"], sort_keys=True, default=str), job)
            continue
        if key is None:
            keyless.append(job)
            continue
        score = (rank.get(job["state"], 5), "resumed_from" in job)
        if key not in best or score < best[key]["_score"]:
            best[key] = {**job, "_score": score}
    return [*best.values(), *rejected.values(), *keyless]


def in_report_order(jobs: list[dict]) -> list[dict]:
    """``jobs`` in the report's order: by model, weights, data and eval, the unscaled run first, then by strategy."""
    return sorted(
        jobs,
        key=lambda j: (
            str(job_info(j).get("model_label")),
            str(job_info(j).get("weights")),
            str(job_info(j).get("data")),
            str(job_info(j).get("eval")),
            job_info(j).get("scaling") != "none",
            str(job_info(j).get("scaling")),
        ),
    )
