"""The run-time patch check (rope_ext.check): silent on every supported architecture, one line naming the layers when a
model class bypasses the rotary buffers or the attention hook (built from real transformers classes)."""

import pytest
import torch
from transformers.models.llama import modeling_llama

import rope_ext
from rope_ext.check import PatchCheckError, patch_checked
from tests.test_export import FAMILIES, TRAINED, family_model

SETTINGS = [
    {"name": "yarn", "factor": 4},
    {"name": "dynamic_ntk", "factor": 4},
    {"name": "logn"},
    {"name": "self_extend", "group_size": 4, "window": 16},
    {"name": "dca"},
    {"name": "lm_infinite"},
    {"name": "compose", "stages": [{"name": "yarn", "factor": 2}, {"name": "rerope", "window": 16}]},
]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s["name"])
def test_the_check_is_silent_where_the_patch_works_and_names_what_changed(family, setting):
    model = family_model(family)
    scaling = rope_ext.resolve(setting, TRAINED)
    patch, found = patch_checked(model, scaling, trained=TRAINED)
    layers = [f"{n}" for n, m in model.named_modules() if n.endswith(("self_attn", "attention")) and "." in n]
    if family == "gemma3":  # the global layer only (layer 1); the sliding one bit-identical
        assert found["changed"] == [layers[1]] and found["unchanged"] == [layers[0]]
        assert found["targeted_types"] == ["full_attention"]
    else:
        assert found["changed"] == layers and found["unchanged"] == []
    patch.restore()


class FrozenRotary(modeling_llama.LlamaRotaryEmbedding):
    """A rotary module that keeps a private copy of its frequencies: a patched inv_freq buffer changes nothing."""

    def __init__(self, config):
        super().__init__(config)
        self.frozen = self.inv_freq.clone()

    def forward(self, x, position_ids):
        angle = position_ids[:, :, None].float() * self.frozen[None, None, :]
        emb = torch.cat((angle, angle), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class UnhookedAttention(modeling_llama.LlamaAttention):
    """An attention that calls eager attention directly, not through transformers' AttentionInterface."""

    def forward(self, hidden_states, position_embeddings, attention_mask=None, **kwargs):
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        q, k = modeling_llama.apply_rotary_pos_emb(q, k, *position_embeddings)
        out, weights = modeling_llama.eager_attention_forward(self, q, k, v, attention_mask, scaling=self.scaling)
        return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1).contiguous()), weights


def test_a_rotary_module_that_ignores_its_buffers_is_caught_before_the_eval():
    model = family_model("llama")
    model.model.rotary_emb = FrozenRotary(model.config)
    with pytest.raises(PatchCheckError) as err:
        patch_checked(model, rope_ext.resolve({"name": "yarn", "factor": 4}, TRAINED), trained=TRAINED)
    message = str(err.value)
    # the patcher's own check (every caller of rope_ext.patch) names the rotary module before any model forward
    assert "\n" not in message and "changed nothing in model.rotary_emb (FrozenRotary)" in message
    with torch.no_grad():  # the patch was undone: the model computes what it computed before
        assert torch.equal(model.model.rotary_emb.inv_freq, model.model.rotary_emb.frozen)


def test_an_attention_layer_that_bypasses_the_hook_is_caught_for_attention_level_methods():
    model = family_model("llama")
    bypass = UnhookedAttention(model.config, layer_idx=1)
    bypass.load_state_dict(model.model.layers[1].self_attn.state_dict())
    model.model.layers[1].self_attn = bypass
    with pytest.raises(
        PatchCheckError,
        match=r"only 1 of the 2 attention layers of LlamaForCausalLM call rope_ext's "
        r"attention hook",
    ):
        patch_checked(
            model, rope_ext.resolve({"name": "self_extend", "group_size": 4, "window": 16}, TRAINED), trained=TRAINED
        )
    # a frequency strategy still reaches that layer through the rotary module: checked there, and silent
    patch, found = patch_checked(model, rope_ext.resolve({"name": "yarn", "factor": 4}, TRAINED), trained=TRAINED)
    assert found["changed"] == ["model.layers.0.self_attn"] and found["unobserved"] == 1
    patch.restore()


@pytest.mark.parametrize(
    "setting",
    [{"name": "linear", "factor": 1}, {"name": "yarn", "factor": 1}, {"name": "p_rope", "fraction": 1.0}],
    ids=lambda s: s["name"],
)
def test_a_setting_that_is_the_models_own_rope_is_not_a_false_alarm(setting):
    model = family_model("gemma3")
    patch, found = patch_checked(model, rope_ext.resolve(setting, TRAINED), trained=TRAINED)
    assert found["changed"] == [] and "identity setting" in found["how"]
    patch.restore()
