"""The reference search: the unscaled runs a scaled job's verdict compares with (:mod:`evals.core.decision.verdict`).

``find_reference(job, run_reference)`` looks for finished runs with scaling ``none`` on the same tokens (same
code and versions) in the job's sweep (its ``baseline/`` included) or own directory, then ``resume_from``; when
they lack a length the verdict compares with and ``verdict.baseline`` is on, the job's reference job
(``job.reference``: the unscaled model at the lengths :func:`evals.core.job.lengths.reference_lengths_for` picks) is run
first through ``run_reference`` -- the runner's ``execute`` -- and the search is done again. An unscaled job is
its own reference and needs no search.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from ..config.lengths import length_fields
from ..job.job import Job, parts
from ..job.lengths import reference_lengths_for
from .rundir import read_results
from ..decision.reference import Reference, reference_from


def reference_runs(job: Job) -> list[dict]:
    """Finished runs a reference may come from: the job's sweep (its ``baseline/`` included) or own directory,
    then ``resume_from``; each results.json read once."""
    roots = [job.out_dir.parent if job.multirun else job.out_dir, *map(Path, job.resume_from)]
    seen, runs = set(), []
    for root in roots:
        for path in sorted(Path(root).glob("**/results.json")) if Path(root).is_dir() else []:
            if path.resolve() in seen:
                continue
            seen.add(path.resolve())
            data = read_results(path)
            if (
                isinstance(data, dict)
                and data.get("status") == "done"
                and (data.get("job") or {}).get("scaling") == "none"
            ):
                data["dir"] = str(path.parent)
                runs.append(data)
    return runs


def _covered(job: Job, reference: Reference | None) -> bool:
    """Whether ``reference`` has a judged metric at every length the verdict compares with (job.reference_lengths_for)."""
    if reference is None:
        return False
    declared = job.declared()
    for part_spec, part, _ in parts(job.eval, job.eval_cfg):
        judged = [m.name for m in part_spec.metrics_for(part) if m.verdict]
        lengths = {int(L) for name in length_fields(part_spec.config) if part.get(name) is not None for L in part[name]}
        for L in reference_lengths_for(sorted(lengths), job.trained_context):
            if judged and not any(reference.value(name, L) is not None for name in judged if name in declared):
                return False
    return True


def find_reference(job: Job, run_reference: Callable[[Job], object]) -> tuple[Reference | None, str | None]:
    """(the unscaled reference of a scaled job, why there is none): finished runs on the same tokens (same code
    and versions), or -- when they lack a length and ``verdict.baseline`` is on -- the reference job run now by
    ``run_reference(job.reference)`` (the runner's ``execute``). An unscaled job is its own reference: (None, None)."""
    if job.scaling.name == "none" or not job.needs_reference():
        return None, None
    found = reference_from(reference_runs(job), job.compare, job.environment, strict=True)
    if _covered(job, found):
        return found, None
    if job.reference is None:
        return found, None if found else (
            "no unscaled run on the same tokens in this sweep or resume_from, and "
            "verdict.baseline=false: run scaling=none with the same eval first"
        )
    print(
        f"baseline: the unscaled {job.reference.name} at {reference_lengths(job.reference)} first (the verdict's "
        f"reference; verdict.baseline=false skips it)"
    )
    try:
        run_reference(job.reference)
    except Exception as err:  # noqa: BLE001 -- the job itself still runs; the failure is in the reference's record
        why = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        print(f"error: the reference {job.reference.name} failed ({why}); {job.name} runs without it", file=sys.stderr)
        return found, None if found else f"the unscaled reference run failed ({why})"
    found = reference_from(reference_runs(job), job.compare, job.environment, strict=True)
    return found, None if found else "the unscaled reference run left no comparable result"


def reference_lengths(job: Job) -> list[int]:
    """Every length the job's eval (a suite: each of its parts) measures, sorted."""
    return sorted(
        {
            int(L)
            for part_spec, part, _ in parts(job.eval, job.eval_cfg)
            for name in length_fields(part_spec.config)
            if part.get(name) is not None
            for L in part[name]
        }
    )
