"""What a rotary module outputs, checked against the frequencies it was patched with: no silent patch.

A rotary module (transformers' ``*RotaryEmbedding``) is called with a dummy ``x`` and probe position ids and
returns (cos, sin). :func:`verify` is run by the patcher (:mod:`rope_ext.patch`) on every slot it patched, for
every caller: no pair the model held at frequency zero may rotate after it (proportional RoPE's still pairs, kept by the
patcher), and the output must (1) differ from the module's output before the patch wherever the strategy changed
the frequencies or the attention factor, and (2) be the patched frequencies, cos(p * theta_i) * a and
sin(p * theta_i) * a at each probe position p -- compared layout-agnostically (each position's values sorted, so
halves-concatenated and interleaved layouts are both read), in the order the module returned them before the patch
((sin, cos) for GPT-J's table rotary, :mod:`rope_ext.rotary.tables`, whose frequencies are read from its table). A module whose forward recomputes its frequencies
from the config (PhiMoE calls ``self.rope_init_fn(self.config)`` in every forward) is patched through what it
reads: :func:`route_init_fn` makes its ``rope_init_fn`` return the patched buffer and, where the output still
differs because the forward branches on the config's ``rope_type``, :func:`route_config` sets that to ``default``
while patched (as the patcher does with the module's own ``rope_type``). Anything else that ignores the
patch is a :class:`SilentPatchError` naming the module and what it read instead; the patch is undone first.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

from ..strategies.registry import ScalingError
from .tables import held_frequencies, tolerance

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .slot import RotarySlot

_MISSING = object()


class SilentPatchError(ScalingError):
    """A patched rotary module whose output did not follow the patched frequencies (one line)."""


def call_rotary(module: nn.Module, slot: RotarySlot, positions: torch.Tensor):
    """(cos, sin) of ``module`` at ``positions`` (float32), or None when it cannot be called as
    ``module(x, position_ids[, layer_type])``; None too on the meta device."""
    import torch

    buffer = getattr(module, slot.buffer)
    if buffer.is_meta:
        return None
    x = torch.zeros(1, positions.shape[-1], 1, dtype=torch.float32, device=buffer.device)
    args = [x, positions.to(buffer.device)]
    if slot.layer_type is not None and "layer_type" in inspect.signature(module.forward).parameters:
        args.append(slot.layer_type)
    try:
        with torch.no_grad():
            out = module(*args)
    except Exception:  # a rotary called otherwise (multimodal position ids, ...): not verifiable this way
        return None
    if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(torch.is_tensor(t) for t in out)):
        return None
    return tuple(t.detach().float().clone() for t in out)


def expected_mismatch(
    out, inv_freq: torch.Tensor, attention: float, positions: torch.Tensor, sin_first: bool = False
) -> float:
    """Largest difference between the module's (cos, sin) -- (sin, cos) when ``sin_first`` -- and cos/sin(p * theta)
    * a, each position's values sorted (any layout: halves concatenated or interleaved, one or two copies of each
    pair)."""
    import torch

    out = tuple(reversed(out)) if sin_first else out
    angles = positions.reshape(-1, 1).double().to(inv_freq.device) * inv_freq.double().reshape(1, -1)
    worst = 0.0
    for got, fn in zip(out, (torch.cos, torch.sin)):
        got = got.reshape(-1, positions.shape[-1], got.shape[-1])[0].double()
        want = fn(angles) * attention
        copies = got.shape[-1] // want.shape[-1]
        if copies < 1 or got.shape[-1] % want.shape[-1]:
            return float("inf")
        want = want.repeat(1, copies)
        worst = max(worst, float((got.sort(-1).values - want.sort(-1).values).abs().max()))
    return worst


def route_init_fn(module: nn.Module, slot_prefixes: list[str]) -> tuple | None:
    """A single-slot module with a ``rope_init_fn`` (called in every forward by PhiMoE-style rotaries) is made to
    return its patched buffer; returns what to restore, (module, saved value or _MISSING), or None."""
    if slot_prefixes != [""] or not callable(getattr(module, "rope_init_fn", None)):
        return None
    saved = module.__dict__.get("rope_init_fn", _MISSING)

    def patched_init_fn(*args, **kwargs):
        return module.inv_freq, module.attention_scaling

    module.rope_init_fn = patched_init_fn
    return module, saved


def route_config(module: nn.Module) -> tuple | None:
    """A module whose forward also reads its config's ``rope_type`` (PhiMoE takes its long/short mscale from the
    config when it is not ``default``) gets ``default`` there too, as the patcher sets the module's own; returns
    what to restore, (the rope parameters, their rope_type), or None when there is nothing to route."""
    params = getattr(getattr(module, "config", None), "rope_parameters", None)
    if not isinstance(params, dict) or params.get("rope_type") in (None, "default"):
        return None
    saved = params, params["rope_type"]
    params["rope_type"] = "default"
    return saved


def unroute(saved: tuple) -> None:
    """Undo :func:`route_init_fn` or :func:`route_config`."""
    owner, value = saved
    if isinstance(owner, dict):
        owner["rope_type"] = value
    elif value is _MISSING:
        owner.__dict__.pop("rope_init_fn", None)
    else:
        owner.rope_init_fn = value


def verify(module: nn.Module, slot: RotarySlot, before, positions: torch.Tensor, own: tuple, label: str) -> str:
    """Check one patched slot (``before``: its output before the patch; ``own``: its frequencies then); returns
    how it was checked, or raises SilentPatchError."""
    import torch

    after = call_rotary(module, slot, positions)  # first: a dynamic strategy sets the frequencies of this length
    if after is None or before is None:
        return "not callable alone: checked through the model's forward only (rope_ext.check)"
    inv_freq, attention = held_frequencies(module, slot)
    # a table holds its values in its dtype: rounded to 2^-8 relative in bfloat16 (model.half() too)
    rounding = tolerance(getattr(module, slot.table), 0.0, attention) if slot.table else 0.0
    # the order the module returned (cos, sin) in before the patch: (sin, cos) for GPT-J's table rotary
    sin_first = bool(slot.table) and expected_mismatch(before, *own, positions, True) < expected_mismatch(
        before, *own, positions
    )
    where = f"{slot.module_name} ({type(module).__name__}{', ' + slot.layer_type if slot.layer_type else ''})"
    moved = (own[0].cpu() == 0) & (inv_freq.cpu() != 0) if inv_freq.shape == own[0].shape else own[0].cpu() == 0
    if bool(moved.any()):  # a pair the model holds still (frequency 0: proportional RoPE) must not start to rotate
        raise ScalingError(
            f"scaling '{label}': {where} rotates {int(moved.sum())} pairs the model holds at frequency 0 "
            "(pairs that carry no position): the patch would change what the model is, so rope_ext refuses it"
        )
    identity = torch.equal(inv_freq.cpu(), own[0].cpu()) and attention == own[1]
    if not identity and all(torch.equal(a, b) for a, b in zip(after, before)):
        raise SilentPatchError(
            f"scaling '{label}' changed nothing in {where}: its forward does not read the patched inv_freq/"
            "attention_scaling (it recomputes cos/sin from elsewhere), so rope_ext refuses to patch it"
        )
    gap = expected_mismatch(after, inv_freq, attention, positions, sin_first)
    # the module computes p * theta in float32: its angle is off by up to ~1 ulp of the largest angle (2e-3 at 4L =
    # 16384), far below what a wrong frequency or attention factor moves (a factor 2, or mscale's 1.14)
    largest = float(positions.max()) * float(inv_freq.abs().max())
    near = max((1e-4 + 4 * largest * 2.0**-24) * max(1.0, abs(attention)), rounding)
    if not gap <= near:
        raise SilentPatchError(
            f"scaling '{label}': {where} outputs cos/sin that are not the patched frequencies (max gap {gap:.2g}): "
            "its forward reads something else (e.g. the config's rope_type or mscale), so rope_ext refuses to patch it"
        )
    return "the rotary module's (cos, sin) equal the patched frequencies at the probe positions"
