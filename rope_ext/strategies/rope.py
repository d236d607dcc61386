"""RoPE's own frequencies (Su et al. 2021, RoFormer, arXiv 2104.09864), which every strategy starts from.

Notation: d = rotary dimension, b = base (rope_theta), theta_i = b^(-2i/d) for i = 0 .. d/2-1, wavelength
lambda_i = 2*pi / theta_i.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def default_inv_freq(dim: int, base: float) -> torch.Tensor:
    """RoPE's inverse frequencies theta_i = b^(-2i/d) for i < d/2 (Su et al. 2021, RoFormer, arXiv 2104.09864), float32
    exactly as transformers computes them. Args: ``dim`` the rotary dim d (even), ``base`` b. Returns a (d/2,) tensor.
    Raises nothing of its own.

    >>> default_inv_freq(4, 10000.0).tolist()
    [1.0, 0.009999999776482582]
    """
    # theta_i = b^(-2i/d), in float32 exactly as transformers computes it
    import torch

    exponent = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim
    return 1.0 / (base**exponent)


def wavelengths(inv_freq: torch.Tensor) -> torch.Tensor:
    """Wavelengths lambda_i = 2 pi / theta_i: the tokens per full rotation of each pair (inf where theta is 0). Args:
    ``inv_freq`` a tensor of frequencies. Returns a tensor of the same shape. Raises nothing of its own.

    >>> round(float(wavelengths(default_inv_freq(4, 10000.0))[1]), 1)
    628.3
    """
    # lambda_i = 2*pi / theta_i: tokens per full rotation of dimension pair i (inf for theta = 0)
    return 2 * math.pi / inv_freq


def effective_base(inv_freq: torch.Tensor, dim: int) -> float | None:
    """The base b with inv_freq = b^(-2i/d), or None when the frequencies are not of that form."""
    import torch

    if abs(float(inv_freq[0]) - 1.0) > 1e-6 or len(inv_freq) < 2:
        return None
    candidate = float(inv_freq[1]) ** (-dim / 2)
    return candidate if torch.allclose(default_inv_freq(dim, candidate), inv_freq, rtol=1e-4) else None
