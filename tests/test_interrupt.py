"""SIGTERM is one outcome wherever it lands (evals/core/run/interrupt.py): exit 130, one line and no traceback, the job
recorded as interrupted and only what finished before it kept -- also where Python or a library does not let the
KeyboardInterrupt through as such. Deterministic: the eval of a plugin sends SIGTERM to its own process at the
chosen place (``signal.raise_signal`` runs the handler at once), no timing involved:

- ``set_name``: in a descriptor's ``__set_name__`` while a class is created, which Python 3.11 re-raises as a
  RuntimeError. Dataclass fields are such descriptors, so this is where an interrupt landing while lm-eval's task
  loading imports rdata / xarray / scipy ended (the flaky slow test in test_lm_harness.py): a crash, exit 1;
- ``raised_from``: in a library that raises its own error from whatever it caught (``except BaseException``);
- ``swallowed``: in a library's bare ``except:`` (datasets' fingerprinting has one): the run went on and finished;
- ``del``: in a ``__del__``, where Python only prints "Exception ignored in ..." with a traceback: the run went on.

A sweep stops there (it went on to its next job), and an lm-eval run interrupted while a task's data is built keeps
its finished tasks, the re-run running only the rest (the slow test of test_lm_harness.py without its timing).
"""

import json

import pytest

from tests.tiny import TINY

PLUGIN = '''
"""An eval that writes a record, gets SIGTERM where the test says, then writes another."""
import signal
import time
from dataclasses import dataclass

from evals import register_eval


@dataclass
class LandsConfig:
    name: str = "interrupt_lands"
    where: str = "set_name"


class SignalledDescriptor:
    def __set_name__(self, owner, name):
        signal.raise_signal(signal.SIGTERM)


class SignalledOnDelete:
    def __del__(self):
        signal.raise_signal(signal.SIGTERM)


class LibraryError(Exception):
    pass


@register_eval("interrupt_lands", config=LandsConfig, needs=())
def interrupt_lands(cfg, ctx):
    with ctx.output.records("steps") as write:
        write({"step": 1})
        if cfg.where == "set_name":  # a module being imported: its classes created
            class Imported:
                value = SignalledDescriptor()
        elif cfg.where == "raised_from":
            try:
                signal.raise_signal(signal.SIGTERM)
            except BaseException as err:
                raise LibraryError("the library failed") from err
        elif cfg.where == "swallowed":
            try:
                signal.raise_signal(signal.SIGTERM)
            except:  # noqa: E722
                pass
        elif cfg.where == "del":
            SignalledOnDelete()  # deleted at once
            for _ in range(500):  # the run goes on (5 s)
                time.sleep(0.01)
        write({"step": 2})
    return {"steps": 2}
'''


@pytest.fixture
def lands(tmp_path, searchpath):
    """(args, env): the CLI arguments and environment of a run of the plugin eval above."""
    import os

    from tests.tiny import ROOT

    (tmp_path / "lands_plugin.py").write_text(PLUGIN)
    (tmp_path / "conf" / "eval").mkdir(parents=True)
    (tmp_path / "conf" / "eval" / "interrupt_lands.yaml").write_text(
        "defaults:\n  - /schema/eval@_here_: interrupt_lands\n  - _self_\n"
    )
    env = {
        **os.environ,
        "ROPE_EXT_PLUGINS": "lands_plugin",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
    }
    return [*TINY, searchpath(tmp_path), "eval=interrupt_lands"], env


@pytest.mark.parametrize(
    "where",
    [
        "set_name",
        "swallowed",
        "raised_from",
        "del",
    ],
)
def test_sigterm_anywhere_in_a_job_exits_130_without_a_traceback_and_keeps_only_what_finished(
    tmp_path, lands, run_cli, where
):
    args, env = lands
    out = tmp_path / "run"
    done = run_cli(*args, f"eval.where={where}", f"output_dir={out}", env=env)
    assert done.returncode == 130, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith("interrupted:")
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "interrupted" and results["error"]["type"] == "KeyboardInterrupt"
    records = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert records == [{"step": 1}]  # what finished before the signal; nothing computed after it


def test_a_sweep_stops_at_an_interrupt_a_library_raised_as_another_error(tmp_path, lands, run_cli):
    """A multirun went on to its next job: the RuntimeError was a crash of one job, not the interrupt."""
    args, env = lands
    sweep = tmp_path / "sweep"
    done = run_cli("-m", *args, "eval.where=set_name,none", f"hydra.sweep.dir={sweep}", env=env)
    assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "crashed" not in done.stderr
    (first,) = sweep.glob("0_*/results.json")
    assert json.loads(first.read_text())["status"] == "interrupted"
    assert not list(sweep.glob("1_*"))


def test_what_is_the_interrupt():
    """The interrupt, raised from or during it; no other error (no signal came to this process)."""
    from evals.core.run import interrupt

    def raised_from(err):
        try:
            raise err
        except BaseException as caught:
            try:
                raise RuntimeError("wrapped") from caught
            except RuntimeError as outer:
                return outer

    assert interrupt.interrupted(KeyboardInterrupt())
    assert interrupt.interrupted(raised_from(KeyboardInterrupt()))
    assert not interrupt.interrupted(raised_from(ValueError()))
    assert not interrupt.interrupted(SystemExit(0))
    assert not interrupt.interrupted(ValueError())


