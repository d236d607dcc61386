"""Rotaries that hold a sin/cos *table* instead of inverse frequencies: found, read and rebuilt from the values alone;
and what any slot holds, as frequencies (:func:`held_frequencies`: its ``inv_freq`` buffer, or the table read).

GPT-J and CodeGen (transformers' ``GPTJRotaryEmbedding``, ``CodeGenRotaryEmbedding``) precompute a buffer whose row p
is (sin(p * theta_i), cos(p * theta_i)) for p < max_position_embeddings, theta_i = b^(-2i/d) (RoPE, Su et al. 2021,
RoFormer, arXiv 2104.09864), and index it with the position ids: a position past the table is an IndexError, and the
frequencies are not a buffer the patcher could replace. A *table slot* (:class:`rope_ext.rotary.slot.RotarySlot` with
``table`` set) is a module buffer of shape (rows, d) such that

- row 0 is sin(0) * a = 0 in d/2 columns and cos(0) * a = a in the other d/2 (the layout: which columns are the
  sines, which the cosines -- halves either way round, or interleaved; pair i is the i-th of each), a > 0 the
  attention factor; the frequencies are read from rows 1 and rows - 1 (:func:`read_table`);
- the frequencies have RoPE's form theta_i = b^(-2i/d), the base b read from them (:func:`table_base`) -- a table
  that is not (one patched already) is still the same slot, its base NaN, and the patcher refuses to scale it;
- the module's forward returns that table's sin and cos rows at the position ids it is given (a pair of tensors, in
  either order), so an absolute sinusoidal position embedding (one tensor out) is not one.

Tables are read from their values. On a ``meta``-device model (no values: how a harness reads a model's geometry
before its weights load) a buffer of that shape, in a module without parameters whose forward on ``meta`` returns two
tensors, is read from the values loading will give it: transformers 5 fills a model's non-persistent buffers, which no
checkpoint holds, with the model's own ``_init_weights`` (``PreTrainedModel._init_weights``; GPT-J's writes
``create_sinusoidal_positions``), so that is run on a CPU copy of the module (:func:`as_loaded`,
:func:`rope_ext.rotary.find.loaded_copy`). While patched (:mod:`rope_ext.patch`) the
buffer is replaced by :func:`build_table` of the strategy's frequencies theta' and attention factor a,
sin(p * theta'_i) * a and cos(p * theta'_i) * a in the same layout and dtype, with rows for every position a forward
asks (grown in a forward pre-hook: extension past the table is the point); restore() puts the original buffer back.
The patcher reads the base from the live buffer when it patches (:func:`own_base`), not from the slot it was handed,
and refuses in one line a table with no values here (``meta``, offloaded) or not of RoPE's form (patched already).
Past its end a table grows with the module's own RoPE at that base, its rows kept (:func:`own_table`, :func:`grown`):
what the patcher compares a patched table with, and what a strategy that changes no frequency runs on.

A table held in half precision (``model.half()``, bfloat16) is read within its rounding: every comparison allows
4 ulps of the table's dtype where that is more than its float32 tolerance (:func:`tolerance`).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ..strategies.registry import ScalingError
from ..strategies.rope import default_inv_freq

if TYPE_CHECKING:
    import torch
    from torch import nn


TOLERANCE = 1e-3  # a table within this of RoPE's sin/cos at the read base is one (float32 tables: ~1e-6 off)


def tolerance(table: torch.Tensor, floor: float, attention: float = 1.0) -> float:
    """How far a table's values may be from what they stand for: ``floor``, or 4 ulps of the table's dtype where that
    is more (a table rounded to float16, 2^-11 relative, or bfloat16, 2^-8: ``model.half()``), times max(1, a)."""
    import torch

    return max(floor, 4 * torch.finfo(table.dtype).eps) * max(1.0, abs(attention))


def readable(table: torch.Tensor, where: str) -> tuple[torch.Tensor, torch.Tensor, float]:
    """:func:`layout` of a table slot's buffer, or a one-line ScalingError naming ``where`` when it holds no values
    here (``meta``, or offloaded under a device_map) or is no sin/cos table (any more)."""
    found = layout(table)
    if found is None:
        why = "holds no values here (meta device, or offloaded)" if table.is_meta else "is no sin/cos table"
        raise ScalingError(f"{where}: its sin/cos table {why}: rope_ext cannot read or rebuild its frequencies")
    return found


def put(module: nn.Module, name: str, tensor) -> None:
    """Set the buffer ``name`` of ``module``, keeping whether it is saved in the state dict."""
    module.register_buffer(name, tensor, persistent=name not in module._non_persistent_buffers_set)


def held_frequencies(module: nn.Module, slot) -> tuple[torch.Tensor, float]:
    """(the inverse frequencies, the attention factor) ``module`` holds in ``slot`` (a
    :class:`rope_ext.rotary.slot.RotarySlot`) now, whichever form it holds them in: its ``<prefix>inv_freq`` buffer
    and ``<prefix>attention_scaling``, or for a table slot theta (float32) and a read from the table at the slot's
    original length; a one-line ScalingError where a table holds no values here (:func:`readable`)."""
    if not slot.table:
        return getattr(module, f"{slot.prefix}inv_freq"), float(getattr(module, f"{slot.prefix}attention_scaling"))
    table = getattr(module, slot.table)
    readable(table, slot.module_name)
    theta, a = read_table(table, slot.rows)
    return theta.float(), a


def table_shaped(table: torch.Tensor) -> bool:
    """A 2-D float tensor of >= 2 rows and an even number >= 4 of columns: the shape of a sin/cos table."""
    return (
        table.dim() == 2
        and table.is_floating_point()
        and table.shape[0] >= 2
        and table.shape[1] >= 4
        and not (table.shape[1] % 2)
    )


def layout(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    """(sine columns, cosine columns, attention factor a) of a sin/cos table, read from row 0, or None when
    ``table`` is not one (not a 2-D float tensor of >= 2 rows and an even number >= 4 of columns, or row 0 not
    d/2 zeros and d/2 equal positive values)."""
    if not table_shaped(table) or table.is_meta:
        return None
    width = table.shape[1]
    row = table[0].detach().double().cpu()
    zero = row == 0  # sin(0) * a
    if int(zero.sum()) != width // 2:
        return None
    sines, cosines = zero.nonzero().flatten(), (~zero).nonzero().flatten()
    a = row[cosines]  # cos(0) * a
    if not (float(a.min()) > 0 and float(a.min()) == float(a.max())):
        return None
    return sines, cosines, float(a[0])


def read_table(table: torch.Tensor, reference_rows: int = 0) -> tuple[torch.Tensor, float] | None:
    """(theta (d/2,) float64, a) a sin/cos table holds, or None when it is not one. theta_i = atan2 at row 1, refined
    turn by turn at rows 2, 4, 8, ... and r = min(reference_rows or rows, rows) - 1: at each row p, theta = (phase_p +
    2*pi*k) / p, k the whole turns the previous estimate predicts (the angle p * theta read at a large p: the slow
    pairs' frequencies to the table's precision over r). Doubling p keeps the predicted angle's error at about twice
    the read error, far below half a turn, even for a bfloat16 table (row 1 alone would predict the turns at row r
    with r times its error)."""
    import torch

    found = layout(table)
    if found is None:
        return None
    sines, cosines, a = found
    values = table.detach().double().cpu()
    theta = torch.atan2(values[1, sines], values[1, cosines])
    last = min(reference_rows or values.shape[0], values.shape[0]) - 1
    rows = [2**k for k in range(1, max(last, 1).bit_length()) if 2**k < last] + ([last] if last > 1 else [])
    for row in rows:
        phase = torch.atan2(values[row, sines], values[row, cosines])
        theta = (phase + 2 * math.pi * torch.round((row * theta - phase) / (2 * math.pi))) / row
    return theta, a


def build_table(
    inv_freq: torch.Tensor, attention: float, rows: int, like: torch.Tensor, where: str = "a rotary"
) -> torch.Tensor:
    """A table of ``rows`` positions in the layout, dtype and device of ``like``: sin(p * theta_i) * a in its sine
    columns, cos(p * theta_i) * a in its cosine columns, computed in float32 as transformers computes cos/sin. A
    ``like`` with no values here is a one-line ScalingError naming ``where`` (:func:`readable`)."""
    import torch

    sines, cosines, _ = readable(like, where)
    # angle p * theta_i, float32 as GPT-J's create_sinusoidal_positions and transformers' rotary forwards
    angles = torch.arange(rows, dtype=torch.int64).float()[:, None] * inv_freq.float().cpu()[None, :]
    table = torch.empty(rows, like.shape[1], dtype=torch.float32)
    table[:, sines] = torch.sin(angles) * attention
    table[:, cosines] = torch.cos(angles) * attention
    return table.to(dtype=like.dtype, device=like.device)


def table_base(table: torch.Tensor) -> float | None:
    """The base b of a RoPE table, theta_i = b^(-2i/d) -- read from each pair i >= 1, b = theta_i^(-d/(2i)), or the
    nearest whole number, whichever rebuilds the table closest -- or None when the table is not of that form (within
    :data:`TOLERANCE`, or 4 ulps of its dtype: :func:`tolerance`)."""
    read = read_table(table)
    if read is None:
        return None
    theta, a = read
    dim = 2 * theta.numel()
    if not (abs(float(theta[0]) - 1.0) < tolerance(table, 1e-4) and all(0 < float(t) < 1 for t in theta[1:])):
        return None
    # theta_i = b^(-2i/d)  =>  b = theta_i^(-d/(2i))
    reads = [float(theta[i]) ** (-dim / (2 * i)) for i in range(1, theta.numel())]
    best, gap = None, math.inf
    for base in sorted({float(round(b)) for b in reads}) + reads:  # a whole number first: a tie keeps it
        if base > 1:
            rebuilt = build_table(default_inv_freq(dim, base), a, table.shape[0], table)
            error = float((rebuilt.double() - table.detach().double()).abs().max())
            if error < gap:
                best, gap = base, error
    return best if gap <= tolerance(table, TOLERANCE, a) else None


def own_base(slot, table: torch.Tensor, label: str) -> float:
    """The base of the RoPE ``table`` holds now (:func:`table_base`), or a one-line ScalingError naming the module of
    ``slot`` (a :class:`rope_ext.rotary.slot.RotarySlot`) where it holds no values or is not RoPE's form (patched
    already): no base to scale from or grow with."""
    readable(table, slot.module_name)
    base = table_base(table)
    if base is None or not base > 1:
        raise ScalingError(
            f"scaling '{label}': the sin/cos table of {slot.module_name} is not RoPE's theta_i = b^(-2i/d) (patched "
            "already?): rope_ext reads no base to scale it from or grow it with"
        )
    return base


def own_table(slot, original: torch.Tensor, rows: int, base: float) -> torch.Tensor:
    """The module's own table grown to ``rows``: its rows kept, the rest its own RoPE at ``base`` (:func:`own_base`)."""
    rows = max(rows, original.shape[0])
    table = build_table(default_inv_freq(slot.dim, base), layout(original)[2], rows, original, slot.module_name)
    table[: original.shape[0]] = original
    return table


@contextmanager
def grown(module: nn.Module, slot, rows: int, base: float):
    """The table slot grown to ``rows`` with the module's own RoPE at ``base`` while inside (its output past the
    table, before any patch: what the patcher's check compares the patched output with)."""
    original = getattr(module, slot.table)
    put(module, slot.table, own_table(slot, original, rows, base))
    try:
        yield
    finally:
        put(module, slot.table, original)
