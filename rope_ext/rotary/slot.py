"""A *rotary slot*: one place in a model where RoPE's frequencies are kept, and what it holds now.

A slot (:class:`RotarySlot`) is a description -- the rotary module's name, the buffer prefix, the rotary dim and base
-- so slots found on a ``meta``-device instance name the same places in the loaded model (finding them:
:mod:`rope_ext.rotary.find`). The frequencies are a buffer ``<prefix>inv_freq`` beside ``<prefix>attention_scaling``
(every transformers 5 rotary module), or a sin/cos table the rotary indexes (GPT-J, CodeGen: a *table slot*, read and
rebuilt from its values, :mod:`rope_ext.rotary.tables`); :func:`held_frequencies` reads either. What a slot's live
buffer holds when a patch begins is read once into a :class:`Held` (:func:`rope_ext.rotary.find.read_held`), which the
patcher's later stages take instead of reading the model again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..strategies.registry import ScalingError
from ..strategies.rope import default_inv_freq
from .tables import own_base, read_table, readable

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
    as :func:`held_frequencies` reads them -- the patcher's one read of the model, which the later stages take."""

    dim: int
    base: float
    still: torch.Tensor | None
    inv_freq: torch.Tensor
    attention: float


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
    """What ``slot`` holds in the live ``module`` now, read once when a patch begins: its frequencies and attention
    factor (:func:`held_frequencies`), and its dim, base and still pairs from the buffer, not from the slot (found on
    ``meta``, the initialiser may not have run: a config's base, not an odd dim's b^(d/d')) -- a table's base from its
    values (:func:`rope_ext.rotary.tables.own_base`, a one-line ScalingError naming ``label`` where it is none),
    frequencies' as :func:`held_geometry` reads them. A buffer with no values here is a one-line ScalingError."""
    inv_freq, attention = held_frequencies(module, slot)
    if slot.table:
        return Held(slot.dim, own_base(slot, getattr(module, slot.table), label), None, inv_freq, attention)
    if inv_freq.is_meta:
        raise ScalingError(f"{slot.module_name}: its {slot.buffer} holds no values here (meta device, or offloaded)")
    still = (inv_freq == 0).cpu()
    dim, base, _ = held_geometry(inv_freq, slot.base)
    if bool(still.any()) and slot.still == int(still.sum()):  # found with values: the slot's (no fixpoint otherwise)
        dim, base = slot.dim, slot.base
    return Held(dim, base, still if bool(still.any()) else None, inv_freq, attention)
