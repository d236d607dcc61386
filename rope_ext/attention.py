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
Self-Extend, :mod:`rope_ext.assembled`), and otherwise calls the original function with the rest untouched. Forward pre-hooks on the modules that take
``position_embeddings`` remember each layer's (cos, sin): that undoes the rotation for a capture and tells
which rotary slot a layer uses (Gemma-3: sliding or global). Removing the last hook puts the config
attribute back exactly and removes the pre-hooks.

A model whose attention does not go through the interface (GPT-NeoX-Japanese; before transformers 5.25 also Falcon,
GPT-J and CodeGen) cannot be hooked; :func:`probe` tells so from a forward of a ``meta``-device instance, before any
weight is loaded. Position embeddings passed as (sin, cos) -- GPT-J's and CodeGen's split of their table -- are
recognised (:func:`_sin_first`) and handed on as (cos, sin).
"""

from __future__ import annotations

import functools
import inspect
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from .slots import RotarySlot, find_rotary_slots
from .registry import ScalingError

if TYPE_CHECKING:
    from torch import nn
    import torch

WRAPPER_PREFIX = "rope_ext_"


class AttentionHookError(ScalingError):
    """The model's attention cannot be hooked (it does not call transformers' AttentionInterface)."""


def text_config(model: nn.Module):
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


@dataclass
class AttentionCall:
    """One call of a hooked attention function."""

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
        self._required = {}
        self.sin_first, self.complex_rotation = {}, set()
        self._calls, self.most_calls = {}, {}
        _INSTALLED.pop(id(self.config), None)

    def _remember(self, signature, module, args, kwargs):
        self._calls[id(module)] = 0  # a forward of the module starts: its interface calls counted anew
        rotation = kwargs.get("position_embeddings")
        if rotation is None and args:
            rotation = signature.bind_partial(None, *args, **kwargs).arguments.get("position_embeddings")
        if rotation is None:  # this call holds none (a NoPE layer type: Beam's)
            self._rotations.pop(id(module), None)
        if rotation is not None:
            self._rotations[id(module)] = rotation
            if self.replacement is not None and self.calibrating is None:  # what rotary_layout calls the module with
                hidden = args[0] if args else kwargs.get("hidden_states")
                if hidden is not None and hidden.ndim == 3:
                    self._inputs[id(module)] = hidden[:1, :4].detach().clone()
                    if id(module) not in self.layouts:  # kept only until its layout is read (rotary_layout)
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
        positions = _positions(query, key, kwargs.get("position_ids"))
        rotation = self._rotations.get(id(module))
        if rotation is not None and not isinstance(rotation, (tuple, list)) and rotation.is_complex():
            # one complex tensor, cos + i sin per frequency (Llama-4's and DeepSeek-V2's freqs_cis): one column each
            self.complex_rotation.add(id(module))
            rotation = (rotation.real, rotation.imag)
        if rotation is not None and id(module) not in self.sin_first:
            found = _sin_first(rotation, positions, self)
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


def frequency_columns(width: int, pairs: int) -> tuple[slice, ...]:
    """The selections of a cos (or sin) ``width`` columns wide that may carry frequency i of ``pairs``: the first half
    (rotate_half) or every other column (interleaved) when it holds two per pair, all of it when it holds one per
    frequency (GPT-J's table, cos + i sin), none otherwise."""
    if width == 2 * pairs:
        return (slice(0, pairs), slice(0, None, 2))
    return (slice(None),) if width == pairs else ()


SIN_FIRST_POSITIONS = 256  # the first positions of a call that decide the order (cheap at 128k tokens)


def _sin_first(rotation: tuple, positions: torch.Tensor, hooks: "AttentionHooks") -> bool | None:
    """Whether a module's position embeddings are (sin, cos) rather than (cos, sin) (GPT-J and CodeGen split their
    table so): (c, s) = f (cos, sin)(p theta) satisfies c sin(p theta) = s cos(p theta) at every position p, for the
    frequencies of one of the model's rotary slots; the order that fits it better is the module's. None when this
    call cannot tell (one complex tensor: DeepSeek-V2's freqs_cis; meta tensors; no slot of its width)."""
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


def _positions(query: torch.Tensor, key: torch.Tensor, position_ids: torch.Tensor | None) -> torch.Tensor:
    """(batch, q_len) query positions: the call's position_ids, else the last q_len of the key positions."""
    import torch

    batch, q_len = query.shape[0], query.shape[-2]
    if position_ids is not None:
        if position_ids.ndim == 3:  # multimodal rotary (t, h, w): the text positions
            position_ids = position_ids[0]
        if position_ids.shape[-1] == q_len:
            return position_ids.expand(batch, q_len)
    k_len = key.shape[-2]
    return torch.arange(k_len - q_len, k_len, device=query.device).expand(batch, q_len)


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
    ``(attn_output (batch, q_len, heads, head_dim), None)`` or None to call the original function."""
    return attention_hooks(model).add(fn, transform, replace)


# -- capture -----------------------------------------------------------------------------------------------


@dataclass
class CapturedLayer:
    """One attention layer's query and key as RoPE received them (after any q/k norm), with what RoPE did."""

    layer: int | None
    name: str
    query: torch.Tensor  # (batch, heads, n, head_dim), float32, rotation undone (and the attention factor)
    key: torch.Tensor  # (batch, kv_heads, n, head_dim)
    pairs: tuple[torch.Tensor, torch.Tensor]  # dims (a_i, b_i) of rotary pair i: rotate_half or interleaved
    inv_freq: torch.Tensor  # (d_rot/2,) the frequencies the layer's slot applied
    attention_factor: float  # the factor on cos/sin (YaRN's temperature; 1 unscaled)
    slot: RotarySlot | None
    positions: torch.Tensor  # (batch, n)
    scaling: float | None  # the softmax scale the module uses
    call: AttentionCall = field(repr=False, default=None)


def pair_layout(cos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary pair dims from the layer's cos: (i, i + r/2) for rotate_half (cos = [f, f]), (2i, 2i+1) for
    interleaved (cos repeats each frequency); rotate_half when both fit (only position 0 seen)."""
    import torch

    r = cos.shape[-1]
    half = torch.arange(r // 2, device=cos.device)
    if torch.equal(cos[..., : r // 2], cos[..., r // 2 :]):
        return half, half + r // 2
    if torch.equal(cos[..., 0::2], cos[..., 1::2]):
        return 2 * half, 2 * half + 1
    raise AttentionHookError(f"cos of width {r} is neither rotate_half nor interleaved: cannot tell the rotary pairs")


def unrotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pairs) -> torch.Tensor:
    """x (batch, heads, n, d) as it was before ``x * cos + rotate(x) * sin``: per pair, the inverse rotation
    divided by cos^2 + sin^2 (the attention factor squared). Dims beyond the rotary width pass through."""
    a, b = pairs
    c = cos.float()[..., a].unsqueeze(1)  # (batch, 1, n, r/2)
    s = sin.float()[..., a].unsqueeze(1)
    x = x.float()
    xa, xb = x[..., a], x[..., b]
    norm = c * c + s * s
    out = x.clone()
    out[..., a] = (xa * c + xb * s) / norm
    out[..., b] = (xb * c - xa * s) / norm
    return out


def rotate(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, pairs, attention_factor: float = 1.0):
    """x (batch, heads, n, d) rotated by RoPE at ``positions`` (batch, n) with ``inv_freq``, pair layout ``pairs``."""
    a, b = pairs
    angle = positions.to(x.device).double()[..., None] * inv_freq.to(x.device).double()  # (batch, n, r/2)
    c = (angle.cos() * attention_factor).unsqueeze(1)
    s = (angle.sin() * attention_factor).unsqueeze(1)
    x = x.double()
    out = x.clone()
    out[..., a] = x[..., a] * c - x[..., b] * s
    out[..., b] = x[..., b] * c + x[..., a] * s
    return out


def capture(model: nn.Module, on_layer: Callable[[CapturedLayer], None]) -> Handle:
    """Observe every attention layer: ``on_layer`` gets its query and key with the rotation undone, the pair
    layout and the frequencies applied. Run one forward without a KV cache (queries and keys aligned)."""

    def observe(call: AttentionCall) -> None:
        if call.rotation is None:
            raise AttentionHookError(
                f"{call.name} ({type(call.module).__name__}) receives no position_embeddings: "
                "its rotation cannot be undone"
            )
        if call.key.shape[-2] != call.query.shape[-2]:
            raise AttentionHookError("capture needs one forward without a KV cache (query and key lengths differ)")
        cos, sin = call.rotation
        pairs = pair_layout(cos)
        slot = call.slot()
        if slot is None:
            raise AttentionHookError(f"{call.name}: no rotary slot of the model reproduces its cos")
        inv_freq, factor = slot.frequencies(model)
        inv_freq = inv_freq.detach().float().cpu()
        on_layer(
            CapturedLayer(
                call.layer,
                call.name,
                unrotate(call.query, cos, sin, pairs),
                unrotate(call.key, cos, sin, pairs),
                pairs,
                inv_freq,
                factor,
                slot,
                call.positions,
                call.scaling,
                call,
            )
        )

    return hook_attention(model, observe)


# -- probe -------------------------------------------------------------------------------------------------


@dataclass
class Probe:
    """What a hooked forward saw: the attention modules that called the interface, with positions and rotations."""

    layers: int  # the config's num_hidden_layers
    called: list[str]
    with_rotation: list[str]
    with_position_ids: list[str]
    repeated: dict = field(default_factory=dict)  # {layer: interface calls in one of its forwards}, those with > 1
    with_sinks: list = field(default_factory=list)  # layers given attention sinks (s_aux, sinks)

    def attention_refusal(self) -> str | None:
        """Why an attention-level method (its layout probe, its re-assembled attention) cannot run on this model, in
        one line that reads after "in model X", or None: what a run checks before it loads weights and ``python -m
        evals.models`` reports, so that no refusal waits for the first forward."""
        missing = [name for name in self.called if name not in self.with_rotation]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            return f"{missing[0]}{more} receives no position_embeddings to re-rotate its query and key"
        if self.repeated:
            name, count = next(iter(self.repeated.items()))
            return (
                f"{name} makes {count} attention calls per forward (differential attention): an attention-level "
                "method re-assembles one"
            )
        if self.with_sinks:
            return f"{self.with_sinks[0]} is given attention sinks, which attention-level methods do not support"
        return None


def _attention_class(model: nn.Module) -> str:
    names = [type(m).__name__ for m in model.modules() if "attention" in type(m).__name__.lower()]
    return names[0] if names else "its attention"


def probe(model: nn.Module, tokens: int = 4) -> Probe:
    """A ``tokens``-long forward of ``model`` (a ``meta``-device instance is enough) with an observer attached;
    raises AttentionHookError (one line, naming the classes) when no attention layer calls the hook."""
    import torch

    called, rotated, positioned, sinks = {}, set(), set(), {}

    def observe(call: AttentionCall) -> None:
        called[call.name] = None
        if any(call.kwargs.get(name) is not None for name in ("s_aux", "sinks")):
            sinks[call.name] = None
        if call.rotation is not None:
            rotated.add(call.name)
        if "position_ids" in call.kwargs:
            positioned.add(call.name)

    parameter = next(model.parameters(), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    dtypes = [parameter.dtype if parameter is not None else torch.float32]
    if device.type == "meta" and torch.bfloat16 not in dtypes:
        # some kernels' meta implementations take bf16 only (torch._grouped_mm in MoE experts): a meta instance
        # built in float32 for a bf16 checkpoint is probed in bf16 (free on meta), then put back
        dtypes.append(torch.bfloat16)
    failure = None
    for dtype in dtypes:
        called.clear()
        try:
            if dtype != dtypes[0]:
                model.to(dtype)
            with hook_attention(model, observe) as handle, torch.no_grad():
                # with a cache (the default): no packed-sequence check, which reads values a meta tensor lacks
                model(input_ids=torch.zeros(1, tokens, dtype=torch.long, device=device))
                hooks = handle.hooks
                repeated = {hooks._names.get(i, "?"): n for i, n in hooks.most_calls.items() if n > 1}
            failure = None
            break
        except AttentionHookError:
            raise
        except Exception as err:
            failure = failure or err
        finally:
            if dtype != dtypes[0]:
                model.to(dtypes[0])
    if failure is not None:
        raise AttentionHookError(
            f"{type(model).__name__}: a {tokens}-token forward of the model fails on {device.type} "
            f"({type(failure).__name__}: {str(failure).splitlines()[0][:160] if str(failure) else ''})"
        ) from None
    layers = int(getattr(text_config(model), "num_hidden_layers", 0) or 0)
    if not called:
        raise AttentionHookError(
            f"{type(model).__name__}: its attention ({_attention_class(model)}) does not call transformers' "
            "AttentionInterface, so rope_ext cannot hook where RoPE meets attention; models whose attention does: "
            "Llama/SmolLM2, Qwen2/3, Gemma-3, GPT-NeoX, Mistral, Phi-3"
        )
    return Probe(layers, list(called), sorted(rotated), sorted(positioned), repeated, list(sinks))
