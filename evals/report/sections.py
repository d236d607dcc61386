"""The report's sections, each in markdown (report.md) and HTML (report.html): the warnings, the ranked answer,
the verdict table, a search's results, the jobs that did not finish, short-context retention and the agreement
between metrics. Each function returns (markdown lines, HTML parts); empty when it has nothing to say."""

from __future__ import annotations

import html

from ..core.decision.ranking import table as ranking_table
from ..search.outputs import report_section
from .agreement import agreement
from .judge import retention
from .page import html_table
from .tables import length_order, markdown_table


def report_sections(
    dirs, jobs, verdicts, rows, answer, flat_answer, ranked, warnings, criteria
) -> tuple[list[str], list[str]]:
    """Every section in the report's order (a search's first: its trials' own verdicts come after)."""
    sections_md, sections_html = [], []
    for md, parts in (
        warnings_section(warnings),
        answer_section(ranked),
        verdict_section(answer, flat_answer, criteria),
    ):
        sections_md += md
        sections_html += parts
    search_md, search_html = report_section(dirs)  # a search's best setting and figures (evals/search)
    # a search's report leads with the search: its trials' own verdicts (at each trial's own target) come after
    sections_md, sections_html = search_md + sections_md, search_html + sections_html
    for md, parts in (unfinished_section(rows), retention_section(jobs, verdicts), agreement_section(jobs)):
        sections_md += md
        sections_html += parts
    return sections_md, sections_html


def warnings_section(warnings: list[str]) -> tuple[list[str], list[str]]:
    """What could not be compared, and why."""
    if not warnings:
        return [], []
    md = ["", "## Warnings: what could not be compared, what was dropped", "", *[f"- {w}" for w in warnings]]
    parts = [
        "<h2>Warnings: what could not be compared</h2><div class=warn><ul>"
        + "".join(f"<li>{html.escape(w)}</li>" for w in warnings)
        + "</ul></div>"
    ]
    return md, parts


