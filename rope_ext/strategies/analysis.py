"""Analytic RoPE studies for any frequency set a strategy produces.

- Long-distance decay (Su et al. 2021, RoFormer, arXiv 2104.09864, section 3.4.3; kexue.fm/archives/8265): the
  score <R_m q, R_n k> = q^T R_{n-m} k against relative distance r = n - m, for q = k = all-ones, or for q
  and k drawn per position from Gaussians with given means and standard deviations (Barbero et al. 2024,
  "Round and Round We Go! What makes Rotary Positional Encodings useful?", arXiv 2410.06205, found no decay
  for zero means; the non-zero-mean experiment follows the tinymind blog post of 2024-10-13,
  github.com/Paul33333/tinymind-blog).
- Base bound (Su 2024, "RoPE base design principles", kexue.fm/archives/10122; Men et al. 2024, "Base of
  RoPE Bounds Context Length", arXiv 2405.14591): the smallest base b with sum_i cos(m * theta_i) >= 0 for
  every m < L.
- A per-dimension table for a strategy: wavelength, its ratio to the trained context, the factor
  applied, and whether the pair is extrapolated, interpolated, blended, or removed (theta = 0: p-RoPE).
- Score profiles of real queries and keys (the tinymind conjecture on a model's own q, k): per rotary pair
  the complex cross-correlation C_i(r) = mean_m z_q(m + r) conj(z_k(m)) of the unrotated pairs
  z = x_a + i x_b, by FFT; the score profile for any frequencies is sum_i Re(C_i(r) e^{i r theta_i}),
  and its mean-field part (the means alone) sum_i Re(mu_q,i conj(mu_k,i) e^{i r theta_i}).
"""

from __future__ import annotations

from typing import TYPE_CHECKING
import math

from .rope import default_inv_freq, wavelengths

if TYPE_CHECKING:
    import torch


