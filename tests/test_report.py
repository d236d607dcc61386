"""The report: one report over many runs that answers with verdicts (markdown, CSV and a self-contained HTML page
checked in a real headless browser), never compares runs on other text silently, names disagreeing references,
and its command line."""

import json
import math
import shutil
import subprocess
import sys

import pytest

from evals.report.write import write_report
from tests.tiny import ROOT


@pytest.fixture(scope="module")
def runs(tmp_path_factory, run_job):
    """A small set of real runs: a strategy sweep, the same model with other random weights, a retrieval
    grid, a decay study, a failed job, and a scaled run on other documents (not comparable with the rest)."""
    root = tmp_path_factory.mktemp("runs")
    books = ["data.books=[persuasion]", f"resume_from=[{root / 'sweep'}]"]
    run_job(root / "sweep" / "none", *books, "eval.lengths=[256,512,2048,4096]")
    run_job(root / "sweep" / "yarn", *books, "eval.lengths=[256,512,2048,4096]", "scaling=yarn")
    run_job(root / "sweep" / "ntk", *books, "eval.lengths=[256,512,2048,4096]", "scaling=ntk")
    run_job(root / "other" / "none_seed1", *books, "eval.lengths=[256,512,2048,4096]", "model.seed=1")
    run_job(
        root / "two_books" / "yarn",
        "data.books=[persuasion,emma]",
        "eval.documents=2",
        "eval.lengths=[256,512,2048,4096]",
        "scaling=yarn",
        "verdict.baseline=false",
        "resume_from=[]",
    )
    for name in ("none", "yarn"):
        run_job(
            root / "sweep" / f"needle_{name}",
            *books,
            "eval=needle",
            "eval.lengths=[256,512,2048]",
            "eval.depths=[0.2,0.8]",
            "eval.trials=1",
            f"scaling={name}",
        )
    run_job(
        root / "sweep" / "decay",
        "eval=rope_decay",
        "scaling=yarn",
        "eval.max_distance=8192",
        "eval.bound_contexts=[1024,2048]",
    )
    with pytest.raises(Exception):
        run_job(root / "sweep" / "failed", *books, "eval.lengths=[256,1000000]")  # no novel is as long
    return root


