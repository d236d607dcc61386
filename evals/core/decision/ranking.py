"""The ranked answer of a sweep: at the target length, which strategy should I use, and is it really better
than the next one?

For each model and target, every strategy's finished jobs (perplexity, LongPPL, needle, passkey, RULER ...
each judged by evals/core/decision/verdict.py) are taken together:

- **Tie groups, by the comparison between strategies** on the *primary* metric at the target (the first
  lower-is-better NLL metric every strategy measured, perplexity, else the first judged metric): two strategies
  are tied when their simultaneous paired interval (one against the other, on the units both measured) holds 1,
  whatever their states against the unscaled model. The best strategy that is yes or undecided leads the first
  group, every strategy whose interval against it holds 1 joins it; the best one left leads the next. The
  intervals printed (each against the best) are the same simultaneous intervals (simultaneous.py, Bonferroni over
  every pair): a strategy is in the best's group exactly when its printed interval holds 1, and among strategies
  of equal quality a split is declared in at most 5% of sweeps however many there are (bench/ranking_ties.py
  measures it through the real verdicts).
- **recommended** only when every metric measured is ``yes`` at the target (beyond the trained context that
  includes the short-context checks): a tie is no evidence of a small loss, so a strategy tied with a recommended
  one whose primary metric is undecided against the unscaled model is named beside it, not recommended (``dca ≈
  self_extend (tied; self_extend undecided against the unscaled model alone: not recommended)``). One ``NO``
  anywhere fails it, and the answer names where (``fails passkey``); where one eval says yes and another NO, the
  answer says they disagree. Recommended ones first (by group), then undecided, not answered, failing.
- Cost: the strategy's time relative to the unscaled jobs of the same evals, from their paired forwards with its
  95% interval, or not shown (evals/core/scoring/cost.py: one timing against one is noise on a shared machine), and its
  peak memory relative to theirs. Never part of the order.
- Per engine (engines.py): the best recommended strategy each serving engine can serve, and its ratio to the best.

The answer's first line reads e.g. ``at 16384 (2x) on smollm2: dca ≈ self_extend (tied), then yarn-factor2;
lm_infinite fails passkey; string fails perplexity, passkey; simultaneous 95% (Bonferroni, 15 pairs)``, and a line per
engine follows it (``vllm: yarn-factor2, x1.021 [1.004, 1.038] of dca (dca: ...)``).
"""

from __future__ import annotations

from .engines import engine_line, per_engine
from ..measure import by_metric, measured_value
from .simultaneous import holds_one, widened
from .paired import paired_ratio
from .answer_text import answer_line, answer_text, format_group, table
from ..scoring.cost import time_ratio

__all__ = ["rank", "answer_line", "answer_text", "format_group", "table"]

ORDER = {"yes": 0, "inconclusive": 1, "?": 2, "NO": 3, "cannot reach": 4}
CLASS = {"yes": 0, "inconclusive": 0, "?": 1, "NO": 2, "cannot reach": 3}  # yes and inconclusive: ranked together


def _sort_key(row: dict, lower: bool) -> tuple:
    """Yes and undecided together by the primary metric's value (which of them is yes is the comparison's to say),
    then not answered, failing, unreachable."""
    value = row["value"]
    return (CLASS[row["state"]], (value if lower else -value) if value is not None else float("inf"), row["strategy"])


def _primary_only(jobs: list[tuple[dict, dict]], primary: str | None, target: int, trained: int) -> bool:
    """Whether every judged check of the strategy at the target (and at the short lengths it rests on) other than
    the primary metric's is yes, and the primary metric's are yes or inconclusive: a tie on the primary metric is
    then all that stands between it and yes."""
    if primary is None:
        return False
    for _, verdict in jobs:
        rows = [row for row in verdict.get("lengths") or [] if row["length"] == target or row["length"] <= trained]
        if not any(row["length"] == target for row in rows):
            return False
        for row in rows:
            for check in row["checks"]:
                if check["second_look"] or check["state"] == "skip":
                    continue
                allowed = ("yes", "inconclusive") if check["metric"] == primary else ("yes",)
                if check["state"] not in allowed:
                    return False
    return True


def _info(job: dict) -> dict:
    return job.get("job") or {}


def _at_target(verdict: dict, target: int) -> dict | None:
    return next((row for row in verdict.get("lengths") or [] if row["length"] == target), None)


