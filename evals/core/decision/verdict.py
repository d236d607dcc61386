"""The answer to "does this strategy keep my model working at length L?", judged against the unscaled model.

One rule, used at the end of every job, by the sweep report and by ``python -m evals.report``:

- The reference is the *unscaled* model measured on the same tokens: a finished run with scaling ``none``
  whose comparison key for the eval is the job's (same model, data content, protocol, documents, tokens
  scored, stride ...; evals/core/job/parse.py); a job's own run when it is unscaled. A strategy is never judged
  against itself: PI x2 is flat at twice the unscaled perplexity, and fails here.
- Each metric an eval declares with ``verdict=True`` (evals/core/registry.py ``Metric``) is checked at L:
  beyond the trained context T against the reference at T, up to T against the reference at the same length
  (short-context retention, as LongRoPE2, arXiv 2502.20082, reports it). The check is a *paired* comparison
  on the units both runs share (evals/core/measure.py: token blocks of each document, prompts, samples): the
  ratio strategy / unscaled with its interval (evals/stats.py, calibrated by simulation in
  tests/test_calibration.py) -- for NLL metrics exp of the paired mean NLL difference: over several documents a
  Hall-corrected t on the token-weighted per-document influences (CR2 variance, Bell-McCaffrey degrees of
  freedom), within one document a fixed-b HAC interval over its blocks in order; for scores in a bounded range
  Tang's score interval for a ratio of paired proportions. A lower-is-better metric (ppl, LongPPL) passes when
  the whole interval is at most ``1 + tolerance``, a higher-is-better one (retrieval, RULER) when it is at least
  ``retained`` (NoLiMa's relative rule, arXiv 2502.05167: 0.85). **yes** when the interval lies within the
  limit, **NO** when it lies beyond, **inconclusive** when it straddles it -- naming the lever that would decide
  it: about how many more documents or prompts (aimed at 90% power; followed, it decides >= 80% of the time in
  the simulations), or that one document cannot decide it at this length. Below the fewest units a method is
  calibrated for (``MIN_BLOCKS`` of one document, ``MIN_DOCUMENTS``, ``MIN_PROMPTS``; evals/stats.py) nothing
  is decided, and the line says so. Metrics declared without ``verdict`` (the answer NLL of needle and passkey)
  are compared the same way and shown beside the decision as a second, continuous look.
- An unscaled job at its own lengths is the reference: its rows print ``reference`` (``verdict_state@L`` stays
  ``yes`` for code that reads it; the check carries ``reference_itself``), not a ratio of 1 with an interval.
- ``verdict@L`` is true when every check at L and every short-context check is yes, false when one is NO,
  null otherwise; ``verdict_state@L`` says which: ``yes``, ``NO``, ``inconclusive`` or ``?`` (something
  needed is missing, with its reason). ``verdict`` is the answer at the target length; ``effective_length``
  the largest length up to which the answer is yes at every evaluated length (null when it is not yes from
  the start, or when nothing beyond T was evaluated). ``<metric>_ratio@L`` is the paired ratio with
  ``_ci95_low``/``_ci95_high``; ``<metric>_retention@L`` (L <= T) is reference / value for lower-is-better
  metrics and value / reference otherwise (1 = nothing lost). ``<metric>_stable_length`` keeps the old,
  self-referenced quantity for lower-is-better metrics (flatness, not quality).
- Only units that are the same are paired: a block one side lacks (past T) enters its own side's influence only;
  runs on different document sets are compared on the documents both hold (the line says so) and refused
  when none is shared, never pooled; two runs at the same length that do not rest on the same units (and
  weights) are not the same test and are not compared; a reference computed with other code or package
  versions is used with a visible note.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..config.structured import VerdictConfig
from ..measure import by_metric, measured_value

AT = re.compile(r"^(.+)@(\d+)$")  # <metric>@<length> as a user types it (a search's objective)
DEFAULTS = {key: getattr(VerdictConfig(), key) for key in ("tolerance", "retained")}  # declared once, in VerdictConfig
STATES = ("yes", "NO", "inconclusive", "?")


def criteria_of(cfg) -> dict:
    """The verdict's thresholds from a ``verdict`` config node (or defaults)."""
    if cfg is None:
        return dict(DEFAULTS)
    return {"tolerance": float(cfg.tolerance), "retained": float(cfg.retained)}


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


def _fmt(x: float | None) -> str:
    return "?" if x is None else f"{x:.4g}"