def table(md: str, heading: str) -> list[list[str]]:
    section = md.split(heading, 1)[1].split("\n## ", 1)[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines() if line.startswith("|")]


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_report_answers_with_verdicts_and_merges_runs_one_row_per_identity(runs):
    written = write_report([runs / "sweep", runs / "other"], runs / "report")
    assert {p.name for p in written} >= {
        "report.csv",
        "report.md",
        "report.html",
        "report_verdict.csv",
        "report_ppl_by_length.png",
        "report_ppl_by_length.svg",
        "report_needle_heatmaps.png",
        "report_needle_acc_by_length.png",
        "report_decay.png",
    }
    md = (runs / "report" / "report.md").read_text()
    verdicts = table(md, "## Verdict: does each strategy keep the model working?")
    head, rows = verdicts[0], {(r[2], r[3]): dict(zip(verdicts[0], r)) for r in verdicts[2:]}
    assert head[:6] == ["model", "data", "eval", "strategy", "trained", "target"] and "verdict@4096" in head
    assert {
        ("perplexity", "none"),
        ("perplexity", "yarn-factor2"),
        ("perplexity", "ntk-factor2"),
        ("needle", "none"),
        ("needle", "yarn-factor2"),
    } <= set(rows)
    yarn = rows[("perplexity", "yarn-factor2")]
    assert (
        yarn["target"] == "4096"
        and yarn["verdict"] in ("yes", "NO", "inconclusive")
        and yarn["reference"].endswith("sweep/none")
    )
    assert rows[("perplexity", "none")]["reference"] == "itself"
    header = next(line for line in md.split("## Jobs", 1)[1].splitlines() if line.startswith("| model |"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns[:9] == [
        "model",
        "weights",
        "data",
        "eval",
        "strategy",
        "state",
        "target",
        "verdict",
        "effective_length",
    ]
    assert columns.index("ppl@256") < columns.index("ppl@512") < columns.index("ppl@4096")  # lengths in order
    jobs = [
        line for line in md.split("## Jobs", 1)[1].splitlines() if line.startswith("| tinyllama[random] | random |")
    ]
    ppl_rows = [line for line in jobs if "| perplexity |" in line]
    assert len(ppl_rows) == 5  # none, yarn, ntk, none with other weights, the failed one
    assert "Not finished: 1 of" in md and "exceed every document" in md
    assert "Short-context retention" in md and "ppl_retention@256" in md
    csv_lines = (runs / "report" / "report.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + len(jobs) and "verdict@4096" in csv_lines[0]
    again = write_report([runs / "sweep", runs / "other", runs / "sweep" / "yarn"], runs / "report2")  # no double rows
    assert (runs / "report2" / "report.csv").read_text().count("\n") == len(csv_lines) and again


def test_runs_on_other_text_are_never_compared_silently(runs, tmp_path):
    """yarn scored on two documents is not judged against the unscaled run on one: a visible warning naming
    what differs, no retention, no verdict; the differing field is a column of the job table."""
    write_report([runs / "sweep", runs / "two_books"], tmp_path)
    md = (tmp_path / "report.md").read_text()
    warnings = md.split("## Warnings: what could not be compared", 1)[1].split("\n## ", 1)[0]
    assert "two_books/yarn" in warnings and "eval.documents: 2 vs 1" in warnings
    verdicts = {(r[2], r[3], r[-1]): r for r in table(md, "## Verdict")[2:]}
    (row,) = [r for (e, s, ref), r in verdicts.items() if "not compared" in ref]
    assert row[3] == "yarn-factor2" and "not judged" in row and "yes" not in row[6:] and "NO" not in row[6:]
    retained = table(md, "## Short-context retention")
    assert sum(r[2] == "perplexity" and r[3] == "yarn-factor2" for r in retained[2:]) == 1  # the comparable yarn only
    assert "perplexity:eval.documents" in md.split("## Jobs", 1)[1].splitlines()[2]


def test_two_unscaled_references_that_disagree_are_named(runs, tmp_path):
    """A copy of the unscaled run made with other code, with another number: used with a note, never silently."""
    original = json.loads((runs / "sweep" / "none" / "results.json").read_text())
    twin = tmp_path / "twin" / "none"
    twin.mkdir(parents=True)
    original["job"].update(key="0" * 16, environment="another")
    at_256 = next(m for m in original["measurements"] if (m["metric"], m["length"]) == ("ppl", 256))
    at_256["value"] *= 1.5
    (twin / "results.json").write_text(json.dumps(original))
    write_report([runs / "sweep", tmp_path / "twin"], tmp_path / "out")
    warnings = (tmp_path / "out" / "report.md").read_text().split("## Warnings", 1)[1].split("\n## ", 1)[0]
    assert "two unscaled runs disagree on ppl@256" in warnings


def test_report_cli_help_and_two_directories(runs, tmp_path):
    result = subprocess.run([sys.executable, "-m", "evals.report", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert (
        result.returncode == 0 and "usage: python -m evals.report" in result.stdout and "report.html" in result.stdout
    )
    assert ":class:" not in result.stdout and "``" not in result.stdout
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "evals.report",
            str(runs / "sweep"),
            str(runs / "other"),
            "--out",
            str(tmp_path),
            "--tolerance",
            "0.5",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "verdict: tinyllama[random], perplexity on books" in result.stdout  # the answer, printed
    assert (tmp_path / "report.html").stat().st_size > 50_000  # figures embedded
    assert "lower-is-better metrics (ppl, LongPPL) pass at most 1.5" in (tmp_path / "report.md").read_text()
    bad = subprocess.run(
        [sys.executable, "-m", "evals.report", str(runs / "sweep"), "--retained", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "--retained=2.0 is out of range" in bad.stderr


CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def _chromium(tmp_path, width: int = 1400, height: int = 1000):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--window-size={width},{height}",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(DRIVER), options=options)


@pytest.mark.skipif(
    not (CHROMIUM and DRIVER),
    reason="Debian's chromium and chromium-driver are not installed "
    "(.ci/run installs them: apt-get install chromium chromium-driver)",
)
def test_report_html_renders_tables_and_figures_in_headless_chromium(runs, tmp_path):
    failing = json.loads((runs / "sweep" / "yarn" / "results.json").read_text())  # a strategy that breaks at 4096
    failing["job"].update(key="f" * 16, scaling="yarn-broken")
    for record in failing["measurements"]:  # three times the perplexity at 4096: every block's NLL + log 3
        if (record["metric"], record["length"]) == ("ppl", 4096):
            record["value"] *= 3
            record["units"] = {k: [nll + math.log(3) * n, n] for k, (nll, n) in record["units"].items()}
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "results.json").write_text(json.dumps(failing))
    write_report([runs / "sweep", runs / "other", tmp_path / "broken"], tmp_path)
    driver = _chromium(tmp_path)
    try:
        driver.get((tmp_path / "report.html").as_uri())
        images = driver.execute_script(
            "return [...document.images].map(i => [i.alt, i.complete, i.naturalWidth, i.getBoundingClientRect().width])"
        )
        tables = driver.execute_script(
            "return [...document.querySelectorAll('table')].map(t => [t.className, t.rows.length])"
        )
        text = driver.execute_script("return document.body.innerText")
        overflow = driver.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
        verdict_cells = driver.execute_script(
            "return [...document.querySelectorAll('table.verdict td.yes, table.verdict td.no')].map(td => "
            "getComputedStyle(td).backgroundColor)"
        )
        # the interactive chart: a click on a legend entry hides that run's line, a second click shows it again
        chart = "document.querySelector('.chart')"
        shown = driver.execute_script(
            f"return [...{chart}.querySelectorAll('svg g[data-series]')].map(g => getComputedStyle(g).display)"
        )
        driver.execute_script(f"{chart}.querySelector('.legend [data-series=\"0\"]').click()")
        hidden = driver.execute_script(
            f"return getComputedStyle({chart}.querySelector('svg g[data-series=\"0\"]')).display"
        )
        tips = driver.execute_script(
            "return [...document.querySelectorAll('.chart circle title')].map(t => t.textContent)"
        )
        driver.execute_script(f"{chart}.querySelector('.legend [data-series=\"0\"]').click()")
        again = driver.execute_script(
            f"return getComputedStyle({chart}.querySelector('svg g[data-series=\"0\"]')).display"
        )
        height = driver.execute_script("return document.body.scrollHeight")
        driver.set_window_size(1400, min(height + 100, 12000))
        driver.save_screenshot(str(tmp_path / "report.png"))
    finally:
        driver.quit()
    names = {alt for alt, *_ in images}
    assert {"ppl_by_length", "needle_heatmaps", "needle_acc_by_length", "decay"} <= names
    assert all(complete and natural > 300 and shown > 300 for _, complete, natural, shown in images), images
    classes = dict(tables)
    assert classes["verdict"] >= 1 + 5 and classes["jobs"] >= 1 + 8  # the answer first, the job table after
    assert overflow <= 0  # readable at 1400 px: wide tables scroll inside the page, the page itself does not
    assert verdict_cells and len(set(verdict_cells)) == 2  # yes and NO in their two colours
    assert all(d != "none" for d in shown) and hidden == "none" and again != "none"
    assert any("at 4096 tokens" in t for t in tips)
    assert "Not finished: 1 of" in text and "yarn-factor2" in text and "Verdict: does each strategy" in text
    assert (tmp_path / "report.png").stat().st_size > 100_000
    shutil.copy(tmp_path / "report.png", runs / "report_screenshot.png")  # to look at


def _ppl_at(result: dict, values: dict[int, float]) -> dict:
    """``result`` with its perplexity at each length set to ``values[length]`` (every block's NLL shifted to
    match, an interval of +-0.15 around it)."""
    for record in result["measurements"]:
        if record["metric"] == "ppl" and record["length"] in values:
            shift = math.log(values[record["length"]] / record["value"])
            record["value"] = values[record["length"]]
            record["low"], record["high"] = record["value"] - 0.15, record["value"] + 0.15
            record["units"] = {k: [nll + shift * n, n] for k, (nll, n) in record["units"].items()}
    return result


@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="Debian's chromium and chromium-driver are not installed")
def test_the_length_chart_tells_five_close_strategies_apart_in_headless_chromium(runs, tmp_path):
    """Five strategies between 26 and 27 and the unscaled run at 1400 px: the main panel has a linear axis with
    labelled ticks and an interval band per run, and the ratio panel below puts the five lines apart."""
    lengths = (256, 512, 2048, 4096)
    unscaled = json.loads((runs / "sweep" / "none" / "results.json").read_text())
    (tmp_path / "close" / "none").mkdir(parents=True)
    (tmp_path / "close" / "none" / "results.json").write_text(
        json.dumps(_ppl_at(unscaled, dict(zip(lengths, (26.0, 26.1, 26.3, 90.0)))))
    )
    for k, name in enumerate(("yarn", "ntk", "linear", "longrope", "dynamic_ntk")):
        result = json.loads((runs / "sweep" / "yarn" / "results.json").read_text())
        result["job"].update(key=f"{k}" * 16, scaling=name)
        result["config"]["scaling"]["name"] = name
        (tmp_path / "close" / name).mkdir()
        (tmp_path / "close" / name / "results.json").write_text(
            json.dumps(_ppl_at(result, {L: 26.05 + 0.2 * k + 0.02 * i for i, L in enumerate(lengths)}))
        )
    write_report([tmp_path / "close"], tmp_path)
    driver = _chromium(tmp_path)
    try:
        driver.get((tmp_path / "report.html").as_uri())
        chart = driver.find_element("css selector", ".chart")
        found = driver.execute_script(
            """
            const chart = arguments[0], last = pl => {  // the last point of a polyline, in screen pixels
              const p = pl.points[pl.points.numberOfItems - 1], m = pl.getScreenCTM();
              return p.x * m.b + p.y * m.d + m.f; };
            return {ticks: [...chart.querySelectorAll('.values text.ytick')].map(t => t.textContent),
                    ratio_ticks: chart.querySelectorAll('.ratio text.ytick').length,
                    bands: chart.querySelectorAll('.values polygon.band').length,
                    levels: [...chart.querySelectorAll('.ratio line.level')].map(l => l.getAttribute('stroke-dasharray')),
                    last: Object.fromEntries([...chart.querySelectorAll('.ratio g[data-series]')].map(g =>
                      [g.getAttribute('data-strategy'), last(g.querySelector('polyline'))])),
                    width: chart.querySelector('svg').getBoundingClientRect().width};""",
            chart,
        )
        chart.screenshot(str(tmp_path / "chart.png"))
    finally:
        driver.quit()
    assert len(found["ticks"]) >= 3 and found["ratio_ticks"] >= 3, found
    assert found["bands"] == 6 and found["levels"] == ["6,4", "6,4"], found  # 1 and the verdict limit, dashed
    scaled = [y for name, y in found["last"].items() if name != "none"]
    assert len(scaled) == 5 and found["width"] > 600, found
    assert all(abs(a - b) >= 3 for i, a in enumerate(scaled) for b in scaled[i + 1 :]), found
    assert (tmp_path / "chart.png").stat().st_size > 0


@pytest.mark.slow  # a CLI run with its reference, and the report CLI (~25 s)
def test_an_eval_from_outside_gets_its_verdict_retention_and_report_section_with_no_project_edit(
    plugin, run_cli, searchpath, tmp_path
):
    """The plugin's prefix_nll declares one lower-is-better metric and a report section -- nothing else: the
    reference is run for it, its retention and verdict are in the summary, and the report draws its section."""
    from tests.tiny import MICRO

    plug, env = plugin
    out = tmp_path / "out"
    result = run_cli(
        *MICRO,
        "model.architecture.vocab_size=49152",
        searchpath(plug),
        "scaling=halve_slow",
        "scaling.factor=4",
        "eval=prefix_nll",
        "data.books=[persuasion]",
        "verdict.baseline=true",
        f"output_dir={out}",
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert set(summary) >= {
        "prefix_nll@32",
        "prefix_nll@64",
        "prefix_nll@128",
        "prefix_nll_retention@32",
        "prefix_nll_retention@64",
        "verdict@32",
        "verdict@64",
        "verdict@128",
    }
    assert summary["verdict_state@128"] in ("yes", "NO", "inconclusive"), summary["verdict_reason@128"]
    # 32 tokens are 4 blocks of one document: fewer than the calibrated minimum (evals/core/stats.py MIN_BLOCKS)
    assert summary["verdict@32"] is None and "at least 8 are needed" in summary["verdict_reason@32"]
    report = subprocess.run(
        [sys.executable, "-m", "evals.report", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert report.returncode == 0, report.stderr[-3000:]
    md = (out / "report.md").read_text()
    assert "report_prefix_nll_bars.png" in md and (out / "report_prefix_nll_bars.png").is_file()
    (row,) = [r for r in table(md, "## Verdict") if r[0] != "model" and not set(r[0]) <= {"-"}]
    assert any("prefix NLL" in c or "prefix_nll" in c for c in table(md, "## Verdict")[0] + row), md


def test_the_report_lists_files_it_cannot_read_and_refuses_an_out_it_cannot_write(tmp_path, capsys):
    from evals.report.cli import main

    for name, text in {"list": "[]", "empty": "{}", "tool": '{"accuracy": 0.5}', "cut": '{"status": "do'}.items():
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "results.json").write_text(text)
    assert main([str(tmp_path / "runs")]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    md = (tmp_path / "runs" / "report.md").read_text()
    for reason in ("is not a rope_ext result", "is not valid JSON"):
        assert reason in md
    assert md.count("unreadable") >= 4
    (tmp_path / "afile").write_text("x")
    assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "afile")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: the report cannot be written to {tmp_path / 'afile'}: "
        f"{tmp_path / 'afile'} is a file, not a directory; give a writable "
        f"directory with --out"
    )


def test_the_length_figure_s_legend_covers_no_band():
    """Issue 55: in the perplexity PNG the legend (``loc="best"``) covered the interval bands. With bands that fill
    the plot, as wide ones do, no place inside it is free: the legend box must not overlap any band, as drawn."""
    from evals.core.plots import Curve, length_figure

    lengths = [256, 512, 1024, 2048, 4096]
    curves = [
        Curve(
            name,
            name,
            [{"length": L, "value": 10.0 * (k + 1), "low": 1.0, "high": 1000.0} for L in lengths],
            {L: 10.0 for L in lengths},
        )
        for k, name in enumerate(["none", "linear", "yarn", "ntk"])
    ]
    fig = length_figure(
        curves,
        "value",
        ylabel="perplexity",
        title="bands everywhere",
        band=("low", "high"),
        logy=True,
        trained=1024,
        target=4096,
        ratio={"label": "ratio", "limit": 1.1},
    )
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    checked = 0
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        box = legend.get_window_extent(renderer)
        for band in ax.collections:
            for path in band.get_paths():
                drawn = band.get_transform().transform_path(path).get_extents()
                assert not box.overlaps(drawn), (box, drawn)
                checked += 1
        assert not box.overlaps(ax.get_window_extent(renderer))  # nor anything else plotted
    assert checked == len(curves)
