"""Confidence intervals, stated with the method that produced them.

- Across documents (n >= 2): a Student-t interval on the per-document mean NLL, mean +/- t_{0.975, n-1} *
  sd / sqrt(n) (the normal 1.96 understates it badly for few documents: with n = 2, t = 12.7), then exp.
- Accuracies (retrieval, RULER): the Wilson score interval of a binomial proportion (Wilson 1927), which
  keeps inside [0, 1] and stays honest at 0/n and n/n, where the normal approximation claims no doubt at all.
- Within one document: a block bootstrap (Kuensch 1989, "The jackknife and the bootstrap for general
  stationary observations"): the token NLLs cut into consecutive blocks of ``block`` tokens (token losses
  are correlated within a passage), blocks resampled with replacement, the 2.5 / 97.5 percentiles of
  the resampled mean NLL, then exp.
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
# with ``key`` = ``"<cluster>/<unit>"`` (a document and a block of its token positions) or a plain ``"<unit>"`` (a
# prompt, a sample: its own cluster). The statistic of a side is sum(sums) / sum(weights): a token-weighted mean NLL,
# an accuracy. Following Miller 2024 ("Adding Error Bars to Evals", arXiv 2411.00640): paired differences on the
# same units, clustered resampling, and how many more units a comparison needs.

Units = dict  # {key: (sum, weight)}


def cluster_of(key: str) -> str:
    return key.rsplit("/", 1)[0] if "/" in key else key


def units_mean(units: Units) -> float:
    """sum(sums) / sum(weights): a side's statistic (a token-weighted mean NLL, an accuracy)."""
    return sum(t for t, _ in units.values()) / sum(w for _, w in units.values())


def _clusters(units: Units) -> dict[str, dict[str, tuple[float, float]]]:
    found: dict[str, dict] = {}
    for key, (total, weight) in units.items():
        found.setdefault(cluster_of(key), {})[key] = (float(total), float(weight))
    return found


def _draw(rng, a: dict, b: dict, samples: int):
    """(sum_a, weight_a, sum_b, weight_b) arrays of ``samples`` resamples of one cluster's units: the units both
    sides hold drawn jointly (paired), each side's own units drawn on their own."""
    import numpy as np

    out = [np.zeros(samples) for _ in range(4)]
    shared = [k for k in a if k in b]
    for keys, sides in ((shared, "ab"), ([k for k in a if k not in b], "a"), ([k for k in b if k not in a], "b")):
        if not keys:
            continue
        picks = rng.integers(0, len(keys), (samples, len(keys)))
        for side in sides:
            src, index = (a, 0) if side == "a" else (b, 2)
            out[index] += np.array([src[k][0] for k in keys])[picks].sum(1)
            out[index + 1] += np.array([src[k][1] for k in keys])[picks].sum(1)
    return out


def paired_log_ratio(
    a: Units, b: Units, log_statistic, samples: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, int, bool] | None:
    """(low, high, n, clustered): a 95% interval of ``log_statistic(mean_a, mean_b)`` (a log ratio: the mean NLL
    difference, or log(mean_a / mean_b)) on paired units.

    - Several clusters (documents) held by both sides: clustered, as Miller 2024 asks -- the per-cluster paired
      log ratios d_j, and the overall estimate +/- t_{0.975, D-1} * sd(d) / sqrt(D) (a Student-t on the D
      clusters: percentile bootstraps over a handful of documents cover far less than 95%, and resampling
      blocks inside resampled documents counts the within-document variance twice); ``n`` = D.
    - One cluster (one document, or units that are their own clusters): a paired bootstrap of its units --
      units both sides hold resampled jointly, a side's own units on their own -- percentile interval; ``n`` =
      its units.
    None with fewer than two units (or clusters) to resample."""
    import numpy as np
    from scipy import stats

    ca, cb = _clusters(a), _clusters(b)
    shared = [c for c in ca if c in cb]

    if len(shared) >= 2 and len(shared) == len(ca) == len(cb):
        d = np.array([log_statistic(units_mean(ca[c]), units_mean(cb[c])) for c in shared])
        estimate = log_statistic(units_mean(a), units_mean(b))
        half = float(stats.t.ppf(0.5 + level / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d)))
        return estimate - half, estimate + half, len(d), True
    if len(a) < 2 or len(b) < 2:
        return None
    rng = np.random.default_rng(seed)
    sa, wa, sb, wb = _draw(rng, a, b, samples)
    with np.errstate(divide="ignore", invalid="ignore"):
        values = log_statistic(sa / wa, sb / wb)
    values = values[np.isfinite(values)]
    if len(values) < samples // 2:
        return None
    tail = (1 - level) / 2
    low, high = np.quantile(values, [tail, 1 - tail])
    return float(low), float(high), max(len(a), len(b)), False


