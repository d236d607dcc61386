"""End to end through run.run(cfg): real Hydra composition, the bundled books, tiny random-weight models."""

import json
import os
import subprocess
import sys

import pytest

from tests.tiny import ROOT

BOOKS = ["data.books=[persuasion,emma]", "data.max_documents=2"]


def test_perplexity_job_writes_results_csv_png(tmp_path, run_job):
    summary, results = run_job(tmp_path, *BOOKS, "scaling=yarn", "eval.lengths=[256,1024,4096]", "eval.documents=null")
    assert results["status"] == "done"
    assert results["config"]["scaling"]["name"] == "yarn" and results["versions"]["transformers"].startswith("5.")
    assert results["rope"]["patched"][0]["attention_factor"] > 1  # YaRN temperature applied to the model
    assert results["rope"]["scaling"]["original_max_position"] == 2048  # filled from the model config
    assert (
        results["config"]["scaling"]["label"] == "yarn-factor2" and results["job"]["model_label"] == "tinyllama[random]"
    )
    rows = results["metrics"]["perplexity"]["by_length"]
    assert [r["length"] for r in rows] == [256, 1024, 4096] and all(r["documents"] == 2 for r in rows)
    assert summary["ppl@4096"] == rows[2]["ppl"] > 1
    for name in (
        "perplexity.csv",
        "ppl_by_length.png",
        "ppl_by_length.svg",
        "loss_by_position.csv",
        "loss_by_position_plot.png",
    ):
        assert (tmp_path / name).stat().st_size > 0
    assert results["timings"]["elapsed_s"] > 0


def test_model_is_loaded_once_and_repatched_across_jobs(tmp_path, run_job):
    first, _ = run_job(tmp_path / "a", *BOOKS, "scaling=none", "eval.lengths=[512]")
    second, results = run_job(tmp_path / "b", *BOOKS, "scaling=linear", "scaling.factor=4", "eval.lengths=[512]")
    third, _ = run_job(tmp_path / "c", *BOOKS, "scaling=none", "eval.lengths=[512]")
    assert second["ppl@512"] != first["ppl@512"]
    assert third["ppl@512"] == first["ppl@512"]  # the patch was fully restored between jobs
    assert "random weights" in results["rope"]["model_source"]


def test_rope_decay_job_needs_no_weights(tmp_path, run_job):
    summary, results = run_job(
        tmp_path,
        *BOOKS,
        "eval=rope_decay",
        "scaling=yarn",
        "scaling.factor=4",
        "eval.max_distance=8192",
        "eval.bound_contexts=[1024,2048,4096]",
        "model.architecture.hidden_size=2048",
        "model.architecture.num_attention_heads=32",
    )  # TinyLlama's real head size
    assert summary["rotary_dim"] == 64 and summary["base"] == 10000.0
    assert summary["decay_strength/none/gauss_mean1"] > 0.3 and abs(summary["decay_strength/none/gauss_mean0"]) < 0.15
    assert summary["base_bound_max_context"] == 1024  # base 1e4 is below the bound for 2k at d = 64
    assert summary["pairs_extrapolated"] > 0 and summary["pairs_interpolated"] > 0
    assert "rope" not in results  # no model was loaded
    for name in (
        "rope_decay.csv",
        "base_bound.csv",
        "dimensions.csv",
        "rope_decay_plot.png",
        "base_bound_plot.png",
        "dimensions_plot.png",
    ):
        assert (tmp_path / name).stat().st_size > 0


def test_rope_decay_computes_the_base_bound_at_the_model_s_head_dim_and_lengths(tmp_path, run_job):
    """``target=2x eval=rope_decay`` on the tiny model spent minutes on bounds at 32768 tokens and head dim 128 (a
    reference curve), neither the model's own; the bound is computed at its head dim, from trained/4 to the target."""
    import csv

    summary, _ = run_job(tmp_path, *BOOKS, "model.original_max_position=256", "target=2x", "eval=rope_decay")
    rows = list(csv.DictReader((tmp_path / "base_bound.csv").open()))
    assert [int(r["context"]) for r in rows] == [64, 128, 256, 512]  # trained 256, target 512
    assert {int(r["rotary_dim"]) for r in rows} == {summary["rotary_dim"]} == {16}


