"""No silent patch, in the library: ``rope_ext.patch`` itself checks each patched rotary module's (cos, sin) against the
patched frequencies (rope_ext.rotary.output), for every caller. PhiMoE's rotary recomputes its frequencies from the
config in every forward: it is patched through what it reads (its ``rope_init_fn``, and its config's ``rope_type``
where it ships LongRoPE with long/short mscale) and checked against transformers' own LongRoPE; a rotary that keeps a
private copy is refused in one line naming the module, the model left as it was."""

import math

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import rope_ext
from rope_ext.rotary.output import SilentPatchError
from tests.test_export import family_model
from tests.test_patch_check import FrozenRotary

TRAINED, LENGTH = 32, 80


def phimoe(rope_parameters=None, seed=0):
    config = AutoConfig.for_model(
        "phimoe",
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=TRAINED if rope_parameters is None else 4 * TRAINED,
        **({} if rope_parameters is None else {"rope_parameters": rope_parameters}),
    )
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


def logits(model):
    with torch.no_grad():
        return model(torch.arange(LENGTH)[None] % 128).logits


def test_phimoe_is_patched_through_what_its_forward_reads_and_equals_transformers_longrope():
    long = [1.0 + i / 4 for i in range(8)]
    attention = math.sqrt(1 + math.log(4) / math.log(TRAINED))  # LongRoPE's factor for s = 4
    native = phimoe(
        {
            "rope_type": "longrope",
            "rope_theta": 1e6,
            "short_factor": long,  # PhiMoE's forward computes rope_init_fn(config) without the length: short factors
            "long_factor": long,  # at every length, so both lists are the same here
            "short_mscale": attention,
            "long_mscale": attention,
            "original_max_position_embeddings": TRAINED,
        }
    )
    plain = phimoe()
    plain.load_state_dict(native.state_dict())
    before = logits(plain)
    setting = {"name": "longrope", "short_factor": long, "long_factor": long, "factor": 4}
    with rope_ext.patch(plain, setting, TRAINED) as patch:
        patched = logits(plain)
    assert "equal the patched frequencies" in patch.applied[0]["verified"]
    assert (patched - before).abs().max() > 1e-3  # the old patcher left PhiMoE unchanged (a silent patch)
    torch.testing.assert_close(patched, logits(native), atol=1e-5, rtol=0)
    assert torch.equal(logits(plain), before)


def test_phimoe_shipping_longrope_with_mscales_is_patched_through_its_config_and_restored_exactly():
    shipped = {
        "rope_type": "longrope",
        "rope_theta": 1e4,
        "short_factor": [1.0] * 8,
        "long_factor": [2.0] * 8,
        "short_mscale": 1.1,
        "long_mscale": 1.2,
        "original_max_position_embeddings": TRAINED,
    }
    model = phimoe(shipped)
    before = logits(model)
    with rope_ext.patch(model, {"name": "linear", "factor": 2}, TRAINED) as patch:
        assert "config's rope_type set to default" in patch.applied[0]["verified"]
        assert (logits(model) - before).abs().max() > 1e-3
    assert model.config.rope_parameters["rope_type"] == "longrope" and "rope_init_fn" in vars(model.model.rotary_emb)
    assert torch.equal(logits(model), before)


def test_a_rotary_that_ignores_its_patch_is_refused_by_rope_ext_patch_itself():
    model = family_model("llama")
    model.model.rotary_emb = FrozenRotary(model.config)
    before = logits(model)
    with pytest.raises(SilentPatchError) as err:
        rope_ext.patch(model, {"name": "linear", "factor": 2}, TRAINED)
    message = str(err.value)
    assert "\n" not in message and "changed nothing in model.rotary_emb (FrozenRotary)" in message
    assert torch.equal(logits(model), before) and torch.equal(
        model.model.rotary_emb.inv_freq, model.model.rotary_emb.frozen
    )


def qwen3_next(layers: int):
    """Qwen3-Next: a full-attention layer every fourth; with three layers every layer is linear attention."""
    config = AutoConfig.for_model(
        "qwen3_next",
        num_hidden_layers=layers,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=128,
        max_position_embeddings=TRAINED,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def uncached(model):
    with torch.no_grad():  # without a cache: a cache of linear-attention layers alone cannot say its length
        return model(torch.arange(LENGTH)[None] % 128, use_cache=False).logits


@pytest.mark.parametrize(
    "setting",
    [{"name": "linear", "factor": 2}, {"name": "yarn", "factor": 4}, {"name": "dynamic_ntk", "factor": 2}],
    ids=lambda s: s["name"],
)
def test_a_model_that_reads_no_rotary_output_is_refused_by_rope_ext_patch_itself(setting):
    """Every rotary module outputs the patched frequencies, but no layer reads them: three Qwen3-Next layers are all
    linear attention, and a Llama whose keys are zero attends uniformly whatever the rotation. Refused in one line,
    the model left as it was; with a layer that reads the rotary (four Qwen3-Next layers, real keys) it is patched."""
    hybrid = qwen3_next(3)
    keyless = family_model("llama")
    for layer in keyless.model.layers:
        torch.nn.init.zeros_(layer.self_attn.k_proj.weight)
    for model in (hybrid, keyless):
        before = uncached(model)
        with pytest.raises(SilentPatchError) as err:
            rope_ext.patch(model, setting, TRAINED)
        message = str(err.value)
        assert "\n" not in message and "would change nothing" in message and "model.rotary_emb" in message
        assert torch.equal(uncached(model), before)
    for model in (qwen3_next(4), family_model("llama")):
        before = uncached(model)
        with rope_ext.patch(model, setting, TRAINED):
            assert (uncached(model) - before).abs().max() > 1e-4
        assert torch.equal(uncached(model), before)
