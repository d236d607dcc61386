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

import math

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


def block_bootstrap(nll: torch.Tensor, block: int, samples: int = 1000, seed: int = 0,
                    level: float = 0.95) -> tuple[float, float] | None:
    """(low, high) of the mean token NLL by resampling blocks of ``block`` consecutive tokens; None with
    fewer than two blocks."""
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
