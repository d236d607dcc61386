"""Comparisons that hold 95% jointly: the ranked answer (ranking.py) makes many "is A really better than B"
statements in one answer, and picks the leader it compares against by its observed value, so each comparison at
95% on its own declares a non-tie among equal strategies far more often than 5% (tests/test_ranking.py, 1000
simulated sweeps each: 4.4%, 12.2% and 27.2% with 2, 3 and 5 equal strategies; with these comparisons 4.4%, 3.9%
and 3.0%).

- The family: every pair of the answer's strategies that measured the primary metric on shared units -- all pairs,
  not only those against the leader, because the leader is the observed best (against it, the largest of k-1
  differences is the range of k draws: Holm over the k-1 comparisons against the leader alone still declared a
  non-tie in 6.1% (3) and 8.0% (5) of 20000 simulated sweeps of paired t-tests over 6 documents).
- The decisions (separated or tied): Holm's step-down procedure (Holm 1979, "A simple sequentially rejective
  multiple test procedure", Scand. J. Statist. 6:65-70) on the pairs' p-values: sorted p(1) <= ... <= p(m), reject
  while p(i) <= alpha / (m - i + 1); the family-wise error is at most alpha under any dependence between them.
- The intervals shown: simultaneous (Bonferroni), each at level 1 - alpha / m (Dunn 1961, "Multiple comparisons
  among means", JASA 56:52-64): they cover all m ratios together with probability >= 95%. Holm rejects every pair
  whose simultaneous interval excludes 1, and possibly more.
- A pair's p-value and its interval at another level come from the verdict's own 95% interval
  (verdict.paired_ratio) inverted through a normal pivot: on the log scale, estimate +/- q * half-width, each side
  keeping its own half-width (a score of 0, whose interval [0, h] has no log scale: on the ratio scale).
  Conservative: the verdict's calibrated intervals are wider than a normal 95% interval (over documents a
  Hall-corrected t at 99.4%, Tang at 96%: evals/stats.py), so the p-values are larger than their own levels imply
  and the family-wise error stays below 5% (tests/test_ranking.py measures it); the price is power.
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


def p_value(versus: dict | None) -> float | None:
    """The two-sided p-value of "the ratio is 1" that the pair's 95% interval implies (None: no interval)."""
    if not versus or versus.get("low") is None or versus.get("ratio") is None:
        return None
    if versus["ratio"] <= 0 or versus["low"] <= 0:  # a score of 0 (Tang's [0, h]): no log scale; the ratio scale
        estimate, low, high = versus["ratio"] - 1, versus["low"] - 1, versus["high"] - 1
    else:
        estimate, low, high = math.log(versus["ratio"]), math.log(versus["low"]), math.log(versus["high"])
    half = estimate - low if estimate >= 0 else high - estimate  # the side of the interval towards 1
    if half <= 0:
        return 1.0 if estimate == 0 else 0.0
    quantile, survival = _pivot(versus)
    # z = q_{0.975} * |log ratio| / half-width: the statistic the interval was built from
    return min(1.0, 2 * survival(quantile(0.5 + LEVEL / 2) * abs(estimate) / half))


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


def holm(p_values: dict, alpha: float = ALPHA) -> dict:
    """Holm's adjusted p-values (Holm 1979): p~(i) = max_{j <= i} min(1, (m - j + 1) p(j)) over the sorted p-values;
    a hypothesis is rejected at family-wise level alpha where p~ <= alpha."""
    ordered = sorted(p_values, key=lambda key: p_values[key])
    m, running, adjusted = len(ordered), 0.0, {}
    for j, key in enumerate(ordered):
        running = max(running, min(1.0, (m - j) * p_values[key]))
        adjusted[key] = running
    return adjusted
