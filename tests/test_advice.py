"""The advice of an inconclusive verdict, followed (evals/core/planning.py, evals/core/decision/verdict.py): seeded
simulations with known truth in which the units a line names are added from the same truth and the verdict judged
again -- how often "about k more units would likely decide it" then decides, per scenario (documents alike, unequal or
freshly drawn weights, skewed documents, two documents, prompts), counting the lines as printed; the rates the lines
state are these (docs/verdict.md's table, bench/calibration_tables.py)."""

import numpy as np
import pytest

from evals.core.planning import FEW_RATE, FOLLOWED, PLAIN, PLAIN_RATES, more_units
from evals.core.stats import cluster_critical, cluster_interval, document_critical, influence, tang_interval


def test_more_documents_followed_decide_it():
    """Six documents, a true ratio 4% from the limit: when inconclusive, the documents it names are added."""
    rng = np.random.default_rng(11)
    truth, limit = np.log(1.06), np.log(1.1)
    decided = asked = 0
    for _ in range(150):
        d = truth + 0.05 * rng.standard_normal(6)
        estimate, u, h = influence(3 + d, np.ones(6), np.full(6, 3.0), np.ones(6))
        low, high, se, df = cluster_interval(u, h, estimate)
        if high[0] <= limit or low[0] > limit:
            continue
        half = high[0] - estimate[0] if limit > estimate[0] else estimate[0] - low[0]
        more = more_units(6, float(half), float(abs(limit - estimate[0])), cluster_critical(df[0], 6), float(df[0]))
        asked += 1
        if more is None:
            continue
        more = min(more, 3000)  # the interval's O(n^2) memory; deciding with fewer than advised only lowers the rate
        d = np.concatenate([d, truth + 0.05 * rng.standard_normal(more)])
        m = len(d)
        estimate, u, h = influence(3 + d, np.ones(m), np.full(m, 3.0), np.ones(m))
        low, high, _, _ = cluster_interval(u, h, estimate)
        decided += bool(high[0] <= limit or low[0] > limit)
    print(f"more documents, followed: decided {decided}/{asked}")
    assert asked >= 50 and decided / asked >= 0.8
    assert cluster_critical(5.0, 6)(np.array([6, 12])) == pytest.approx(document_critical(np.array([6, 12])))


def test_more_prompts_followed_decide_it():
    """The reference always right, the strategy right 95% (limit 0.85), 20 prompts."""
    rng = np.random.default_rng(12)
    decided = asked = 0
    for _ in range(400):
        own = rng.random(20) < 0.95
        low, high = tang_interval(own.sum(), 0, (~own).sum(), 0)
        if low >= 0.85 or high < 0.85:
            continue
        ratio = own.mean()
        more = more_units(20, float(ratio - low) if ratio > 0.85 else float(high - ratio), float(abs(ratio - 0.85)))
        asked += 1
        if more is None:
            continue
        own = np.concatenate([own, rng.random(more) < 0.95])
        low, high = tang_interval(own.sum(), 0, (~own).sum(), 0)
        decided += bool(low >= 0.85 or high < 0.85)
    print(f"more prompts, followed: decided {decided}/{asked}")
    assert asked >= 50 and decided / asked >= 0.8


def plan(n: int, estimate: float, low: float, high: float, se: float, df, effective, limit: float):
    """(kind, k) of the advice the verdict prints for an inconclusive log-ratio interval (evals/core/decision/verdict.py
    ``_advice``: the side facing the limit, no shorter than t se, in the log)."""
    from evals.core.planning import advise

    half = high - estimate if limit > estimate else estimate - low
    half = max(half, float(cluster_critical(df, n)(n)) * se)
    kind, more, point = advise(
        n, float(half), float(abs(limit - estimate)), cluster_critical(df, n), float(df), effective
    )
    return kind, more if kind != "plain" else point


def followed_documents(rng, weights, sigma: float, reps: int, fresh=None):
    """{kind: (decided, asked)} of the advice followed, by what the line says (evals/core/planning.py ``advise``: "promise"
    = "about k more documents would likely decide it", "few" = two documents, k with its measured rate; "plain" =
    more than 20x for a plan that holds, the plan on the current spread followed where it is within 20x; "none":
    no number): documents of ``weights`` (the added ones repeat the pattern; ``fresh(rng, k)``:
    every document's weight drawn afresh instead), paired differences log 1.06 against a limit of log 1.1, sd 0.05,
    normal or lognormal-skewed."""
    weights = np.asarray(weights, float)
    truth, limit = np.log(1.06), np.log(1.1)

    def draw(k):
        if not sigma:
            return truth + 0.05 * rng.standard_normal(k)
        raw = rng.lognormal(0, sigma, k)
        return truth + 0.05 * (raw - np.exp(sigma**2 / 2)) / np.sqrt((np.exp(sigma**2) - 1) * np.exp(sigma**2))

    def interval(d, w):
        estimate, u, h = influence((3 + d) * w, w, 3.0 * w, w)
        low, high, se, df = cluster_interval(u, h, estimate)
        return estimate[0], low[0], high[0], se[0], df[0]

    found = {"promise": [0, 0], "few": [0, 0], "plain": [0, 0], "none": [0, 0]}
    for _ in range(reps):
        w0 = weights if fresh is None else fresh(rng, len(weights))
        d = draw(len(w0))
        estimate, low, high, se, df = interval(d, w0)
        if high <= limit or low > limit:
            continue
        kind, more = plan(len(w0), estimate, low, high, se, df, w0.sum() ** 2 / (w0 * w0).sum(), limit)
        if kind == "plain" and not (more and more <= PLAIN * len(w0)):  # no number on the current spread either
            kind = "none"
        found[kind][1] += 1
        if kind == "none":
            continue
        w = np.concatenate([w0, np.resize(w0, more) if fresh is None else fresh(rng, more)])
        _, low, high, _, _ = interval(np.concatenate([d, draw(more)]), w)
        found[kind][0] += bool(high <= limit or low > limit)
    return found


