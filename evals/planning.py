"""How many more units (documents, prompts) would likely decide an inconclusive verdict, said so that it holds when
followed (Miller 2024, "Adding Error Bars to Evals", arXiv 2411.00640, section on power; the intervals are
:mod:`evals.stats`'s).

The number is the smallest k with (q(n + k) + z_0.9) se_plan sqrt(n / (n + k)) <= d_plan: 90% power on a standard
error that shrinks as 1/sqrt(n). Planned on the point values alone (the estimate's distance d from the limit and
its standard error se) it decided only 29-72% of the time when followed with few documents or unequal weights, and
32-59% with prompts of independent outcomes: se rests on few degrees of freedom, and the inconclusive cases are the
ones whose estimate is far from the truth. So it is planned on an upper 80% confidence bound of the standard error,
se sqrt(df / chi2_0.2(df)) (df the interval's own, Bell-McCaffrey's for documents; none for prompts), and on a
distance half a standard error nearer the limit (at least half of it). Followed (tests/test_calibration.py, slow
set; docs/verdict.md): >= 80% in most scenarios of the suite, 73-77% with strongly skewed documents or one document
carrying half the weight. Where the plan is more than
``PLAIN`` times the units at hand, the line says plainly that these units cannot decide it.
"""

from __future__ import annotations

POWER_Z = 1.2816  # z_0.9: 90% power on the planned spread
SPREAD_LEVEL = 0.8  # plan on an upper 80% confidence bound of the standard error
DISTANCE_Z = 0.5  # ... and on a distance half a standard error nearer the limit
DISTANCE_FLOOR = 0.5  # ... but no nearer than half of it
PLAIN = 20  # more than 20x the units at hand: "these units cannot decide it; about N would"


def more_units(
    n: int, half_width: float, distance: float, critical=None, df: float | None = None, cautious: bool = True
) -> int | None:
    """How many more units would likely bring an interval whose side towards a limit is ``half_width`` long (at
    ``n`` units) to exclude that limit, ``distance`` from its estimate. ``critical(m)``: the interval's critical
    value at m units, for an array of m (default 1.96); ``df``: the degrees of freedom its standard error rests on
    (None: many). ``cautious``: plan on the upper bound of the spread and the nearer distance (see the module); else
    on the point values. None when the estimate sits on the limit or more than 10^6 n would be needed."""
    import numpy as np
    from scipy import stats

    if distance <= 1e-12 or n <= 0 or half_width <= 0:
        return None
    q0 = float(critical(n)) if critical else 1.96
    se = half_width / q0
    if cautious:
        if df:
            se = se * float(np.sqrt(df / stats.chi2.ppf(1 - SPREAD_LEVEL, df)))  # upper 80% bound of se
        distance = max(distance - DISTANCE_Z * half_width / q0, distance * DISTANCE_FLOOR)
    totals = np.unique(np.concatenate([n + np.arange(1, 201), np.ceil(n * 1.03 ** np.arange(1, 470))])).astype(int)
    q = np.asarray(critical(totals), float) if critical else np.full(len(totals), q0)
    ok = (q + POWER_Z) * se * np.sqrt(n / totals) <= distance
    return int(totals[np.argmax(ok)] - n) if ok.any() else None
