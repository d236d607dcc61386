"""The ranked answer as a user reads it (ranking.py decides it): its first line (:func:`answer_line`), the text of
report_answer.txt and W&B's ``answer`` (:func:`answer_text`), the flat table (:func:`table`: csv, markdown, W&B) and
the printed block (:func:`format_group`)."""

from __future__ import annotations

from .verdict_text import multiple, word
from ..scoring.cost import time_text


def _tiers(chosen: list[dict]) -> str:
    """``dca ≈ self_extend (tied), then yarn``: the rows (in order) by tie group."""
    tiers: list[list[dict]] = []
    for i, r in enumerate(chosen):
        if tiers and r["tie_group"] is not None and r["tie_group"] == chosen[i - 1]["tie_group"]:
            tiers[-1].append(r)
        else:
            tiers.append([r])

    def tier(members: list[dict]) -> str:
        alone = [r["strategy"] for r in members if r.get("tied_with")]
        members = sorted(members, key=lambda r: not r["recommended"])  # the recommended ones named first
        names = " ≈ ".join(r["strategy"] for r in members)
        if len(members) == 1:
            return names
        return (
            names
            + " (tied"
            + (f"; {', '.join(alone)} undecided against the unscaled model alone: not recommended" if alone else "")
            + ")"
        )

    return ", then ".join(tier(t) for t in tiers)


def answer_line(
    model: str,
    trained: int,
    target: int,
    rows: list[dict],
    pairs: int = 0,
    asked: list[int] | None = None,
    unjudged: dict[str, str] | None = None,
) -> str:
    """``at 16384 (2x) on smollm2: dca ≈ self_extend (tied), then yarn; lm_infinite fails passkey; ...;
    simultaneous 95% (Bonferroni, 15 pairs)``: ``pairs`` comparisons made, all holding together. First what the
    answer could not judge: a target nobody evaluated (``asked``: answered at ``target``, the largest length
    evaluated) and each declared metric not judged there (``unjudged``: {metric: why})."""
    head = ""
    if asked:
        wanted = " and ".join(f"{a} ({multiple(a, trained)})" for a in asked)
        head = f"the target {wanted} was not evaluated (add it to eval.lengths); answered at the largest length evaluated: "
    head += f"at {target} ({multiple(target, trained)}) on {model}: "
    parts = [f"{metric} not judged: {why}" for metric, why in (unjudged or {}).items()]
    recommended = [r for r in rows if r["recommended"] or r.get("tied_with")]  # tied_with: named beside its twin
    if recommended:
        parts.append(_tiers(recommended))
    elif unjudged and (partly := [r for r in rows if r["state"] == "yes"]):
        judged = "yes on what was judged, not recommended"
        parts.append(f"no strategy is recommended; {judged}: {_tiers(partly)}")
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
        elif not r["recommended"] and not r.get("tied_with") and not (r["state"] == "yes" and r.get("unjudged")):
            said = "inconclusive" if r["state"] == "inconclusive" else "not judged"
            parts.append(f"{r['strategy']} {said} on {', '.join(r['undecided'])}")
    if pairs:
        parts.append(f"simultaneous 95% (Bonferroni, {pairs} pair{'s' if pairs > 1 else ''})")
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
                "answer": "reference"
                if r["strategy"] == "none"
                else "recommended"
                if r["recommended"]
                else word(r["state"]),
                "tie_group": r["tie_group"],
                f"{metric}@target": r["value"],
                "vs_best": versus.get("ratio"),
                "vs_best_ci95_low": versus.get("low"),
                "vs_best_ci95_high": versus.get("high"),
                "vs_top": (r.get("vs_top") or {}).get("ratio"),  # against the best recommended (deploy's choice)
                "vs_top_ci95_low": (r.get("vs_top") or {}).get("low"),
                "vs_top_ci95_high": (r.get("vs_top") or {}).get("high"),
                "tied_with": r.get("tied_with"),
                "evals": ", ".join(f"{e}: {s}" for e, s in r["evals"].items()),
                "time_vs_unscaled": (r["time"] or {}).get("ratio"),
                "time_vs_unscaled_ci95_low": (r["time"] or {}).get("low"),
                "time_vs_unscaled_ci95_high": (r["time"] or {}).get("high"),
                "memory_vs_unscaled": r["memory"],
                "best_for_engines": ", ".join(r.get("best_for") or []),
                "note": "; ".join(
                    n
                    for n in (
                        f"metrics disagree ({r['disagree']})" if r["disagree"] else r.get("why", ""),
                        f"not judged: {', '.join(r.get('unjudged') or {})}" if r.get("unjudged") else "",
                    )
                    if n
                ),
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
            + (f"  (tied with {row['tied_with']})" if row["tied_with"] else "")
            + (f"  cost: {cost}" if cost else "")
            + (f"  [{row['note']}]" if row["note"] else "")
        )
    return lines