def lognormal_weights(sigma: float):
    """Documents' token weights drawn afresh, lognormal(0, sigma) x 1000 tokens (a few documents carry most)."""
    return lambda rng, k: np.maximum(np.round(1000 * rng.lognormal(0, sigma, k)), 1.0)


def exponential_weights(rng, k):
    """Documents' token weights drawn afresh, exponential with mean 500 tokens."""
    return np.maximum(np.round(rng.exponential(500, k)), 1.0)


def followed_prompts(rng, n: int, p_ref: float, p_own: float, reps: int):
    """{kind: (decided, asked)} of "about k more prompts" followed (as :func:`followed_documents`): the strategy right
    independently of the reference."""
    from evals.core.planning import advise

    found = {"promise": [0, 0], "few": [0, 0], "plain": [0, 0], "none": [0, 0]}

    def table(ref, own):
        return (own & ref).sum(), (own & ~ref).sum(), (~own & ref).sum(), (~own & ~ref).sum()

    for _ in range(reps):
        ref, own = rng.random(n) < p_ref, rng.random(n) < p_own
        counts = table(ref, own)
        low, high = (float(x) for x in tang_interval(*counts))
        if low >= 0.85 or high < 0.85:
            continue
        ratio = (counts[0] + counts[1]) / (counts[0] + counts[2])
        kind, more, point = advise(n, ratio - low if ratio > 0.85 else high - ratio, abs(ratio - 0.85))
        if kind == "plain":
            kind, more = ("plain", point) if point and point <= PLAIN * n else ("none", None)
        found[kind][1] += 1
        if kind == "none":
            continue
        ref, own = np.concatenate([ref, rng.random(more) < p_ref]), np.concatenate([own, rng.random(more) < p_own])
        low, high = (float(x) for x in tang_interval(*table(ref, own)))
        found[kind][0] += bool(low >= 0.85 or high < 0.85)
    return found


def followed(weights, sigma=0.0, fresh=None):
    """A scenario of :func:`followed_documents`: (rng, reps) -> its counts."""
    return lambda rng, reps: followed_documents(rng, weights, sigma, reps, fresh)


WORST = FOLLOWED["documents"][1] - 0.05  # the measured floor the line states, less Monte Carlo slack
ADVICE = {  # scenario: (how it is drawn, the rate "would likely decide it" must reach followed)
    "2 documents": (followed([1, 1]), 0.8),
    "3 documents": (followed([1, 1, 1]), 0.8),
    "6 documents, weights 4,4,1,1,1,1": (followed([4, 4, 1, 1, 1, 1]), 0.8),
    "6 documents, weights 1..6": (followed([1, 2, 3, 4, 5, 6]), 0.8),
    "6 documents, weights 10,1,1,1,1,1": (followed([10] + [1] * 5), WORST),
    "6 documents, lognormal sigma 1": (followed([1] * 6, 1.0), WORST),
    "6 documents, weights drawn afresh, lognormal sigma 1.2": (followed([1] * 6, 0, lognormal_weights(1.2)), WORST),
    "8 documents, weights drawn afresh, exponential": (followed([1] * 8, 0, exponential_weights), 0.8),
    "4 documents, lognormal sigma 1, weights drawn afresh": (followed([1] * 4, 1.0, exponential_weights), WORST),
    "30 prompts, independent, 0.80 / 0.76": (lambda rng, reps: followed_prompts(rng, 30, 0.8, 0.76, reps), 0.8),
    "30 prompts, independent, 0.90 / 0.80": (
        lambda rng, reps: followed_prompts(rng, 30, 0.9, 0.8, reps),
        FOLLOWED["prompts"][1] - 0.05,
    ),
}


def rate(decided: int, asked: int) -> str:
    return f"{decided}/{asked} ({decided / asked:.2f})" if asked else "-"


@pytest.mark.slow
@pytest.mark.parametrize("scenario", list(ADVICE))
def test_more_units_followed_decide_it_in_every_scenario(scenario):
    """Followed, each line's number decides as often as the line says (evals/core/planning.py ``advise``), counted by
    what the user reads: "about k more ... would likely decide it" >= 80% (the point plan of the earlier code:
    29-72% in these scenarios), or the measured floor the line states (FOLLOWED) in the scenarios marked lower;
    two documents' line its rate (FEW_RATE); "cannot decide" lines their range (PLAIN_RATES). 1000 samples a
    scenario (~5-15 s each)."""
    draw, floor = ADVICE[scenario]
    found = draw(np.random.default_rng(1), 1000)
    print(f"more units followed, {scenario}: " + ", ".join(f"{k} {rate(*v)}" for k, v in found.items()))
    decided, asked = found["promise"]
    assert asked < 20 or decided / asked >= floor
    decided, asked = found["few"]
    assert asked < 50 or abs(decided / asked - FEW_RATE) <= 0.1
    decided, asked = found["plain"]
    assert asked < 50 or PLAIN_RATES[0] <= decided / asked <= PLAIN_RATES[1]
