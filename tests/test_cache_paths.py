"""Every KV-cache path ``generate`` can take, under every attention-level method: exact or refused in one line.

Greedy ``generate`` of a tiny random-weight model (fp32) under the patch, with each cache implementation transformers
offers (dynamic, static -- the path ``torch.compile`` and CUDA graphs take --, offloaded, offloaded static, quantized),
is compared with a full recompute under the same patch: one forward of the whole generated sequence without a cache,
whose logits at each generated step must equal the step's (1e-4) and whose greedy tokens must be the ones generated.
The prompts are longer than each method's window, group or chunk, so the method changes attention (checked: the
patched recompute differs from the unpatched one). A static cache hands attention its whole preallocated buffer
(unfilled slots masked); a sliding-window static layer (Mistral's, Gemma-3's local layers) rolls its buffer once
full: the keys' positions are those of the slots, not of a cache that ends at the last query. Chunked prefill, a
left-padded batch, eager attention and rope_ext's FlexAttention path are checked under the static cache too.

The quantized cache's stored keys are lossy (fp8; quanto and HQQ are optional backends, skipped where not installed),
so its decode cannot equal a recompute: its error under the patch is compared with the unpatched model's under the
same cache. The offloaded caches move layers from CUDA to the CPU (skipped without CUDA): the same layers, the same
keys.
"""

import importlib

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import rope_ext
from rope_ext.attention import flex

TRAINED = 64
PROMPT = 24  # beyond every window below
NEW = 8
SMALL = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    vocab_size=100,
    max_position_embeddings=TRAINED,
    initializer_range=0.1,  # sharper attention than the default 0.02: each method moves the logits by 1e-2 to 1
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=None,  # no end of sequence: every step generated, greedy over the whole vocabulary
)
FAMILIES = {
    "llama": {},
    "qwen2": {},
    "qwen3": {},
    # every layer sliding: a static buffer of 28 slots, 24 written by the prompt, full at the 4th new token, then rolled
    "mistral": {"sliding_window": 28},
    # sliding + global layers (layer_types=all below: the method on both, the sliding buffer rolling)
    "gemma3_text": {"sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"]},
    # multi-head latent attention: a rope sub-dimension, a value head of another size
    "deepseek_v3": dict(
        first_k_dense_replace=1,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        moe_intermediate_size=16,
        q_lora_rank=None,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=12,
        num_key_value_heads=4,
        head_dim=8,
    ),
    "gpt_neox": {"rotary_pct": 0.5, "num_key_value_heads": 4},  # partial rotary
    "olmo2": {},  # q/k norms over the whole projection
    "cohere": {},  # interleaved pairs
    "phi3": {"partial_rotary_factor": 0.5},
    # a sparse-attention indexer (QSA) that keeps 2 of the blocks of 4 keys, not always the query's own
    "qwen4_exp_text": dict(
        layer_types=["linear_attention", "full_attention"],
        indexer_n_heads=2,
        indexer_kv_heads=1,
        indexer_head_dim=8,
        indexer_budget=8,
        indexer_compress_ratio=4,
    ),
}
METHODS = {
    "self_extend": {"group_size": 4, "window": 6},
    "dca": {"chunk_size": 12, "local_window": 4},
    "rerope": {"window": 6},
    "leaky_rerope": {"window": 6, "leak": 4.0},
    "string": {"offset": 10, "local_window": 3},
    "lm_infinite": {"global_tokens": 3, "local_span": 10},
}


def build(family, implementation="sdpa"):
    config = AutoConfig.for_model(family, **{**SMALL, **FAMILIES[family]})
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=implementation).eval()


def scaling(method):
    return {"name": method, **METHODS[method], "layer_types": "all"}


def prompt(seed=1):
    return torch.randint(3, 100, (1, PROMPT), generator=torch.Generator().manual_seed(seed))


def generated(model, ids, cache, **kwargs):
    """(sequences, per-step logits (batch, NEW, vocab)) of greedy decoding under ``cache``."""
    with torch.no_grad():
        out = model.generate(
            ids,
            max_new_tokens=NEW,
            do_sample=False,
            cache_implementation=cache,
            output_logits=True,
            return_dict_in_generate=True,
            **kwargs,
        )
    return out.sequences, torch.stack(out.logits, 1)


def recomputed(model, sequences):
    """The logits of each generated step from one forward of the whole sequence, no cache."""
    with torch.no_grad():
        return model(input_ids=sequences[:, :-1], use_cache=False).logits[:, PROMPT - 1 :]


def decode_error(family, method, cache, implementation="sdpa", **kwargs) -> float:
    """max |logits of generate under ``cache`` - logits of a full recompute| under the patch; the tokens equal."""
    model = build(family, implementation)
    ids = prompt()
    with rope_ext.patch(model, scaling(method), original_max_position=TRAINED):
        sequences, steps = generated(model, ids, cache, **kwargs)
        full = recomputed(model, sequences)
    error = float((steps - full).abs().max())
    assert error <= 1e-4, f"{family} {method} {cache}: generate's logits {error:.3g} off a full recompute's"
    assert torch.equal(full.argmax(-1), sequences[:, PROMPT:])
    # not vacuous: the method changes these logits
    assert float((recomputed(model, sequences) - full).abs().max()) > 1e-3
    return error