def paired_ratio(metric: dict, own: dict, ref: dict, itself: bool = False) -> dict:
    """The paired ratio own / reference of one metric with its 95% interval and what it rests on:
    ``{"ratio", "low", "high", "n", "method", "shared", "clustered"}`` (low/high None: no interval), and
    ``documents`` (the clusters both hold; other documents are left out, never pooled), ``min_units`` (the fewest
    units the method decides on, tests/test_calibration.py), ``lever`` ("documents", "prompts" or "units": what
    more of would narrow it; None: nothing at this length), ``refused`` (why nothing is compared) and, for the
    "more units" estimate, ``critical`` (a function of the unit count). ``itself``: an unscaled job judged
    against its own run (the ratio is 1 by definition: the reference)."""
    from ...stats import (
        MIN_PROMPTS,
        document_critical,
        paired_log_ratio,
        paired_proportion_ratio,
        shared_clusters,
        units_mean,
    )

    a, b = _units(own), _units(ref)
    shared = len(set(a) & set(b))
    found = {
        "ratio": None,
        "low": None,
        "high": None,
        "n": min(len(a), len(b)),
        "method": None,
        "shared": shared,
        "clustered": False,
        "documents": None,
        "min_units": None,
        "lever": None,
        "refused": None,
    }
    value, reference = measured_value(own), measured_value(ref)
    if metric.get("nll") and a and b:
        found["ratio"] = math.exp(units_mean(a) - units_mean(b))  # the perplexity ratio: exp of the mean NLL difference
    elif value is not None and reference:
        found["ratio"] = value / reference
    if itself:
        found.update(ratio=1.0, low=1.0, high=1.0, n=len(a), method="the reference itself", reference=True)
        return found
    if metric.get("nll") and a and a == b:  # the same units with the same NLLs: exactly 1
        found.update(ratio=1.0, low=1.0, high=1.0, n=len(a), method="identical units")
        return found
    if a and b and not shared_clusters(a, b)[2]:
        found.update(shared=0, refused="no document (or unit) in common with the reference: not compared")
        return found
    unit = (own or {}).get("unit") or metric.get("unit") or "unit"
    bounds = metric.get("bounds")
    if bounds and not metric.get("lower_is_better"):
        lo, hi = bounds
        scale = lambda u: {k: ((t / w - lo) / (hi - lo), 1.0) for k, (t, w) in u.items() if w}  # noqa: E731
        low, high, table = paired_proportion_ratio(scale(a), scale(b)) if a and b else (None, None, None)
        pairs = int(round(table["n"])) if table else 0
        if table and pairs and table["x11"] + table["x21"] > 0:
            found["ratio"] = (table["x11"] + table["x12"]) / (table["x11"] + table["x21"])  # on the paired units
        found.update(low=low, high=high, method="Tang score interval", n=pairs, min_units=MIN_PROMPTS)
        found.update(lever=f"{unit}s", critical=None)
        return found
    interval = paired_log_ratio(a, b, log=not metric.get("nll")) if a and b else None
    if interval:
        found.update(
            ratio=math.exp(interval["estimate"]),
            low=math.exp(interval["low"]),
            high=math.exp(interval["high"]),
            n=interval["n"],
            clustered=interval["clustered"],
            documents=interval["documents"],
            min_units=interval["min_units"],
        )
        if interval["clustered"]:
            whole = all("/" in k for k in a)  # blocks of documents, or units that are their own clusters
            what = "documents" if whole else f"{unit}s"
            found.update(
                method=f"Hall-corrected t over paired {what} (CR2 variance, Bell-McCaffrey df)",
                lever=what,
                critical=document_critical,
            )
        else:
            found.update(method="HAC (Bartlett, fixed-b) over the blocks of one document", lever=None)
    return found


def _log(x):
    import numpy as np

    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(x)


def _units(record: dict) -> dict:
    return {k: (float(v[0]), float(v[1])) for k, v in ((record or {}).get("units") or {}).items()}


def _same_units(own: dict, ref: dict) -> bool:
    """Whether two measurements at one length rest on the same units with the same weights (the same tokens,
    prompts, samples): a partial run (out of memory after some documents), other documents or another block size
    is not the same test."""
    a, b = _units(own), _units(ref)
    return set(a) == set(b) and all(math.isclose(a[k][1], b[k][1], rel_tol=1e-6) for k in a)


