"""A position rule: which relative position each causal (query m, key n) pair sees, in pieces.

A :class:`PositionRule` is a few :class:`Piece` s that split the causal pairs -- each holds, for the query at m,
the keys n in an interval [lo(m), hi(m)) whose ends never decrease with m -- each giving the position its query and
its key take there (RoPE then sees their difference); pairs no piece holds are not attended. The attention-level
strategies (:mod:`rope_ext.strategies.attention_level`) are such rules; :mod:`rope_ext.attention.assembled` computes attention exactly
from the pieces, block by block; :meth:`PositionRule.relative` gives the dense map for analysis and display.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch

Positions = Callable[["torch.Tensor"], "torch.Tensor"]


@dataclass(frozen=True)
class Piece:
    """A part of the causal (m, n) pairs and the positions its query and key take there.

    The query at position m holds the keys at positions lo(m) <= n < hi(m) (LongTensors of m's shape;
    hi(m) <= m + 1, and neither end decreases as m grows, so a block of queries holds a band of keys);
    ``query(m)`` / ``key(n)`` give the positions (float64) they take, None for their own."""

    name: str
    lo: Positions
    hi: Positions
    query: Positions | None = None
    key: Positions | None = None

    @property
    def moves(self) -> bool:
        return self.query is not None or self.key is not None

    def region(self, m: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        """Which pairs (m, n) it holds (broadcast LongTensors)."""
        return (n >= self.lo(m)) & (n < self.hi(m))

    def keys(self, first: int, last: int) -> tuple[int, int]:
        """The key positions [lo, hi) it can hold for queries at positions in [first, last]."""
        import torch

        return int(self.lo(torch.tensor(first))), int(self.hi(torch.tensor(last)))


@dataclass(frozen=True)
class PositionRule:
    """An attention-level method: its pieces, a factor on each query by position (ReRoPE's log n), and a
    factor on the rotary dims of queries and keys (STRING's attention factor, as a cos/sin factor)."""

    name: str
    pieces: tuple[Piece, ...]
    query_scale: Positions | None = None
    rotary_scale: float = 1.0
    complete: bool = True  # every causal pair is in some piece (False: the rest is not attended)

    def identity_for(self, first: int, last: int, max_distance: int) -> bool:
        """Whether, for queries at positions [first, last] seeing keys at most ``max_distance`` back, the rule
        changes nothing: only its first piece (which moves no position) holds pairs, it holds them all, and
        no factor applies."""
        import torch

        if self.rotary_scale != 1.0 or self.pieces[0].moves:
            return False
        if self.query_scale is not None and not bool((self.query_scale(torch.tensor([first, last])) == 1).all()):
            return False
        for piece in self.pieces[1:]:
            lo, hi = piece.keys(first, last)
            if max(lo, last - max_distance, 0) < min(hi, last + 1):
                return False
        # a rule that drops pairs (LM-Infinite) is the identity only where its first piece holds every pair
        return self.complete or self.pieces[0].keys(last, last)[0] <= last - max_distance

    def relative(self, m: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The relative position (float64) each pair (m, n) sees and whether it is attended at all."""
        import torch

        m, n = torch.broadcast_tensors(m, n)
        position = torch.zeros(m.shape, dtype=torch.float64)
        seen = torch.zeros(m.shape, dtype=torch.bool)
        for piece in self.pieces:
            here = piece.region(m, n) & (n <= m) & ~seen
            q = piece.query(m) if piece.query else m.double()
            k = piece.key(n) if piece.key else n.double()
            position = torch.where(here, q - k, position)
            seen |= here
        return position, seen
