"""One generic patcher that applies a scaling strategy to any Hugging Face model with RoPE.

It works from the model object alone, on its *rotary slots* (:mod:`rope_ext.rotary.find`): the ones the
scaling's ``layer_types`` select, or -- from a harness that found and selected them before the model
loaded -- the slots it is given.

Static strategies replace the buffer once and cost nothing per forward. Dynamic strategies
(``dynamic_ntk``, ``longrope``, dynamic ``yarn``) recompute the frequencies in a forward pre-hook
from the current length n = max(position_ids) + 1. KV-cache caveat: during generation, keys cached
at one length were rotated with that length's frequencies and are reused unchanged when later
tokens arrive with another length's frequencies (transformers issue #25104); scoring a whole
sequence in one forward, as the evals here do, is exact.

Pairs whose held frequency is exactly zero do not rotate, before or after a patch (transformers' ``proportional``
RoPE, Gemma-4 / LFM3: the pairs past ``partial_rotary_factor`` hold 0): the strategy's frequencies are computed for the
rotating pairs only, on the dim and base they have (:func:`rope_ext.rotary.find.held_geometry`: theta_i = b^(-2i/D) over a
pairs is RoPE of dim 2a at the base b^(2a/D), the same wavelengths), and the still pairs are put back at zero -- for
dynamic strategies at every length too.

A frequency strategy also sets what the attention modules computed from the rope parameters when they were built
(:mod:`rope_ext.rotary.softmax_scale`): DeepSeek's multi-head latent attention multiplies its softmax scale by
mscale(factor, mscale_all_dim)^2 (DeepSeek-V2's split of YaRN's temperature), so the patched model equals transformers'
build for the strategy's ``rope_parameters`` (the unscaled one where transformers has none), and is restored exactly.

A patch the model would not feel is refused, not applied: for a frequency or attention-level strategy,
:mod:`rope_ext.rotary.in_use` checks on a few tokens that the logits depend on the patched rotary slots (a config whose
layers are all linear attention or NoPE reads none of them) and raises a one-line SilentPatchError otherwise.

The model's own ``rope_type`` is set to ``default`` while patched, so transformers' own dynamic
update cannot overwrite ours; everything is restored exactly by :meth:`RopePatch.restore`.

A sin/cos *table* rotary (GPT-J, CodeGen: :mod:`rope_ext.rotary.tables`) gets a table rebuilt from the strategy's
frequencies and attention factor, grown in a forward pre-hook to every position a forward asks (its own table ends at
max_position_embeddings); under a strategy that changes no frequency (``none``, query scaling, attention-level) it
is grown with its own RoPE, its rows kept. Dynamic strategies rebuild it from the current length.

Query-scaling strategies (``logn``, alone or in a ``compose``) change no frequency: the patcher attaches a
query transform to rope_ext's attention hook (:mod:`rope_ext.attention.hook`) that multiplies the query at
each position by the strategy's factor, in the layers whose rotary slot is selected (``layer_types=auto``
on Gemma-3: the global layers); removing it restores the model's attention implementation exactly.
Attention-level strategies (Self-Extend, DCA, ReRoPE, STRING, LM-Infinite) attach the hook's replacement in
the same layers: attention assembled from the strategy's position rule (:mod:`rope_ext.attention.assembled`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

from .attention.call import assemble_call, require_hooked
from .attention.hook import hook_attention
from .rotary.find import find_rotary_slots, read_held, select_slots
from .rotary.in_use import require_in_use
from .rotary.output import SilentPatchError, call_rotary, route_config, route_init_fn, unroute, verify
from .rotary.slot import Held, RotaryNotFoundError, RotarySlot
from .rotary.softmax_scale import describe, native_changes
from .rotary.tables import build_table, grown, own_table, put
from .strategies.registry import ScalingError
from .strategies.scaling import Scaling, resolve
from .strategies.shipped import inherit_shipped, trained_context

if TYPE_CHECKING:
    from torch import nn


def probe_positions(trained: int):
    """Position ids below, at and past the trained context L (0, 1, L-1, L, 2L-1, 4L): where the patcher compares each
    rotary's output with the patched frequencies (:func:`rope_ext.rotary.output.verify`), and :mod:`rope_ext.check` the
    model's attention."""
    import torch

    return torch.tensor([[0, 1, trained - 1, trained, 2 * trained - 1, 4 * trained]])


