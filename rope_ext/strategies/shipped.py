"""Models that ship a scaling: one rule for what a requested strategy keeps of it; the context they were trained for.

A checkpoint may ship rope parameters of its own (Llama-3.1 ``llama3`` x8, gpt-oss YaRN with ``truncate: false``,
Ministral-3 / DeepSeek YaRN with ``mscale``/``mscale_all_dim``, Phi-3 LongRoPE). The rule, applied wherever a
scaling is resolved for a model (the patcher given a mapping, the harness's job -- so the verdict's reference and
the export use the same value):

- the **same-named** strategy inherits every shipped parameter it declares and the request leaves unset or at its
  registered default (a Hydra config always carries the defaults) (``truncate``,
  ``mscale``, ``mscale_all_dim``, ``beta_fast``/``beta_slow``, ``low_freq_factor``/``high_freq_factor``, LongRoPE's
  factor lists), so ``yarn`` on gpt-oss is gpt-oss's YaRN at the requested factor; ``factor`` is always the request's;
- **another** strategy replaces the shipped one (its frequencies are rebuilt from ``rope_theta``); where the shipped
  RoPE holds frequency 0 for the pairs it does not rotate (transformers' ``proportional``: Gemma-4, LFM3's
  full-attention layers), the strategy scales the rotating pairs only and the others stay still (the patcher's rule,
  :mod:`rope_ext.patch`), and the line says so;
- either way, a model whose attention modules build a constant from the rope parameters (DeepSeek's MLA: the
  softmax scale x mscale(factor, mscale_all_dim)^2) gets the one transformers builds for the strategy's parameters,
  the unscaled one where transformers has no counterpart (:mod:`rope_ext.rotary.softmax_scale`; the patch's line says so);
  ``none`` and the strategies that change no frequency keep the model as shipped, that constant included;
- the trained context is the shipped ``original_max_position_embeddings`` wherever the family keeps it (in the rope
  parameters: DeepSeek, Llama-3.1; at the top level: Phi-3) -- :func:`trained_context`.

:func:`inherit_shipped` returns the setting and one line saying which of these happened.
"""

from __future__ import annotations

from typing import Mapping

from .registry import STRATEGIES, resolve_name

# transformers' rope_type -> the rope_ext strategy of the same method
SAME = {"linear": "linear", "dynamic": "dynamic_ntk", "yarn": "yarn", "llama3": "llama3", "longrope": "longrope"}
# transformers' rope_types that hold frequency 0 for the pairs they do not rotate (modeling_rope_utils.py
# _compute_proportional_rope_parameters: the pairs past int(partial_rotary_factor * head_dim / 2))
STILL_PAIRS = {"proportional"}
NEVER_INHERITED = {"factor", "original_max_position", "dynamic"}  # the request's own, or the trained context's


def shipped_parameters(config, layer_types=None) -> dict:
    """The rope parameters a model ships with a scaling (``rope_type`` not ``default``): the first scaled layer
    type's where they are nested per layer type (sliding layer types last); {} for plain RoPE. Args: ``config`` a
    transformers config (or a model), ``layer_types`` the scaling's (None, ``auto``, ``all``: any). Returns a dict.
    Raises nothing of its own.

    >>> from transformers import LlamaConfig
    >>> shipped = LlamaConfig(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0})
    >>> shipped_parameters(shipped)["rope_type"], shipped_parameters(LlamaConfig())
    ('yarn', {})
    """
    text = getattr(config, "config", config)
    text = text.get_text_config() if hasattr(text, "get_text_config") else text
    params = dict(getattr(text, "rope_parameters", None) or {})
    if params and all(isinstance(v, Mapping) for v in params.values()):
        order = sorted(params, key=lambda t: "sliding" in t)
        entries = [dict(params[t]) for t in order if layer_types in (None, "auto", "all") or t in layer_types]
    else:
        entries = [params]
    for entry in entries:
        if (entry.get("rope_type") or entry.get("type") or "default") != "default":
            return entry
    return {}


