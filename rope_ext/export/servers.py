"""A scaling as vLLM and SGLang take it: the HF config overrides and the context flag.

- vLLM (its own code checked in tests/test_engines.py, :data:`~rope_ext.export.common.VERIFIED`): ``--hf-overrides
  '{"rope_parameters": {...}, "max_position_embeddings": N}' --max-model-len C``. vLLM sets a dict override on the
  config as it is (the model's own rope dict is replaced: its ``partial_rotary_factor`` is kept here) and a flat one
  through the config loader (``vllm/config/model.py``); its start-up check (``_get_and_verify_max_len``) multiplies
  ``max_position_embeddings`` by the factor only for ``linear``/``dynamic``, and its cos/sin table has
  ``max_position_embeddings`` rows for ``default`` and ``llama3`` (``rotary_embedding/base.py``), so N >= C is passed
  as ``max_position_embeddings`` too. Its YaRN reads ``attention_factor`` (``yarn_scaling_rope.py``). It reads
  ``rope_parameters`` only since PR #28542 (2025-11): an older vLLM ignores the override and serves plain RoPE.
  Its ``dynamic`` rope computes one NTK base at start-up from ``max_position_embeddings`` and
  ``max_trained_positions`` (``dynamic_ntk_scaling_rope.py``): static, so dynamic NTK is not exported. Its
  LongRoPE uses the long factors at every length once ``max_model_len`` exceeds the trained context
  (``phi3_long_rope_scaled_rope.py``): not the measurement, not exported. p-RoPE as its ``proportional`` rope with
  ``partial_rotary_factor`` = kept pairs / (d/2) (``gemma4_rope.py``), on models that rotate the whole head. DCA as
  Qwen2.5-1M's ``dual_chunk_attention_config`` (``chunk_size``, ``local_size``, ``original_max_position_embeddings``)
  with ``VLLM_ATTENTION_BACKEND=DUAL_CHUNK_FLASH_ATTN``, on the Qwen2 family only.
- SGLang: ``--json-model-override-args '{"rope_scaling": {...}, "max_position_embeddings": N}' --context-length C``.
  SGLang merges a rope override into the model's own dict (``{**current, **value}``,
  ``srt/utils/hf_transformers/config.py``), so every key of the model's own rope dict the export does not set is
  given explicitly (null; ``factor`` 1) and a top-level ``original_max_position_embeddings`` (which its Llama copies
  over the rope dict's) is set too; its context check (``get_context_length``) multiplies by the factor only without
  ``original_max_position_embeddings`` and for non-llama3. Its YaRN reads ``attn_factor`` and multiplies it by
  0.1 ln s + 1 itself (``rotary_embedding/yarn.py``). Dynamic NTK is static there too; its LongRoPE switches to the
  long factors for a whole batch when any position passes the trained context; its Llama/Qwen2 pass get_rope a
  rotary dim of their own, so p-RoPE's ``proportional`` rope would rotate every pair: none of these is exported. Its
  Gemma-3 (``srt/models/gemma3_causal.py``) builds every layer's rotary with rope_type ``default`` and the layer
  type's ``rope_theta``: only a changed base (NTK-aware, ``base``) reaches it, every other rope type is refused. DCA
  with ``--attention-backend dual_chunk_flash_attn``.
- DeepSeek-V3 in both (their ``models/deepseek_v2.py``, :func:`_deepseek_rope`): the rotary covers
  ``qk_rope_head_dim``; a rope type but ``default`` becomes their DeepSeek YaRN, whose magnitude and softmax scale
  come from ``mscale``/``mscale_all_dim``: YaRN and NTK-by-parts are given as these, the rest refused.

C is the context served (the length the job's verdict judged; else what the scaling covers, trained x factor).
"""

from __future__ import annotations

import json
import math

from ..strategies.frequency import yarn_mscale
from ..strategies.scaling import Scaling
from ..rotary.native import Geometry, Unsupported, served, table
from .common import MODEL, note, shell
from ..rotary.native import rope_parameters, transformers_config

QWEN2_FAMILY = ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe")  # vLLM/SGLang models with dual chunk attention

