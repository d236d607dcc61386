"""Attention assembled exactly from a position rule (:mod:`rope_ext.strategies.position_rule`), block by block.

The query and key arrive rotated by RoPE at their own positions (with any frequency strategy and
attention factor already applied). For each piece of the rule, they are rotated further by the
difference between the position the piece gives them and their own (R(p' - p) R(p) = R(p'), the attention
factor untouched), so the piece's scores are those of RoPE at its positions. Queries go in blocks; for each
block a piece is computed only over the keys it can hold (``Piece.keys``: the neighbour band, the far
triangle, the chunks), in key blocks whose mask is dropped where every pair is the piece's, skipped where
none is; the partial softmaxes are merged by their log-sum-exp, as flash attention merges blocks (and as the
reference implementations of DCA and STRING merge their pieces). No [tokens x tokens] matrix is built beyond
one block. Each block goes through a fused kernel that returns the log-sum-exp: on CPU PyTorch's flash kernel;
on CUDA its flash kernel (bf16/fp16, no mask) or its memory-efficient kernel (a mask, or float32) -- the kernels
``scaled_dot_product_attention`` dispatches to; elsewhere (and with logit soft-capping) a float32 matmul-softmax.

Works with a KV cache (a query block of one token sees every cached key, re-rotated from its own
position), grouped-query attention, rotary pairs anywhere in the head (partial rotary, MLA's rope sub-dimension,
interleaved), a value head of another size than the query's (MLA), the call's padding mask, a sliding
window and logit soft-capping; a call the rule leaves unchanged (e.g. every distance below the window) goes
to the model's own attention function, so the output is exactly the unpatched one. Where FlexAttention is
used (:func:`rope_ext.attention.flex.available`: on CUDA by default), :func:`assemble` hands the same computation to
:func:`rope_ext.attention.flex.flex_assemble`, one kernel call per piece; these blocks are the fallback and the reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
import functools

from ..strategies.position_rule import PositionRule
from .pieces import _merge, _pair_index, mask_heads, rerotate, with_factors

if TYPE_CHECKING:
    import torch

QUERY_BLOCK = 1024
KEY_BLOCK = 4096


def fused_kernel(x: torch.Tensor) -> bool:
    """Whether blocks of ``x`` go through a fused PyTorch kernel that returns the log-sum-exp: on CPU; on CUDA from
    Ampere on (the flash kernel's sm80) with a head size the kernels take (a multiple of 8, at most 256)."""
    import torch

    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    if x.device.type == "cpu":
        return True
    head = x.shape[-1]
    return x.device.type == "cuda" and head % 8 == 0 and head <= 256 and _capability(x.device.index) >= (8, 0)


@functools.lru_cache(maxsize=None)
def _capability(index: int | None) -> tuple[int, int]:
    # asked for every block of every piece: read the device once
    import torch

    return torch.cuda.get_device_capability(index)


def _fused_cuda(q, k, v, mask, causal: bool, scale: float):
    """(output, log-sum-exp) from PyTorch's CUDA flash kernel (bf16/fp16 without a mask) or memory-efficient
    kernel (an additive mask, or float32), the kernels ``scaled_dot_product_attention`` dispatches to."""
    import torch

    rep = q.shape[1] // k.shape[1]
    if rep > 1:  # grouped-query attention: the kernels take as many key/value heads as query heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    if mask is None and q.dtype != torch.float32:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[:2]
        return out, lse.float()
    bias = None
    if mask is not None:  # the kernel reads bias rows aligned to 16 elements: pad the storage, keep the shape
        keys = mask.shape[-1]
        storage = mask.new_zeros(*mask.shape[:-1], -(-keys // 16) * 16)
        storage[..., :keys] = mask
        bias = storage[..., :keys].expand(q.shape[0], q.shape[1], q.shape[2], keys)
    out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, 0.0, causal, scale=scale)[:2]
    return out, lse[..., : q.shape[2]].float()  # the kernel pads the log-sum-exp's rows to a multiple of 32


def _attend(q, k, v, allowed, scale: float, softcap: float | None, bias=None, causal: bool = False):
    """Softmax attention of q over k/v where ``allowed`` (batch, 1 or heads, q, k; None: all) holds, plus the additive
    ``bias`` (the same shape), or with ``causal`` key j for query i <= j (a square block): (output, log-sum-exp); rows
    with no allowed key get output 0 and log-sum-exp -inf."""
    import torch

    if softcap is None and fused_kernel(q) and q.shape[-1] != v.shape[-1]:  # MLA: the kernels take one head size
        width = max(q.shape[-1], v.shape[-1])
        q, k, v_wide = (torch.nn.functional.pad(x, (0, width - x.shape[-1])) for x in (q, k, v))
        out, lse = _attend(q, k, v_wide, allowed, scale, softcap, bias, causal)
        return out[..., : v.shape[-1]], lse
    if softcap is None and fused_kernel(q):
        mask = None
        if allowed is not None or bias is not None:
            mask = torch.zeros(allowed.shape if allowed is not None else bias.shape, dtype=q.dtype, device=q.device)
            if bias is not None:
                mask = mask + bias.to(q.dtype)
            if allowed is not None:
                mask = mask.masked_fill(~allowed, float("-inf"))
        if q.device.type == "cuda":
            out, lse = _fused_cuda(q, k, v, mask, causal, scale)
        else:
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, causal, attn_mask=mask, scale=scale
            )
            lse = lse.float()
    else:
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1) if rep > 1 else k
        v = v.repeat_interleave(rep, dim=1) if rep > 1 else v
        work = torch.promote_types(q.dtype, torch.float32)  # float32 at least, float64 kept
        scores = (q.to(work) @ k.to(work).transpose(-1, -2)) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap  # Gemma-2-style logit soft-capping
        if bias is not None:
            scores = scores + bias.to(work)
        if causal:
            allowed = _causal(scores.shape[-1], scores.device)[None, None]
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        weights = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
        out = (weights @ v.to(work)).to(q.dtype)
    if allowed is not None and not causal:
        empty = ~allowed.any(-1)  # (batch, 1 or heads, q)
        if bool(empty.any()):
            lse = lse.masked_fill(empty, float("-inf"))
            out = out.masked_fill(empty[..., None], 0.0)
    return out, lse