def _check(
    metric: dict, own: dict, ref: dict | None, criteria: dict, ref_length: int, second_look: bool, itself: bool = False
) -> dict:
    """One metric at one length against the reference (at ``ref_length``): its state and why."""
    name, lower = metric["name"], metric["lower_is_better"]
    value = measured_value(own)
    check = {
        "metric": name,
        "value": value,
        "reference": measured_value(ref),
        "reference_length": ref_length,
        "state": "?",
        "second_look": second_look,
        "unit": (own or {}).get("unit") or metric.get("unit") or "unit",
    }
    if ref is None or check["reference"] is None:
        check["why"] = f"no unscaled {name} at {ref_length}"
        return check
    if value is None:
        check["why"] = f"{name} not measured ({own.get('note') or 'no value'})"
        return check
    if own["length"] == ref_length and not itself and (_units(own) or _units(ref)) and not _same_units(own, ref):
        check["why"] = (
            f"{name} rests on other {check['unit']}s here ({own.get('count') or 0:g}) than in the "
            f"reference ({ref.get('count') or 0:g}): not the same test"
        )
        return check
    if not lower and check["reference"] <= 0:
        check.update(state="skip", why=f"the unscaled model scores 0 on {name} at {ref_length}: nothing to keep")
        return check
    limit = 1 + criteria["tolerance"] if lower else criteria["retained"]
    paired = paired_ratio(metric, own, ref, itself)
    ratio, low, high = paired["ratio"], paired["low"], paired["high"]
    check.update(limit=limit, ratio=ratio, low=low, high=high, n=paired["n"], method=paired["method"])
    if paired.get("reference"):  # an unscaled job at its own length: nothing is compared, it is the reference
        check.update(state="yes", reference_itself=True, why=f"{name} {_fmt(value)}: the reference itself")
        return check
    if paired["refused"]:
        check.update(state="?", why=f"{name}: {paired['refused']}")
        return check
    blocks_of_one = not paired["clustered"] and "block" in check["unit"]
    if paired["clustered"] and "block" in check["unit"]:  # what the interval rests on: the documents
        check["unit"] = "document"
    head = f"{name} {_fmt(value)} vs {_fmt(check['reference'])} unscaled @{ref_length}: x{_fmt(ratio)}"
    documents = paired.get("documents")
    counts = {len({k.rsplit("/", 1)[0] for k in _units(r) if "/" in k}) for r in (own, ref)}
    if documents and "/" in next(iter(_units(own)), "") and max(counts) > documents:
        head += f" (on the {documents} document(s) both hold)"
    interval = f" [{_fmt(low)}, {_fmt(high)}]" if low is not None else " [no interval]"
    op = "<=" if lower else ">="
    needed = paired.get("min_units") or 0
    if low is not None and paired["n"] < needed:
        state = "inconclusive"
        what = "blocks of one document" if blocks_of_one else f"{check['unit']}s"
        tail = f" on {paired['n']} {what}: at least {needed} are needed to decide"
    elif low is None:
        state, tail = "inconclusive", f", no interval on {paired['n']} {check['unit']}(s)"
    elif (high <= limit) if lower else (low >= limit):
        state, tail = "yes", f" {op} {limit:g}"
    elif (low > limit) if lower else (high < limit):
        state, tail = "NO", f" {'>' if lower else '<'} {limit:g}"
    else:
        state = "inconclusive"
        point = ratio if ratio is not None else (low + high) / 2
        half = (high - point) if limit > point else (point - low)  # the side of the interval facing the limit
        distance = abs(point - limit)
        from ...stats import more_units

        if blocks_of_one:  # more blocks would need another length: the lever is more documents
            more = None
            tail = f" straddles {limit:g}: one document cannot decide it at this length; more documents would"
        else:
            more = more_units(paired["n"], half, distance, paired.get("critical"))
            lever = paired.get("lever") or f"{check['unit']}s"
            tail = f" straddles {limit:g}: " + (
                f"about {more} more {lever} would likely decide it" if more else "the estimate sits on the limit"
            )
        check["more_units"] = more
    check["state"] = state
    check["why"] = head + interval + tail
    return check


def _decide(checks: list[dict]) -> tuple[str, str]:
    """The state at one length from its judged checks: NO beats ?, ? beats inconclusive, all yes is yes."""
    real = [c for c in checks if c["state"] != "skip" and not c["second_look"]]
    for state in ("NO", "?", "inconclusive"):
        hit = [c for c in real if c["state"] == state]
        if hit:
            return state, "; ".join(c["why"] for c in hit)
    if not real:
        return "?", "; ".join(c["why"] for c in checks if not c["second_look"]) or "nothing judged at this length"
    return "yes", "; ".join(c["why"] for c in real)


