"""Attention of a position rule through PyTorch's FlexAttention (Dong et al. 2024, arXiv 2412.05496;
``torch.nn.attention.flex_attention``): one kernel call per piece, no dense mask.

The same computation as :func:`rope_ext.attention.assembled.assemble` -- each piece of the rule (:mod:`rope_ext.strategies.position_rule`)
attends with its query and key re-rotated to the positions it gives them, and the pieces' partial softmaxes are
merged by their log-sum-exp -- but each piece is one ``flex_attention`` call whose block mask holds exactly the
pairs the piece holds (lo(m) <= n < hi(m), causal, the sliding window, the call's padding): blocks no pair of the
piece falls in are skipped by the kernel, blocks it holds whole run unmasked, so a piece costs what its pairs
cost (Self-Extend's neighbour band plus the grouped far triangle: about one causal pass in all, where the
reference implementations compute two or three dense passes). Logit soft-capping and an additive mask are score
modifications. The block masks depend only on the positions, so the layers of one forward share them.

``flex_attention`` runs compiled on CUDA (Triton) and eagerly elsewhere (every score materialised: tests only; torch
2.13 cannot compile it on the CPU with the log-sum-exp the merge needs);
:func:`available` says where it is used by default (:data:`BACKEND`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from typing import TYPE_CHECKING

from .pieces import _merge, _pair_index, mask_heads, rerotate, with_factors

if TYPE_CHECKING:
    import torch

    from ..strategies.position_rule import Piece, PositionRule

BLOCK = 128  # flex_attention's block size (query and key), its default
# "auto": flex on CUDA where torch has it, the blocks of rope_ext.attention.assembled elsewhere; "flex" or "blocks" forces one
BACKEND = os.environ.get("ROPE_EXT_ATTENTION", "auto")
BACKENDS = ("auto", "flex", "blocks")
_MASKS: dict = {}
_FAILED: str | None = None  # why FlexAttention failed under "auto" (then the blocks run)


@contextlib.contextmanager
def backend(name: str):
    """:data:`BACKEND` set to ``name`` inside the block (benchmarks compare the two paths on one model)."""
    global BACKEND
    if name not in BACKENDS:
        raise ValueError(f"backend {name!r}: valid are {', '.join(BACKENDS)}")
    before, BACKEND = BACKEND, name
    try:
        yield
    finally:
        BACKEND = before


def failed(err: Exception) -> None:
    """FlexAttention failed under ``auto``: said once, the blocks used from now on; forced (``flex``): raised."""
    global _FAILED
    if BACKEND != "auto":
        raise err
    if _FAILED is None:
        _FAILED = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        warnings.warn(f"rope_ext: FlexAttention failed ({_FAILED}); attention-level methods use the blocks path")


def available(x: torch.Tensor) -> bool:
    """Whether attention on ``x`` goes through FlexAttention under :data:`BACKEND` (``auto``: on CUDA, float32 or
    lower, where torch ships it and Triton compiles it)."""
    import torch

    if BACKEND not in BACKENDS:
        raise ValueError(f"ROPE_EXT_ATTENTION={BACKEND!r}: valid are {', '.join(BACKENDS)}")
    if BACKEND == "blocks" or x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    if BACKEND == "flex":
        return _flex() is not None
    return _FAILED is None and x.device.type == "cuda" and _flex() is not None and _triton()


@functools.lru_cache(maxsize=None)
def _flex():
    try:
        from torch.nn.attention import flex_attention
    except ImportError:  # torch < 2.5
        return None
    return flex_attention


@functools.lru_cache(maxsize=None)
def _triton() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=None)
def _compiled(device_type: str):
    # one compiled kernel per device type; shapes that change (a growing cache) are marked dynamic by torch.compile
    import torch

    return torch.compile(_flex().flex_attention, dynamic=None)


def _kernel(device_type: str):
    """The compiled ``flex_attention``; eager (every score materialised: tiny shapes only) with
    ``ROPE_EXT_FLEX_EAGER=1`` and on the CPU, where torch 2.13's inductor cannot compile it with the log-sum-exp
    the pieces are merged by ("torch.compile on CPU only supports inference and `return_lse` is not supported
    yet": torch/_inductor/kernel/flex/flex_cpu.py)."""
    if os.environ.get("ROPE_EXT_FLEX_EAGER") == "1" or device_type == "cpu":
        return _flex().flex_attention
    return _compiled(device_type)


def _at(table, b, *index):
    """``table[b, *index]``, each index clamped into the table's range first: a kernel may ask about the padding of a
    last, partial block (whose answer it discards)."""
    return table[(b, *(i.clamp(max=size - 1) for i, size in zip(index, table.shape[1:])))]


def _mask_mod(piece: Piece, qp, kp, window: int | None, allowed, offsets: tuple[int, int] | None = None):
    """Whether query index q_idx attends key index kv_idx in ``piece``: at positions qp[b, q_idx] and kp[b, kv_idx],
    or q0 + q_idx and k0 + kv_idx where ``offsets`` = (q0, k0) (every row a run of consecutive positions); and
    where the call's mask ``allowed`` (batch, q, k) lets it. Every tensor is read through :func:`_at`."""

    def holds(b, h, q_idx, kv_idx):
        if offsets is None:
            m, n = _at(qp, b, q_idx), _at(kp, b, kv_idx)
        else:
            m, n = q_idx + offsets[0], kv_idx + offsets[1]
        keep = (n >= piece.lo(m)) & (n < piece.hi(m)) & (n <= m)
        if window is not None:
            keep = keep & (m - n < window)
        if allowed is not None:
            keep = keep & _at(allowed, b, q_idx, kv_idx)
        return keep

    return holds


def _consecutive(positions) -> int | None:
    """The first position where every row of ``positions`` (batch, n) is the same run of consecutive positions."""
    length = positions.shape[-1]
    first = positions[:, :1]
    if bool((positions[:, -1:] - first == length - 1).all()) and bool((first == first[:1]).all()):
        if length <= 2 or bool((positions[:, 1:] - positions[:, :-1] == 1).all()):
            return int(first[0, 0])
    return None


def _ordered(selected):
    """(count per query block, key block indices selected first) of a (batch, q_blocks, k_blocks) selection, as
    BlockMask takes them (a head dim of 1: every head alike)."""
    import torch

    count = selected.sum(-1).to(torch.int32)
    index = torch.argsort((~selected).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return count[:, None], index[:, None]


def _tiles(allowed, block: int, fill: bool):
    """``allowed`` (batch, q, k) padded with ``fill`` to whole blocks, as (batch, q_blocks, block, k_blocks, block)."""

    batch, q_len, k_len = allowed.shape
    q_blocks, k_blocks = -(-q_len // block), -(-k_len // block)
    padded = allowed.new_full((batch, q_blocks * block, k_blocks * block), fill)
    padded[:, :q_len, :k_len] = allowed
    return padded.view(batch, q_blocks, block, k_blocks, block)


def mask_blocks(allowed, block: int) -> tuple:
    """(blocks the call's mask ``allowed`` (batch, q, k) opens at all, blocks it opens whole), each (batch, q_blocks,
    k_blocks): the same for every piece of a call, so computed once per call."""
    return _tiles(allowed, block, False).any(4).any(2), _tiles(allowed, block, True).all(4).all(2)


def _from_bounds(
    piece: Piece, q0: int, q_len: int, k0: int, k_len: int, window: int | None, allowed, block: int, device, opened
):
    """The piece's BlockMask from its bounds (positions q0 + i, k0 + j): lo and hi never decrease, so a query
    block's first and last rows bound every row -- a key block is skipped when no row can reach it, full when
    every row holds all of it, partial (the mask evaluated per pair) otherwise; with the call's mask ``allowed``
    (batch, q, k), a block it closes whole is skipped and one it opens only in part is partial. No dense map of
    positions is built (create_block_mask's would hold q x k int64 entries)."""
    import torch
    from torch.nn.attention.flex_attention import BlockMask

    q_first = q0 + torch.arange(0, q_len, block, device=device)
    q_last = (q_first + block - 1).clamp(max=q0 + q_len - 1)
    k_first = k0 + torch.arange(0, k_len, block, device=device)
    k_end = (k_first + block).clamp(max=k0 + k_len)  # exclusive
    lo_first, lo_last = piece.lo(q_first), piece.lo(q_last)
    hi_first = torch.minimum(piece.hi(q_first), q_first + 1)  # causal: n <= m
    hi_last = torch.minimum(piece.hi(q_last), q_last + 1)
    skipped = (hi_last[:, None] <= k_first[None]) | (lo_first[:, None] >= k_end[None])
    full = (lo_last[:, None] <= k_first[None]) & (hi_first[:, None] >= k_end[None])
    if window is not None:  # m - n < window
        skipped |= q_first[:, None] - (k_end[None] - 1) >= window
        full &= q_last[:, None] - k_first[None] < window
    skipped, full = skipped[None], full[None]  # (batch, q_blocks, k_blocks)
    if allowed is not None:
        some, whole = opened
        skipped = skipped | ~some
        full = full & whole
    full = full & ~skipped
    count, index = _ordered(~skipped & ~full)
    full_count, full_index = _ordered(full)
    return BlockMask.from_kv_blocks(
        count,
        index,
        full_count,
        full_index,
        BLOCK_SIZE=block,
        mask_mod=_mask_mod(piece, None, None, window, allowed, (q0, k0)),
        seq_lengths=(q_len, k_len),
        compute_q_blocks=False,
    )


def block_mask(piece: Piece, qp, kp, window: int | None, allowed, block: int = BLOCK, opened=None):
    """The piece's BlockMask over (query index, key index): from its bounds where every row's positions are the same
    run of consecutive positions (kept, without a call mask, for the next layers of the same forward: the same
    pairs; ``opened``: :func:`mask_blocks` of the call's mask, when already computed), else by evaluating the mask
    over every pair (``create_block_mask``: a batch of left-padded rows)."""
    batch, q_len, k_len = qp.shape[0], qp.shape[-1], kp.shape[-1]
    q0, k0 = _consecutive(qp), _consecutive(kp)
    if q0 is None or k0 is None:
        holds = _mask_mod(piece, qp, kp, window, allowed)
        return _flex().create_block_mask(holds, batch, None, q_len, k_len, device=qp.device, BLOCK_SIZE=block)
    if allowed is not None:
        opened = opened if opened is not None else mask_blocks(allowed, block)
        return _from_bounds(piece, q0, q_len, k0, k_len, window, allowed, block, qp.device, opened)
    key = (piece, q0, q_len, k0, k_len, window, block, str(qp.device))
    if key not in _MASKS:
        if len(_MASKS) >= 16:
            _MASKS.clear()
        _MASKS[key] = _from_bounds(piece, q0, q_len, k0, k_len, window, None, block, qp.device, None)
    return _MASKS[key]


def _score_mod(softcap: float | None, bias):
    """Soft-capping (Gemma-2's tanh) then the call's additive mask (batch, q, k), on a score already multiplied by
    the scale; the mask read through :func:`_at`."""
    import torch

    if softcap is None and bias is None:
        return None

    def modify(score, b, h, q_idx, kv_idx):
        if softcap is not None:
            score = torch.tanh(score / softcap) * softcap
        if bias is not None:
            score = score + _at(bias, b, q_idx, kv_idx).to(score.dtype)
        return score

    return modify


def _padding(mask, q_len: int, k_len: int):
    """(allowed (batch, q, k) bool, bias (batch, q, k) or None) of the call's mask (its rows the queries, its first
    ``k_len`` columns the keys, as rope_ext.attention.assembled reads it); (None, None) without one."""
    import torch

    mask = mask_heads(mask, mask.shape[1] if mask is not None and mask.ndim == 4 else 1)
    if mask is None:
        return None, None
    if mask.shape[1] > 1:  # the blocks path applies it (rope_ext.attention.assembled)
        raise ValueError("a mask whose heads differ (a bias per head) is not taken by the FlexAttention path")
    part = mask[:, 0, :, :k_len].expand(mask.shape[0], q_len, k_len)
    if part.dtype == torch.bool:
        return part.contiguous(), None
    allowed = part > torch.finfo(part.dtype).min / 2
    bias = part.masked_fill(~allowed, 0) if bool((part[allowed] != 0).any()) else None
    return allowed.contiguous(), None if bias is None else bias.contiguous()


def flex_assemble(
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
    block: int | None = None,
) -> torch.Tensor:
    """:func:`rope_ext.attention.assembled.assemble`'s output (batch, heads, q_len, v_dim), each piece one FlexAttention call."""
    from torch.nn.attention.flex_attention import AuxRequest

    block = block or BLOCK
    pairs = _pair_index(pairs)
    query, key = with_factors(rule, query, key, query_positions, pairs)
    qp, kp = query_positions.to(query.device), key_positions.to(query.device)
    qp, kp = qp.expand(query.shape[0], -1).contiguous(), kp.expand(query.shape[0], -1).contiguous()
    allowed, bias = _padding(mask, query.shape[-2], key.shape[-2])
    kernel = _kernel(query.device.type)
    modify = _score_mod(softcap, bias)
    gqa = query.shape[1] != key.shape[1]
    opened = mask_blocks(allowed, block) if allowed is not None else None  # shared by the pieces
    parts = []
    for piece in rule.pieces:
        q = rerotate(query, piece.query(qp) - qp, inv_freq, pairs) if piece.query else query
        k = rerotate(key, piece.key(kp) - kp, inv_freq, pairs) if piece.key else key
        found = block_mask(piece, qp, kp, sliding_window, allowed, block, opened)
        out, aux = kernel(
            q,
            k,
            value,
            score_mod=modify,
            block_mask=found,
            scale=scale,
            enable_gqa=gqa,
            return_aux=AuxRequest(lse=True),
        )
        parts.append((out, aux.lse))
    return _merge(parts).to(query.dtype)
