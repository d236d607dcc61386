"""The runner and its run directories: nothing computed is lost or reused for other inputs (finished results are
never written over; skip, force and resume by the job's key), a sweep survives its failures, bad input is one line
before any work, memory failures are results, interrupted and dead runs say so."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evals.core.job.parse import parse_job
from evals.core.run.rundir import state
from evals.report.load import load_jobs
from tests.tiny import ROOT, TINY

SMALL = [*TINY, "data.books=[persuasion]", "eval.lengths=[256,512]"]


def read(path: Path) -> dict:
    return json.loads(Path(path).read_text())


# --- finished results are never written over ------------------------------------------------------------


def test_finished_results_are_untouched_by_any_rerun(tmp_path, capsys, compose, run_job):
    out = tmp_path / "run"
    args = ["data.books=[persuasion]", "eval.lengths=[256,512]"]
    first, _ = run_job(out, *args)
    snapshot = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    import run as rope_run

    again = rope_run.run(compose(*TINY, *args, f"output_dir={out}"))  # the same job: skipped
    assert again == first and "skip: the same job finished in" in capsys.readouterr().out
    run_job(out, *args)  # force=true: recomputed, next to it
    run_job(out, "data.books=[persuasion]", "eval.lengths=[256]")  # another job aimed at the same directory
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == snapshot
    assert read(tmp_path / "run-2" / "results.json")["status"] == "done"
    assert read(tmp_path / "run-3" / "results.json")["config"]["eval"]["lengths"] == [256]


def test_a_job_moved_beside_its_directory_is_found_there_when_run_again(tmp_path, capsys, compose, run_job):
    """A job whose output_dir held another run writes to <dir>-2; the same command again found nothing in <dir> and
    computed it a second time into <dir>-3."""
    import run as rope_run

    out = tmp_path / "run"
    run_job(out, "data.books=[persuasion]", "eval.lengths=[256]")  # another run holds the directory
    args = [*TINY, "data.books=[persuasion]", "eval.lengths=[256,512]", "verdict.baseline=false", f"output_dir={out}"]
    first = rope_run.run(compose(*args))
    assert f"holds another run; this one writes to {tmp_path / 'run-2'}" in capsys.readouterr().out
    again = rope_run.run(compose(*args))  # the same command
    assert again == first and f"skip: the same job finished in {tmp_path / 'run-2'}" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "run-2"]  # neither computed again nor a pointer


@pytest.mark.slow  # several CLI runs; CI runs the slow set after the default suite
def test_a_sweep_rerun_into_its_own_directory_skips_every_finished_job(tmp_path, run_cli):
    sweep_dir = tmp_path / "sweep"
    command = ["-m", *SMALL, f"hydra.sweep.dir={sweep_dir}", "resume_from=[]", "scaling=none,linear"]
    first = run_cli(*command)
    assert first.returncode == 0
    # where the sweep is, after each job
    assert "sweep: job 1/2 finished; about " in first.stdout and " left at the rate measured so far (" in first.stdout
    assert "sweep: job 2/2 finished\n" in first.stdout
    before = {p: p.read_bytes() for p in sweep_dir.glob("*/results.json")}
    again = run_cli(*command)
    assert again.returncode == 0 and again.stdout.count("skip: the same job finished") == 2
    assert {p: p.read_bytes() for p in sweep_dir.glob("*/results.json")} == before and len(before) == 2
    shared = run_cli(
        "-m",
        *SMALL,
        f"hydra.sweep.dir={tmp_path / 'other'}",
        f"output_dir={tmp_path / 'shared'}",
        "resume_from=[]",
        "scaling=none,linear",
        "force=true",
    )
    assert shared.returncode == 0  # output_dir in a multirun: one subdirectory per job, not one folder for all
    assert sorted(p.parent.name for p in (tmp_path / "shared").glob("*/results.json")) == [
        "0_tinyllama_none",
        "1_tinyllama_linear_x2",
    ]


# --- every input that changes a number changes the key ------------------------------------------------------


def test_every_input_that_changes_a_number_changes_the_key(tmp_path, models, compose):
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("Some text to score. " * 400)

    def key(
        *overrides, base=(*TINY, "scaling=yarn", "eval.lengths=[256]", "data=text_files", f"data.glob={texts}/*.txt")
    ):
        return parse_job(compose(*base, models, *overrides), tmp_path / "k").key

    reference = key()
    assert key() == reference  # deterministic
    changed = {
        "factor": key("scaling.factor=4"),
        "beta_fast": key("scaling.beta_fast=16"),
        "strategy": key("scaling=ntk"),
        "lengths": key("eval.lengths=[512]"),
        "eval option": key("eval.chunk_tokens=64"),
        "seed": key("seed=1"),
        "weights seed": key("model.seed=1"),
        "dtype": key("model.dtype=bfloat16"),
        "size": key("model.architecture.hidden_size=128"),
        "attention": key("model.attn_implementation=eager"),
        "tokenizer": key(f"model.tokenizer={ROOT / 'tests'}"),
        "trained context": key("model.original_max_position=1024"),
    }
    (texts / "a.txt").write_text("Other text to score. " * 400)
    changed["data content"] = key()
    assert len(set(changed.values()) | {reference}) == len(changed) + 1, changed
    # which layers are scaled is part of the scaling: Gemma-3 with auto (global layers) vs all
    gemma = (*TINY, "model=tinygemma", "scaling=linear", "eval.lengths=[256]")
    assert key("scaling.layer_types=auto", base=gemma) != key("scaling.layer_types=all", base=gemma)
    assert key("scaling.layer_types=auto", base=gemma) == key("scaling.layer_types=[full_attention]", base=gemma)
    # what a strategy ignores does not: none with any factor is the same job
    assert key("scaling=none", "scaling.factor=2") == key("scaling=none", "scaling.factor=4")


def test_the_code_in_the_key_covers_the_lm_eval_task_files():
    """Our lm-eval tasks are code: their YAMLs, ``*_yaml`` templates and functions change numbers too."""
    from evals.core.job.identity import code_files
    from evals.lm_harness import TASKS_DIR

    files = set(code_files())
    for name in (
        "_ruler_template_yaml",
        "_retrieval_template_yaml",
        "rope_ext_ruler_niah_single_1.yaml",
        "rope_ext_ruler_utils.py",
    ):
        assert str(TASKS_DIR / name) in files


def test_weights_file_identity_is_in_the_key(tmp_path, compose, tiny_llama):
    """A local checkpoint replaced by another one with the same name is another job."""
    checkpoint = tmp_path / "ckpt"
    tiny_llama(vocab=49152).save_pretrained(checkpoint)
    args = [
        *TINY,
        "model.weights=pretrained",
        f"model.path={checkpoint}",
        f"model.tokenizer={ROOT / 'tests'}",
        "eval.lengths=[64]",
        "data.books=[persuasion]",
    ]
    first = parse_job(compose(*args), tmp_path / "k").key
    time.sleep(0.01)
    tiny_llama(vocab=49152, seed=1).save_pretrained(checkpoint)
    assert parse_job(compose(*args), tmp_path / "k").key != first


# --- a sweep survives its failures ------------------------------------------------------------------------


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


# --- bad input: one line, exit 2, before any work ---------------------------------------------------------

BAD_VALUES = [
    (["scaling=linear", "scaling.factor=0.5"], "factor=0.5 must be >= 1"),
    (["scaling=ntk", "scaling.factor=0"], "factor=0.0 must be >= 1"),
    (["scaling=yarn", "scaling.factor=inf"], "factor=inf must be a finite number"),
    (["scaling=mixed", "scaling.bands=null", "scaling.factors=[1,2]"], "factors needs d/2 = 32 values"),
    (["scaling=mixed", "scaling.bands=[{dims:[0,20],factor:1},{dims:[10,32],factor:2}]"], "overlaps earlier bands"),
    (["scaling=yarn", "scaling.beta_fast=0"], "beta_fast=0.0 must be > 0"),
    (["scaling=yarn", "scaling.beta_fast=1", "scaling.beta_slow=2"], "beta_fast=1 must be > beta_slow=2"),
    (["scaling=yarn", "scaling.original_max_position=0"], "original_max_position=0 must be >= 1"),
    (["scaling=longrope", "scaling.short_factor=[1]", "scaling.long_factor=[1]"], "short_factor needs d/2 = 32 values"),
    (["scaling=linear", "scaling.layer_types=[global]"], "layer_types ['global'] not in this model"),
    (["model.device=cuda"], "model.device='cuda' but this machine has no CUDA device"),
    (["model.device=gpu7"], "model.device='gpu7' is not a device"),
    (["model.attn_implementation=fast"], "attn_implementation='fast'"),
    (["eval=rope_decay", "eval.head_dim=63"], "eval.head_dim=63 must be even"),
    (["eval=needle", "eval.depths=[0.5,2]"], "eval.depths=[0.5, 2.0]: each value must be <= 1"),
    (["eval=needle", "eval.needle=no key"], "must contain {key}"),
    (["verdict.tolerance=-1"], "verdict.tolerance=-1.0: must be >= 0"),
    (["verdict.retained=1.5"], "verdict.retained=1.5: must be <= 1"),
    (["data.max_documents=0"], "data.max_documents=0: must be >= 1"),
    (["scaling=compose", "scaling.stages=[]"], "scaling 'compose' needs at least one stage"),
    (["scaling=compose", "scaling.stages=[yarn]"], "scaling 'compose': stage 'yarn' is not a scaling config"),
    (
        ["+eval.chunk_tokenz=64"],
        "eval.chunk_tokenz is not an option here; valid: lengths,",
    ),  # + adds past Hydra's check
    (["eval.longppl=true", "+eval.key_tokens.alfa=1"], "eval.key_tokens.alfa is not an option here; valid: evaluator,"),
    (["eval=suite", "+eval.perplexty.lengths=[64]"], "eval.perplexty is not an option here; valid: run,"),
    (["+verdict.tolerence=0.2"], "verdict.tolerence is not an option here"),
    (["eval=qk_study", "eval.document=9"], "eval.document=9 but the data has 6 documents (0..5)"),  # before tokenizing
]


def one_line_error(result, message):
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr[-2000:]
    output = result.stdout + result.stderr
    assert "random weights" not in output and "loading" not in output and "tokenize" not in output  # no work done


@pytest.mark.parametrize("args,message", BAD_VALUES, ids=[" ".join(a) for a, _ in BAD_VALUES])
def test_each_bad_value_is_one_line_before_any_work(args, message, tmp_path, compose):
    """Parsing the job (what the CLI does first) rejects the value: no model, no tokenizer, no documents
    (how long the CLI takes for these is in docs/benchmarks.md; a timed test would be flaky)."""
    from evals import UserError

    with pytest.raises(UserError) as err:
        parse_job(compose("logger=none", *args), tmp_path)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "results.json").exists()


@pytest.mark.slow  # several CLI runs; CI runs the slow set after the default suite
def test_bad_files_and_models_are_one_line_and_exit_2_from_the_cli(tmp_path, models, run_cli):
    empty, latin = tmp_path / "empty.txt", tmp_path / "latin.txt"
    empty.write_text("  \n")
    latin.write_bytes("Emma Woodhouse, caf\xe9".encode("latin-1"))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "model.gguf").write_bytes(b"GGUF" + os.urandom(64))
    cases = [
        (["scaling=yarn", "scaling.beta_fast=1", "scaling.beta_slow=2"], "beta_fast=1 must be > beta_slow=2"),
        (["model.device=cuda"], "model.device='cuda' but this machine has no CUDA device"),
        (["data=text_files", f"data.glob={empty}"], f"data file {empty} is empty"),
        (["data=text_files", f"data.glob={latin}"], f"data file {latin} is not UTF-8 text"),
        ([models, "model=tinygpt2", "eval=rope_decay"], "model 'tinygpt2' (gpt2) has no RoPE"),
        (
            [f"model.path={tmp_path / 'broken'}", "model.gguf_file=model.gguf", "model.gguf_package=null"],
            "cannot be read as GGUF",
        ),
        ([*TINY, "+model.architecture.head_dim=15"], "RoPE requires an even rotary dimension"),
        ([*TINY, "model.architecture.head_dim=15"], "model.architecture.head_dim is not in the config; to add a key"),
    ]
    for args, message in cases:
        one_line_error(run_cli("logger=none", f"hydra.run.dir={tmp_path / 'run'}", *args), message)


# --- memory: a failed allocation at one length is a result ---------------------------------------------


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


# --- correctness defects ------------------------------------------------------------------------------------


def test_sliding_scores_max_tokens_of_each_document_and_says_so(eval_context, structured):
    from evals import perplexity

    ctx = eval_context()
    cfg = structured(perplexity.PerplexityConfig, lengths=[64, 128], protocol="sliding", stride=32, max_tokens=300)
    perplexity.evaluate(cfg, ctx)
    metrics = read(ctx.output.dir / "results.json")["metrics"]["perplexity"]
    rows = {r["length"]: r for r in metrics["by_length"]}
    assert metrics["max_tokens"] == 300
    assert rows[64]["tokens"] == rows[128]["tokens"] == 299 + 259 + 149  # every token after the first, each document


def test_rope_decay_studies_the_layers_the_strategy_scales(tmp_path, models, run_job):
    _, results = run_job(
        tmp_path,
        models,
        "model=tinygemma",
        "eval=rope_decay",
        "scaling=yarn",
        "eval.max_distance=1024",
        "eval.bound_contexts=[256]",
    )
    summary = results["summary"]
    assert summary["base"] == 1e6 and summary["rotary_dim"] == 32  # the global layers', not 1e4
    _, results = run_job(
        tmp_path / "all",
        models,
        "model=tinygemma",
        "eval=rope_decay",
        "scaling=yarn",
        "scaling.layer_types=all",
        "eval.max_distance=1024",
        "eval.bound_contexts=[256]",
    )
    assert {results["summary"]["base_full_attention"], results["summary"]["base_sliding_attention"]} == {1e6, 1e4}


# --- files that are not ours, and a full disk ---------------------------------------------------------------


def test_foreign_and_damaged_results_files_are_skipped_and_named_once(tmp_path, capsys, compose):
    import run as rope_run
    from evals.core import files

    files._SAID.clear()
    other = tmp_path / "elsewhere"
    for name, text in {
        "a_list": "[]",
        "an_object": "{}",
        "another_tool": '{"status": 3, "job": []}',
        "cut": '{"status": "done", "job": {"key"',
    }.items():
        (other / name).mkdir(parents=True)
        (other / name / "results.json").write_text(text)
    out = tmp_path / "run"
    (out).mkdir()
    (out / "results.json").write_text("[1, 2]")  # another tool's file where the job writes: kept, never overwritten
    summary = rope_run.run(compose(*SMALL, f"output_dir={out}", f"resume_from=[{other}]", "verdict.baseline=false"))
    assert summary["ppl@512"] > 0 and (out / "results.json").read_text() == "[1, 2]"
    assert read(tmp_path / "run-2" / "results.json")["status"] == "done"
    err = capsys.readouterr().err
    for name in ("a_list", "an_object", "another_tool", "cut"):
        assert err.count(f"note: skipping {other / name / 'results.json'}: it ") == 1, err
    assert "Traceback" not in err
    # the report lists each as an unreadable row with the reason
    rows = {str(j["dir"].name): j for j in load_jobs([other])}
    assert {r["state"] for r in rows.values()} == {"unreadable"}
    assert "is not valid JSON" in rows["cut"]["error"]["message"]
    assert "is not a rope_ext result" in rows["a_list"]["error"]["message"]


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
