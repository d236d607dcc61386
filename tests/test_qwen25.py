"""Qwen2.5-Coder-0.5B-Instruct offline (``model=qwen25``, the GGUF `make setup` joins from PyPI chunk packages): the
third architecture -- one layer type, q/k/v biases, GQA 14/2 -- through the patcher, the attention hook and the
bias ablation; perplexity equals a plain transformers forward. Slow: a real 0.5B model on CPU."""

import math

import pytest
import torch

import rope_ext
from evals.core import projection_bias as bias
from evals.core.inputs.data import load_documents

pytestmark = pytest.mark.slow
QWEN25 = ["model=qwen25", "logger=none", "data.books=[emma]"]


@pytest.fixture(scope="module")
def qwen25(real_model):
    return real_model(*QWEN25, "scaling=yarn", "scaling.factor=4")  # (job, model) loaded once for the module


def test_qwen25_geometry_one_layer_type_biases_and_the_patcher(qwen25):
    job, loaded = qwen25
    config = loaded.model.config
    assert (job.trained_context, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (
        32768,
        24,
        14,
        2,
    )
    assert [(s.layer_type, s.dim, s.base) for s in job.scaled] == [(None, 64, 1e6)]  # layer_types=auto: all of them
    for t in "qkv":
        assert len(bias.biased(loaded.model, t)) == 24
    attention = loaded.model.model.layers[0].self_attn
    assert float(attention.k_proj.bias.detach().abs().mean()) > 3 * float(
        attention.q_proj.bias.detach().abs().mean()
    )  # 18 vs 4
    rotary = rope_ext.find_rotary_slots(loaded.model)[0].module(loaded.model)
    own = rotary.inv_freq.clone()
    with rope_ext.patch(loaded.model, job.scaling, slots=job.scaled):
        assert not torch.equal(rotary.inv_freq, own)
    assert torch.equal(rotary.inv_freq, own)


def test_qwen25_capture_sees_the_biased_queries_and_keys_per_gqa_head(qwen25):
    _, loaded = qwen25
    model, ids = loaded.model, torch.arange(100, 164)[None]
    layers = []
    with rope_ext.capture(model, layers.append), torch.no_grad():
        model(ids)
    first = layers[0]
    assert first.query.shape == (1, 14, 64, 64) and first.key.shape == (1, 2, 64, 64) and len(layers) == 24
    attention = model.model.layers[0].self_attn
    with torch.no_grad():
        x = model.model.layers[0].input_layernorm(model.model.embed_tokens(ids))
        q, k = (
            attention.q_proj(x).view(1, 64, 14, 64).transpose(1, 2),
            attention.k_proj(x).view(1, 64, 2, 64).transpose(1, 2),
        )
    torch.testing.assert_close(first.query, q, atol=2e-4, rtol=1e-4)  # unrotated, bias included
    torch.testing.assert_close(first.key, k, atol=2e-4, rtol=1e-4)
    with bias.ablated(model, ["k"], "zero"):
        again = []
        with rope_ext.capture(model, again.append), torch.no_grad():
            model(ids)
    torch.testing.assert_close(
        first.key[0] - again[0].key[0], attention.k_proj.bias.view(2, 1, 64).expand(2, 64, 64), atol=2e-4, rtol=1e-4
    )


def test_qwen25_perplexity_offline_equals_a_plain_forward(qwen25, tmp_path, compose):
    import run as rope_run

    job, loaded = qwen25
    summary = rope_run.run(compose(*QWEN25, "eval.lengths=[512,1024]", f"output_dir={tmp_path / 'run'}", "force=true"))
    ids = load_documents(job.data_cfg, loaded.tokenizer)[0].ids[:512]
    with torch.no_grad():
        loss = loaded.model(ids[None], labels=ids[None]).loss  # transformers' own loss over the full logits
    assert math.exp(float(loss)) == pytest.approx(summary["ppl@512"], rel=1e-4)
    assert summary["ppl@512"] == pytest.approx(52.5, rel=0.01) and summary["ppl@1024"] == pytest.approx(53.9, rel=0.01)


def test_qk_study_on_qwen25_reports_what_the_biases_are_of_the_means(qwen25, tmp_path, compose):
    import run as rope_run

    summary = rope_run.run(
        compose(
            *QWEN25,
            "eval=qk_study",
            "eval.tokens=512",
            "eval.max_distance=65536",
            f"output_dir={tmp_path / 'qk'}",
            "force=true",
        )
    )
    assert summary["heads"] == 24 * 14
    assert summary["bias_k_norm"] > summary["bias_q_norm"] > 0 and 0 < summary["bias_share_k"] < 1.5
    assert summary["claim/bias_sets_decay"] in ("holds", "not significant", "contradicted")
    _, loaded = qwen25
    saved = loaded.model.model.layers[3].self_attn.q_proj.bias.clone()
    ablated = rope_run.run(
        compose(
            *QWEN25,
            "eval=qk_study",
            "eval.tokens=512",
            "eval.ablate_bias=[q,k]",
            f"output_dir={tmp_path / 'qk0'}",
            "force=true",
        )
    )
    assert ablated["bias_q_norm"] == 0 == ablated["bias_k_norm"] and ablated["heads"] == 24 * 14
    assert torch.equal(loaded.model.model.layers[3].self_attn.q_proj.bias, saved)
