"""The answer to "does this strategy keep my model working at length L?", judged against the unscaled model.

One rule, used at the end of every job, by the sweep report and by ``python -m evals.report``:

- The reference is the *unscaled* model measured on the same tokens: a finished run with scaling ``none``
  whose comparison key for the eval is the job's (same model, data content, protocol, documents, tokens
  scored, stride ...; evals/core/job.py); a job's own run when it is unscaled. A strategy is never judged
  against itself: PI x2 is flat at twice the unscaled perplexity, and fails here.
- Each metric an eval declares with ``verdict=True`` (evals/core/registry.py ``Metric``) is checked at L:
  beyond the trained context T against the reference at T, up to T against the reference at the same length
  (short-context retention, as LongRoPE2, arXiv 2502.20082, reports it). A lower-is-better metric (ppl,
  LongPPL) passes at most ``(1 + tolerance)`` x the reference; a higher-is-better one (retrieval accuracy,
  RULER) at least ``retained`` x the reference (NoLiMa's relative rule, arXiv 2502.05167: 0.85).
- ``verdict@L`` is true when every check at L and every short-context check passes, false when one fails,
  null (with its reason) when something needed is missing. ``verdict`` is the answer at the target length;
  ``effective_length`` the largest length up to which the answer is true at every evaluated length (null
  when it fails from the start, or when nothing beyond T was evaluated). ``<metric>_stable_length`` keeps
  the old, self-referenced quantity for lower-is-better metrics: how far the metric stays within tolerance
  of the strategy's *own* value at T (flatness, not quality). ``<metric>_retention@L`` (L <= T) is
  reference / value for lower-is-better metrics and value / reference otherwise (1 = nothing lost).
- Two measurements are comparable at a length only when what they rest on (tokens, trials, samples: the
  metric's ``count``) is the same; a reference computed with other code or package versions is used with a
  visible note.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

AT = re.compile(r"^(.+)@(\d+)$")
DEFAULTS = {"tolerance": 0.1, "retained": 0.85}


def criteria_of(cfg) -> dict:
    """The verdict's thresholds from a ``verdict`` config node (or defaults)."""
    if cfg is None:
        return dict(DEFAULTS)
    return {"tolerance": float(cfg.tolerance), "retained": float(cfg.retained)}


def measured(values: dict, declared: dict) -> dict[str, dict[int, float]]:
    """{metric: {length: value}} of the declared metrics among ``values`` (a summary)."""
    found: dict[str, dict[int, float]] = {}
    for key, value in values.items():
        match = AT.match(key)
        if match and match.group(1) in declared and _number(value):
            found.setdefault(match.group(1), {})[int(match.group(2))] = float(value)
    return found


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class Reference:
    """The unscaled model's values at each length, merged from the runs that match, and where they came from."""

    values: dict = field(default_factory=dict)  # "<metric>@L" -> value, and "<count>@L" -> count
    sources: list = field(default_factory=list)  # run directories
    notes: list = field(default_factory=list)  # what the reader should know (another environment, disagreements)

    def get(self, metric: str, length: int):
        return self.values.get(f"{metric}@{length}")


def reference_from(runs: list[dict], compare: dict, environment: str | None = None, strict: bool = False) -> Reference | None:
    """The reference for a job whose comparison keys are ``compare`` ({eval: key}), from finished unscaled
    ``runs`` (results.json dicts with their ``dir``): the values of each eval's declared metrics from the runs
    whose key for that eval matches. ``strict``: only runs of the same ``environment`` (code and versions),
    as a job reusing a result demands; otherwise they are used and noted. None when nothing matches."""
    found = Reference()
    ordered = sorted(runs, key=lambda r: (r.get("job", {}).get("environment") != environment, -(r.get("finished") or 0)))
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
            metrics = {m: d for m, d in declared.items() if d.get("eval") == eval_name}
            counts = {d["count"] for d in metrics.values() if d.get("count")}
            for name, value in (run.get("summary") or {}).items():
                match = AT.match(name)
                if not match or match.group(1) not in metrics and match.group(1) not in counts or not _number(value):
                    continue
                known = found.values.get(name)
                if known is None:
                    found.values[name] = float(value)
                    used = True
                elif not math.isclose(known, float(value), rel_tol=1e-6, abs_tol=1e-9):
                    found.notes.append(f"two unscaled runs disagree on {name} ({known:.6g} in {found.sources[0]}, "
                                       f"{float(value):.6g} in {run.get('dir')}); the first is used")
        if used:
            found.sources.append(str(run.get("dir")))
            if not same_env and environment is not None:
                found.notes.append(f"the reference in {run.get('dir')} was computed with other code or package "
                                   "versions; its numbers may differ slightly")
    return found if found.values else None


