"""A local comparison report for a sweep directory (no W&B needed).

    python -m evals.report multirun/2026-11-22/20-30-00

Writes next to the runs: ``report.md`` and ``report.csv`` (a row per job: model, strategy, factor,
ppl at each length, effective length, retrieval accuracy by length), ``report_perplexity.png``
(ppl vs length, one line per job) and ``report_<task>_heatmaps.png`` (heatmaps side by side).
Also runs at the end of every multirun, through ``ReportCallback`` (conf/hydra/default.yaml).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from hydra.experimental.callback import Callback

from .plots import heatmaps, line_plot

RETRIEVAL = ("needle", "passkey")


def load_jobs(sweep_dir: Path) -> list[dict]:
    jobs = []
    for path in sorted(Path(sweep_dir).glob("*/results.json")) + sorted(Path(sweep_dir).glob("results.json")):
        try:
            data = json.loads(path.read_text())
        except ValueError:
            continue
        data["dir"] = path.parent
        jobs.append(data)
    return jobs


def job_row(job: dict) -> dict:
    config, metrics = job.get("config", {}), job.get("metrics", {})
    scaling = dict(config.get("scaling", {}))
    used = (job.get("rope") or {}).get("scaling", scaling)
    row = {"job": job["dir"].name, "status": job.get("status"), "model": config.get("model", {}).get("name"),
           "strategy": scaling.get("name"), "factor": used.get("factor") if scaling.get("name") != "none" else None,
           "base": used.get("base")}
    ppl = metrics.get("perplexity") or {}
    for r in ppl.get("by_length", []):
        row[f"ppl@{r['length']}"] = r["ppl"]
    if ppl:
        row["effective_length"] = ppl.get("effective_length")
    for task in RETRIEVAL:
        for key, value in (metrics.get(task) or {}).items():
            if key.startswith(f"{task}_acc@") or key in (f"{task}_mean_acc", f"{task}_max_length_at_threshold"):
                row[key] = value
    row["model_load_s"] = job.get("timings", {}).get("model_load_s")
    row["elapsed_s"] = job.get("timings", {}).get("elapsed_s")
    return row


def strategy_label(row: dict) -> str:
    """e.g. ``yarn x2``, ``none``."""
    return f"{row['strategy']}" + (f" x{row['factor']:g}" if row["factor"] else "")


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "" if value is None else str(value)


def write_report(sweep_dir: Path) -> list[Path]:
    sweep_dir = Path(sweep_dir)
    jobs = load_jobs(sweep_dir)
    if not jobs:
        raise FileNotFoundError(f"no results.json under {sweep_dir}")
    job_rows = [job_row(job) for job in jobs]
    # the unscaled baseline first, then strategies by name and factor
    rows = sorted(job_rows, key=lambda r: (str(r["model"]), r["strategy"] != "none", str(r["strategy"]), r["factor"] or 0))
    columns = list(dict.fromkeys(k for r in rows for k in r))
    written = [sweep_dir / "report.csv", sweep_dir / "report.md"]
    with open(written[0], "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    lines = [f"# rope_ext report: {sweep_dir}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |" for r in rows]
    written[1].write_text("\n".join(lines) + "\n")

    curves = {}
    for job, row in zip(jobs, job_rows):
        by_length = ((job.get("metrics") or {}).get("perplexity") or {}).get("by_length", [])
        scored = [r for r in by_length if r["ppl"] is not None]
        if scored:
            curves[f"{row['model']} {strategy_label(row)}"] = ([r["length"] for r in scored], [r["ppl"] for r in scored])
    if curves:
        trained = jobs[0]["config"].get("model", {}).get("original_max_position")
        written.append(line_plot(sweep_dir / "report_perplexity.png", curves, xlabel="context length (tokens)",
                                 ylabel="perplexity", title="Perplexity by length", logx=True, logy=True,
                                 vline=trained, vlabel=f"trained {trained}"))
    for task in RETRIEVAL:
        panels = []
        for job, row in zip(jobs, job_rows):
            cells = ((job.get("metrics") or {}).get(task) or {}).get("cells")
            if cells:
                lengths, depths = sorted({c["length"] for c in cells}), sorted({c["depth"] for c in cells})
                value = {(c["length"], c["depth"]): c["accuracy"] for c in cells}
                grid = [[value.get((L, d), float("nan")) for L in lengths] for d in depths]
                panels.append((strategy_label(row), grid, lengths, depths, job["config"]["model"].get("original_max_position")))
        if panels:
            written.append(heatmaps(sweep_dir / f"report_{task}_heatmaps.png", panels))
    return written


class ReportCallback(Callback):
    """Hydra callback: write the report when a multirun ends."""

    def on_multirun_end(self, config, **kwargs) -> None:
        try:
            for path in write_report(Path(config.hydra.sweep.dir)):
                print(f"report: {path}")
        except FileNotFoundError as err:
            print(f"report: {err}")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m evals.report <sweep or run directory>", file=sys.stderr)
        return 2
    try:
        for path in write_report(Path(argv[0])):
            print(path)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