def _primary(members: dict[str, list[tuple[dict, dict]]], target: int) -> tuple[str, dict] | None:
    """(metric, its declaration): of the judged metrics measured at the target, those measured by the most
    strategies; among them a lower-is-better NLL metric (perplexity) first, then the order the evals declare them."""
    counts: dict[str, int] = {}  # insertion order: the order of the jobs and of their declarations
    declared: dict[str, dict] = {}
    for jobs in members.values():
        names = {}
        for job, _ in jobs:
            for name, d in (job.get("declared") or {}).items():
                record = by_metric(job.get("measurements") or []).get(name, {}).get(target)
                if d.get("verdict") and measured_value(record) is not None:
                    names[name] = None
                    declared.setdefault(name, d)
        for name in names:
            counts[name] = counts.get(name, 0) + 1
    if not counts:
        return None
    order = list(counts)
    best = sorted(
        order,
        key=lambda n: (-counts[n], not (declared[n].get("nll") and declared[n]["lower_is_better"]), order.index(n)),
    )[0]
    return best, declared[best]


def _unjudged(jobs: list[tuple[dict, dict]], target: int, unscaled: list[tuple[dict, dict]]) -> dict[str, str]:
    """{metric: why it was not judged at the target} for every metric the strategy's evals declare for the verdict
    and the verdict could not judge there: the unscaled model scored 0 (nothing to keep), not measured, the target
    not evaluated. Such a strategy is not recommended: its answer would rest on the other metrics alone."""
    found = {}
    for job, verdict in jobs:
        row = _at_target(verdict, target)
        checks = {c["metric"]: c for c in (row or {}).get("checks") or [] if not c["second_look"]}
        for name, declared in (job.get("declared") or {}).items():
            if not declared.get("verdict"):
                continue
            check = checks.get(name)
            if row is None:
                found[name] = f"{target} not evaluated"
            elif check is None:
                found[name] = f"not measured at {target}"
            elif check["state"] == "skip":
                found[name] = _scored_nothing(name, check, unscaled)
    return found


def _scored_nothing(name: str, check: dict, unscaled: list[tuple[dict, dict]]) -> str:
    """``the unscaled model found 0/10 prompts at 1024``: the reference a bounded metric is kept relative to."""
    L = check["reference_length"]
    record = next(
        (
            by_metric(j.get("measurements") or []).get(name, {}).get(L)
            for j, _ in unscaled
            if by_metric(j.get("measurements") or []).get(name, {}).get(L)
        ),
        None,
    )
    units = len((record or {}).get("units") or {})
    out_of = f"0/{units} {check.get('unit') or 'unit'}s" if units else "0"
    return f"the unscaled model scored {out_of} at {L}: nothing to keep"


def _record(jobs: list[tuple[dict, dict]], metric: str, target: int) -> tuple[dict | None, dict | None]:
    """(the measurement of ``metric`` at the target, the job it came from)."""
    for job, _ in jobs:
        record = by_metric(job.get("measurements") or []).get(metric, {}).get(target)
        if measured_value(record) is not None:
            return record, job
    return None, None


def _cost(jobs: list[tuple[dict, dict]], unscaled: list[tuple[dict, dict]]) -> tuple[dict | None, float | None]:
    """(time, peak memory) of a strategy's jobs relative to the unscaled jobs of the same evals."""
    base = {_info(j).get("eval"): j for j, _ in unscaled}
    pairs = [(j, base[_info(j).get("eval")]) for j, _ in jobs if _info(j).get("eval") in base]
    time = time_ratio(pairs)  # paired forwards with their spread, or None (evals/core/scoring/cost.py)
    own_m = [(j.get("timings") or {}).get("peak_memory_bytes") for j, _ in pairs]
    ref_m = [(b.get("timings") or {}).get("peak_memory_bytes") for _, b in pairs]
    memory = max(own_m) / max(ref_m) if pairs and None not in own_m + ref_m and max(ref_m) > 0 else None
    return time, memory


