"""Confidence intervals, stated with the method that produced them.

- Across documents (n >= 2): a Student-t interval on the per-document mean NLL, mean +/- t_{0.975, n-1} *
  sd / sqrt(n) (the normal 1.96 understates it badly for few documents: with n = 2, t = 12.7), then exp.
- Accuracies (retrieval, RULER): the Wilson score interval of a binomial proportion (Wilson 1927), which
  keeps inside [0, 1] and stays honest at 0/n and n/n, where the normal approximation claims no doubt at all.
- Within one document: a block bootstrap (Kuensch 1989, "The jackknife and the bootstrap for general
  stationary observations"): the token NLLs cut into consecutive blocks of ``block`` tokens (token losses
  are correlated within a passage), blocks resampled with replacement, the 2.5 / 97.5 percentiles of
  the resampled mean NLL, then exp.

The verdict's paired comparisons (strategy / unscaled on the same units) are below; each method was chosen because
a simulation with known truth says it holds (tests/test_calibration.py, numbers in docs/verdict.md):

- Several documents: the token-weighted estimate with a cluster-robust variance made unbiased for the weighted
  mean (the CR2 idea of Bell & McCaffrey 2002, "Bias reduction in standard errors for linear regression with
  multi-stage samples", Survey Methodology 28:169-181) and their Satterthwaite degrees of freedom (one 10,000-token
  document among 19 tiny ones counts as about one), Hall's (1992, "On the removal of skewness by
  transformation", JRSS B 54:221-228) cubic transformation of the t statistic for skewed per-document
  differences, at 99.7% per side: at 6 documents strongly skewed differences (lognormal sigma 1) are not visible
  in the sample, and only a wider interval keeps false yes near 5% (the power it costs is said in the docs).
- One document, every block held by both sides (1x): its blocks in position order, the estimate's influence series,
  a Bartlett (Newey & West 1987, "A simple, positive semi-definite, heteroskedasticity and autocorrelation consistent
  covariance matrix", Econometrica 55:703-708) long-run variance with the bandwidth the whole series (b = 1) and a
  fixed-b critical value (Kiefer & Vogelsang 2005, "A new asymptotic theory for heteroskedasticity-autocorrelation
  robust tests", Econometric Theory 21:1130-1164) taken under long memory: KV's 4.81 holds for short memory only,
  and block differences of real text look like fractional Gaussian noise (lag-1 correlation ~0.32, H ~0.7), under
  which it covered 0.80-0.88; ``HAC_CRITICAL`` is the b = 1 statistic's quantile under fGn with H = 0.75 (McElroy &
  Politis 2012, "Fixed-b asymptotics for the studentized mean from time series with short, long, or negative
  memory", Econometric Theory 28:471-481), scaled by t_{n-1} / 1.96 and n / (n - 1) for short series.
- One document with blocks one side lacks (2x, 4x: the blocks past T exist on the strategy's side only): the
  estimate's error is the paired part on the shared blocks plus the own side's between-segment difference in text
  difficulty. The old whole-series HAC centred the own-only blocks on the whole series' mean, so the effect measured
  (a step or ramp past T) counted as variance (Emma, unscaled at 16k against 8k: x2.06 [0.25, 17.2]). Here every
  long-run variance comes from the shared segment alone, where both sides are measured, and is carried over to the
  own-only blocks: an orthonormal-series estimate (Sun 2013, "A heteroskedasticity and autocorrelation robust F test
  using an orthonormal series variance estimator", Econometrics Journal 16:1-26; Mueller 2007, "A theory of robust
  long-run variance estimation", J. Econometrics 141:1331-1352) on the segment's first cosine (made orthogonal to its
  token weights), with Student's t on 1 degree of freedom, its fixed-smoothing critical value (12.7); the segments'
  covariance is left out (positive across the boundary, it only lowers the variance of a difference). Why one
  cosine: block difficulty of a novel wanders slowly, and a segment's mean absorbs most of a slow wander, so every
  within-segment estimate sees only part of it; with 2 cosines and t_2 coverage fell to 0.926 at 2x and 0.908 at 4x
  (tests/test_calibration.py's model). Assumes stationary text difficulty across the document: the own-only blocks'
  text varies as the shared blocks' does, and is as hard on average -- within one text a block's difficulty and its
  position cannot be told apart, so a novel whose second half is harder reads as a loss at 2x, and no
  within-document method can tell (more documents can).
- Accuracies (paired proportions): Tang, Tang & Chan's (2003, "On tests of equivalence via non-unity relative
  risk for matched-pair design", Statistics in Medicine 22:1217-1233) score interval for the ratio of two
  paired proportions, inverted by bisection, at a nominal 96%: at 95% the discreteness of counts lets its coverage
  dip to 93% (n = 100, the reference always right).
"""

