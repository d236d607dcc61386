"""Attention-level strategies: which relative position each (query, key) pair sees, instead of new frequencies.

A method is a :class:`rope_ext.strategies.position_rule.PositionRule`: pieces of the causal (query m, key n) pairs, each
giving the position its query and its key take there; :mod:`rope_ext.attention.assembled` computes attention exactly from
those pieces, block by block.

- ``self_extend``  Self-Extend (Jin et al. 2024, arXiv 2401.01325; datamllab/LongLM): neighbours (m - n < W)
  keep their positions; beyond, query and key positions are floor-divided by the group size G and the query
  shifted by W - W // G, so the grouped relative position is m//G - n//G + W - W//G.
- ``dca``          Dual Chunk Attention (An et al. 2024, arXiv 2402.17463; HKUNLP/ChunkLlama): chunks of
  c = chunk_size - local_window tokens; keys at n mod c; the query at m mod c within its chunk, at
  min(m mod c + c, chunk_size) for the previous chunk, and at min(2c - 1, chunk_size) for older chunks.
- ``rerope``       ReRoPE (Su 2023, kexue.fm/archives/9708; bojone/rerope): m - n below the window W as is,
  W beyond it; the query scaled by max(1, log(m+1) / log L) (the reference's log-n, ``logn``).
- ``leaky_rerope`` Leaky ReRoPE (same post): beyond W the relative position grows 1/k as fast,
  W + (m - n - W) / k; the same log-n query scale.
- ``string``       STRING (An et al. 2024, arXiv 2410.18745): pairs at m - n >= S (the shifted offset,
  int(0.33 L) by default) see m - n - S + W (W the small local value, 128), nearer pairs their own
  distance; cos and sin multiplied by the attention factor 0.1 ln 2 + 1 (the reference's, as YaRN's).
  The paper's formula is implemented: the reference's flash code also counts the pair at m - n = S in
  both pieces (its window [S, 0] is inclusive).
- ``lm_infinite``  LM-Infinite (Han et al. 2023, arXiv 2308.16137; Glaciohound/LM-Infinite): the
  Lambda-shaped mask: the last ``local_span`` keys (default L) at their distance, the first
  ``global_tokens`` (10) keys beyond it at distance ``local_span``, nothing else.

They compose with frequency and query-scaling strategies (``compose`` of ``yarn`` and ``dca``, as
Qwen2.5-1M; ``logn`` with ``self_extend``); at most one attention-level method per model.
"""

from __future__ import annotations

import math

from .position_rule import Piece, PositionRule, Positions
from .registry import TRAINED, Param, ScalingError, register


def _near(window: int) -> Piece:
    # pairs closer than the window keep their own positions
    return Piece("near", lambda m: m - window + 1, lambda m: m + 1)


def _far(window: int, query: Positions | None, key: Positions | None, name: str = "far") -> Piece:
    import torch

    return Piece(name, torch.zeros_like, lambda m: (m - window + 1).clamp(min=0), query, key)


def _log_n(trained: int) -> Positions:
    # max(1, log(m + 1) / log L): bojone/rerope's query scale, log_L of the tokens seen beyond L
    import torch

    return lambda m: (torch.log(m.double() + 1) / math.log(trained)).clamp(min=1.0)


def eighth_window(p: dict, trained: int, target: int) -> tuple[int, str]:
    # W = L/8: the neighbour window (1024 on an 8k model; bojone/rerope's 512 on LLaMA-2's 4096)
    return trained // 8, f"trained / 8 = {trained} / 8"


def group_for_target(p: dict, trained: int, target: int) -> tuple[int, str]:
    """Self-Extend's group size for a target N: the smallest G with W + (N - W) / G <= 2L/3, the upper end of
    the LongLM README's rule (1/2 to 2/3) L > W + (N - W) / G (datamllab/LongLM)."""
    window, usable = p["window"], 2 * trained / 3
    if window >= usable:
        raise ScalingError(
            f"scaling 'self_extend': window={window} leaves no group size that reaches {target} tokens: "
            f"the rule W + (N - W) / G <= 2L/3 = {usable:.0f} needs W < {usable:.0f}"
        )
    group = max(1, math.ceil((target - window) / (usable - window) - 1e-9))
    return group, f"smallest G with W + (N - W) / G <= 2L/3: {window} + {target - window} / {group} <= {usable:.0f}"


@register(
    "self_extend",
    kind="attention",
    targets={"window": eighth_window, "group_size": group_for_target},
    params={
        "group_size": Param(
            8,
            int,
            "group size G: positions beyond the window are floor-divided by G",
            minimum=1,
            search=(2, 32),
            log=True,
        ),
        "window": Param(
            1024,
            int,
            "neighbour window W (pairs closer than W keep their positions)",
            minimum=1,
            search=(128, 4096),
            log=True,
        ),
        "original_max_position": TRAINED,
    },
)
def self_extend(p) -> PositionRule:
    """Self-Extend: grouped positions m//G + W - W//G and n//G beyond the neighbour window W."""
    import torch

    group, window = p["group_size"], p["window"]
    shift = window - window // group  # the grouped query's offset, so the two pieces meet at distance W
    return PositionRule(
        "self_extend",
        (
            _near(window),
            _far(
                window,
                lambda m: torch.div(m, group, rounding_mode="floor").double() + shift,
                lambda n: torch.div(n, group, rounding_mode="floor").double(),
                "grouped",
            ),
        ),
    )


