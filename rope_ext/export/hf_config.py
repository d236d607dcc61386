"""A scaling as transformers' ``config.json`` takes it: ``rope_parameters`` (``modeling_rope_utils.py``, the installed
version's ``ROPE_INIT_FUNCTIONS``: ``default`` with its ``rope_theta``, ``linear``, ``dynamic``, ``yarn``, ``llama3``,
``longrope``), per layer type where the model has layer types (Gemma-3: ``{"full_attention": {...},
"sliding_attention": {...}}``), and ``max_position_embeddings``. vLLM and SGLang read the same dict
(:mod:`rope_ext.export.servers`)."""

from __future__ import annotations

from ..frequency import ntk_base
from ..scaling import Scaling
from .common import Geometry, Unsupported, scaled_types, table, trained_of, why_not


def rope_parameters(scaling: Scaling, geo: Geometry) -> dict:
    """The ``rope_parameters`` of one scaled layer type, as the installed transformers reads them; Unsupported where
    transformers has no rope type that computes the same frequencies."""
    p, name, L = scaling.params, scaling.name, trained_of(scaling, geo)
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
        # DeepSeek's split temperature: MLA families build their softmax scale from mscale_all_dim (rope_ext.softmax_scale)
        deepseek = {k: p[k] for k in ("mscale", "mscale_all_dim") if p.get(k)}
        return {
            **deepseek,
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
    raise Unsupported(f"transformers cannot express '{scaling.label}': {why_not(scaling)}")


def transformers_config(
    scaling: Scaling, geo: Geometry, model_config: dict | None = None, context: int | None = None
) -> dict:
    """The keys of ``config.json`` to set: ``rope_parameters`` (nested per layer type where the model has them; the
    unscaled types keep the model's own) and ``max_position_embeddings`` (the context served, ``context`` or what
    the scaling covers, and at least the latter; the trained context for dynamic NTK, which transformers grows
    from it: its context has no limit)."""
    scaled = rope_parameters(scaling, geo)
    longest = trained_of(scaling, geo) if scaling.name == "dynamic_ntk" else table(scaling, geo, context)
    types = scaled_types(scaling, geo)
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
