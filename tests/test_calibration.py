"""Calibration of the verdict's intervals (evals/core/stats.py): seeded simulations with known truth, one per interval the
verdict uses, each measured for coverage (the 95% interval holds the truth) and false yes (the truth sits exactly on
the limit and the interval excludes it on the passing side; nominal 2.5%). Monte Carlo error at 2000 replications:
+-0.5 points on a 95% coverage, +-0.35 on a 2.5% rate. The numbers are in docs/verdict.md (``pytest -s`` prints them).

- One document, block NLLs correlated like SmolLM2's on Emma (lags 1-4: 0.27, 0.11, 0.13, 0.14): a persistent AR(1)
  (phi 0.95, 14% of the variance) plus a short one (0.16) gives 0.25, 0.13, 0.10, 0.09; the two models' per-block
  difference on shared tokens an AR(1) of 0.27; shared + own blocks as at 1x (all shared), 2x (half) and 4x, down to
  8 blocks in all (MIN_BLOCKS); at 2x and 4x also with the strategy worse past T -- a level step of 1.45 nats, and
  a ramp 4.35 r^2 (r the share of the own blocks passed) like the unscaled model's doubling on Emma (x2.06, the
  chunk means of its 8k-16k blocks) -- which must not widen the interval.
- Several documents: per-document differences normal or skewed (lognormal sigma 0.5, 1), equal and unequal token
  weights (one 10,000-token document and 19 of 256 tokens), documents on each side that differ (compared on the
  shared ones only).
- Paired accuracies: the reference always or nearly always right, small n.
("About k more units would decide it", followed: tests/test_advice.py.)"""

import numpy as np
import pytest


from evals.core.stats import (
    MIN_BLOCKS,
    MIN_PROMPTS,
    cluster_interval,
    hac_interval,
    influence,
    one_document_interval,
    paired_log_ratio,
    paired_proportion_ratio,
    tang_interval,
)

REPS = 2000
DELTA = 0.05  # the true mean NLL difference (a ratio of exp(0.05))


def ar(rng, reps: int, n: int, phi: float) -> np.ndarray:
    """Stationary AR(1) rows of unit variance."""
    x = np.empty((reps, n))
    x[:, 0] = rng.standard_normal(reps)
    shocks = rng.standard_normal((reps, n)) * np.sqrt(1 - phi * phi)
    for t in range(1, n):
        x[:, t] = phi * x[:, t - 1] + shocks[:, t]
    return x


def difficulty(rng, reps: int, n: int) -> np.ndarray:
    """Block NLLs of one novel (sd 0.3): lags 1-4 about 0.25, 0.13, 0.10, 0.09."""
    return 0.3 * (np.sqrt(0.14) * ar(rng, reps, n, 0.95) + np.sqrt(0.86) * ar(rng, reps, n, 0.159))


def past_T(kind: str, shared: int, own: int) -> np.ndarray:
    """The strategy's loss on each block: none, a step of 1.45 nats past T, or Emma's ramp 4.35 r^2 (mean 1.45)."""
    t = np.arange(shared + own)
    r = (t - shared + 0.5) / max(own, 1)
    return {"none": 0.0 * t, "step": 1.45 * (t >= shared), "ramp": np.where(t >= shared, 4.35 * r * r, 0.0)}[kind]


def one_document(shared: int, own: int, seed: int, effect: str = "none"):
    """(low, high, truth) of REPS one-document comparisons: the strategy on shared + own blocks, the reference on the
    shared ones (the first), both 256 tokens a block; the strategy worse past T by :func:`past_T`."""
    rng = np.random.default_rng(seed)
    n = shared + own
    x = difficulty(rng, REPS, n)
    loss = past_T(effect, shared, own)
    a = x + DELTA + 0.05 * ar(rng, REPS, n, 0.27) + loss
    b = np.where(np.arange(n) < shared, x, 0.0)
    wb = np.broadcast_to((np.arange(n) < shared) * 256.0, (REPS, n))
    _, low, high, _, _, _ = one_document_interval(256 * a, np.full((REPS, n), 256.0), 256 * b, wb)
    return low, high, DELTA + float(loss.mean())


