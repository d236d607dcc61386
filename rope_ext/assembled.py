"""Attention assembled exactly from a position rule (:mod:`rope_ext.positions`), block by block.

The query and key arrive rotated by RoPE at their own positions (with any frequency strategy and
attention factor already applied). For each piece of the rule, they are rotated further by the
difference between the position the piece gives them and their own (R(p' - p) R(p) = R(p'), the attention
factor untouched), so the piece's scores are those of RoPE at its positions. Queries go in blocks; for each
block a piece is computed only over the keys it can hold (``Piece.keys``: the neighbour band, the far
triangle, the chunks), in key blocks whose mask is dropped where every pair is the piece's, skipped where
none is; the partial softmaxes are merged by their log-sum-exp, as flash attention merges blocks (and as the
reference implementations of DCA and STRING merge their pieces). No [tokens x tokens] matrix is built beyond
one block. On CPU each block goes through PyTorch's fused flash kernel, elsewhere through a matmul-softmax.

Works with a KV cache (a query block of one token sees every cached key, re-rotated from its own
position), grouped-query attention, partial rotary dims (GPT-NeoX), the call's padding mask, a sliding
window and logit soft-capping; a call the rule leaves unchanged (e.g. every distance below the window) goes
to the model's own attention function, so the output is exactly the unpatched one.
"""

from __future__ import annotations

import torch

from .positions import PositionRule

QUERY_BLOCK = 1024
KEY_BLOCK = 4096


def rerotate(x: torch.Tensor, shift: torch.Tensor, inv_freq: torch.Tensor, pairs) -> torch.Tensor:
    """x (batch, heads, n, d) rotated further by ``shift`` (batch, n) positions: R(shift * theta) per pair."""
    a, b = pairs
    angle = shift.to(x.device, torch.float64)[..., None] * inv_freq.to(x.device, torch.float64)  # (batch, n, r/2)
    c = angle.cos().to(x.dtype).unsqueeze(1)
    s = angle.sin().to(x.dtype).unsqueeze(1)
    xa, xb = x[..., a], x[..., b]
    out = x.clone()
    out[..., a] = xa * c - xb * s
    out[..., b] = xb * c + xa * s
    return out


def _pair_index(pairs) -> tuple:
    """Rotary pair dims as slices where contiguous (rotate_half), else index tensors (interleaved)."""
    a, b = pairs
    half = len(a)
    if torch.equal(a, torch.arange(half, device=a.device)) and torch.equal(b, a + half):
        return slice(0, half), slice(half, 2 * half)
    return a, b