def answer_section(ranked: list[dict]) -> tuple[list[str], list[str]]:
    """The ranked answer (evals/core/decision/ranking.py): which strategy at the target, one table per model and target."""
    if not ranked:
        return [], []
    rule = (
        "Recommended only when every metric declared for the verdict is judged and yes at the target (short-context "
        "checks included; a metric that could not be judged is named first), or when tied with such a strategy "
        "with only the first metric undecided against the unscaled model (said); ordered by the first metric, with "
        "the paired ratio to the best and its simultaneous 95% interval (Bonferroni over every pair) on the units "
        "both measured; a strategy whose interval against its group's leader holds 1 is tied with it, whatever its "
        "state (in the best's group exactly when its printed interval holds 1); cost = compute time and peak "
        "memory relative to the unscaled job (the reference row) of the same evals. Per engine: the "
        "best recommended strategy it can serve (python -m evals.export SWEEP --to ENGINE exports it)."
    )
    md = ["", "## The answer: which strategy at the target", "", rule, ""]
    parts = [f"<h2>The answer: which strategy at the target</h2><p class=note>{html.escape(rule)}</p>"]
    for group in ranked:
        rows_ = ranking_table(group)
        cols = list(dict.fromkeys(k for r in rows_ for k in r))
        engines = group.get("engine_lines") or []
        md += [f"**{group['answer']}**", "", *(f"- {line}" for line in engines), "", *markdown_table(rows_, cols), ""]
        parts.append(
            f"<p class=answer><b>{html.escape(group['answer'])}</b></p>"
            + ("<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in engines) + "</ul>" if engines else "")
            + html_table(rows_, cols, "ranking")
        )
    return md, parts


def verdict_section(answer: list[dict], flat_answer: list[dict], criteria: dict) -> tuple[list[str], list[str]]:
    """The verdict table with the rule it applies, and (HTML) why each answer that is not yes is not."""
    if not answer:
        return [], []
    cols = list(flat_answer[0])
    explain = (
        f"Each strategy at each length paired against the unscaled model on the same units (token blocks "
        f"of each document, prompts, samples): the ratio strategy / unscaled with its 95% interval; lower-is-"
        f"better metrics (ppl, LongPPL) pass at most {1 + criteria['tolerance']:g}, higher-is-better ones "
        f"(retrieval, RULER) at least {criteria['retained']:g} (at the same length up to the trained context, "
        f"at the trained context beyond it; beyond it the short-context checks must hold too). yes = the "
        f"whole interval within the limit, NO = beyond it, inconclusive = it straddles the limit (the reason "
        f"says how many more units would likely decide it). verdict = the answer at the target length; "
        f"effective_length = the largest length up to which every answer is yes. ? = a reference or a "
        f"length is missing (see the reason)."
    )
    md = [
        "",
        "## Verdict: does each strategy keep the model working?",
        "",
        explain,
        "",
        *markdown_table(flat_answer, cols),
    ]
    reasons = "".join(
        f"<li><b>{html.escape(str(r['strategy']))}</b> ({html.escape(str(r['eval']))}) at {L}: "
        f"{html.escape(r['reasons'][L])}</li>"
        for r in answer
        for L in sorted(r["reasons"])
        if r["verdicts"][L] not in ("yes", "reference")
    )
    parts = [
        f"<h2>Verdict: does each strategy keep the model working?</h2><p class=note>{html.escape(explain)}"
        f"</p>{html_table(flat_answer, cols, 'verdict')}"
        + (f"<details><summary>Why not yes</summary><ul class=note>{reasons}</ul></details>" if reasons else "")
    ]
    return md, parts


def unfinished_section(rows: list[dict]) -> tuple[list[str], list[str]]:
    """The jobs that did not finish, with their state and error."""
    failed = [r for r in rows if r["state"] not in ("done", "unreachable")]  # unreachable: in the answer
    if not failed:
        return [], []
    md = ["", f"## Not finished: {len(failed)} of {len(rows)} jobs", ""]
    md += [f"- {r['state']}: {r['dir']}: {r['error'] or '(no error recorded)'}" for r in failed]
    parts = [
        f"<h2>Not finished: {len(failed)} of {len(rows)} jobs</h2><ul>"
        + "".join(
            f"<li><b>{html.escape(r['state'])}</b>: {html.escape(r['dir'])}: {html.escape(r['error'] or '(no error recorded)')}</li>"
            for r in failed
        )
        + "</ul>"
    ]
    return md, parts


def retention_section(jobs: list[dict], verdicts: dict[int, dict]) -> tuple[list[str], list[str]]:
    """Short-context retention: each strategy up to the trained context relative to its unscaled run."""
    kept = retention(jobs, verdicts)
    if not kept:
        return [], []
    cols = list(dict.fromkeys(k for r in kept for k in r))
    cols = cols[:4] + sorted(cols[4:], key=length_order)
    md = [
        "",
        "## Short-context retention (vs the comparable unscaled run; 1 = nothing lost)",
        "",
        *markdown_table(kept, cols),
    ]
    parts = [
        "<h2>Short-context retention</h2><p class=note>Each strategy at lengths up to the trained "
        "context relative to the comparable unscaled run (lower-is-better metrics: unscaled/strategy; "
        "accuracies and scores: strategy/unscaled); 1 = nothing lost.</p>" + html_table(kept, cols)
    ]
    return md, parts


def agreement_section(jobs: list[dict]) -> tuple[list[str], list[str]]:
    """The agreement between metrics beyond the trained context (agreement.py)."""
    agree = agreement(jobs)
    if not agree:
        return [], []
    cols = list(agree[0])
    md = ["", "## Agreement between metrics beyond the trained context", "", *markdown_table(agree, cols)]
    parts = [
        "<h2>Agreement between metrics beyond the trained context</h2><p class=note>Across the "
        "jobs of one model and data, at each length: does perplexity rank strategies like "
        "retrieval does?</p>" + html_table(agree, cols)
    ]
    return md, parts