def inherit_shipped(setting: Mapping, config) -> tuple[dict, str | None]:
    """(``setting`` with what it inherits from the model's shipped scaling, one line saying what the rule did or
    None when the model ships none). Args: ``setting`` a scaling mapping (``name`` and parameters), ``config`` the
    model's config. The same strategy inherits the shipped parameters the request leaves at their defaults (never
    ``factor``, the trained context or ``dynamic``); another frequency strategy replaces the shipped one. Returns a
    new dict and a str or None. Raises nothing of its own (an unknown name is left for :func:`resolve` to refuse).

    >>> from transformers import LlamaConfig
    >>> shipped = LlamaConfig(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
    ...     "beta_fast": 16.0})
    >>> inherit_shipped({"name": "yarn", "factor": 8}, shipped)
    ({'name': 'yarn', 'factor': 8, 'beta_fast': 16.0}, "yarn inherits the shipped yarn x4's beta_fast=16.0")
    >>> inherit_shipped({"name": "yarn", "factor": 8}, LlamaConfig())
    ({'name': 'yarn', 'factor': 8}, None)
    """
    setting = dict(setting)
    shipped = shipped_parameters(config, setting.get("layer_types"))
    if not shipped or not setting.get("name"):
        return setting, None
    kind = shipped.get("rope_type") or shipped.get("type")
    label = f"{kind}" + (f" x{shipped['factor']:g}" if isinstance(shipped.get("factor"), (int, float)) else "")
    try:
        name = resolve_name(str(setting["name"]))
    except Exception:  # an unknown name: resolve() says so, in one line
        return setting, None
    if SAME.get(kind) != name:
        if name == "none" or STRATEGIES[name].kind != "frequencies":
            return setting, None
        if kind in STILL_PAIRS:
            fraction = shipped.get("partial_rotary_factor", 1.0)
            return setting, (
                f"{name} scales the rotating pairs of the shipped {label} RoPE (partial_rotary_factor {fraction:g}: "
                "the other pairs hold frequency 0 and stay still; the rotating ones rebuilt from rope_theta)"
            )
        return setting, f"{name} replaces the shipped {label} scaling (its frequencies are rebuilt from rope_theta)"
    declared = set(STRATEGIES[name].params) - NEVER_INHERITED
    params = STRATEGIES[name].params
    unset = {k for k in declared if setting.get(k) is None or setting.get(k) == params[k].default}
    # only what differs from what the request would get anyway (its value, else the registered default)
    asked = {k: params[k].default if setting.get(k) is None else setting[k] for k in unset}
    kept = {k: shipped[k] for k in sorted(unset) if shipped.get(k) is not None and shipped[k] != asked[k]}
    setting.update(kept)
    said = ", ".join(f"{k}={v}" if not isinstance(v, list) else f"{k} ({len(v)} values)" for k, v in kept.items())
    return setting, f"{name} inherits the shipped {label}'s " + (said or "parameters: none differ from the request")


def trained_context(model_or_config) -> int:
    """The trained context from a model's config (or a config): ``original_max_position_embeddings`` (in
    the rope parameters -- any layer type's, as Gemma-3 keeps it under ``full_attention`` only -- or the
    config itself, as Phi-3 keeps it), else ``max_position_embeddings``. Models whose config bumps
    ``max_position_embeddings`` after extension need the real value passed (transformers #38224). Returns an int;
    raises AttributeError where the config has no ``max_position_embeddings``.

    >>> from transformers import LlamaConfig
    >>> trained_context(LlamaConfig(max_position_embeddings=2048))
    2048
    """
    config = getattr(model_or_config, "config", model_or_config)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    params = dict(getattr(config, "rope_parameters", None) or {})
    per_type = [v for v in params.values() if isinstance(v, Mapping)]
    entries = per_type if params and len(per_type) == len(params) else [params]
    found = [int(e["original_max_position_embeddings"]) for e in entries if e.get("original_max_position_embeddings")]
    trained = max(found) if found else getattr(config, "original_max_position_embeddings", None)
    return int(trained or config.max_position_embeddings)
