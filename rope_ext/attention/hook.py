"""One hook where RoPE meets attention: every attention call of a transformers model, with its query and
key exactly as the rotary embedding left them.

transformers 5 attention modules (Llama/SmolLM2, Qwen2/3, Gemma-3, GPT-NeoX, Mistral, Phi-3, ...) project
q and k, apply any q/k norm and RoPE, and then call the attention function registered under
``config._attn_implementation`` in ``transformers.AttentionInterface`` (sdpa, eager, flash, flex) with
``position_ids`` among its keyword arguments. rope_ext registers one wrapper per implementation
(``rope_ext_<implementation>``, with the original's mask function, so masks and flash/sdpa checks are
unchanged) and points the model's text config at it while hooks are attached. The wrapper passes each call
to the model's *observers* (they see the rotated q and k: :func:`capture`) and then to its *query
transforms* (they may return a scaled query: query-scaling strategies such as ``logn``), then to its one
*replacement*, if any (it may return the attention output itself: attention-level strategies such as
Self-Extend, :mod:`rope_ext.attention.assembled`), and otherwise calls the original function with the rest untouched. Forward pre-hooks on the modules that take
``position_embeddings`` remember each layer's (cos, sin): that undoes the rotation for a capture and tells
which rotary slot a layer uses (Gemma-3: sliding or global), and keep (weakly) the mask each was given: a module
may take keys out of it before the call (a sparse-attention indexer), so the keys' positions are read from it. Removing the last hook puts the config
attribute back exactly and removes the pre-hooks.

A model whose attention does not go through the interface (GPT-NeoX-Japanese; before transformers 5.25 also Falcon,
GPT-J and CodeGen) cannot be hooked; :func:`probe` tells so from a forward of a ``meta``-device instance, before any
weight is loaded. Position embeddings passed as (sin, cos) -- GPT-J's and CodeGen's split of their table -- are
recognised (:func:`rope_ext.attention.layout.sin_first`) and handed on as (cos, sin).
"""

from __future__ import annotations

import functools
import inspect
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from ..rotary.find import find_rotary_slots
from .layout import frequency_columns, sin_first
from ..rotary.slot import RotarySlot
from ..strategies.registry import ScalingError

if TYPE_CHECKING:
    from torch import nn
    import torch

WRAPPER_PREFIX = "rope_ext_"


class AttentionHookError(ScalingError):
    """The model's attention cannot be hooked (it does not call transformers' AttentionInterface), or a hook cannot
    do what it was asked on a call. Args: the one-line message. A :class:`ScalingError`.

    >>> import torch
    >>> from rope_ext import capture
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
    ...     num_key_value_heads=1, vocab_size=64, max_position_embeddings=64)
    >>> model = LlamaForCausalLM(config).eval()
    >>> cache = model(torch.zeros(1, 3, dtype=torch.long), use_cache=True).cache
    >>> with capture(model, print):
    ...     _ = model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
    Traceback (most recent call last):
    ...
    rope_ext.attention.hook.AttentionHookError: capture needs one forward without a KV cache (query and key lengths differ)
    """


def text_config(model: nn.Module):
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


@dataclass
class AttentionCall:
    """One call of a hooked attention function, what :func:`hook_attention`'s function gets: the module, its name
    and layer, the query, key and value as the function received them, the mask, the query positions, the call's
    keyword arguments and the (cos, sin) the module received. Built by the hook, not by hand; raises nothing.

    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
    ...     num_key_value_heads=1, vocab_size=64, max_position_embeddings=64)
    >>> model = LlamaForCausalLM(config).eval()
    >>> calls = []
    >>> with hook_attention(model, calls.append):
    ...     _ = model(torch.zeros(1, 3, dtype=torch.long))
    >>> call = calls[0]
    >>> call.name, call.layer, tuple(call.query.shape), call.positions.tolist()
    ('model.layers.0.self_attn', 0, (1, 2, 3, 16), [[0, 1, 2]])
    """

    module: nn.Module  # the attention module
    name: str  # its qualified name in the model
    layer: int | None  # its ``layer_idx``
    query: torch.Tensor  # (batch, heads, q_len, head_dim) after q/k norm and RoPE
    key: torch.Tensor  # (batch, kv_heads, k_len, head_dim) likewise (with a KV cache: every cached key)
    value: torch.Tensor
    attention_mask: torch.Tensor | None
    positions: torch.Tensor  # (batch, q_len) 0-based query positions
    kwargs: dict  # the keyword arguments of the call (scaling, sliding_window, ...)
    rotation: tuple | None  # the (cos, sin) the module received, None when it takes no position_embeddings
    hooks: "AttentionHooks" = field(repr=False, default=None)
    implementation: str = "eager"  # the attention function the model asked for (sdpa, eager, flash_attention_2, ...)
    # the mask that tells where the keys are (last_query_slot): the one the module was given where the call's is that
    # mask with keys taken out by the module (a sparse-attention indexer's selection), else the call's own
    position_mask: object = field(repr=False, default=None)

    @property
    def scaling(self) -> float | None:
        return self.kwargs.get("scaling")

    def slot(self) -> RotarySlot | None:
        """The rotary slot whose frequencies this layer's (cos, sin) were computed from."""
        return self.hooks.slot_of(self)


