"""The report uploaded to W&B: one run of the sweep's group (job type ``report``) with the verdict, ranking and
job tables, the answers as summary keys, the figures and report.html as an artifact."""

from __future__ import annotations

import csv
from pathlib import Path


def log_report(config, sweep_dir: Path, written: list[Path]) -> None:
    """The sweep's report as one W&B run of the sweep's group (job type ``report``): the verdict and job tables,
    the figures, and report.html as an artifact."""
    from ..core.run.tracking import Tracker, sweep_group

    logger = config.get("logger")
    if logger is None or logger.get("name") == "none":
        return
    tracker = Tracker(
        logger,
        {"sweep_dir": str(sweep_dir)},
        sweep_dir,
        f"report-{sweep_dir.name}",
        sweep_group(sweep_dir),
        tags=["report"],
        job_type="report",
    )
    if tracker.run is None:
        return
    by_name = {p.name: p for p in written}
    for name in ("report_ranking.csv", "report_verdict.csv", "report.csv"):
        if name in by_name:
            with open(by_name[name]) as handle:
                rows = list(csv.DictReader(handle))
            tracker.table(name.removesuffix(".csv"), rows)
            if name == "report_verdict.csv":  # the answer per strategy, as summary columns of the group's runs table
                tracker.summary(
                    {f"verdict/{r['eval']}/{r['strategy']}": r["verdict"] for r in rows if r.get("verdict")}
                )
            if name == "report_ranking.csv":  # the ranked answer: each strategy's place and state at the target
                tracker.summary(
                    {f"rank/{r['model']}@{r['target']}/{r['strategy']}": f"{r['rank']}: {r['answer']}" for r in rows}
                )
    if "report_answer.txt" in by_name:  # the one-line answers, first thing in the report run's summary
        tracker.summary({"answer": by_name["report_answer.txt"].read_text().strip()})
    for path in written:
        if path.suffix == ".png":
            tracker.image(path.stem, path)
    if "report.html" in by_name:
        tracker.artifact(by_name["report.html"], f"report-{sweep_dir.name}")
    tracker.finish(0)
