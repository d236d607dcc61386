"""rope_ext's attention hook on real transformers architectures (tiny, random weights): the captured q and k
are what the attention module rotates (attention re-run from them reproduces the module's output), the
hook changes nothing while attached and is removed exactly, and a model whose attention does not call
transformers' AttentionInterface is named before any weight exists."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import rope_ext
from rope_ext.attention import capture

TOKENS = 24
COMMON = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=100,
    max_position_embeddings=64,
)
ARCHITECTURES = {
    "llama": {},
    "qwen3": {"head_dim": 16},  # q/k norm before RoPE
    "gemma3_text": {"head_dim": 16, "num_hidden_layers": 6, "sliding_window": 8},  # sliding + global layers, two bases
}


def build(model_type, implementation="sdpa", **extra):
    config = AutoConfig.for_model(model_type, **{**COMMON, **ARCHITECTURES.get(model_type, {}), **extra})
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=implementation).eval()


def tokens(length=TOKENS):
    return torch.randint(3, 100, (1, length), generator=torch.Generator().manual_seed(1))


def eager_attention(layer, module):
    """The module's output recomputed from the captured (unrotated) q, k: our own RoPE, causal (+ sliding)
    mask, GQA, softmax and the output projection."""
    call = layer.call
    q = capture.rotate(layer.query, layer.positions, layer.inv_freq, layer.pairs, layer.attention_factor)
    k = capture.rotate(layer.key, layer.positions, layer.inv_freq, layer.pairs, layer.attention_factor)
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, 1)
    v = call.value.double().repeat_interleave(groups, 1)
    n = q.shape[-2]
    distance = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    allowed = distance >= 0
    if call.kwargs.get("sliding_window"):
        allowed &= distance < call.kwargs["sliding_window"]
    scores = (q @ k.transpose(-1, -2)) * call.scaling
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    out = (weights @ v).transpose(1, 2).reshape(1, n, -1)
    return module.o_proj(out.float())


@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_captured_qk_rerun_attention_reproduces_the_module_output(model_type):
    model = build(model_type)
    ids = tokens()
    with torch.no_grad():
        reference = model(ids).logits
    captured, outputs = [], {}
    hooks = [
        m.register_forward_hook(lambda mod, args, out: outputs.__setitem__(id(mod), out[0]))
        for m in model.modules()
        if type(m).__name__.endswith("Attention")
    ]
    with rope_ext.capture(model, captured.append), torch.no_grad():
        assert torch.equal(model(ids).logits, reference)  # observing changes nothing
        assert model.config._attn_implementation == "rope_ext_sdpa"
    for hook in hooks:
        hook.remove()
    assert len(captured) == model.config.num_hidden_layers
    for layer in captured:
        module = layer.call.module
        torch.testing.assert_close(eager_attention(layer, module), outputs[id(module)], atol=1e-5, rtol=1e-4)
        # the captured q/k are RoPE's input: rotated again they are exactly what attention received
        torch.testing.assert_close(
            capture.rotate(layer.query, layer.positions, layer.inv_freq, layer.pairs, layer.attention_factor).float(),
            layer.call.query,
            atol=1e-5,
            rtol=1e-5,
        )
    if model_type == "gemma3_text":  # each layer's slot identified from its cos: sliding base 1e4, global 1e6
        types = [layer.slot.layer_type for layer in captured]
        assert types == list(model.config.layer_types)
        assert {layer.slot.base for layer in captured} == {10000.0, 1000000.0}
    assert model.config._attn_implementation == "sdpa"
    assert not any(m._forward_pre_hooks for m in model.modules())


def test_qk_norm_is_inside_the_capture():
    """Qwen3 normalises q and k per head before RoPE: the captured vectors are the normalised ones."""
    model = build("qwen3")
    captured, projected = [], {}
    attn = model.model.layers[0].self_attn
    attn.q_norm.register_forward_hook(lambda mod, args, out: projected.__setitem__("q", out))
    with rope_ext.capture(model, captured.append), torch.no_grad():
        model(tokens())
    torch.testing.assert_close(captured[0].query[0], projected["q"][0].transpose(0, 1), atol=1e-5, rtol=1e-5)


def test_hooks_share_one_installation_and_restore_in_any_order():
    model = build("llama", implementation="eager")
    ids = tokens(3 * 64)
    with torch.no_grad():
        before = model(ids).logits
    patched = rope_ext.patch(model, {"name": "logn"})
    seen = []
    handle = rope_ext.hook_attention(model, lambda call: seen.append(call.query.clone()))
    with torch.no_grad():
        scaled = model(ids).logits
    assert not torch.equal(scaled, before)  # positions beyond 64 have their queries scaled
    patched.restore()  # the patch goes first; the observer still works, unscaled
    assert model.config._attn_implementation == "rope_ext_eager"
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)
    handle.remove()
    assert model.config._attn_implementation == "eager" and "_attn_implementation_internal" in vars(model.config)
    assert len(seen) == 4
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)


def unhookable_config():
    """A one-layer GPT-NeoX-Japanese: its attention does not call transformers' AttentionInterface (Falcon's did not
    either, up to transformers 5.24)."""
    return AutoConfig.for_model(
        "gpt_neox_japanese",
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_multiple_size=2,
        vocab_size=100,
    )


def test_probe_on_a_meta_model_names_attention_that_cannot_be_hooked():
    config = unhookable_config()
    with torch.device("meta"):
        unhookable = AutoModelForCausalLM.from_config(config)
        llama = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **COMMON))
    assert rope_ext.find_rotary_slots(unhookable)  # its frequencies can be patched ...
    with pytest.raises(
        rope_ext.AttentionHookError,
        match=r"GPTNeoXJapaneseForCausalLM: its attention \(GPTNeoXJapaneseAttention\) does "
        "not call transformers' AttentionInterface",
    ):
        rope_ext.probe(unhookable)  # ... but not its queries
    found = rope_ext.probe(llama)
    assert len(found.called) == 2 and found.with_rotation == found.called == found.with_position_ids


def test_a_patch_refused_half_way_leaves_the_model_as_it_was():
    """YaRN's frequencies are set before Self-Extend finds GPT-NeoX-Japanese's attention cannot be hooked: the refusal undoes
    them (before, the model stayed scaled with nothing left to restore it)."""
    config = unhookable_config()
    unhookable = AutoModelForCausalLM.from_config(config).eval()
    ids = torch.arange(40).unsqueeze(0) % 100
    with torch.no_grad():
        before = unhookable(ids).logits
    buffers = {name: buffer for name, buffer in unhookable.named_buffers()}
    composed = {"name": "compose", "stages": [{"name": "yarn", "factor": 2.0}, {"name": "self_extend"}]}
    with pytest.raises(rope_ext.AttentionHookError):
        rope_ext.patch(unhookable, composed, original_max_position=32)
    assert all(buffer is buffers[name] for name, buffer in unhookable.named_buffers())
    with torch.no_grad():
        assert torch.equal(unhookable(ids).logits, before)
