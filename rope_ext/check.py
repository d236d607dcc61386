"""A patch that silently does nothing, caught at run time: :func:`patch_checked` applies a scaling and proves, on the
user's model and installed transformers, that it changes the model exactly where it should.

The failure users of context-extension code report most is a patch that runs and changes nothing (Self-Extend no
longer attaching once transformers made SDPA the default, datamllab/LongLM #23, #46) or changes the wrong layers
(Gemma-3 scaling applied to the sliding layers too). The check is a probe of a few tokens whose position ids lie
past the trained context (0, 1, L - 1, L, 2L - 1, 4L), run before and after patching:

- a frequency strategy must change the (cos, sin) that exactly the targeted attention layers receive (their rotary
  slot's layer type), and leave every other layer's bit-identical; on a model whose attention does not call
  transformers' AttentionInterface, the rotary modules' outputs are compared instead (slot by slot);
- a query-scaling or attention-level strategy must reach exactly the targeted layers through rope_ext's attention
  hook (every targeted layer's attention called it and was selected; no other layer was).

A mismatch is a :class:`PatchCheckError` naming the layers and what was expected; the patch is undone first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .attention.hook import hook_attention, text_config
from .patch import RopePatch, probe_positions
from .rotary.slot import RotarySlot
from .rotary.output import SilentPatchError
from .strategies.scaling import Scaling, resolve

if TYPE_CHECKING:
    from torch import nn
    import torch


class PatchCheckError(SilentPatchError):
    """A patch that changed nothing where it should, or something where it should not (one line); the patcher's own
    check of each rotary module's output (:mod:`rope_ext.rotary.output`) comes first and is reported as one too."""


def _observe(model: nn.Module, positions: torch.Tensor, slots: Sequence[RotarySlot]) -> tuple[dict, dict]:
    """One probe forward: {attention layer: ((cos, sin) it received, the slot they came from)}, {rotary module of
    ``slots`` (every slot of the model, as the patcher found them): its outputs (cos, sin)}."""
    import torch

    seen, rotary = {}, {}
    modules = {s.module_name for s in slots}
    handles = []
    for name in modules:

        def keep(module, args, output, name=name, kwargs=None):
            rotary.setdefault(name, []).append(tuple(t.detach().clone() for t in output))

        handles.append(model.get_submodule(name).register_forward_hook(keep))

    def observe(call) -> None:
        rotation = None if call.rotation is None else tuple(t.detach().clone() for t in call.rotation)
        seen[call.name] = (rotation, call.slot() if rotation is not None else None)

    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    try:
        with hook_attention(model, observe), torch.no_grad():
            model(
                input_ids=torch.zeros(positions.shape, dtype=torch.long, device=device),
                position_ids=positions.to(device),
                use_cache=False,
            )
    finally:
        for handle in handles:
            handle.remove()
    return seen, rotary


def _same(a, b) -> bool:
    import torch

    return a is not None and b is not None and all(torch.equal(x, y) for x, y in zip(a, b))