def rank(jobs: list[dict], verdicts: dict[int, dict]) -> list[dict]:
    """The ranked answer for every model and target among ``jobs`` (report entries) judged in ``verdicts``:
    ``[{"model", "target", "trained", "metric", "answer", "rows": [...]}]``."""
    groups: dict[tuple, dict[str, list[tuple[dict, dict]]]] = {}
    for index, verdict in verdicts.items():
        job = jobs[index]
        info = _info(job)
        target = verdict.get("target")
        if info.get("role", "job") != "job" or not target or not verdict.get("lengths"):
            continue
        key = (info.get("model_label"), info.get("weights"), info.get("data"), verdict.get("trained"), target)
        groups.setdefault(key, {}).setdefault(str(info.get("scaling")), []).append((job, verdict))
    unreachable: dict[
        tuple, dict[str, str]
    ] = {}  # strategies a target= sweep could not set up (run_hydra records them)
    for job in jobs:
        info = _info(job)
        if job.get("state") == "unreachable" and info.get("target_length"):
            key = (
                info.get("model_label"),
                info.get("weights"),
                info.get("data"),
                info.get("trained_context"),
                info["target_length"],
            )
            groups.setdefault(key, {})
            unreachable.setdefault(key, {})[str(info.get("scaling"))] = (job.get("error") or {}).get("message", "")
    # a target no job evaluated: answered at the largest length they did evaluate, saying so (never rows of "?")
    answered: dict[tuple, tuple[dict, dict, int | None]] = {}
    for key, members in groups.items():
        model, w, d, trained, target = key
        lengths = [row["length"] for jobs in members.values() for _, v in jobs for row in v.get("lengths") or []]
        at = key
        if lengths and target not in lengths:
            at = (model, w, d, trained, max(lengths))
        members_at, reach, asked = answered.setdefault(at, ({}, {}, []))
        for strategy, jobs in members.items():
            members_at.setdefault(strategy, []).extend(jobs)
        reach.update(unreachable.get(key, {}))
        if at != key:
            asked.append(target)
    return [
        _rank_group(model, trained, target, members, reach, sorted(set(asked)))
        for (model, w, d, trained, target), (members, reach, asked) in answered.items()
    ]


