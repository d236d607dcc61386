"""A local comparison report over any number of runs and sweeps (no W&B needed).

    python -m evals.report multirun/2026-11-22/20-30-00 [more dirs ...] [--out DIR]

Reads every ``results.json`` under the given directories -- one row per job identity (its key: model,
weights, data, eval, strategy and its parameters...; a resumed copy of a finished job is the same row),
lengths in order, failed / interrupted / dead / running jobs listed with their errors -- and writes into
``--out`` (default: the first directory):

- ``report.csv`` and ``report.md``: the table; short-context retention of each strategy against the unscaled
  job of the same model and data (ppl and accuracy at lengths up to the trained context, as LongRoPE2,
  arXiv 2502.20082, reports it); the agreement between metrics across jobs at each length beyond the
  trained context (Spearman and Pearson, scipy): does perplexity predict retrieval on this model?
- ``report_<figure>.png``: ppl vs length per job with its 95% interval band and the trained length;
  needle/passkey heatmaps side by side on one colour scale; retrieval accuracy vs length; the expected
  RoPE decay of every strategy in one figure.
- ``report.html``: all of it in one self-contained page (figures embedded), to open offline.

Also runs at the end of every multirun, through :class:`ReportCallback` (conf/hydra/default.yaml), which
makes the sweep exit non-zero when a job did not finish.
"""

from __future__ import annotations

import argparse
import base64
import csv
import html
import io
import math
import re
import sys
from pathlib import Path

from hydra.experimental.callback import Callback

from .core.cache import atomic_write
from .core.plots import heatmaps, length_figure, plt
from .core.retention import retention_of
from .core.rundir import read_results, state

RETRIEVAL = ("needle", "passkey")
FIXED = ["model", "weights", "data", "eval", "strategy", "state"]


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


def one_per_identity(jobs: list[dict]) -> list[dict]:
    """One job per key: a finished original over a resumed copy over an unfinished attempt."""
    rank = {"done": 0, "running": 2, "interrupted": 3, "dead": 3, "failed": 4}
    best: dict[str, dict] = {}
    keyless = []
    for job in jobs:
        key = (job.get("job") or {}).get("key")
        if key is None:
            keyless.append(job)
            continue
        score = (rank.get(job["state"], 5), "resumed_from" in job)
        if key not in best or score < best[key]["_score"]:
            best[key] = {**job, "_score": score}
    return [*best.values(), *keyless]


def _length_key(column: str):
    match = re.search(r"@(\d+)$", column)
    return (column[: match.start()], int(match.group(1))) if match else (column, -1)


def job_row(job: dict) -> dict:
    info, config = job.get("job") or {}, job.get("config") or {}
    scaling, model = config.get("scaling") or {}, config.get("model") or {}
    row = {"model": info.get("model_label") or model.get("name"), "weights": info.get("weights") or model.get("weights"),
           "data": info.get("data") or (config.get("data") or {}).get("name"),
           "eval": info.get("eval") or (config.get("eval") or {}).get("name"),
           "strategy": info.get("scaling") or scaling.get("label") or scaling.get("name"), "state": job["state"],
           "trained": info.get("trained_context")}
    summary = job.get("summary") or {}
    if not summary:  # an unfinished run: what it measured before it stopped
        by_length = ((job.get("metrics") or {}).get("perplexity") or {}).get("by_length", [])
        summary = {f"ppl@{r['length']}": r["ppl"] for r in by_length if r.get("documents")}
    for key, value in summary.items():
        if "@" in key and isinstance(value, (int, float, type(None))) and not key.startswith(("tokens@", "ppl_ci95")):
            row[key] = value
    for key in ("effective_length", "needle_max_length_at_threshold", "passkey_max_length_at_threshold",
                "ruler_effective_length"):
        if key in summary:
            row[key] = summary[key]
    row["elapsed_s"] = (job.get("timings") or {}).get("elapsed_s")
    row["dir"] = str(job["dir"])
    row["key"] = info.get("key")
    row["error"] = ((job.get("error") or {}).get("message") or "") if job["state"] != "done" else ""
    return row


def _columns(rows: list[dict]) -> list[str]:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    measured = sorted((k for k in keys if "@" in k), key=_length_key)
    rest = [k for k in keys if k not in FIXED and k not in measured and k not in ("dir", "key", "error", "trained")]
    return FIXED + measured + rest + ["dir", "key", "error"]


def _fmt(value) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}"
    return "" if value is None else str(value)


def _group(row) -> tuple:
    return row["model"], row["weights"], row["data"], row["eval"]


def retention(rows: list[dict]) -> list[dict]:
    """Each strategy's metrics at lengths <= the trained context relative to the unscaled job of the same
    model, weights, data and eval: ppl_none / ppl and acc / acc_none (1 = nothing lost)."""
    baselines = {_group(r): r for r in rows if r["strategy"] == "none" and r["state"] == "done"}
    found = []
    for row in rows:
        base = baselines.get(_group(row))
        if row["strategy"] == "none" or row["state"] != "done" or base is None:
            continue
        out = {"model": row["model"], "data": row["data"], "eval": row["eval"], "strategy": row["strategy"],
               **retention_of(row, base, row["trained"])}
        if len(out) > 4:
            found.append(out)
    return found


