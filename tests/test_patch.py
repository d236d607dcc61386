"""rope_ext.patch on real transformers architectures (tiny, random weights) against the same weights
loaded with the equivalent native ``rope_parameters``."""

import copy

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import rope_ext
from rope_ext import RotaryNotFoundError, ScalingError

TRAINED = 64
COMMON = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    vocab_size=128,
    max_position_embeddings=TRAINED,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
ARCHITECTURES = {
    "llama": {"num_key_value_heads": 2},
    "qwen2": {"num_key_value_heads": 2},
    "mistral": {"num_key_value_heads": 2, "sliding_window": None},
    "gpt_neox": {"partial_rotary_factor": 0.5},
    "phi3": {"num_key_value_heads": 2, "partial_rotary_factor": 0.5, "original_max_position_embeddings": TRAINED},
}
# our scaling config -> native transformers rope_parameters (beyond rope_theta / partial_rotary_factor)
STRATEGIES = {
    "linear": ({"name": "linear", "factor": 4.0}, {"rope_type": "linear", "factor": 4.0}),
    "dynamic_ntk": ({"name": "dynamic_ntk", "factor": 2.0}, {"rope_type": "dynamic", "factor": 2.0}),
    "yarn": (
        {"name": "yarn", "factor": 4.0},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": TRAINED},
    ),
    "llama3": (
        {"name": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
        {
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": TRAINED,
        },
    ),
}


def build(model_type, rope=None, **extra):
    fields = {**COMMON, **ARCHITECTURES.get(model_type, {}), **extra}
    partial = fields.pop("partial_rotary_factor", None)
    rope_parameters = {"rope_type": "default", "rope_theta": 10000.0, **(rope or {})}
    if partial:
        rope_parameters["partial_rotary_factor"] = partial
    config = AutoConfig.for_model(model_type, rope_parameters=rope_parameters, **fields)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def native_twin(model, rope):
    config = copy.deepcopy(model.config)
    config.rope_parameters = {**config.rope_parameters, **rope}
    twin = AutoModelForCausalLM.from_config(config).eval()
    twin.load_state_dict(model.state_dict())
    return twin


def logits(model, length, seed=1):
    ids = torch.randint(3, COMMON["vocab_size"], (1, length), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_patched_equals_native(model_type, strategy):
    ours, native = STRATEGIES[strategy]
    model = build(model_type)
    twin = native_twin(model, native)
    with rope_ext.patch(model, ours):
        for length in (TRAINED // 2, 3 * TRAINED):  # below and beyond the trained context
            torch.testing.assert_close(logits(model, length), logits(twin, length), atol=1e-5, rtol=1e-5)


def test_patched_longrope_equals_native():
    model = build("phi3")
    half = rope_ext.find_rotary_slots(model)[0].dim // 2
    short, long = [1.0 + 0.1 * i for i in range(half)], [2.0 + 0.5 * i for i in range(half)]
    twin = native_twin(
        model,
        {
            "rope_type": "longrope",
            "short_factor": short,
            "long_factor": long,
            "factor": 4.0,
            "original_max_position_embeddings": TRAINED,
        },
    )
    with rope_ext.patch(model, {"name": "longrope", "short_factor": short, "long_factor": long, "factor": 4.0}):
        for length in (TRAINED // 2, 3 * TRAINED, TRAINED // 4):
            torch.testing.assert_close(logits(model, length), logits(twin, length), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model_type", ["llama", "gpt_neox"])
def test_restore_is_bit_for_bit(model_type):
    model = build(model_type)
    before = logits(model, 3 * TRAINED)
    buffer = model.get_decoder().rotary_emb.inv_freq if hasattr(model.get_decoder(), "rotary_emb") else None
    for scaling in ({"name": "yarn", "factor": 4.0}, {"name": "dynamic_ntk", "factor": 2.0}):
        with rope_ext.patch(model, scaling):
            assert not torch.equal(logits(model, 3 * TRAINED), before)
        assert torch.equal(logits(model, 3 * TRAINED), before)
    if buffer is not None:
        assert model.get_decoder().rotary_emb.inv_freq is buffer
    patched = rope_ext.patch(model, {"name": "ntk", "factor": 8.0})
    assert not torch.equal(logits(model, 3 * TRAINED), before)
    patched.restore()
    assert torch.equal(logits(model, 3 * TRAINED), before)


def test_static_strategy_adds_no_hook_and_dynamic_recomputes_per_forward():
    model = build("llama")
    rotary = model.get_decoder().rotary_emb
    with rope_ext.patch(model, {"name": "yarn", "factor": 4.0}):
        assert not rotary._forward_pre_hooks
    with rope_ext.patch(model, {"name": "dynamic_ntk", "factor": 2.0}) as patched:
        logits(model, 2 * TRAINED)
        at_double = rotary.inv_freq.clone()
        logits(model, 4 * TRAINED)
        assert not torch.equal(rotary.inv_freq, at_double)  # recomputed for the new length
        assert patched.seq_len[patched.slots[0]] == 4 * TRAINED
    assert not rotary._forward_pre_hooks


def test_native_scaling_is_replaced_and_none_leaves_it():
    model = build("llama", rope={"rope_type": "linear", "factor": 2.0})
    before = logits(model, 32)
    with rope_ext.patch(model, {"name": "none"}):
        assert torch.equal(logits(model, 32), before)
    plain = native_twin(model, {"rope_type": "default"})
    plain.config.rope_parameters.pop("factor", None)
    with rope_ext.patch(model, {"name": "linear", "factor": 1.0}):  # factor 1 from the base: the unscaled RoPE
        torch.testing.assert_close(logits(model, 32), logits(plain, 32), atol=1e-5, rtol=1e-5)


def test_layer_types_gemma3_auto_scales_global_layers_only():
    model = build("gemma3_text", num_hidden_layers=6, num_key_value_heads=2, head_dim=16, sliding_window=16)
    slots = {s.layer_type: s for s in rope_ext.find_rotary_slots(model)}
    assert set(slots) == {"sliding_attention", "full_attention"}
    assert slots["full_attention"].base != slots["sliding_attention"].base  # per-layer-type bases read from config
    rotary = slots["full_attention"].module(model)
    sliding_before = rotary.sliding_attention_inv_freq.clone()
    full_before = rotary.full_attention_inv_freq.clone()
    with rope_ext.patch(model, {"name": "linear", "factor": 4.0}) as patched:
        assert [s.layer_type for s in patched.slots] == ["full_attention"]
        assert torch.equal(rotary.sliding_attention_inv_freq, sliding_before)
        torch.testing.assert_close(rotary.full_attention_inv_freq, full_before / 4)
    with rope_ext.patch(model, {"name": "linear", "factor": 4.0, "layer_types": "all"}):
        torch.testing.assert_close(rotary.sliding_attention_inv_freq, sliding_before / 4)
    with pytest.raises(ScalingError, match="layer_types \\['global'\\] not in this model"):
        rope_ext.patch(model, {"name": "linear", "factor": 4.0, "layer_types": ["global"]})


def test_the_patcher_finds_every_slot_once_and_reads_what_each_scaled_one_held():
    """The patcher's stages pass their data forward: every slot found once (``every``: the attention hooks' selection
    and the softmax-scale geometry take it), what each scaled slot held read once before anything is written (``held``:
    rope_ext.check's identity test and the tables' growth take it), the unscaled slots not read."""
    model = build("gemma3_text", num_hidden_layers=6, num_key_value_heads=2, head_dim=16, sliding_window=16)
    found = rope_ext.find_rotary_slots(model)
    full = next(s for s in found if s.layer_type == "full_attention")
    before = full.module(model).full_attention_inv_freq.clone()
    with rope_ext.patch(model, {"name": "linear", "factor": 4.0}) as patched:
        assert patched.every == found and list(patched.held) == [full]
        held = patched.held[full]
        assert (held.dim, held.base, held.still, held.attention) == (full.dim, full.base, None, 1.0)
        assert torch.equal(held.inv_freq, before)  # what it held, not what the patch wrote
    config = AutoConfig.for_model("gpt2", n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=64)
    with rope_ext.patch(AutoModelForCausalLM.from_config(config), {"name": "none"}) as plain:  # nothing to change
        assert plain.every == [] and plain.held == {}


def test_model_without_rope_names_its_class():
    config = AutoConfig.for_model("gpt2", n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=64)
    with pytest.raises(RotaryNotFoundError, match="GPT2LMHeadModel has no rotary embedding"):
        rope_ext.patch(AutoModelForCausalLM.from_config(config), {"name": "linear", "factor": 2.0})


def test_trained_context_comes_from_config_or_argument():
    model = build("llama")
    with rope_ext.patch(model, {"name": "yarn", "factor": 2.0}) as patched:
        assert patched.scaling.params["original_max_position"] == TRAINED
    with rope_ext.patch(model, {"name": "yarn", "factor": 2.0}, original_max_position=32) as patched:
        assert patched.scaling.params["original_max_position"] == 32


def test_trained_context_reads_every_layer_types_rope_parameters():
    """Gemma-3 keeps original_max_position_embeddings under full_attention only, listed after sliding_attention."""
    config = AutoConfig.for_model(
        "gemma3_text",
        num_hidden_layers=2,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=131072,
    )
    config.rope_parameters = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {
            "rope_type": "linear",
            "factor": 8.0,
            "rope_theta": 1e6,
            "original_max_position_embeddings": 32768,
        },
    }
    assert rope_ext.trained_context(config) == 32768
    config.rope_parameters["full_attention"].pop("original_max_position_embeddings")
    assert rope_ext.trained_context(config) == 131072