def test_failed_job_keeps_what_it_wrote(tmp_path, run_job):
    from evals import UserError

    with pytest.raises(UserError, match="exceed every document"):
        run_job(tmp_path, *BOOKS, "eval.lengths=[512,1000000]")  # a million tokens: no novel is as long; fits memory
    results = json.loads((tmp_path / "results.json").read_text())
    # the trained context (2048) is measured too: the unscaled job is its own reference beyond it
    assert results["status"] == "failed" and results["config"]["eval"]["lengths"] == [512, 2048, 1000000]
    assert "exceed every document" in results["error"]["message"] and results["error"]["user_error"]


def test_only_the_documents_asked_for_are_tokenized(tmp_path, capsys):
    from evals.core.config.structured import DataConfig
    from evals.core.inputs.data import load_documents
    from evals.core.inputs.loading import bundled_tokenizer
    from evals.core.progress import progress

    books = DataConfig(name="books", source="books", books=["persuasion", "emma"])
    assert [d.name for d in load_documents(books, bundled_tokenizer(), count=1)] == ["persuasion"]
    assert [d.name for d in load_documents(books, bundled_tokenizer(), count=1, min_tokens=10**9)] == [
        "persuasion",
        "emma",
    ]
    assert list(progress(range(50), "quick", "item")) == list(range(50))  # a quick loop leaves no line in a log
    assert "quick" not in capsys.readouterr().err


# ``python run.py <args>`` in a fresh process, then which of the libraries only a running job needs it imported
PROBE = """
import json, sys
sys.argv = ["run.py", *json.loads(sys.argv[1])]
import run
try:
    code = run.main()
except SystemExit as exit:
    code = exit.code
heavy = ("torch", "transformers", "lm_eval", "matplotlib", "wandb", "optuna", "datasets")
print(json.dumps({"code": code, "imported": sorted(m for m in heavy if m in sys.modules)}))
"""


@pytest.mark.parametrize(
    "args, code, says",
    [
        (["--help"], 0, None),
        (["scaling=nope"], 2, "error: scaling=nope is not an option"),
        (["target=abc"], 2, "error: target='abc' is not a length"),
        (["verdict.target=-5"], 2, "error: verdict.target=-5 is -5 tokens: a target is a positive length"),
        (["-m", "scaling=none,nope"], 2, "error: scaling=nope is not an option"),
        # to see a sweep before running it: Hydra's own ValueError was a traceback
        (["-m", "experiment=compare", "target=2x", "--cfg", "job"], 2, "error: -m and --cfg together: Hydra takes one"),
        (["--resolve"], 2, "error: --resolve goes with --cfg or --help"),
        # -m forgotten: Hydra ran the unscaled model alone (hours on a CPU) and compared nothing
        (["experiment=compare", "target=2x"], 2, "error: experiment=compare is a sweep (scaling over none,linear,"),
    ],
)
def test_help_and_bad_input_are_answered_before_torch_transformers_or_matplotlib_is_imported(args, code, says):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args)], cwd=ROOT, capture_output=True, text=True, env=env, timeout=120
    )
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    assert probe == {"code": code, "imported": []}, result.stderr[-2000:]
    if says is None:
        assert "== Configuration groups ==" in result.stdout and "scaling: base, base_20k, compose" in result.stdout
    else:
        assert result.stderr.strip().startswith(says) and len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("bad", ["target=abc", "model.path=/nonexistent/checkpoint"])
def test_a_command_refused_for_bad_input_leaves_no_run_directory_behind(tmp_path, bad):
    """Issue 55: every failed command left an ``outputs/<date>/<time>_.../`` with ``.hydra/`` and an empty cli.log
    (8 after half an hour of trying); a refused command leaves nothing."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), bad, "logger=none"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 2 and result.stderr.startswith("error: "), result.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_help_into_a_pipe_closed_early_ends_quietly(tmp_path):
    """``rope-ext --help | head`` ended in a BrokenPipeError traceback: the reader closed the pipe first."""
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "run.py"), "--help"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    process.stdout.close()  # `head` done before the help is printed
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 0 and "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_the_docs_option_table_lists_every_option_of_every_group_and_no_other():
    """Issue 55: ``base_20k`` was in ``--help`` but not in the option table (the README's then, docs/running.md's
    now). The table's options (the backticked names of each ``| `group` |`` row) are checked against the groups
    ``--help`` lists (Hydra's config loader over conf/ and the registries' generated configs): a new option without
    its row fails here."""
    import re

    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from evals import load_evals
    from evals.core.config.resolvers import _option_groups
    from evals.core.config.store import config_dir, register_configs

    load_evals()
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        listed = {g: set(o.split(", ")) for g, o in (line.split(": ", 1) for line in _option_groups().splitlines())}
    table = {}
    for line in (ROOT / "docs" / "running.md").read_text().splitlines():
        row = re.match(r"\| `(\w+)` \| (.*) \|$", line)
        if row and row.group(1) in listed:
            table[row.group(1)] = set(re.findall(r"`(\w+)`", row.group(2)))
    assert table == listed


GGUF_LOAD = """
from hydra import compose, initialize_config_dir

