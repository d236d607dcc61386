"""The Hydra callback (conf/hydra/default.yaml): a sweep's progress after each job, and at its end the report,
the verdict table printed, the report logged to W&B and a non-zero exit when one of its own jobs did not finish."""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

from hydra.experimental.callback import Callback

from ..core.run.rundir import SWEEP
from ..search import is_search
from .load import load_jobs
from .sweep import sweep_size
from .wandb_upload import log_report
from .write import write_report


class ReportCallback(Callback):
    """Hydra callback: when a multirun ends, write the report, print the verdict table, log the report to W&B
    as a run of the sweep's group, and make the sweep exit non-zero (1) when any of its own jobs did not
    finish -- after every job has run."""

    def on_multirun_start(self, config, **kwargs) -> None:
        """Mark this sweep's jobs (their processes inherit the variable), so its end judges only its own; count them."""
        os.environ[SWEEP] = uuid.uuid4().hex
        self._jobs = None if is_search(config) else sweep_size(config) or None
        self._finished, self._since = 0, time.monotonic()
        self._ran, self._ran_s = 0, 0.0  # the jobs computed here (not reused), and the seconds they took

    def on_job_start(self, config, **kwargs) -> None:
        self._job_since = time.monotonic()

    def on_job_end(self, config, job_return, **kwargs) -> None:
        """Where the sweep is: ``sweep: job 4/6 finished (1 failed, 2 reused); about 12 min left at the rate
        measured so far (6 min per job run, 2 still to run)``.
        The time left comes from the jobs that ran in this sweep, never from those reused (a finished job found
        again takes a second: counted in, a resumed sweep's estimate read seconds for minutes of work)."""
        from ..core.run.runner import last_job_outcome, last_job_ran

        jobs = getattr(self, "_jobs", None)
        if not jobs:
            return
        self._finished += 1
        spent = time.monotonic() - getattr(self, "_job_since", self._since)
        if last_job_ran():
            self._ran, self._ran_s = self._ran + 1, self._ran_s + spent
        ends = getattr(self, "_ends", {})  # failed / unreachable / reused: each counted as what it is
        outcome = last_job_outcome()
        if outcome in ("failed", "unreachable", "reused"):
            ends[outcome] = ends.get(outcome, 0) + 1
        self._ends = ends
        ran = self._ran
        left = jobs - self._finished
        said = ", ".join(f"{n} {what}" for what in ("failed", "unreachable", "reused") if (n := ends.get(what)))
        line = f"sweep: job {self._finished}/{jobs} finished" + (f" ({said})" if said else "")
        if left > 0 and ran:
            per_job = self._ran_s / ran
            line += (
                f"; about {_minutes(per_job * left)} left at the rate measured so far ({_minutes(per_job)} per job "
                f"run, {left} still to run)"
            )
        elif left > 0:
            line += "; the time left is known once a job has run here (none has so far)"
        print(line, flush=True)

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():  # nothing ran (a search stopped by bad input before its first trial)
            return
        try:
            written = write_report([sweep_dir], print_verdict=True)
        except FileNotFoundError as err:
            print(f"report: {err}")
            return
        for path in written:
            if path.suffix != ".svg":
                print(f"report: {path}")
        log_report(config, sweep_dir, written)
        ours = os.environ.get(SWEEP)
        failed = [
            j
            for j in load_jobs([sweep_dir])
            if j["state"] not in ("done", "unreadable", "unreachable") and (j.get("process") or {}).get("sweep") == ours
        ]  # another sweep's running job is not ours
        if failed and not is_search(config):  # a search's failed jobs are failed trials; the search says how it ended
            print(
                f"error: {len(failed)} job(s) of the sweep did not finish; see {sweep_dir / 'report.md'}",
                file=sys.stderr,
            )
            raise SystemExit(1)


def _minutes(seconds: float) -> str:
    """A duration as seconds, minutes or hours, whichever reads best."""
    return (
        f"{seconds:.0f} s"
        if seconds < 90
        else f"{seconds / 60:.0f} min"
        if seconds < 5400
        else f"{seconds / 3600:.1f} h"
    )
