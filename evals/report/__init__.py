"""The comparison report over any number of runs and sweeps: does each strategy keep the model working at each
length, against the unscaled model? Written by ``python -m evals.report DIR [DIR ...]`` and at the end of every
multirun. Where each part lives:

- load.py: every results.json under the directories, one job per identity
- judge.py: the verdict of every job against its comparable unscaled run; the answer rows, retention
- agreement.py: the correlations between metrics beyond the trained context
- tables.py: the job and verdict tables, markdown and CSV, the verdict as printed
- figures.py: the figures by length and each eval's own (PNG, SVG)
- sections.py: each section of report.md and report.html
- page.py: report.html -- its CSS, tables and page; charts.py: its interactive length charts
- write.py: ``write_report``, the whole report into a directory
- cli.py (``python -m evals.report``; its help says what the report holds), callback.py (Hydra, at a multirun's
  end), wandb_upload.py (the report as a W&B run), sweep.py (a sweep's size and preflight)
"""

from .callback import ReportCallback
from .cli import main
from .judge import judge_all
from .load import load_jobs
from .sweep import target_preflight
from .wandb_upload import log_report
from .write import write_report

__all__ = ["ReportCallback", "judge_all", "load_jobs", "log_report", "main", "target_preflight", "write_report"]
