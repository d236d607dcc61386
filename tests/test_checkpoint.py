"""A local checkpoint (``model.path``) is read as shipped: its trained context comes from its own config, not from
the preset it was named with (issue #46); the preset's value only where the checkpoint says nothing, and a value
given on the command line wins. Each disagreement is said in one line."""

from __future__ import annotations

import json

import pytest

from evals.core.job.parse import parse_job

from tests.tiny import TINY


def _checkpoint(tmp_path, tiny_llama, trained: int):
    from evals.core.inputs.loading import bundled_tokenizer

    checkpoint = tmp_path / "ckpt"
    tiny_llama(vocab=49152, trained=trained).save_pretrained(checkpoint)
    bundled_tokenizer().save_pretrained(checkpoint)  # a checkpoint ships its tokenizer
    return checkpoint


def _run(run_cli, tmp_path, checkpoint, *extra):
    out = tmp_path / "run"
    result = run_cli(
        *TINY,  # the tinyllama preset: original_max_position 2048
        "model.weights=pretrained",
        f"model.path={checkpoint}",
        "data.books=[persuasion]",
        "eval.lengths=[64]",
        "verdict.baseline=false",
        "logger=none",
        f"output_dir={out}",
        *extra,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result, json.loads((out / "results.json").read_text())


def test_a_local_checkpoint_s_trained_context_is_its_own_not_the_preset_s(tmp_path, compose, tiny_llama, capsys):
    checkpoint = _checkpoint(tmp_path, tiny_llama, trained=256)
    cfg = compose(*TINY, "model.weights=pretrained", f"model.path={checkpoint}", "eval.lengths=[64]")
    assert parse_job(cfg, tmp_path / "job").trained_context == 256  # the preset tinyllama says 2048
    notes = [line for line in capsys.readouterr().err.splitlines() if "trained context 256" in line]
    assert len(notes) == 1 and "not the preset tinyllama's 2048" in notes[0], notes


@pytest.mark.slow  # a CLI run: the override is read from Hydra's command line
def test_the_command_line_trained_context_wins_over_the_checkpoint_s(tmp_path, run_cli, tiny_llama):
    result, results = _run(
        run_cli, tmp_path, _checkpoint(tmp_path, tiny_llama, trained=256), "model.original_max_position=128"
    )
    assert results["job"]["trained_context"] == 128
    assert "model.original_max_position=128 overrides the trained context 256" in result.stderr


def test_a_local_checkpoint_is_recorded_and_matched_by_its_own_name_not_the_preset_s(tmp_path, run_job, tiny_llama):
    """``model.path=<checkpoint>`` under a preset was recorded as the preset (results.json, reports, W&B) and fed
    that model's sweep budget; it is the checkpoint's directory name now, the preset kept as its family."""
    from evals.core.run.budget import measured_seconds

    checkpoint = _checkpoint(tmp_path, tiny_llama, trained=256)
    _, results = run_job(
        tmp_path / "run",
        "model.weights=pretrained",
        f"model.path={checkpoint}",
        "data.books=[persuasion]",
        "eval.lengths=[64]",
        "logger=none",
    )
    job = results["job"]
    assert (job["model"], job["model_label"], job["model_family"]) == ("ckpt", "ckpt", "tinyllama")
    assert job["name"].startswith("ckpt-")
    assert (results["config"]["model"]["name"], results["config"]["model"]["family"]) == ("ckpt", "tinyllama")
    assert results["identity"]["model"]["name"] == "ckpt"
    assert measured_seconds([tmp_path], "tinyllama") == {}  # the preset's budget is not fed by the checkpoint
    assert set(measured_seconds([tmp_path], "ckpt")) == {64}


def test_a_model_name_the_user_gives_a_checkpoint_is_kept(tmp_path, compose, tiny_llama):
    checkpoint = _checkpoint(tmp_path, tiny_llama, trained=256)
    cfg = compose(*TINY, "model.weights=pretrained", f"model.path={checkpoint}", "model.name=mine", "eval.lengths=[64]")
    job = parse_job(cfg, tmp_path / "job")
    assert (job.model.name, job.info()["model"], "model_family" in job.info()) == ("mine", "mine", False)


LLAMA3_X8 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
    "rope_theta": 10000.0,
}