def paired_proportion_ratio(a: Units, b: Units, level: float = 0.95) -> tuple[float | None, float | None, dict]:
    """(low, high, moments) of the ratio mean_a / mean_b of two scores in [0, 1] on paired units: Fieller's
    interval (Fieller 1954) on means adjusted as Agresti & Min (2005) adjust paired proportions -- half a
    pseudo-pair at each of (1,1), (1,0), (0,1), (0,0) -- so it stays honest at 0/n and n/n and with a handful of
    prompts. Units held by one side only add to its variance, not to the covariance. (None, None) when the
    interval is unbounded (the reference is not distinguishable from 0)."""
    from scipy import stats

    z = float(stats.norm.ppf(0.5 + level / 2))
    xa = {k: t / w for k, (t, w) in a.items() if w}
    xb = {k: t / w for k, (t, w) in b.items() if w}
    pseudo = [(1.0, 1.0), (1.0, 0.0), (0.0, 1.0), (0.0, 0.0)]  # each with weight 1/2
    na, nb = len(xa) + 2, len(xb) + 2
    ma, mb = (sum(xa.values()) + 1) / na, (sum(xb.values()) + 1) / nb
    var_a = (sum((x - ma) ** 2 for x in xa.values()) + sum(0.5 * (p - ma) ** 2 for p, _ in pseudo)) / (na - 1) / na
    var_b = (sum((x - mb) ** 2 for x in xb.values()) + sum(0.5 * (q - mb) ** 2 for _, q in pseudo)) / (nb - 1) / nb
    shared = [k for k in xa if k in xb]
    m = len(shared) + 2
    co = sum((xa[k] - ma) * (xb[k] - mb) for k in shared) + sum(0.5 * (p - ma) * (q - mb) for p, q in pseudo)
    cov = co / (na * nb) * m / (m - 1)
    moments = {"mean_a": ma, "mean_b": mb, "var_a": var_a, "var_b": var_b, "cov": cov, "z": z}
    # Fieller: the c with (ma - c mb)^2 <= z^2 Var(ma - c mb), a quadratic a c^2 + b c + k <= 0
    qa, qb, qk = mb * mb - z * z * var_b, -2 * (ma * mb - z * z * cov), ma * ma - z * z * var_a
    disc = qb * qb - 4 * qa * qk
    if qa <= 0 or disc < 0:
        return None, None, moments
    root = math.sqrt(disc)
    return max(0.0, (-qb - root) / (2 * qa)), (-qb + root) / (2 * qa), moments  # a ratio of scores is >= 0


def more_units(n: int, half_width: float, distance: float) -> int | None:
    """How many more units would likely bring an interval whose side towards a limit is ``half_width`` long (at
    ``n`` units) to exclude that limit, ``distance`` from its estimate, its width shrinking as 1/sqrt(n); None
    when the estimate sits on the limit."""
    if distance <= 1e-12 or n <= 0:
        return None
    return max(1, math.ceil(n * (half_width / distance) ** 2 - n))
