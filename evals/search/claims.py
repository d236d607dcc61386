"""Who runs a trial of a shared study: several processes may search one study (Hydra's joblib or submitit
launchers, one Optuna storage), and a process that starts or resumes the search must tell a trial that another
live process is running from one that a killed process left running.

- :func:`claim`: a trial asked (Optuna's ask-and-tell, Akiba et al. 2019, arXiv 1907.10902) and its owner -- host,
  pid and the pid's start time -- recorded on it at once.
- :func:`cut_off`: a running trial is cut off when its owner is recorded and no longer runs (on this host; another
  host's process is taken as live), or when no owner was recorded within :data:`CLAIM_GRACE` seconds of its start
  (a process killed between asking and recording). Optuna makes a trial running when it is asked, before the owner
  can be written: that gap is the claim's, never a sign of death (taking it for one re-ran another process's
  running trial, and its owner then crashed with ``UpdateFinishedTrialError``).
- :func:`recover`: the cut-off trials failed and enqueued again (their jobs are reused when they finished).
"""

from __future__ import annotations

import contextlib
from datetime import datetime

from ..core.run.rundir import is_alive, this_process

CLAIM_GRACE = 120.0  # seconds a process has between asking a trial and recording itself as its owner


def claim(study):
    """A new trial of ``study``, owned by this process."""
    trial = study.ask()
    trial.set_user_attr("process", this_process())
    return trial


def cut_off(trial, now: datetime | None = None, grace: float = CLAIM_GRACE) -> bool:
    """Whether a running trial was left by a process that no longer runs (see the module's docstring)."""
    owner = trial.user_attrs.get("process")
    if owner:
        return is_alive(owner) is False
    started = trial.datetime_start  # Optuna's local time, set when the trial became running
    return started is None or ((now or datetime.now()) - started).total_seconds() > grace


def recover(study, grace: float = CLAIM_GRACE) -> list[int]:
    """The cut-off running trials of ``study`` failed and enqueued again; their numbers."""
    import optuna

    recovered = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if not cut_off(trial, grace=grace):
            continue
        try:
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # its owner finished it after all, between our look and our word
        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number}, skip_if_exists=False)
        recovered.append(trial.number)
    return recovered


@contextlib.contextmanager
def opening(storage: str):
    """Hold an exclusive lock on ``<the SQLite file>.lock`` (other storages: nothing) while the study is opened: its
    tables are created by one process at a time (SQLAlchemy's create_all checks, then creates)."""
    if not storage.startswith("sqlite:///"):
        yield
        return
    import fcntl

    with open(f"{storage.removeprefix('sqlite:///')}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
