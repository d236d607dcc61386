"""What a model's attention modules take from the rope parameters when they are built: the softmax scale of
multi-head latent attention (MLA).

YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language Models", section 3.4) multiplies
the attention logits by 1/t, sqrt(1/t) = 0.1 ln(s) + 1. DeepSeek-V2 (DeepSeek-AI 2024, "DeepSeek-V2", section 2.1.3
and its released modeling code) splits that temperature in two: ``mscale`` on the rotary's cos/sin and
``mscale_all_dim`` on the softmax scale of every dimension, the rotary's part nope-free. transformers computes the
second at BUILD time in the attention module, not in the rotary: ``self.scaling = yarn_apply_mscale(
config.rope_parameters, qk_head_dim ** -0.5)``, i.e. x yarn_get_mscale(factor, mscale_all_dim)^2 whenever the rope
type is not ``default`` and ``mscale_all_dim`` is set (DeepSeek-V2/V3/V3.2, GLM-4-MoE-Lite, LongCat-Flash, MiniCPM3,
Mistral-4, ... every modeling file with ``mscale_all_dim``). Real DeepSeek-V3 ships YaRN x40 with ``mscale_all_dim``
1: its softmax scale is x1.874 (0.1 ln 40 + 1 = 1.369, squared).

A patch that changes only the rotary would leave that constant at the shipped value. The rule here (applied by the
patcher, :mod:`rope_ext.patch`, for every strategy that changes the frequencies): the attention modules get what
transformers would build for the strategy --

- the strategy's own ``rope_parameters`` where transformers has them (:func:`rope_ext.rotary.native.
  rope_parameters`: YaRN with the ``mscale``/``mscale_all_dim`` it declares or inherits, linear, dynamic NTK, ...),
  so a patched model equals the model natively configured so;
- the model's **unscaled** RoPE (``rope_type: default`` at its ``rope_theta``) for a strategy transformers has no
  counterpart for: the strategy replaces the shipped scaling, the softmax scale included.

Strategies that change no frequency (``none``, query scaling, attention-level methods) keep the rotary as shipped,
so they keep the shipped softmax scale too: ``none`` is the model as shipped (as its export says).

How, generically (no per-model code): every module that has a ``config`` and a ``layer_idx`` (transformers' attention
modules) is built again on the ``meta`` device -- nothing allocated -- from a copy of its config, once with the
model's own rope parameters and once with the strategy's; a plain float attribute (``scaling``, ...) that the first
build reproduces from the live module and the second changes is set on the live module for the patch and restored
exactly. Builds are cached per (class, layer, config, parameters), so a sweep pays once per strategy. A module whose
constructor takes other arguments is not rebuilt (its constants are left as they are). Attention-level methods read
the softmax scale from the ``scaling`` argument the module passes (:mod:`rope_ext.attention.hook`), so they follow it.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

    from ..strategies.scaling import Scaling


def target_parameters(model: nn.Module, scaling: Scaling, slots, every) -> dict | None:
    """The ``rope_parameters`` transformers would build the model's attention from for ``scaling`` applied to
    ``slots`` of ``every`` slot of the model (found once, by the caller: the layer types the model has), the model's
    unscaled RoPE where transformers has no counterpart; None where it reads none (no ``rope_parameters``)."""
    from ..strategies.scaling import resolve
    from .native import Unsupported, slots_geometry, transformers_config

    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    own = getattr(config, "rope_parameters", None)
    if not isinstance(own, dict) or not own:
        return None
    geo = slots_geometry(config, every, slots)
    try:
        return transformers_config(scaling, geo, {"rope_parameters": own})["rope_parameters"]
    except Unsupported:  # no native counterpart: the model's unscaled RoPE
        plain = resolve({"name": "base", "base": geo.base, "layer_types": scaling.layer_types}, geo.trained)
        return transformers_config(plain, geo, {"rope_parameters": own})["rope_parameters"]


def _floats(module) -> dict:
    return {k: v for k, v in vars(module).items() if isinstance(v, float) and not k.startswith("_")}


_BUILT: dict[tuple, dict | None] = {}  # (class, layer, config, parameters) -> its float attributes


def _built(module, parameters: dict) -> dict | None:
    """The float attributes of ``module``'s class built on meta from a copy of its config with these rope
    parameters (None: its constructor takes other arguments); cached."""
    import torch

    config = module.config
    key = (
        type(module),
        module.layer_idx,
        hashlib.sha1(config.to_json_string(use_diff=False).encode()).hexdigest(),  # a sweep keeps no config copies
        json.dumps(parameters, sort_keys=True, default=str),
    )
    if key not in _BUILT:
        config = copy.deepcopy(config)
        config.rope_parameters = copy.deepcopy(parameters)
        try:
            with torch.device("meta"):
                _BUILT[key] = _floats(type(module)(config, module.layer_idx))
        except Exception:
            _BUILT[key] = None
    return _BUILT[key]


def native_changes(model: nn.Module, scaling: Scaling, slots, rotary_modules=(), *, every) -> list[tuple]:
    """(module, attribute, live value, value for ``scaling``) of every build-time float the strategy changes, applied
    to ``slots`` of ``every`` slot of the model (:func:`target_parameters`)."""
    if not scaling.scales_frequencies:
        return []
    target = target_parameters(model, scaling, slots, every)
    if target is None:
        return []
    target_json = json.dumps(target, sort_keys=True, default=str)
    skip = {id(m) for m in rotary_modules}
    changes = []
    for name, module in model.named_modules():
        config, layer = getattr(module, "config", None), getattr(module, "layer_idx", None)
        if id(module) in skip or not isinstance(layer, int) or not hasattr(config, "to_json_string"):
            continue
        live = _floats(module)
        if not live:
            continue
        own = getattr(config, "rope_parameters", None)
        if not isinstance(own, dict) or json.dumps(own, sort_keys=True, default=str) == target_json:
            continue
        built_own, built_new = _built(module, own), _built(module, target)
        if built_own is None or built_new is None:
            continue
        for attr, value in live.items():
            if attr in built_own and built_own[attr] == value and built_new.get(attr, value) != value:
                changes.append((module, attr, value, built_new[attr]))
    return changes


def describe(changes: list[tuple]) -> str | None:
    """One line: what the patch set on the attention modules (None: nothing)."""
    if not changes:
        return None
    said = sorted({(type(m).__name__, a, v, new) for m, a, v, new in changes}, key=str)
    parts = [f"{cls}.{attr} {old:.6g} -> {new:.6g} (x{new / old:.4g})" for cls, attr, old, new in said]
    layers = len({id(m) for m, *_ in changes})
    return f"the attention's build-time constants follow the strategy's rope parameters in {layers} layers: " + (
        ", ".join(parts)
    )
