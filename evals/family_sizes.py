"""The tiny sizes of every RoPE family of the installed transformers (the compatibility suites: evals/families.py,
tests/test_attention_families.py): :data:`TINY`, each sub-size a full-size config sets larger cut (:data:`CUT`: experts,
indexers, per-layer inputs, ...), multi-head latent attention at toy ranks (:data:`MLA`, DeepSeek-V2's, arXiv:2405.04434),
a composite's vision and audio towers at :data:`SUB` sizes, and the one table of the families that need other arguments
(:data:`SPECIAL`: what a default config lacks and a checkpoint ships)."""

from __future__ import annotations

from functools import lru_cache

from transformers import AutoConfig

TRAINED, LENGTH, VOCAB = 32, 72, 128  # 72 tokens on a 32-token model: past 2L, so every strategy moves the logits
TINY = dict(
    num_hidden_layers=2,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=VOCAB,
    max_position_embeddings=TRAINED,
    pad_token_id=0,
)
# sub-sizes a full-size config sets past a tiny model's, cut to these where the family's default config has them
# larger: routed experts (and the experts each token takes, and DeepSeek's expert groups), a sparse-attention
# indexer's heads, per-layer input embeddings (Gemma-3n/4: 262,144 x 256 by default), a feed-forward, shared expert,
# output projection's rank, sliding-window attention or output vocabulary sized apart from the tiny ones
CUT = dict(
    ffn_dim=TINY["intermediate_size"],
    shared_experts_intermediate_size=TINY["moe_intermediate_size"],
    o_lora_rank=16,
    swa_num_attention_heads=TINY["num_attention_heads"],
    swa_num_key_value_heads=TINY["num_key_value_heads"],
    swa_head_dim=TINY["head_dim"],
    unpadded_vocab_size=VOCAB,
    num_experts=8,
    num_local_experts=8,
    n_routed_experts=8,
    moe_num_experts=8,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    index_n_heads=2,
    index_num_heads=2,
    index_head_dim=16,
    vocab_size_per_layer_input=VOCAB,
    hidden_size_per_layer_input=16,
)
# the families that need other arguments to build tiny: the one table of them
DROP = object()  # a TINY key the family's config does not take
MLA = dict(  # multi-head latent attention (DeepSeek-V2 and kin: every family whose config has a rope sub-dimension,
    # qk_rope_head_dim) at toy sizes, rope sub-dimension 8, every head a query head of its own latent key/value
    kv_lora_rank=16,
    q_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=16,
    num_key_value_heads=4,
    head_dim=8,  # the rotary's (LongCat-Flash, Youtu size their rotary from head_dim; DeepSeek sets it so itself)
    num_experts_per_tok=2,  # None by default in DeepSeek-V2's config
)
SPECIAL: dict[str, dict] = {
    "falcon": {"head_dim": DROP},
    # RoFormer's rotary indexes a sin/cos table of max_position_embeddings rows (a frozen nn.Embedding): past it,
    # transformers itself raises IndexError; the table long enough for the survey (its trained context, the suite's,
    # is passed to the patch)
    "roformer": {"max_position_embeddings": LENGTH},
    "blt": {"encoder_hash_byte_group_vocab": 64},  # its hash n-gram embeddings: 500,002 rows per n-gram size by default
    # Phi-3 (and Phi-4-multimodal's text model) keep the trained context at the top level
    **{t: {"original_max_position_embeddings": TRAINED} for t in ("phi3", "phi4_multimodal")},
    "gptj": {"rotary_dim": 8},  # partial rotary, as GPT-J 6B's 64 of 256 (the default 64 exceeds the tiny head)
    "codegen": {"rotary_dim": 8},
    "bamba": {"attn_layer_indices": [1]},  # its default has no attention layer at all (Bamba-9B's lists them)
    # its full-attention layers are DeepSeek's MLA (one latent key/value for every head)
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},  # its pattern's attention layer is the 3rd
    # its pattern's first 3 layers are fixed; two shared-attention layers (transformers' weight tying wants a second)
    "zamba": {"num_hidden_layers": 4, "attn_layer_period": 1, "attn_layer_offset": 0},
    "ergo": dict(first_dense_intermediate_size=96, shared_intermediate_size=32),
    "lfm3": {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8},  # 2 conv layers otherwise
    # its default split (8 input + 8 output layers around a looped middle) exceeds a tiny stack: transformers then
    # runs each layer twice under one cache index; one layer each way and one looped between
    "dory": {"num_hidden_layers": 3, "n_input_layers": 1, "n_output_layers": 1},
    # DBRX's attention reads attn_config.rope_theta and clamps by clip_qkv, neither set by its default config (DBRX's
    # checkpoint ships both: 500000, 8); its experts are sized from d_model before hidden_size (its alias) is set
    "dbrx": {
        "d_model": TINY["hidden_size"],
        "attn_config": {"kv_n_heads": 2, "rope_theta": 500000.0, "clip_qkv": 8.0},
        "ffn_config": {"ffn_hidden_size": 96},
    },
    "dots1": dict(n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2),  # None by default
    # a composite's layer types are its text config's, not read from the default (layer_kinds): one of each
    **{t: {"layer_types": ["linear_attention", "full_attention"]} for t in ("qwen3_5", "qwen3_5_moe")},
    # Qwen4-exp's indexer is sized by fields its default config leaves None (the modeling divides them)
    "qwen4_exp": dict(
        layer_types=["linear_attention", "full_attention"],
        indexer_n_heads=2,
        indexer_kv_heads=1,
        indexer_head_dim=16,
        indexer_budget=16,
        indexer_compress_ratio=4,
    ),
    **{
        t: dict(indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=16, indexer_compress_ratio=4)
        for t in ("qwen4_exp_text",)
    },
    # no attention layer by default (Granite-4.0-H's checkpoints list them): one, so a cached forward has one to mask
    "granitemoehybrid": {"layer_types": ["linear_attention", "attention"]},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    # one Mamba-2 layer, one with the shared attention, whose RoPE is off by default (use_mem_rope): on, so it is checked
    "zamba2": {"layers_block_type": ["linear_attention", "hybrid"], "use_mem_rope": True},
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    "gemma3n_text": {"num_kv_shared_layers": 0},
    # its sliding layers' MLA is sized apart (swa_*: 64 heads, ranks 1024 by default)
    **{
        t: dict(
            swa_num_attention_heads=4,
            swa_num_key_value_heads=4,
            swa_q_lora_rank=16,
            swa_kv_lora_rank=16,
            swa_head_dim=16,
            swa_qk_nope_head_dim=8,
            swa_v_head_dim=16,
        )
        for t in ("dots3_note", "dots3_note_text")
    },
    "bailing_hybrid": dict(
        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, num_key_value_heads=4
    ),
}


