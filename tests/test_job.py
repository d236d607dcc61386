"""The job model: registries that describe themselves, a job parsed once, one output sink, packaging."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException

import rope_ext
from evals.core.job.parse import parse_job
from evals.core.run.runner import execute
from tests.tiny import ROOT, TINY


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_a_strategy_and_an_eval_from_outside_the_package_run_end_to_end(plugin, run_cli, searchpath):
    tmp, env = plugin
    search = searchpath(tmp)
    result = run_cli(
        *TINY,
        search,
        "scaling=halve_slow",
        "scaling.factor=4",
        "eval=first_tokens",
        "eval.tokens=32",
        "data.books=[persuasion]",
        f"output_dir={tmp / 'out'}",
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp / "out" / "results.json").read_text())
    assert results["status"] == "done" and results["job"]["scaling"] == "halve_slow-factor4"
    (patched,) = results["rope"]["patched"]
    dim = patched["rotary_dim"]
    assert patched["inv_freq_min"] == pytest.approx(float(rope_ext.default_inv_freq(dim, 10000.0)[-1]) / 4, rel=1e-6)
    assert results["summary"]["first_tokens_nll"] > 0 and (tmp / "out" / "first_tokens.csv").is_file()
    # the plugin's schema is generated from its registration: its parameters only, at composition
    bad = run_cli(*TINY, search, "scaling=halve_slow", "scaling.beta_fast=3", "eval=first_tokens", env=env)
    assert bad.returncode == 2
    assert "scaling 'halve_slow' does not take beta_fast. Its parameters: factor, layer_types" in bad.stderr
    suite = run_cli("--cfg", "job", *TINY, search, "eval=suite", "eval.run=[first_tokens]", env=env)
    assert suite.returncode == 0 and "first_tokens:\n    name: first_tokens\n    tokens: 64\n" in suite.stdout


def test_a_key_of_another_strategy_fails_at_composition_naming_this_ones_parameters(compose, run_cli):
    with pytest.raises(ConfigCompositionException):
        compose("scaling=linear", "scaling.beta_fast=32")
    result = run_cli("scaling=linear", "scaling.beta_fast=32")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        result.stderr.strip() == "error: scaling 'linear' does not take beta_fast. Its parameters: factor, layer_types."
    )


def test_cfg_job_shows_the_registry_defaults_and_what_a_target_derives(compose, run_cli):
    result = run_cli("--cfg", "job", "scaling=yarn")
    assert result.returncode == 0, result.stderr
    scaling = result.stdout[result.stdout.index("scaling:") : result.stdout.index("eval:")]
    # factor is what a target sets: unset (null) in the config, the registry's 2 when no target is given
    for line in (
        "name: yarn",
        "factor: null",
        "beta_fast: 32.0",
        "beta_slow: 1.0",
        "truncate: true",
        "dynamic: false",
        "layer_types: auto",
    ):
        assert f"  {line}\n" in scaling, scaling
    assert "set up for the target" not in result.stdout
    llama3 = compose("scaling=llama3").scaling
    assert (llama3.factor, llama3.low_freq_factor, llama3.high_freq_factor) == (None, 1.0, 4.0)
    assert rope_ext.resolve(llama3, 8192).params["factor"] == 2.0
    derived = run_cli("--cfg", "job", "scaling=self_extend", "target=4x")
    assert derived.returncode == 0, derived.stderr
    assert "# target: 32768 tokens (4x smollm2's trained 8192)" in derived.stdout
    assert "scaling.window=1024" in derived.stdout and "scaling.group_size=8" in derived.stdout
    assert "1024 + 31744 / 8 <= 5461" in derived.stdout  # the rule it was derived by
    explicit = run_cli("--cfg", "job", "scaling=self_extend", "target=4x", "scaling.window=3072")
    assert "scaling.window" not in explicit.stdout.split("set up for the target")[1]
    assert "scaling.group_size=13" in explicit.stdout  # G follows the window given: 3072 + 29696 / 13 <= 5461


def test_a_job_is_validated_once(tmp_path, monkeypatch, compose):
    """Parsing resolves the scaling; running the job (patching included) never validates it again."""
    calls = []
    coerce = rope_ext.Param.coerce
    monkeypatch.setattr(rope_ext.Param, "coerce", lambda self, *a: calls.append(a[1]) or coerce(self, *a))
    cfg = compose(*TINY, "scaling=yarn", "eval.lengths=[256]", "data.books=[persuasion]", f"output_dir={tmp_path}")
    job = parse_job(cfg, tmp_path)
    assert "factor" in calls and job.scaling.params["beta_fast"] == 32.0
    calls.clear()
    execute(job)
    assert calls == [], calls


def test_a_model_is_looked_up_once_and_its_slots_selected_once_per_job(tmp_path, monkeypatch, compose):
    """SmolLM2's shape (its GGUF package located once, for the job and its unscaled reference alike), its
    rotary slots found on the meta model and selected once, then handed to the patcher: neither is redone."""
    import sys

    import evals.core.inputs.models as models

    counts = {"gguf": 0, "find": 0, "select": 0}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(models, "_gguf_location", counted("gguf", models._gguf_location))
    for module in (rope_ext, sys.modules["rope_ext.rotary.find"], sys.modules["rope_ext.patch"]):
        for attr, name in (("find_rotary_slots", "find"), ("select_slots", "select")):
            if hasattr(module, attr):
                monkeypatch.setattr(module, attr, counted(name, getattr(sys.modules["rope_ext.rotary.find"], attr)))
    cfg = compose(
        "model=smollm2",
        "model.weights=random",
        "model.architecture.num_hidden_layers=2",
        "logger=none",
        "scaling=yarn",
        "eval.lengths=[256,0.1x]",
        "data.books=[persuasion]",
        f"output_dir={tmp_path}",
        "resume_from=[]",
    )
    execute(parse_job(cfg, tmp_path))
    assert counts == {"gguf": 1, "find": 1, "select": 1}, counts
    reference = json.loads(next((tmp_path / "baseline").glob("*/results.json")).read_text())
    assert reference["status"] == "done"  # the reference ran, on the model resolved for the job


def wandb_keys(run_dir: Path) -> dict[str, str]:
    """{logged key: W&B type} of an offline run, read with wandb's own `wandb leet inspect`."""
    (offline,) = run_dir.glob("wandb/offline-run-*")
    records = subprocess.run(
        [str(Path(sys.executable).parent / "wandb"), "leet", "inspect", "--json", str(offline)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    keys = {}
    for line in records.stdout.splitlines():
        record = json.loads(line)
        if record.get("type") == "history":
            for key, value in record["history"]["item"].items():
                if key.endswith("._type"):
                    keys[key[: -len("._type")]] = value
    return keys


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_every_table_and_figure_reaches_wandb_under_its_file_name(tmp_path, compose):
    cfg = compose(
        *TINY,
        "logger=wandb",
        "logger.mode=offline",
        "eval=suite",
        "eval.run=[perplexity,needle,rope_decay]",
        "eval.perplexity.lengths=[256,512]",
        "eval.needle.lengths=[256]",
        "eval.needle.depths=[0.5]",
        "eval.needle.trials=1",
        "eval.rope_decay.max_distance=4096",
        "eval.rope_decay.bound_contexts=[1024]",
        "scaling=yarn",
        "data.books=[persuasion]",
        f"output_dir={tmp_path}",
    )
    execute(parse_job(cfg, tmp_path))
    logged = wandb_keys(tmp_path)
    tables = {p.stem for p in tmp_path.glob("*.csv")} | {p.stem for p in tmp_path.glob("*.jsonl")}
    figures = {p.stem for p in tmp_path.glob("*.png")}
    assert {
        "perplexity",
        "loss_by_position",
        "needle_cells",
        "needle_trials",
        "rope_decay",
        "base_bound",
        "dimensions",
    } <= tables
    assert {
        "ppl_by_length",
        "needle_acc_by_length",
        "needle_nll_by_length",
        "needle_heatmap",
        "rope_decay_plot",
        "base_bound_plot",
        "dimensions_plot",
    } <= figures
    assert {p.stem for p in tmp_path.glob("*.svg")} == figures  # a vector copy of every figure, for a paper
    assert {k: v for k, v in logged.items()} == {
        **{t: "table-file" for t in tables},
        **{f: "image-file" for f in figures},
    }


def test_pip_install_ships_the_configs_and_a_console_script(tmp_path):
    """`pip install .` (not -e): the wheel carries conf/ and the lm-eval task YAMLs; `rope-ext` runs the app."""
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "wheel"), str(ROOT)],
        check=True,
        timeout=300,
        cwd=tmp_path,
    )
    (wheel,) = (tmp_path / "wheel").glob("rope_ext-*.whl")
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(tmp_path / "site"), str(wheel)], check=True, timeout=300
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import evals, evals.core.config.store as c; print(evals.__file__); print(c.config_dir())",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.split() == [
        str(tmp_path / "site" / "evals" / "__init__.py"),
        str(tmp_path / "site" / "evals" / "conf"),
    ]
    assert (tmp_path / "site" / "evals" / "lm_eval_tasks" / "_retrieval_template_yaml").is_file()
    script = tmp_path / "site" / "bin" / "rope-ext"
    result = subprocess.run(
        [str(script), "--cfg", "job", "scaling=ntk"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "name: ntk" in result.stdout and "model_type: llama" in result.stdout


def test_a_name_registered_twice_is_an_error_naming_both_places():
    from evals import load_evals
    from evals.core.registry import register_eval

    load_evals()
    with pytest.raises(
        ValueError,
        match=r"strategy name 'yarn' is registered twice: by .*rope_ext/strategies/frequency.py:\d+ and by "
        r".*test_job.py:\d+",
    ):

        @rope_ext.register("yarn", params={})
        def yarn_again(p, dim, base, seq_len):
            return None

    with pytest.raises(ValueError, match=r"strategy name 'pi' is registered twice"):  # an alias is a name too

        @rope_ext.register("my_pi", params={}, aliases=("pi",))
        def pi_again(p, dim, base, seq_len):
            return None

    assert "my_pi" not in rope_ext.STRATEGIES
    with pytest.raises(
        ValueError, match=r"eval name 'passkey' is registered twice: by .*evals/tasks/retrieval/eval.py:\d+"
    ):

        @register_eval("passkey", config=dict)
        def passkey_again(cfg, ctx):
            return {}
