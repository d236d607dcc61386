"""A scaling as the engines that serve models take it: transformers' ``config.json``, vLLM, SGLang and llama.cpp.

Each engine gets the exact settings that reproduce the strategy, or, where it cannot express one, a one-line
reason (:class:`Unsupported`) instead of an approximation. Sources of every key:

- transformers ``rope_parameters`` (``modeling_rope_utils.py``, the installed version's ``ROPE_INIT_FUNCTIONS``:
  ``default`` with its ``rope_theta``, ``linear``, ``dynamic``, ``yarn``, ``llama3``, ``longrope``); per layer type
  where the model has layer types (Gemma-3: ``{"full_attention": {...}, "sliding_attention": {...}}``).
- vLLM (verified against 0.33.0's own code, ``tests/test_engines.py``): ``--hf-overrides '{"rope_parameters":
  {...}, "max_position_embeddings": N}' --max-model-len N``. vLLM sets a dict override on the config as it is (the
  model's own rope dict is replaced: its ``partial_rotary_factor`` is kept here) and a flat one through the config
  loader (``vllm/config/model.py``); its start-up check (``_get_and_verify_max_len``) multiplies
  ``max_position_embeddings`` by the factor only for ``linear``/``dynamic``, and its cos/sin table has
  ``max_position_embeddings`` rows for ``default`` and ``llama3`` (``rotary_embedding/base.py``), so N is passed as
  ``max_position_embeddings`` too. Its YaRN reads ``attention_factor`` (``yarn_scaling_rope.py``). It reads
  ``rope_parameters`` only since PR #28542 (2025-11): an older vLLM ignores the override and serves plain RoPE.
  Its ``dynamic`` rope computes one NTK base at start-up from ``max_position_embeddings`` and
  ``max_trained_positions`` (``dynamic_ntk_scaling_rope.py``): static, so dynamic NTK is not exported. Its
  LongRoPE uses the long factors at every length once ``max_model_len`` exceeds the trained context
  (``phi3_long_rope_scaled_rope.py``): not the measurement, not exported. p-RoPE as its ``proportional`` rope with
  ``partial_rotary_factor`` = kept pairs / (d/2) (``gemma4_rope.py``), on models that rotate the whole head. DCA as Qwen2.5-1M's
  ``dual_chunk_attention_config`` (``chunk_size``, ``local_size``, ``original_max_position_embeddings``) with
  ``VLLM_ATTENTION_BACKEND=DUAL_CHUNK_FLASH_ATTN``, on the Qwen2 family only.
- SGLang (verified against 0.5.23's own code): ``--json-model-override-args '{"rope_scaling": {...},
  "max_position_embeddings": N}' --context-length N``. SGLang merges a rope override into the model's own dict
  (``{**current, **value}``, ``srt/utils/hf_transformers/config.py``), so every key of the model's own rope dict
  the export does not set is given explicitly (null; ``factor`` 1) and a top-level
  ``original_max_position_embeddings`` (which its Llama copies over the rope dict's) is set too; its context check
  (``get_context_length``) multiplies by the factor only without ``original_max_position_embeddings`` and for
  non-llama3. Its YaRN reads ``attn_factor`` and multiplies it by 0.1 ln s + 1 itself (``rotary_embedding/yarn.py``).
  Dynamic NTK is static there too; its LongRoPE switches to the long factors for a whole batch when any position
  passes the trained context; its Llama/Qwen2 pass get_rope a rotary dim of their own, so p-RoPE's
  ``proportional`` rope would rotate every pair: none of these is exported. DCA with ``--attention-backend dual_chunk_flash_attn``.
- llama.cpp: ``--rope-scaling {none,linear,yarn} --rope-freq-scale --rope-freq-base b --yarn-orig-ctx L
  --yarn-ext-factor --yarn-beta-fast --yarn-beta-slow -c N --override-kv KEY=float:X`` (``common/arg.cpp``), and
  the same as ``llama_cpp.Llama(...)`` arguments (``rope_scaling_type``, ``rope_freq_base``, ``rope_freq_scale``,
  ``yarn_orig_ctx``, ``yarn_ext_factor``, ``yarn_beta_fast``, ``yarn_beta_slow``, ``n_ctx``, ``kv_overrides``).
  With YaRN on, llama.cpp's cos/sin magnitude is ``<arch>.rope.scaling.attn_factor * (1 + 0.1 ln s)``: the kernel
  (``rope_yarn`` in ggml) multiplies by ``yarn_attn_factor * (1 + 0.1 ln s)``, and since PR #17945 the host sets
  ``yarn_attn_factor`` to that GGUF key's value, ignoring ``--yarn-attn-factor`` (``src/llama-context.cpp``); the
  key is set with ``--override-kv``. It rounds the ramp's ends to whole dimensions (transformers' ``truncate``).
  Its Self-Extend (llama-cli's ``--grp-attn-n/--grp-attn-w``, ``tools/completion``) is not the one measured here.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from .frequency import ntk_base, yarn_mscale
from .scaling import Compose, Scaling

ENGINES = ("transformers", "vllm", "sglang", "llama.cpp")
# the engine versions each export was checked against (transformers: the logits, tests/test_export.py; vLLM and
# SGLang: their own rotary and config code, tests/test_engines.py; llama.cpp: tests/test_llama_cpp*.py) ...
VERIFIED = {
    "transformers": "5.24.0",
    "vllm": "0.33.0",
    "sglang": "0.5.23",
    "llama.cpp": "llama-cpp-python 0.3.36 (llama.cpp 0c1e570)",
}
# ... and the oldest that reads what the export gives it
MINIMUM = {
    "transformers": "transformers 5.0.0 (rope_parameters)",
    "vllm": "a vLLM with rope_parameters support (PR #28542, 2025-11); an older one ignores the override and "
    "serves plain RoPE",
    "sglang": "SGLang 0.5.23 (older versions not checked)",
    # the host multiplying <arch>.rope.scaling.attn_factor into the rope's magnitude (PR #7225), before PR #17945 as
    # after it; --yarn-attn-factor, which #17945 overwrites, is left at its default 1
    "llama.cpp": "llama.cpp with PR #7225 (2024-05, <arch>.rope.scaling.attn_factor); verified: 0.3.36 only",
}
# the model families whose vLLM and SGLang modules the tests check (others: "not verified" in deploy/README.md)
ENGINE_VERIFIED_MODELS = ("llama", "qwen2")
QWEN2_FAMILY = ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe")  # vLLM/SGLang models with dual chunk attention


class Unsupported(ValueError):
    """An engine that cannot express a scaling: the message says why, in one line."""


@dataclass(frozen=True)
class Geometry:
    """What an export needs to know of the model: its type, trained context, rotary dim, base and layer types
    (None: one shared rotary), and the layer types the scaling applies to."""

    model_type: str
    trained: int
    dim: int
    base: float
    layer_types: tuple[str, ...] | None = None
    scaled_types: tuple[str, ...] | None = None


def geometry(model_or_config, scaling: Scaling, slots=None, trained: int | None = None, scaled=None) -> Geometry:
    """The :class:`Geometry` of a transformers model (or its config with ``slots``, and the ``scaled`` ones, as a job
    resolves and selects them): the rotary dim and base of the slots the scaling patches (Gemma-3: the global
    layers')."""
    from .slots import find_rotary_slots, select_slots, trained_context

    config = getattr(model_or_config, "config", model_or_config)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    slots = list(slots if slots is not None else find_rotary_slots(model_or_config))
    if scaled is None:
        scaled = select_slots(slots, scaling.layer_types) if scaling.name != "none" else slots
    types = sorted({s.layer_type for s in slots if s.layer_type is not None}) or None
    scaled_types = sorted({s.layer_type for s in scaled if s.layer_type is not None}) or None
    return Geometry(
        config.model_type,
        int(trained or trained_context(config)),
        scaled[0].dim,
        float(scaled[0].base),
        tuple(types) if types else None,
        tuple(scaled_types) if scaled_types else None,
    )


def covered(scaling: Scaling, trained: int) -> int:
    """The context the scaled model is set up for: trained x factor (the trained context without a factor)."""
    factor = scaling.factor or 1.0
    return round(trained * factor)


def _trained(scaling: Scaling, geo: Geometry) -> int:
    # the trained context the scaling was resolved with (scaling.original_max_position), else the model's
    return int(scaling.params.get("original_max_position") or geo.trained)


def rope_parameters(scaling: Scaling, geo: Geometry) -> dict:
    """The ``rope_parameters`` of one scaled layer type, as the installed transformers reads them; Unsupported where
    transformers has no rope type that computes the same frequencies."""
    p, name, L = scaling.params, scaling.name, _trained(scaling, geo)
    if name == "none":
        return {"rope_type": "default", "rope_theta": geo.base}
    if name == "linear":
        return {"rope_type": "linear", "rope_theta": geo.base, "factor": p["factor"]}
    if name == "ntk":  # NTK-aware: the default rope at the enlarged base b * s^(d/(d-2))
        return {"rope_type": "default", "rope_theta": ntk_base(geo.base, p["factor"], geo.dim)}
    if name == "base":
        return {"rope_type": "default", "rope_theta": p["base"]}
    if name == "dynamic_ntk":
        return {"rope_type": "dynamic", "rope_theta": geo.base, "factor": p["factor"]}
    if name in ("yarn", "ntk_by_parts"):
        if p.get("dynamic"):
            raise Unsupported(
                "transformers has no dynamic YaRN (the factor following the length); export the static one"
            )
        attention = 1.0 if name == "ntk_by_parts" else scaling.frequencies(geo.dim, geo.base)[1]
        return {
            "rope_type": "yarn",
            "rope_theta": geo.base,
            "factor": p["factor"],
            "original_max_position_embeddings": L,
            "beta_fast": p["beta_fast"],
            "beta_slow": p["beta_slow"],
            "truncate": p["truncate"],
            "attention_factor": attention,
        }
    if name == "llama3":
        return {
            "rope_type": "llama3",
            "rope_theta": geo.base,
            "factor": p["factor"],
            "original_max_position_embeddings": L,
            "low_freq_factor": p["low_freq_factor"],
            "high_freq_factor": p["high_freq_factor"],
        }
    if name == "longrope":
        return {
            "rope_type": "longrope",
            "rope_theta": geo.base,
            "factor": p["factor"],
            "original_max_position_embeddings": L,
            "short_factor": list(p["short_factor"]),
            "long_factor": list(p["long_factor"]),
            "attention_factor": scaling.frequencies(geo.dim, geo.base, L + 1)[1],
        }
    raise Unsupported(f"transformers cannot express '{scaling.label}': {_why_not(scaling)}")


def _why_not(scaling: Scaling) -> str:
    kind = scaling.strategy.kind
    if isinstance(scaling, Compose):
        return "a composition of stages has no rope type"
    if kind == "attention":
        return "an attention-level method changes which relative position each pair sees, not the frequencies"
    if kind == "query":
        return "query scaling inside attention has no config key"
    return f"no rope type computes '{scaling.name}' frequencies"


def _scaled_types(scaling: Scaling, geo: Geometry) -> tuple[str, ...] | None:
    if geo.layer_types is None:
        return None
    return geo.scaled_types if geo.scaled_types is not None else geo.layer_types


def transformers_config(scaling: Scaling, geo: Geometry, model_config: dict | None = None) -> dict:
    """The keys of ``config.json`` to set: ``rope_parameters`` (nested per layer type where the model has them; the
    unscaled types keep the model's own) and ``max_position_embeddings`` (what the scaling covers; the trained
    context for dynamic NTK, which transformers grows from it)."""
    scaled = rope_parameters(scaling, geo)
    longest = _trained(scaling, geo) if scaling.name == "dynamic_ntk" else covered(scaling, _trained(scaling, geo))
    types = _scaled_types(scaling, geo)
    own = dict((model_config or {}).get("rope_parameters") or {})
    if scaling.name == "none" and own:  # the model as it is: its own rope (which may be scaled already)
        return {"rope_parameters": own, "max_position_embeddings": longest}
    if types is not None and scaled.get("truncate") is False:
        # _compute_yarn_parameters reads config.rope_parameters.get("truncate", True): the top level, never a layer type's
        raise Unsupported(
            "transformers reads YaRN's truncate from the top level of rope_parameters only, so a "
            "per-layer-type truncate=false would be read as true"
        )
    if types is None:
        return {"rope_parameters": {**_kept(own), **scaled}, "max_position_embeddings": longest}
    nested = {
        t: (
            {**_kept(own.get(t) or {}), **scaled}
            if t in types
            else own.get(t, {"rope_type": "default", "rope_theta": geo.base})
        )
        for t in geo.layer_types
    }
    return {"rope_parameters": nested, "max_position_embeddings": longest}


def _kept(own: dict) -> dict:
    # what a model's rope parameters say that is not the scaling (GPT-NeoX's partial rotary)
    return {k: v for k, v in own.items() if k == "partial_rotary_factor"}


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


def _served(scaling: Scaling, geo: Geometry, model_config: dict | None, engine: str) -> tuple[dict, int]:
    """(the rope parameters, the context length) a vLLM-style engine reads from the HF config it is given."""
    if scaling.name == "p_rope" and engine == "vLLM":
        return _proportional(scaling, geo, model_config), _trained(scaling, geo)
    why = _NOT_SERVED.get((scaling.name, engine)) or _NOT_SERVED.get(scaling.name)
    if why:
        raise Unsupported(why.format(engine=engine))
    try:
        config = transformers_config(scaling, geo, model_config)
    except Unsupported as err:
        raise Unsupported(str(err).replace("transformers", engine, 1)) from None
    return config["rope_parameters"], covered(scaling, _trained(scaling, geo))


def _proportional(scaling: Scaling, geo: Geometry, model_config: dict | None) -> dict:
    """vLLM's 'proportional' rope (Gemma-4's, ``rotary_embedding/gemma4_rope.py``): pairs i < rotary_dim/2 keep
    b^(-2i/head_size), the rest do not rotate -- p-RoPE when the model rotates its whole head."""
    from .frequency import p_rope_pairs

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


def _note(geo: Geometry, engine: str, scaling: Scaling | None = None) -> str | None:
    if scaling is not None and scaling.name == "dca":
        return f"not verified against {engine} {VERIFIED[engine.lower()]} (dual chunk attention runs in a GPU attention backend)"
    if geo.model_type in ENGINE_VERIFIED_MODELS:
        return None
    return f"not verified against {engine} {VERIFIED[engine.lower()]} for {geo.model_type} (checked: Llama, Qwen2)"


def vllm(scaling: Scaling, geo: Geometry, model_config: dict | None = None) -> dict:
    """``{"command": ..., "hf_overrides": ..., "env": ...}`` for ``vllm serve``."""
    if scaling.name == "dca":
        overrides, env, longest = _dca(scaling, geo, "vLLM"), {"VLLM_ATTENTION_BACKEND": "DUAL_CHUNK_FLASH_ATTN"}, None
    else:
        rope, longest = _served(scaling, geo, model_config, "vLLM")
        # vLLM's YaRN reads attention_factor itself; the table and the start-up check read max_position_embeddings
        overrides, env = {"rope_parameters": rope, "max_position_embeddings": longest}, {}
    command = ["vllm", "serve", "MODEL", "--hf-overrides", json.dumps(overrides)]
    if longest:
        command += ["--max-model-len", str(longest)]
    return {"command": _shell(command, env), "hf_overrides": overrides, "env": env, "note": _note(geo, "vLLM", scaling)}


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


def sglang(scaling: Scaling, geo: Geometry, model_config: dict | None = None) -> dict:
    """``{"command": ..., "json_model_override_args": ...}`` for ``python -m sglang.launch_server``."""
    extra = []
    if scaling.name == "dca":
        overrides, longest = _dca(scaling, geo, "SGLang"), None
        extra = ["--attention-backend", "dual_chunk_flash_attn"]
    else:
        rope, longest = _served(scaling, geo, model_config, "SGLang")
        own = dict((model_config or {}).get("rope_parameters") or {})
        if scaling.name == "none" and own:
            rope = {}  # the model's own rope, as it is
        elif "rope_type" in rope:
            rope = _sglang_rope(rope, own)
        else:
            rope = {t: _sglang_rope(entry, own.get(t) or {}) for t, entry in rope.items()}
        overrides = {**({"rope_scaling": rope} if rope else {}), "max_position_embeddings": longest}
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
    command = [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "MODEL",
        "--json-model-override-args",
        json.dumps(overrides),
        *extra,
    ]
    if longest:
        command += ["--context-length", str(longest)]
    return {
        "command": _shell(command, {}),
        "json_model_override_args": overrides,
        "note": _note(geo, "SGLang", scaling),
    }


def _dca(scaling: Scaling, geo: Geometry, engine: str) -> dict:
    from .attention_methods import dca_sizes

    if geo.model_type not in QWEN2_FAMILY:
        raise Unsupported(
            f"{engine} runs dual chunk attention on the Qwen2 family only ({', '.join(QWEN2_FAMILY)}), "
            f"not {geo.model_type}"
        )
    chunk, local = dca_sizes(scaling.params)
    return {
        "dual_chunk_attention_config": {
            "chunk_size": chunk,
            "local_size": local,
            "original_max_position_embeddings": geo.trained,
        }
    }


LLAMA_CPP_SCALING_TYPE = {"none": 0, "linear": 1, "yarn": 2}  # llama.h's LLAMA_ROPE_SCALING_TYPE_*
# transformers model_type -> llama.cpp's GGUF architecture, the prefix of its metadata keys (src/llama-arch.cpp;
# convert_hf_to_gguf.py writes Mistral and Mixtral as llama)
LLAMA_CPP_ARCH = {
    "llama": "llama",
    "mistral": "llama",
    "mixtral": "llama",
    "qwen2": "qwen2",
    "qwen2_moe": "qwen2moe",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3moe",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
    "gpt_neox": "gptneox",
    "stablelm": "stablelm",
    "starcoder2": "starcoder2",
    "olmo": "olmo",
    "olmo2": "olmo2",
    "granite": "granite",
    "smollm3": "smollm3",
}


def llama_cpp(scaling: Scaling, geo: Geometry) -> dict:
    """``{"command", "flags", "llama_cpp_python", "verified", "minimum"}``: llama-cli/llama-server flags and the
    same settings as ``llama_cpp.Llama(...)`` arguments; Unsupported (one line) where llama.cpp would not compute
    what was measured."""
    p, name = scaling.params, scaling.name
    if geo.layer_types is not None and geo.scaled_types is not None and any("sliding" in t for t in geo.scaled_types):
        raise Unsupported(
            "llama.cpp scales the global layers only (its *_swa rope settings are the GGUF's): sliding "
            "layers cannot be scaled with flags"
        )
    n_ctx = covered(scaling, _trained(scaling, geo))
    if name == "none":
        args = {"rope_scaling_type": 0}
    elif name == "linear":
        args = {"rope_scaling_type": 1, "rope_freq_scale": 1 / p["factor"]}
    elif name in ("ntk", "base"):
        base = ntk_base(geo.base, p["factor"], geo.dim) if name == "ntk" else p["base"]
        args = {"rope_scaling_type": 0, "rope_freq_base": base}
    elif name in ("yarn", "ntk_by_parts"):
        args = _llama_yarn(scaling, geo)
    elif name == "self_extend":
        raise Unsupported(
            "llama.cpp's Self-Extend (llama-cli --grp-attn-n/--grp-attn-w, not in llama-server) divides the KV "
            "cache's positions a whole window at a time as the context grows, so keys nearer than the window can "
            "be grouped: not the per-query neighbour window measured here"
        )
    elif name == "dynamic_ntk":
        raise Unsupported("llama.cpp has no dynamic NTK")
    elif name == "llama3":
        raise Unsupported(
            "llama.cpp reads Llama-3.1 scaling from the GGUF's rope_freqs tensor (set at conversion), not from flags"
        )
    elif name == "longrope":
        raise Unsupported("llama.cpp reads LongRoPE factors from the GGUF (rope_factors_long/short), not from flags")
    elif name in ("mixed", "p_rope"):
        raise Unsupported(
            f"llama.cpp takes per-pair frequency factors ('{name}') only from the GGUF's rope_freqs tensor "
            "(set at conversion), not from flags"
        )
    elif name == "logn":
        raise Unsupported("llama.cpp has no flag that scales the query by log n")
    else:
        raise Unsupported(f"llama.cpp cannot express '{scaling.label}': {_why_not(scaling)}")
    args["n_ctx"] = n_ctx
    flags = _llama_flags(args)
    return {
        "command": _shell(["llama-cli", "-m", "MODEL.gguf", *flags], {}),
        "flags": flags,
        "llama_cpp_python": args,
        "verified": VERIFIED["llama.cpp"],  # tests/test_llama_cpp.py runs it
        "minimum": MINIMUM["llama.cpp"],
    }


def _llama_yarn(scaling: Scaling, geo: Geometry) -> dict:
    """YaRN and NTK-by-parts. Since PR #17945 llama.cpp overwrites --yarn-attn-factor when YaRN is on: its kernel
    scales cos/sin by ``<arch>.rope.scaling.attn_factor * (1 + 0.1 ln s)`` (src/llama-context.cpp; ``rope_yarn`` in
    ggml), so the magnitude is set with ``--override-kv`` (llama-cpp-python: ``kv_overrides``)."""
    p = scaling.params
    if p.get("dynamic"):
        raise Unsupported("llama.cpp has no dynamic YaRN (the factor following the length)")
    if not p["truncate"]:
        raise Unsupported(
            "llama.cpp rounds YaRN's ramp ends to whole dimensions (truncate=true); this setting has truncate=false"
        )
    attention = 1.0 if scaling.name == "ntk_by_parts" else scaling.frequencies(geo.dim, geo.base)[1]
    magnitude = attention / yarn_mscale(p["factor"])  # the kernel multiplies by 1 + 0.1 ln s itself
    arch = LLAMA_CPP_ARCH.get(geo.model_type)
    if arch is None:
        raise Unsupported(
            f"llama.cpp's YaRN magnitude is set through the GGUF key <arch>.rope.scaling.attn_factor and the GGUF "
            f"architecture of model_type {geo.model_type!r} is not known here; known: {', '.join(LLAMA_CPP_ARCH)}"
        )
    unscaled = set(geo.layer_types or ()) - set(_scaled_types(scaling, geo) or ())
    if unscaled and abs(magnitude - 1) > 1e-6:
        raise Unsupported(
            f"llama.cpp applies <arch>.rope.scaling.attn_factor ({magnitude:.4g} here) to the unscaled layer "
            "types too; only YaRN's default attention factor leaves them as they are"
        )
    return {
        "rope_scaling_type": 2,
        "rope_freq_scale": 1 / p["factor"],
        "yarn_orig_ctx": _trained(scaling, geo),
        "yarn_ext_factor": 1.0,
        "yarn_beta_fast": p["beta_fast"],
        "yarn_beta_slow": p["beta_slow"],
        "kv_overrides": {f"{arch}.rope.scaling.attn_factor": magnitude},
    }


_FLAG = {
    "rope_freq_scale": "--rope-freq-scale",
    "rope_freq_base": "--rope-freq-base",
    "yarn_orig_ctx": "--yarn-orig-ctx",
    "yarn_ext_factor": "--yarn-ext-factor",
    "yarn_beta_fast": "--yarn-beta-fast",
    "yarn_beta_slow": "--yarn-beta-slow",
    "n_ctx": "-c",
}


def _llama_flags(args: dict) -> list[str]:
    kind = {v: k for k, v in LLAMA_CPP_SCALING_TYPE.items()}[args["rope_scaling_type"]]
    flags = ["--rope-scaling", kind]
    for key, flag in _FLAG.items():
        if key in args:
            flags += [flag, _number(args[key])]
    for key, value in args.get("kv_overrides", {}).items():
        flags += ["--override-kv", f"{key}=float:{_number(value)}"]
    return flags


def _number(value) -> str:
    return f"{value:.10g}" if isinstance(value, float) else str(value)


def _shell(command: list[str], env: dict) -> str:
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return (prefix + " " if prefix else "") + " ".join(shlex.quote(part) for part in command)


def export(scaling: Scaling, geo: Geometry, engine: str, model_config: dict | None = None) -> dict:
    """The settings ``engine`` needs for ``scaling`` on a model of geometry ``geo``; Unsupported (one line) where it
    cannot express them."""
    if engine == "transformers":
        return {"config": transformers_config(scaling, geo, model_config)}
    if engine == "vllm":
        return vllm(scaling, geo, model_config)
    if engine == "sglang":
        return sglang(scaling, geo, model_config)
    if engine == "llama.cpp":
        return llama_cpp(scaling, geo)
    raise ValueError(f"unknown engine {engine!r}; valid: {', '.join(ENGINES)}")
