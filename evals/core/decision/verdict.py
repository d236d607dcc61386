"""The answer to "does this strategy keep my model working at length L?", judged against the unscaled model.

One rule, used at the end of every job, by the sweep report and by ``python -m evals.report`` (judged here; the
reference's measurements in reference.py, the paired ratio and its interval in paired.py, the printed verdict in
verdict_text.py):

- The reference is the *unscaled* model measured on the same tokens: a finished run with scaling ``none``
  whose comparison key for the eval is the job's (same model, data content, protocol, documents, tokens
  scored, stride ...; evals/core/job/parse.py); a job's own run when it is unscaled. A strategy is never judged
  against itself: PI x2 is flat at twice the unscaled perplexity, and fails here.
- Each metric an eval declares with ``verdict=True`` (evals/core/registry.py ``Metric``) is checked at L:
  beyond the trained context T against the reference at T, up to T against the reference at the same length
  (short-context retention, as LongRoPE2, arXiv 2502.20082, reports it). The check is a *paired* comparison
  on the units both runs share (evals/core/measure.py: token blocks of each document, prompts, samples): the
  ratio strategy / unscaled with its interval (evals/core/stats.py, calibrated by simulation in
  tests/test_calibration.py) -- for NLL metrics exp of the paired mean NLL difference: over several documents a
  Hall-corrected t on the token-weighted per-document influences (CR2 variance, Bell-McCaffrey degrees of
  freedom), within one document a long-run-variance interval over its blocks in order; for scores in a bounded range
  Tang's score interval for a ratio of paired proportions. A lower-is-better metric (ppl, LongPPL) passes when
  the whole interval is at most ``1 + tolerance``, a higher-is-better one (retrieval, RULER) when it is at least
  ``retained`` (NoLiMa's relative rule, arXiv 2502.05167: 0.85). **yes** when the interval lies within the
  limit, **NO** when it lies beyond, **inconclusive** when it straddles it -- naming the lever that would decide
  it: about how many more documents or prompts (evals/core/planning.py: planned on the effective number of documents
  and an upper bound of the spread; each line states the rate at which, followed, it decided in the simulation,
  docs/verdict.md), that two documents cannot plan it (the spread itself is unknown), that the units at hand cannot
  decide it (more than 20x would be needed), or that one document cannot decide it at this length. Past T, a drift
  of the reference's NLL with position within T large enough to bias the comparison is warned about in one line
  (evals/core/decision/positions.py; ``notes``, ``verdict_notes``), the verdict unchanged. Below the fewest units a method is
  calibrated for (``MIN_BLOCKS`` of one document, ``MIN_DOCUMENTS``, ``MIN_PROMPTS``; evals/core/stats.py) nothing
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

from ..config.structured import VerdictConfig
from ..measure import by_metric, measured_value
from .paired import paired_ratio, same_units, units_of
from .positions import position_drift
from .reference import Reference
from .verdict_text import lever as more_of
from .verdict_text import word

AT = re.compile(r"^(.+)@(\d+)$")  # <metric>@<length> as a user types it (a search's objective)
DEFAULTS = {key: getattr(VerdictConfig(), key) for key in ("tolerance", "retained")}  # declared once, in VerdictConfig
STATES = ("yes", "NO", "inconclusive", "?")


def criteria_of(cfg) -> dict:
    """The verdict's thresholds from a ``verdict`` config node (or defaults)."""
    if cfg is None:
        return dict(DEFAULTS)
    return {"tolerance": float(cfg.tolerance), "retained": float(cfg.retained)}


def _fmt(x: float | None) -> str:
    return "?" if x is None else f"{x:.4g}"


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
    if own["length"] == ref_length and not itself and (units_of(own) or units_of(ref)) and not same_units(own, ref):
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
    counts = {len({k.rsplit("/", 1)[0] for k in units_of(r) if "/" in k}) for r in (own, ref)}
    if documents and "/" in next(iter(units_of(own)), "") and max(counts) > documents:
        head += f" (on the {documents} document(s) both hold)"
    interval = f" [{_fmt(low)}, {_fmt(high)}]" if low is not None else " [no interval]"
    op = "<=" if lower else ">="
    needed = paired.get("min_units") or 0
    if low is not None and paired["n"] < needed:
        state = "inconclusive"
        what = "blocks of one document" if blocks_of_one else f"{check['unit']}s"
        tail = f" on {paired['n']} {what}: at least {needed} are needed to decide; {more_of(what, metric.get('eval'), blocks_of_one)}"
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
        if blocks_of_one:  # more blocks would need another length: the lever is more documents
            more = None
            tail = f" straddles {limit:g}: one document cannot decide it at this length; more documents would"
        else:
            lever = paired.get("lever") or f"{check['unit']}s"
            if paired["clustered"]:  # the cluster interval is symmetric in the log: plan there (evals/core/planning.py)
                half = math.log(high / point) if limit > point else math.log(point / low)
                if paired.get("se") and paired.get("critical"):  # Hall's side can be short: not below t se
                    half = max(half, float(paired["critical"](paired["n"])) * paired["se"])
                distance = abs(math.log(point / limit))
            tail = f" straddles {limit:g}: " + _advice(paired, half, distance, point, limit, lever)
            more = paired.get("advice")
        check["more_units"] = more
    check["state"] = state
    check["why"] = head + interval + tail
    return check