def _check(metric: dict, value: float, reference, count, reference_count, criteria: dict, ref_length: int) -> dict:
    """One metric at one length against the reference value (at ``ref_length``)."""
    name = metric["name"]
    check = {"metric": name, "value": value, "reference": reference, "reference_length": ref_length, "pass": None}
    if reference is None:
        check["why"] = f"no unscaled {name} at {ref_length}"
        return check
    if count is not None and reference_count is not None and count != reference_count:
        check["why"] = f"{name} rests on {count:g} here and {reference_count:g} in the reference: not the same test"
        return check
    if metric["lower_is_better"]:
        limit = (1 + criteria["tolerance"]) * reference
        check.update(limit=limit, **{"pass": value <= limit})
        check["why"] = f"{name} {value:.4g} {'<=' if check['pass'] else '>'} {limit:.4g} (unscaled {reference:.4g} @{ref_length})"
    else:
        if reference <= 0:
            check["why"] = f"the unscaled model scores 0 on {name} at {ref_length}: nothing to keep"
            check["skip"] = True
            return check
        limit = criteria["retained"] * reference
        check.update(limit=limit, **{"pass": value >= limit})
        check["why"] = f"{name} {value:.4g} {'>=' if check['pass'] else '<'} {limit:.4g} (unscaled {reference:.4g} @{ref_length})"
    return check


def _decide(checks: list[dict]) -> tuple[bool | None, str]:
    real = [c for c in checks if not c.get("skip")]
    failed = [c for c in real if c["pass"] is False]
    if failed:
        return False, "; ".join(c["why"] for c in failed)
    missing = [c for c in real if c["pass"] is None]
    if missing:
        return None, "; ".join(c["why"] for c in missing)
    if not real:
        return None, "; ".join(c["why"] for c in checks) or "nothing judged at this length"
    return True, "; ".join(c["why"] for c in real)


def judge(values: dict, declared: dict, reference: Reference | None, trained: int, target: int | None,
          criteria: dict, missing: str | None = None) -> dict:
    """The verdict of one job: ``values`` its summary, ``declared`` its metric declarations (results.json's
    ``declared``), ``reference`` the unscaled values (None: ``missing`` says why). Returns
    ``{"summary": {...}, "lengths": [per-length rows], "criteria", "target", "trained", "reference"}``."""
    metrics = {name: d for name, d in declared.items()}
    judged = {name: d for name, d in metrics.items() if d.get("verdict")}
    have = measured(values, metrics)
    lengths = sorted({L for name in judged for L in have.get(name, {})})
    if not lengths:  # nothing this job measured is judged (an analytic study): no verdict at all
        return {"summary": {}, "lengths": [], "criteria": criteria, "target": target, "trained": trained,
                "reference": None, "missing": None}
    summary: dict = {}
    rows = []
    for L in lengths:
        checks = []
        for name, metric in judged.items():
            value = have.get(name, {}).get(L)
            if value is None:
                continue
            ref_length = L if L <= trained else trained
            count = metric.get("count")
            own_count = values.get(f"{count}@{L}") if count and L <= trained else None
            ref_count = reference.get(count, L) if count and reference is not None and L <= trained else None
            ref_value = reference.get(name, ref_length) if reference is not None else None
            checks.append(_check(metric, value, ref_value, own_count, ref_count, criteria, ref_length))
        rows.append({"length": L, "checks": checks})
    if reference is None:
        why = missing or "no unscaled reference on the same tokens"
        for row in rows:
            row["verdict"], row["reason"] = None, why
    else:
        short = [c for row in rows if row["length"] <= trained for c in row["checks"]]
        kept, kept_why = _decide(short) if short else (None, f"short context not measured: add lengths up to {trained} (1x)")
        for row in rows:
            verdict, reason = _decide(row["checks"])
            if row["length"] > trained:
                verdict, reason = _both(verdict, reason, kept, kept_why)
            row["verdict"], row["reason"] = verdict, reason
    for row in rows:
        summary[f"verdict@{row['length']}"] = row["verdict"]
        summary[f"verdict_reason@{row['length']}"] = row["reason"]
    summary["target_length"] = target
    at_target = next((row for row in rows if row["length"] == target), None)
    summary["verdict"] = at_target["verdict"] if at_target else None
    summary["verdict_reason"] = at_target["reason"] if at_target else (
        f"the target length {target} was not evaluated: add it to the lengths" if target else "no target length")
    for name in metrics:
        if target in have.get(name, {}):
            summary[f"{name}@target"] = have[name][target]
    summary["effective_length"], summary["effective_length_reason"] = _effective(rows, trained)
    if reference is not None and reference.sources != ["itself"]:  # an unscaled run retains itself, trivially
        for name, metric in metrics.items():
            for L, value in have.get(name, {}).items():
                base = reference.get(name, L)
                if L > trained or base is None or (not metric["lower_is_better"] and base <= 0) or value <= 0:
                    continue
                summary[f"{name}_retention@{L}"] = base / value if metric["lower_is_better"] else value / base
    for name, metric in judged.items():
        if metric["lower_is_better"] and have.get(name):
            summary[f"{name}_stable_length"] = _stable(have[name], trained, criteria["tolerance"])
    return {"summary": summary, "lengths": rows, "criteria": criteria, "target": target, "trained": trained,
            "reference": None if reference is None else {"sources": reference.sources, "notes": reference.notes},
            "missing": missing if reference is None else None}


