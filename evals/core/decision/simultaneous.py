"""Comparisons that hold 95% jointly: the ranked answer (ranking.py) makes many "is A really better than B"
statements in one answer, and picks the leader it compares against by its observed value, so each comparison at
95% on its own would declare a non-tie among equal strategies far more often than 5% (with 2, 3 and 5 equal
strategies the share of split sweeps grows with their number: bench/ranking_ties.py measures it, docs/verdict.md).

- The family: every pair of the answer's strategies that measured the primary metric on shared units -- all pairs,
  not only those against the leader, because the leader is the observed best (against it, the largest of k-1
  differences is the range of k draws).
- One rule for the decision and for what is printed: each pair's interval at the simultaneous level 1 - alpha / m
  (Bonferroni; Dunn 1961, "Multiple comparisons among means", JASA 56:52-64): the m intervals cover their ratios
  together with probability >= 95% under any dependence between them, so two strategies are tied exactly when the
  interval printed between them holds 1, and among strategies of equal quality a non-tie is declared in at most 5%
  of sweeps however many there are. (Holm's step-down, which the ranking used before, rejects more pairs than the
  intervals exclude: a strategy could be outside the leader's group while its printed interval held 1.)
- A pair's interval at another level comes from the verdict's own 95% interval (verdict.paired_ratio) through a
  normal pivot: on the log scale, estimate +/- q * half-width, each side keeping its own half-width (a score of 0,
  whose interval [0, h] has no log scale: on the ratio scale). Conservative: the verdict's calibrated intervals are
  wider than a normal 95% interval (over documents a Hall-corrected t at 99.4%, Tang at 96%: evals/core/stats.py), so the
  family-wise error stays below 5% (bench/ranking_ties.py and tests/test_ranking.py measure it, with the real
  verdicts); the price is power.
"""

from __future__ import annotations

import math

ALPHA = 0.05
LEVEL = 0.95  # the level of the verdict's intervals (verdict.paired_ratio)


def _pivot(versus: dict):
    """(quantile, survival) functions of the normal pivot (scipy.special's ufuncs: the ranking makes m(m-1)/2 of
    these per answer)."""
    from scipy import special

    return lambda p: float(special.ndtri(p)), lambda x: float(special.ndtr(-x))


def widened(versus: dict | None, pairs: int) -> dict | None:
    """The pair's interval at the simultaneous level 1 - ALPHA / pairs (Bonferroni), from its 95% interval."""
    if not versus or versus.get("low") is None or pairs <= 1 or versus["low"] == versus["high"]:
        return versus
    quantile, _ = _pivot(versus)
    # each side's half-width scaled by q_{1 - alpha/(2m)} / q_{0.975}
    scale = quantile(1 - ALPHA / (2 * pairs)) / quantile(0.5 + LEVEL / 2)
    if versus["ratio"] <= 0 or versus["low"] <= 0:  # a score of 0: widened on the ratio scale, kept >= 0
        ratio = versus["ratio"]
        low = max(0.0, ratio - (ratio - versus["low"]) * scale)
        return {**versus, "low": low, "high": ratio + (versus["high"] - ratio) * scale}
    estimate = math.log(versus["ratio"])
    low = estimate - (estimate - math.log(versus["low"])) * scale
    high = estimate + (math.log(versus["high"]) - estimate) * scale
    return {**versus, "low": math.exp(low), "high": math.exp(high)}


def holds_one(versus: dict | None) -> bool:
    """Whether a (simultaneous) interval holds a ratio of 1: the two strategies are tied. No interval: not tied
    (nothing shows them equal; the answer orders them by value)."""
    return bool(versus) and versus.get("low") is not None and versus["low"] <= 1 <= versus["high"]
