"""Readable results: honest intervals, an effective length that means something, one report over many runs
(markdown, CSV and a self-contained HTML page checked in a real headless browser)."""

import json
import math
import shutil
import subprocess
import sys

import pytest
import torch
from scipy import stats

from evals import perplexity
from evals.core.data import Document
from evals.report import write_report
from evals.stats import block_bootstrap, t_interval
from tests.conftest import ROOT, TINY, run_job, structured


@pytest.mark.parametrize("n", [2, 5])
def test_t_interval_matches_scipy(n):
    values = [2.0 + 0.3 * math.sin(i) for i in range(n)]
    low, high = t_interval(values)
    expected = stats.t.interval(0.95, n - 1, loc=sum(values) / n, scale=stats.sem(values))
    assert (low, high) == pytest.approx(expected, rel=1e-12)
    normal = 1.96 * stats.sem(values)
    assert (high - low) / 2 > normal  # wider than the normal approximation it replaces (6.5x for n = 2)


def test_one_document_gets_a_block_bootstrap_interval_and_two_a_t_interval(eval_context):
    generator = torch.Generator().manual_seed(1)
    one = [Document("one", torch.randint(3, 96, (1200,), generator=generator))]
    ctx = eval_context(None, docs=one)
    perplexity.evaluate(structured(perplexity.PerplexityConfig, lengths=[64, 1024], bootstrap_block=128), ctx)
    rows = {r["length"]: r for r in json.loads((ctx.output.dir / "results.json").read_text())["metrics"]["perplexity"]["by_length"]}
    assert rows[1024]["ci_method"] == "block bootstrap, 128-token blocks"
    assert rows[1024]["ci95_low"] < rows[1024]["ppl"] < rows[1024]["ci95_high"]
    assert rows[64]["ci_method"] is None and rows[64]["ci95_low"] is None  # one block: no interval claimed
    nll = torch.rand(1000, generator=generator)
    assert block_bootstrap(nll, 100, seed=3) == block_bootstrap(nll, 100, seed=3)  # seeded
    ctx = eval_context(None)  # three documents (300, 260, 150 tokens)
    summary = perplexity.evaluate(structured(perplexity.PerplexityConfig, lengths=[64, 200]), ctx)
    rows = {r["length"]: r for r in json.loads((ctx.output.dir / "results.json").read_text())["metrics"]["perplexity"]["by_length"]}
    assert rows[64]["ci_method"] == "t, 3 documents" and rows[200]["ci_method"] == "t, 2 documents"
    assert summary["ppl_ci95_low@200"] == rows[200]["ci95_low"] and summary["tokens@200"] == 2 * 199


def test_effective_length_is_null_with_a_reason_when_nothing_exceeds_the_trained_context(tmp_path, capsys):
    summary, results = run_job(tmp_path, "eval.lengths=[256,512]", "data.books=[persuasion]")
    assert summary["effective_length"] is None
    reason = results["metrics"]["perplexity"]["effective_length_reason"]
    assert "no evaluated length exceeds the trained context (2048)" in reason
    assert f"effective_length: null: {reason}" in capsys.readouterr().out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A small set of real runs: a strategy sweep, the same model with other random weights, a retrieval
    grid, a decay study and a failed job."""
    root = tmp_path_factory.mktemp("runs")
    books = ["data.books=[persuasion]"]
    run_job(root / "sweep" / "none", *books, "eval.lengths=[256,512,4096]")
    run_job(root / "sweep" / "yarn", *books, "eval.lengths=[256,512,4096]", "scaling=yarn")
    run_job(root / "sweep" / "ntk", *books, "eval.lengths=[256,512,4096]", "scaling=ntk")
    run_job(root / "other" / "none_seed1", *books, "eval.lengths=[256,512,4096]", "model.seed=1")
    for name in ("none", "yarn"):
        run_job(root / "sweep" / f"needle_{name}", *books, "eval=needle", "eval.lengths=[256,512]", "eval.depths=[0.2,0.8]",
                "eval.trials=1", f"scaling={name}")
    run_job(root / "sweep" / "decay", "eval=rope_decay", "scaling=yarn", "eval.max_distance=8192",
            "eval.bound_contexts=[1024,2048]")
    with pytest.raises(Exception):
        run_job(root / "sweep" / "failed", *books, "eval.lengths=[256,100000000]")
    return root


def test_report_merges_runs_one_row_per_identity_with_failures_listed(runs):
    written = write_report([runs / "sweep", runs / "other"], runs / "report")
    assert {p.name for p in written} >= {"report.csv", "report.md", "report.html", "report_perplexity.png",
                                        "report_needle_heatmaps.png", "report_needle_accuracy.png", "report_decay.png"}
    md = (runs / "report" / "report.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| model |"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns[:6] == ["model", "weights", "data", "eval", "strategy", "state"]
    assert columns.index("ppl@256") < columns.index("ppl@512") < columns.index("ppl@4096")  # lengths in order
    table = [line for line in md.splitlines() if line.startswith("| tinyllama[random] | random |")]
    ppl_rows = [line for line in table if "| perplexity |" in line]
    assert len(ppl_rows) == 5  # none, yarn, ntk, none with other weights, the failed one
    assert sum("| none | done |" in line for line in ppl_rows) == 2  # same label, other weights: two rows
    assert "Not finished: 1 of" in md and "exceed every document" in md
    assert "Short-context retention" in md and "ppl_retention@256" in md
    csv_lines = (runs / "report" / "report.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + len(table)
    again = write_report([runs / "sweep", runs / "other", runs / "sweep" / "yarn"], runs / "report2")  # no double rows
    assert (runs / "report2" / "report.csv").read_text().count("\n") == len(csv_lines) and again


def test_report_cli_help_and_two_directories(runs, tmp_path):
    result = subprocess.run([sys.executable, "-m", "evals.report", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0 and "usage: python -m evals.report" in result.stdout and "report.html" in result.stdout
    result = subprocess.run([sys.executable, "-m", "evals.report", str(runs / "sweep"), str(runs / "other"), "--out",
                             str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "report.html").stat().st_size > 50_000  # figures embedded


CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="Debian's chromium and chromium-driver are not installed "
                                                      "(.ci/run installs them: apt-get install chromium chromium-driver)")
def test_report_html_renders_tables_and_figures_in_headless_chromium(runs, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    write_report([runs / "sweep", runs / "other"], tmp_path)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        driver.get((tmp_path / "report.html").as_uri())
        images = driver.execute_script(
            "return [...document.images].map(i => [i.alt, i.complete, i.naturalWidth, i.getBoundingClientRect().width])")
        tables = driver.execute_script("return [...document.querySelectorAll('table')].map(t => t.rows.length)")
        text = driver.execute_script("return document.body.innerText")
        height = driver.execute_script("return document.body.scrollHeight")
        driver.set_window_size(1400, min(height + 100, 12000))
        driver.save_screenshot(str(tmp_path / "report.png"))
    finally:
        driver.quit()
    names = {alt for alt, *_ in images}
    assert {"perplexity", "needle_heatmaps", "needle_accuracy", "decay"} <= names
    assert all(complete and natural > 300 and shown > 300 for _, complete, natural, shown in images), images
    assert tables[0] >= 1 + 8 and len(tables) >= 2  # the job table (header + rows) and the retention table
    assert "Not finished: 1 of" in text and "yarn-factor2" in text
    assert (tmp_path / "report.png").stat().st_size > 100_000
    shutil.copy(tmp_path / "report.png", runs / "report_screenshot.png")  # to look at