def _advice(paired: dict, half: float, distance: float, point: float, limit: float, lever: str) -> str:
    """What more units would decide an inconclusive check (evals/core/planning.py :func:`advise`): "about k more ...
    would likely decide it" only where that, followed, decides >= 80% of the time; with two documents (the spread
    rests on ~1 degree of freedom) the number with its measured rate; "these units cannot decide it" when more than
    PLAIN times the units at hand would be needed, with the plan on the current spread; "sits on the limit" only
    when the estimate prints as the limit. Sets ``paired["advice"]`` (the promised number, or None)."""
    from ..planning import FEW_DF, FEW_RATE, FOLLOWED, PLAIN, PLAIN_RATES, advise

    n = paired["n"]
    paired["advice"] = None
    if f"{point:.4g}" == f"{limit:.4g}":
        return f"the estimate sits on the limit (x{point:.4g}): no number of {lever} can be promised to decide it"
    df = paired.get("df")
    kind, more, low = advise(n, half, distance, paired.get("critical"), df, paired.get("effective"))
    question = f"a x{point:.3g} vs x{limit:g} question"
    unknown = df is not None and df < FEW_DF
    spread = ""
    if unknown:  # ~1 degree of freedom: two documents, or a few carrying most of the weight
        spread = f"with {n} the spread itself is unknown" if n == 2 else f"{df:.1f} df: the spread itself is unknown"
    if kind == "none":
        return f"{n} {lever} cannot decide {question}; even 10^6 times as many might not"
    if kind == "plain":
        why = f"{spread}, and " if unknown else ""
        lo, hi = PLAIN_RATES
        current = (
            f"; on the current spread about {n + low} might (followed in simulation: {lo:.0%}-{hi:.0%})"
            if low and low <= PLAIN * n
            else ""
        )
        return f"{n} {lever} cannot decide {question}: {why}a plan that holds needs over {PLAIN}x as many{current}"
    if kind == "few":
        return (
            f"{n} {lever} cannot plan it: {spread}; add {lever}: about {more} more "
            f"would decide it if the next ones resemble these (followed in simulation, such advice decided "
            f"{FEW_RATE:.0%} of the time)"
        )
    paired["advice"] = more
    current = f"at least {low} on the current spread; " if low and low < more else ""
    typical, worst, which = FOLLOWED["prompts" if lever == "prompts" else "documents"]
    rates = f"followed in simulation it decided >= {typical:.0%}, {worst:.0%} with {which}"
    return f"about {more} more {lever} would likely decide it ({current}{rates})"


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
    rows, notes = [], []  # notes: position-effect warnings (evals/core/decision/positions.py)
    for L in lengths:
        checks = []
        for name, metric in metrics.items():
            own = have.get(name, {}).get(L)
            if own is None or (not metric.get("verdict") and not units_of(own)):
                continue
            ref_length = L if L <= trained else trained
            ref = reference.get(name, ref_length) if reference is not None else None
            if measured_value(own) is None and measured_value(ref) is None and not own.get("note") == "out of memory":
                continue  # measured on neither side (LongPPL where no token is a key token): nothing to judge
            itself = reference is not None and reference.sources == ["itself"] and L == ref_length
            checks.append(_check(metric, own, ref, criteria, ref_length, not metric.get("verdict"), itself))
            if L > trained and metric.get("nll") and metric.get("verdict") and ref and not itself:
                drift = position_drift(units_of(own), units_of(ref), criteria["tolerance"], L, trained)
                if drift and drift["warn"]:  # the verdict stays; the warning travels with it
                    checks[-1]["position_drift"] = drift
                    notes.append(f"{name}: {drift['note']}")
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
    if notes:  # with the verdict wherever it goes: results.json and W&B (summary), the printed and report notes
        summary["verdict_notes"] = "; ".join(notes)
    return {
        "summary": summary,
        "lengths": rows,
        "criteria": criteria,
        "target": target,
        "trained": trained,
        "notes": notes,
        "reference": None if reference is None else {"sources": reference.sources, "notes": reference.notes + notes},
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
            if best is None:  # the one vocabulary (verdict_text.word): "not working" is said for NO only
                said = "not working" if row["state"] == "NO" else word(row["state"])
                return None, f"{said} at {row['length']}: {row['reason']}"
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