def test_a_signal_of_an_earlier_run_in_the_same_process_is_forgotten_by_the_next():
    """In a long-lived process (a notebook calling the CLI twice), one Ctrl-C must not make every later error, and
    every later finished job, 'interrupted'."""
    import signal
    import sys

    from evals.core.run import interrupt

    saved = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT), sys.unraisablehook
    try:
        interrupt._received.append(signal.SIGTERM)  # what the handler left behind in the earlier run
        assert interrupt.interrupted(ValueError())
        interrupt.install()
        assert not interrupt.interrupted(ValueError()) and not interrupt.received()
        with interrupt.as_interrupt():
            pass  # a job that finishes is not turned into an interrupt
    finally:
        interrupt._received.clear()
        signal.signal(signal.SIGTERM, saved[0])
        signal.signal(signal.SIGINT, saved[1])
        sys.unraisablehook = saved[2]


SIGNAL_TASK = """
include: {template}
task: signal_passkey
custom_dataset: !function signal_utils.dataset
"""

SIGNAL_UTILS = '''
"""rope_ext_passkey's documents, but the first time they are built SIGTERM lands while a class is created."""
import signal
from pathlib import Path

from evals.lm_eval_tasks.rope_ext_utils import aggregate_scores, passkey_dataset, process_retrieval  # noqa: F401

MARKER = Path(__file__).parent / "signalled"


class SignalledDescriptor:
    def __set_name__(self, owner, name):
        signal.raise_signal(signal.SIGTERM)


def dataset(**metadata):
    if not MARKER.exists():
        MARKER.touch()

        class Imported:  # what importing rdata / xarray / scipy does, many times over
            value = SignalledDescriptor()

    return passkey_dataset(**metadata)
'''


@pytest.mark.slow  # two lm-eval CLI runs (~30 s)
def test_sigterm_while_lm_eval_loads_a_task_keeps_the_finished_tasks_and_the_rerun_runs_the_rest(tmp_path, run_cli):
    """The flaky slow test of test_lm_harness.py, made deterministic: SIGTERM lands where lm-eval's task loading
    spends its time (class creation while importing), after the first task finished."""
    from evals.tasks.lm_harness import TASKS_DIR

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "signal_passkey.yaml").write_text(SIGNAL_TASK.format(template=TASKS_DIR / "_retrieval_template_yaml"))
    (tasks / "signal_utils.py").write_text(SIGNAL_UTILS)
    out = tmp_path / "lm"
    args = [
        *TINY,
        "eval=lm_eval",
        "eval.tasks=[rope_ext_passkey,signal_passkey]",
        f"eval.include_path=[{tasks}]",
        "eval.lengths=[256]",
        "eval.limit=2",
        f"output_dir={out}",
    ]
    first = run_cli(*args)
    assert first.returncode == 130 and "Traceback" not in first.stderr, first.stderr[-3000:]
    assert json.loads((out / "results.json").read_text())["status"] == "interrupted"
    kept = [json.loads(line) for line in (out / "lm_eval_tasks.jsonl").read_text().splitlines()]
    assert [r["task"] for r in kept] == ["rope_ext_passkey"]

    rerun = run_cli(*args)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "lm_eval: 1 of 2 tasks kept from the interrupted run" in rerun.stdout
    results = json.loads((out / "results.json").read_text())
    assert set(results["metrics"]["lm_eval"]["results"]) == {"rope_ext_passkey", "signal_passkey"}


# --- a sweep interrupted and resumed: counted right ------------------------------------------------------------

ONCE_PLUGIN = '''
"""An eval interrupted (SIGTERM to its own process) the first time a scaled job runs it, after one record; the
re-run keeps that record and finishes."""
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from evals import register_eval


@dataclass
class OnceConfig:
    name: str = "interrupt_once"
    marker: str = ""
    seconds: float = 0.0


@register_eval("interrupt_once", config=OnceConfig, needs=())
def interrupt_once(cfg, ctx):
    kept = ctx.output.previous("steps")
    with ctx.output.records("steps") as write:
        for record in kept or [{"step": 1}]:
            write(record)
        if ctx.job.scaling.name != "none" and not Path(cfg.marker).exists():
            Path(cfg.marker).touch()
            signal.raise_signal(signal.SIGTERM)
        time.sleep(cfg.seconds)
        write({"step": 2})
    return {"steps": 2, "kept": len(kept)}
'''


