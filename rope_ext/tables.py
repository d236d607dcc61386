"""Rotaries that hold a sin/cos *table* instead of inverse frequencies: found, read and rebuilt from the values alone.

GPT-J and CodeGen (transformers' ``GPTJRotaryEmbedding``, ``CodeGenRotaryEmbedding``) precompute a buffer whose row p
is (sin(p * theta_i), cos(p * theta_i)) for p < max_position_embeddings, theta_i = b^(-2i/d) (RoPE, Su et al. 2021,
RoFormer, arXiv 2104.09864), and index it with the position ids: a position past the table is an IndexError, and the
frequencies are not a buffer the patcher could replace. A *table slot* (:class:`rope_ext.slots.RotarySlot` with
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
:func:`rope_ext.slots.loaded_copy`). While patched (:mod:`rope_ext.patch`) the
buffer is replaced by :func:`build_table` of the strategy's frequencies theta' and attention factor a,
sin(p * theta'_i) * a and cos(p * theta'_i) * a in the same layout and dtype, with rows for every position a forward
asks (grown in a forward pre-hook: extension past the table is the point); restore() puts the original buffer back.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import TYPE_CHECKING

from .rope import default_inv_freq

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .slots import RotarySlot

TOLERANCE = 1e-3  # a table within this of RoPE's sin/cos at the read base is one (float32 tables: ~1e-6 off)


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
    at row r = min(reference_rows or rows, rows) - 1: theta = (phase_r + 2*pi*k) / r, k the whole turns row 1 predicts
    (the angle p * theta read at a large p: the slow pairs' frequencies to float32's precision over r)."""
    import torch

    found = layout(table)
    if found is None:
        return None
    sines, cosines, a = found
    values = table.detach().double().cpu()
    theta = torch.atan2(values[1, sines], values[1, cosines])
    last = min(reference_rows or values.shape[0], values.shape[0]) - 1
    if last > 1:
        phase = torch.atan2(values[last, sines], values[last, cosines])
        theta = (phase + 2 * math.pi * torch.round((last * theta - phase) / (2 * math.pi))) / last
    return theta, a


def build_table(inv_freq: torch.Tensor, attention: float, rows: int, like: torch.Tensor) -> torch.Tensor:
    """A table of ``rows`` positions in the layout, dtype and device of ``like``: sin(p * theta_i) * a in its sine
    columns, cos(p * theta_i) * a in its cosine columns, computed in float32 as transformers computes cos/sin."""
    import torch

    sines, cosines, _ = layout(like)
    # angle p * theta_i, float32 as GPT-J's create_sinusoidal_positions and transformers' rotary forwards
    angles = torch.arange(rows, dtype=torch.int64).float()[:, None] * inv_freq.float().cpu()[None, :]
    table = torch.empty(rows, like.shape[1], dtype=torch.float32)
    table[:, sines] = torch.sin(angles) * attention
    table[:, cosines] = torch.cos(angles) * attention
    return table.to(dtype=like.dtype, device=like.device)


def table_base(table: torch.Tensor) -> float | None:
    """The base b of a RoPE table, theta_i = b^(-2i/d) -- b = theta_1^(-d/2), or its nearest whole number where
    that rebuilds the table closer -- or None when the table is not of that form (within :data:`TOLERANCE`)."""
    read = read_table(table)
    if read is None:
        return None
    theta, a = read
    dim = 2 * theta.numel()
    if not (abs(float(theta[0]) - 1.0) < 1e-4 and 0 < float(theta[1]) < 1):
        return None
    # theta_1 = b^(-2/d)  =>  b = theta_1^(-d/2)
    read_base = float(theta[1]) ** (-dim / 2)
    best, gap = None, math.inf
    for base in (read_base, float(round(read_base))):
        if base > 1:
            rebuilt = build_table(default_inv_freq(dim, base), a, table.shape[0], table)
            error = float((rebuilt.double() - table.detach().double()).abs().max())
            if error < gap:
                best, gap = base, error
    return best if gap <= TOLERANCE * max(1.0, a) else None


def held(module: nn.Module, slot: RotarySlot) -> tuple[torch.Tensor, float]:
    """(theta float32, a) the table slot of ``module`` holds now (read at the slot's original length)."""
    theta, a = read_table(getattr(module, slot.table), slot.rows)
    return theta.float(), a


def own_table(slot: RotarySlot, original: torch.Tensor, rows: int) -> torch.Tensor:
    """The module's own table grown to ``rows``: its rows kept, the rest its own RoPE at the slot's base."""
    rows = max(rows, original.shape[0])
    table = build_table(default_inv_freq(slot.dim, slot.base), layout(original)[2], rows, original)
    table[: original.shape[0]] = original
    return table


@contextmanager
def grown(module: nn.Module, slot: RotarySlot, rows: int):
    """The table slot grown to ``rows`` with the module's own RoPE while inside (its output past the table, before
    any patch: what the patcher's check compares the patched output with)."""
    original = getattr(module, slot.table)
    persistent = slot.table not in module._non_persistent_buffers_set
    module.register_buffer(slot.table, own_table(slot, original, rows), persistent=persistent)
    try:
        yield
    finally:
        module.register_buffer(slot.table, original, persistent=persistent)


def as_loaded(model: nn.Module, module: nn.Module, name: str) -> nn.Module | None:
    """The ``meta``-device ``module`` as loading will give it (:func:`rope_ext.slots.loaded_copy`), or None where
    ``name`` cannot be a table rotary's: not of a table's shape, in a module with parameters, or a forward on ``meta``
    at three positions that does not return two tensors of d/2 columns."""
    import torch

    from .slots import loaded_copy

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
    from .rotary_output import call_rotary, expected_mismatch
    from .slots import RotarySlot

    import torch

    slots = []
    for module_name, module in model.named_modules():
        for name, buffer in module.named_buffers(recurse=False):
            source = as_loaded(model, module, name) if buffer.is_meta else module
            if source is None or layout(buffer := getattr(source, name)) is None:
                continue
            base = table_base(buffer)  # NaN: not RoPE's form (a table patched already): found, not scaled again
            base = math.nan if base is None else base
            slot = RotarySlot(module_name, "", int(buffer.shape[1]), base, table=name, rows=int(buffer.shape[0]))
            positions = torch.tensor([[0, 1, buffer.shape[0] - 1]])
            out = call_rotary(source, slot, positions)
            theta, a = held(source, slot)
            if out is not None and any(
                expected_mismatch(out, theta, a, positions, sin_first) <= 1e-4 * max(1.0, a) for sin_first in (0, 1)
            ):
                slots.append(slot)
    return slots
