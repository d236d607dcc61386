"""Whether a model's output depends on the rotary slots a patch scales: no silent patch where no layer uses them.

The patcher proves that each patched rotary module outputs the patched frequencies (:mod:`rope_ext.rotary.output`),
but a model may not read that output at all: a hybrid whose config has only linear-attention or NoPE layers (a
Qwen3-Next or Falcon-H1-style model cut to a few layers), a key temperature of zero, a rotary slot of a layer type
no layer has. Every strategy then changes nothing, and nothing would be said.

:func:`require_in_use` runs two forwards of a few distinct tokens: the model as it is, and with the targeted rotary
modules' outputs halved by a forward hook (for a typed slot only the calls for its layer type). Halving cos and sin
halves the rotated queries and keys, so every attention layer that reads them changes its scores, and the logits
change. Equal logits (bit-identical) mean no layer reads what the patch changed: a :class:`SilentPatchError` naming
the modules. The patcher runs it for the strategies that act through the rotary (frequency and attention-level
ones); query scaling acts on the query itself -- in NoPE layers too, as Llama-4's temperature tuning -- and is checked
by the attention hook's reach (:mod:`rope_ext.check`). A model whose short forward cannot run here (multimodal inputs, the meta device) or a table rotary
(:mod:`rope_ext.rotary.tables`: read by the attention that holds it) is not probed.
"""

from __future__ import annotations

import inspect
import weakref
from typing import TYPE_CHECKING, Sequence

from .output import SilentPatchError

if TYPE_CHECKING:
    from torch import nn

    from .slot import RotarySlot

PROBE_TOKENS = 6


def _halved(output):
    import torch

    if torch.is_tensor(output) and (output.is_floating_point() or output.is_complex()):
        return output * 0.5
    if isinstance(output, (tuple, list)):
        return type(output)(_halved(t) for t in output)
    return output


def _layer_type_of(module: nn.Module, args: tuple, kwargs: dict):
    """The layer type a rotary call is for (Gemma-3-style ``forward(x, position_ids, layer_type)``), or None."""
    if "layer_type" in kwargs:
        return kwargs["layer_type"]
    names = list(inspect.signature(module.forward).parameters)
    if "layer_type" in names and names.index("layer_type") < len(args):
        return args[names.index("layer_type")]
    return None


def _logits(model: nn.Module, ids):
    import torch

    with torch.no_grad():
        out = model(input_ids=ids, use_cache=False)
    logits = getattr(out, "logits", out[0] if isinstance(out, (tuple, list)) else out)
    return logits.detach().clone()


def in_use(model: nn.Module, slots: Sequence[RotarySlot]) -> bool | None:
    """Whether ``model``'s logits depend on the outputs of ``slots`` (their rotary modules' calls for the slots'
    layer types); None where that cannot be seen (no slot to probe, meta device, a forward that fails)."""
    import torch

    probed = [s for s in slots if not s.table]
    parameter = next(model.parameters(), None)
    if not probed or parameter is None or parameter.is_meta:
        return None
    by_module: dict[str, set] = {}
    for slot in probed:
        by_module.setdefault(slot.module_name, set()).add(slot.layer_type)
    vocab = (
        int(getattr(model.get_input_embeddings(), "num_embeddings", 0) or 0)
        if hasattr(model, "get_input_embeddings")
        else 0
    )
    if vocab < 2:
        return None
    # distinct tokens: with one token repeated every value vector is the same and attention's output is too
    ids = (torch.arange(PROBE_TOKENS, device=parameter.device) * 7919 % (vocab - 1) + 1).unsqueeze(0)
    try:
        plain = _logits(model, ids)
    except Exception:  # a model that needs other inputs (images, token types): not probed here
        return None
    handles = []
    for name, types in by_module.items():
        module = model.get_submodule(name)

        def halve(module, args, kwargs, output, types=types):
            if None in types or _layer_type_of(module, args, kwargs) in types:
                return _halved(output)
            return output

        handles.append(module.register_forward_hook(halve, with_kwargs=True))
    try:
        halved = _logits(model, ids)
    except Exception:
        return None
    finally:
        for handle in handles:
            handle.remove()
    return not torch.equal(plain, halved)


_SEEN: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()


def _weights_state(model: nn.Module) -> tuple:
    """Changes whenever a parameter is replaced or written in place (its version counter), so that a cached answer
    is for these very weights."""
    return tuple((id(p), p._version) for p in model.parameters())


def require_in_use(model: nn.Module, slots: Sequence[RotarySlot], label: str) -> None:
    """Raise a SilentPatchError (one line) when no layer of ``model`` reads what scaling ``label`` patched. The answer
    is kept per model, slot set and weights (a sweep patches one model many times: probed once)."""
    key = (frozenset((s.module_name, s.prefix) for s in slots), _weights_state(model))
    seen = _SEEN.setdefault(model, {})
    if key not in seen:
        if len(seen) >= 8:  # weights written again and again (a training loop): keep the latest answers only
            seen.clear()
        seen[key] = in_use(model, slots)
    if seen[key] is not False:
        return
    modules = sorted({s.module_name for s in slots})
    types = sorted({str(s.layer_type) for s in slots if s.layer_type is not None})
    which = f" (layer types {', '.join(types)})" if types else ""
    raise SilentPatchError(
        f"scaling '{label}' would change nothing: the logits of {type(model).__name__} do not depend on "
        f"{', '.join(modules)}{which} -- no layer of this config reads its rotary output (e.g. every layer is "
        "NoPE or linear attention)"
    )