def _masked(q, k, v, lo, hi, m, n, mask, where, sliding_window, scale, softcap):
    """One key block of a strip: the pairs with lo <= key index < hi per query row, within the sliding window
    and the call's mask; None when it holds none. Without a window or mask the block is classified from lo and
    hi alone: unmasked when every row holds every key, the kernel's causal path when the pairs are exactly
    the top-left triangle of a square block."""
    import torch

    start, stop, k_start, k_stop = where
    if sliding_window is None and mask is None:
        rows = torch.arange(stop - start, device=lo.device)
        if bool((hi.clamp(max=k_stop) <= lo.clamp(min=k_start)).all()):
            return None
        if bool((lo <= k_start).all()):
            if bool((hi >= k_stop).all()):
                return _attend(q, k, v, None, scale, softcap)
            if k_stop - k_start == stop - start and bool((hi == k_start + rows + 1).all()):
                return _attend(q, k, v, None, scale, softcap, causal=True)
    index = torch.arange(k_start, k_stop, device=lo.device)
    allowed = ((index >= lo[..., None]) & (index < hi[..., None]))[:, None]  # (batch, 1, block, keys)
    if sliding_window is not None:
        allowed &= (m[..., None] - n < sliding_window)[:, None]
    bias = None
    if mask is not None:  # (batch, 1 or heads, block, keys)
        part = (mask[:, :, start:stop] if mask.shape[-2] > 1 else mask)[..., k_start:k_stop]
        if part.dtype == torch.bool:
            allowed = allowed & part
        else:
            allowed = allowed & (part > torch.finfo(part.dtype).min / 2)
            bias = part.masked_fill(~allowed, 0) if bool((part[allowed] != 0).any()) else None
        if not bool(allowed.any()):
            return None
    return _attend(q, k, v, allowed, scale, softcap, bias)


_CAUSAL: dict = {}


def _causal(size: int, device) -> torch.Tensor:
    import torch

    key = (size, str(device))
    if key not in _CAUSAL:
        _CAUSAL.clear()
        _CAUSAL[key] = torch.ones(size, size, dtype=torch.bool, device=device).tril()
    return _CAUSAL[key]