AGREEMENT = ("ppl", "longppl", "needle_acc", "passkey_acc", "ruler", "needle_nll")


def agreement(rows: list[dict]) -> list[dict]:
    """Across finished jobs (same model, weights, data), at each length beyond the trained context: the
    Spearman and Pearson correlation between every two metrics measured there by at least three jobs."""
    from scipy import stats

    found = []
    by_group: dict[tuple, list[dict]] = {}
    for row in rows:
        if row["state"] == "done":
            by_group.setdefault((row["model"], row["weights"], row["data"]), []).append(row)
    for (model, weights, data), members in by_group.items():
        merged: dict[str, dict[str, float]] = {}  # strategy -> metric@L -> value (a suite's evals merge)
        for row in members:
            merged.setdefault(row["strategy"], {}).update(
                {k: v for k, v in row.items() if "@" in k and isinstance(v, (int, float)) and v is not None})
        trained = max((r["trained"] or 0) for r in members)
        lengths = sorted({int(k.split("@")[1]) for m in merged.values() for k in m if int(k.split("@")[1]) > trained})
        for L in lengths:
            present = [m for m in AGREEMENT if sum(f"{m}@{L}" in v for v in merged.values()) >= 3]
            for i, a in enumerate(present):
                for b in present[i + 1:]:
                    pairs = [(v[f"{a}@{L}"], v[f"{b}@{L}"]) for v in merged.values() if f"{a}@{L}" in v and f"{b}@{L}" in v]
                    xs, ys = zip(*pairs)
                    if len(pairs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
                        continue
                    spearman, pearson = stats.spearmanr(xs, ys), stats.pearsonr(xs, ys)
                    found.append({"model": model, "data": data, "length": L, "metrics": f"{a} vs {b}", "jobs": len(pairs),
                                  "spearman": float(spearman.statistic), "spearman_p": float(spearman.pvalue),
                                  "pearson": float(pearson.statistic), "pearson_p": float(pearson.pvalue)})
    return found


def _label(job: dict, jobs: list[dict]) -> str:
    """The strategy and model; the directory when two jobs would read the same."""
    info = job.get("job") or {}
    label = f"{info.get('model_label')} {info.get('scaling')}"
    twins = [j for j in jobs if f"{(j.get('job') or {}).get('model_label')} {(j.get('job') or {}).get('scaling')}" == label]
    return label if len(twins) == 1 else f"{label} ({job['dir'].name})"


def perplexity_figure(jobs: list[dict]):
    curves = [(_label(job, jobs), ((job.get("metrics") or {}).get("perplexity") or {}).get("by_length", []),
               (job.get("job") or {}).get("trained_context")) for job in jobs]
    curves = [c for c in curves if any(r.get("ppl") is not None for r in c[1])]
    return length_figure(curves, "ppl", ylabel="perplexity (band: 95% interval)", title="Perplexity by length",
                         band=("ci95_low", "ci95_high"), logy=True) if curves else None


def retrieval_figures(jobs: list[dict]) -> dict:
    """Per task: heatmaps side by side on one colour scale, and accuracy against length."""
    figures = {}
    for task in RETRIEVAL:
        panels, curves = [], []
        for job in jobs:
            metrics = (job.get("metrics") or {}).get(task) or {}
            cells = metrics.get("cells")
            if not cells:
                continue
            lengths, depths = sorted({c["length"] for c in cells}), sorted({c["depth"] for c in cells})
            value = {(c["length"], c["depth"]): c["accuracy"] for c in cells}
            grid = [[float("nan") if value.get((L, d)) is None else value[(L, d)] for L in lengths] for d in depths]
            trained = (job.get("job") or {}).get("trained_context")
            panels.append((_label(job, jobs), grid, lengths, depths, trained))
            curves.append((_label(job, jobs), metrics.get("by_length", []), trained))
        if panels:
            figures[f"{task}_heatmaps"] = heatmaps(panels)
            figures[f"{task}_accuracy"] = length_figure(curves, "accuracy", ylabel="accuracy", ylim=(-0.05, 1.05),
                                                        title=f"{task}: accuracy by length")
    return figures


def decay_figure(jobs: list[dict]):
    """The expected decay of every strategy of the jobs (one line each; ``none`` once) per q/k distribution."""
    from .rope_decay import decay_figure as draw

    curves, vectors, trained, target = {}, [], None, None
    for job in jobs:
        metrics = (job.get("metrics") or {}).get("rope_decay") or {}
        for studied in (metrics.get("studied") or {}).values():
            for label, by_vector in studied["curves"].items():
                name = label if label == "none" else _label(job, jobs)
                curves.setdefault(name if label != "none" else f"none (d={studied['dim']}, base={studied['base']:g})", by_vector)
                vectors = vectors or [{"label": v} for v in by_vector]
            trained, target = trained or metrics.get("trained_context"), target or metrics.get("target_length")
    return draw(curves, vectors, trained, target, "Expected RoPE decay, every strategy") if curves else None


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _md_table(rows: list[dict], columns: list[str]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(_fmt(r.get(c)).replace("|", "/") for c in columns) + " |" for r in rows]


def _html_table(rows: list[dict], columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        f"<tr class=\"{html.escape(str(r.get('state', 'done')))}\">" + "".join(
            f"<td>{html.escape(_fmt(r.get(c)))}</td>" for c in columns) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


STYLE = """body{font-family:system-ui,sans-serif;margin:24px;color:#222} table{border-collapse:collapse;margin:8px 0 24px;
font-size:12px} th,td{border:1px solid #ccc;padding:3px 6px;text-align:right;white-space:nowrap} th{background:#f0f0f0}
td:nth-child(-n+6){text-align:left} tr.failed,tr.dead,tr.interrupted{background:#fde2e2} tr.running{background:#fff6d6}
img{max-width:100%;border:1px solid #ddd;margin:6px 0 18px} h2{margin-top:28px} .note{color:#666;font-size:12px}"""


def write_report(dirs, out: Path | None = None) -> list[Path]:
    dirs = [Path(d) for d in dirs]
    out = Path(out or dirs[0])
    jobs = one_per_identity(load_jobs(dirs))
    if not jobs:
        raise FileNotFoundError(f"no results.json under {', '.join(map(str, dirs))}")
    pairs = sorted(((job_row(job), job) for job in jobs),  # by model, weights, data, eval; the unscaled job first
                   key=lambda p: (tuple(map(str, _group(p[0]))), p[0]["strategy"] != "none", str(p[0]["strategy"])))
    rows, jobs = [p[0] for p in pairs], [p[1] for p in pairs]
    columns = _columns(rows)
    out.mkdir(parents=True, exist_ok=True)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    written = [out / "report.csv", out / "report.md", out / "report.html"]
    atomic_write(written[0], buffer.getvalue())

    kept, sections_md, sections_html = retention(rows), [], []
    failed = [r for r in rows if r["state"] != "done"]
    if failed:
        sections_md += ["", f"## Not finished: {len(failed)} of {len(rows)} jobs", ""]
        sections_md += [f"- {r['state']}: {r['dir']}: {r['error'] or '(no error recorded)'}" for r in failed]
        sections_html.append(f"<h2>Not finished: {len(failed)} of {len(rows)} jobs</h2><ul>" + "".join(
            f"<li><b>{html.escape(r['state'])}</b>: {html.escape(r['dir'])}: {html.escape(r['error'] or '(no error recorded)')}</li>"
            for r in failed) + "</ul>")
    if kept:
        cols = list(dict.fromkeys(k for r in kept for k in r))
        cols = cols[:4] + sorted(cols[4:], key=_length_key)
        sections_md += ["", "## Short-context retention (vs the unscaled job; 1 = nothing lost)", "", *_md_table(kept, cols)]
        sections_html.append("<h2>Short-context retention</h2><p class=note>Each strategy at lengths up to the trained "
                             "context relative to the unscaled job of the same model and data (ppl: none/strategy; "
                             "accuracy: strategy/none); 1 = nothing lost.</p>" + _html_table(kept, cols))
    agree = agreement(rows)
    if agree:
        cols = list(agree[0])
        sections_md += ["", "## Agreement between metrics beyond the trained context", "", *_md_table(agree, cols)]
        sections_html.append("<h2>Agreement between metrics beyond the trained context</h2><p class=note>Across the "
                             "jobs of one model and data, at each length: does perplexity rank strategies like "
                             "retrieval does?</p>" + _html_table(agree, cols))
    figures = {"perplexity": perplexity_figure(jobs), **retrieval_figures(jobs), "decay": decay_figure(jobs)}
    images = {}
    for name, fig in figures.items():
        if fig is not None:
            images[name] = _png(fig)
            written.append(out / f"report_{name}.png")
            atomic_write(written[-1], images[name])
    title = f"rope_ext report: {', '.join(map(str, dirs))}"
    md = [f"# {title}", "", *_md_table(rows, columns), *sections_md, "", *[f"![{n}](report_{n}.png)" for n in images]]
    atomic_write(written[1], "\n".join(md) + "\n")
    page = [f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title><style>{STYLE}</style>"
            f"</head><body><h1>{html.escape(title)}</h1><p class=note>{len(rows)} jobs; one row per job identity; lengths "
            "in order.</p>", _html_table(rows, columns), *sections_html, "<h2>Figures</h2>"]
    page += [f"<figure><img alt=\"{n}\" src=\"data:image/png;base64,{base64.b64encode(data).decode()}\">"
             f"<figcaption>{n}</figcaption></figure>" for n, data in images.items()]
    atomic_write(written[2], "\n".join(page) + "</body></html>\n")
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
