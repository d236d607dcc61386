"""Scoring helpers shared by the evals, by job:

- :mod:`.nll`: per-token NLL without materialising [tokens, vocab] logits, sliding-window NLL, and a per-layer
  progress bar for long forwards (on a terminal);
- :mod:`.oom`: out-of-memory handling that treats a CPU allocation failure like a CUDA one;
- :mod:`.cost`: what a length will cost before it runs -- memory estimates against what the device has, and
  expected time (:class:`Cost`).

The names below are re-exported so ``from evals.core.scoring import token_nll`` keeps working.
"""

from __future__ import annotations

from ..run.peak import available_bytes
from .cost import Cost, cost_of, estimate_forward_bytes, warn_if_too_large
from .nll import layer_progress, logit_softcap, sliding_nll, token_nll
from .oom import free_memory, is_out_of_memory

__all__ = [
    "Cost",
    "available_bytes",
    "cost_of",
    "estimate_forward_bytes",
    "free_memory",
    "is_out_of_memory",
    "layer_progress",
    "logit_softcap",
    "sliding_nll",
    "token_nll",
    "warn_if_too_large",
]
