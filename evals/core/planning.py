"""How many more units (documents, prompts) would likely decide an inconclusive verdict, said so that it holds when
followed (Miller 2024, "Adding Error Bars to Evals", arXiv 2411.00640, section on power; the intervals are
:mod:`evals.core.stats`'s).

The number is the smallest k with (q(n + k) + z_0.9) se_plan sqrt(n_eff / (n_eff + k rho)) <= d_plan: 90% power on
a standard error that shrinks with the effective number of units. n_eff = (sum w)^2 / sum w^2 of the units' weights
(n when they are equal); each added unit is planned to bring rho = (n_eff - 1) / (n - 1) of one (the unbiased
share under weights drawn afresh from the same distribution: the sample's own n_eff / n overstates it by about 1/n,
and heavy-tailed weights rarely show their largest in a few units). Planned on the point values alone (the
estimate's distance d from the limit and its standard error se) it decided only 29-72% of the time when followed
with few documents or unequal weights, and 32-59% with prompts of independent outcomes: se rests on few degrees of
freedom, and the inconclusive cases are the ones whose estimate is far from the truth. So it is planned on an upper
90% confidence bound of the standard error, se sqrt(df / chi2_0.1(df)) (df the interval's own, Bell-McCaffrey's for
documents; none for prompts), and on a distance one standard error nearer the limit (at least 30% of it). Where
the interval is Hall-corrected (documents) the side facing the limit is taken no shorter than t se.

What the line says (:func:`advise`, read by evals/core/decision/verdict.py; followed in tests/test_advice.py,
counting only the lines that promise a decision, and docs/verdict.md's table):

- ``promise``: "about k more ... would likely decide it", with the rates measured followed (``FOLLOWED``): >= 80%
  for documents alike (equal, patterned or exponential weights: 82-98%) and prompts (90%), but 33-49% with
  strongly skewed documents (lognormal sigma 1) or weights drawn afresh from a lognormal, 69% with one document
  carrying half the weight, 48% for prompts of outcomes independent of the reference's near the limit -- cases a
  few units cannot tell apart from the others, so the line states both numbers.
- ``few``: the spread rests on fewer than ``FEW_DF`` degrees of freedom (two documents): the spread itself is
  unknown, and a plan on it is selected where the two happened to agree -- followed, such plans decided only about
  half the time (an independent hold-out: 29-50%). The line says so and states the measured rate (``FEW_RATE``,
  the table's "2 documents, stated rate" row), with the number.
- ``plain``: more than ``PLAIN`` times the units at hand would be needed for a plan that holds: said plainly,
  with the plan on the current spread and its measured rate (``PLAIN_RATES``; the cautious plan's own number, on
  ~1 df, overstated what decides it 10x and more: an independent hold-out decided 98-100% of those cases at 100
  documents against a median "about N" of 300-5400).

Most inconclusive verdicts on 2-6 documents now get the plain line: a plan that holds on so few rarely fits in
20x of them.
"""

from __future__ import annotations

POWER_Z = 1.2816  # z_0.9: 90% power on the planned spread
SPREAD_LEVEL = 0.9  # plan on an upper 90% confidence bound of the standard error
DISTANCE_Z = 1.0  # ... and on a distance one standard error nearer the limit
DISTANCE_FLOOR = 0.3  # ... but no nearer than 30% of it
PLAIN = 20  # more than 20x the units at hand: "these units cannot decide it" (no promise)
FEW_DF = 1.5  # fewer degrees of freedom than this (two documents): no promise, the measured rate instead
# Followed in the suite (tests/test_advice.py ADVICE, 1000 samples a scenario; docs/verdict.md's table), what
# each line states:
FEW_RATE = 0.45  # two documents' plan decided 46% (38% for 4 skewed documents whose weights give ~1 df)
PLAIN_RATES = (0.2, 0.9)  # "cannot decide": the plan on the current spread decided 23-85% (a hold-out: 48-92%)
# "would likely decide it": >= 80% for documents alike (equal, patterned or exponential weights) and prompts whose
# outcomes go with the reference's; as little as the second number where the first units cannot show it
FOLLOWED = {
    "documents": (0.8, 0.33, "strongly skewed documents or widely varying weights"),
    "prompts": (0.8, 0.48, "outcomes independent of the reference's near the limit"),
}


def more_units(
    n: int,
    half_width: float,
    distance: float,
    critical=None,
    df: float | None = None,
    cautious: bool = True,
    effective: float | None = None,
) -> int | None:
    """How many more units would likely bring an interval whose side towards a limit is ``half_width`` long (at
    ``n`` units) to exclude that limit, ``distance`` from its estimate. ``critical(m)``: the interval's critical
    value at m units, for an array of m (default 1.96); ``df``: the degrees of freedom its standard error rests on
    (None: many); ``effective``: the units' effective number (sum w)^2 / sum w^2 (None: n, equal weights).
    ``cautious``: plan on the upper bound of the spread and the nearer distance (see the module); else on the point
    values. None when the estimate sits on the limit or more than 10^6 n would be needed."""
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
    eff = float(min(max(effective, 1.0), n)) if effective else float(n)
    rho = (eff - 1) / (n - 1) if n > 1 and eff < n else 1.0  # what one added unit is worth
    rho = max(rho, 1.0 / n)
    totals = np.unique(np.concatenate([n + np.arange(1, 201), np.ceil(n * 1.03 ** np.arange(1, 470))])).astype(int)
    q = np.asarray(critical(totals), float) if critical else np.full(len(totals), q0)
    ok = (q + POWER_Z) * se * np.sqrt(eff / (eff + (totals - n) * rho)) <= distance
    return int(totals[np.argmax(ok)] - n) if ok.any() else None


def advise(
    n: int, half_width: float, distance: float, critical=None, df: float | None = None, effective: float | None = None
) -> tuple[str, int | None, int | None]:
    """(kind, k, k on the current spread) of the advice for an inconclusive interval (arguments as
    :func:`more_units`): kind "promise" (k more would likely decide it), "few" (the spread rests on fewer than FEW_DF
    degrees of freedom: k is stated with its measured rate), "plain" (more than PLAIN n would be needed, checked
    first; the point plan is given) or "none" (not even 10^6 n)."""
    more = more_units(n, half_width, distance, critical, df, effective=effective)
    point = more_units(n, half_width, distance, critical, df, cautious=False, effective=effective)
    if more is None:
        return "none", None, point
    if more > PLAIN * n:
        return "plain", more, point
    if df is not None and df < FEW_DF:
        return "few", more, point
    return "promise", more, point
