"""A local comparison report over runs and sweeps (no W&B needed).

    python -m evals.report multirun/2026-11-22/20-30-00 [more dirs ...] [--out DIR]

Reads every ``results.json`` under the given directories and writes, into ``--out`` (default: the first
directory): ``report.md`` and ``report.csv`` (one row per job identity -- model, weights, data, eval,
strategy and its parameters --, lengths in order; failed, interrupted, dead and running jobs listed with
their errors), ``report_perplexity.png`` (ppl vs length, one line per job) and ``report_<task>_heatmaps.png``.
Also runs at the end of every multirun, through :class:`ReportCallback` (conf/hydra/default.yaml), which
makes the sweep exit non-zero when a job failed.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
from pathlib import Path

from hydra.experimental.callback import Callback

from .core.cache import atomic_write
from .core.plots import heatmaps, line_plot
from .core.rundir import read_results, state

RETRIEVAL = ("needle", "passkey")


def load_jobs(dirs) -> list[dict]:
    """Every results.json under ``dirs`` (each read once), with its directory and current state."""
    jobs, seen = [], set()
    for root in dirs:
        for path in sorted(Path(root).glob("**/results.json")):
            if path.resolve() in seen:
                continue
            seen.add(path.resolve())
            data = read_results(path)
            if data is None:
                continue
            data["dir"], data["state"] = path.parent, state(data)
            jobs.append(data)
    return jobs


def _length_key(column: str):
    match = re.search(r"@(\d+)$", column)
    return (column[: match.start()], int(match.group(1))) if match else (column, -1)


def job_row(job: dict) -> dict:
    info, config, metrics = job.get("job") or {}, job.get("config") or {}, job.get("metrics") or {}
    scaling = config.get("scaling") or {}
    model = config.get("model") or {}
    row = {"job": str(job["dir"]), "state": job["state"],
           "model": info.get("model_label") or model.get("name"), "weights": info.get("weights") or model.get("weights"),
           "data": info.get("data") or (config.get("data") or {}).get("name"),
           "eval": info.get("eval") or (config.get("eval") or {}).get("name"),
           "strategy": info.get("scaling") or scaling.get("label") or scaling.get("name"),
           "key": info.get("key")}
    ppl = metrics.get("perplexity") or {}
    for r in ppl.get("by_length", []):
        row[f"ppl@{r['length']}"] = r["ppl"]
    if ppl:
        row["effective_length"] = ppl.get("effective_length")
    for task in RETRIEVAL:
        for key, value in (metrics.get(task) or {}).items():
            if key.startswith(f"{task}_acc@") or key in (f"{task}_mean_acc", f"{task}_max_length_at_threshold"):
                row[key] = value
    row["error"] = ((job.get("error") or {}).get("message") or "") if job["state"] != "done" else ""
    row["elapsed_s"] = (job.get("timings") or {}).get("elapsed_s")
    return row


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "" if value is None else str(value)


def _columns(rows: list[dict]) -> list[str]:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    fixed = ["model", "weights", "data", "eval", "strategy", "state"]
    measured = sorted((k for k in keys if "@" in k), key=_length_key)
    rest = [k for k in keys if k not in fixed and k not in measured and k not in ("job", "key", "error")]
    return fixed + measured + rest + ["job", "key", "error"]


def write_report(dirs, out: Path | None = None) -> list[Path]:
    dirs = [Path(d) for d in dirs]
    out = Path(out or dirs[0])
    jobs = load_jobs(dirs)
    if not jobs:
        raise FileNotFoundError(f"no results.json under {', '.join(map(str, dirs))}")
    rows = sorted((job_row(job) for job in jobs),
                  key=lambda r: (str(r["model"]), str(r["eval"]), r["strategy"] != "none", str(r["strategy"])))
    columns = _columns(rows)
    out.mkdir(parents=True, exist_ok=True)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    written = [out / "report.csv", out / "report.md"]
    atomic_write(written[0], buffer.getvalue())
    lines = [f"# rope_ext report: {', '.join(map(str, dirs))}", "", "| " + " | ".join(columns) + " |",
             "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(r.get(c)).replace("|", "/") for c in columns) + " |" for r in rows]
    failed = [r for r in rows if r["state"] != "done"]
    if failed:
        lines += ["", f"## Not finished: {len(failed)} of {len(rows)} jobs", ""]
        lines += [f"- {r['state']}: {r['job']}: {r['error'] or '(no error recorded)'}" for r in failed]
    atomic_write(written[1], "\n".join(lines) + "\n")
    written += _figures(jobs, out)
    return written


def _label(job: dict) -> str:
    info = job.get("job") or {}
    return f"{info.get('model_label')} {info.get('scaling')}"


def _figures(jobs: list[dict], out: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    written, curves = [], {}
    for job in jobs:
        by_length = ((job.get("metrics") or {}).get("perplexity") or {}).get("by_length", [])
        scored = [r for r in by_length if r["ppl"] is not None]
        if scored:
            curves[f"{_label(job)} ({job['dir'].name})"] = ([r["length"] for r in scored], [r["ppl"] for r in scored])
    if curves:
        trained = next((j.get("job") or {}).get("trained_context") for j in jobs)
        fig = line_plot(curves, xlabel="context length (tokens)", ylabel="perplexity", title="Perplexity by length",
                        logx=True, logy=True, vline=trained, vlabel=f"trained {trained}")
        written.append(out / "report_perplexity.png")
        fig.savefig(written[-1], dpi=120, bbox_inches="tight")
        plt.close(fig)
    for task in RETRIEVAL:
        panels = []
        for job in jobs:
            cells = ((job.get("metrics") or {}).get(task) or {}).get("cells")
            if cells:
                lengths, depths = sorted({c["length"] for c in cells}), sorted({c["depth"] for c in cells})
                value = {(c["length"], c["depth"]): c["accuracy"] for c in cells}
                grid = [[float("nan") if value.get((L, d)) is None else value[(L, d)] for L in lengths] for d in depths]
                panels.append((_label(job), grid, lengths, depths, (job.get("job") or {}).get("trained_context")))
        if panels:
            written.append(out / f"report_{task}_heatmaps.png")
            fig = heatmaps(panels)
            fig.savefig(written[-1], dpi=120, bbox_inches="tight")
            plt.close(fig)
    return written


class ReportCallback(Callback):
    """Hydra callback: write the report when a multirun ends, and make the sweep exit non-zero (1) when
    any of its jobs did not finish -- after every job has run."""

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            for path in write_report([sweep_dir]):
                print(f"report: {path}")
        except FileNotFoundError as err:
            print(f"report: {err}")
            return
        failed = [j for j in load_jobs([sweep_dir]) if j["state"] != "done"]
        if failed:
            print(f"error: {len(failed)} job(s) of the sweep did not finish; see {sweep_dir / 'report.md'}",
                  file=sys.stderr)
            raise SystemExit(1)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m evals.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", type=Path, help="run or sweep directories (searched recursively)")
    parser.add_argument("--out", type=Path, help="where to write the report (default: the first directory)")
    args = parser.parse_args(argv)
    missing = [str(d) for d in args.dirs if not d.is_dir()]
    if missing:
        print(f"error: not a directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        for path in write_report(args.dirs, args.out):
            print(path)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
