"""A *rotary slot*: one place in a model where RoPE's frequencies are kept, and what it held -- plain data.

A slot (:class:`RotarySlot`) is a description -- the rotary module's name, the buffer prefix, the rotary dim and base
-- so slots found on a ``meta``-device instance name the same places in the loaded model (finding them:
:mod:`rope_ext.rotary.find`). The frequencies are a buffer ``<prefix>inv_freq`` beside ``<prefix>attention_scaling``
(every transformers 5 rotary module), or a sin/cos table the rotary indexes (GPT-J, CodeGen: a *table slot*, read and
rebuilt from its values, :mod:`rope_ext.rotary.tables`); :func:`rope_ext.rotary.tables.held_frequencies` reads either.
What a slot's live buffer holds when a patch begins is read once into a :class:`Held`
(:func:`rope_ext.rotary.find.read_held`), which the patcher's later stages take instead of reading the model again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..strategies.registry import ScalingError
from .tables import held_frequencies

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


@dataclass(frozen=True)
class Held:
    """What a slot's live buffer holds when a patch begins (:func:`rope_ext.rotary.find.read_held`): the dim and base of
    its rotating pairs, the mask of its still pairs (None: every pair rotates), and its frequencies and attention factor
    as :func:`rope_ext.rotary.tables.held_frequencies` reads them -- the patcher's one read of the model, which its
    later stages take."""

    dim: int
    base: float
    still: torch.Tensor | None
    inv_freq: torch.Tensor
    attention: float