def _layers_of(model: nn.Module, names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def patch_checked(
    model: nn.Module,
    scaling: Scaling,
    slots: Sequence[RotarySlot] | None = None,
    trained: int | None = None,
    every: Sequence[RotarySlot] | None = None,
) -> tuple[RopePatch, dict]:
    """(the patch, what the check found: ``{"changed": [...], "unchanged": [...], "targeted_types": [...], "how": ...}``);
    a PatchCheckError (the patch undone) when the model changed elsewhere than declared. ``slots`` and ``every``: the
    scaled and all the model's slots where the caller found them already (:func:`rope_ext.patch`)."""
    import torch

    trained = trained or int(scaling.params.get("original_max_position") or 0) or 4096
    positions = probe_positions(trained)
    changes = scaling.scales_frequencies or scaling.scales_query or scaling.scales_attention
    before = None
    if scaling.scales_frequencies:  # under ``none``: a sin/cos table rotary grown past its end with its own RoPE
        with RopePatch(model, resolve({"name": "none"}), every=every) as plain:
            before = _observe(model, positions, plain.every)
    try:
        patch = RopePatch(model, scaling, slots=slots, every=every)
    except SilentPatchError as err:  # the patcher's own check of the rotary outputs (the patch undone)
        raise err if isinstance(err, PatchCheckError) else PatchCheckError(str(err)) from None
    if not changes:
        return patch, {"changed": [], "unchanged": [], "how": "none: nothing to change"}
    if (
        scaling.scales_frequencies
        and not scaling.scales_query
        and not scaling.scales_attention
        and not scaling.dynamic
        and all(
            torch.equal(slot.frequencies(model)[0], held.inv_freq) and slot.frequencies(model)[1] == held.attention
            for slot, held in patch.held.items()  # what the patch read before it wrote
        )
    ):
        # a setting that is the model's own RoPE (factor 1, p-RoPE keeping every pair, the model's base): nothing to see
        return patch, {
            "changed": [],
            "unchanged": [],
            "how": "an identity setting: the frequencies are the model's own",
        }
    try:
        found = _check(model, patch, positions, before)
    except Exception:
        patch.restore()
        raise
    return patch, found


def _check(model: nn.Module, patch: RopePatch, positions: torch.Tensor, before) -> dict:
    targeted = set(patch.slots)
    types = sorted({str(s.layer_type) for s in targeted if s.layer_type is not None}) or ["all (one rotary)"]
    patch.reached.clear()
    after = _observe(model, positions, patch.every)
    layers, _ = after
    if not layers and not patch.scaling.scales_frequencies:
        raise PatchCheckError(
            f"scaling '{patch.scaling.label}': no attention layer of {type(model).__name__} called "
            "rope_ext's attention hook, so the method changed nothing"
        )
    observable = any(rotation is not None for rotation, _ in layers.values())
    if patch.scaling.scales_frequencies and observable:
        expected = {name for name, (rotation, slot) in layers.items() if slot in targeted}
        changed = sorted(
            name for name, (rotation, _) in layers.items() if not _same(rotation, before[0].get(name, (None, None))[0])
        )
        how = "the (cos, sin) each attention layer received, before and after"
    elif patch.scaling.scales_frequencies:  # attention outside the AttentionInterface: the rotary modules' outputs
        expected = {s.module_name for s in targeted}
        changed = sorted(
            name
            for name, outs in after[1].items()
            if any(not _same(a, b) for a, b in zip(outs, before[1].get(name, [])))
        )
        layers = dict.fromkeys(after[1])
        how = "the rotary modules' (cos, sin), before and after (attention not observable through the hook)"
    else:
        every = patch.attention_slots() is None
        expected = {name for name, (_, slot) in layers.items() if every or slot in targeted}
        changed = sorted(patch.reached)
        how = "the layers whose attention rope_ext's hook reached"
    total = int(getattr(text_config(model), "num_hidden_layers", 0) or 0)
    if not patch.scaling.scales_frequencies and 0 < len(layers) < total:
        raise PatchCheckError(
            f"scaling '{patch.scaling.label}': only {len(layers)} of the {total} attention layers of "
            f"{type(model).__name__} call rope_ext's attention hook; the others would run unchanged"
        )
    unchanged = sorted(set(layers) - set(changed))
    missing, extra = sorted(expected - set(changed)), sorted(set(changed) - expected)
    label = patch.scaling.label
    if not expected:
        raise PatchCheckError(
            f"scaling '{label}': no layer of {type(model).__name__} uses the targeted rotary slots ({', '.join(types)})"
        )
    if missing:
        raise PatchCheckError(
            f"scaling '{label}' changed nothing in {_layers_of(model, missing)} ({len(missing)} of "
            f"{len(expected)} targeted layers, layer types {', '.join(types)}): the model does not use "
            f"what rope_ext patched ({how})"
        )
    if extra:
        raise PatchCheckError(
            f"scaling '{label}' changed {_layers_of(model, extra)}, which it does not target (layer "
            f"types {', '.join(types)} only)"
        )
    return {
        "changed": changed,
        "unchanged": unchanged,
        "targeted_types": types,
        "how": how,
        "unobserved": max(0, total - len(layers)) if total and how.startswith("the (cos") else 0,
        "positions": positions[0].tolist(),
    }