@lru_cache(maxsize=None)
def _default_config(model_type: str):
    """The family's default (full-size) config (None where it cannot be made); read, never changed."""
    try:
        return AutoConfig.for_model(model_type)
    except Exception:
        return None


def _defaults(model_type: str) -> dict:
    """The family's default (full-size) text config, as a dict ({} where it cannot be made)."""
    cfg = _default_config(model_type)
    return cfg.get_text_config().to_dict() if cfg is not None else {}


# a composite's other sub-configs (vision, audio, ...) at toy sizes, where they are set larger
SUB = dict(
    hidden_size=32,
    hidden_size_global=32,  # BLT's byte encoder and decoder: the global transformer's width (SUB's hidden_size)
    intermediate_size=64,
    num_hidden_layers=1,
    depth=1,
    num_global_layers=1,
    num_attention_heads=2,
    num_heads=2,
    num_key_value_heads=2,
    embed_dim=32,
    hidden_dim=32,
    out_hidden_size=64,
    projection_dim=32,
    vision_output_dim=32,
    # the trained context, the tiny model's everywhere: a sub-config whose own rotary reads its own (BLT's patcher,
    # byte encoder and decoder, global transformer: 8192, 24576, 24576, 4096 by default) is extended past it too
    max_position_embeddings=TRAINED,
)


def config_arguments(model_type: str, sizes: dict) -> dict:
    """The config's arguments for ``sizes``: the text config's where it is a sub-config of a composite (Gemma-3,
    Qwen3.5, Llama-4, ...), and every other sub-config not given at :data:`SUB` sizes, so no vision tower or audio
    encoder keeps its default billions."""
    base = _default_config(model_type)
    if base is None:
        return sizes
    text = base.get_text_config()
    out = dict(sizes) if text is base else {}
    for name in base.sub_configs or {}:
        sub = getattr(base, name, None)
        if name in sizes or not hasattr(sub, "to_dict"):
            continue
        default = sub.to_dict()
        out[name] = (
            sizes
            if sub is text
            else {k: v for k, v in SUB.items() if isinstance(default.get(k), int) and default[k] > v}
        )
    return out


def tiny_sizes(model_type: str, tiny: dict = TINY) -> dict:
    """The arguments of the family's tiny config: ``tiny``; each :data:`CUT` size the default config sets larger, cut;
    :data:`MLA` where the family has a rope sub-dimension; then the family's own :data:`SPECIAL` (:data:`DROP`: a key
    left to the config)."""
    default = _defaults(model_type)
    cut = {k: v for k, v in CUT.items() if isinstance(default.get(k), int) and default[k] > v}
    mla = MLA if isinstance(default.get("qk_rope_head_dim"), int) else {}
    sizes = {**tiny, **mla, **cut, **SPECIAL.get(model_type, {})}
    return {k: v for k, v in sizes.items() if v is not DROP}


def tiny_arguments(model_type: str, sizes: dict) -> dict:
    """The config arguments of another tiny suite (the attention-level one): its ``sizes`` over this suite's cuts,
    MLA sizes and fixes of the family (:func:`tiny_sizes`), a composite's text config and towers given apart."""
    return config_arguments(model_type, {**tiny_sizes(model_type, sizes), **sizes})


@lru_cache(maxsize=None)
def layer_kinds(model_type: str) -> tuple[str, ...]:
    """The kinds of layer the family's default (full-size) config lists in ``layer_types``, in order of first
    appearance: ``()`` where it lists none or they cannot be given (composite, or derived from other fields)."""
    try:
        cfg = AutoConfig.for_model(model_type)
    except Exception:
        return ()
    field = type(cfg).attribute_map.get("layer_types", "layer_types")
    if cfg.get_text_config() is not cfg or isinstance(getattr(type(cfg), field, None), property):
        return ()  # composite, or its layer_types derived from other fields (Jamba, RecurrentGemma): not given
    kinds = getattr(cfg, "layer_types", None)
    return tuple(dict.fromkeys(kinds)) if isinstance(kinds, (list, tuple)) else ()