_INSTALLED: dict[int, "AttentionHooks"] = {}  # id(text config) -> the hooks of the model using it


def _original_function(implementation: str, module: nn.Module) -> Callable:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if implementation == "eager":  # each modeling file has its own eager function (softcapping, sinks, ...)
        function = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if function is None:
            raise AttentionHookError(
                f"{type(module).__name__}: no eager_attention_forward in {type(module).__module__}"
            )
        return function
    return ALL_ATTENTION_FUNCTIONS[implementation]


def _dispatch(implementation: str, module, query, key, value, attention_mask, *args, **kwargs):
    hooks = _INSTALLED.get(id(getattr(module, "config", None)))
    if hooks is not None:
        query, output = hooks.run(module, query, key, value, attention_mask, kwargs, implementation)
        if output is not None:
            return output
    return _original_function(implementation, module)(module, query, key, value, attention_mask, *args, **kwargs)


def wrapper_name(implementation: str | None) -> str:
    """The registered wrapper around ``implementation`` (registered once per process)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    implementation = implementation or "eager"
    name = WRAPPER_PREFIX + implementation
    if name not in ALL_ATTENTION_FUNCTIONS:
        if implementation != "eager" and implementation not in ALL_ATTENTION_FUNCTIONS:
            raise AttentionHookError(
                f"attention implementation {implementation!r} is not in transformers' AttentionInterface"
            )
        if implementation not in ALL_MASK_ATTENTION_FUNCTIONS:
            raise AttentionHookError(f"attention implementation {implementation!r} has no mask function to keep")
        AttentionInterface.register(name, functools.partial(_dispatch, implementation))
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[implementation])
    return name


@functools.lru_cache(maxsize=None)
def _takes_position_embeddings(cls: type) -> inspect.Signature | None:
    try:
        signature = inspect.signature(cls.forward)
    except (TypeError, ValueError):
        return None
    return signature if "position_embeddings" in signature.parameters else None


STANDARD_ARGUMENTS = ("self", "hidden_states", "position_embeddings", "attention_mask", "position_ids")


def _required_others(signature: inspect.Signature) -> list[str]:
    """The module's required parameters beyond the standard ones (Gemma-4's ``shared_kv_states``)."""
    return [
        name
        for name, parameter in signature.parameters.items()
        if name not in STANDARD_ARGUMENTS
        and parameter.default is inspect.Parameter.empty
        and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    ]


class Handle:
    """A hook attached to a model; ``remove()`` (or leaving the ``with`` block) detaches it."""

    def __init__(self, hooks: "AttentionHooks", fn: Callable):
        self.hooks, self.fn = hooks, fn

    def remove(self) -> None:
        self.hooks.remove(self.fn)

    def __enter__(self) -> "Handle":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


class AttentionHooks:
    """The observers and query transforms attached to one model (one per text config)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.config = text_config(model)
        self.observers: list[Callable] = []
        self.transforms: list[Callable] = []
        self.replacement: Callable | None = None
        self._rotations: dict[int, tuple] = {}
        self._slot_cache: dict[int, RotarySlot | None] = {}  # id(attention module) -> its slot
        self._pre_hooks: list = []
        self._names: dict[int, str] = {}
        self._slots: list[RotarySlot] | None = None
        self._saved = None
        self._inputs: dict[int, torch.Tensor] = {}  # id(attention module) -> a few tokens of its last hidden states
        self._required: dict[int, dict] = {}  # id(attention module) -> the other required arguments it was given
        self._given_masks: dict[int, Callable] = {}  # id(attention module) -> a weak reference to the mask it was given
        self.calibrating: list | None = None  # set by rope_ext.rotary_layout: record calls, skip attention
        self.layouts: dict = {}  # rope_ext.rotary_layout's findings, per attention module
        self.sin_first: dict[int, bool] = {}  # id(attention module) -> it receives (sin, cos) (GPT-J, CodeGen)
        self.complex_rotation: set[int] = set()  # id(attention module) it receives cos + i sin (Llama-4, DeepSeek-V2)
        self._calls: dict[int, int] = {}  # id(attention module) -> interface calls in its current forward
        self.most_calls: dict[int, int] = {}  # id(attention module) -> the most interface calls in one of its forwards

    # -- attaching -----------------------------------------------------------------------------------------
    def add(self, fn: Callable, transform: bool = False, replace: bool = False) -> Handle:
        if replace and self.replacement is not None:
            raise AttentionHookError(
                "this model's attention is already replaced by an attention-level method; apply at most one"
            )
        if not self.observers and not self.transforms and self.replacement is None:
            self._install()
        if replace:
            self.replacement = fn
        else:
            (self.transforms if transform else self.observers).append(fn)
        return Handle(self, fn)

    def remove(self, fn: Callable) -> None:
        for chain in (self.observers, self.transforms):
            if fn in chain:
                chain.remove(fn)
        if self.replacement is fn:
            self.replacement = None
        if not self.observers and not self.transforms and self.replacement is None and self._saved is not None:
            self._uninstall()

    def _install(self) -> None:
        if id(self.config) in _INSTALLED:
            raise AttentionHookError("this model's attention is already hooked by another AttentionHooks")
        name = wrapper_name(self.config._attn_implementation)
        # the exact attribute state, restored as it was (absent or set)
        self._saved = (
            "_attn_implementation_internal" in vars(self.config),
            vars(self.config).get("_attn_implementation_internal"),
        )
        self.config._attn_implementation_internal = name
        self._names = {id(m): n for n, m in self.model.named_modules()}
        for module in self.model.modules():
            signature = _takes_position_embeddings(type(module))
            if signature is not None:
                self._pre_hooks.append(
                    module.register_forward_pre_hook(functools.partial(self._remember, signature), with_kwargs=True)
                )
        _INSTALLED[id(self.config)] = self

    def _uninstall(self) -> None:
        had, value = self._saved
        if had:
            self.config._attn_implementation_internal = value
        else:
            del self.config._attn_implementation_internal
        for hook in self._pre_hooks:
            hook.remove()
        self._pre_hooks, self._rotations, self._slot_cache, self._saved, self._inputs = [], {}, {}, None, {}
        self._required, self._given_masks = {}, {}
        self.sin_first, self.complex_rotation = {}, set()
        self._calls, self.most_calls = {}, {}
        _INSTALLED.pop(id(self.config), None)

    def _remember(self, signature, module, args, kwargs):
        self._calls[id(module)] = 0  # a forward of the module starts: its interface calls counted anew
        rotation, mask = kwargs.get("position_embeddings"), kwargs.get("attention_mask")
        if args:
            bound = signature.bind_partial(None, *args, **kwargs).arguments
            rotation, mask = bound.get("position_embeddings"), bound.get("attention_mask")
        if self.calibrating is None:  # weakly: its caller holds it for the forward (a long context's mask not kept)
            self._given_masks[id(module)] = _weak(mask)
        if rotation is None or isinstance(rotation, dict):  # none (a NoPE layer type: Beam's), or one per kind of
            self._rotations.pop(id(module), None)  # layer (DeepSeek-V4's {"main", "compress"}): which one is not read
        else:
            self._rotations[id(module)] = rotation
            if self.replacement is not None and self.calibrating is None:  # what rotary_layout calls the module with
                hidden = args[0] if args else kwargs.get("hidden_states")
                if hidden is not None and hidden.ndim == 3 and id(module) not in self.layouts:
                    # kept only until its layout is read (rotary_layout): the 4 tokens of largest norm, in order --
                    # not the first row's first tokens, which in a left-padded batch are padding (zero hidden
                    # states where the pad embedding is zero: no dim moves, the layer was read as one without RoPE
                    # and the method silently left out for the rest of the session)
                    flat = hidden.detach().reshape(-1, hidden.shape[-1])
                    keep = flat.float().norm(dim=-1).topk(min(4, flat.shape[0])).indices.sort().values
                    self._inputs[id(module)] = flat[keep][None].clone()
                    bound = signature.bind_partial(None, *args, **kwargs).arguments
                    self._required[id(module)] = {
                        name: bound[name] for name in _required_others(signature) if name in bound
                    }

    # -- calls ---------------------------------------------------------------------------------------------
    def run(
        self, module, query, key, value, attention_mask, kwargs, implementation: str = "eager"
    ) -> tuple[torch.Tensor, tuple | None]:
        """The query to use (after the transforms) and the replacement's output (None: call the original)."""
        if self.calibrating is not None:  # a call made by rope_ext.rotary_layout: its q/k, no attention computed
            import torch

            self.calibrating.append((query.detach().clone(), key.detach().clone()))
            shape = (query.shape[0], query.shape[2], query.shape[1], value.shape[-1])
            return query, (torch.zeros(shape, dtype=value.dtype, device=value.device), None)
        if id(module) in self._calls:  # two calls in one forward (DiffLlama's differential attention): see probe()
            count = self._calls[id(module)] = self._calls[id(module)] + 1
            self.most_calls[id(module)] = max(count, self.most_calls.get(id(module), 0))
        given = self._given_masks.get(id(module), _none)()
        position_mask = _position_mask(given, attention_mask)
        positions = _positions(query, key, kwargs.get("position_ids"), position_mask, implementation)
        rotation = self._rotations.get(id(module))
        if rotation is not None and not isinstance(rotation, (tuple, list)) and rotation.is_complex():
            # one complex tensor, cos + i sin per frequency (Llama-4's and DeepSeek-V2's freqs_cis): one column each
            self.complex_rotation.add(id(module))
            rotation = (rotation.real, rotation.imag)
        if rotation is not None and id(module) not in self.sin_first:
            found = sin_first(rotation, positions, self)
            if found is not None:  # kept once told; asked again while this call could not tell
                self.sin_first[id(module)] = found
        if rotation is not None and self.sin_first.get(id(module)):
            rotation = (rotation[1], rotation[0])
        call = AttentionCall(
            module,
            self._names.get(id(module), type(module).__name__),
            getattr(module, "layer_idx", None),
            query,
            key,
            value,
            attention_mask,
            positions,
            kwargs,
            rotation,
            self,
            implementation,
            position_mask,
        )
        for fn in list(self.observers):
            fn(call)
        for fn in list(self.transforms):
            scaled = fn(call)
            if scaled is not None:
                call.query = scaled
        output = self.replacement(call) if self.replacement is not None else None
        return call.query, output

    @property
    def slots(self) -> list[RotarySlot]:
        if self._slots is None:
            self._slots = find_rotary_slots(self.model)
        return self._slots

    def slot_of(self, call: AttentionCall) -> RotarySlot | None:
        """The slot whose current frequencies reproduce the layer's cos (the only slot when there is one)."""
        import torch

        if len(self.slots) == 1:
            return self.slots[0]
        if id(call.module) in self._slot_cache:
            return self._slot_cache[id(call.module)]
        found = None
        if call.rotation is not None and not call.rotation[0].is_meta:
            cos = call.rotation[0].float()
            positions = call.positions.to(cos.device).float()
            errors = []
            for slot in self.slots:
                columns = frequency_columns(cos.shape[-1], slot.width // 2)  # the rotating dim and the still pairs
                if not columns:
                    continue
                inv_freq, scale = slot.frequencies(self.model)
                inv_freq = inv_freq.to(cos.device).float()
                expected = torch.cos(positions[..., None] * inv_freq) * scale
                errors.append((min(float((cos[..., c] - expected).abs().max()) for c in columns), slot))
            if errors:
                found = min(errors, key=lambda e: e[0])[1]
        self._slot_cache[id(call.module)] = found
        return found


def _none():
    return None


def _weak(mask) -> Callable:
    import torch
    import weakref

    return weakref.ref(mask) if isinstance(mask, torch.Tensor) else _none


def _position_mask(given, mask):
    """The mask whose last row tells where the call's keys are (:func:`last_query_slot`): the one the module was
    ``given`` where the call's ``mask`` has its shape -- a module may take keys out of it, its own query's too
    (Qwen4-exp's QSA indexer keeps the top-scoring blocks of 4 keys: a last query whose own block scored low sees keys
    up to 4 slots back, and its keys were read as 4 positions later) -- else the call's (a mask the module built)."""
    import torch

    if isinstance(given, torch.Tensor) and isinstance(mask, torch.Tensor):
        if given.ndim == mask.ndim and given.shape[-2:] == mask.shape[-2:]:
            return given
    return mask


def _positions(
    query: torch.Tensor,
    key: torch.Tensor,
    position_ids: torch.Tensor | None,
    mask=None,
    implementation: str = "eager",
) -> torch.Tensor:
    """(batch, q_len) query positions: the call's position_ids, else the key slots of the queries (the q_len slots
    that end at :func:`last_query_slot`)."""
    import torch

    batch, q_len = query.shape[0], query.shape[-2]
    if position_ids is not None:
        if position_ids.ndim == 3:  # multimodal rotary (t, h, w): the text positions
            position_ids = position_ids[0]
        if position_ids.shape[-1] == q_len:
            return position_ids.expand(batch, q_len)
    # a mask of another kind (a BlockMask): the keys taken to end at the last query, as observers always took them
    last = last_query_slot(query, key, mask if isinstance(mask, torch.Tensor) else None, implementation)
    return (last[:, None] - q_len + 1 + torch.arange(q_len, device=query.device)).expand(batch, q_len)


def last_query_slot(query: torch.Tensor, key: torch.Tensor, mask, implementation: str = "eager") -> torch.Tensor:
    """(batch,) the index among the call's keys of each row's last query (its own key), read as the model's own
    attention function reads it. A cache need not end at the last query: a static cache (``StaticLayer``, the path
    of torch.compile and CUDA graphs) hands attention its whole preallocated buffer, the slots not yet written masked,
    and a sliding-window static layer its window-long buffer until it is full (then rolled: it ends at the last query).
    So: the last key the last query's mask row lets it see (causal: itself; a padding mask, flash attention's, the
    last key written); without a mask, sdpa's ``is_causal`` aligns the queries with the first keys (``is_causal``
    is top-left in torch: a static cache's prefill, whose mask transformers skips), else (decoding one token, a
    dynamic cache, flash attention's bottom-right alignment) the keys end at the last query."""
    import torch

    batch, q_len, k_len = query.shape[0], query.shape[-2], key.shape[-2]
    if mask is None:
        last = q_len - 1 if implementation == "sdpa" and 1 < q_len < k_len else k_len - 1
        return torch.full((batch,), last, dtype=torch.long, device=query.device)
    if not isinstance(mask, torch.Tensor) or mask.ndim not in (2, 4):
        raise AttentionHookError(
            f"an attention mask of type {type(mask).__name__}: cannot tell which cached keys the queries see "
            "(use model.attn_implementation=sdpa or eager)"
        )
    row = mask[..., :k_len] if mask.ndim == 2 else mask[:, :, -1, :k_len]  # (batch, k) or (batch, heads, k)
    sees = row.bool() if row.dtype == torch.bool or mask.ndim == 2 else row > torch.finfo(row.dtype).min / 2
    if sees.ndim == 3:
        sees = sees.any(1)
    index = torch.arange(sees.shape[-1], device=sees.device)
    last = torch.where(sees, index, -1).amax(-1).to(query.device)
    # a row that sees no key (a padded query): its keys end at the last query, as before
    return torch.where(last < 0, k_len - 1, last).expand(batch)


def attention_hooks(model: nn.Module) -> AttentionHooks:
    """The model's hooks (created on first use; shared by the patcher and captures)."""
    return _INSTALLED.get(id(text_config(model))) or AttentionHooks(model)


def hook_attention(
    model: nn.Module,
    fn: Callable[[AttentionCall], "torch.Tensor | None"],
    transform: bool = False,
    replace: bool = False,
) -> Handle:
    """Call ``fn(call)`` at every attention call of ``model``: an observer (``transform=False``), run first
    on the query and key as RoPE left them, a query transform returning the query to use (or None), or with
    ``replace=True`` the one replacement, run last, returning the attention function's output
    ``(attn_output (batch, q_len, heads, head_dim), None)`` or None to call the original function. Args: ``model``
    a transformers model, ``fn`` a function of an :class:`AttentionCall`. Returns a handle: ``remove()`` (or the end
    of a ``with`` block) detaches ``fn``. Raises AttentionHookError when the model's attention takes no hook.

    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
    ...     num_key_value_heads=1, vocab_size=64, max_position_embeddings=64)
    >>> model = LlamaForCausalLM(config).eval()
    >>> seen = []
    >>> with hook_attention(model, lambda call: seen.append(call.name)):
    ...     _ = model(torch.zeros(1, 3, dtype=torch.long))
    >>> seen
    ['model.layers.0.self_attn']
    """
    return attention_hooks(model).add(fn, transform, replace)