def rates(low, high, truth: float) -> tuple[float, float, float]:
    """(coverage, miss below: the whole interval under the truth, miss above)."""
    return float(np.mean((low <= truth) & (truth <= high))), float(np.mean(high < truth)), float(np.mean(low > truth))


def test_the_interval_matches_its_vectorised_form():
    rng = np.random.default_rng(0)
    a = {f"doc/{256 * t}": (256 * (3 + v), 256.0) for t, v in enumerate(rng.normal(0, 0.3, 24))}
    b = {k: (s - 256 * rng.normal(0.05, 0.05), w) for k, (s, w) in list(a.items())[:12]}
    found = paired_log_ratio(a, b)
    sa, wa = zip(*a.values())
    sb = [b[k][0] if k in b else 0.0 for k in a]
    wb = [b[k][1] if k in b else 0.0 for k in a]
    _, low, high, _, _, method = one_document_interval(sa, wa, sb, wb)
    assert (found["low"], found["high"]) == pytest.approx((low[0], high[0]))
    assert found["n"] == 24 and not found["clustered"] and found["method"] == method == "segments"
    full = {k: (s - 256 * rng.normal(0.05, 0.05), w) for k, (s, w) in a.items()}  # 1x: every block on both sides
    estimate, u, _ = influence(sa, wa, *zip(*full.values()))
    assert paired_log_ratio(a, full)["method"] == "hac"
    assert paired_log_ratio(a, full)["low"] == pytest.approx(hac_interval(u, estimate)[0][0])


def test_a_loss_past_T_moves_the_one_document_interval_without_widening_it():
    """Real blocks: the first scores 255 tokens (its first token has no context), the rest 256; the strategy 1.45 nats
    worse on every block past T moves the estimate and both ends by the same amount, and leaves the width alone."""
    rng = np.random.default_rng(3)
    w = np.full(64, 256.0)
    w[0] = 255.0
    x = 3.2 + 0.3 * rng.standard_normal(64)
    wb = np.where(np.arange(64) < 32, w, 0.0)
    sb = np.where(np.arange(64) < 32, x * w, 0.0)
    flat = one_document_interval(x * w, w, sb, wb)
    worse = one_document_interval((x + 1.45 * (np.arange(64) >= 32)) * w, w, sb, wb)
    assert flat[5] == worse[5] == "segments"
    shift = worse[0][0] - flat[0][0]
    assert shift == pytest.approx(1.45 * 32 * 256 / w.sum())
    assert (worse[1][0] - flat[1][0], worse[2][0] - flat[2][0]) == pytest.approx((shift, shift))


@pytest.mark.parametrize(
    "shared,own,effect",
    [(8, 0, "none"), (16, 0, "none"), (32, 0, "none"), (64, 0, "none")]  # 1x
    + [(4, 4, "none"), (8, 8, "none"), (16, 16, "none"), (32, 32, "none"), (64, 64, "none")]  # 2x
    + [(4, 4, "ramp"), (32, 32, "step"), (32, 32, "ramp")]
    + [(2, 6, "none"), (4, 12, "none"), (16, 48, "none"), (32, 96, "none"), (32, 96, "ramp")],  # 4x
)
def test_one_document_with_correlated_blocks(shared, own, effect):
    low, high, truth = one_document(shared, own, seed=shared * 1000 + own, effect=effect)
    coverage, below, above = rates(low, high, truth)
    width = float(np.mean(high - low))
    print(
        f"one document {shared}+{own} blocks, {effect} past T: coverage {coverage:.3f}, false yes {below:.3f}, "
        f"false NO {above:.3f}, mean width {width:.3f}"
    )
    assert shared + own >= MIN_BLOCKS
    assert coverage >= 0.94 and below <= 0.03 and above <= 0.03