from evals import load_evals
from evals.core.config.store import config_dir, register_configs
from evals.core.inputs.loading import load_model
from evals.core.inputs.models import resolve_model
from evals.core.progress import quiet_libraries

quiet_libraries()  # as the command line does first
load_evals()
register_configs()
with initialize_config_dir(str(config_dir()), version_base="1.3"):
    cfg = compose("config", overrides=["model=smollm2"])
load_model(resolve_model(cfg.model, geometry=False, weights=True))
"""


@pytest.mark.slow  # de-quantizes the bundled SmolLM2 (~45 s of CPU)
def test_a_gguf_checkpoint_de_quantized_into_a_log_writes_at_most_one_progress_line():
    """Issue 55: transformers' de-quantizing bar (a plain tqdm over every tensor) flooded a redirected log with
    carriage returns; the docs promise one line per finished step. The bundled SmolLM2 GGUF, loaded in a process
    whose stderr is a pipe (a log) and whose bars are not switched off."""
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    result = subprocess.run(
        [sys.executable, "-c", GGUF_LOAD],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**env, "HF_HUB_OFFLINE": "1"},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "\r" not in result.stderr, result.stderr[-500:]
    assert len([line for line in result.stderr.splitlines() if "quantiz" in line]) <= 1, result.stderr[-2000:]


@pytest.mark.slow  # builds a tiny checkpoint and runs a job on it with its reference (~1 min)
def test_the_docs_own_checkpoint_dry_run_works_as_written(tmp_path):
    """Issue 55: building a local checkpoint with the bundled tokenizer was shown only in a test. docs/running.md's
    "Your own checkpoint" commands, run as written (the checkout's python for ``.venv/bin/python``), in a fresh
    directory: the checkpoint is built, its trained context read from it, and the job ends in its verdict."""
    import re

    docs = (ROOT / "docs" / "running.md").read_text()
    section = docs.split("### Your own checkpoint", 1)[1].split("\n### ", 1)[0]
    (script,) = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    script = script.replace(".venv/bin/python run.py", f"{sys.executable} {ROOT / 'run.py'}")
    script = script.replace(".venv/bin/python -", f"{sys.executable} -")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        ["bash", "-e", "-c", script], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trained context 512 from the checkpoint's own config, not the preset llama's 4096" in result.stderr
    assert "-> at the target 1024 (2x the trained 512): " in result.stdout
    assert (tmp_path / "ckpt" / "tiny" / "tokenizer.json").is_file()


def test_every_module_of_evals_tasks_registers_an_eval():
    """evals/tasks/ holds the evals and nothing else (load_evals imports every module there, listing none): each
    module, imported alone in a fresh process, adds at least one eval to the registry. A helper module dropped there
    fails here; it belongs beside its eval (inside that eval's package) or in evals/core/."""
    import pkgutil

    import evals.tasks

    names = sorted(m.name for m in pkgutil.iter_modules(evals.tasks.__path__))
    assert names  # the built-in evals are there
    probe = (
        "import importlib, sys; from evals.core.registry import EVALS; before = set(EVALS); "
        "importlib.import_module(sys.argv[1]); print(' '.join(sorted(set(EVALS) - before)))"
    )
    added = {}
    for name in names:
        result = subprocess.run(
            [sys.executable, "-c", probe, f"evals.tasks.{name}"], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr
        added[name] = result.stdout.split()
    assert not [name for name, evals_added in added.items() if not evals_added], added
