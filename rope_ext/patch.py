"""One generic patcher that applies a scaling strategy to any Hugging Face model with RoPE.

It works from the model object alone. A *rotary slot* is a module buffer named ``<prefix>inv_freq``
(prefix ``""``, or ``"<layer_type>_"`` for models with per-layer-type RoPE such as Gemma-3) next to an
attribute ``<prefix>attention_scaling`` -- the contract every transformers 5 rotary module follows.
The rotary dimension is read from the buffer (d = 2 * len(inv_freq), which covers partial rotary
models: GPT-NeoX ``rotary_pct``, Phi ``partial_rotary_factor``), the base from the model config.

Static strategies replace the buffer once and cost nothing per forward. Dynamic strategies
(``dynamic_ntk``, ``longrope``, dynamic ``yarn``) recompute the frequencies in a forward pre-hook
from the current length n = max(position_ids) + 1. KV-cache caveat: during generation, keys cached
at one length were rotated with that length's frequencies and are reused unchanged when later
tokens arrive with another length's frequencies (transformers issue #25104); scoring a whole
sequence in one forward, as the evals here do, is exact.

The model's own ``rope_type`` is set to ``default`` while patched, so transformers' own dynamic
update cannot overwrite ours; everything is restored exactly by :meth:`RopePatch.restore`.

Query-scaling strategies (``logn``, alone or in a ``compose``) change no frequency: the patcher attaches a
query transform to rope_ext's attention hook (:mod:`rope_ext.attention`) that multiplies the query at
each position by the strategy's factor, in the layers whose rotary slot is selected (``layer_types=auto``
on Gemma-3: the global layers); removing it restores the model's attention implementation exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch
from torch import nn

from .strategies import Scaling, ScalingError, resolve


class RotaryNotFoundError(ScalingError):
    """The model has no rotary embedding module rope_ext can patch."""


@dataclass
class RotarySlot:
    """One set of rotary frequencies in a model: module, buffer prefix, rotary dim and base."""

    module: nn.Module
    module_name: str
    prefix: str
    dim: int
    base: float
    seq_len: int | None = None  # length the current frequencies were computed for (dynamic strategies)

    @property
    def layer_type(self) -> str | None:
        return self.prefix[:-1] if self.prefix else None

    def describe(self) -> dict:
        return {"module": self.module_name, "layer_type": self.layer_type, "rotary_dim": self.dim, "base": self.base}


def _rope_parameters(module: nn.Module, model: nn.Module, layer_type: str | None) -> dict:
    config = getattr(module, "config", None) or model.config
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    params = getattr(config, "rope_parameters", None) or {}
    if layer_type is not None and isinstance(params.get(layer_type), Mapping):
        params = params[layer_type]
    return dict(params)


def _infer_base(inv_freq: torch.Tensor, module_name: str) -> float:
    # inv_freq[1] = b^(-2/d)  =>  b = inv_freq[1]^(-d/2)
    if inv_freq.is_meta or inv_freq.numel() < 2:
        raise RotaryNotFoundError(f"{module_name}: no rope_theta in the config and no frequencies to read the base from")
    dim = 2 * inv_freq.numel()
    return float(inv_freq[1].double() ** (-dim / 2))


def find_rotary_slots(model: nn.Module) -> list[RotarySlot]:
    """Every rotary slot of ``model``; raises RotaryNotFoundError naming the class when there is none.

    Works on a model built on the ``meta`` device too (shapes only, no weights): that is how the
    geometry a model will have is read before anything is loaded."""
    slots = []
    for module_name, module in model.named_modules():
        for buffer_name, buffer in module.named_buffers(recurse=False):
            if not buffer_name.endswith("inv_freq") or buffer_name.endswith(("original_inv_freq", "long_inv_freq")):
                continue
            prefix = buffer_name[: -len("inv_freq")]
            if not hasattr(module, f"{prefix}attention_scaling"):
                continue
            params = _rope_parameters(module, model, prefix[:-1] if prefix else None)
            base = params.get("rope_theta") or _infer_base(buffer, module_name)
            slots.append(RotarySlot(module, module_name, prefix, 2 * buffer.numel(), float(base)))
    if not slots:
        raise RotaryNotFoundError(
            f"{type(model).__name__} has no rotary embedding module (no `inv_freq` buffer with "
            "`attention_scaling`): rope_ext patches models that use RoPE only"
        )
    return slots


def trained_context(model_or_config) -> int:
    """The trained context from a model's config (or a config): ``original_max_position_embeddings`` (in
    the rope parameters -- any layer type's, as Gemma-3 keeps it under ``full_attention`` only -- or the
    config itself, as Phi-3 keeps it), else ``max_position_embeddings``. Models whose config bumps
    ``max_position_embeddings`` after extension need the real value passed (transformers #38224)."""
    config = getattr(model_or_config, "config", model_or_config)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    params = dict(getattr(config, "rope_parameters", None) or {})
    per_type = [v for v in params.values() if isinstance(v, Mapping)]
    entries = per_type if params and len(per_type) == len(params) else [params]
    found = [int(e["original_max_position_embeddings"]) for e in entries if e.get("original_max_position_embeddings")]
    trained = max(found) if found else getattr(config, "original_max_position_embeddings", None)
    return int(trained or config.max_position_embeddings)


def select_slots(slots: Sequence[RotarySlot], layer_types) -> list[RotarySlot]:
    """Slots to scale: all, or the named layer types; ``auto`` skips sliding-window layer types (their
    window is shorter than the trained context, so they never see a position beyond it)."""
    types = sorted({s.layer_type for s in slots if s.layer_type is not None})
    if layer_types in (None, "auto"):
        chosen = [s for s in slots if not (s.layer_type and "sliding" in s.layer_type)]
        return chosen or list(slots)
    if layer_types == "all":
        return list(slots)
    wanted = [layer_types] if isinstance(layer_types, str) else list(layer_types)
    unknown = sorted(set(wanted) - set(types))
    if unknown:
        raise ScalingError(f"layer_types {unknown} not in this model; it has {types or ['(one shared rotary)']}; or use auto/all")
    return [s for s in slots if s.layer_type in wanted]


class RopePatch:
    """A scaling strategy applied to a model; a context manager that restores the model on exit."""

    def __init__(self, model: nn.Module, scaling: "Mapping | Scaling", original_max_position: int | None = None):
        self.model = model
        if not isinstance(scaling, Scaling) or original_max_position is not None:
            scaling = resolve(scaling, original_max_position or trained_context(model))
        self.scaling = scaling
        self.slots = select_slots(find_rotary_slots(model), scaling.layer_types)
        self.name, self.dynamic = scaling.name, scaling.dynamic
        self._saved: list[tuple] = []
        self._hooks: list = []
        self.applied: list[dict] = []
        if scaling.scales_frequencies:
            self._apply()
        if scaling.scales_query:
            self._scale_queries()

    def _scale_queries(self) -> None:
        from .attention import hook_attention

        every = find_rotary_slots(self.model)
        chosen = {(id(s.module), s.prefix) for s in self.slots}
        # only the selected layers' queries (None: every layer, the model has no other slot)
        self._query_slots = None if len(chosen) == len(every) else chosen
        self._hooks.append(hook_attention(self.model, self._scale_query, transform=True))
        self.applied.append({"query_scaling": self.scaling.label,
                             "layer_types": sorted({str(s.layer_type) for s in self.slots})})

    def _scale_query(self, call):
        if self._query_slots is not None:
            slot = call.slot()
            if slot is None or (id(slot.module), slot.prefix) not in self._query_slots:
                return None
        factors = self.scaling.query_factors(call.positions)  # (batch, q_len)
        return (call.query * factors.to(call.query.device)[:, None, :, None]).to(call.query.dtype)

    def _apply(self) -> None:
        for module in {id(s.module): s.module for s in self.slots}.values():
            self._saved.append((module, None, "rope_type", getattr(module, "rope_type", None)))
            rope_type = getattr(module, "rope_type", None)
            if isinstance(rope_type, dict):
                module.rope_type = {k: "default" for k in rope_type}
            elif rope_type is not None:
                module.rope_type = "default"
            if self.dynamic:
                self._hooks.append(module.register_forward_pre_hook(self._dynamic_hook, with_kwargs=True))
        for slot in self.slots:
            buffer_name, scaling_name = f"{slot.prefix}inv_freq", f"{slot.prefix}attention_scaling"
            self._saved.append((slot.module, buffer_name, None, getattr(slot.module, buffer_name)))
            self._saved.append((slot.module, None, scaling_name, getattr(slot.module, scaling_name)))
            inv_freq, attention = self._set(slot, seq_len=None)
            self.applied.append({**slot.describe(), "attention_factor": attention, "inv_freq_min": float(inv_freq.min())})

    def _set(self, slot: RotarySlot, seq_len: int | None):
        inv_freq, attention = self.scaling.frequencies(slot.dim, slot.base, seq_len)
        old = getattr(slot.module, f"{slot.prefix}inv_freq")
        slot.module.register_buffer(f"{slot.prefix}inv_freq", inv_freq.to(old.device), persistent=False)
        setattr(slot.module, f"{slot.prefix}attention_scaling", attention)
        slot.seq_len = seq_len
        return inv_freq, attention

    def _dynamic_hook(self, module, args, kwargs):
        position_ids = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
        if position_ids is None:
            raise ScalingError(f"dynamic scaling '{self.name}': the rotary module was called without position_ids")
        seq_len = int(position_ids.max()) + 1
        for slot in self.slots:
            if slot.module is module and slot.seq_len != seq_len:
                self._set(slot, seq_len)

    def restore(self) -> None:
        """Put back the exact tensors and attributes the model had before patching."""
        for hook in self._hooks:
            hook.remove()
        for module, buffer_name, attr_name, value in reversed(self._saved):
            if buffer_name is not None:
                module.register_buffer(buffer_name, value, persistent=False)
            elif value is not None or hasattr(module, attr_name):
                setattr(module, attr_name, value)
        self._saved, self._hooks = [], []

    def __enter__(self) -> "RopePatch":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


def patch(model: nn.Module, scaling: "Mapping | Scaling", original_max_position: int | None = None) -> RopePatch:
    """Apply ``scaling`` to every selected rotary module of ``model`` now; use as ``with patch(...)``
    to restore on exit, or call ``.restore()``. A resolved :class:`Scaling` is applied as it is; a
    mapping is resolved here, its trained context defaulting to ``original_max_position`` or the config's."""
    return RopePatch(model, scaling, original_max_position)