def check_dca(p: dict) -> None:
    chunk, local = dca_sizes(p)
    if not chunk > local:
        raise ScalingError(
            f"scaling: chunk_size={chunk} must be > local_window={local} (a chunk holds "
            "chunk_size - local_window tokens)"
        )


def dca_sizes(p: dict) -> tuple[int, int]:
    """(chunk_size, local_window): defaults 3L/4 and L/16, as HKUNLP/ChunkLlama's replace_with_chunkllama."""
    trained = p["original_max_position"]
    chunk = p["chunk_size"] if p["chunk_size"] is not None else trained * 3 // 4
    local = p["local_window"] if p["local_window"] is not None else trained // 16
    return chunk, local


def _dca_chunk(p: dict, trained: int, target: int) -> tuple[int, str]:
    return trained * 3 // 4, f"3L/4 = 3 x {trained} / 4 (ChunkLlama's; relative positions stay below it at any length)"


def _dca_local(p: dict, trained: int, target: int) -> tuple[int, str]:
    return trained // 16, f"L/16 = {trained} / 16 (ChunkLlama's)"


@register(
    "dca",
    kind="attention",
    check=check_dca,
    targets={"chunk_size": _dca_chunk, "local_window": _dca_local},
    context_defaults=lambda p: dict(zip(("chunk_size", "local_window"), dca_sizes(p))),
    params={
        "chunk_size": Param(None, int, "chunk size s (default 3L/4); chunks hold s - local_window tokens", minimum=2),
        "local_window": Param(None, int, "local window w (default L/16)", minimum=0),
        "original_max_position": TRAINED,
    },
)
def dca(p) -> PositionRule:
    """Dual Chunk Attention: intra-chunk, successive-chunk and inter-chunk pieces over chunks of s - w tokens."""
    import torch

    size, local = dca_sizes(p)
    c = size - local  # tokens per chunk

    def chunk(x):
        return torch.div(x, c, rounding_mode="floor")

    def key(n):
        return (n % c).double()

    def succ_query(m):
        return (m % c + c).clamp(max=size).double()

    inter = float(min(2 * c - 1, size))  # ChunkLlama's qc position of index c - 1
    return PositionRule(
        "dca",
        (
            Piece("intra", lambda m: c * chunk(m), lambda m: m + 1),
            Piece("successive", lambda m: (c * (chunk(m) - 1)).clamp(min=0), lambda m: c * chunk(m), succ_query, key),
            Piece(
                "inter",
                torch.zeros_like,
                lambda m: (c * (chunk(m) - 1)).clamp(min=0),
                lambda m: torch.full(m.shape, inter, dtype=torch.float64, device=m.device),
                key,
            ),
        ),
    )


LOGN = Param(True, bool, "scale the query by max(1, log(m+1)/log L) (the reference's log-n)")


@register(
    "rerope",
    kind="attention",
    targets={"window": eighth_window},
    params={
        "window": Param(
            512, int, "window W: beyond it every pair sees relative position W", minimum=1, search=(128, 4096), log=True
        ),
        "logn": LOGN,
        "original_max_position": TRAINED,
    },
)
def rerope(p) -> PositionRule:
    """ReRoPE: relative position min(m - n, W); query scaled by log-n."""
    import torch

    window = p["window"]
    return PositionRule(
        "rerope",
        (
            _near(window),
            _far(
                window,
                lambda m: torch.full(m.shape, float(window), dtype=torch.float64, device=m.device),
                lambda n: torch.zeros(n.shape, dtype=torch.float64, device=n.device),
            ),
        ),
        _log_n(p["original_max_position"]) if p["logn"] else None,
    )


def leak_for_target(p: dict, trained: int, target: int) -> tuple[float, str]:
    """Leaky ReRoPE's k for a target N: the smallest (to 0.01) with W + (N - 1 - W) / k <= L - 1, so the farthest
    pair sees a position the model was trained on."""
    window = p["window"]
    if window >= trained - 1:
        raise ScalingError(
            f"scaling 'leaky_rerope': window={window} must be < {trained - 1} (the trained context "
            f"{trained} - 1) to reach {target} tokens"
        )
    leak = max(1.01, math.ceil(100 * (target - 1 - window) / (trained - 1 - window)) / 100)
    return (
        leak,
        f"smallest k with W + (N - 1 - W) / k <= L - 1: {window} + {target - 1 - window} / {leak:g} <= {trained - 1}",
    )