def _attend(q, k, v, allowed, scale: float, softcap: float | None, bias=None):
    """Softmax attention of q over k/v where ``allowed`` (batch, q, k; None: all) holds: (output, log-sum-exp);
    rows with no allowed key get output 0 and log-sum-exp -inf."""
    fused = q.device.type == "cpu" and softcap is None and q.dtype in (torch.float32, torch.bfloat16, torch.float16)
    if fused:
        mask = None
        if allowed is not None or bias is not None:
            mask = torch.zeros(allowed.shape if allowed is not None else bias.shape[-3:], dtype=q.dtype, device=q.device)
            if bias is not None:
                mask = mask + bias.to(q.dtype)
            if allowed is not None:
                mask = mask.masked_fill(~allowed, float("-inf"))
            mask = mask.unsqueeze(1)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask,
                                                                              scale=scale)
        lse = lse.float()
    else:
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1) if rep > 1 else k
        v = v.repeat_interleave(rep, dim=1) if rep > 1 else v
        scores = (q.float() @ k.float().transpose(-1, -2)) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap  # Gemma-2-style logit soft-capping
        if bias is not None:
            scores = scores + bias.unsqueeze(1).float()
        if allowed is not None:
            scores = scores.masked_fill(~allowed.unsqueeze(1), float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        weights = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
        out = (weights @ v.float()).to(q.dtype)
    if allowed is not None:
        empty = ~allowed.any(-1)  # (batch, q)
        if bool(empty.any()):
            lse = lse.masked_fill(empty.unsqueeze(1), float("-inf"))
            out = out.masked_fill(empty[:, None, :, None], 0.0)
    return out, lse


def _merge(out, lse, part, part_lse):
    """Two softmax partials over disjoint keys merged by their log-sum-exp."""
    if out is None:
        return part.float(), part_lse
    total = torch.logaddexp(lse, part_lse)
    finite = total.isfinite()
    old = torch.where(finite, torch.exp(lse - total), torch.zeros_like(total))
    new = torch.where(finite, torch.exp(part_lse - total), torch.zeros_like(total))
    return out * old[..., None] + part.float() * new[..., None], total


def assemble(rule: PositionRule, query, key, value, query_positions, key_positions, inv_freq, pairs, scale: float,
             mask=None, sliding_window: int | None = None, softcap: float | None = None,
             query_block: int | None = None, key_block: int | None = None) -> torch.Tensor:
    """Attention output (batch, heads, q_len, head_dim) of ``rule`` for rotated ``query`` (batch, heads, q_len,
    d) and ``key``/``value`` (batch, kv_heads, k_len, d) at positions ``query_positions`` (batch, q_len) and
    ``key_positions`` (batch, k_len); ``inv_freq`` and ``pairs`` the layer's rotary frequencies and pair dims;
    ``mask`` the call's mask (batch, 1, q_len, k_len), bool (True: attend) or additive."""
    query_block, key_block = query_block or QUERY_BLOCK, key_block or KEY_BLOCK
    pairs = _pair_index(pairs)
    if rule.query_scale is not None:  # ReRoPE's log-n, by the query's position
        query = query * rule.query_scale(query_positions).to(query.device, query.dtype)[:, None, :, None]
    if rule.rotary_scale != 1.0:  # a cos/sin factor: the rotary dims of query and key
        query, key = query.clone(), key.clone()
        for x in (query, key):
            x[..., pairs[0]] *= rule.rotary_scale
            x[..., pairs[1]] *= rule.rotary_scale
    if mask is not None and mask.ndim == 2:  # a (batch, k_len) padding mask (flash attention's)
        mask = mask.bool()[:, None, None, :]
    qp, kp = query_positions.to(query.device), key_positions.to(query.device)
    offsets = kp[:, :1]  # key index i is at position offset + i (per row)
    low_offset, high_offset = int(offsets.min()), int(offsets.max())
    k_len = key.shape[-2]
    moved = []
    for piece in rule.pieces:
        q = rerotate(query, piece.query(qp) - qp, inv_freq, pairs) if piece.query else query
        k = rerotate(key, piece.key(kp) - kp, inv_freq, pairs) if piece.key else key
        moved.append((piece, q, k))
    outputs = []
    for start in range(0, query.shape[-2], query_block):
        stop = min(start + query_block, query.shape[-2])
        m = qp[:, start:stop]
        first, last = int(m.min()), int(m.max())
        out = lse = None
        for piece, q, k in moved:
            lo, hi = piece.keys(first, last)
            lo, hi = max(0, lo - high_offset), min(k_len, hi - low_offset)  # key indices that can hold it
            for k_start in range(lo, hi, key_block):
                k_stop = min(k_start + key_block, hi)
                n = kp[:, k_start:k_stop]
                mm, nn = m[:, :, None], n[:, None, :]
                allowed = piece.region(mm, nn) & (nn <= mm)  # pieces are disjoint
                if sliding_window is not None:
                    allowed &= mm - nn < sliding_window
                bias = None
                if mask is not None:
                    part = (mask[:, 0, start:stop] if mask.shape[-2] > 1 else mask[:, 0])[..., k_start:k_stop]
                    if part.dtype == torch.bool:
                        allowed &= part
                    else:
                        allowed &= part > torch.finfo(part.dtype).min / 2
                        bias = part.masked_fill(~allowed, 0) if bool((part[allowed] != 0).any()) else None
                if not bool(allowed.any()):
                    continue
                full = bool(allowed.all())
                part_out, part_lse = _attend(q[:, :, start:stop], k[:, :, k_start:k_stop], value[:, :, k_start:k_stop],
                                             None if full else allowed, scale, softcap, bias)
                out, lse = _merge(out, lse, part_out, part_lse)
        if out is None:
            out = torch.zeros(query.shape[:2] + (stop - start, value.shape[-1]), dtype=torch.float32, device=query.device)
        outputs.append(out.to(query.dtype))
    return torch.cat(outputs, dim=-2)
