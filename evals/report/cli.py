"""A local comparison report over any number of runs and sweeps (no W&B needed), answering the question a
user comes with: does each strategy keep the model working at each length, against the unscaled model?

    python -m evals.report multirun/2026-11-22/20-30-00 [more dirs ...] [--out DIR] [--tolerance 0.1] [--retained 0.85]

Reads every results.json under the given directories -- one row per job identity (its key; a resumed copy
of a finished job is the same row), failed / interrupted / dead / running jobs and unreadable files listed
with their reasons -- and writes into ``--out`` (default: the first directory):

- the verdict of every job (evals/core/decision/verdict.py, the rule a job applies at its end): each strategy judged
  against the unscaled run *comparable* with it -- same model, data content, protocol, documents, tokens
  scored, stride ... (the job's comparison key, recorded in results.json); a run with no comparable
  unscaled run is named with what differs, never compared silently; a reference from other code or
  package versions is used with a note. The thresholds are the runs' own (``verdict.*``) unless given here.
- ``report.md``, ``report.csv`` (one row per job: measurements, verdicts, what was compared) and
  ``report_verdict.csv``; short-context retention; the agreement between metrics across strategies beyond
  the trained context (Spearman and Pearson, scipy).
- figures (PNG and SVG): each declared metric by length, one line per run in its strategy's colour, with
  its interval, the trained and target lengths, and a value / unscaled panel with the verdict's limit;
  retrieval heatmaps on one colour scale; the expected RoPE decay of every strategy.
- ``report.html``: all of it in one self-contained page (opens offline) with interactive charts.

It also runs at the end of every multirun (``ReportCallback``, conf/hydra/default.yaml): the verdict table is
printed, the report is logged to W&B as a run of the sweep's group, and the sweep exits non-zero when one
of its own jobs did not finish.
"""

# The docstring above is the help text of ``python -m evals.report --help`` (main reads it).

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from ..core.files import unwritable
from .write import write_report


def main(argv: list[str]) -> int:
    """``python -m evals.report``: check the arguments (exit 2 with one line when they are wrong), write the
    report, print the paths written; 0 when written."""
    parser = argparse.ArgumentParser(
        prog="python -m evals.report",
        description=__doc__.replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dirs", nargs="+", type=Path, help="run or sweep directories (searched recursively)")
    parser.add_argument("--out", type=Path, help="where to write the report (default: the first directory)")
    parser.add_argument(
        "--tolerance", type=float, help="lower-is-better metrics pass at most (1 + this) x the unscaled value"
    )
    parser.add_argument(
        "--retained", type=float, help="higher-is-better metrics pass at least this x the unscaled value"
    )
    args = parser.parse_args(argv)
    missing = [str(d) for d in args.dirs if not d.is_dir()]
    if missing:
        print(f"error: not a directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    target = args.out if args.out is not None else args.dirs[0]
    problem = unwritable(target)
    if problem:
        print(
            f"error: the report cannot be written to {target}: {problem}; give a writable directory with --out",
            file=sys.stderr,
        )
        return 2
    for name, value, ok in (
        ("--tolerance", args.tolerance, lambda v: v >= 0),
        ("--retained", args.retained, lambda v: 0 < v <= 1),
    ):
        if value is not None and not (math.isfinite(value) and ok(value)):
            print(f"error: {name}={value} is out of range (--tolerance >= 0, 0 < --retained <= 1)", file=sys.stderr)
            return 2
    try:
        for path in write_report(args.dirs, args.out, args.tolerance, args.retained, print_verdict=True):
            print(path)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