def pair_score(q: torch.Tensor, k: torch.Tensor, inv_freq: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
    """q^T R_r k for pairs (x_{2i}, x_{2i+1}) rotated by r * theta_i; q, k: (..., d), distance: (...,)."""
    angle = distance[..., None].double() * inv_freq.double()  # (..., d/2)
    qa, qb = q[..., 0::2].double(), q[..., 1::2].double()
    ka, kb = k[..., 0::2].double(), k[..., 1::2].double()
    # per pair: (qa*ka + qb*kb) cos(r theta) + (qa*kb - qb*ka) sin(r theta)
    return ((qa * ka + qb * kb) * angle.cos() + (qa * kb - qb * ka) * angle.sin()).sum(-1)


def decay_curve(
    inv_freq: torch.Tensor,
    max_distance: int,
    *,
    q_mean: float | None = None,
    k_mean: float | None = None,
    std: float = 1.0,
    attention_factor: float = 1.0,
    seed: int = 0,
) -> torch.Tensor:
    """Score against distance 0 .. max_distance-1 for a query at position 0 and keys at positions r.

    With ``q_mean``/``k_mean`` None, q = k = all-ones (RoFormer's bound). Otherwise each key position draws
    its own k ~ N(k_mean, std^2) and the query q ~ N(q_mean, std^2), as in the tinymind experiment.
    ``attention_factor`` scales cos/sin, so it multiplies the score by its square.
    """
    import torch

    dim = 2 * inv_freq.numel()
    distance = torch.arange(max_distance)
    if q_mean is None and k_mean is None:
        # all-ones: q^T R_r k = 2 * sum_i cos(r theta_i)
        score = 2 * torch.cos(distance[:, None].double() * inv_freq.double()).sum(-1)
    else:
        generator = torch.Generator().manual_seed(seed)
        q = torch.randn(dim, generator=generator, dtype=torch.float64) * std + (q_mean or 0.0)
        k = torch.randn(max_distance, dim, generator=generator, dtype=torch.float64) * std + (k_mean or 0.0)
        score = pair_score(q.expand_as(k), k, inv_freq, distance)
    return score * attention_factor**2


def expected_decay(
    inv_freq: torch.Tensor,
    distance: torch.Tensor,
    *,
    q_mean: float | None = None,
    k_mean: float | None = None,
    std: float = 1.0,
    attention_factor: float = 1.0,
):
    """(mean, standard deviation) of q^T R_r k at each ``distance`` r, exactly, instead of one random draw.

    All-ones (means None): 2 * sum_i cos(r theta_i), no spread. q ~ N(mu_q, s^2 I), k ~ N(mu_k, s^2 I)
    independent: E = mu_q * mu_k * 2 * sum_i cos(r theta_i) -- the all-ones curve scaled by the product of
    the means (so zero means have no decay, opposite signs turn it into a rise) -- and
    Var = d * s^2 * (mu_q^2 + mu_k^2) + d * s^4, the same at every distance (R_r is orthogonal): a larger
    variance does not change the mean curve, it buries it in noise. Both scaled by attention_factor^2.
    """
    import torch

    dim = 2 * inv_freq.numel()
    ones = 2 * torch.cos(distance[:, None].double() * inv_freq.double()).sum(-1)
    scale = attention_factor**2
    if q_mean is None and k_mean is None:
        return ones * scale, torch.zeros_like(ones)
    mq, mk = q_mean or 0.0, k_mean or 0.0
    sd = math.sqrt(dim * std**2 * (mq**2 + mk**2) + dim * std**4)
    return mq * mk * ones * scale, torch.full_like(ones, sd * scale)


def lowest_frequency_base(inv_freq: torch.Tensor) -> float | None:
    """The base b of plain RoPE whose slowest pair turns as slowly as this frequency set's: theta_(d/2-1) =
    b^(-(d-2)/d). Equal to the base for base-form frequencies (NTK, ABF); PI by s gives b * s^(d/(d-2)).
    None when the slowest pair does not turn (theta = 0, p-RoPE)."""
    dim = 2 * inv_freq.numel()
    slowest = float(inv_freq.min())
    if slowest <= 0 or dim < 4:
        return None
    return slowest ** (-dim / (dim - 2))


def decay_strength(score: torch.Tensor, near: int = 64, far_fraction: float = 0.25) -> float:
    """(mean score over r < near - mean over the last far_fraction of distances) / max |score|.

    Positive: the score decays with distance; near 0: no decay; negative: it rises.
    """
    far = score[-max(1, int(len(score) * far_fraction)) :]
    return float((score[:near].mean() - far.mean()) / score.abs().max())


def first_rise(score: torch.Tensor, start: int = 64) -> int | None:
    """Distance where the smoothed curve, past its early decay, reaches its minimum and turns up again.

    The curve is smoothed over 1/64 of the window (at least 64 distances) to remove the fast
    oscillation. Returns None when the smoothed curve keeps (weakly) decaying to the end.
    """
    import torch

    smooth = max(64, len(score) // 64)
    kernel = torch.ones(1, 1, smooth, dtype=score.dtype) / smooth
    smoothed = torch.nn.functional.conv1d(score[None, None], kernel).flatten()
    tail = smoothed[start:]
    lowest = int(tail.argmin())
    rises = float(tail[lowest:].max() - tail[lowest]) > 0.05 * float(smoothed.abs().max())
    return lowest + start + smooth // 2 if rises else None


def cosine_sum(inv_freq: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    # B(m) = sum_i cos(m * theta_i): the expected score of a key identical to the query at distance m
    import torch

    return torch.cos(positions[:, None].double() * inv_freq.double()).sum(-1)


def satisfies_bound(base: float, dim: int, context: int, chunk: int = 1 << 16) -> bool:
    """Whether sum_i cos(m * theta_i) >= 0 for every m in [0, context)."""
    import torch

    inv_freq = default_inv_freq(dim, base)
    for start in range(0, context, chunk):
        positions = torch.arange(start, min(context, start + chunk))
        if bool((cosine_sum(inv_freq, positions) < 0).any()):
            return False
    return True


def base_lower_bound(dim: int, context: int, ratio: float = 1.01, rel_tol: float = 1e-3, hi: float = 1e12) -> float:
    """Smallest base b (to rel_tol) with sum_i cos(m * b^(-2i/d)) >= 0 for all m < context.

    The set of good bases is not monotone near the edge (good, bad, good again), so the search scans
    a fine geometric grid (step ``ratio``) upward from context/100 and bisects between the last bad
    grid point and the first good one. This reproduces Men et al. 2024 (arXiv 2405.14591), Table 1,
    d = 128: 1k -> 4.3e3, 32k -> 6.4e5.
    """
    if context < 1 or dim < 2 or dim % 2:
        raise ValueError(f"need context >= 1 and an even dim >= 2, got context={context}, dim={dim}")
    bad = max(2.0, context / 100)
    if satisfies_bound(bad, dim, context):
        return bad
    good = bad * ratio
    while not satisfies_bound(good, dim, context):
        bad, good = good, good * ratio
        if good > hi:
            raise ValueError(f"no base up to {hi:g} satisfies the bound for dim={dim}, context={context}")
    while good / bad > 1 + rel_tol:
        mid = math.sqrt(good * bad)
        if satisfies_bound(mid, dim, context):
            good = mid
        else:
            bad = mid
    return good


def dimension_table(inv_freq: torch.Tensor, base: float, trained: int) -> list[dict]:
    """Per pair i: original and scaled wavelength, lambda/L, the factor theta_i/theta'_i and its regime.

    A pair with theta'_i = 0 (p-RoPE) has an infinite scaled wavelength and factor and the regime
    ``removed``: it carries no position."""
    dim = 2 * inv_freq.numel()
    original = default_inv_freq(dim, base)
    factor = original / inv_freq  # > 1: interpolated (slower rotation); inf where theta' = 0
    finite = factor[factor.isfinite()]
    top = float(finite.max()) if finite.numel() else 1.0
    rows = []
    for i in range(dim // 2):
        f = float(factor[i])
        if not math.isfinite(f):
            regime = "removed"  # theta' = 0: no rotation, no position
        elif abs(f - 1) < 1e-4:
            regime = "extrapolated"  # rotates as trained
        elif abs(f - top) < 1e-4 * top and f > 1:
            regime = "interpolated"  # the full factor
        else:
            regime = "blended"  # between the two (ramps, NTK, llama3 smoothing)
        rows.append(
            {
                "pair": i,
                "wavelength": float(wavelengths(original)[i]),
                "scaled_wavelength": float(wavelengths(inv_freq)[i]),
                "wavelength_over_context": float(wavelengths(original)[i]) / trained,
                "factor": f,
                "regime": regime,
            }
        )
    return rows


def complex_pairs(x: torch.Tensor, pairs) -> torch.Tensor:
    """(..., d) real vectors -> (..., d_rot/2) complex pairs z_i = x[a_i] + i x[b_i] (float64)."""
    import torch

    a, b = pairs
    return torch.complex(x[..., a].double(), x[..., b].double())


def cross_correlation(zq: torch.Tensor, zk: torch.Tensor) -> torch.Tensor:
    """C[..., r, i] = mean over m of zq[..., m + r, i] * conj(zk[..., m, i]) for r = 0 .. n-1 (the n - r pairs
    of tokens at distance r: query r positions after the key), by FFT in O(n log n).

    zq, zk: (..., n, P) complex, the same leading shape. Returns (..., n, P) complex128."""
    import torch

    n = zq.shape[-2]
    size = 1 << (2 * n - 1).bit_length()
    fq = torch.fft.fft(zq.to(torch.complex128), n=size, dim=-2)
    fk = torch.fft.fft(zk.to(torch.complex128), n=size, dim=-2)
    corr = torch.fft.ifft(fq * fk.conj(), dim=-2)[..., :n, :]
    counts = torch.arange(n, 0, -1, dtype=torch.float64, device=corr.device)
    return corr / counts[:, None]


def profile_from_correlation(corr: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float = 1.0) -> torch.Tensor:
    """Score profile (..., n) at distance r = sum_i a^2 Re(C_i(r) e^{i r theta_i}) for frequencies ``inv_freq`` (P,)."""
    import torch

    n = corr.shape[-2]
    angle = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq.double()[None, :]  # (n, P)
    phase = torch.polar(torch.ones_like(angle), angle)
    return (corr * phase).real.sum(-1) * attention_factor**2


def mean_field_profile(
    mu_q: torch.Tensor,
    mu_k: torch.Tensor,
    inv_freq: torch.Tensor,
    max_distance: int,
    attention_factor: float = 1.0,
    chunk: int = 8192,
) -> torch.Tensor:
    """sum_i a^2 Re(mu_q,i conj(mu_k,i) e^{i r theta_i}) for r = 0 .. max_distance-1: the score of the mean
    query at r positions after the mean key (mu: (..., P) complex). Returns (..., max_distance) float64."""
    import torch

    product = (mu_q.to(torch.complex128) * mu_k.to(torch.complex128).conj())[..., None, :]  # (..., 1, P)
    pieces = []
    for start in range(0, max_distance, chunk):
        r = torch.arange(start, min(max_distance, start + chunk), dtype=torch.float64)
        angle = r[:, None] * inv_freq.double()[None, :]
        pieces.append((product * torch.polar(torch.ones_like(angle), angle)).real.sum(-1))
    return torch.cat(pieces, dim=-1) * attention_factor**2


def window_mean(profile: torch.Tensor, lo: int, hi: int, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of profile[..., lo:hi] (weighted, e.g. by the number of token pairs at each distance)."""
    hi = min(hi, profile.shape[-1])
    if not 0 <= lo < hi:
        raise ValueError(f"empty window [{lo}, {hi}) of a profile of {profile.shape[-1]} distances")
    part = profile[..., lo:hi]
    if weights is None:
        return part.mean(-1)
    w = weights[lo:hi].to(part.dtype)
    return (part * w).sum(-1) / w.sum()


def locality(profile: torch.Tensor, near: int, window: int, weights: torch.Tensor | None = None) -> torch.Tensor:
    """How much a score profile decays over ``window`` distances: its mean over r in [1, near] minus its mean
    over [window/2, window). Positive: near keys score higher (decay); negative: far keys do (a rise)."""
    return window_mean(profile, 1, near + 1, weights) - window_mean(profile, window // 2, window, weights)
