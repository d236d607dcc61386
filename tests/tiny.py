"""The tiny test models, described once. TinyLlama's architecture at two toy sizes gives TINY and MICRO (Hydra
overrides: jobs composed as the CLI composes them) and ``tiny_llama`` (the micro model built directly with
transformers); ``MODELS`` are model configs of other families for Hydra's search path (the ``models`` fixture
writes them as YAML). A plain module, so module-level code (parametrize lists, constants) can import from it;
the fixtures are in conftest.py."""

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent  # the checkout: run.py, conf/, README.md

# TinyLlama's architecture (model=tinyllama) at toy sizes, random weights
TINY_ARCHITECTURE = dict(
    num_hidden_layers=2,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=49152,
)  # SmolLM2's tokenizer, the bundled one
MICRO_ARCHITECTURE = dict(
    num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2
)
MICRO_TRAINED = 64  # the micro model's trained context


def tinyllama(architecture: dict, **model) -> list[str]:
    """The overrides for ``model=tinyllama`` with random weights, this architecture and these model options,
    and no logger."""
    return [
        "model=tinyllama",
        "model.weights=random",
        *(f"model.architecture.{k}={v}" for k, v in architecture.items()),
        *(f"model.{k}={v}" for k, v in model.items()),
        "logger=none",
    ]


# the one tiny random-weight model of a real architecture (TinyLlama's), for jobs run end to end
TINY = tinyllama(TINY_ARCHITECTURE)
# smaller still, eager attention, trained context 64: for evals checked token by token against transformers
MICRO = tinyllama(
    {**MICRO_ARCHITECTURE, "max_position_embeddings": MICRO_TRAINED},
    original_max_position=MICRO_TRAINED,
    attn_implementation="eager",
)


def tiny_llama(vocab=96, trained=MICRO_TRAINED, seed=0, **extra):
    """The micro architecture as a transformers Llama, built directly (no Hydra, no job): eager attention, BOS 1,
    EOS 2, random weights drawn with ``seed``; ``extra`` goes to its config."""
    config = AutoConfig.for_model(
        "llama",
        **MICRO_ARCHITECTURE,
        vocab_size=vocab,
        max_position_embeddings=trained,
        bos_token_id=1,
        eos_token_id=2,
        **extra,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


# model configs of other families, each a conf/model/<name>.yaml against the model schema, random weights
SCHEMA = [{"/schema/model@_here_": "base"}, "_self_"]
MODELS = {
    "tinygemma": {  # Gemma-3's per-layer-type RoPE: a sliding layer (base 1e4) and a global one (base 1e6)
        "defaults": SCHEMA,
        "name": "tinygemma",
        "weights": "random",
        "original_max_position": 512,
        "architecture": {
            "model_type": "gemma3_text",
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "vocab_size": 49152,
            "max_position_embeddings": 512,
            "sliding_window": 64,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            },
        },
    },
    "tinyqwen2": {  # Qwen2's attention: biases on the q, k and v projections, GQA
        "defaults": SCHEMA,
        "name": "tinyqwen2",
        "weights": "random",
        "original_max_position": 256,
        "architecture": {
            "model_type": "qwen2",
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 49152,
            "max_position_embeddings": 256,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        },
    },
    "tinygpt2": {  # no RoPE at all
        "defaults": SCHEMA,
        "name": "tinygpt2",
        "weights": "random",
        "original_max_position": 256,
        "architecture": {
            "model_type": "gpt2",
            "n_embd": 32,
            "n_layer": 1,
            "n_head": 2,
            "vocab_size": 49152,
            "n_positions": 256,
            "bos_token_id": 0,
            "eos_token_id": 0,
        },
    },
    "tinyneoxjapanese": {  # RoPE, but an attention that does not call transformers' AttentionInterface (not hookable)
        "defaults": SCHEMA,
        "name": "tinyneoxjapanese",
        "weights": "random",
        "attn_implementation": "eager",  # the only one it has
        "original_max_position": 256,
        "architecture": {
            "model_type": "gpt_neox_japanese",
            "hidden_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "intermediate_multiple_size": 2,
            "vocab_size": 49152,
            "max_position_embeddings": 256,
        },
    },
}
