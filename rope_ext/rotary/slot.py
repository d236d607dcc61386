"""A *rotary slot*: one place in a model where RoPE's frequencies are kept, and what it holds now.

A slot (:class:`RotarySlot`) is a description -- the rotary module's name, the buffer prefix, the rotary dim and base
-- so slots found on a ``meta``-device instance name the same places in the loaded model (finding them:
:mod:`rope_ext.rotary.find`). The frequencies are a buffer ``<prefix>inv_freq`` beside ``<prefix>attention_scaling``
(every transformers 5 rotary module), or a sin/cos table the rotary indexes (GPT-J, CodeGen: a *table slot*, read and
rebuilt from its values, :mod:`rope_ext.rotary.tables`); :func:`held_frequencies` reads either. A table slot grows with
the module's own RoPE past its end (:func:`own_base`, :func:`own_table`, :func:`grown`): what the patcher compares a
patched table with, and what a strategy that changes no frequency runs on.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..strategies.registry import ScalingError
from ..strategies.rope import default_inv_freq
from .tables import build_table, layout, put, read_table, readable, table_base

if TYPE_CHECKING:
    from torch import nn
    import torch


class RotaryNotFoundError(ScalingError):
    """The model has no rotary embedding module rope_ext can patch. Args: the one-line message, naming the model's
    class. A :class:`ScalingError`; :func:`find_rotary_slots` (and so :func:`patch`) raises it.

    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> from rope_ext import find_rotary_slots
    >>> find_rotary_slots(GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=64)))
    Traceback (most recent call last):
    ...
    rope_ext.rotary.slot.RotaryNotFoundError: GPT2LMHeadModel has no rotary embedding module ...
    """


@dataclass(frozen=True)
class RotarySlot:
    """One set of rotary frequencies in a model: the module's qualified name, the buffer prefix, rotary dim
    and base (of the rotating pairs); for a sin/cos table rotary, the table buffer's name and its number of rows; the
    number of ``still`` pairs the buffer holds at frequency zero after the rotating ones. A slot is a place: two are
    equal when they name the same buffer, whatever dim, base, rows and still pairs it held when each was found (a
    table patched to other frequencies is the same slot; its base is NaN where the table is not of RoPE's form; a
    buffer patched with p-RoPE holds more zeros). Found by :func:`find_rotary_slots`, not built by hand; raises
    nothing of its own.

    >>> from rope_ext import find_rotary_slots
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
    ...     num_key_value_heads=1, vocab_size=64, max_position_embeddings=64)
    >>> model = LlamaForCausalLM(config).eval()
    >>> slot = find_rotary_slots(model)[0]
    >>> slot.module_name, slot.dim, slot.base, slot.width
    ('model.rotary_emb', 16, 10000.0, 16)
    """

    module_name: str
    prefix: str
    dim: int = field(compare=False)  # of the rotating pairs: 2 * (pairs held) - 2 * still
    base: float = field(compare=False)  # what the place held when found (a patched table reads otherwise)
    table: str = ""
    rows: int = field(default=0, compare=False)
    still: int = field(default=0, compare=False)  # pairs held at frequency 0 (proportional RoPE): never rotated

    @property
    def width(self) -> int:
        """2 x the pairs the buffer holds: the rotating dim plus 2 x the still pairs (the cos/sin width)."""
        return self.dim + 2 * self.still

    @property
    def buffer(self) -> str:
        """The name of the buffer that holds this slot's frequencies (``<prefix>inv_freq``, or the table)."""
        return self.table or f"{self.prefix}inv_freq"

    @property
    def layer_type(self) -> str | None:
        return self.prefix[:-1] if self.prefix else None

    def module(self, model: nn.Module) -> nn.Module:
        """The rotary module of ``model`` this slot names."""
        return model.get_submodule(self.module_name)

    def frequencies(self, model: nn.Module) -> tuple[torch.Tensor, float]:
        """(the inverse frequencies, the attention factor) ``model`` holds in this slot now."""
        return held_frequencies(self.module(model), self)

    def describe(self) -> dict:
        found = {"module": self.module_name, "layer_type": self.layer_type, "rotary_dim": self.dim, "base": self.base}
        found.update({"still_pairs": self.still} if self.still else {})
        return {**found, "table": self.table, "table_rows": self.rows} if self.table else found


def held_frequencies(module: nn.Module, slot: RotarySlot) -> tuple[torch.Tensor, float]:
    """(the inverse frequencies, the attention factor) ``module`` holds in ``slot`` now: its ``<prefix>inv_freq`` buffer
    and ``<prefix>attention_scaling``, or for a table slot theta (float32) and a read from the table at the slot's
    original length; a one-line ScalingError where a table holds no values here (:func:`readable`)."""
    if not slot.table:
        return getattr(module, f"{slot.prefix}inv_freq"), float(getattr(module, f"{slot.prefix}attention_scaling"))
    table = getattr(module, slot.table)
    readable(table, slot.module_name)
    theta, a = read_table(table, slot.rows)
    return theta.float(), a


def own_base(slot: RotarySlot, table: torch.Tensor, label: str) -> float:
    """The base of the RoPE ``table`` holds now (:func:`table_base`), or a one-line ScalingError naming the slot's
    module where it holds no values or is not RoPE's form (patched already): no base to scale from or grow with."""
    readable(table, slot.module_name)
    base = table_base(table)
    if base is None or not base > 1:
        raise ScalingError(
            f"scaling '{label}': the sin/cos table of {slot.module_name} is not RoPE's theta_i = b^(-2i/d) (patched "
            "already?): rope_ext reads no base to scale it from or grow it with"
        )
    return base


def own_table(slot: RotarySlot, original: torch.Tensor, rows: int, base: float) -> torch.Tensor:
    """The module's own table grown to ``rows``: its rows kept, the rest its own RoPE at ``base`` (:func:`own_base`)."""
    rows = max(rows, original.shape[0])
    table = build_table(default_inv_freq(slot.dim, base), layout(original)[2], rows, original, slot.module_name)
    table[: original.shape[0]] = original
    return table


@contextmanager
def grown(module: nn.Module, slot: RotarySlot, rows: int, base: float):
    """The table slot grown to ``rows`` with the module's own RoPE at ``base`` while inside (its output past the
    table, before any patch: what the patcher's check compares the patched output with)."""
    original = getattr(module, slot.table)
    put(module, slot.table, own_table(slot, original, rows, base))
    try:
        yield
    finally:
        put(module, slot.table, original)
