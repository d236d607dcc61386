"""Hydra multirun sweeps: W&B offline runs read back with wandb's own reader, the local report,
the joblib and submitit launchers, and resuming a killed sweep."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evals.report.write import write_report
from tests.tiny import ROOT, TINY

SMALL = [*TINY, "data.books=[persuasion]", "eval.lengths=[256,512]"]
WANDB = Path(sys.executable).parent / "wandb"


@pytest.fixture(scope="session")
def sweep(run_cli):
    """``sweep(sweep_dir, *args, timeout=600, **popen)``: ``python run.py -m`` over SMALL into ``sweep_dir``, resuming
    from its parent: the finished run (asserted to succeed), or the running Popen when given ``popen`` arguments."""

    def sweep(sweep_dir, *args, timeout=600, **popen):
        env = {**os.environ, "WANDB_SILENT": "true", "TQDM_DISABLE": "1"}
        command = ["-m", *SMALL, f"hydra.sweep.dir={sweep_dir}", f"resume_from=[{sweep_dir.parent}]", *args]
        if popen:
            return run_cli(*command, env=env, **popen)
        result = run_cli(*command, env=env, timeout=timeout)
        assert result.returncode == 0, result.stderr[-3000:]
        return result

    return sweep


def results(sweep_dir):
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(Path(sweep_dir).glob("*/results.json"))}


def wandb_artifacts(run_dir: Path) -> set[str]:
    """The names of the artifacts an offline run logged, read with wandb's own `wandb leet inspect`."""
    (offline,) = run_dir.glob("wandb/offline-run-*")
    records = subprocess.run(
        [str(WANDB), "leet", "inspect", "--json", str(offline)], capture_output=True, text=True, timeout=120, check=True
    ).stdout.splitlines()
    return {json.loads(line)["artifact"]["name"] for line in records if json.loads(line).get("type") == "artifact"}


