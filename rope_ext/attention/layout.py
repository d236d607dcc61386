"""How a layer's rotation is laid out in the (cos, sin) its attention module receives: which columns carry frequency
i (rotate_half and interleaved tables hold two per pair, GPT-J's half-width table and complex cos + i sin one), and
whether the pair is handed over as (sin, cos) -- GPT-J's and CodeGen's split of their table -- rather than (cos, sin)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def frequency_columns(width: int, pairs: int) -> tuple[slice, ...]:
    """The selections of a cos (or sin) ``width`` columns wide that may carry frequency i of ``pairs``: the first half
    (rotate_half) or every other column (interleaved) when it holds two per pair, all of it when it holds one per
    frequency (GPT-J's table, cos + i sin), none otherwise."""
    if width == 2 * pairs:
        return (slice(0, pairs), slice(0, None, 2))
    return (slice(None),) if width == pairs else ()


SIN_FIRST_POSITIONS = 256  # the first positions of a call that decide the order (cheap at 128k tokens)


def sin_first(rotation: tuple, positions: torch.Tensor, hooks) -> bool | None:
    """Whether a module's position embeddings are (sin, cos) rather than (cos, sin) (GPT-J and CodeGen split their
    table so): (c, s) = f (cos, sin)(p theta) satisfies c sin(p theta) = s cos(p theta) at every position p, for the
    frequencies of one of the model's rotary slots; the order that fits it better is the module's. None when this
    call cannot tell (one complex tensor: DeepSeek-V2's freqs_cis; meta tensors; no slot of its width). ``hooks``: the
    model's attention hooks (their ``model`` and rotary ``slots``)."""
    if not isinstance(rotation, (tuple, list)) or len(rotation) != 2:
        return None
    first, second = rotation
    if first.is_meta or not first.is_floating_point() or first.shape[-1] == 0 or first.ndim < 2:
        return None
    n = min(SIN_FIRST_POSITIONS, first.shape[-2])
    if positions.shape[-1] != first.shape[-2]:
        return None
    first, second = first[..., :n, :].double(), second[..., :n, :].double()
    width, angles = first.shape[-1], positions[..., :n].to(first.device).double()[..., None]
    fits = []
    try:
        slots = hooks.slots
        for slot in slots:
            inv_freq = slot.frequencies(hooks.model)[0].to(first.device).double()
            angle = angles * inv_freq
            for columns in frequency_columns(width, len(inv_freq)):
                a, b = first[..., columns], second[..., columns]
                as_is = float((a * angle.sin() - b * angle.cos()).abs().max())
                swapped = float((b * angle.sin() - a * angle.cos()).abs().max())
                fits.append((min(as_is, swapped), swapped < as_is))
    except Exception:  # noqa: BLE001 -- no rotary slot rope_ext can read (custom code): the usual (cos, sin)
        return None
    return min(fits)[1] if fits else None