def _rank_group(
    model: str,
    trained: int,
    target: int,
    members: dict[str, list[tuple[dict, dict]]],
    unreachable: dict[str, str] | None = None,
    asked: list[int] | None = None,
) -> dict:
    primary = _primary(members, target)
    unscaled = members.get("none", [])
    every_eval = list(dict.fromkeys(_info(job).get("eval") for jobs in members.values() for job, _ in jobs))
    rows = []
    for strategy, jobs in members.items():
        states, failing, undecided, saying = [], [], [], {}
        for eval_name in every_eval:  # an eval the others ran and this one did not: not recommended on it
            if eval_name not in {_info(job).get("eval") for job, _ in jobs}:
                states.append("?")
                saying[eval_name] = "?"
                undecided.append(eval_name)
        for job, verdict in jobs:
            row = _at_target(verdict, target)
            eval_name = _info(job).get("eval")
            state = row["state"] if row else "?"
            states.append(state)
            saying[eval_name] = state
            if state == "NO":
                failing.append(eval_name)
            elif state != "yes":
                undecided.append(eval_name)
        overall = max(states, key=lambda s: ORDER[s]) if states else "?"
        missed = _unjudged(jobs, target, unscaled)
        value = record = None
        if primary:
            record, _ = _record(jobs, primary[0], target)
            value = measured_value(record)
        time, memory = _cost(jobs, unscaled) if strategy != "none" else (None, 1.0 if unscaled else None)
        said = set(saying.values())
        disagree = ", ".join(f"{e} {s}" for e, s in saying.items()) if "yes" in said and "NO" in said else None
        rows.append(
            {
                "strategy": strategy,
                "state": overall,
                "recommended": overall == "yes" and not missed,
                "unjudged": missed,
                "failing": failing,
                "undecided": undecided,
                "evals": saying,
                "value": value,
                "_record": record,
                "time": time,
                "memory": memory,
                "disagree": disagree,
                "_primary_only": overall == "inconclusive"
                and _primary_only(jobs, primary and primary[0], target, trained),
            }
        )
    for strategy, why in (unreachable or {}).items():
        if strategy not in members:
            rows.append(
                {
                    "strategy": strategy,
                    "state": "cannot reach",
                    "recommended": False,
                    "failing": [],
                    "undecided": [],
                    "unjudged": {},
                    "evals": {},
                    "value": None,
                    "_record": None,
                    "time": None,
                    "memory": None,
                    "disagree": None,
                    "why": why,
                }
            )
    lower = bool(primary and primary[1]["lower_is_better"])
    rows.sort(key=lambda r: _sort_key(r, lower))
    # the family: every pair of strategies with a value, each at the simultaneous level (simultaneous.py)
    valued = [r for r in rows if r["value"] is not None]
    versus = {}
    for i, r in enumerate(valued):
        for other in valued[:i]:
            versus[(r["strategy"], other["strategy"])] = _versus(primary, r, other)
    pairs = sum(1 for i, r in enumerate(valued) for o in valued[:i] if versus[(r["strategy"], o["strategy"])])
    simultaneous = {key: widened(v, pairs) for key, v in versus.items()}
    best = valued[0] if valued else None  # yes or inconclusive first: the one with the best value
    for r in rows:
        r["vs_best"] = (
            (_versus(primary, r, r) if r is best else simultaneous.get((r["strategy"], best["strategy"])))
            if best
            else None
        )
        r["tie_group"] = r["tied_with"] = None
    # tie groups, by the comparison alone (whatever the states): the best strategy not yet grouped leads, and every
    # strategy whose simultaneous interval against it holds 1 joins it
    group = 0
    for leader in valued:
        if leader["tie_group"] is not None:
            continue
        group += 1
        for r in valued:
            if r["tie_group"] is None and (
                r is leader or holds_one(simultaneous.get((r["strategy"], leader["strategy"])))
            ):
                r["tie_group"] = group
    # "recommended" stays the strategy's own: yes on every metric (a tie is no evidence of a small loss: a strategy
    # at x1.15 tied with one at x1.00 would otherwise be recommended in ~10% of six-document sweeps,
    # bench/ranking_ties.py). A strategy tied with a recommended one whose only undecided metric is the primary one
    # is named beside it (``tied_with``): same group, its own verdict still undecided
    for r in rows:
        if r["recommended"] or r["tie_group"] is None or not r.pop("_primary_only", False):
            r.pop("_primary_only", None)
            continue
        twin = next((o for o in rows if o["tie_group"] == r["tie_group"] and o["recommended"]), None)
        if twin is not None:
            r["tied_with"] = twin["strategy"]
    rows.sort(
        key=lambda r: (
            not (r["recommended"] or r["tied_with"]),
            CLASS[r["state"]],
            r["tie_group"] or len(rows) + 1,
            *_sort_key(r, lower)[1:],
        )
    )
    # against the first recommended strategy (the one the per-engine answer and the export name): the best by value
    # may be an undecided one, and a ratio printed "of dca" must be against dca
    top = next((r for r in rows if r["recommended"] and r["value"] is not None), None)
    for r in rows:
        r["vs_top"] = _against(primary, r, top, simultaneous) if top and r["value"] is not None else None
    unjudged = {m: why for r in rows if r["strategy"] != "none" for m, why in r["unjudged"].items()}
    configs = {s: next((j["config"] for j, _ in jobs if j.get("config")), None) for s, jobs in members.items()}
    engines = per_engine(rows, {s: c for s, c in configs.items() if c})
    for r in rows:
        r.pop("_record", None)
        r["best_for"] = [e["engine"] for e in engines if e["strategy"] == r["strategy"]]  # the engines' choice
    return {
        "model": model,
        "trained": trained,
        "target": target,
        "metric": primary[0] if primary else None,
        "pairs": pairs,
        "asked": asked or [],
        "unjudged": unjudged,
        "answer": answer_line(model, trained, target, rows, pairs, asked, unjudged),
        "engines": engines,
        "engine_lines": [engine_line(e) for e in engines],
        "rows": rows,
    }


def _against(primary, r: dict, other: dict, simultaneous: dict) -> dict | None:
    """``r`` against ``other`` at the simultaneous level, whichever order the pair was compared in."""
    if r is other:
        return _versus(primary, r, r)
    if (r["strategy"], other["strategy"]) in simultaneous:
        return simultaneous[(r["strategy"], other["strategy"])]
    found = simultaneous.get((other["strategy"], r["strategy"]))
    if not found:
        return found
    flip = lambda x: None if x in (None, 0) else 1 / x  # noqa: E731 -- a/b from b/a: the interval's ends swap
    return {**found, "ratio": flip(found["ratio"]), "low": flip(found.get("high")), "high": flip(found.get("low"))}


def _versus(primary, row: dict, other: dict | None) -> dict | None:
    """The paired ratio of ``row`` to ``other`` on the primary metric at the target (the units both hold)."""
    if primary is None or other is None or row["_record"] is None or other["_record"] is None:
        return None
    if row is other:
        return {"ratio": 1.0, "low": 1.0, "high": 1.0}
    paired = paired_ratio(primary[1], row["_record"], other["_record"])
    if not paired["shared"]:  # other tokens, other prompts: nothing to pair
        return None
    return {k: paired[k] for k in ("ratio", "low", "high", "n", "method")}  # n, method: the interval's pivot
