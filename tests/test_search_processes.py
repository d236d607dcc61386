"""Searches across processes (-m hydra/sweeper=optuna on the tiny model, through the CLI): a 4-trial search
interrupted and resumed without repeating a trial, surviving a failing one and writing its best config; trials in
parallel through a launcher; a worker that dies; a damaged study file; two searches sharing one study, and the
claims (evals/search/claims.py) by which no live process's trial is taken for cut off."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from evals.core.job.parse import parse_job
from tests.test_search import ENV, SEARCH, trials
from tests.tiny import ROOT, TINY


@pytest.mark.slow  # heavy: two CLI searches (about a minute); CI runs it after the default suite
def test_a_four_trial_search_resumes_after_a_kill_survives_a_failing_trial_and_writes_its_best_config(
    tmp_path, run_cli, compose
):
    sweep_dir = tmp_path / "search"
    args = [
        *SEARCH,
        "model.original_max_position=256",
        "logger=none",
        "objective=ppl@512",
        "hydra.sweeper.n_trials=4",
        'constraints=["ppl_retention@256>=0.5"]',
        f"hydra.sweep.dir={sweep_dir}",
        # the first trial fails: beta_fast 0.5 is not above beta_slow 1 (the job rejects it; the search goes on);
        # the second is the published default, which the report sets the best against
        "hydra.sweeper.enqueue=[{scaling.beta_fast:0.5,scaling.beta_slow:1.0},{scaling.beta_fast:32.0,scaling.beta_slow:1.0}]",
    ]
    process = run_cli(
        *args, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    deadline, before = time.time() + 300, {}
    while time.time() < deadline and not list(sweep_dir.glob("0_*")):  # the study exists: reading it creates nothing
        time.sleep(0.1)
    while time.time() < deadline and before.get(2) != "RUNNING" and process.poll() is None:
        time.sleep(0.1)  # until trial 1 is told to the study and trial 2 is under way
        try:
            before = {t.number: t.state.name for t in trials(sweep_dir)}
        except Exception:  # noqa: BLE001 -- the study is not created yet, or its database is busy
            continue
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    before = {t.number: t.state.name for t in trials(sweep_dir)}
    assert before == {0: "FAIL", 1: "COMPLETE", 2: "RUNNING"}, process.stdout.read()[-3000:]
    first = {p.parent.name: p.stat().st_mtime_ns for p in sweep_dir.glob("[01]_*/results.json")}

    result = run_cli(*args, env=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "already finished; not repeated" in result.stdout
    assert "search: trial 2 was cut off; it runs again" in result.stdout
    study = trials(sweep_dir)
    finished = [t for t in study if "outcome" in t.user_attrs]
    assert len(finished) == 4  # the budget counts finished trials: none repeated, the cut-off one tried again
    assert {p.parent.name: p.stat().st_mtime_ns for p in sweep_dir.glob("[01]_*/results.json")} == first
    assert "beta_fast" in study[0].user_attrs["error"] and study[0].state.name == "FAIL"
    assert sum(t.state.name == "COMPLETE" for t in finished) == 3
    rows = (sweep_dir / "search_trials.csv").read_text().splitlines()
    assert rows[0].startswith("trial,state,ppl@512,ppl_retention@256>=0.5,feasible")
    summary = json.loads((sweep_dir / "search.json").read_text())
    best = summary["best"][0]
    values = {t.number: t.values[0] for t in finished if t.state.name == "COMPLETE"}
    assert best["values"]["ppl@512"] == min(values.values()) and best["trial"] in values
    assert (sweep_dir / "search_history.png").stat().st_size > 0
    # 4 trials: no importance or parallel chart, and the terminal says why
    assert not (sweep_dir / "search_importance.png").exists() and not (sweep_dir / "search_parallel.png").exists()
    assert (
        "search: no importance or parallel-coordinate figure from 3 finished trial(s): importances (fANOVA) need "
        "at least 10" in result.stdout
    )
    report = (sweep_dir / "report.md").read_text()
    assert "## Search" in report
    assert report.index("## Search") < report.index("## Verdict")  # the search first, the trials' verdicts after
    given = summary["given"]
    assert [g["trial"] for g in given] == [1] and given[0]["scaling"]["beta_fast"] == 32.0
    assert given[0]["reported"]["ppl@512"] == values[1] and "ppl_retention@256" in given[0]["reported"]
    assert (f"against a setting given (hydra.sweeper.enqueue), trial 1: ppl@512 = {values[1]:.5g}" in report) == (
        best["trial"] != 1
    )
    # the terminal says what the search found, against the published default it was given
    assert f"search: best: trial {best['trial']}, ppl@512 = {best['values']['ppl@512']:.5g}" in result.stdout
    assert (f"search: against the given setting, trial 1: ppl@512 = {values[1]:.5g}" in result.stdout) == (
        best["trial"] != 1
    )
    # the best setting is a ready-to-use scaling option: composed, parsed and equal to the best trial's
    config = sweep_dir / "conf" / "scaling" / "yarn_searched.yaml"
    cfg = compose(
        *TINY,
        "model.original_max_position=256",
        f"hydra.searchpath=[file://{sweep_dir / 'conf'}]",
        "scaling=yarn_searched",
    )
    job = parse_job(cfg, tmp_path / "use")
    ran = json.loads((Path(best["dir"]) / "results.json").read_text())
    stored = {k: v for k, v in ran["config"]["scaling"].items() if k != "label"}
    assert job.scaling.to_dict() == stored, config.read_text()


@pytest.mark.slow  # heavy: a CLI search of two trials in two joblib processes; CI runs it after the default suite
def test_a_search_runs_its_trials_in_parallel_through_the_launcher_into_its_own_directory(tmp_path):
    # no hydra.sweep.dir: the search names its directory, and every trial (launched by joblib, which composes each
    # job's config anew) must land there with the study and the report, not in Hydra's dated default
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "run.py"),
            *SEARCH,
            "model.original_max_position=256",
            "logger=none",
            "objective=ppl@512",
            'constraints=["ppl_retention@256>=0.5"]',
            "hydra.sweeper.n_trials=2",
            "hydra.sweeper.n_jobs=2",
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
        ],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Joblib.Parallel" in result.stdout + result.stderr  # Hydra's joblib launcher ran the batch
    (sweep_dir,) = (tmp_path / "multirun" / "search").iterdir()
    assert sweep_dir.name == "tinyllama_yarn_ppl@512"
    assert sorted(p.name for p in (tmp_path / "multirun").iterdir()) == ["search"]
    study = trials(sweep_dir)
    assert [t.state.name for t in study] == ["COMPLETE", "COMPLETE"]
    assert all(Path(t.user_attrs["dir"]).resolve().parent == sweep_dir.resolve() for t in study)
    jobs = [json.loads((Path(t.user_attrs["dir"]) / "results.json").read_text()) for t in study]
    # two trials, two jobs of their own in two worker processes, neither the search's own process
    assert len({j["job"]["key"] for j in jobs}) == 2 and all(j["status"] == "done" for j in jobs)
    pids = {j["process"]["pid"] for j in jobs}
    assert len(pids) == 2 and study[0].user_attrs["process"]["pid"] not in pids
    # the two concurrent trials share one unscaled reference, run once, and both report the retention it gives
    assert len(list((sweep_dir / "baseline").glob("*/results.json"))) == 1
    assert all(t.user_attrs["reported"]["ppl_retention@256"] is not None for t in study)
    assert json.loads((sweep_dir / "search.json").read_text())["complete"] == 2
    assert "## Search" in (sweep_dir / "report.md").read_text()


@pytest.mark.slow  # heavy: a CLI search whose worker process is killed; CI runs it after the default suite
def test_a_trial_whose_worker_dies_is_a_failed_trial_and_the_search_goes_on(tmp_path, run_cli):
    # the launcher itself fails (a joblib worker killed, as the OOM killer would): not a traceback that ends the search
    sweep_dir = tmp_path / "killed_worker"
    process = run_cli(
        *SEARCH,
        "model.original_max_position=256",
        "logger=none",
        "objective=ppl@512",
        "hydra.sweeper.n_trials=2",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        f"hydra.sweep.dir={sweep_dir}",
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline, killed = time.time() + 300, None
    while time.time() < deadline and killed is None and process.poll() is None:
        for path in sweep_dir.glob("0_*/results.json"):
            job = json.loads(path.read_text())
            if job["status"] == "running":
                killed = job["process"]["pid"]
                os.kill(killed, signal.SIGKILL)
        time.sleep(0.02)
    output, _ = process.communicate(timeout=300)
    assert killed is not None, output[-3000:]
    assert process.returncode == 0, output[-3000:]
    study = trials(sweep_dir)
    assert [t.state.name for t in study] == ["FAIL", "COMPLETE"]
    assert study[0].user_attrs["error"].startswith("the launcher failed: TerminatedWorkerError")
    assert "search: trial 0 failed (the launcher failed" in output
    rows = (sweep_dir / "search_trials.csv").read_text()
    assert "the launcher failed" in rows and json.loads((sweep_dir / "search.json").read_text())["failed"] == 1
    # its job never said how the setting does: a re-run tries it again (a failing job's trial is not retried)
    rerun = run_cli(
        *SEARCH,
        "model.original_max_position=256",
        "logger=none",
        "objective=ppl@512",
        "hydra.sweeper.n_trials=2",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        f"hydra.sweep.dir={sweep_dir}",
        env=ENV,
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "search: trial 0 was lost with its launcher; it runs again" in rerun.stdout
    study = trials(sweep_dir)
    assert [t.state.name for t in study] == ["FAIL", "COMPLETE", "COMPLETE"]
    assert study[2].user_attrs["retry_of"] == 0 and study[2].params == study[0].params


def test_a_damaged_study_file_is_one_line_and_exit_2(tmp_path, run_cli):
    """A truncated optuna.db (a full disk, a copy cut short) was a SQLAlchemy traceback on the re-run."""
    sweep_dir = tmp_path / "search"
    sweep_dir.mkdir()
    (sweep_dir / "optuna.db").write_bytes(b"SQLite format 3\x00" + b"\x00" * 40)
    result = run_cli(
        *SEARCH, "model.original_max_position=256", f"hydra.sweep.dir={sweep_dir}", "objective=ppl@512", env=ENV
    )
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.strip().splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "is damaged: move it away to start the search anew" in lines[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # two searches at once (~40 s)
def test_two_identical_searches_started_together_share_the_studys_budget(tmp_path, run_cli):
    """Each process used to spend the whole n_trials: 3 + 3 = 6 complete trials."""
    import optuna

    sweep_dir = tmp_path / "search"
    args = [
        *SEARCH,
        "model.original_max_position=256",
        f"hydra.sweep.dir={sweep_dir}",
        "objective=ppl@512",
        "hydra.sweeper.n_trials=3",
        "verdict.baseline=false",
    ]
    first = run_cli(*args, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(1.0)  # the first creates the study; the second joins it
    second = run_cli(*args, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    outputs = [p.communicate(timeout=600)[0] for p in (first, second)]
    for output in outputs:  # whole, on a failure (an assertion message is cut short)
        print(output)
    assert [p.returncode for p in (first, second)] == [0, 0], [o[-1500:] for o in outputs]
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{sweep_dir / 'optuna.db'}")
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 3, [(t.number, t.state.name, t.user_attrs.get("outcome")) for t in study.trials]


# a worker of a shared study, stopped where a claim is open: after Optuna's ask made the trial running, before its
# owner is recorded (what evals.search.claims.claim does next); it records itself and finishes when told to
WORKER = """
import sys, time
from pathlib import Path
import optuna
from evals.core.run.rundir import this_process
optuna.logging.set_verbosity(optuna.logging.ERROR)
storage, flags, own = sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "own"
study = optuna.load_study(study_name="shared", storage=storage)
trial = study.ask()
if own:
    trial.set_user_attr("process", this_process())