def _as_bool(state: str) -> bool | None:
    return {"yes": True, "NO": False}.get(state)


def judge(
    measurements: list[dict],
    declared: dict,
    reference: Reference | None,
    trained: int,
    target: int | None,
    criteria: dict,
    missing: str | None = None,
) -> dict:
    """The verdict of one job: ``measurements`` its records (results.json ``measurements``), ``declared`` its metric
    declarations, ``reference`` the unscaled measurements (None: ``missing`` says why). Returns
    ``{"summary": {...}, "lengths": [per-length rows], "criteria", "target", "trained", "reference"}``."""
    metrics = {name: d for name, d in declared.items()}
    judged = {name: d for name, d in metrics.items() if d.get("verdict")}
    have = {name: rows for name, rows in by_metric(measurements).items() if name in metrics}
    lengths = sorted({L for name in judged for L in have.get(name, {})})
    if not lengths:  # nothing this job measured is judged (an analytic study): no verdict at all
        return {
            "summary": {},
            "lengths": [],
            "criteria": criteria,
            "target": target,
            "trained": trained,
            "reference": None,
            "missing": None,
        }
    summary: dict = {}
    rows = []
    for L in lengths:
        checks = []
        for name, metric in metrics.items():
            own = have.get(name, {}).get(L)
            if own is None or (not metric.get("verdict") and not _units(own)):
                continue
            ref_length = L if L <= trained else trained
            ref = reference.get(name, ref_length) if reference is not None else None
            if measured_value(own) is None and measured_value(ref) is None and not own.get("note") == "out of memory":
                continue  # measured on neither side (LongPPL where no token is a key token): nothing to judge
            checks.append(
                _check(
                    metric,
                    own,
                    ref,
                    criteria,
                    ref_length,
                    second_look=not metric.get("verdict"),
                    itself=reference is not None and reference.sources == ["itself"] and L == ref_length,
                )
            )
        rows.append({"length": L, "checks": checks})
    if reference is None:
        why = missing or "no unscaled reference on the same tokens"
        for row in rows:
            row["state"], row["reason"] = "?", why
    else:
        short = [c for row in rows if row["length"] <= trained for c in row["checks"]]
        kept, kept_why = (
            _decide(short) if short else ("?", f"short context not measured: add lengths up to {trained} (1x)")
        )
        for row in rows:
            state, reason = _decide(row["checks"])
            if row["length"] > trained:
                state, reason = _both(state, reason, kept, kept_why)
            row["state"], row["reason"] = state, reason
    for row in rows:
        row["verdict"] = _as_bool(row["state"])
        L = row["length"]
        summary[f"verdict@{L}"] = row["verdict"]
        summary[f"verdict_state@{L}"] = row["state"]
        summary[f"verdict_reason@{L}"] = row["reason"]
        for c in row["checks"]:
            if c.get("ratio") is not None and reference is not None and reference.sources != ["itself"]:
                summary[f"{c['metric']}_ratio@{L}"] = c["ratio"]
                summary[f"{c['metric']}_ratio_ci95_low@{L}"], summary[f"{c['metric']}_ratio_ci95_high@{L}"] = (
                    c["low"],
                    c["high"],
                )
    summary["target_length"] = target
    at_target = next((row for row in rows if row["length"] == target), None)
    summary["verdict"] = at_target["verdict"] if at_target else None
    summary["verdict_state"] = at_target["state"] if at_target else "?"
    summary["verdict_reason"] = (
        at_target["reason"]
        if at_target
        else (f"the target length {target} was not evaluated: add it to the lengths" if target else "no target length")
    )
    values = {name: {L: measured_value(r) for L, r in by_length.items()} for name, by_length in have.items()}
    for name in metrics:
        if values.get(name, {}).get(target) is not None:
            summary[f"{name}@target"] = values[name][target]
    summary["effective_length"], summary["effective_length_reason"] = _effective(rows, trained)
    if reference is not None and reference.sources != ["itself"]:  # an unscaled run retains itself, trivially
        for name, metric in metrics.items():
            for L, value in values.get(name, {}).items():
                base = reference.value(name, L)
                if (
                    L > trained
                    or base is None
                    or value is None
                    or (not metric["lower_is_better"] and base <= 0)
                    or value <= 0
                ):
                    continue
                summary[f"{name}_retention@{L}"] = base / value if metric["lower_is_better"] else value / base
    for name, metric in judged.items():
        own = {L: v for L, v in values.get(name, {}).items() if v is not None}
        if metric["lower_is_better"] and own:
            summary[f"{name}_stable_length"] = _stable(own, trained, criteria["tolerance"])
    return {
        "summary": summary,
        "lengths": rows,
        "criteria": criteria,
        "target": target,
        "trained": trained,
        "reference": None if reference is None else {"sources": reference.sources, "notes": reference.notes},
        "missing": missing if reference is None else None,
    }


