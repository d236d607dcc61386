"""evals/core/projection_bias.py on Qwen2's attention (q/k/v biases, GQA): zeroing a bias moves the captured means by exactly the
bias, centring leaves mean 0 with the variance kept, both are undone exactly; qk_study reports the bias share and
runs ablated; the ablation is in the job key; on a model without biases it is one line before the model loads."""

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import rope_ext
from evals.core import projection_bias as bias
from evals.core.job.parse import parse_job
from evals.tasks.perplexity import PerplexityError
from evals.tasks.qk_study import QKStudyError
from tests.tiny import MODELS


def tiny_qwen2():
    """tests/tiny.py's tinyqwen2 built directly, with large random biases (initialisation leaves them small)."""
    architecture = dict(MODELS["tinyqwen2"]["architecture"])
    config = AutoConfig.for_model(architecture.pop("model_type"), **{**architecture, "vocab_size": 100})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    with torch.no_grad():
        for _, module in bias.biased(model, "q") + bias.biased(model, "k"):
            module.bias.copy_(torch.randn_like(module.bias) * 3)
    return model


def captured(model, ids):
    layers = []
    with rope_ext.capture(model, layers.append), torch.no_grad():
        model(ids)
    return layers


IDS = torch.randint(3, 100, (1, 48), generator=torch.Generator().manual_seed(1))


def test_zero_ablation_moves_the_means_by_the_bias_and_is_undone_exactly():
    model = tiny_qwen2()
    saved = {name: m.bias.clone() for t in "qkv" for name, m in bias.biased(model, t)}
    before = captured(model, IDS)[0]
    with bias.ablated(model, ["q", "k"], "zero") as done:
        after = captured(model, IDS)[0]
    assert done["q"]["layers"] == 2 and done["q"]["bias_norm_before"] > 0 and done["q"]["bias_norm_after"] == 0
    attention = model.model.layers[0].self_attn
    b_q, b_k = (
        saved["model.layers.0.self_attn.q_proj"].view(4, 16),
        saved["model.layers.0.self_attn.k_proj"].view(2, 16),
    )
    # layer 0 sees the same input: every captured (unrotated) query and key moves by exactly its head's bias
    torch.testing.assert_close(before.query[0] - after.query[0], b_q[:, None].expand(4, 48, 16), atol=1e-5, rtol=0)
    torch.testing.assert_close(before.key[0] - after.key[0], b_k[:, None].expand(2, 48, 16), atol=1e-5, rtol=0)
    assert bias.layer_bias(attention, "q") is not None
    assert all(torch.equal(m.bias, saved[name]) for t in "qkv" for name, m in bias.biased(model, t))  # restored


