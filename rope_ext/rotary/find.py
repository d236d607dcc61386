"""Where a model keeps its rotary frequencies: *rotary slots*, found from the model object alone.

A slot is a module buffer named ``<prefix>inv_freq`` (prefix ``""``, or ``"<layer_type>_"`` for models with
per-layer-type RoPE such as Gemma-3) next to an attribute ``<prefix>attention_scaling`` -- the contract every
transformers 5 rotary module follows. The rotary dimension is read from the buffer (d = 2 * len(inv_freq),
which covers partial rotary models: GPT-NeoX ``rotary_pct``, Phi ``partial_rotary_factor``), the base from
the model config. Pairs the buffer holds at frequency exactly zero do not rotate (transformers' ``proportional`` RoPE:
Gemma-4, LFM3's full-attention layers; p-RoPE): a slot's dim and base are those of its rotating pairs, its ``still``
pairs stay zero under every strategy (:func:`held_geometry`). A :class:`RotarySlot` is a description (module name,
prefix, dim, base), so slots found
on a ``meta``-device instance -- shapes only, no weights -- name the same places in the loaded model: a
harness finds and selects them once, before anything loads, and hands them to the patcher.

A rotary that holds a sin/cos table instead (GPT-J, CodeGen) is a *table slot*: ``table`` names its buffer, ``rows``
its length, the base and frequencies are read from the values (:mod:`rope_ext.rotary.tables`; on ``meta``, from the values
the model's own initialiser writes into a CPU copy of the module, as loading does).

The patcher's first stage after resolving the strategy is this module's: it finds and selects the slots; what each live
slot holds is then read once (:func:`read_held`), and the stages after it compute, write and verify
from that data.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Mapping, Sequence

from ..strategies.registry import ScalingError
from ..strategies.rope import default_inv_freq
from .output import call_rotary, expected_mismatch
from .slot import Held, RotaryNotFoundError, RotarySlot
from .tables import held_frequencies, layout, own_base, read_table, table_base, table_shaped, tolerance

if TYPE_CHECKING:
    from torch import nn
    import torch


def _rope_parameters(module: nn.Module, model: nn.Module, layer_type: str | None) -> dict:
    config = getattr(module, "config", None) or model.config
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    params = getattr(config, "rope_parameters", None) or {}
    if layer_type is not None and isinstance(params.get(layer_type), Mapping):
        params = params[layer_type]
    return dict(params)


def loaded_copy(model: nn.Module, module: nn.Module) -> nn.Module | None:
    """A CPU copy of a ``meta``-device ``module`` (no parameters of its own: a rotary) holding the values loading
    gives its buffers: transformers 5 fills the non-persistent buffers no checkpoint holds with the model's own
    ``_init_weights`` (``PreTrainedModel._init_weights``), run here on the copy, every float buffer NaN before (one it
    does not write stays NaN); None where the initialiser cannot run on the module alone."""
    import copy
    import math

    import torch

    init = getattr(model, "_init_weights", None)
    if not callable(init) or next(module.parameters(), None) is not None:
        return None
    loaded = copy.deepcopy(module).to_empty(device="cpu")
    for tensor in loaded.buffers():
        if tensor.is_floating_point():
            tensor.fill_(math.nan)
    try:
        with torch.no_grad():
            init(loaded)
    except Exception:  # its values are not known before loading
        return None
    return loaded


def _infer_base(inv_freq: torch.Tensor, module_name: str) -> float:
    # inv_freq[1] = b^(-2/d)  =>  b = inv_freq[1]^(-d/2)
    if inv_freq.is_meta or inv_freq.numel() < 2:
        raise RotaryNotFoundError(
            f"{module_name}: no rope_theta in the config and no frequencies to read the base from"
        )
    dim = 2 * inv_freq.numel()
    return float(inv_freq[1].double() ** (-dim / 2))


def as_loaded(model: nn.Module, module: nn.Module, name: str) -> nn.Module | None:
    """The ``meta``-device ``module`` as loading will give it (:func:`loaded_copy`), or None where
    ``name`` cannot be a table rotary's: not of a table's shape, in a module with parameters, or a forward on ``meta``
    at three positions that does not return two tensors of d/2 columns."""
    import torch

    buffer = getattr(module, name)
    if not table_shaped(buffer) or next(module.parameters(), None) is not None:
        return None
    x = torch.zeros(1, 3, 1, device="meta")
    try:
        with torch.no_grad():
            out = module(x, torch.zeros(1, 3, dtype=torch.int64, device="meta"))
    except Exception:  # called otherwise: not a rotary this reads
        return None
    if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(torch.is_tensor(t) for t in out)):
        return None
    if any(t.shape[-1] != buffer.shape[1] // 2 for t in out):
        return None
    return loaded_copy(model, module)


def find_table_slots(model: nn.Module) -> list[RotarySlot]:
    """Every table slot of ``model``: a buffer that is a RoPE table and that its module's forward returns at the
    position ids it is called with (on the ``meta`` device: read from the values loading gives it, :func:`as_loaded`)."""
    import torch

    slots = []
    for module_name, module in model.named_modules():
        for name, buffer in module.named_buffers(recurse=False):
            source = as_loaded(model, module, name) if buffer.is_meta else module
            if source is None or layout(buffer := getattr(source, name)) is None:
                continue
            base = table_base(buffer)  # NaN: not RoPE's form (a table patched already): found, not scaled again
            base = math.nan if base is None else base
            theta, a = read_table(buffer)  # what the slot holds (rope_ext.rotary.tables.held_frequencies)
            near = tolerance(buffer, 1e-4, a)  # float32: 1e-4; a half-precision table: its rounding
            slot = RotarySlot(module_name, "", int(buffer.shape[1]), base, table=name, rows=int(buffer.shape[0]))
            positions = torch.tensor([[0, 1, buffer.shape[0] - 1]])
            out = call_rotary(source, slot, positions)
            theta = theta.float()
            if out is not None and any(
                expected_mismatch(out, theta, a, positions, sin_first) <= near for sin_first in (0, 1)
            ):
                slots.append(slot)
    return slots


def find_rotary_slots(model: nn.Module) -> list[RotarySlot]:
    """Every rotary slot of ``model``; raises RotaryNotFoundError naming the class when there is none. Works on
    a model built on the ``meta`` device too: that is how the geometry a model will have is read before it loads.
    Args: ``model`` a transformers model. Returns a list of :class:`RotarySlot`, one per frequency buffer or table.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
    ...     num_key_value_heads=1, vocab_size=64, max_position_embeddings=64)
    >>> model = LlamaForCausalLM(config).eval()
    >>> [(s.module_name, s.dim, s.base) for s in find_rotary_slots(model)]
    [('model.rotary_emb', 16, 10000.0)]
    """
    slots, loaded = [], {}
    for module_name, module in model.named_modules():
        for buffer_name, buffer in module.named_buffers(recurse=False):
            if not buffer_name.endswith("inv_freq") or buffer_name.endswith(("original_inv_freq", "long_inv_freq")):
                continue
            prefix = buffer_name[: -len("inv_freq")]
            if not hasattr(module, f"{prefix}attention_scaling"):
                continue
            params = _rope_parameters(module, model, prefix[:-1] if prefix else None)
            base = params.get("rope_theta") or _infer_base(buffer, module_name)
            values = buffer
            if buffer.is_meta:  # the values loading gives it (one copy per module)
                if module_name not in loaded:
                    loaded[module_name] = loaded_copy(model, module)
                values = getattr(loaded[module_name], buffer_name, None)
            dim, base, still = held_geometry(values, float(base), buffer.numel())
            slots.append(RotarySlot(module_name, prefix, dim, base, still=still))
    slots += find_table_slots(model)
    if not slots:
        raise RotaryNotFoundError(
            f"{type(model).__name__} has no rotary embedding module (no `inv_freq` buffer with "
            "`attention_scaling`, no sin/cos table its rotary indexes): rope_ext patches models that use RoPE only"
        )
    return slots


def select_slots(slots: Sequence[RotarySlot], layer_types) -> list[RotarySlot]:
    """Slots to scale: all, or the named layer types; ``auto`` skips sliding-window layer types (their
    window is shorter than the trained context, so they never see a position beyond it). Args: ``slots`` from
    :func:`find_rotary_slots`, ``layer_types`` None, ``auto``, ``all``, a name or a list of names. Returns a list
    (every slot where ``auto`` would leave none). Raises ScalingError (one line) for a layer type the model lacks.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
    ...     num_key_value_heads=1, vocab_size=64, max_position_embeddings=64)
    >>> model = LlamaForCausalLM(config).eval()
    >>> slots = find_rotary_slots(model)
    >>> select_slots(slots, "auto") == slots
    True
    >>> select_slots(slots, ["sliding_attention"])
    Traceback (most recent call last):
    ...
    rope_ext.strategies.registry.ScalingError: layer_types ['sliding_attention'] not in this model; ...
    """
    types = sorted({s.layer_type for s in slots if s.layer_type is not None})
    if layer_types in (None, "auto"):
        chosen = [s for s in slots if not (s.layer_type and "sliding" in s.layer_type)]
        return chosen or list(slots)
    if layer_types == "all":
        return list(slots)
    wanted = [layer_types] if isinstance(layer_types, str) else list(layer_types)
    unknown = sorted(set(wanted) - set(types))
    if unknown:
        raise ScalingError(
            f"layer_types {unknown} not in this model; it has {types or ['(one shared rotary)']}; or use auto/all"
        )
    return [s for s in slots if s.layer_type in wanted]


def held_base(inv_freq: torch.Tensor | None, base: float) -> float:
    """The base of the frequencies a slot holds, given the config's ``base``: itself, except where they are
    transformers' RoPE for an odd rotary dim d' (``int(head_dim * partial_rotary_factor)``: MiMo-V2-Flash's 0.334 of
    a 16-wide head is 5), theta_i = b^(-2i/d') for i < n = (d'+1)/2 -- RoPE of dim d = 2n at the base b^(d/d'), which
    is the slot's base then, so every strategy starts from the frequencies the model holds, not b^(-2i/d)."""
    import torch

    if inv_freq is None or inv_freq.is_meta or inv_freq.numel() < 2:
        return base
    held, pairs = inv_freq.detach().float().cpu(), inv_freq.numel()
    if torch.allclose(held, default_inv_freq(2 * pairs, base), rtol=1e-5, atol=0):
        return base
    if torch.allclose(held, default_inv_freq(2 * pairs - 1, base), rtol=1e-5, atol=0):
        return base ** (2 * pairs / (2 * pairs - 1))  # theta_i = b^(-2i/d') = (b^(d/d'))^(-2i/d)
    return base


def held_geometry(inv_freq: torch.Tensor | None, base: float, pairs: int | None = None) -> tuple[int, float, int]:
    """(dim, base, still) of the frequencies a slot holds, given the config's ``base``: pairs held at exactly zero do
    not rotate (transformers' ``proportional`` RoPE, ``modeling_rope_utils._compute_proportional_rope_parameters``:
    theta_i = b^(-2i/D) for the first a = int(partial_rotary_factor * D/2) of D/2 pairs, D the head dim, 0 for the
    rest). The a rotating pairs are RoPE of dim 2a at the base b^(2a/D) -- the same wavelengths, so a strategy that
    works by wavelength (YaRN's ramp, Llama-3's bands) sees the true ones -- and the still ones are appended back
    unchanged by the patcher. D is read from the values (the head's 2n, an odd 2n - 1 as in :func:`held_base`, or
    the rotating 2a); frequencies of no such form (a shipped factor) are rebuilt from rope_theta over the head, D = 2n,
    as transformers' proportional RoPE is. Without zeros: (2n, :func:`held_base`, 0); without values: (2 * pairs,
    base, 0)."""
    import torch

    if inv_freq is None or inv_freq.is_meta or inv_freq.numel() < 2:
        return 2 * (pairs if pairs is not None else 0 if inv_freq is None else inv_freq.numel()), base, 0
    held = inv_freq.detach().float().cpu()
    pairs = held.numel()
    rotating = held[held != 0]
    a = rotating.numel()
    if a == pairs:
        return 2 * pairs, held_base(held, base), 0
    for full in (2 * pairs, 2 * pairs - 1, 2 * a, 2 * a - 1):
        if full >= 2 and torch.allclose(rotating, default_inv_freq(full, base)[:a], rtol=1e-5, atol=0):
            return 2 * a, base ** (2 * a / full), pairs - a  # b^(-2i/D) = (b^(2a/D))^(-2i/(2a))
    return 2 * a, base ** (a / pairs), pairs - a  # rebuilt from rope_theta over the head: b^(-2i/(2n)), i < a


def read_held(module: nn.Module, slot: RotarySlot, label: str) -> Held:
    """What ``slot`` holds in the live ``module`` now, read once when a patch begins (a
    :class:`rope_ext.rotary.slot.Held`): its dim, base and still pairs from the buffer, not from the slot (found on
    ``meta``, the initialiser may not have run: a config's base, not an odd dim's b^(d/d')) -- frequencies' as
    :func:`held_geometry` reads them, a table's base from its values (:func:`rope_ext.rotary.tables.own_base`, a
    one-line ScalingError naming ``label`` where it is none) -- and its frequencies and attention factor
    (:func:`rope_ext.rotary.tables.held_frequencies`). A buffer with no values here is a one-line ScalingError."""
    if not slot.table:
        buffer = getattr(module, slot.buffer)
        if buffer.is_meta:
            raise ScalingError(
                f"{slot.module_name}: its {slot.buffer} holds no values here (meta device, or offloaded)"
            )
        still = (buffer == 0).cpu()
        dim, base, _ = held_geometry(buffer, slot.base)
        if bool(still.any()) and slot.still == int(still.sum()):  # found with values: the slot's (no fixpoint else)
            dim, base = slot.dim, slot.base
    inv_freq, attention = held_frequencies(module, slot)
    if slot.table:
        return Held(slot.dim, own_base(slot, getattr(module, slot.table), label), None, inv_freq, attention)
    return Held(dim, base, still if bool(still.any()) else None, inv_freq, attention)
