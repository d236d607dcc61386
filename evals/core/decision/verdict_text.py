"""The verdict as a user reads it: one job's, one line per length (:func:`format_job`, at the end of a run), and
a strategies x lengths table of verdicts (:func:`format_table`, the report's); the rule itself is
:mod:`evals.core.decision.verdict`.
"""

from __future__ import annotations


def multiple(length: int, trained: int) -> str:
    """``16384`` on a model trained at 8192 -> ``2x``; ``12288`` -> ``1.5x``."""
    ratio = length / trained
    return f"{ratio:.3g}x"


def word(verdict) -> str:
    """A state as printed, in the one vocabulary: ``yes``, ``NO``, ``inconclusive`` (the interval straddles the limit)
    and ``not judged`` (``?``: nothing could be compared; the reason beside it); a bool or None: yes / NO / not
    judged."""
    if isinstance(verdict, str):
        return "not judged" if verdict == "?" else verdict
    return {True: "yes", False: "NO", None: "not judged"}[verdict]


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
    for dropped in judgement.get("dropped") or []:  # what the numbers leave out (evals/core/run/output.py dropped)
        lines.append(f"  dropped: {dropped}")
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
        state = word(summary.get("verdict_state", summary["verdict"]))
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


def lever(unit: str, eval_name: str | None, blocks_of_one: bool) -> str:
    """What to change so that a comparison below the fewest units it decides on gets enough of them (the options a
    user types)."""
    if blocks_of_one:
        return "more documents (eval.documents=null takes every document of the data) or longer text"
    if "prompt" in unit:
        where = f"eval.{eval_name}.trials" if eval_name else "more trials"
        return f"more prompts ({where}=N)"
    return "more documents (eval.documents=null takes every document of the data, or data with more of them)"