@pytest.mark.parametrize(
    "scaling, how",
    [
        (
            ["scaling=yarn", "scaling.factor=2"],
            "yarn replaces the shipped llama3 x8 scaling (its frequencies are rebuilt from rope_theta)",
        ),
        (["scaling=self_extend"], "self_extend stacks on it: the model's own (scaled) frequencies are kept"),
    ],
)
def test_a_checkpoint_shipped_with_rope_scaling_says_whether_the_strategy_replaces_or_stacks_on_it(
    tmp_path, compose, tiny_llama, capsys, scaling, how
):
    from evals.core.inputs.loading import bundled_tokenizer

    checkpoint = tmp_path / "ckpt"
    tiny_llama(vocab=49152, trained=512, rope_parameters=LLAMA3_X8).save_pretrained(checkpoint)
    bundled_tokenizer().save_pretrained(checkpoint)
    cfg = compose(*TINY, "model.weights=pretrained", f"model.path={checkpoint}", "eval.lengths=[64]", *scaling)
    job = parse_job(cfg, tmp_path / "job")
    assert job.trained_context == 64  # the native scaling's original context, not max_position_embeddings 512
    notes = [line for line in capsys.readouterr().err.splitlines() if "ships with" in line]
    assert notes == [
        f"note: model 'ckpt' ships with llama3 x8 rope scaling; the reference (scaling=none) is the model as "
        f"shipped, and {how}"
    ]


def _qwen3(tmp_path, name="my-qwen3"):
    """A user's own small Qwen3 (512-token context), saved with save_pretrained, the bundled tokenizer beside it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from evals.core.inputs.loading import bundled_tokenizer

    config = AutoConfig.for_model(
        "qwen3",
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=49152,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    checkpoint = tmp_path / name
    AutoModelForCausalLM.from_config(config).save_pretrained(checkpoint)
    bundled_tokenizer().save_pretrained(checkpoint)
    return checkpoint


def test_a_local_checkpoint_under_the_default_preset_is_logged_as_itself(tmp_path, compose, caplog):
    """``model.path=<a 512-token Qwen3>`` under the default preset (SmolLM2's GGUF) needed ``model.gguf_file=null``,
    and was then logged as SmolLM2: results.json and W&B's config said hub_id HuggingFaceTB/SmolLM2-135M-Instruct,
    original_max_position 8192, a 30-layer llama of hidden size 576; the log said ``loading smollm2``; the job
    folders were named ``..._smollm2_...``. It runs with ``model.path=`` alone and is itself everywhere."""
    import logging

    import run as rope_run
    from omegaconf import OmegaConf

    checkpoint = _qwen3(tmp_path)
    overrides = (f"model.path={checkpoint}", "data.books=[persuasion]", "eval.lengths=[64]", "verdict.baseline=false")
    hydra = compose(*overrides, return_hydra_config=True).hydra
    assert OmegaConf.select(hydra, "run.dir").endswith("_my-qwen3_none")  # the job folder, as Hydra names it
    assert "${rope_ext.model_name:${model}}_" in OmegaConf.to_container(hydra.sweep)["subdir"]  # a sweep's, the same
    cfg = compose(*overrides, "logger=none", "force=true", f"output_dir={tmp_path / 'run'}")
    with caplog.at_level(logging.INFO, logger="evals.core.inputs.loading"):
        rope_run.run(cfg)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    model = results["config"]["model"]  # what W&B's run config is made of (evals/core/run/tracking.py flatten)
    assert (model["name"], model["family"], model["path"]) == ("my-qwen3", "smollm2", str(checkpoint.resolve()))
    assert (model["hub_id"], model["gguf_file"], model["gguf_package"]) == (None, None, None)
    assert model["original_max_position"] == 512 == results["job"]["trained_context"]
    architecture = model["architecture"]
    assert (architecture["model_type"], architecture["hidden_size"], architecture["num_hidden_layers"]) == (
        "qwen3",
        32,
        2,
    )
    assert results["job"]["name"].startswith("my-qwen3-")  # the W&B run name
    loading = [r.getMessage() for r in caplog.records if r.getMessage().startswith(("loading", "model "))]
    assert loading and all("my-qwen3" in line and "smollm2" not in line for line in loading), loading


def test_a_gguf_file_or_a_folder_holding_one_is_a_local_checkpoint(tmp_path, compose):
    """``model.path=<x.gguf>`` (docs/running.md) read the preset's file name inside a path that is a file."""
    import shutil

    from evals.core.inputs.models import SMOLLM2_GGUF, SMOLLM2_PACKAGE, locate, model_name, package_dir

    folder = tmp_path / "mine"
    folder.mkdir()
    shutil.copy(package_dir(SMOLLM2_PACKAGE) / SMOLLM2_GGUF, folder / "tiny-q4.gguf")
    for path in (folder / "tiny-q4.gguf", folder):
        cfg = compose(f"model.path={path}").model
        source = locate(cfg)
        assert (source.kind, source.file, model_name(cfg)) == ("gguf", "tiny-q4.gguf", "tiny-q4")