@pytest.mark.parametrize("shared,own", [(8, 8), (32, 32), (64, 64), (16, 48), (32, 96)])
def test_a_loss_past_T_does_not_widen_the_one_document_interval(shared, own):
    """Emma's unscaled doubling (the blocks past T worse, a ramp): the interval's width is what it is without the
    loss, and under half the whole-series Bartlett HAC's with it (4.33 at 32 + 32 in the log ratio; on Emma itself
    x2.06 [0.25, 17.2])."""
    widths = [float(np.mean(np.subtract(*one_document(shared, own, 7, effect)[1::-1]))) for effect in ("none", "ramp")]
    print(f"one document {shared}+{own}: mean width {widths[0]:.3f} without a loss past T, {widths[1]:.3f} with")
    assert widths[1] == pytest.approx(widths[0]) and widths[1] <= 2.0


def documents(rng, reps: int, count: int, sigma: float, weights=None):
    """(estimate, influences, weight shares) of ``count`` documents whose paired differences are normal
    (sigma 0) or lognormal-skewed, mean DELTA, sd 0.03, plus within-document noise 0.03 / sqrt(blocks)."""
    if sigma:
        raw = rng.lognormal(0, sigma, (reps, count))
        z = (raw - np.exp(sigma**2 / 2)) / np.sqrt((np.exp(sigma**2) - 1) * np.exp(sigma**2))
    else:
        z = rng.standard_normal((reps, count))
    blocks = np.broadcast_to(np.full(count, 32.0) if weights is None else np.asarray(weights, float), (reps, count))
    d = DELTA + 0.03 * z + 0.03 * rng.standard_normal((reps, count)) / np.sqrt(blocks)
    base = 3 + 0.3 * rng.standard_normal((reps, count))  # the documents' own difficulty, shared by both sides
    w = 256 * blocks
    return influence((base + d) * w, w, base * w, w)