def _both(at_length: str, why: str, kept: str, kept_why: str) -> tuple[str, str]:
    """A length beyond T: its own checks and the short-context ones together."""
    for state in ("NO", "?", "inconclusive"):
        if state in (at_length, kept):
            parts = [why] if at_length == state else []
            return state, "; ".join(parts + ([f"short context: {kept_why}"] if kept == state else []))
    return "yes", f"{why}; short context kept"


def _effective(rows: list[dict], trained: int) -> tuple[int | None, str | None]:
    """The largest length with a true verdict at it and at every shorter evaluated length."""
    if not any(row["length"] > trained for row in rows):
        return None, f"no evaluated length exceeds the trained context ({trained})"
    best = None
    for row in rows:
        if row["state"] != "yes":
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


def word(verdict) -> str:
    """A state as printed: ``yes``, ``NO``, ``inconclusive``, ``?`` (a bool or None: yes / NO / ?)."""
    if isinstance(verdict, str):
        return verdict
    return {True: "yes", False: "NO", None: "?"}[verdict]


RULE = (
    "yes when the 95% interval of the paired ratio strategy / unscaled lies within the limit, NO when it lies "
    "beyond, inconclusive when it straddles it"
)


def format_job(title: str, judgement: dict) -> list[str]:
    """The verdict of one job, one line per length: what a user reads at the end of a run."""
    trained, target, criteria = judgement["trained"], judgement["target"], judgement["criteria"]
    lines = [
        f"verdict: does {title} keep working? (paired against the unscaled model on the same units; "
        f"lower-is-better metrics x <= {1 + criteria['tolerance']:g}, higher-is-better ones x >= "
        f"{criteria['retained']:g}; {RULE})"
    ]
    if judgement.get("missing"):
        lines.append(f"  no answer: {judgement['missing']}")
    for note in (judgement.get("reference") or {}).get("notes", []):
        lines.append(f"  note: {note}")
    for row in judgement["lengths"]:
        mark = " <- target" if row["length"] == target else ""
        looks = [
            c["why"]
            for c in row["checks"]
            if c["second_look"] and c.get("ratio") is not None and not c.get("reference_itself")
        ]
        itself = row["checks"] and all(c.get("reference_itself") for c in row["checks"] if not c["second_look"])
        lines.append(
            f"  {row['length']:>7} ({multiple(row['length'], trained):>5})  "
            f"{'reference' if itself else word(row['state']):<12}  "
            f"{row['reason']}" + (f" | second look: {'; '.join(looks)}" if looks else "") + mark
        )
    summary = judgement["summary"]
    if target:
        state = summary.get("verdict_state", word(summary["verdict"]))
        lines.append(
            f"  -> at the target {target} ({multiple(target, trained)} the trained {trained}): {state}"
            + ("" if state in ("yes", "NO") else f" ({summary['verdict_reason']})")
        )
    effective = summary.get("effective_length")
    lines.append(
        f"  -> effective length: {effective if effective is not None else 'none'}"
        + (
            f" ({summary['effective_length_reason']})"
            if effective is None and summary.get("effective_length_reason")
            else ""
        )
    )
    return lines


def format_table(rows: list[dict], trained: int | None) -> list[str]:
    """A strategies x lengths table of verdicts (rows: {"strategy", "target", "verdicts": {L: state},
    "effective_length"}), as lm-eval and the yarn scripts print theirs."""
    lengths = sorted({L for row in rows for L in row["verdicts"]})
    head = (
        ["strategy", "target"]
        + [f"{L}" + (f" ({multiple(L, trained)})" if trained else "") for L in lengths]
        + ["effective length"]
    )
    body = [
        [row["strategy"], str(row["target"] or "")]
        + [word(row["verdicts"][L]) if L in row["verdicts"] else "-" for L in lengths]
        + [str(row["effective_length"] or "none")]
        for row in rows
    ]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, body)]