from __future__ import annotations

from typing import TYPE_CHECKING
import math

if TYPE_CHECKING:
    import torch


def t_interval(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """(low, high) of the mean of ``values`` (NLLs), or None with fewer than two values."""
    from scipy import stats

    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = stats.t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return mean - half, mean + half


def block_bootstrap(
    nll: torch.Tensor, block: int, samples: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float] | None:
    """(low, high) of the mean token NLL by resampling blocks of ``block`` consecutive tokens; None with
    fewer than two blocks."""
    import torch

    n_blocks = len(nll) // block
    if n_blocks < 2:
        return None
    blocks = nll[: n_blocks * block].double().view(n_blocks, block).sum(1)
    rest = nll[n_blocks * block :].double()
    sums = torch.cat([blocks, rest.sum()[None]]) if len(rest) else blocks
    sizes = torch.tensor([block] * n_blocks + ([len(rest)] if len(rest) else []), dtype=torch.float64)
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(sums), (samples, len(sums)), generator=generator)
    means = sums[picks].sum(1) / sizes[picks].sum(1)
    tail = (1 - level) / 2
    low, high = torch.quantile(means, torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
    return low, high


def wilson_interval(successes: float, n: int, level: float = 0.95) -> tuple[float, float] | None:
    """(low, high) of a proportion from ``successes`` of ``n`` trials (fractional successes allowed, as
    multi-key retrieval scores them); None without trials."""
    from scipy import stats

    if n <= 0:
        return None
    z = float(stats.norm.ppf(0.5 + level / 2))
    p = min(max(successes / n, 0.0), 1.0)
    # Wilson: (p + z^2/2n +/- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low, high = max(0.0, centre - half), min(1.0, centre + half)
    return (0.0 if p == 0 else low), (1.0 if p == 1 else high)  # exact at the ends, where rounding would leave dust


# ---- paired comparisons of a strategy with the unscaled reference (the verdict's intervals) -------------------------
#
# Units are what a measurement averages over, keyed so two runs on the same units pair up: ``{key: (sum, weight)}``
# with ``key`` = ``"<cluster>/<unit>"`` (a document and the first position of a block) or a plain ``"<unit>"`` (a
# prompt, a sample: its own cluster). The statistic of a side is sum(sums) / sum(weights): a token-weighted mean NLL,
# an accuracy. Following Miller 2024 ("Adding Error Bars to Evals", arXiv 2411.00640): paired differences on the
# same units, clustered, and how many more units a comparison needs. Only clusters both sides hold are compared.

Units = dict  # {key: (sum, weight)}

# Fewest units before an interval may decide (yes or NO): below these the calibration (tests/test_calibration.py)
# misses its coverage or false-yes bound, or no decision is possible at all.
MIN_BLOCKS = 8  # one document: 256-token blocks (2048 tokens)
MIN_DOCUMENTS = 2  # several documents (or prompts as their own clusters): the cluster interval holds from 2
MIN_PROMPTS = 4  # paired accuracies (Tang's interval holds from 1; below 4 it cannot say yes at 0.85 anyway)
DOCUMENT_LEVEL = 0.994  # the cluster interval's nominal level: <= 5% false yes under strongly skewed differences
TANG_LEVEL = 0.96  # Tang's nominal level: its coverage dips with the discreteness of counts (0.927 at n = 100 at 95%)
# The b = 1 Bartlett HAC's critical value: the 94% quantile of |t| under fractional Gaussian noise with H = 0.75
# (simulated, 20,000 series of 128-256 blocks; 8.8 at 95%); Kiefer & Vogelsang's short-memory value is 4.81, which
# covers 0.80 at H = 0.75 (tests/test_calibration.py: coverage >= 0.93 for H <= 0.75 from 8 blocks on)
HAC_CRITICAL = 8.3
SEGMENT_COSINES = 1  # one document over segments: cosines on the shared segment (tests/test_calibration.py)
HAC_METHOD = "HAC (Bartlett, fixed-b under long memory) over the blocks of one document"
SEGMENTS_METHOD = "shared-segment long-run variance (1 cosine, t_1) over the blocks of one document"


def cluster_of(key: str) -> str:
    return key.rsplit("/", 1)[0] if "/" in key else key


def _position(key: str) -> float:
    tail = key.rsplit("/", 1)[-1]
    try:
        return float(tail)
    except ValueError:
        return math.inf


def units_mean(units: Units) -> float:
    """sum(sums) / sum(weights): a side's statistic (a token-weighted mean NLL, an accuracy)."""
    return sum(t for t, _ in units.values()) / sum(w for _, w in units.values())


def shared_clusters(a: Units, b: Units) -> tuple[Units, Units, list[str]]:
    """(a, b) restricted to the clusters (documents) both hold, and those clusters: never pooled across others."""
    ca, cb = {cluster_of(k) for k in a}, {cluster_of(k) for k in b}
    shared = sorted(ca & cb)
    keep = set(shared)
    return (
        {k: v for k, v in a.items() if cluster_of(k) in keep},
        {k: v for k, v in b.items() if cluster_of(k) in keep},
        shared,
    )


def influence(sa, wa, sb, wb, log: bool = False):
    """The estimate f(mean_a) - f(mean_b) (f = identity for NLLs, log otherwise) and each unit's influence on it,
    u_k = f'(m_a) (s_a,k - m_a w_a,k) / W_a - f'(m_b) (s_b,k - m_b w_b,k) / W_b (w = 0 where a side lacks the unit),
    and its weight share (the two sides' token shares averaged): arrays, rows of 2-d ones separate samples."""
    import numpy as np

    sa, wa, sb, wb = (np.atleast_2d(np.asarray(x, float)) for x in (sa, wa, sb, wb))
    Wa, Wb = wa.sum(1, keepdims=True), wb.sum(1, keepdims=True)
    ma, mb = sa.sum(1, keepdims=True) / Wa, sb.sum(1, keepdims=True) / Wb
    fa, fb = (1 / ma, 1 / mb) if log else (1.0, 1.0)  # f'(m)
    with np.errstate(divide="ignore", invalid="ignore"):
        estimate = (np.log(ma) - np.log(mb))[:, 0] if log else (ma - mb)[:, 0]
    u = fa * (sa - ma * wa) / Wa - fb * (sb - mb * wb) / Wb
    return estimate, u, (wa / Wa + wb / Wb) / 2


def _influence(keys, a: Units, b: Units, log: bool):
    import numpy as np

    columns = [np.array([side[k][i] if k in side else 0.0 for k in keys]) for side in (a, b) for i in (0, 1)]
    if log and (columns[0].sum() <= 0 or columns[2].sum() <= 0):
        return None, None, None
    estimate, u, h = influence(*columns, log=log)
    return float(estimate[0]), u[0], h[0]


def hac_interval(u, estimate, level: float = 0.95):
    """One document: Bartlett long-run variance of the influence series ``u`` (in position order; rows of a 2-d
    array are separate series) with bandwidth the whole series, sum_{|l|<n} (1 - |l|/n) sum_t u_t u_{t+l}, and
    the fixed-b critical value at b = 1 under long memory (``HAC_CRITICAL``) scaled by t_{n-1} / 1.96 and n / (n - 1)
    (small n). (low, high, se, critical)."""
    import numpy as np
    from scipy import stats

    u = np.atleast_2d(np.asarray(u, float))
    n = u.shape[1]
    variance = (u * u).sum(1)
    for lag in range(1, n):
        variance = variance + 2 * (1 - lag / n) * (u[:, :-lag] * u[:, lag:]).sum(1)
    # the b = 1 value under long memory, times t_{n-1} / 1.96 and n / (n - 1) (the mean removed from a short series)
    critical = HAC_CRITICAL * float(stats.t.ppf(0.5 + level / 2, n - 1)) / 1.96 * n / (n - 1)
    se = np.sqrt(np.maximum(variance, 0.0))
    return estimate - critical * se, estimate + critical * se, se, critical


def segment_basis(weights, k: int = SEGMENT_COSINES):
    """Orthonormal columns over one segment's blocks: its first ``k`` cosines cos(pi j (t + 1/2) / m), j = 1..k,
    made orthogonal to each weight vector in ``weights`` (so a level within the segment projects to 0), at most
    m - rank(weights) of them."""
    import numpy as np

    w = np.column_stack([np.asarray(x, float) for x in weights if np.any(x)])
    q, sv, _ = np.linalg.svd(w, full_matrices=False)
    q = q[:, sv > 1e-9 * sv[0]]
    m = w.shape[0]
    k = min(k, m - q.shape[1])
    if k < 1:
        return np.zeros((m, 0))
    cosines = np.cos(np.pi * np.outer(np.arange(m) + 0.5, np.arange(1, k + 1)) / m)
    cosines -= q @ (q.T @ cosines)  # orthogonal to the weights
    return np.linalg.qr(cosines)[0]


def segments(wa, wb):
    """Each block's segment from which side holds it (1-d weights): 3 both, 1 the first side only, 2 the second."""
    import numpy as np

    return (np.asarray(wa) > 0) * 1 + (np.asarray(wb) > 0) * 2


def segment_interval(sa, wa, sb, wb, log: bool = False, level: float = 0.95, k: int = SEGMENT_COSINES):
    """One document whose sides hold different blocks (rows of 2-d arrays: separate samples on the same blocks, in
    position order; w = 0 where a side lacks a block). The error of the estimate is the shared segment's paired part
    plus each one-sided segment's mean difficulty against the shared one's; every long-run variance is estimated on
    the shared segment only, where both sides are measured (the effect measured past T -- a step, a ramp -- never
    enters it): with r_a = f'(m_a) (s_a - m_a,sh w_a) / W_a and r_b likewise (residuals centred on the shared
    segment's means), phi_j its ``k`` cosines (:func:`segment_basis`),
    Var = mean_j [ m_sh (phi_j' (r_a - r_b))^2 + m_a-only (phi_j' r_a)^2 + m_b-only (phi_j' r_b)^2 ];
    Student's t with k df. (estimate, low, high, se, critical); None when the shared segment is too short for one
    cosine (fewer than 2 blocks)."""
    import numpy as np
    from scipy import stats

    sa, wa, sb, wb = (np.atleast_2d(np.asarray(x, float)) for x in (sa, wa, sb, wb))
    label = segments(wa[0], wb[0])
    at = label == 3
    basis = segment_basis([wa[0, at], wb[0, at]], k) if at.sum() >= 2 else np.zeros((0, 0))
    if basis.shape[1] == 0:
        return None
    Wa, Wb = wa.sum(1, keepdims=True), wb.sum(1, keepdims=True)
    ma, mb = sa.sum(1, keepdims=True) / Wa, sb.sum(1, keepdims=True) / Wb
    fa, fb = (1 / ma, 1 / mb) if log else (1.0, 1.0)  # f'(m)
    with np.errstate(divide="ignore", invalid="ignore"):
        estimate = (np.log(ma) - np.log(mb))[:, 0] if log else (ma - mb)[:, 0]
    # each side's residuals on the shared segment, centred on its mean there: s - m_sh w
    ra, rb = (
        fa * (sa[:, at] - wa[:, at] * sa[:, at].sum(1, keepdims=True) / wa[:, at].sum(1, keepdims=True)) / Wa,
        fb * (sb[:, at] - wb[:, at] * sb[:, at].sum(1, keepdims=True) / wb[:, at].sum(1, keepdims=True)) / Wb,
    )
    pa, pb = ra @ basis, rb @ basis  # projections on the cosines
    # m_g times the long-run variance of the segment's influence, all from the shared segment's projections
    variance = (at.sum() * (pa - pb) ** 2 + (label == 1).sum() * pa**2 + (label == 2).sum() * pb**2).mean(1)
    critical = float(stats.t.ppf(0.5 + level / 2, basis.shape[1]))
    se = np.sqrt(variance)
    return estimate, estimate - critical * se, estimate + critical * se, se, critical


def one_document_interval(sa, wa, sb, wb, log: bool = False, level: float = 0.95):
    """One document's interval (rows of 2-d arrays: samples on the same blocks, in position order; w = 0 where a side
    lacks a block): :func:`segment_interval` when a side holds blocks the other lacks and 2 or more are shared,
    else :func:`hac_interval` on the influence series. (estimate, low, high, se, critical, "segments" or "hac")."""
    import numpy as np

    if len(np.unique(segments(np.atleast_2d(wa)[0], np.atleast_2d(wb)[0]))) > 1:
        found = segment_interval(sa, wa, sb, wb, log=log, level=level)
        if found:
            return *found, "segments"
    estimate, u, _ = influence(sa, wa, sb, wb, log=log)
    return estimate, *hac_interval(u, estimate, level), "hac"


def cluster_interval(u, h, estimate, level: float = DOCUMENT_LEVEL):
    """Several clusters: ``u`` their influences on the estimate, ``h`` their weight shares (rows of 2-d arrays:
    separate samples). Var = sum u_j^2 scaled to be unbiased for a weighted mean of equal-variance clusters (the
    CR2 idea), Bell-McCaffrey degrees of freedom tr(B)^2 / tr(B^2), and Hall's skewness-removing transform of
    t. (low, high, se, df)."""
    import numpy as np
    from scipy import stats

    u, h = np.atleast_2d(np.asarray(u, float)), np.atleast_2d(np.asarray(h, float))
    h = h / h.sum(1, keepdims=True)
    # sum h_j^2 e_j^2 = d' B d, B = M' diag(h^2) M, M = I - 1 h' (the residuals of the weighted mean); with
    # P = M M' (P_kl = [k = l] - h_k - h_l + sum h^2): tr B = sum_k h_k^2 P_kk, tr B^2 = sum_kl h_k^2 h_l^2 P_kl^2
    a, s2 = h * h, (h * h).sum(1)[:, None, None]
    p = np.eye(h.shape[1])[None] - h[:, :, None] - h[:, None, :] + s2
    trace = (a * np.einsum("rkk->rk", p)).sum(1)
    trace2 = np.einsum("rk,rkl,rl->r", a, p * p, a)
    uu = (u * u).sum(1)
    variance = uu * (h * h).sum(1) / trace  # E = Var(estimate) when the clusters share one variance
    df = trace * trace / trace2
    se = np.sqrt(np.maximum(variance, 0.0))
    q = stats.t.ppf(0.5 + level / 2, df)
    with np.errstate(divide="ignore", invalid="ignore"):
        kappa = np.where(uu > 0, (u**3).sum(1) / uu**1.5, 0.0)  # the estimate's skewness (gamma / sqrt(n), a mean)
        safe = np.where(np.abs(kappa) < 1e-9, 1.0, kappa)

        def inverse(y):  # Hall 1992: g(t) = t + k t^2 / 3 + k^2 t^3 / 27 + k / 6, inverted
            return np.where(np.abs(kappa) < 1e-9, y, (3 / safe) * (np.cbrt(1 + safe * (y - safe / 6)) - 1))

        return estimate - se * inverse(q), estimate - se * inverse(-q), se, df


def paired_log_ratio(a: Units, b: Units, log: bool = False, level: float = 0.95) -> dict | None:
    """The paired interval of f(mean_a) - f(mean_b) (f = identity: the mean NLL difference, the log of a perplexity
    ratio; f = log otherwise) on the clusters both sides hold: ``{"estimate", "low", "high", "n", "clustered",
    "method", "documents", "shared", "min_units", "se", "critical"}`` (several documents: also "df" and
    "effective", their effective number); None when nothing is shared or fewer than
    two units remain.

    - Two or more shared clusters: :func:`cluster_interval` on the per-cluster influences; ``n`` = clusters.
    - One shared cluster (one document): :func:`one_document_interval` on its units in position order: the
      Bartlett HAC when both sides hold the same units; when a side holds units the other lacks (the blocks past T
      of a 2x run), the segment-centred interval (shared, own-only); ``n`` = its units, ``description`` the method
      in words."""
    import numpy as np

    a, b, shared = shared_clusters(a, b)
    if not shared:
        return None
    keys = sorted(set(a) | set(b), key=lambda k: (cluster_of(k), _position(k), k))
    found = _influence(keys, a, b, log)
    if found[0] is None:
        return None
    estimate, u, h = found
    base = {"estimate": float(estimate), "documents": len(shared), "shared": len(set(a) & set(b))}
    if len(shared) >= 2:
        index = {c: i for i, c in enumerate(shared)}
        rows = np.array([index[cluster_of(k)] for k in keys])
        uc = np.bincount(rows, weights=u, minlength=len(shared))
        hc = np.bincount(rows, weights=h, minlength=len(shared))
        low, high, se, df = cluster_interval(uc, hc, estimate, DOCUMENT_LEVEL if level == 0.95 else level)
        return {
            **base,
            "low": float(low[0]),
            "high": float(high[0]),
            "n": len(shared),
            "clustered": True,
            "se": float(se[0]),
            "df": float(df[0]),
            "critical": cluster_critical(float(df[0]), len(shared)),
            "effective": float(hc.sum() ** 2 / (hc * hc).sum()),  # (sum w)^2 / sum w^2: evals/core/planning.py
            "min_units": MIN_DOCUMENTS,
            "method": "cluster",
        }
    if len(keys) < 2:
        return None
    columns = [np.array([side[k][i] if k in side else 0.0 for k in keys]) for side in (a, b) for i in (0, 1)]
    _, low, high, se, critical, method = one_document_interval(*columns, log=log, level=level)
    return {
        **base,
        "low": float(low[0]),
        "high": float(high[0]),
        "n": len(keys),
        "clustered": False,
        "se": float(se[0]),
        "critical": critical,
        "min_units": MIN_BLOCKS,
        "method": method,
        "description": SEGMENTS_METHOD if method == "segments" else HAC_METHOD,
    }


def _soft_table(a: dict, b: dict):
    """The 2x2 table of matched pairs (x11, x12, x21, x22) from paired scores in [0, 1]; a fractional pair (u, v)
    counts u v, u (1 - v), (1 - u) v, (1 - u)(1 - v) (binary pairs: exact)."""
    import numpy as np

    keys = [k for k in a if k in b]
    u = np.clip(np.array([a[k] for k in keys], float), 0, 1)
    v = np.clip(np.array([b[k] for k in keys], float), 0, 1)
    return (
        float((u * v).sum()),
        float((u * (1 - v)).sum()),
        float(((1 - u) * v).sum()),
        float(((1 - u) * (1 - v)).sum()),
    )


def tang_score(theta, x11, x12, x21, x22):
    """Tang, Tang & Chan 2003's score statistic for H0: p1 / p2 = theta (p1 = p11 + p12, p2 = p11 + p21), numpy
    arrays broadcast: (x11 + x12 - (x11 + x21) theta) / sqrt(n (1 + theta) p21~ + (x11 + x12 + x21)(theta - 1)), with
    p21~ the constrained maximum-likelihood estimate (the positive root of a q^2 + b q + c = 0)."""
    import numpy as np

    n = x11 + x12 + x21 + x22
    qa = n * (1 + theta)
    qb = (x11 + x21) * theta**2 - (x11 + x12 + 2 * x21)
    qc = x21 * (1 - theta) * (x11 + x12 + x21) / np.where(n > 0, n, 1)
    p21 = (-qb + np.sqrt(np.maximum(qb * qb - 4 * qa * qc, 0))) / (2 * qa)
    variance = n * (1 + theta) * p21 + (x11 + x12 + x21) * (theta - 1)
    numerator = x11 + x12 - (x11 + x21) * theta
    with np.errstate(divide="ignore", invalid="ignore"):
        score = numerator / np.sqrt(np.maximum(variance, 0))
        return np.where(numerator == 0, 0.0, np.where(np.isfinite(score), score, np.sign(numerator) * np.inf))


def tang_interval(x11, x12, x21, x22, level: float = TANG_LEVEL, steps: int = 60):
    """(low, high) arrays of the ratio p1 / p2 of paired proportions: the thetas whose score |T| <= z, by bisection
    on log theta in [1e-6, 1e6]; high = inf when the reference never scores (x11 + x21 = 0), low = 0 when the
    strategy never does."""
    import numpy as np
    from scipy import stats

    z = float(stats.norm.ppf(0.5 + level / 2))
    x11, x12, x21, x22 = (np.asarray(x, float) for x in (x11, x12, x21, x22))

    def bound(target, sign):  # T decreases in theta: the theta where T = target
        lo, hi = np.full(x11.shape, -6.0), np.full(x11.shape, 6.0)
        for _ in range(steps):
            mid = (lo + hi) / 2
            above = tang_score(10**mid, x11, x12, x21, x22) > target
            lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
        return 10 ** ((lo + hi) / 2)

    low = np.where(x11 + x12 <= 0, 0.0, bound(z, 1))
    high = np.where(x11 + x21 <= 0, np.inf, bound(-z, -1))
    return low, high


def paired_proportion_ratio(a: Units, b: Units, level: float = TANG_LEVEL) -> tuple[float | None, float | None, dict]:
    """(low, high, table) of the ratio mean_a / mean_b of two scores in [0, 1] on the units both hold: Tang's score
    interval; ``table`` the counts (x11, x12, x21, x22, n). (None, None) when the reference never scores."""
    xa = {k: t / w for k, (t, w) in a.items() if w}
    xb = {k: t / w for k, (t, w) in b.items() if w}
    x11, x12, x21, x22 = _soft_table(xa, xb)
    table = {"x11": x11, "x12": x12, "x21": x21, "x22": x22, "n": x11 + x12 + x21 + x22}
    if table["n"] <= 0 or x11 + x21 <= 0:
        return None, None, table
    low, high = tang_interval(x11, x12, x21, x22, level)
    return float(low), float(high), table


def document_critical(m):
    """The cluster interval's critical value at ``m`` documents of equal weight (t at DOCUMENT_LEVEL, m - 1 df)."""
    import numpy as np
    from scipy import stats

    return stats.t.ppf(0.5 + DOCUMENT_LEVEL / 2, np.maximum(np.asarray(m, float) - 1, 1))


def cluster_critical(df: float, n: int):
    """The critical value the cluster interval would use at m clusters like its ``n`` present ones (a function of
    an array of m): t at DOCUMENT_LEVEL with its Bell-McCaffrey ``df`` grown in proportion, df (m - 1) / (n - 1)
    (at m = n exactly its own; equal weights: m - 1, :func:`document_critical`)."""
    import numpy as np
    from scipy import stats

    def critical(m):
        grown = df * (np.asarray(m, float) - 1) / max(n - 1, 1)
        return stats.t.ppf(0.5 + DOCUMENT_LEVEL / 2, np.maximum(grown, 1e-3))

    return critical
