"""Captures and probes built on the attention hook (:mod:`rope_ext.attention.hook`): a layer's query and key with
RoPE's rotation undone (:func:`capture`, for studies of a model's own q and k), the rotation applied again
(:func:`rotate`), and :func:`probe`, which tells from a forward of a ``meta``-device instance whether a model's attention
can be hooked at all, before any weight is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from .hook import AttentionCall, AttentionHookError, Handle, hook_attention, text_config

if TYPE_CHECKING:
    from torch import nn
    import torch

    from ..rotary.slot import RotarySlot

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
    layout and the frequencies applied. Run one forward without a KV cache (queries and keys aligned). Args:
    ``model`` a transformers model, ``on_layer`` a function of a ``CapturedLayer`` (layer, name, query and key
    (batch, heads, n, head_dim) float32 unrotated, pairs, inv_freq, attention_factor, slot, positions, scaling).
    Returns a handle (``remove()``, or a ``with`` block). Raises AttentionHookError (one line) during the forward
    when a layer receives no rotation, has a KV cache, or no rotary slot reproduces its cos.

    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
    ...     num_key_value_heads=1, vocab_size=64, max_position_embeddings=64)
    >>> model = LlamaForCausalLM(config).eval()
    >>> layers = []
    >>> with capture(model, layers.append):
    ...     _ = model(torch.zeros(1, 3, dtype=torch.long))
    >>> layers[0].layer, tuple(layers[0].query.shape), tuple(layers[0].inv_freq.shape)
    (0, (1, 2, 3, 16), (8,))
    """

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
            return f"{missing[0]}{more} receives no position_embeddings to re-rotate its query and key (a (cos, sin) pair or one complex tensor)"
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
    raises AttentionHookError (one line, naming the classes) when no attention layer calls the hook. Args:
    ``model``, ``tokens`` the forward's length. Returns a ``Probe``: ``layers`` (the config's layer count),
    ``called``, ``with_rotation``, ``with_position_ids`` (the attention modules' names).

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
    ...     num_key_value_heads=1, vocab_size=64, max_position_embeddings=64)
    >>> model = LlamaForCausalLM(config).eval()
    >>> seen = probe(model)
    >>> seen.layers, seen.called, seen.with_rotation
    (1, ['model.layers.0.self_attn'], ['model.layers.0.self_attn'])
    """
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
