"""The ranked answer of a sweep: at the target length, which strategy should I use, and is it really better
than the next one?

For each model and target, every strategy's finished jobs (perplexity, LongPPL, needle, passkey, RULER ...
each judged by evals/core/decision/verdict.py) are taken together:

- **recommended** only when every metric measured is ``yes`` at the target (beyond the trained context that
  includes the short-context checks): one ``NO`` anywhere fails it, and the answer names where (``fails
  passkey``); where one eval says yes and another NO, the answer says they disagree.
- Ordered by the *primary* metric at the target -- the first lower-is-better NLL metric every strategy
  measured (perplexity), else the first judged metric: recommended ones first, then inconclusive, missing,
  failing. For each, the paired ratio to the best (the recommended strategy with the best value) on the units
  both measured, and **tie groups**: a strategy that Holm's procedure does not separate from its group's leader
  is tied with it (``dca ≈ self_extend``). The comparisons hold 95% jointly (simultaneous.py: Holm 1979 over
  every pair, the intervals shown Bonferroni-simultaneous), so among strategies of equal quality a non-tie is
  declared in at most 5% of sweeps however many there are.
- Cost: the strategy's time relative to the unscaled jobs of the same evals, from their paired forwards with its
  95% interval, or not shown (evals/scoring/cost.py: one timing against one is noise on a shared machine), and its
  peak memory relative to theirs. Never part of the order.
- Per engine (engines.py): the best recommended strategy each serving engine can serve, and its ratio to the best.

The answer's first line reads e.g. ``at 16384 (2x) on smollm2: dca ≈ self_extend (tied), then yarn-factor2;
lm_infinite fails passkey; string fails perplexity, passkey; simultaneous 95% (Holm, 15 pairs)``, and a line per
engine follows it (``vllm: yarn-factor2, x1.021 [1.004, 1.038] of dca (dca: ...)``).
"""

from __future__ import annotations

from .engines import engine_line, per_engine
from ..measure import by_metric, measured_value
from .simultaneous import ALPHA, holm, p_value, widened
from .paired import paired_ratio
from .verdict_text import multiple
from ...scoring.cost import time_ratio, time_text

ORDER = {"yes": 0, "inconclusive": 1, "?": 2, "NO": 3, "cannot reach": 4}


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
    time = time_ratio(pairs)  # paired forwards with their spread, or None (evals/scoring/cost.py)
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
    return [
        _rank_group(model, trained, target, members, unreachable.get((model, w, d, trained, target), {}))
        for (model, w, d, trained, target), members in groups.items()
    ]


def _rank_group(
    model: str,
    trained: int,
    target: int,
    members: dict[str, list[tuple[dict, dict]]],
    unreachable: dict[str, str] | None = None,
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
                "recommended": overall == "yes",
                "failing": failing,
                "undecided": undecided,
                "evals": saying,
                "value": value,
                "_record": record,
                "time": time,
                "memory": memory,
                "disagree": disagree,
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
    missing_value = float("inf")
    rows.sort(
        key=lambda r: (
            ORDER[r["state"]],
            (r["value"] if lower else -r["value"]) if r["value"] is not None else missing_value,
            r["strategy"],
        )
    )
    # the family: every pair of strategies with a value, the later one against the earlier (simultaneous.py)
    valued = [r for r in rows if r["value"] is not None]
    pairs, versus = {}, {}
    for i, r in enumerate(valued):
        for other in valued[:i]:
            key = (r["strategy"], other["strategy"])
            versus[key] = _versus(primary, r, other)
            if (p := p_value(versus[key])) is not None:
                pairs[key] = p
    adjusted = holm(pairs)
    best = valued[0] if valued else None  # recommended first: the recommended strategy with the best value
    group, leader = 0, None
    for r in rows:
        if r is best:
            r["vs_best"] = _versus(primary, r, r)
        else:
            r["vs_best"] = widened(versus.get((r["strategy"], best["strategy"])), len(pairs)) if best else None
        r["p_holm"] = None
        if r["value"] is None:
            r["tie_group"] = None
            continue
        key = (r["strategy"], leader["strategy"]) if leader is not None else None
        r["p_holm"] = adjusted.get(key)
        tied = r["p_holm"] is not None and r["p_holm"] > ALPHA and r["state"] == leader["state"]
        if not tied:
            group, leader = group + 1, r
        r["tie_group"] = group
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
        "pairs": len(pairs),
        "answer": answer_line(model, trained, target, rows, len(pairs)),
        "engines": engines,
        "engine_lines": [engine_line(e) for e in engines],
        "rows": rows,
    }


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


