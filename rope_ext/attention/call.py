"""An attention-level method applied to one attention call, recomputing attention as the model's own function would.

The hook (:mod:`rope_ext.attention.hook`) hands over the query and key as the module rotated them. To re-rotate them
(:mod:`rope_ext.attention.assembled`), the method must know exactly which dims the module's RoPE rotated, in which pairs and
at which frequency -- the layouts differ by family: every dim (Llama), the leading dims (partial rotary: GPT-NeoX,
Phi-3), a rope sub-dimension after the no-position dims (multi-head latent attention, DeepSeek-V2 arXiv 2405.04434:
DeepSeek-V3, MiniCPM3, GLM-4-MoE-Lite, ...), interleaved pairs whose cos is laid out as rotate_half's (DeepSeek's
``rope_interleave``). :func:`rotary_layout` reads it from the module itself: it calls the module on a few tokens of
its own hidden states three times with made-up rotations (identity; a quarter turn, which moves each rotated dim
onto its partner; one distinct angle per frequency, which names the frequency of each pair) and records the q and
k the module hands to attention. No per-model code; a module whose q/k do not follow one rotation (a norm after
RoPE, say) is refused in one line.

:func:`assemble_call` then applies the rule as the original attention function would: the value head may differ
from the query/key head (MLA), the sliding window and logit soft-capping are applied where the model's function
applies them (eager and sdpa read the window from the mask, and sdpa ignores soft-capping; flash kernels take both
as arguments), attention sinks are refused.
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import MutableMapping, MutableSequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .assembled import _causal, assemble
from .hook import AttentionHookError, _takes_position_embeddings, last_query_slot
from .capture import pair_layout

if TYPE_CHECKING:
    import torch

    from .hook import AttentionCall
    from ..strategies.position_rule import PositionRule

MASK_CARRIES_WINDOW = ("eager", "sdpa")  # the original functions that take the sliding window from the mask only


@dataclass(frozen=True)
class RotaryLayout:
    """The rotary pairs of a layer's query and key: dims ``a[i]``, ``b[i]`` rotated by frequency ``freq[i]``
    (an index into the slot's inv_freq) as ``(x_a cos - x_b sin, x_b cos + x_a sin)``."""

    a: torch.Tensor
    b: torch.Tensor
    freq: torch.Tensor

    @property
    def pairs(self) -> tuple:
        return self.a, self.b


def _pairs(x: torch.Tensor, quarter: torch.Tensor, turned: torch.Tensor, angles: torch.Tensor, what: str):
    """(a, b, freq) from the module's q (or k) under the identity, a quarter turn and ``angles`` per frequency."""
    import torch

    d = x.shape[-1]
    x, quarter, turned = (t.double().reshape(-1, d) for t in (x, quarter, turned))
    moved = (x != quarter).any(0).nonzero().flatten()
    width = 2 * len(angles)
    if len(moved) == 0:  # the module does not rotate this (a layer without RoPE, SmolLM3's NoPE layers)
        return None
    if len(moved) != width:
        raise ValueError(f"{len(moved)} of its {what} dims moved under a rotation of width {width}")
    scale = float(x.abs().max()) or 1.0
    xm, qm = x[:, moved], quarter[:, moved]
    # a quarter turn: q_a -> -x_b, q_b -> x_a
    negated = (qm[:, :, None] + xm[:, None, :]).abs().amax(0) <= 1e-6 * scale  # [j, i]: q_j == -x_i
    copied = (qm[:, :, None] - xm[:, None, :]).abs().amax(0) <= 1e-6 * scale
    first = negated.any(1).nonzero().flatten()
    if len(first) != width // 2 or not bool(copied.any(1).sum() == width // 2):
        raise ValueError(f"its {what} dims do not move in pairs under a quarter turn")
    a = moved[first]
    b = moved[negated[first].float().argmax(1)]
    xa, xb, za, zb = x[:, a], x[:, b], turned[:, a], turned[:, b]
    seen = torch.atan2((xa * zb - xb * za).sum(0), (xa * za + xb * zb).sum(0))  # the angle each pair turned
    error = (seen[:, None] - angles.double()[None, :].to(seen.device)).abs()
    freq = error.argmin(1)
    spacing = float(angles[1] - angles[0]) if len(angles) > 1 else 1.0
    if bool((error.min(1).values > spacing / 3).any()) or len(set(freq.tolist())) != len(angles):
        raise ValueError(f"its {what} pairs do not turn by one frequency each")
    return a, b, freq


def _causal_mask(hidden: torch.Tensor) -> torch.Tensor:
    """(1, 1, n, n) additive causal mask for ``hidden`` (batch, n, ...): 0 where a query sees a key, else the minimum."""
    import torch

    n = hidden.shape[1]
    dtype = hidden.dtype if hidden.is_floating_point() else torch.float32
    sees = _causal(n, hidden.device)  # rope_ext.attention.assembled's lower triangle
    return torch.zeros(1, 1, n, n, dtype=dtype, device=hidden.device).masked_fill(~sees, torch.finfo(dtype).min)


def rotary_layout(call: AttentionCall) -> RotaryLayout | None:
    """The layer's rotary layout, read once per module by calling it with made-up rotations (see the module doc);
    None when the module rotates neither its query nor its key (a layer without RoPE)."""
    import torch

    hooks, module = call.hooks, call.module
    if id(module) in hooks.layouts:
        return hooks.layouts[id(module)]
    cos = call.rotation[0]
    r = cos.shape[-1]
    try:
        ca, cb = pair_layout(cos)  # the columns of cos/sin that carry frequency i
        half = r // 2
    except AttentionHookError:  # one column per frequency (GPT-J, CodeGen: the module spreads it over a pair)
        ca = cb = torch.arange(r, device=cos.device)
        half = r
    hidden = hooks._inputs.get(id(module))
    signature = _takes_position_embeddings(type(module))
    angles = -math.pi + 2 * math.pi * (torch.arange(half, dtype=torch.float64) + 1) / (half + 1)

    def rotation(phi: torch.Tensor):
        c = torch.empty(r, dtype=torch.float64)
        s = torch.empty(r, dtype=torch.float64)
        c[ca.cpu()], c[cb.cpu()], s[ca.cpu()], s[cb.cpu()] = phi.cos(), phi.cos(), phi.sin(), phi.sin()
        shape = (1,) * (cos.ndim - 2) + (hidden.shape[1], r)
        order = (s, c) if hooks.sin_first.get(id(module)) else (c, s)  # as the module takes them
        found = tuple(t.to(cos.device, cos.dtype).expand(shape).contiguous() for t in order)
        return torch.complex(*found) if id(module) in hooks.complex_rotation else found

    if hidden is None or signature is None:
        raise AttentionHookError(f"{call.name} ({type(module).__name__}): its hidden states were not seen")
    extra = {}
    if "attention_mask" in signature.parameters:
        required = signature.parameters["attention_mask"].default is inspect.Parameter.empty
        # None where the module takes it; a causal additive mask where it must have one (a sparse-attention indexer
        # masks its key scores with it: DeepSeek-V3.2's DSA)
        extra["attention_mask"] = _causal_mask(hidden) if required else None
    position_ids = signature.parameters.get("position_ids")
    if position_ids is not None and position_ids.default is inspect.Parameter.empty:  # Ministral-3's query temperature
        extra["position_ids"] = torch.arange(hidden.shape[1], device=hidden.device)[None]
    # any other required argument as the module was given it, a container copied so the probe writes nothing back
    # (Gemma-4's shared_kv_states: a layer stores its keys there for the layers that share them)
    for name, value in hooks._required.pop(id(module), {}).items():  # not held past this probe (a KV store)
        extra[name] = copy.copy(value) if isinstance(value, (MutableMapping, MutableSequence)) else value
    saved = hooks._rotations.get(id(module))
    hooks.calibrating = records = []
    try:
        with torch.no_grad():
            for phi in (
                torch.zeros(half, dtype=torch.float64),
                torch.full((half,), math.pi / 2, dtype=torch.float64),
                angles,
            ):
                module(hidden, position_embeddings=rotation(phi), **extra)
        if len(records) != 3:
            raise ValueError(f"{len(records) // 3 or len(records)} attention calls per forward")
        query = _pairs(records[0][0], records[1][0], records[2][0], angles, "query")
        key = _pairs(records[0][1], records[1][1], records[2][1], angles, "key")
        if query is None and key is None:
            hooks.layouts[id(module)] = None
            return None
        if query is not None and key is None:
            raise ValueError("its key does not turn with its own position embeddings (keys shared from another layer)")
        if query is None or key is None or not all(torch.equal(x, y) for x, y in zip(query, key)):
            raise ValueError("its query and key are rotated in different layouts")
        a, b, freq = query
    except Exception as err:
        raise AttentionHookError(
            f"{call.name} ({type(module).__name__}): cannot tell which dims of its query and key RoPE rotates "
            f"({str(err).splitlines()[0][:160] if str(err) else type(err).__name__})"
        ) from None
    finally:
        hooks.calibrating = None
        if saved is not None:
            hooks._rotations[id(module)] = saved
    device = call.query.device
    found = hooks.layouts[id(module)] = RotaryLayout(a.to(device), b.to(device), freq.to(device))
    return found


def assemble_call(rule: PositionRule, call: AttentionCall, label: str, model) -> tuple | None:
    """The attention function's output ``(attn_output (batch, q_len, heads, v_dim), None)`` of ``rule`` for this
    call, or None where the rule changes nothing (the model's own function runs)."""
    import torch

    k_len = call.key.shape[-2]
    query_positions = call.positions
    # key i is at the last query's position - (the last query's slot - i): a static cache's buffer runs past the last
    # query (its unfilled slots, masked, fall after it and are never attended); a dynamic cache ends at it
    last = last_query_slot(call.query, call.key, call.position_mask, call.implementation).to(query_positions.device)
    key_positions = query_positions[:, -1:] - last[:, None] + torch.arange(k_len, device=query_positions.device)
    first, last = int(query_positions.min()), int(query_positions.max())
    if rule.identity_for(first, last, last - int(key_positions.min())):
        return None
    for unsupported in ("s_aux", "sinks"):
        if call.kwargs.get(unsupported) is not None:
            raise AttentionHookError(
                f"{call.name}: attention sinks ({unsupported}) are not supported by attention-level scaling '{label}'"
            )
    if call.rotation is None:
        if _takes_position_embeddings(type(call.module)) is not None:  # given none: a layer without RoPE (Beam's NoPE)
            return None
        raise AttentionHookError(
            f"{call.name} ({type(call.module).__name__}) receives no position_embeddings: "
            f"scaling '{label}' cannot re-rotate its query and key"
        )
    if not isinstance(call.rotation, (tuple, list)) or len(call.rotation) != 2:
        raise AttentionHookError(
            f"{call.name} ({type(call.module).__name__}) receives its rotation as one real tensor, not (cos, sin) nor "
            f"cos + i sin: scaling '{label}' cannot re-rotate its query and key"
        )
    layout = rotary_layout(call)
    if layout is None:  # no RoPE in this layer: no position to change, the model's own attention runs
        return None
    inv_freq, _ = call.slot().frequencies(model)
    inv_freq = inv_freq.to(call.query.device)[layout.freq]
    scale = call.scaling if call.scaling is not None else call.query.shape[-1] ** -0.5
    own_mask = call.implementation in MASK_CARRIES_WINDOW
    softcap = call.kwargs.get("softcap") if call.implementation != "sdpa" else None  # sdpa has no soft-capping
    out = assemble(
        rule,
        call.query,
        call.key,
        call.value,
        query_positions,
        key_positions,
        inv_freq,
        layout.pairs,
        scale,
        call.attention_mask,
        None if own_mask else call.kwargs.get("sliding_window"),
        softcap,
    )
    return out.transpose(1, 2).contiguous(), None


def require_hooked(model, label: str) -> None:
    """Raise (one line) when attention-level scaling ``label`` would leave ``model`` unchanged: no attention layer
    calls transformers' AttentionInterface, or none receives the rotation the method re-rotates."""
    from .capture import probe

    found = probe(model)
    if not found.with_rotation:
        raise AttentionHookError(
            f"{type(model).__name__}: scaling '{label}' would change nothing: none of its attention layers "
            f"({found.called[0]} and {len(found.called) - 1} more) receives position_embeddings it can re-rotate: a (cos, sin) pair or one complex tensor"
        )