# what vLLM's and SGLang's start-up would not give the measurement: one line each
_NOT_SERVED = {
    "dynamic_ntk": "{engine}'s 'dynamic' rope computes one NTK base at start-up, from max_position_embeddings and "
    "max_trained_positions (static): it would not be the dynamic NTK measured here, whose base follows the length",
    ("longrope", "vLLM"): "vLLM uses LongRoPE's long factors at every length once --max-model-len exceeds the "
    "trained context; the measurement used the short factors up to it",
    ("longrope", "SGLang"): "SGLang switches LongRoPE to the long factors for a whole batch once any position in "
    "it passes the trained context; the measurement switched per sequence",
    "p_rope": "{engine}'s Llama and Qwen2 build the 'proportional' rope (p-RoPE) from the rotary dim they compute "
    "themselves, not from rope_parameters: not exported",
}


# engine model modules that read only rope_theta from the config and fix the rope type themselves
_THETA_ONLY = {
    ("SGLang", "gemma3_text"): "SGLang's Gemma-3 builds every layer's rotary with rope_type 'default' and the config's "
    "rope_theta only (srt/models/gemma3_causal.py): only a changed base (ntk, base) reaches it",
}


MLA_YARN = ("deepseek_v3",)  # DeepSeek-V3's module: every rope type but default served as its own YaRN (below)


def softmax_temperature(own: dict) -> float:
    """The factor DeepSeek-V3's attention multiplies into its softmax scale, squared (transformers'
    ``yarn_apply_mscale``, vLLM's and SGLang's DeepSeek modules): yarn_mscale(factor, mscale_all_dim) for a scaled
    rope dict with ``mscale_all_dim``, else 1. The patched model's is its strategy's (:mod:`rope_ext.rotary.softmax_scale`)."""
    kind = own.get("rope_type") or own.get("type") or "default"
    if kind == "default" or not own.get("mscale_all_dim"):
        return 1.0
    return yarn_mscale(float(own.get("factor") or 1.0), float(own["mscale_all_dim"]))


def _deepseek_rope(scaling: Scaling, geo: Geometry, model_config: dict | None, engine: str, context) -> dict:
    """DeepSeek-V3 in vLLM and SGLang (``models/deepseek_v2.py`` of both): the rotary covers ``qk_rope_head_dim``
    (the slot's dim); rope type ``default`` is plain RoPE, every other type becomes their DeepSeek YaRN (vLLM
    ``deepseek_yarn``/``deepseek_llama_scaling``, SGLang ``deepseek_yarn``: by-parts frequencies from ``factor``,
    ``original_max_position_embeddings``, ``beta_fast``/``beta_slow``, always truncated) with cos/sin magnitude
    yarn_mscale(s, mscale) / yarn_mscale(s, mscale_all_dim) (SGLang times ``attn_factor``; ``attention_factor`` is
    not read) and the softmax scale times yarn_mscale(s, mscale_all_dim)^2 (vLLM: not when ``attention_factor`` is
    1.0). So YaRN and NTK-by-parts go as ``mscale``/``mscale_all_dim`` that give the measured magnitude and the
    measured softmax scale -- the strategy's own, as the patch sets it (:mod:`rope_ext.rotary.softmax_scale`,
    :func:`softmax_temperature`); ``none`` as the model's own rope (the model as shipped, its softmax scale included),
    ``ntk``/``base`` as a default rope (the unscaled softmax scale, as measured); anything else is refused."""
    config = model_config or {}
    if engine == "vLLM" and config.get("rope_interleave") is False:
        raise Unsupported(
            "vLLM's DeepSeek rotates interleaved pairs whatever the config's rope_interleave says: this model's "
            "rope_interleave=false would be served with other pairs"
        )
    if scaling.name not in ("yarn", "ntk_by_parts"):
        if scaling.name in ("none", "ntk", "base"):
            return transformers_config(scaling, geo, model_config, context)["rope_parameters"]
        raise Unsupported(
            f"{engine}'s DeepSeek serves every rope type but 'default' as its DeepSeek YaRN: "
            f"'{scaling.name}' is not exported for {geo.model_type}"
        )
    yarn = rope_parameters(scaling, geo)
    temperature = softmax_temperature(yarn)  # the softmax scale measured: the strategy's own mscale_all_dim
    if yarn["truncate"] is False:
        raise Unsupported(f"{engine}'s DeepSeek YaRN always truncates its correction range (truncate=false)")
    factor, magnitude = float(yarn["factor"]), float(yarn["attention_factor"])
    if factor <= 1.0 and (magnitude, temperature) != (1.0, 1.0):
        raise Unsupported(f"{engine}'s DeepSeek YaRN at factor {factor:g} has magnitude 1 and no softmax change")
    served_context = served(scaling, geo, context)
    rows = yarn["original_max_position_embeddings"] * factor
    if engine == "vLLM" and served_context > math.ceil(rows):
        raise Unsupported(
            f"vLLM's DeepSeek YaRN has a cos/sin table of original x factor = {rows:g} positions, fewer than the "
            f"{served_context} served"
        )
    log = 0.1 * math.log(factor) if factor > 1.0 else 1.0
    entry = {k: v for k, v in yarn.items() if k not in ("truncate", "attention_factor")}
    # magnitude = yarn_mscale(s, mscale) / yarn_mscale(s, mscale_all_dim); softmax x yarn_mscale(s, mscale_all_dim)^2
    entry["mscale"] = (magnitude * temperature - 1.0) / log
    entry["mscale_all_dim"] = (temperature - 1.0) / log
    if engine == "SGLang":  # its DeepSeek YaRN also multiplies by these
        entry.update(attn_factor=1.0, extrapolation_factor=1.0)
    return entry


