"""Confidence intervals for perplexity, stated with the method that produced them.

- Across documents (n >= 2): a Student-t interval on the per-document mean NLL, mean +/- t_{0.975, n-1} *
  sd / sqrt(n) (the normal 1.96 understates it badly for few documents: with n = 2, t = 12.7), then exp.
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
