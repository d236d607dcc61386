"""Runs that fail, stop or share a directory: a sweep runs every job it can and reports its failures, an allocation
failure at one length is a result, interrupted and dead runs say so and a rerun replaces them, two runs or sweeps
into one directory compute each job once, an unreachable W&B costs one timeout, a full disk keeps a finished job's
numbers, SIGTERM keeps the finished jobs readable."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evals.core.run.rundir import state
from evals.report.load import load_jobs
from tests.test_runner import SMALL, read
from tests.tiny import ROOT, TINY


# --- a sweep survives its failures ------------------------------------------------------------------------------


@pytest.mark.slow  # several CLI runs; CI runs the slow set after the default suite
def test_a_sweep_runs_every_job_it_can_reports_failures_and_exits_nonzero(tmp_path, plugin, run_cli, searchpath):
    plug, env = plugin
    sweep_dir = tmp_path / "sweep"
    result = run_cli(
        "-m", *SMALL, f"hydra.sweep.dir={sweep_dir}", "resume_from=[]", "scaling=linear", "scaling.factor=0.5,2"
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    jobs = {j["dir"].name: j for j in load_jobs([sweep_dir]) if j.get("job", {}).get("role") != "reference"}
    assert [j["state"] for _, j in sorted(jobs.items())] == ["failed", "done"]
    report = (sweep_dir / "report.md").read_text()
    assert "Not finished: 1 of 3 jobs" in report and "factor=0.5 must be >= 1" in report  # 3: the reference too
    crash = run_cli(
        "-m",
        *TINY,
        "data.books=[persuasion]",
        searchpath(plug),
        f"hydra.sweep.dir={tmp_path / 'crash'}",
        "resume_from=[]",
        "eval=first_tokens",
        "eval.crash=true,false",
        env=env,
    )
    assert crash.returncode == 1 and "crashed: RuntimeError: boom" in crash.stderr
    jobs = sorted(load_jobs([tmp_path / "crash"]), key=lambda j: j["dir"].name)
    assert [j["state"] for j in jobs] == ["failed", "done"]
    assert "Traceback" in jobs[0]["error"]["traceback"] and not jobs[0]["error"]["user_error"]
    assert "boom: a bug in an eval" in (tmp_path / "crash" / "report.md").read_text()


# --- memory: a failed allocation at one length is a result ------------------------------------------------------


@pytest.mark.slow  # heavy: subprocess runs; CI runs it after the default suite
def test_cpu_allocation_failure_at_one_length_is_recorded_and_the_others_report(tmp_path, plugin, run_cli):
    """Under a 3 GiB process memory limit, eager attention at 16384 tokens (4.3 GiB of scores a layer) cannot be
    allocated: that length is OOM, the shorter ones are measured, in both protocols and the needle grid."""
    plug, env = plugin
    env = {**env, "TEST_MEMORY_LIMIT_GIB": "3"}
    common = [*TINY, "model.attn_implementation=eager", "data.books=[emma]"]
    suite = run_cli(
        *common,
        "eval=suite",
        "eval.run=[perplexity,needle]",
        "eval.perplexity.lengths=[256,1024,16384]",
        "eval.needle.lengths=[256,16384]",
        "eval.needle.depths=[0.5]",
        "eval.needle.trials=1",
        "eval.needle.prefix_sharing=false",  # shared prefixes prefill in 1024-token chunks: they fit
        f"output_dir={tmp_path / 'suite'}",
        env=env,
    )
    assert suite.returncode == 0, suite.stderr[-3000:]
    assert "memory: perplexity at 16384 tokens needs about" in suite.stdout  # said before it is tried
    assert "memory: perplexity at 1024 tokens" not in suite.stdout
    results = read(tmp_path / "suite" / "results.json")
    rows = {r["length"]: r for r in results["metrics"]["perplexity"]["by_length"]}
    assert rows[16384]["oom"] and rows[16384]["ppl"] is None
    assert not rows[1024]["oom"] and rows[1024]["ppl"] > 1 and rows[256]["ppl"] > 1
    needle = {r["length"]: r for r in results["metrics"]["needle"]["by_length"]}
    assert needle[16384]["oom"] and needle[16384]["accuracy"] is None and needle[256]["accuracy"] is not None
    sliding = run_cli(
        *common,
        "eval.protocol=sliding",
        "eval.stride=256",
        "eval.lengths=[256,16384]",
        f"output_dir={tmp_path / 'sliding'}",
        env=env,
    )
    assert sliding.returncode == 0, sliding.stderr[-3000:]
    rows = {r["length"]: r for r in read(tmp_path / "sliding" / "results.json")["metrics"]["perplexity"]["by_length"]}
    assert rows[16384]["oom"] and rows[256]["ppl"] > 1
    assert (
        rows[256]["tokens"] == 16384 - 16384 // 256
    )  # max_tokens: the longest length; no BOS: each window's first unscored


@pytest.mark.slow  # heavy: a subprocess under a memory limit
def test_a_batch_of_prompts_that_does_not_fit_is_halved_until_it_does(tmp_path, plugin, run_cli):
    """Under a 4 GiB process memory limit, eager attention at 8192 tokens holds 1 GiB of scores a prompt a layer: a
    batch of 4 prompts and one of 2 fail, one prompt alone fits -- every prompt is scored, none recorded OOM, and the
    log says each halving; 1024 tokens, where the batch of 4 fits, is not halved."""
    plug, env = plugin
    passkey = run_cli(
        *TINY,
        "model.attn_implementation=eager",
        "eval=passkey",
        "eval.lengths=[1024,8192]",
        "eval.depths=[0.2,0.8]",
        "eval.trials=2",
        "eval.batch=4",
        "eval.max_new_tokens=2",
        f"output_dir={tmp_path / 'passkey'}",
        env={**env, "TEST_MEMORY_LIMIT_GIB": "4"},
    )
    assert passkey.returncode == 0, passkey.stderr[-3000:]
    said = passkey.stdout + passkey.stderr
    assert "out of memory at length 8192 in a batch of 4 prompts; trying 2" in said
    assert "out of memory at length 8192 in a batch of 2 prompts; trying 1" in said
    assert "out of memory at length 1024" not in said
    results = read(tmp_path / "passkey" / "results.json")
    by_length = {r["length"]: r for r in results["metrics"]["passkey"]["by_length"]}
    assert not by_length[8192]["oom"] and by_length[8192]["trials"] == 4 and by_length[1024]["trials"] == 4
    assert results["metrics"]["passkey"]["passkey_batch"] == 4


# --- interrupted, dead and concurrent runs ------------------------------------------------------------


def wait_for_status(path: Path, wanted: str, timeout: float = 120) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.is_file():
            try:
                data = read(path)
            except ValueError:
                data = {}
            if data.get("status") == wanted and (data.get("rope") or wanted != "running"):
                return data
        time.sleep(0.1)
    raise AssertionError(f"{path} never reached {wanted}")


@pytest.mark.slow  # heavy: subprocess runs; CI runs it after the default suite
def test_interrupted_and_dead_runs_say_so_and_a_rerun_replaces_them(tmp_path, plugin, run_cli, searchpath):
    plug, env = plugin
    args = [*TINY, "data.books=[persuasion]", searchpath(plug), "eval=first_tokens", "eval.sleep=60"]
    # Ctrl-C as a terminal sends it: a job started from a background shell inherits SIGINT ignored, and Python then
    # installs no KeyboardInterrupt handler -- so the child gets SIGINT's default back, whatever ran the tests
    process = run_cli(
        *args,
        f"output_dir={tmp_path / 'int'}",
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_for_status(tmp_path / "int" / "results.json", "running")
    deadline = time.time() + 120  # the eval writes its table, then sleeps: Ctrl-C lands in the eval, not in imports
    while not (tmp_path / "int" / "first_tokens.csv").is_file() and time.time() < deadline:
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130 and "Traceback" not in stderr and "interrupted" in stderr
    assert read(tmp_path / "int" / "results.json")["status"] == "interrupted"

    args[-1] = "eval.sleep=3"  # long enough to be killed while running, short enough to re-run
    process = run_cli(
        *args, f"output_dir={tmp_path / 'dead'}", env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wait_for_status(tmp_path / "dead" / "results.json", "running")
    process.kill()
    process.wait()
    (killed,) = load_jobs([tmp_path / "dead"])
    assert killed["status"] == "running" and killed["state"] == "dead"
    assert "dead" in [r.split(":")[0] for r in _report_lines(tmp_path / "dead")]
    rerun = run_cli(*args, f"output_dir={tmp_path / 'dead'}", env=env)
    assert rerun.returncode == 0 and state(read(tmp_path / "dead" / "results.json")) == "done"  # same job: replaced
    assert not (tmp_path / "dead-2").exists()


def _report_lines(directory):
    from evals.report.write import write_report

    write_report([directory])
    text = (Path(directory) / "report.md").read_text()
    return [line[2:] for line in text.splitlines() if line.startswith("- ")]


@pytest.mark.slow  # two concurrent CLI runs (~25 s)
def test_two_runs_into_one_directory_both_complete(tmp_path, run_cli):
    out = tmp_path / "together"
    processes = [
        run_cli(
            *SMALL,
            "eval.lengths=[256,2048]",
            f"output_dir={out}",
            "force=true",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr[-2000:]
    finished = [read(p) for p in (out, tmp_path / "together-2") for p in [p / "results.json"]]
    assert [f["status"] for f in finished] == ["done", "done"]
    assert finished[0]["summary"] == finished[1]["summary"]
    assert not list(tmp_path.glob("together*/.*.tmp")) and not list(tmp_path.glob("together*/.rope_ext.lock"))


# --- W&B unreachable ----------------------------------------------------------------------------------


@pytest.mark.slow  # waits out a W&B timeout (~20 s)
def test_unreachable_wandb_costs_one_timeout_per_process_not_per_job(tmp_path, run_cli):
    env = {**os.environ, "WANDB_API_KEY": "x" * 40, "WANDB_BASE_URL": "http://127.0.0.1:9", "WANDB_SILENT": "true"}
    result = run_cli(
        "-m",
        *SMALL,
        "logger=wandb",
        "logger.mode=online",
        "logger.init_timeout=5",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "resume_from=[]",
        "scaling=none,linear,ntk",
        env=env,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    # skipped without a wait: linear, ntk and the sweep's report (the sweep's own none job is their reference: every
    # length is within the trained context, so no other unscaled run is needed)
    assert (result.stdout + result.stderr).count("W&B skipped: it could not start earlier in this process") == 3
    assert not (tmp_path / "sweep" / "baseline").exists()
    assert all(j["state"] == "done" for j in load_jobs([tmp_path / "sweep"]))
    assert (result.stdout + result.stderr).count("W&B start failed") == 1  # one wait for the whole sweep


# --- a full disk, two sweeps into one directory, SIGTERM --------------------------------------------------------


@pytest.mark.slow  # two CLI runs (~25 s)
def test_a_figure_that_a_full_disk_refuses_leaves_a_finished_job_with_its_numbers(tmp_path):
    import resource

    limit = 40_000  # bytes per file: results.json and the tables fit, the figures do not

    def full_disk():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    out = tmp_path / "full"
    result = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *SMALL, f"output_dir={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=full_disk,
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    results = read(out / "results.json")
    assert results["status"] == "done" and results["summary"]["ppl@512"] > 0
    assert results["unwritten"] and all(why == "File too large" for why in results["unwritten"].values())
    assert f"warning: could not write {out / next(iter(results['unwritten']))} (File too large)" in result.stderr
    rerun = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *SMALL, f"output_dir={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rerun.returncode == 0 and "skip: the same job finished in" in rerun.stdout  # not recomputed


@pytest.mark.slow  # two concurrent CLI sweeps (~40 s)
def test_two_identical_sweeps_into_one_directory_compute_each_job_once_and_both_succeed(tmp_path, run_cli):
    sweep = tmp_path / "sweep"
    args = ["-m", *SMALL, "scaling=none,yarn,ntk", f"hydra.sweep.dir={sweep}"]
    processes = [run_cli(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [process.communicate(timeout=600) for process in processes]
    for process, (stdout, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr[-3000:]  # neither judges the other's running job
        assert "did not finish" not in stderr
    jobs = [read(p) for p in sweep.glob("*/results.json")]
    assert not list(tmp_path.glob("sweep/*-2")), sorted(p.name for p in sweep.iterdir())  # nothing computed twice
    assert len(jobs) == 3 and all(j["status"] == "done" for j in jobs)
    waited = "".join(stdout for stdout, _ in outputs)
    assert "wait: " in waited or "skip: the same job finished in" in waited


@pytest.mark.slow  # ~28 s
def test_a_sweep_stopped_with_sigterm_keeps_its_finished_jobs_finished_and_readable(
    tmp_path, plugin, run_cli, searchpath
):
    plug, env = plugin
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        *TINY,
        "data.books=[persuasion]",
        searchpath(plug),
        "eval=first_tokens",
        "eval.sleep=2",
        "scaling=none,linear,ntk",
        f"hydra.sweep.dir={sweep}",
        "resume_from=[]",
    ]
    process = run_cli(*args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_status(sweep / "1_tinyllama_linear_x2" / "results.json", "running")
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130 and "Traceback" not in stderr
    assert read(sweep / "0_tinyllama_none" / "results.json")["status"] == "done"
    assert read(sweep / "1_tinyllama_linear_x2" / "results.json")["status"] == "interrupted"
    assert not (sweep / "2_tinyllama_ntk_x2").exists()
    states = sorted(
        line.split(":")[0] for line in _report_lines(sweep) if line.split(":")[0] in ("interrupted", "done")
    )
    assert states == ["interrupted"]  # the report reads every file; only the unfinished one is listed as such
    rerun = run_cli(*args, env=env)
    assert rerun.returncode == 0 and rerun.stdout.count("skip: the same job finished") == 1
    assert read(sweep / "2_tinyllama_ntk_x2" / "results.json")["status"] == "done"


# --- what is dropped or failed is said where the user looks ----------------------------------------------------


def test_a_document_too_short_for_the_lengths_is_said_in_the_terminal_the_verdict_the_report_and_w_b(
    tmp_path, run_job, capsys
):
    """``data=text_files eval.documents=null``: a file too short for the lengths was dropped with only results.json's
    ``excluded_documents`` naming it (the terminal said ``2/2 document done``)."""
    from evals.core.decision.verdict_text import format_job
    from evals.report.write import write_report

    texts = tmp_path / "texts"
    texts.mkdir()
    book = (ROOT / "README.md").read_text()
    (texts / "long.txt").write_text(book)
    (texts / "short.txt").write_text("A few words only.")
    _, results = run_job(
        tmp_path / "run",
        "data=text_files",
        f"data.glob={texts / '*.txt'}",
        "eval.documents=null",
        "eval.lengths=[128]",
    )
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("warning: dropped document short (")]
    assert len(said) == 1 and "shorter than the 128 tokens" in said[0], err[-2000:]
    assert (
        "document short (" in results["summary"]["dropped"]
    )  # the summary W&B receives (evals/core/run/output.py close)
    assert results["dropped"][0]["what"].startswith("document short (")
    printed = format_job("none on tiny", results["verdict"])
    assert any(line.startswith("  dropped: document short (") for line in printed), printed
    write_report([tmp_path / "run"])
    assert "dropped document short (" in (tmp_path / "run" / "report.md").read_text()
    answer = (tmp_path / "run" / "report_answer.txt").read_text()  # the answer (and W&B's) says what it leaves out
    assert "dropped document short (" in answer and "shorter than the 128 tokens" in answer, answer


def test_a_failed_job_of_a_sweep_is_counted_as_failed_never_as_reused(tmp_path, run_cli):
    """A sweep whose job failed ended with ``sweep: job 2/2 finished (1 reused or not started)``."""
    sweep_dir = tmp_path / "sweep"
    result = run_cli(
        "-m",
        *TINY,
        "data.books=[persuasion]",
        "eval.lengths=[64]",
        "verdict.baseline=false",
        f"hydra.sweep.dir={sweep_dir}",
        "resume_from=[]",
        "scaling=linear",
        "scaling.factor=0.5,2",
    )
    assert result.returncode == 1, result.stderr[-2000:]
    progress = [line for line in result.stdout.splitlines() if line.startswith("sweep: job")]
    assert progress[0].startswith("sweep: job 1/2 finished (1 failed)"), progress
    assert progress[1].startswith("sweep: job 2/2 finished (1 failed)") and "reused" not in " ".join(progress)