# the default suite: every family under the static cache (each with another method, so every method is met), every
# method on Llama, and the other caches on Llama and Gemma-3; the slow test runs the whole grid
ROTATION = list(METHODS)
STATIC = [(family, ROTATION[i % len(ROTATION)]) for i, family in enumerate(FAMILIES)]
STATIC += [("llama", method) for method in ROTATION if ("llama", method) not in STATIC]
STATIC += [("qwen4_exp_text", "dca")]  # its indexer drops the last query's own key: positions read from the causal mask
NEEDS_CUDA = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="transformers offloads a cache to the CPU from CUDA only"
)
CACHES = [
    "dynamic",
    "static",
    pytest.param("offloaded", marks=NEEDS_CUDA),
    pytest.param("offloaded_static", marks=NEEDS_CUDA),
]


@pytest.mark.parametrize("family,method", STATIC)
def test_static_cache_decodes_as_a_full_recompute(family, method):
    assert decode_error(family, method, "static") <= 1e-4


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize(
    "family,method", [("llama", "dca"), ("gemma3_text", "self_extend"), ("mistral", "lm_infinite")]
)
def test_each_cache_decodes_as_a_full_recompute(family, method, cache):
    assert decode_error(family, method, cache) <= 1e-4


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("family,method", [("llama", "dca"), ("gemma3_text", "self_extend"), ("mistral", "rerope")])
def test_chunked_prefill_decodes_as_a_full_recompute(family, method, cache):
    """The prompt prefilled 10 tokens at a time: a chunk sees the cached keys and its own (Gemma-3's sliding static
    layer rolls inside the prefill)."""
    assert decode_error(family, method, cache, prefill_chunk_size=10) <= 1e-4


@pytest.mark.parametrize("method", ["self_extend", "lm_infinite"])
def test_eager_attention_under_the_static_cache(method):
    assert decode_error("llama", method, "static", "eager") <= 1e-4


@pytest.mark.parametrize("family,method", [("llama", "dca"), ("mistral", "self_extend")])
def test_flex_attention_path_under_the_static_cache(family, method):
    """rope_ext.attention.flex (FlexAttention, eager on the CPU) takes the same key positions as the blocks."""
    with flex.backend("flex"):
        assert decode_error(family, method, "static") <= 1e-4


def test_left_padded_batch_under_the_static_cache_decodes_each_row_as_alone():
    """The first call under the patch a left-padded batch: its first tokens padding (zero hidden states here) are
    not what the rotary layout is read from (it was: the layers read as without RoPE, the method silently off)."""
    model = build("llama")
    short, long_ = prompt(2)[:, :18], prompt(3)
    batch = torch.cat([torch.cat([torch.zeros(1, PROMPT - 18, dtype=torch.long), short], 1), long_])
    mask = torch.ones_like(batch)
    mask[0, : PROMPT - 18] = 0
    _, plain = generated(model, batch, "static", attention_mask=mask)
    with rope_ext.patch(model, scaling("self_extend"), original_max_position=TRAINED):
        both, steps = generated(model, batch, "static", attention_mask=mask)
        for row, ids in enumerate((short, long_)):
            alone, alone_steps = generated(model, ids, "dynamic")
            assert torch.equal(both[row, PROMPT:], alone[0, ids.shape[1] :])
            assert float((steps[row] - alone_steps[0]).abs().max()) <= 1e-4
    assert float((steps[1] - plain[1]).abs().max()) > 1e-3  # the method is on


@pytest.mark.slow  # transformers compiles its flex_attention: ~30 s on the CPU
def test_a_mask_that_does_not_say_which_keys_are_written_is_refused_in_one_line():
    """transformers' flex_attention implementation hands attention a BlockMask: which slots of a static buffer are
    written cannot be read from it, so the method refuses (it crashed on the mask before)."""
    model = build("llama", "flex_attention")
    with rope_ext.patch(model, scaling("dca"), original_max_position=TRAINED):
        with pytest.raises(rope_ext.AttentionHookError, match="BlockMask.*sdpa or eager") as err:
            generated(model, prompt(), "static")
    assert "\n" not in str(err.value)


def backend(name):
    """pytest.param of a quantized cache's backend, skipped (saying so) where its optional package is not installed."""
    package = {"quanto": "optimum.quanto", "hqq": "hqq"}.get(name)
    missing = False
    if package is not None:
        try:
            importlib.import_module(package)
        except ImportError:
            missing = True
    reason = f"the quantized cache's {name} backend needs {package}, not installed here"
    return pytest.param(name, marks=pytest.mark.skipif(missing, reason=reason))


@pytest.mark.parametrize("name", [backend("fp8"), backend("quanto"), backend("hqq")])
def test_quantized_cache_is_as_close_under_the_patch_as_without_it(name):
    """Its keys and values are stored lossy (fp8 is transformers' built-in backend), so its decode cannot equal a
    recompute: its error under the patch is compared with the unpatched model's under the same cache."""
    model = build("llama")
    ids = prompt()
    errors = []
    for patched in (False, True):
        patch = rope_ext.patch(model, scaling("self_extend"), original_max_position=TRAINED) if patched else None
        try:
            sequences, steps = generated(model, ids, "quantized", cache_config={"backend": name})
            errors.append(float((steps - recomputed(model, sequences)).abs().max()))
        finally:
            if patch is not None:
                patch.restore()
    plain, patched = errors
    assert patched <= 3 * plain + 1e-4, errors


@pytest.mark.slow
@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_and_method_under_the_static_cache(family, method):
    assert decode_error(family, method, "static") <= 1e-4