@pytest.mark.parametrize("sigma", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("count", [2, 3, 4, 6, 10, 20])
def test_several_documents_normal_and_skewed(count, sigma):
    rng = np.random.default_rng(count * 10 + int(10 * sigma))
    estimate, u, h = documents(rng, REPS, count, sigma)
    coverage, below, above = rates(*cluster_interval(u, h, estimate)[:2], DELTA)
    print(f"{count} documents, sigma {sigma}: coverage {coverage:.3f}, false yes {below:.3f}, false NO {above:.3f}")
    bound = 0.05 if sigma == 1.0 else 0.03  # strongly skewed: small samples cannot see the tail (docs/verdict.md)
    assert coverage >= 0.94 and below <= bound and above <= 0.03


@pytest.mark.parametrize("sigma", [0.0, 1.0])
def test_one_large_document_among_tiny_ones_counts_as_about_one(sigma):
    rng = np.random.default_rng(5)
    estimate, u, h = documents(rng, REPS, 20, sigma, weights=[39.0] + [1.0] * 19)
    low, high, _, df = cluster_interval(u, h, estimate)
    coverage, below, above = rates(low, high, DELTA)
    print(f"1 large + 19 tiny documents, sigma {sigma}: coverage {coverage:.3f}, false yes {below:.3f}")
    assert float(np.median(df)) < 2 and coverage >= 0.94 and below <= 0.03


def different_document_sets(rng, reps: int) -> tuple[float, float]:
    """(coverage, false yes) of ``reps`` comparisons of six documents a side, three in common."""
    covered = below = 0
    for _ in range(reps):
        base = rng.normal(3, 0.3, (9, 16))
        effect = DELTA + rng.normal(0, 0.03, (9, 1))
        own = base + effect + rng.normal(0, 0.02, base.shape)
        a = {f"doc{d}/{256 * t}": (256 * own[d, t], 256.0) for d in range(6) for t in range(16)}
        b = {f"doc{d}/{256 * t}": (256 * base[d, t], 256.0) for d in range(3, 9) for t in range(16)}
        found = paired_log_ratio(a, b)
        assert found["documents"] == 3 and found["clustered"]
        covered += found["low"] <= DELTA <= found["high"]
        below += found["high"] < DELTA
    return covered / reps, below / reps


def test_different_documents_on_each_side_are_compared_on_the_shared_ones():
    """Six documents each, three in common: the old pooled bootstrap covered 25-32%."""
    coverage, below = different_document_sets(np.random.default_rng(9), 400)
    print(f"different document sets, 3 shared: coverage {coverage:.3f}, false yes {below:.3f}")
    assert coverage >= 0.94 and below <= 0.03
    assert paired_log_ratio({"x/0": (1.0, 1.0), "x/1": (2.0, 1.0)}, {"y/0": (1.0, 1.0), "y/1": (2.0, 1.0)}) is None


def paired_scores(rng, reps: int, n: int, p_ref: float, ratio: float):
    """Tables of ``n`` paired prompts: the reference right with p_ref, the strategy right with ratio * p_ref, as
    correlated as the two allow (the strategy right only where the reference is, when p_ref = 1 trivially)."""
    ref = rng.random((reps, n)) < p_ref
    keep = rng.random((reps, n)) < ratio
    own = ref & keep
    x11 = (own & ref).sum(1)
    x12 = (own & ~ref).sum(1)
    x21 = (~own & ref).sum(1)
    return x11, x12, x21, n - x11 - x12 - x21


@pytest.mark.parametrize("p_ref", [1.0, 0.95, 0.8])
@pytest.mark.parametrize("n", [4, 8, 12, 20, 30, 60, 100])
def test_paired_accuracies_at_the_limit(n, p_ref):
    """The strategy keeps exactly 85% of the reference's accuracy: yes (the interval above 0.85) is a false yes."""
    rng = np.random.default_rng(n * 100 + int(100 * p_ref))
    low, high = tang_interval(*paired_scores(rng, REPS, n, p_ref, 0.85))
    coverage, below, above = rates(low, high, 0.85)
    print(f"accuracy n={n} reference {p_ref}: coverage {coverage:.3f}, false yes {above:.3f}, false NO {below:.3f}")
    assert n >= MIN_PROMPTS and coverage >= 0.94 and above <= 0.03 and below <= 0.03


def test_perfect_accuracy_on_both_sides_needs_24_prompts_for_yes():
    def low(n):
        return paired_proportion_ratio({str(i): (1.0, 1.0) for i in range(n)}, {str(i): (1.0, 1.0) for i in range(n)})[
            0
        ]

    assert low(12) < 0.85 <= low(24) and low(23) < 0.85  # 12/12 against 12/12 was yes


def fgn(rng, reps: int, n: int, hurst: float) -> np.ndarray:
    """Fractional Gaussian noise rows of unit variance (exact, by the Cholesky factor of its covariance)."""
    k = np.arange(n)
    gamma = 0.5 * (np.abs(k + 1) ** (2 * hurst) - 2 * k ** (2 * hurst) + np.abs(k - 1) ** (2 * hurst))
    return rng.standard_normal((reps, n)) @ np.linalg.cholesky(gamma[np.abs(k[:, None] - k[None, :])]).T


def long_memory_rates(blocks: int, hurst: float):
    """(coverage, false yes, false NO, the method) of the one-document interval at 1x, block differences fGn."""
    rng = np.random.default_rng(blocks * 100 + int(100 * hurst))
    x = difficulty(rng, REPS, blocks)
    a = x + DELTA + 0.05 * fgn(rng, REPS, blocks, hurst)
    w = np.full((REPS, blocks), 256.0)
    _, low, high, _, _, method = one_document_interval(256 * a, w, 256 * x, w)
    return (*rates(low, high, DELTA), method)


@pytest.mark.parametrize("hurst", [0.5, 0.7, 0.75])
@pytest.mark.parametrize("blocks", [8, 32, 128])
def test_one_document_at_1x_with_long_memory(blocks, hurst):
    """Short-context retention on one document (every block on both sides): the per-block differences as fractional
    Gaussian noise (H 0.7: a lag-1 correlation of 0.32, as real text's), the documents' own difficulty shared by
    both sides. With Kiefer & Vogelsang's short-memory critical value it covered 0.80-0.92 at H 0.7-0.75."""
    coverage, below, above, method = long_memory_rates(blocks, hurst)
    print(f"one document at 1x, {blocks} blocks, fGn H {hurst}: coverage {coverage:.3f}, false yes {below:.3f}")
    assert method == "hac" and coverage >= 0.93 and below <= 0.04 and above <= 0.04


def drifting_documents(rng, count: int, shared: int, shift: float):
    """(strategy units at 2x, reference units at T) of ``count`` documents of 2 x ``shared`` blocks whose text gets
    harder along the document: a ramp whose second half is ``shift`` nats harder on average; the strategy DELTA worse
    everywhere."""
    own, ref = {}, {}
    n = 2 * shared
    ramp = 2 * shift * ((np.arange(n) + 0.5) / n - 0.5)
    x = 3 + difficulty(rng, count, n) + ramp
    a = x + DELTA + 0.05 * ar(rng, count, n, 0.27)
    for d in range(count):
        for t in range(n):
            own[f"doc{d}/{256 * t}"] = (256 * a[d, t], 256.0)
            if t < shared:
                ref[f"doc{d}/{256 * t}"] = (256 * x[d, t], 256.0)
    return own, ref


def drift_rates(count: int, shift: float, reps: int, shared: int = 16) -> tuple[int, int]:
    """(warned, the 2x interval covered the strategy's own loss) of ``reps`` drifting samples: the position check
    (evals/core/decision/positions.py) and the paired interval on them."""
    from evals.core.decision.positions import position_drift

    rng = np.random.default_rng(count * 10 + int(100 * shift))
    warned = covered = 0
    for _ in range(reps):
        own, ref = drifting_documents(rng, count, shared, shift)
        found = position_drift(own, ref, 0.1, 2 * shared * 256, shared * 256)
        warned += bool(found and found["warn"])
        if shift:
            interval = paired_log_ratio(own, ref)
            covered += interval["low"] <= DELTA <= interval["high"]
    return warned, covered


@pytest.mark.parametrize(
    "count,shift,warned_at_least,warned_at_most",
    [(20, 0.0, 0, 0.05), (1, 0.0, 0, 0.05), (20, np.log(1.3), 0.7, 1)],
)
def test_a_drift_with_position_is_warned_about(count, shift, warned_at_least, warned_at_most):
    """The own-only half of every document harder than the shared one (a drift under way within T): read as the
    strategy's loss by the 2x interval; the position check (evals/core/decision/positions.py) warns, and stays quiet
    on stationary text."""
    reps = 60
    warned, covered = drift_rates(count, shift, reps)
    print(
        f"position drift, {count} documents, own-only half x{np.exp(shift):.2f} harder: warned {warned}/{reps}"
        + (f", the 2x interval covered the strategy's own loss {covered}/{reps}" if shift else "")
    )
    assert warned_at_least <= warned / reps <= warned_at_most


@pytest.mark.parametrize("table", ["accuracies", "several_documents"])
def test_docs_verdict_md_has_the_tables_the_simulations_give(table):
    """docs/verdict.md's calibration tables are written by bench/calibration_tables.py --write from the functions
    above; the two cheap ones are recomputed here (the others take 20 s to minutes: regenerate them with it)."""
    import importlib.util

    from tests.tiny import ROOT

    spec = importlib.util.spec_from_file_location("calibration_tables", ROOT / "bench" / "calibration_tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    text = tables.DOC.read_text()
    assert tables.replace(text, table, tables.TABLES[table]()) == text, (
        f"docs/verdict.md's {table} table is stale: python bench/calibration_tables.py {table} --write"
    )