def test_center_ablation_leaves_mean_zero_and_keeps_the_variance():
    model = tiny_qwen2()
    before = captured(model, IDS)
    with bias.ablated(model, ["q", "k"], "center", lambda m: m(IDS)) as done:
        after = captured(model, IDS)
    assert done["k"]["mode"] == "center"
    for layer in after:  # every layer: q and k have mean 0 over the calibration tokens (centred layer by layer)
        assert float(layer.query[0].mean(1).abs().max()) < 1e-4 and float(layer.key[0].mean(1).abs().max()) < 1e-4
    # layer 0's input is unchanged, so its q and k are the same vectors less their mean: the same variance
    torch.testing.assert_close(
        after[0].query[0], before[0].query[0] - before[0].query[0].mean(1, keepdim=True), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(after[0].key[0].var(1), before[0].key[0].var(1), atol=1e-4, rtol=1e-4)


QK = [
    "eval=qk_study",
    "eval.tokens=128",
    "eval.near=4",
    "eval.bins=16",
    "eval.pair_samples=256",
    "data.books=[persuasion]",
]


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_qk_study_on_qwen2_reports_the_bias_share_and_runs_ablated(tmp_path, run_job, models):
    from evals.core.inputs.model_cache import MODEL_CACHE

    # the model's own RoPE (scaling=none): no slot is patched
    summary, results = run_job(tmp_path / "plain", *QK, models, "model=tinyqwen2", "scaling=none")
    heads = (tmp_path / "plain" / "qk_heads.csv").read_text().splitlines()
    assert {"bias_share_q", "bias_share_k", "bias_q_norm", "wx_k_norm", "locality_bias"} <= set(heads[0].split(","))
    assert len(heads) == 1 + 2 * 4 and summary["heads"] == 8
    assert summary["bias_q_norm"] == 0 < summary["wx_q_norm"]  # transformers initialises the biases at 0
    assert "bias_sets_decay" in results["metrics"]["qk_study"]["claims"]
    assert all("bias_share_k" in layer for layer in results["metrics"]["qk_study"]["layers"])
    loaded = MODEL_CACHE._loaded.model
    saved = [m.bias.clone() for _, m in bias.biased(loaded, "k")]
    summary, results = run_job(
        tmp_path / "center",
        *QK,
        models,
        "model=tinyqwen2",
        "scaling=none",
        "eval.ablate_bias=[k]",
        "eval.ablate_mode=center",
    )
    assert summary["bias_k_norm"] > 0 and summary["bias_q_norm"] == 0  # the k bias is now minus the mean it removed
    assert "bias_share_k" not in summary  # k has mean 0: no share is defined
    assert results["metrics"]["qk_study"]["ablation"]["k"]["mode"] == "center"
    assert results["config"]["eval"]["ablate_bias"] == ["k"]
    assert all(
        torch.equal(m.bias, b) for (_, m), b in zip(bias.biased(loaded, "k"), saved)
    )  # the shared model restored


def test_ablation_is_in_the_job_key_and_needs_a_model_with_biases(tmp_path, compose, models, run_cli, searchpath):
    qwen = [*QK, models, "model=tinyqwen2"]
    keys = {
        parse_job(compose(*qwen, *extra), tmp_path / f"k{i}").key
        for i, extra in enumerate(
            [(), ("eval.ablate_bias=[q,k]",), ("eval.ablate_bias=[q,k]", "eval.ablate_mode=center")]
        )
    }
    assert len(keys) == 3
    llama = ["model=tinyllama", "model.weights=random", "logger=none"]
    with pytest.raises(
        QKStudyError, match=r"eval.ablate_bias=\['q'\] but model 'tinyllama' \(llama\) has no bias on q_proj"
    ):
        parse_job(compose(*QK, *llama, "eval.ablate_bias=[q]"), tmp_path / "a")
    with pytest.raises(PerplexityError, match=r"has no bias on q_proj, k_proj; it needs a model with q/k/v biases"):
        parse_job(compose(*llama, "eval.ablate_bias=[q,k]"), tmp_path / "b")
    with pytest.raises(PerplexityError, match=r"with eval.longppl=true"):
        parse_job(compose(*qwen[-2:], "eval.ablate_bias=[q]", "eval.longppl=true"), tmp_path / "c")
    result = run_cli(*llama, "eval.ablate_bias=[k]", f"output_dir={tmp_path / 'cli'}", timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        "error: eval.ablate_bias=['k'] but model 'tinyllama' (llama) has no bias on k_proj; it needs a model with q/k/v "
        "biases (model=qwen25)"
    ]


def test_perplexity_with_centred_biases_runs_and_restores_them(tmp_path, run_job, models):
    summary, results = run_job(
        tmp_path / "ppl",
        models,
        "model=tinyqwen2",
        "eval.lengths=[64,128]",
        "data.books=[persuasion]",
        "eval.ablate_bias=[q,k]",
        "eval.ablate_mode=center",
    )
    assert results["status"] == "done" and summary["ppl@128"] > 0
    ablation = results["metrics"]["ablation"]
    assert ablation["q"]["mode"] == "center" and ablation["k"]["layers"] == 2
    assert json.dumps(results["config"]["eval"]["ablate_mode"]) == '"center"'