def _served_rope(scaling: Scaling, geo: Geometry, model_config: dict | None, engine: str, context) -> dict:
    """The rope parameters a vLLM-style engine reads from the HF config it is given."""
    if geo.model_type in MLA_YARN and scaling.name not in ("dca", "dynamic_ntk"):
        return _deepseek_rope(scaling, geo, model_config, engine, context)
    theta_only = _THETA_ONLY.get((engine, geo.model_type))
    if theta_only and scaling.name not in ("none", "ntk", "base"):
        raise Unsupported(theta_only)
    if scaling.name == "p_rope" and engine == "vLLM":
        return _proportional(scaling, geo, model_config)
    why = _NOT_SERVED.get((scaling.name, engine)) or _NOT_SERVED.get(scaling.name)
    if why:
        raise Unsupported(why.format(engine=engine))
    try:
        return transformers_config(scaling, geo, model_config, context)["rope_parameters"]
    except Unsupported as err:
        raise Unsupported(str(err).replace("transformers", engine, 1)) from None


def _proportional(scaling: Scaling, geo: Geometry, model_config: dict | None) -> dict:
    """vLLM's 'proportional' rope (Gemma-4's, ``rotary_embedding/gemma4_rope.py``): pairs i < rotary_dim/2 keep
    b^(-2i/head_size), the rest do not rotate -- p-RoPE when the model rotates its whole head."""
    from ..strategies.frequency import p_rope_pairs

    config = model_config or {}
    partial = (config.get("rope_parameters") or {}).get("partial_rotary_factor") or config.get("partial_rotary_factor")
    if geo.layer_types is not None or (partial or 1.0) != 1.0:
        raise Unsupported(
            "vLLM's 'proportional' rope computes its frequencies over the whole head: p-RoPE on a model with partial "
            "rotary or per-layer-type rope is not exported"
        )
    pairs = p_rope_pairs(scaling.params["fraction"], geo.dim)
    factor = 2 * pairs / geo.dim
    if int(geo.dim * factor) != 2 * pairs:  # vLLM's rotary_dim = int(head_size * partial_rotary_factor)
        raise Unsupported(f"vLLM would round p-RoPE's {pairs} pairs of {geo.dim // 2} to another count")
    return {"rope_type": "proportional", "rope_theta": geo.base, "partial_rotary_factor": factor}


def _entries(rope: dict) -> list[dict]:
    return [rope] if "rope_type" in rope else list(rope.values())