(flags / "asked").write_text(str(trial.number))
while not (flags / "go").exists():
    time.sleep(0.05)
trial.set_user_attr("process", this_process())
study.tell(trial, 1.0)
"""


def _workers(storage: str, tmp_path: Path, kinds: list[str]) -> list[tuple[subprocess.Popen, Path]]:
    """Workers started at once (each in the claim's gap, or owning its trial: ``own``); back when each has asked."""
    started = []
    for i, kind in enumerate(kinds):
        flags = tmp_path / f"worker{i}"
        flags.mkdir()
        command = [sys.executable, "-c", WORKER, storage, str(flags), kind]
        started.append((subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE), flags))
    deadline = time.monotonic() + 120
    for worker, flags in started:
        while not (flags / "asked").exists():
            assert worker.poll() is None and time.monotonic() < deadline, worker.stderr.read().decode()[-2000:]
            time.sleep(0.05)
    return started


def test_a_trial_another_live_process_is_claiming_is_never_taken_for_cut_off_and_a_dead_ones_is(tmp_path):
    """The CI race made deterministic: the second process took the first one's trial, running but not yet owned, for
    cut off, failed and re-enqueued it, and the first then crashed with UpdateFinishedTrialError."""
    from evals.search import claims

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="shared", storage=storage)
    # alive inside the claim's gap; owner recorded, then killed; killed inside the gap
    (live, flags), (dead, _), (gap, _) = _workers(storage, tmp_path, ["gap", "own", "gap"])
    dead.kill(), gap.kill(), dead.wait(), gap.wait()
    number, owned, unowned = (int((tmp_path / f"worker{i}" / "asked").read_text()) for i in range(3))
    # what a second process's resume does: the dead owner's trial at once, the unowned one after the grace, and
    # never the trial a live process is claiming
    assert claims.recover(study) == [owned]
    (flags / "go").touch()
    assert live.wait(timeout=120) == 0, live.stderr.read().decode()[-2000:]  # was: UpdateFinishedTrialError
    assert claims.recover(study, grace=0.0) == [unowned]
    states = {t.number: t.state.name for t in study.trials}
    assert (states[number], states[owned], states[unowned]) == ("COMPLETE", "FAIL", "FAIL")
    retries = {t.user_attrs["retry_of"]: t.state.name for t in study.trials if "retry_of" in t.user_attrs}
    assert retries == {owned: "WAITING", unowned: "WAITING"}
