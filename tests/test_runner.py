"""The runner and its run directories: nothing computed is lost or reused for other inputs (finished results are
never written over; skip, force and resume by the job's key), bad input is one line before any work, damaged or
foreign results are skipped and named (runs that fail, stop or share a directory: tests/test_runner_failures.py)."""

import json
import os
import time
from pathlib import Path

import pytest

from evals.core.job.parse import parse_job
from evals.report.load import load_jobs
from tests.tiny import ROOT, TINY

SMALL = [*TINY, "data.books=[persuasion]", "eval.lengths=[256,512]"]


def read(path: Path) -> dict:
    return json.loads(Path(path).read_text())


# --- finished results are never written over ------------------------------------------------------------


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
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
    from evals.tasks.lm_harness import TASKS_DIR

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


# --- bad input: one line, exit 2, before any work ---------------------------------------------------------------


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
@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
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


# --- correctness defects ----------------------------------------------------------------------------------------


def test_sliding_scores_max_tokens_of_each_document_and_says_so(eval_context, structured):
    from evals.tasks import perplexity

    ctx = eval_context()
    cfg = structured(perplexity.PerplexityConfig, lengths=[64, 128], protocol="sliding", stride=32, max_tokens=300)
    perplexity.evaluate(cfg, ctx)
    metrics = read(ctx.output.dir / "results.json")["metrics"]["perplexity"]
    rows = {r["length"]: r for r in metrics["by_length"]}
    assert metrics["max_tokens"] == 300
    assert rows[64]["tokens"] == rows[128]["tokens"] == 299 + 259 + 149  # every token after the first, each document


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
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


# --- files that are not ours ------------------------------------------------------------------------------------


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