def _offline_runs(folder):
    """{run id: (state, exit code)} of the W&B offline runs in ``folder``, read with wandb's own `wandb leet inspect`."""
    import subprocess
    import sys
    from pathlib import Path

    wandb = Path(sys.executable).parent / "wandb"
    found = {}
    for run in sorted(folder.glob("offline-run-*")):
        summary = subprocess.run(
            [str(wandb), "leet", "inspect", "--summary", "--json", str(run)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        found[run.name.rsplit("-", 1)[1]] = json.loads(summary.stdout)["state"]
    return found


@pytest.mark.slow  # two sweeps through the CLI with W&B offline (~1 min on a quiet 2-core box)
def test_a_resumed_sweep_counts_each_job_once_resumes_in_place_continues_its_wandb_run_and_times_what_is_left(
    tmp_path, searchpath, run_cli
):
    """Issue 55: after an interrupted sweep the time left counted the reused jobs ("about 6 s left ... 1 s per job"
    for minutes of work); a job rejected again (STRING beyond its reach) was duplicated into ``<dir>-2`` so the report
    said one job more; the interrupted job left two W&B runs, one with exit code 1."""
    import os

    from tests.tiny import ROOT

    (tmp_path / "once_plugin.py").write_text(ONCE_PLUGIN)
    (tmp_path / "conf" / "eval").mkdir(parents=True)
    (tmp_path / "conf" / "eval" / "interrupt_once.yaml").write_text(
        "defaults:\n  - /schema/eval@_here_: interrupt_once\n  - _self_\n"
    )
    env = {
        **os.environ,
        "ROPE_EXT_PLUGINS": "once_plugin",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "WANDB_SILENT": "true",
    }
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        *TINY,
        searchpath(tmp_path),
        "eval=interrupt_once",
        f"eval.marker={tmp_path / 'signalled'}",
        "eval.seconds=2",
        "logger=wandb",
        "logger.mode=offline",
        "target=4x",  # STRING cannot reach 4x: rejected before it starts, in both sweeps
        "scaling=string,linear,none",
        f"hydra.sweep.dir={sweep}",
    ]
    first = run_cli(*args, env=env)
    assert first.returncode == 130, first.stderr[-3000:]
    (interrupted,) = sweep.glob("1_*")
    assert json.loads((interrupted / "results.json").read_text())["status"] == "interrupted"
    run_id = json.loads((interrupted / "results.json").read_text())["tracking"]["id"]

    second = run_cli(*args, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    # the time left: unknown while only a rejected job finished, then from the job that ran (2 s and more)
    progress = [line for line in second.stdout.splitlines() if line.startswith("sweep: job")]
    assert progress[0] == (
        "sweep: job 1/3 finished (1 unreachable); the time left is known once a job has run here (none has so far)"
    ), progress
    assert progress[1].startswith("sweep: job 2/3 finished (1 unreachable); about "), progress
    assert progress[1].endswith(" per job run, 1 still to run)") and progress[2].startswith("sweep: job 3/3 finished")
    import re

    value, unit = re.search(r"\(([\d.]+) (s|min|h) per job run", progress[1]).groups()
    assert float(value) * {"s": 1, "min": 60, "h": 3600}[unit] >= 2  # the 2 s the job slept, at least
    # resumed in place: no <dir>-2, the interrupted job's record kept and finished
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir() and p.name[0].isdigit()) == [
        "0_tinyllama_string_to4x",
        "1_tinyllama_linear_to4x",
        "2_tinyllama_none_to4x",
    ]
    results = json.loads((interrupted / "results.json").read_text())
    assert results["status"] == "done" and results["summary"]["kept"] == 1
    assert results["tracking"] == {"id": run_id, "continued": True}
    # one W&B run per job: the interrupted attempt's run continued under its id, its offline folder set aside
    assert _offline_runs(interrupted / "wandb") == {run_id: "finished"}
    assert list(_offline_runs(interrupted / "wandb-superseded")) == [run_id]
    # the report counts each job once
    assert "3 jobs; one row per job identity." in (sweep / "report.md").read_text()
    assert (sweep / "report.csv").read_text().count("\n") == 4


def test_a_job_rejected_again_is_recorded_in_place_and_a_report_counts_old_duplicates_once(tmp_path):
    """The quick half of the test above: a directory holding the record of a job rejected before it started (no
    key, nothing computed) is reused by the re-run -- rejected again or now valid -- never duplicated into
    ``<dir>-2``; a sweep that already holds such a duplicate is counted once by the report."""
    from evals.core.run.rundir import claim
    from evals.report.load import load_jobs, one_per_identity

    job = tmp_path / "11_llama_string_to4x"
    job.mkdir()
    rejected = {"status": "unreachable", "job": {"name": job.name, "key": None}, "config": {"scaling": "string"}}
    (job / "results.json").write_text(json.dumps(rejected))
    with claim(job, "invalid") as again:
        assert again == job
    with claim(job, "a1b2c3") as valid:
        assert valid == job
    twin = tmp_path / "11_llama_string_to4x-2"  # what a resumed sweep left before
    twin.mkdir()
    (twin / "results.json").write_text(json.dumps(rejected))
    assert len(one_per_identity(load_jobs([tmp_path]))) == 1
    done = {"status": "done", "job": {"name": "x", "key": "k"}, "config": {}}
    (job / "results.json").write_text(json.dumps(done))
    with claim(job, "k2") as other:  # a finished result is never written over; the rejected twin's place is free
        assert other == twin
