"""The whole report written into a directory: the jobs loaded (load.py) and judged (judge.py), the CSVs
(report.csv, report_verdict.csv, report_ranking.csv) and report_answer.txt, the verdict printed, the figures,
report.md and report.html (page.py)."""

from __future__ import annotations

from pathlib import Path

from ..core.files import atomic_write
from ..core.decision.ranking import answer_text, format_group, rank
from ..core.decision.ranking import table as ranking_table
from .figures import metric_figures, save_figures, section_figures
from .judge import criteria_from, dropped_lines, judge_all, verdict_rows
from .load import in_report_order, load_jobs, one_per_identity
from .page import render_page
from .sections import report_sections
from .tables import csv_text, flat_verdict_rows, job_columns, job_row, markdown_table, varying_fields, verdict_text


def write_report(
    dirs,
    out: Path | None = None,
    tolerance: float | None = None,
    retained: float | None = None,
    print_verdict: bool = False,
) -> list[Path]:
    """The report over every results.json under ``dirs``, written into ``out`` (default: the first directory)
    with the given verdict thresholds (default: the runs' own); the verdict tables printed when asked. Returns
    the paths written (report.csv, report.md, report.html, report_verdict.csv first); FileNotFoundError when
    there is no results.json."""
    dirs = [Path(d) for d in dirs]
    out = Path(out or dirs[0])
    loaded = load_jobs(dirs)
    jobs = one_per_identity(loaded)
    if not jobs:
        raise FileNotFoundError(f"no results.json under {', '.join(map(str, dirs))}")
    jobs = in_report_order(jobs)
    criteria = criteria_from(jobs, tolerance, retained)
    verdicts, references, warnings = judge_all(jobs, criteria)
    varying = varying_fields(jobs)
    rows = [{**job_row(job, verdicts.get(i)), **varying.get(i, {})} for i, job in enumerate(jobs)]
    columns = job_columns(rows)
    out.mkdir(parents=True, exist_ok=True)
    answer = verdict_rows(jobs, verdicts)
    written = [out / "report.csv", out / "report.md", out / "report.html", out / "report_verdict.csv"]
    atomic_write(written[0], csv_text(rows, columns))
    flat_answer = flat_verdict_rows(answer)
    atomic_write(written[3], csv_text(flat_answer, list(flat_answer[0]) if flat_answer else ["model"]))
    ranked = rank(jobs, verdicts)
    ranking_rows = [row for group in ranked for row in ranking_table(group)]
    if ranking_rows:
        written.append(out / "report_ranking.csv")
        atomic_write(written[-1], csv_text(ranking_rows, list(dict.fromkeys(k for r in ranking_rows for k in r))))
        written.append(out / "report_answer.txt")
        left_out = [f"  {line}\n" for job in jobs for line in dropped_lines(job)]  # said with the answer it qualifies
        atomic_write(written[-1], "".join(answer_text(group) for group in ranked) + "".join(left_out))
    if print_verdict and answer:
        print("\n".join(verdict_text(answer)))
        for group in ranked:
            print("\n" + "\n".join(format_group(group)))
        for warning in warnings:
            print(f"warning: {warning}")

    sections_md, sections_html = report_sections(
        dirs, jobs, verdicts, rows, answer, flat_answer, ranked, warnings, criteria
    )
    figures, charts = metric_figures(jobs, verdicts, references, criteria)
    figures.update(section_figures(jobs))
    saved, images = save_figures(figures, out)
    written += saved
    title = f"rope_ext report: {', '.join(map(str, dirs))}"
    md = [
        f"# {title}",
        "",
        f"{len(rows)} jobs; one row per job identity.",
        *sections_md,
        "",
        "## Jobs",
        "",
        *markdown_table(rows, columns),
        "",
        *[f"![{n}](report_{n}.png)" for n in images],
    ]
    atomic_write(written[1], "\n".join(md) + "\n")
    atomic_write(written[2], render_page(title, sections_html, charts, rows, columns, images))
    return written