@register(
    "leaky_rerope",
    kind="attention",
    targets={"window": eighth_window, "leak": leak_for_target},
    params={
        "window": Param(
            512, int, "window W: beyond it relative positions grow 1/k as fast", minimum=1, search=(128, 4096), log=True
        ),
        "leak": Param(
            16.0,
            float,
            "k > 1: beyond W the relative position is W + (m - n - W) / k",
            above=1.0,
            search=(2.0, 64.0),
            log=True,
        ),
        "logn": LOGN,
        "original_max_position": TRAINED,
    },
)
def leaky_rerope(p) -> PositionRule:
    """Leaky ReRoPE: query at (m + W(k-1)) / k, key at n / k beyond W; query scaled by log-n."""
    window, k = p["window"], p["leak"]
    return PositionRule(
        "leaky_rerope",
        (
            _near(window),
            _far(window, lambda m: (m.double() + window * (k - 1)) / k, lambda n: n.double() / k),
        ),
        _log_n(p["original_max_position"]) if p["logn"] else None,
    )


def string_offset(p: dict) -> int:
    """STRING's shifted offset S: the given one, else int(0.33 L) as the reference's scripts."""
    return p["offset"] if p["offset"] is not None else int(0.33 * p["original_max_position"])


def check_string(p: dict) -> None:
    offset = string_offset(p)
    if not p["local_window"] < offset:
        raise ScalingError(
            f"scaling: local_window={p['local_window']} must be < offset={offset} (shifted pairs "
            "see m - n - offset + local_window, which must stay below the offset)"
        )


def offset_for_target(p: dict, trained: int, target: int) -> tuple[int, str]:
    """STRING's offset S for a target N: the reference's int(0.33 L) where that keeps every relative position
    below L (N - 1 - S + W <= L - 1), else the smallest S that does; none when it would exceed L (the near
    pairs then see distances up to S - 1 >= L): STRING reaches at most 2L - W."""
    local, default = p["local_window"], int(0.33 * trained)
    needed = target - trained + local
    if needed > trained:
        raise ScalingError(
            f"scaling 'string' cannot reach {target} tokens on a model trained on {trained}: with "
            f"local_window={local} its relative positions stay below {trained} only up to "
            f"{2 * trained - local} tokens (2L - W); choose a target <= {2 * trained - local} or a "
            f"smaller scaling.local_window"
        )
    if needed <= default:
        return default, f"int(0.33 L) = int(0.33 x {trained}) (the reference's; N - 1 - S + W <= L - 1 holds)"
    return needed, f"smallest S with N - 1 - S + W <= L - 1: {target} - {trained} + {local}"


@register(
    "string",
    kind="attention",
    check=check_string,
    targets={"offset": offset_for_target},
    context_defaults=lambda p: {"offset": string_offset(p)},
    params={
        "offset": Param(
            None, int, "shifted offset S (default int(0.33 L)): pairs at m - n >= S are shifted", minimum=1
        ),
        "local_window": Param(128, int, "small local value W: shifted pairs see m - n - S + W", minimum=0),
        "attention_factor": Param(
            0.1 * math.log(2) + 1, float, "cos/sin factor (the reference's 0.1 ln 2 + 1)", above=0.0
        ),
        "original_max_position": TRAINED,
    },
)
def string(p) -> PositionRule:
    """STRING: relative position m - n - S + W where m - n >= S; cos/sin times the attention factor."""
    offset, local = string_offset(p), p["local_window"]
    return PositionRule(
        "string",
        (
            _near(offset),
            _far(offset, lambda m: m.double() - offset + local, None, "shifted"),
        ),
        None,
        float(p["attention_factor"]),
    )


def _span_for_target(p: dict, trained: int, target: int) -> tuple[int, str]:
    return trained, f"the trained context {trained} (LM-Infinite's n_local = L: every distance seen was trained on)"


@register(
    "lm_infinite",
    kind="attention",
    targets={"local_span": _span_for_target},
    context_defaults=lambda p: {"local_span": p["original_max_position"]},
    params={
        "global_tokens": Param(10, int, "the first tokens every query sees (at distance local_span)", minimum=0),
        "local_span": Param(None, int, "the last keys seen at their own distance (default L)", minimum=1),
        "original_max_position": TRAINED,
    },
)
def lm_infinite(p) -> PositionRule:
    """LM-Infinite: a Lambda-shaped mask; the global tokens beyond the local span at distance local_span."""
    import torch

    local = p["local_span"] if p["local_span"] is not None else p["original_max_position"]
    first = p["global_tokens"]
    return PositionRule(
        "lm_infinite",
        (
            _near(local),
            Piece(
                "global",
                torch.zeros_like,
                lambda m: (m - local + 1).clamp(min=0, max=first),
                lambda m: torch.full(m.shape, float(local), dtype=torch.float64, device=m.device),
                lambda n: torch.zeros(n.shape, dtype=torch.float64, device=n.device),
            ),
        ),
        complete=False,
    )