def answer_line(model: str, trained: int, target: int, rows: list[dict], pairs: int = 0) -> str:
    """``at 16384 (2x) on smollm2: dca ≈ self_extend (tied), then yarn; lm_infinite fails passkey; ...;
    simultaneous 95% (Holm, 15 pairs)``: ``pairs`` comparisons made, all holding together."""
    head = f"at {target} ({multiple(target, trained)}) on {model}: "
    recommended = [r for r in rows if r["recommended"]]
    parts = []
    if recommended:
        tiers: list[list[str]] = []
        for r in recommended:
            if (
                tiers
                and r["tie_group"] is not None
                and r["tie_group"] == recommended[recommended.index(r) - 1]["tie_group"]
            ):
                tiers[-1].append(r["strategy"])
            else:
                tiers.append([r["strategy"]])
        parts.append(", then ".join(" ≈ ".join(t) + (" (tied)" if len(t) > 1 else "") for t in tiers))
    else:
        parts.append("no strategy is yes on every metric")
    for r in rows:
        if r["state"] == "NO":
            parts.append(
                f"{r['strategy']} fails {', '.join(r['failing'])}"
                + (
                    f" (though {', '.join(e for e, s in r['evals'].items() if s == 'yes')} yes)"
                    if r["disagree"]
                    else ""
                )
            )
        elif r["state"] == "cannot reach":
            parts.append(f"{r['strategy']} cannot reach {target}")
        elif not r["recommended"]:
            word = "undecided" if r["state"] == "inconclusive" else "not answered"
            parts.append(f"{r['strategy']} {word} on {', '.join(r['undecided'])}")
    if pairs:
        parts.append(f"simultaneous 95% (Holm, {pairs} pair{'s' if pairs > 1 else ''})")
    return head + "; ".join(parts)


def answer_text(group: dict) -> str:
    """The answer as report_answer.txt (and W&B's ``answer``) hold it: its line, then a line per engine."""
    return "".join(line + "\n" for line in [group["answer"], *(f"  {e}" for e in group.get("engine_lines") or [])])


def table(group: dict) -> list[dict]:
    """The rows of one group as a flat table (csv, markdown, W&B)."""
    metric = group["metric"] or "value"
    found = []
    for place, r in enumerate(group["rows"], 1):
        versus = r["vs_best"] or {}
        found.append(
            {
                "model": group["model"],
                "target": group["target"],
                "rank": place,
                "strategy": r["strategy"],
                "answer": "recommended" if r["recommended"] else r["state"],
                "tie_group": r["tie_group"],
                f"{metric}@target": r["value"],
                "vs_best": versus.get("ratio"),
                "vs_best_ci95_low": versus.get("low"),
                "vs_best_ci95_high": versus.get("high"),
                "p_holm": r.get("p_holm"),
                "evals": ", ".join(f"{e}: {s}" for e, s in r["evals"].items()),
                "time_vs_unscaled": (r["time"] or {}).get("ratio"),
                "time_vs_unscaled_ci95_low": (r["time"] or {}).get("low"),
                "time_vs_unscaled_ci95_high": (r["time"] or {}).get("high"),
                "memory_vs_unscaled": r["memory"],
                "best_for_engines": ", ".join(r.get("best_for") or []),
                "note": f"metrics disagree ({r['disagree']})" if r["disagree"] else r.get("why", ""),
            }
        )
    return found


def format_group(group: dict) -> list[str]:
    """The answer as printed: its line, then one line per strategy."""
    lines = [f"answer: {group['answer']}", *(f"  {line}" for line in group.get("engine_lines") or [])]
    metric = group["metric"]
    for row in table(group):
        ratio = row["vs_best"]
        versus = (
            ""
            if ratio is None
            else (
                f" x{ratio:.4g} vs best"
                + (
                    f" [{row['vs_best_ci95_low']:.4g}, {row['vs_best_ci95_high']:.4g}]"
                    if row["vs_best_ci95_low"] is not None
                    else ""
                )
            )
        )
        value = row[f"{metric or 'value'}@target"]
        said = time_text(next(r for r in group["rows"] if r["strategy"] == row["strategy"])["time"])
        memory = f"memory x{row['memory_vs_unscaled']:.2f}" if row["memory_vs_unscaled"] is not None else None
        cost = "; ".join(part for part in (said, memory) if part)
        lines.append(
            f"  {row['rank']:>2}. {row['strategy']:<24} {row['answer']:<12} "
            + (f"{metric} {value:.4g}" if value is not None else f"{metric} -")
            + versus
            + (f"  (group {row['tie_group']})" if row["tie_group"] else "")
            + (f"  cost: {cost}" if cost else "")
            + (f"  [{row['note']}]" if row["note"] else "")
        )
    return lines
