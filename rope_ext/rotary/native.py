"""A scaling as transformers' ``config.json`` takes it: ``rope_parameters`` (``modeling_rope_utils.py``, the installed
version's ``ROPE_INIT_FUNCTIONS``: ``default`` with its ``rope_theta``, ``linear``, ``dynamic``, ``yarn``, ``llama3``,
``longrope``), per layer type where the model has layer types (Gemma-3: ``{"full_attention": {...},
"sliding_attention": {...}}``), and ``max_position_embeddings``. vLLM and SGLang read the same dict
(:mod:`rope_ext.export.servers`). The model's :class:`Geometry` that they are computed for (its rotary dim, base,
trained context and layer types), the context they serve, and the one-line :class:`Unsupported` where transformers has
no counterpart. The patcher reads these too: an attention module's build-time constants follow the strategy's
``rope_parameters`` (:mod:`rope_ext.rotary.softmax_scale`); the engines' exports build on them (:mod:`rope_ext.export`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..strategies.frequency import ntk_base
from ..strategies.scaling import Compose, Scaling


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
    unexportable: str | None = None  # why no engine config can describe the scaled rotary (:func:`unexportable`)


def geometry(model_or_config, scaling: Scaling, slots=None, trained: int | None = None, scaled=None) -> Geometry:
    """The :class:`Geometry` of a transformers model (or its config with ``slots``, and the ``scaled`` ones, as a job
    resolves and selects them): the rotary dim and base of the slots the scaling patches (Gemma-3: the global
    layers')."""
    from .find import find_rotary_slots, select_slots

    slots = list(slots if slots is not None else find_rotary_slots(model_or_config))
    if scaled is None:
        scaled = select_slots(slots, scaling.layer_types) if scaling.name != "none" else slots
    return slots_geometry(model_or_config, slots, scaled, trained)


def slots_geometry(model_or_config, slots, scaled, trained: int | None = None) -> Geometry:
    """The :class:`Geometry` of ``scaled`` among ``slots`` (every slot of the model), found and selected already (the
    patcher's); ``trained`` defaults to the config's trained context."""
    from ..strategies.shipped import trained_context

    config = getattr(model_or_config, "config", model_or_config)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = sorted({s.layer_type for s in slots if s.layer_type is not None}) or None
    scaled_types = sorted({s.layer_type for s in scaled if s.layer_type is not None}) or None
    return Geometry(
        config.model_type,
        int(trained or trained_context(config)),
        scaled[0].dim,
        float(scaled[0].base),
        tuple(types) if types else None,
        tuple(scaled_types) if scaled_types else None,
        unexportable(scaled, config),
    )


def unexportable(scaled, config) -> str | None:
    """Why an engine's config cannot describe the scaled slots (one line; None where it can): a sin/cos table
    (GPT-J, CodeGen: their rotary reads no rope_parameters), pairs held still (proportional RoPE: a
    partial_rotary_factor would rotate other pairs), or frequencies of another base than the config's rope_theta (an
    odd rotary dim: the engine recomputes over its own)."""
    parameters = getattr(config, "rope_parameters", None) or {}
    parameters = parameters if isinstance(parameters, dict) else {}
    for slot in scaled:
        own = parameters.get(slot.layer_type) if isinstance(parameters.get(slot.layer_type), dict) else parameters
        theta = own.get("rope_theta") or (None if slot.layer_type else getattr(config, "rope_theta", None))
        if slot.table:
            why = f"its rotary is a sin/cos table ({slot.table}) that reads no rope_parameters"
        elif slot.still:
            why = f"its rotary holds {slot.still} pairs still (proportional RoPE), which rope_parameters cannot say"
        elif theta and abs(float(slot.base) / float(theta) - 1) > 1e-4:  # a float32 read of the base: ~1e-6
            why = f"its frequencies have base {float(slot.base):.6g}, not the config's rope_theta {float(theta):g}"
        else:
            continue
        return f"{config.model_type}: not exported: {why}; the measured model is rope_ext's patch alone"
    return None


def covered(scaling: Scaling, trained: int) -> int:
    """The context the scaled model is set up for: trained x factor (the trained context without a factor)."""
    factor = scaling.factor or 1.0
    return round(trained * factor)


def trained_of(scaling: Scaling, geo: Geometry) -> int:
    """The trained context the scaling was resolved with (scaling.original_max_position), else the model's."""
    return int(scaling.params.get("original_max_position") or geo.trained)


def served(scaling: Scaling, geo: Geometry, context: int | None) -> int:
    """The context an engine is asked to serve: ``context`` (the length the job's verdict judged, e.g. the target),
    else what the scaling covers (:func:`covered`)."""
    return int(context) if context else covered(scaling, trained_of(scaling, geo))


def table(scaling: Scaling, geo: Geometry, context: int | None) -> int:
    """``max_position_embeddings``: at least what the scaling covers (YaRN and LongRoPE in transformers derive their
    defaults from it), at least the context served (vLLM's cos/sin table of ``default``/``llama3`` has that many
    rows; its start-up check and SGLang's read it)."""
    return max(covered(scaling, trained_of(scaling, geo)), served(scaling, geo, context))


def why_not(scaling: Scaling) -> str:
    """Why no config key expresses a strategy (one clause)."""
    kind = scaling.strategy.kind
    if isinstance(scaling, Compose):
        return "a composition of stages has no rope type"
    if kind == "attention":
        return "an attention-level method changes which relative position each pair sees, not the frequencies"
    if kind == "query":
        return "query scaling inside attention has no config key"
    return f"no rope type computes '{scaling.name}' frequencies"


def scaled_types(scaling: Scaling, geo: Geometry) -> tuple[str, ...] | None:
    if geo.layer_types is None:
        return None
    return geo.scaled_types if geo.scaled_types is not None else geo.layer_types


def rope_parameters(scaling: Scaling, geo: Geometry) -> dict:
    """The ``rope_parameters`` of one scaled layer type, as the installed transformers reads them; Unsupported where
    transformers has no rope type that computes the same frequencies."""
    p, name, L = scaling.params, scaling.name, trained_of(scaling, geo)
    factor = None  # the attention factor transformers is given: YaRN's (static), LongRoPE's past the trained context
    if name == "longrope" or (name == "yarn" and not p.get("dynamic")):
        factor = scaling.frequencies(geo.dim, geo.base, L + 1 if name == "longrope" else None)[1]
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
        attention = 1.0 if name == "ntk_by_parts" else factor
        # DeepSeek's split temperature: MLA families build their softmax scale from mscale_all_dim (rope_ext.rotary.softmax_scale)
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
            "attention_factor": factor,
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