def assemble(
    rule: PositionRule,
    query,
    key,
    value,
    query_positions,
    key_positions,
    inv_freq,
    pairs,
    scale: float,
    mask=None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    query_block: int | None = None,
    key_block: int | None = None,
) -> torch.Tensor:
    """Attention output (batch, heads, q_len, head_dim) of ``rule`` for rotated ``query`` (batch, heads, q_len,
    d) and ``key``/``value`` (batch, kv_heads, k_len, d) at positions ``query_positions`` (batch, q_len) and
    ``key_positions`` (batch, k_len); ``inv_freq`` and ``pairs`` the layer's rotary frequencies and pair dims;
    ``mask`` the call's mask (batch, 1 or heads, q_len, k_len), bool (True: attend) or additive; a mask whose heads
    differ (Doge's dynamic mask: a bias per head) is applied per head."""
    import torch

    from . import flex

    mask = mask_heads(mask, query.shape[1])
    # each piece one FlexAttention call (rope_ext.attention.flex): the same computation; a mask whose heads differ goes
    # through these blocks (FlexAttention here reads one mask for every head)
    if flex.available(query) and (mask is None or mask.shape[1] == 1):
        try:
            return flex.flex_assemble(
                rule,
                query,
                key,
                value,
                query_positions,
                key_positions,
                inv_freq,
                pairs,
                scale,
                mask,
                sliding_window,
                softcap,
            )
        except Exception as err:  # noqa: BLE001 -- chosen automatically: a kernel that fails here falls back, said once
            flex.failed(err)
    query_block, key_block = query_block or QUERY_BLOCK, key_block or KEY_BLOCK
    pairs = _pair_index(pairs)
    query, key = with_factors(rule, query, key, query_positions, pairs)
    qp, kp = query_positions.to(query.device), key_positions.to(query.device)
    offsets = kp[:, :1]  # key index i is at position offset + i (per row)
    k_len = key.shape[-2]
    moved = []
    for piece in rule.pieces:
        q = rerotate(query, piece.query(qp) - qp, inv_freq, pairs) if piece.query else query
        k = rerotate(key, piece.key(kp) - kp, inv_freq, pairs) if piece.key else key
        moved.append((piece, q, k))
    exact = mask is None and sliding_window is None  # else every key block is masked (padding, windows)
    output = torch.zeros(query.shape[:3] + (value.shape[-1],), dtype=query.dtype, device=query.device)
    for start in range(0, query.shape[-2], query_block):
        stop = min(start + query_block, query.shape[-2])
        m = qp[:, start:stop]
        parts = []
        for piece, q, k in moved:
            # the keys each query holds, as key indices: [lo, hi) per row (batch, block)
            lo = (piece.lo(m) - offsets).clamp(0, k_len)
            hi = (piece.hi(m) - offsets).clamp(0, k_len)
            lo_min, lo_max, hi_min, hi_max = int(lo.min()), int(lo.max()), int(hi.min()), int(hi.max())
            spans = [(lo_min, hi_max, True)]  # (first key, end, masked)
            if exact and lo_max < hi_min:  # a middle every query holds (unmasked), strips either side
                right, rows = hi_min, stop - start
                if hi_max - hi_min == rows - 1 and hi_max - rows >= lo_max:
                    right = hi_max - rows  # a diagonal edge: a square strip, the kernel's causal triangle
                spans = [(lo_min, lo_max, True), (lo_max, right, False), (right, hi_max, True)]
            for span_start, span_stop, masked in spans:
                # the fused kernel bounds its own memory over an unmasked span; elsewhere key blocks do
                step = key_block if masked or not fused_kernel(query) else max(1, span_stop - span_start)
                for k_start in range(span_start, span_stop, step):
                    k_stop = min(k_start + step, span_stop)
                    q_part, k_part, v_part = q[:, :, start:stop], k[:, :, k_start:k_stop], value[:, :, k_start:k_stop]
                    if not masked:
                        parts.append(_attend(q_part, k_part, v_part, None, scale, softcap))
                        continue
                    part = _masked(
                        q_part,
                        k_part,
                        v_part,
                        lo,
                        hi,
                        m,
                        torch.arange(k_start, k_stop, device=query.device) + offsets[:, :, None],
                        mask,
                        (start, stop, k_start, k_stop),
                        sliding_window,
                        scale,
                        softcap,
                    )
                    if part is not None:
                        parts.append(part)
        if parts:
            output[:, :, start:stop] = _merge(parts)
    return output
