"""A scaling as llama.cpp takes it: ``--rope-scaling {none,linear,yarn} --rope-freq-scale --rope-freq-base b
--yarn-orig-ctx L --yarn-ext-factor --yarn-beta-fast --yarn-beta-slow -c N --override-kv KEY=float:X``
(``common/arg.cpp``), and the same as ``llama_cpp.Llama(...)`` arguments (``rope_scaling_type``, ``rope_freq_base``,
``rope_freq_scale``, ``yarn_orig_ctx``, ``yarn_ext_factor``, ``yarn_beta_fast``, ``yarn_beta_slow``, ``n_ctx``,
``kv_overrides``). With YaRN on, llama.cpp's cos/sin magnitude is ``<arch>.rope.scaling.attn_factor * (1 + 0.1 ln
s)``: the kernel (``rope_yarn`` in ggml) multiplies by ``yarn_attn_factor * (1 + 0.1 ln s)``, and since PR #17945 the
host sets ``yarn_attn_factor`` to that GGUF key's value, ignoring ``--yarn-attn-factor`` (``src/llama-context.cpp``);
the key is set with ``--override-kv``. It rounds the ramp's ends to whole dimensions (transformers' ``truncate``).
Its Self-Extend (llama-cli's ``--grp-attn-n/--grp-attn-w``, ``tools/completion``) is not the one measured here."""

from __future__ import annotations

from ..strategies.frequency import ntk_base, yarn_mscale
from ..strategies.scaling import Scaling
from ..rotary.native import Geometry, Unsupported, scaled_types, served, trained_of, why_not
from .common import MINIMUM, VERIFIED, number, shell

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


def llama_cpp(scaling: Scaling, geo: Geometry, context: int | None = None, model: str = "MODEL.gguf") -> dict:
    """``{"command", "flags", "llama_cpp_python", "context", "verified", "minimum"}``: llama-cli/llama-server flags
    and the same settings as ``llama_cpp.Llama(...)`` arguments, at ``-c`` = ``context`` (else what the scaling
    covers); Unsupported (one line) where llama.cpp would not compute what was measured."""
    p, name = scaling.params, scaling.name
    if geo.layer_types is not None and geo.scaled_types is not None and any("sliding" in t for t in geo.scaled_types):
        raise Unsupported(
            "llama.cpp scales the global layers only (its *_swa rope settings are the GGUF's): sliding "
            "layers cannot be scaled with flags"
        )
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
        raise Unsupported(f"llama.cpp cannot express '{scaling.label}': {why_not(scaling)}")
    args["n_ctx"] = served(scaling, geo, context)
    flags = _llama_flags(args)
    return {
        "command": shell(["llama-cli", "-m", model, *flags], {}),
        "flags": flags,
        "llama_cpp_python": args,
        "context": args["n_ctx"],
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
    unscaled = set(geo.layer_types or ()) - set(scaled_types(scaling, geo) or ())
    if unscaled and abs(magnitude - 1) > 1e-6:
        raise Unsupported(
            f"llama.cpp applies <arch>.rope.scaling.attn_factor ({magnitude:.4g} here) to the unscaled layer "
            "types too; only YaRN's default attention factor leaves them as they are"
        )
    return {
        "rope_scaling_type": 2,
        "rope_freq_scale": 1 / p["factor"],
        "yarn_orig_ctx": trained_of(scaling, geo),
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
            flags += [flag, number(args[key])]
    for key, value in args.get("kv_overrides", {}).items():
        flags += ["--override-kv", f"{key}=float:{number(value)}"]
    return flags