def vllm(
    scaling: Scaling, geo: Geometry, model_config: dict | None = None, context: int | None = None, model: str = MODEL
) -> dict:
    """``{"command", "hf_overrides", "env", "context", "note"}`` for ``vllm serve``."""
    if scaling.name == "dca":
        overrides, env, longest = (
            _dca(scaling, geo, "vLLM", context),
            {"VLLM_ATTENTION_BACKEND": "DUAL_CHUNK_FLASH_ATTN"},
            context,
        )
    else:
        rope, longest = _served_rope(scaling, geo, model_config, "vLLM", context), served(scaling, geo, context)
        # vLLM's YaRN reads attention_factor itself; the table and the start-up check read max_position_embeddings
        overrides, env = {"rope_parameters": rope, "max_position_embeddings": table(scaling, geo, context)}, {}
    command = ["vllm", "serve", model, "--hf-overrides", json.dumps(overrides)]
    if longest:
        command += ["--max-model-len", str(longest)]
    return {
        "command": shell(command, env),
        "hf_overrides": overrides,
        "env": env,
        "context": longest,
        "note": note(geo, "vLLM", scaling),
    }


def _sglang_rope(rope: dict, own: dict) -> dict:
    """SGLang's rope_scaling override: merged into the model's own dict, so the model's keys that ours lacks are
    given explicitly; YaRN's attention factor as SGLang's attn_factor (it multiplies by 0.1 ln s + 1 itself)."""
    entry = dict(rope)
    if entry.get("rope_type") == "yarn":
        entry["attn_factor"] = entry.pop("attention_factor") / yarn_mscale(entry["factor"])
        entry["extrapolation_factor"] = 1.0
    for key in own:
        if key not in entry and key not in ("rope_theta", "partial_rotary_factor"):
            entry[key] = 1.0 if key == "factor" else None  # get_context_length multiplies by factor
    return entry


def sglang(
    scaling: Scaling, geo: Geometry, model_config: dict | None = None, context: int | None = None, model: str = MODEL
) -> dict:
    """``{"command", "json_model_override_args", "context", "note"}`` for ``python -m sglang.launch_server``."""
    extra = []
    if scaling.name == "dca":
        overrides, longest = _dca(scaling, geo, "SGLang", context), context
        extra = ["--attention-backend", "dual_chunk_flash_attn"]
    else:
        rope, longest = _served_rope(scaling, geo, model_config, "SGLang", context), served(scaling, geo, context)
        own = dict((model_config or {}).get("rope_parameters") or {})
        if scaling.name == "none" and own:
            rope = {}  # the model's own rope, as it is
        elif geo.model_type in MLA_YARN:  # merged into the model's own dict: its other keys given explicitly
            rope = {**{k: (1.0 if k == "factor" else None) for k in own if k not in rope}, **rope}
        elif "rope_type" in rope:
            rope = _sglang_rope(rope, own)
        else:
            rope = {t: _sglang_rope(entry, own.get(t) or {}) for t, entry in rope.items()}
        overrides = {
            **({"rope_scaling": rope} if rope else {}),
            "max_position_embeddings": table(scaling, geo, context),
        }
        if rope and (model_config or {}).get("original_max_position_embeddings") is not None:
            # SGLang's Llama copies a top-level original_max_position_embeddings over the rope dict's
            overrides["original_max_position_embeddings"] = next(
                (
                    e["original_max_position_embeddings"]
                    for e in _entries(rope)
                    if e.get("original_max_position_embeddings")
                ),
                None,
            )
    command = ["python", "-m", "sglang.launch_server", "--model-path", model]
    command += ["--json-model-override-args", json.dumps(overrides), *extra]
    if longest:
        command += ["--context-length", str(longest)]
    return {
        "command": shell(command, {}),
        "json_model_override_args": overrides,
        "context": longest,
        "note": note(geo, "SGLang", scaling),
    }


def _dca(scaling: Scaling, geo: Geometry, engine: str, context: int | None) -> dict:
    """Qwen2.5-1M's dual chunk attention; with a context to serve, ``max_position_embeddings`` set to it (else the
    model's own bounds the engine's context)."""
    from ..strategies.attention_level import dca_sizes

    if geo.model_type not in QWEN2_FAMILY:
        raise Unsupported(
            f"{engine} runs dual chunk attention on the Qwen2 family only ({', '.join(QWEN2_FAMILY)}), "
            f"not {geo.model_type}"
        )
    chunk, local = dca_sizes(scaling.params)
    config = {"chunk_size": chunk, "local_size": local, "original_max_position_embeddings": geo.trained}
    return {"dual_chunk_attention_config": config, **({"max_position_embeddings": context} if context else {})}
