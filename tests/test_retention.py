"""Short-context retention with ``eval.baseline=true``: a scaled job first runs (or reuses) the same job
unscaled at the lengths up to the trained context and reports ``<metric>_retention@L``; a sweep computes
that reference once."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evals.core.errors import UserError
from tests.conftest import ROOT, TINY, compose_config, run_job

BOOKS = ["data.books=[persuasion]", "eval.lengths=[256,512,4096]", "eval.baseline=true"]  # trained: 2048


def read(path: Path) -> dict:
    return json.loads(path.read_text())


def test_a_scaled_job_reports_retention_against_its_unscaled_reference(tmp_path):
    summary, results = run_job(tmp_path / "yarn", *BOOKS, "scaling=yarn", "scaling.factor=4.0")
    (path,) = (tmp_path / "yarn" / "baseline").glob("*/results.json")  # baseline/<its key>
    base = read(path)
    assert base["status"] == "done" and base["job"]["scaling"] == "none"
    assert base["config"]["eval"]["lengths"] == [256, 512] and base["config"]["eval"]["baseline"] is False
    retained = sorted(k for k in summary if "_retention@" in k)
    assert retained == ["ppl_retention@256", "ppl_retention@512"]  # only up to the trained context, only ppl
    assert summary["ppl_retention@256"] == pytest.approx(base["summary"]["ppl@256"] / summary["ppl@256"])
    assert summary["ppl_retention@256"] != 1.0  # yarn x4 changes the short-context numbers
    assert results["summary"]["ppl_retention@512"] == summary["ppl_retention@512"]
    assert results["baseline"]["key"] == base["job"]["key"]

    # another strategy that may resume from the first run reuses the reference instead of computing it
    summary, results = run_job(tmp_path / "ntk", *BOOKS, "scaling=ntk", f"resume_from=[{tmp_path / 'yarn'}]")
    again = read(tmp_path / "ntk" / "baseline" / path.parent.name / "results.json")
    assert again["resumed_from"] == str(path.parent) and again["job"]["key"] == base["job"]["key"]
    assert summary["ppl_retention@256"] == pytest.approx(base["summary"]["ppl@256"] / summary["ppl@256"])

    # the unscaled job is its own reference: nothing more runs
    summary, _ = run_job(tmp_path / "none", *BOOKS)
    assert not (tmp_path / "none" / "baseline").exists() and not any("_retention@" in k for k in summary)


def test_the_reference_scores_the_same_tokens_and_drops_what_cannot_exist_below_the_trained_context(tmp_path):
    from evals.core.job import parse_job

    common = [*TINY, "scaling=yarn", *BOOKS, "eval.protocol=sliding", "eval.longppl=true"]
    job = parse_job(compose_config(*common, "eval.key_tokens.short_context=64", "eval.key_tokens.stride=16"), tmp_path)
    base = job.baseline
    assert base.scaling.name == "none" and list(base.eval_cfg.lengths) == [256, 512]
    assert base.eval_cfg.max_tokens == 4096  # sliding: the job's tokens, not only the first 512
    assert base.eval_cfg.longppl and base.out_dir == tmp_path / "baseline" / base.key[:12]
    # key tokens need more than short_context + stride tokens: none within 512, so the reference has no LongPPL
    job = parse_job(compose_config(*common, "eval.key_tokens.short_context=1024", "eval.key_tokens.stride=1024"), tmp_path)
    assert job.eval_cfg.longppl and not job.baseline.eval_cfg.longppl


def test_no_length_within_the_trained_context_is_refused_before_the_model_loads(tmp_path):
    import run as rope_run

    cfg = compose_config(*TINY, "scaling=yarn", "eval.baseline=true", "eval.lengths=[4096]", f"output_dir={tmp_path}")
    with pytest.raises(UserError, match=r"eval.baseline=true compares lengths up to the trained context \(2048\)"):
        rope_run.run(cfg)
    assert not any(tmp_path.iterdir())


def test_a_sweep_computes_the_reference_once_and_reports_retention(tmp_path):
    sweep_dir = tmp_path / "sweep"
    command = [sys.executable, str(ROOT / "run.py"), "-m", *TINY, *BOOKS, "eval=needle", "eval.lengths=[256,512,4096]",
               "eval.depths=[0.5]", "eval.trials=1", "scaling=yarn,ntk", f"hydra.sweep.dir={sweep_dir}"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "TQDM_DISABLE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    (path,) = (sweep_dir / "baseline").glob("*/results.json")  # one reference for the two jobs
    base = read(path)
    jobs = sorted(p for p in sweep_dir.glob("[01]_*/results.json"))
    assert len(jobs) == 2
    for job in jobs:
        summary = read(job)["summary"]
        assert {"needle_nll_retention@256", "needle_nll_retention@512"} <= set(summary)
        assert "needle_acc_retention@256" not in summary  # a random model's unscaled accuracy is 0: no ratio
        assert summary["needle_nll_retention@512"] == pytest.approx(base["summary"]["needle_nll@512"] / summary["needle_nll@512"])
    report = (sweep_dir / "report.md").read_text()
    section = report.split("## Short-context retention", 1)[1].split("\n## ", 1)[0]  # the report's own comparison
    assert "needle_nll_retention@512" in section and section.count("| tinyllama[random] |") == 2