def _both(at_length: bool | None, why: str, kept: bool | None, kept_why: str) -> tuple[bool | None, str]:
    """A length beyond T: its own checks and the short-context ones together."""
    if at_length is False or kept is False:
        parts = [why] if at_length is False else []
        return False, "; ".join(parts + ([f"short context: {kept_why}"] if kept is False else []))
    if at_length is None or kept is None:
        parts = [why] if at_length is None else []
        return None, "; ".join(parts + ([kept_why] if kept is None else []))
    return True, f"{why}; short context kept"


def _effective(rows: list[dict], trained: int) -> tuple[int | None, str | None]:
    """The largest length with a true verdict at it and at every shorter evaluated length."""
    if not any(row["length"] > trained for row in rows):
        return None, f"no evaluated length exceeds the trained context ({trained})"
    best = None
    for row in rows:
        if row["verdict"] is not True:
            if best is None:
                return None, f"not working at {row['length']}: {row['reason']}"
            break
        best = row["length"]
    return best, None


def _stable(values: dict[int, float], trained: int, tolerance: float) -> int | None:
    """The largest length beyond T up to which ``values`` stay within (1 + tolerance) x their own value at
    the longest length <= T (the old, self-referenced effective length)."""
    own = [L for L in values if L <= trained]
    if not own or not any(L > trained for L in values):
        return None
    limit, best = values[max(own)] * (1 + tolerance), max(own)
    for L in sorted(L for L in values if L > trained):
        if values[L] > limit:
            break
        best = L
    return best


def multiple(length: int, trained: int) -> str:
    """``16384`` on a model trained at 8192 -> ``2x``; ``12288`` -> ``1.5x``."""
    ratio = length / trained
    return f"{ratio:.3g}x"


def word(verdict: bool | None) -> str:
    return {True: "yes", False: "NO", None: "?"}[verdict]


def format_job(title: str, judgement: dict) -> list[str]:
    """The verdict of one job, one line per length: what a user reads at the end of a run."""
    trained, target, criteria = judgement["trained"], judgement["target"], judgement["criteria"]
    lines = [f"verdict: does {title} keep working? (against the unscaled model on the same tokens; lower-is-better "
             f"metrics within {criteria['tolerance']:.0%}, higher-is-better ones >= {criteria['retained']:g} x)"]
    if judgement.get("missing"):
        lines.append(f"  no answer: {judgement['missing']}")
    for note in (judgement.get("reference") or {}).get("notes", []):
        lines.append(f"  note: {note}")
    for row in judgement["lengths"]:
        mark = " <- target" if row["length"] == target else ""
        lines.append(f"  {row['length']:>7} ({multiple(row['length'], trained):>5})  {word(row['verdict']):<3}  "
                     f"{row['reason']}{mark}")
    summary = judgement["summary"]
    if target:
        lines.append(f"  -> at the target {target} ({multiple(target, trained)} the trained {trained}): "
                     f"{word(summary['verdict'])}" + ("" if summary["verdict"] is not None else f" ({summary['verdict_reason']})"))
    effective = summary.get("effective_length")
    lines.append(f"  -> effective length: {effective if effective is not None else 'none'}"
                 + (f" ({summary['effective_length_reason']})" if effective is None and summary.get("effective_length_reason") else ""))
    return lines


def format_table(rows: list[dict], trained: int | None) -> list[str]:
    """A strategies x lengths table of verdicts (rows: {"strategy", "target", "verdicts": {L: bool|None},
    "effective_length"}), as lm-eval and the yarn scripts print theirs."""
    lengths = sorted({L for row in rows for L in row["verdicts"]})
    head = ["strategy", "target"] + [f"{L}" + (f" ({multiple(L, trained)})" if trained else "") for L in lengths] + ["effective length"]
    body = [[row["strategy"], str(row["target"] or "")] + [word(row["verdicts"][L]) if L in row["verdicts"] else "-"
                                                         for L in lengths] + [str(row["effective_length"] or "none")]
            for row in rows]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, body)]