def wandb_read(run_dir: Path) -> tuple[dict, dict, list[dict], list[dict]]:
    """(summary, run record, history rows, metric definitions) of an offline run, read with wandb's own
    `wandb leet inspect`."""
    (offline,) = run_dir.glob("wandb/offline-run-*")
    summary = subprocess.run(
        [str(WANDB), "leet", "inspect", "--summary", "--json", str(offline)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    records = [
        json.loads(line)
        for line in subprocess.run(
            [str(WANDB), "leet", "inspect", "--json", str(offline)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout.splitlines()
    ]
    run = next(r["run"] for r in records if r["type"] == "run")
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    metrics = [r["metric"] for r in records if r["type"] == "metric"]
    return json.loads(summary.stdout), run, history, metrics


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_wandb_offline_sweep_one_run_per_job_in_one_group_and_report(tmp_path, sweep):
    sweep_dir = tmp_path / "sweep"
    sweep(
        sweep_dir,
        "scaling=none,yarn",
        "scaling.factor=2",
        "logger=wandb",
        "logger.mode=offline",
        "eval.lengths=[256,512,1x,2x,4x]",
    )
    jobs = results(sweep_dir)
    assert len(jobs) == 2 and all(j["status"] == "done" for j in jobs.values())
    groups, names = set(), set()
    for name, job in jobs.items():
        summary, run, history, metrics = wandb_read(sweep_dir / name)
        assert summary["state"] == "finished"
        by_length = job["metrics"]["perplexity"]["by_length"]
        assert summary["summary"]["ppl@512"] == pytest.approx(by_length[1]["ppl"])
        assert summary["summary"]["tokens@512"] == 511
        # the answer, and the value at the run's target (2x = 4096), not at the last length logged (8192)
        assert (
            summary["summary"]["target_length"] == 4096
            and summary["summary"]["verdict_state"] == job["summary"]["verdict_state"]
        )
        assert summary["summary"]["perplexity/ppl"] == pytest.approx(job["summary"]["ppl@4096"])
        assert summary["summary"]["perplexity/ppl"] != pytest.approx(job["summary"]["ppl@8192"])
        assert run["job_type"] == "perplexity" and f"scaling:{job['config']['scaling']['name']}" in run["tags"]
        assert f"results-{job['job']['key']}" in wandb_artifacts(sweep_dir / name)
        assert summary["config"]["scaling.name"] == job["config"]["scaling"]["name"]  # flat, filterable config
        assert summary["config"]["scaling.label"] == job["job"]["scaling"]
        assert ("scaling.factor" in summary["config"]) == (job["config"]["scaling"]["name"] != "none")
        # ppl over length as native history, so the group's runs overlay in the default workspace
        curve = [(row["length"], row["perplexity/ppl"]) for row in history if "perplexity/ppl" in row]
        assert curve == [(r["length"], pytest.approx(r["ppl"])) for r in by_length]
        assert {"name": "perplexity/ppl", "step_metric": "length"} in [
            {k: m.get(k) for k in ("name", "step_metric")} for m in metrics
        ]
        groups.add(run["run_group"])
        names.add(run["display_name"])
    assert groups == {f"sweep-{tmp_path.name}_sweep"}
    assert names == {"tinyllama[random]-none-perplexity", "tinyllama[random]-yarn-factor2-perplexity"}
    report = (sweep_dir / "report.md").read_text()  # written by the Hydra callback at the end of the multirun
    jobs_table = report.split("## Jobs", 1)[1]  # the ranked answer above it orders by the answer
    assert "| yarn-factor2 |" in jobs_table and jobs_table.index("| none |") < jobs_table.index(
        "| yarn-factor2 |"
    )  # baseline first
    assert (sweep_dir / "report_ppl_by_length.png").stat().st_size > 0
    assert (sweep_dir / "report.csv").read_text().count("\n") == 3
    # the sweep's report is a run of the same group, with the verdict table and the page as an artifact
    summary, run, history, _ = wandb_read(sweep_dir)
    assert run["run_group"] == f"sweep-{tmp_path.name}_sweep" and run["job_type"] == "report"
    assert summary["summary"]["verdict/perplexity/yarn-factor2"] in ("yes", "NO", "inconclusive", "not judged")
    assert summary["summary"]["answer"].startswith("at 4096 (2x) on tinyllama[random]: ")  # the ranked answer
    assert {k for k in summary["summary"] if k.startswith("rank/")} == {
        "rank/tinyllama[random]@4096/none",
        "rank/tinyllama[random]@4096/yarn-factor2",
    }
    assert "report-sweep" in wandb_artifacts(sweep_dir)


@pytest.mark.slow  # heavy: subprocess runs; CI runs it after the default suite
@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_parallel_launchers_run_a_sweep(tmp_path, launcher, sweep):
    sweep_dir = tmp_path / launcher
    extra = ["hydra.launcher.n_jobs=2"] if launcher == "joblib" else ["hydra.launcher.timeout_min=10"]
    sweep(sweep_dir, f"hydra/launcher={launcher}", *extra, "scaling=none,linear", "scaling.factor=2", "logger=none")
    jobs = results(sweep_dir)
    assert sorted(j["config"]["scaling"]["name"] for j in jobs.values()) == ["linear", "none"]
    assert all(j["status"] == "done" for j in jobs.values())
    assert (sweep_dir / "report.md").is_file()


@pytest.mark.slow  # heavy: subprocess runs; CI runs it after the default suite
def test_killed_sweep_resumes_skipping_finished_jobs(tmp_path, sweep):
    first, second = tmp_path / "first", tmp_path / "second"
    args = ["scaling=none,linear,ntk", "scaling.factor=2", "logger=none"]
    process = sweep(first, *args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and not any(j.get("status") == "done" for j in results(first).values()):
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)  # the whole sweep, midway
    process.wait()
    finished = {j["config"]["scaling"]["name"] for j in results(first).values() if j["status"] == "done"}
    assert "none" in finished
    output = sweep(second, *args).stdout
    rerun = results(second)
    assert len(rerun) == 3 and all(j["status"] == "done" for j in rerun.values())
    for job in rerun.values():
        resumed = "resumed_from" in job
        assert resumed == (job["config"]["scaling"]["name"] in finished), job["config"]["scaling"]["name"]
        assert job["metrics"]["perplexity"]["by_length"][0]["ppl"] > 1
    assert output.count("skip: the same job finished") == len(finished)
    forced = sweep(tmp_path / "forced", "scaling=none", "logger=none", "force=true").stdout
    assert "skip:" not in forced


def test_report_cli_on_a_single_run_and_a_missing_dir(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_report([tmp_path])
    result = subprocess.run(
        [sys.executable, "-m", "evals.report", str(tmp_path / "nope")], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 2 and "not a directory" in result.stderr
    result = subprocess.run(
        [sys.executable, "-m", "evals.report", str(tmp_path)], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 2 and "no results.json" in result.stderr
