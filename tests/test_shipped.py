"""Models that ship a scaling (rope_ext.strategies.shipped): the same-named strategy inherits the shipped parameters the request
leaves at their defaults (gpt-oss's ``truncate: false``, Ministral-3's ``mscale``/``mscale_all_dim``), so asking for
the shipped method at the shipped factor reproduces the model as shipped, bit for bit; another strategy replaces it,
and either is said in one line; the trained context is the shipped ``original_max_position_embeddings``."""

import torch
from transformers import AutoConfig

import rope_ext
from tests.tiny import tiny_llama

TRAINED = 32
SHIPPED = {  # gpt-oss's and Ministral-3's YaRN keys, on a Llama
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "truncate": False,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "beta_fast": 16.0,
    "original_max_position_embeddings": TRAINED,
}


def logits(model):
    with torch.no_grad():
        return model(torch.arange(100)[None] % 96).logits


def test_the_shipped_method_at_the_shipped_factor_is_the_model_as_shipped():
    model = tiny_llama(trained=4 * TRAINED, rope_parameters=SHIPPED)
    assert rope_ext.trained_context(model) == TRAINED
    shipped = logits(model)
    with rope_ext.patch(model, {"name": "yarn", "factor": 4}) as patch:
        assert torch.equal(logits(model), shipped)  # before the rule: truncate true and attention 1.139, not 1.0
        assert patch.scaling.params["truncate"] is False and patch.scaling.frequencies(16, 1e4)[1] == 1.0
    assert (
        patch.shipped
        == "yarn inherits the shipped yarn x4's beta_fast=16.0, mscale=1.0, mscale_all_dim=1.0, truncate=False"
    )
    with rope_ext.patch(model, {"name": "yarn", "factor": 8}) as patch:  # another factor: the shipped method kept
        assert patch.scaling.params["truncate"] is False and not torch.equal(logits(model), shipped)
    with rope_ext.patch(model, {"name": "yarn", "factor": 4, "beta_fast": 64.0}) as patch:  # set: not inherited
        assert patch.scaling.params["beta_fast"] == 64.0 and "beta_fast" not in patch.shipped
    with rope_ext.patch(model, {"name": "linear", "factor": 2}) as patch:
        assert (
            patch.shipped == "linear replaces the shipped yarn x4 scaling (its frequencies are rebuilt from rope_theta)"
        )
        assert patch.scaling.params == {"factor": 2.0}
    assert torch.equal(logits(model), shipped)


def test_the_trained_context_is_the_shipped_original_wherever_the_family_keeps_it():
    phi3 = AutoConfig.for_model("phi3", max_position_embeddings=131072, original_max_position_embeddings=4096)
    llama31 = AutoConfig.for_model(
        "llama",
        max_position_embeddings=131072,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 5e5,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    assert rope_ext.trained_context(phi3) == 4096 and rope_ext.trained_context(llama31) == 8192
    setting, said = rope_ext.inherit_shipped({"name": "llama3", "factor": 16}, llama31)
    assert setting == {"name": "llama3", "factor": 16} and said.startswith("llama3 inherits the shipped llama3 x8's")
