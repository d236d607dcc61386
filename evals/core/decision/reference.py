"""The unscaled model's measurements a verdict compares with (:mod:`evals.core.decision.verdict`, its rule):
merged from the finished unscaled runs whose comparison key for an eval is the job's (same model, data
content, protocol, documents, tokens scored, stride ...), the first kept where two disagree and the
disagreement noted, a run of other code or package versions used with a note; an unscaled job is its own
reference. The runs themselves are found, or the reference job run first, by
:mod:`evals.core.run.reference_search`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..measure import measured_value


@dataclass
class Reference:
    """The unscaled model's measurements, merged from the runs that match, and where they came from."""

    records: dict = field(default_factory=dict)  # (metric, length) -> measurement record
    sources: list = field(default_factory=list)  # run directories
    notes: list = field(default_factory=list)  # what the reader should know (another environment, disagreements)

    def get(self, metric: str, length: int) -> dict | None:
        return self.records.get((metric, int(length)))

    def value(self, metric: str, length: int) -> float | None:
        return measured_value(self.get(metric, length))


def own_reference(measurements: list[dict]) -> Reference:
    """An unscaled job is its own reference."""
    return Reference(records={(r["metric"], int(r["length"])): r for r in measurements}, sources=["itself"])


def reference_from(
    runs: list[dict], compare: dict, environment: str | None = None, strict: bool = False
) -> Reference | None:
    """The reference for a job whose comparison keys are ``compare`` ({eval: key}), from finished unscaled
    ``runs`` (results.json dicts with their ``dir``): the measurements of each eval's declared metrics from the
    runs whose key for that eval matches. ``strict``: only runs of the same ``environment`` (code and versions),
    as a job reusing a result demands; otherwise they are used and noted. None when nothing matches."""
    found = Reference()
    ordered = sorted(
        runs, key=lambda r: (r.get("job", {}).get("environment") != environment, -(r.get("finished") or 0))
    )
    for run in ordered:
        info = run.get("job") or {}
        if run.get("status") != "done" or info.get("scaling") != "none":
            continue
        same_env = info.get("environment") == environment
        if strict and not same_env:
            continue
        declared = run.get("declared") or {}
        used = False
        for eval_name, key in (info.get("compare") or {}).items():
            if compare.get(eval_name) != key:
                continue
            for record in run.get("measurements") or []:
                if (declared.get(record["metric"]) or {}).get("eval") != eval_name:
                    continue
                at = (record["metric"], int(record["length"]))
                known = found.records.get(at)
                if known is None:
                    found.records[at] = record
                    used = True
                elif not _same(measured_value(known), measured_value(record)):
                    found.notes.append(
                        f"two unscaled runs disagree on {at[0]}@{at[1]} ({measured_value(known)} in "
                        f"{found.sources[0] if found.sources else '?'}, {measured_value(record)} in "
                        f"{run.get('dir')}); the first is used"
                    )
        if used:
            found.sources.append(str(run.get("dir")))
            if not same_env and environment is not None:
                found.notes.append(
                    f"the reference in {run.get('dir')} was computed with other code or package "
                    "versions; its numbers may differ slightly"
                )
    return found if found.records else None


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
