"""What the two ways of assembling attention from a position rule share (the blocks of
:mod:`rope_ext.attention.assembled` and FlexAttention, :mod:`rope_ext.attention.flex`): a piece's query and key rotated
further to the positions the piece gives them (R(p' - p) R(p) = R(p'), RoPE: Su et al. 2021, RoFormer, arXiv
2104.09864), the rule's factors on them, the call's mask per head, and the pieces' partial softmaxes merged by their
log-sum-exp (as flash attention merges blocks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from ..strategies.position_rule import PositionRule


def rerotate(x: torch.Tensor, shift: torch.Tensor, inv_freq: torch.Tensor, pairs) -> torch.Tensor:
    """x (batch, heads, n, d) rotated further by ``shift`` (batch, n) positions: R(shift * theta) per pair."""
    import torch

    a, b = pairs
    angle = shift.to(x.device, torch.float64)[..., None] * inv_freq.to(x.device, torch.float64)  # (batch, n, r/2)
    c = angle.cos().to(x.dtype).unsqueeze(1)
    s = angle.sin().to(x.dtype).unsqueeze(1)
    xa, xb = x[..., a], x[..., b]
    out = x.clone()
    out[..., a] = xa * c - xb * s
    out[..., b] = xb * c + xa * s
    return out


def with_factors(rule: PositionRule, query, key, query_positions, pairs) -> tuple:
    """(query, key) with the rule's factors applied: on each query by its position (ReRoPE's log-n), on the rotary
    dims of both (STRING's cos/sin factor); ``pairs`` as :func:`_pair_index` gives them."""
    if rule.query_scale is not None:  # ReRoPE's log-n, by the query's position
        query = query * rule.query_scale(query_positions).to(query.device, query.dtype)[:, None, :, None]
    if rule.rotary_scale != 1.0:  # a cos/sin factor: the rotary dims of query and key
        query, key = query.clone(), key.clone()
        for x in (query, key):
            x[..., pairs[0]] *= rule.rotary_scale
            x[..., pairs[1]] *= rule.rotary_scale
    return query, key


def _pair_index(pairs) -> tuple:
    """Rotary pair dims as slices where contiguous (rotate_half), else index tensors (interleaved)."""
    import torch

    a, b = pairs
    half, start = len(a), int(a[0]) if len(a) else 0
    if torch.equal(a, torch.arange(start, start + half, device=a.device)) and torch.equal(b, a + half):
        return slice(start, start + half), slice(start + half, start + 2 * half)
    return a, b


def _merge(parts: list) -> torch.Tensor:
    """Softmax partials over disjoint keys merged by their log-sum-exp: sum_i out_i * exp(lse_i - lse)."""
    import torch

    work = torch.promote_types(parts[0][0].dtype, torch.float32)
    if len(parts) == 1:
        return parts[0][0].to(work)
    lse = torch.stack([part_lse.to(work) for _, part_lse in parts])
    total = torch.logsumexp(lse, dim=0)
    weights = torch.exp(lse - total.masked_fill(~total.isfinite(), 0)).nan_to_num(0.0)
    out = parts[0][0].to(work) * weights[0, ..., None]
    for (part, _), weight in zip(parts[1:], weights[1:]):
        out += part.to(work) * weight[..., None]
    return out


def mask_heads(mask, heads: int):
    """The call's mask as (batch, 1, q, k) where every head holds the same (a (batch, k) padding mask, flash
    attention's, included), else (batch, ``heads``, q, k): a mask per key/value head repeated to its query heads."""
    import torch

    if mask is None:
        return None
    if mask.ndim == 2:
        return mask.bool()[:, None, None, :]
    count = mask.shape[1]
    if count == 1 or mask.stride(1) == 0:
        return mask[:, :1]
    first_row = mask[:, :, :1]  # a cheap look first: the full comparison only where the first rows agree
    if torch.equal(first_row[:, 1:], first_row[:, :1].expand_as(first_row[:, 1:])) and torch.equal(
        mask[:, 1:], mask[:, :1].expand_as(mask[:, 1:])
    ):
        return mask[:, :1]
    if heads % count:
        from .hook import AttentionHookError

        raise AttentionHookError(
            f"an attention mask of {count} heads for {heads} query heads: cannot tell which applies"
        )
    return mask.repeat_interleave(heads // count, dim=1) if count != heads else mask