class RopePatch:
    """A scaling strategy applied to a model; a context manager that restores the model on exit. Built by
    :func:`patch` (same arguments). ``scaling`` is the resolved :class:`Scaling`, ``slots`` the slots it scales
    (``every``: all the model's), ``held`` what each slot it reads held when the patch began
    (:class:`rope_ext.rotary.slot.Held`), ``shipped`` one line on what the model's shipped scaling did to the request
    (or None); ``restore()`` puts back every buffer, table, hook and attribute it changed. Raises what :func:`patch`
    raises.

    >>> from rope_ext import patch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
    ...     num_key_value_heads=1, vocab_size=64, max_position_embeddings=64)
    >>> model = LlamaForCausalLM(config).eval()
    >>> with patch(model, {"name": "linear", "factor": 2}) as rope:
    ...     type(rope).__name__, rope.scaling.label, model.model.rotary_emb.inv_freq[0].item()
    ('RopePatch', 'linear-factor2', 0.5)
    >>> model.model.rotary_emb.inv_freq[0].item()
    1.0
    """

    def __init__(
        self,
        model: nn.Module,
        scaling: "Mapping | Scaling",
        original_max_position: int | None = None,
        slots: Sequence[RotarySlot] | None = None,
        every: Sequence[RotarySlot] | None = None,
    ):
        self.model = model
        self.shipped = None  # what the model's shipped scaling did to a mapping (rope_ext.strategies.shipped), one line
        self.softmax_scale = (
            None  # what the patch set on the attention modules (rope_ext.rotary.softmax_scale), one line
        )
        if not isinstance(scaling, Scaling):
            scaling, self.shipped = inherit_shipped(scaling, model.config)
        # the trained context the config declares (rope_ext.strategies.shipped), read once: a mapping is resolved with
        # it where none is given, and the frequency check probes around it where the strategy declares none
        self._trained = trained_context(model)
        if not isinstance(scaling, Scaling) or original_max_position is not None:
            scaling = resolve(scaling, original_max_position or self._trained)
        self.scaling = scaling
        changes = scaling.scales_frequencies or scaling.scales_query or scaling.scales_attention
        # every rotary slot of the model, found once (rope_ext.rotary.find) or handed over (found before the model
        # loaded): the ones the strategy scales are selected from it (or handed over too); the tables left at their
        # own RoPE, the attention hooks' selection and per-layer-type rope parameters take it
        try:
            self.every = list(every) if every is not None else find_rotary_slots(model)
        except RotaryNotFoundError:
            if changes:
                raise
            self.every = []  # a strategy that changes nothing, on a model without RoPE: nothing to do
        self.slots = (
            [] if not changes else list(slots) if slots is not None else select_slots(self.every, scaling.layer_types)
        )
        self.name, self.dynamic = scaling.name, scaling.dynamic
        self.seq_len: dict[RotarySlot, int | None] = {}  # the length each slot's frequencies were computed for
        self._saved: list[tuple] = []
        self._hooks: list = []
        self.applied: list[dict] = []
        self._routed: list[tuple] = []  # rope_init_fn routed to the patched buffer (rotary_output.route_init_fn)
        self.reached: set[str] = set()  # the attention layers whose call the query/attention hook changed (check.py)
        self._rows: dict[RotarySlot, int] = {}  # a table slot's rows now
        self._freqs: dict[RotarySlot, tuple] = {}  # the frequencies a table slot was built from
        # what each slot's live buffer held when the patch began (rope_ext.rotary.find.read_held): dim, base, still
        # pairs, frequencies -- the one read of the model the later stages (and rope_ext.check) take
        self.held: dict[RotarySlot, Held] = {}
        # tables this strategy leaves at their own RoPE: grown past their end all the same (rope_ext.rotary.tables)
        self._own_tables = [] if scaling.scales_frequencies else [s for s in self.every if s.table]
        try:
            self._attach()
        except BaseException:  # a refusal half-way (a method the model's attention cannot take): nothing left changed
            self.restore()
            raise

    def _attach(self) -> None:
        """Every change of the patch, in stages that each take what the one before gave: the frequencies -- what the
        scaled slots hold read once, the strategy's computed, written and verified (:meth:`_apply`) --; the attention's
        build-time constants; the tables left at their own RoPE grown past their end; the query and attention hooks;
        the check that the model reads what was patched."""
        scaling, model = self.scaling, self.model
        positions = probe_positions(int(scaling.params.get("original_max_position") or 0) or self._trained)
        if scaling.scales_frequencies:
            self._apply(positions)
            self._follow_softmax_scale()
        for slot in self._own_tables:
            module = slot.module(model)
            self.held[slot] = read_held(module, slot, scaling.label)  # refused where it holds no RoPE (NaN rows)
            self._saved.append((module, slot.table, None, getattr(module, slot.table)))
            self._rows[slot] = slot.rows
            self._hooks.append(module.register_forward_pre_hook(self._position_hook, with_kwargs=True))
        if scaling.scales_query or scaling.scales_attention:
            # only the selected layers' attention (None: every layer, the model has no other slot)
            self._attention_slots = None if set(self.slots) == set(self.every) else set(self.slots)
            layer_types = sorted({str(s.layer_type) for s in self.slots})
        if scaling.scales_attention:
            self._rule = scaling.position_rule()
            require_hooked(self.model, self.scaling.label)  # a method that would change nothing is an error
        if scaling.scales_query:
            self._hooks.append(hook_attention(self.model, self._scale_query, transform=True))
            self.applied.append({"query_scaling": self.scaling.label, "layer_types": layer_types})
        if scaling.scales_attention:
            self._hooks.append(hook_attention(self.model, self._assemble, replace=True))
            self.applied.append({"attention": self.scaling.label, "layer_types": layer_types})
        if self.slots and (scaling.scales_frequencies or scaling.scales_attention):
            # a model that reads none of what was patched: an error, never silence (query scaling acts on the
            # query itself, in NoPE layers too -- Llama-4's temperature tuning: the hook's reach is its check)
            require_in_use(self.model, self.slots, self.scaling.label)

    def _follow_softmax_scale(self) -> None:
        """The attention modules' build-time constants (MLA's softmax scale, from mscale_all_dim) set to what
        transformers builds for the strategy's rope parameters (:mod:`rope_ext.rotary.softmax_scale`)."""
        rotaries = [slot.module(self.model) for slot in self.slots]  # (a rotary has no layer_idx: never rebuilt)
        changes = native_changes(self.model, self.scaling, self.slots, rotaries, every=self.every)
        for module, attr, live, new in changes:
            self._saved.append((module, None, attr, live))
            setattr(module, attr, new)
        self.softmax_scale = describe(changes)
        if changes:
            self.applied.append({"attention_constants": self.softmax_scale})
            if self.shipped:
                self.shipped += f"; {self.softmax_scale}"

    def attention_slots(self) -> set | None:
        """The slots whose layers the query/attention hook changes; None: every layer (the model has no other)."""
        return self._attention_slots

    def _selected(self, call) -> bool:
        return self._attention_slots is None or call.slot() in self._attention_slots

    def _assemble(self, call):
        """The attention output of the position rule for this call, or None where the rule changes nothing."""
        if not self._selected(call):
            return None
        self.reached.add(call.name)
        return assemble_call(self._rule, call, self.scaling.label, self.model)

    def _scale_query(self, call):
        if not self._selected(call):
            return None
        self.reached.add(call.name)
        factors = self.scaling.query_factors(call.positions)  # (batch, q_len)
        return (call.query * factors.to(call.query.device)[:, None, :, None]).to(call.query.dtype)

    def _apply(self, positions) -> None:
        """The frequency stages, each from what the one before gave: what every scaled slot holds, read once
        (:func:`rope_ext.rotary.find.read_held`, kept in ``self.held``), its output at ``positions`` before the patch,
        the strategy's frequencies computed and written (:meth:`_set_all`), and each slot's output verified against
        them (:mod:`rope_ext.rotary.output`)."""
        modules = {slot.module_name: slot.module(self.model) for slot in self.slots}
        self.held = {slot: read_held(modules[slot.module_name], slot, self.scaling.label) for slot in self.slots}
        before = {}
        for slot in self.slots:
            module = modules[slot.module_name]
            if slot.table:  # its output past the table, its own RoPE grown: what the patched one is compared with
                with grown(module, slot, int(positions.max()) + 1, self.held[slot].base):
                    before[slot] = call_rotary(module, slot, positions)
            else:
                before[slot] = call_rotary(module, slot, positions)
        own = {slot: (held.inv_freq, held.attention) for slot, held in self.held.items()}
        try:
            self._set_all(modules)
            for slot in self.slots:
                module = modules[slot.module_name]
                try:
                    how = verify(module, slot, before[slot], positions, own[slot], self.scaling.label)
                except SilentPatchError:  # its forward branches on the config's rope_type: route that, check again
                    routed = route_config(module)
                    if routed is None:
                        raise
                    self._routed.append(routed)
                    how = verify(module, slot, before[slot], positions, own[slot], self.scaling.label)
                    how += " (its config's rope_type set to default while patched)"
                self.applied[-len(self.slots) + self.slots.index(slot)]["verified"] = how
        except Exception:
            self.restore()
            raise

    def _set_all(self, modules: dict) -> None:
        for module in modules.values():
            self._saved.append((module, None, "rope_type", getattr(module, "rope_type", None)))
            rope_type = getattr(module, "rope_type", None)
            if isinstance(rope_type, dict):
                module.rope_type = {k: "default" for k in rope_type}
            elif rope_type is not None:
                module.rope_type = "default"
        for name, module in modules.items():
            if self.dynamic or any(s.table for s in self.slots if s.module_name == name):
                self._hooks.append(module.register_forward_pre_hook(self._position_hook, with_kwargs=True))
        for slot in self.slots:
            module = modules[slot.module_name]
            if slot.table:
                self._saved.append((module, slot.table, None, getattr(module, slot.table)))
                self._rows[slot] = slot.rows
            else:
                buffer_name, scaling_name = f"{slot.prefix}inv_freq", f"{slot.prefix}attention_scaling"
                self._saved.append((module, buffer_name, None, getattr(module, buffer_name)))
                self._saved.append((module, None, scaling_name, getattr(module, scaling_name)))
            inv_freq, attention = self._set(slot, module, seq_len=None)
            held = self.held[slot]  # as the buffer holds it (the slot's, unless found without values)
            self.applied.append(
                {
                    **slot.describe(),
                    "rotary_dim": held.dim,
                    "base": held.base,
                    "attention_factor": attention,
                    "inv_freq_min": float(inv_freq.min()),
                }
            )
        for name, module in modules.items():
            routed = route_init_fn(module, [s.prefix for s in self.slots if s.module_name == name])
            if routed is not None:
                self._routed.append(routed)

    def _set(self, slot: RotarySlot, module: nn.Module, seq_len: int | None):
        """Set ``slot`` to the strategy's frequencies at ``seq_len``; returns them (the rotating pairs') and the
        attention factor."""
        import torch

        dim, base, still = self.held[slot].dim, self.held[slot].base, self.held[slot].still
        if still is not None and not dim:
            raise ScalingError(f"{slot.module_name}: every pair of {slot.buffer} holds frequency 0: nothing rotates")
        try:
            inv_freq, attention = self.scaling.frequencies(dim, base, seq_len)
        except ScalingError as err:
            if still is None:
                raise
            rotates = f"{slot.buffer} rotates {dim // 2} of its {still.numel()} pairs (the rest hold frequency 0)"
            raise ScalingError(f"{err}; {rotates}") from None
        self.seq_len[slot] = seq_len
        if slot.table:  # sin(p * theta') * a, cos(p * theta') * a for every position up to the length asked
            self._freqs[slot] = inv_freq, attention
            self._rows[slot] = max(self._rows[slot], seq_len or 0)
            table = build_table(inv_freq, attention, self._rows[slot], getattr(module, slot.table), slot.module_name)
            put(module, slot.table, table)
            return inv_freq, attention
        old, rotating = getattr(module, f"{slot.prefix}inv_freq"), inv_freq
        if still is not None:  # the still pairs put back at zero, the strategy's frequencies in the rotating ones
            inv_freq = torch.zeros(still.shape, dtype=rotating.dtype).masked_scatter(~still, rotating)
        module.register_buffer(f"{slot.prefix}inv_freq", inv_freq.to(old.device), persistent=False)
        setattr(module, f"{slot.prefix}attention_scaling", attention)
        return rotating, attention

    def _position_hook(self, module, args, kwargs):
        """Before a rotary's forward: dynamic frequencies for the current length n = max(position_ids) + 1; a table
        grown to n rows (at least doubled, so a generation adding one token at a time rebuilds it rarely)."""
        position_ids = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
        if position_ids is None:
            if self.dynamic:
                raise ScalingError(f"dynamic scaling '{self.name}': the rotary module was called without position_ids")
            return
        seq_len = int(position_ids.max()) + 1
        for slot in [*self.slots, *self._own_tables]:
            if slot.module(self.model) is not module:
                continue
            if self.dynamic and slot in self.seq_len and self.seq_len[slot] != seq_len:
                self._set(slot, module, seq_len)
            elif slot.table and seq_len > self._rows[slot]:
                self._rows[slot] = max(seq_len, 2 * self._rows[slot])
                table = getattr(module, slot.table)
                if slot in self._freqs:
                    put(module, slot.table, build_table(*self._freqs[slot], self._rows[slot], table, slot.module_name))
                else:  # a table at its own RoPE: its original rows kept
                    original = next(v for m, n, _, v in self._saved if m is module and n == slot.table)
                    put(module, slot.table, own_table(slot, original, self._rows[slot], self.held[slot].base))

    def restore(self) -> None:
        """Put back the exact tensors and attributes the model had before patching."""
        for hook in self._hooks:
            hook.remove()
        for routed in reversed(self._routed):
            unroute(routed)
        for module, buffer_name, attr_name, value in reversed(self._saved):
            if buffer_name is not None:
                put(module, buffer_name, value)
            elif value is not None or hasattr(module, attr_name):
                setattr(module, attr_name, value)
        self._saved, self._hooks, self._routed = [], [], []

    def __enter__(self) -> "RopePatch":
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


def patch(
    model: nn.Module,
    scaling: "Mapping | Scaling",
    original_max_position: int | None = None,
    slots: Sequence[RotarySlot] | None = None,
    every: Sequence[RotarySlot] | None = None,
) -> RopePatch:
    """Apply ``scaling`` to ``model`` now; use as ``with patch(...)`` to restore on exit, or call
    ``.restore()``. A resolved :class:`Scaling` is applied as it is; a mapping is resolved here, its trained
    context defaulting to ``original_max_position`` or the config's. ``slots``: the rotary slots to scale,
    found and selected already (e.g. on a ``meta``-device instance, before the model loaded); default: the
    model's, selected by the scaling's ``layer_types``. ``every``: all the model's slots, found so too (default: found
    here, once). Returns the :class:`RopePatch`. Raises ScalingError (one
    line) for a config :func:`resolve` refuses or one the model cannot take, RotaryNotFoundError for a model
    without RoPE, AttentionHookError where a query or attention-level strategy cannot hook the attention.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
    ...     num_key_value_heads=1, vocab_size=64, max_position_embeddings=64)
    >>> model = LlamaForCausalLM(config).eval()
    >>> rope = patch(model, {"name": "linear", "factor": 4})
    >>> model.model.rotary_emb.inv_freq[0].item()
    0.25
    >>> rope.restore()
    >>> model.model.rotary_emb.inv_freq[0].item()
    1.0
    """
    return RopePatch(model, scaling, original_max_position, slots, every)
