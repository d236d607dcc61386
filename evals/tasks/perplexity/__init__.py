"""Perplexity by length, token-weighted, under the two protocols papers use.

- ``prefix`` (LCEG, Lu et al. 2024, arXiv 2409.12181): ppl at L over the first L tokens of each document.
  Under causal attention the loss at position t does not depend on later tokens, so for static
  strategies every length comes out of one forward at the largest length a document allows; dynamic
  strategies (frequencies depend on the length) get one forward per length.
- ``sliding`` (Press et al. 2022, arXiv 2108.12409; used by PI and YaRN): windows of L tokens advanced
  by ``stride``; only tokens new to a window are scored; optionally BOS first in every window. Each
  document is scored over its first ``max_tokens`` tokens (default: the longest length, as the yarn
  scripts truncate); results say how many tokens each length scored.

Per length: ppl, mean NLL, tokens, documents, skipped documents, a 95% confidence interval (Student-t
across documents, or a block bootstrap within a single document; the method is recorded, see
evals/core/stats.py), and an out-of-memory flag: a failed allocation at one length, on any device, is
recorded and the other lengths go on. Also the loss-by-position curve of the longest prefix pass. Every
length is scored on the same documents: those with at least ``min_document_tokens`` tokens (default: the
longest length; 0 scores each document at the lengths it reaches, counting it as skipped at the others).
Results are written after each document, so nothing computed is lost. Whether a strategy keeps the model
working is judged against the unscaled model by :mod:`evals.core.decision.verdict`, not here.

With ``longppl=true``, LongPPL (Fang et al., ICLR 2025, arXiv 2410.23771) too: per length, the perplexity
over key tokens only (``longppl@L``, with its interval and the key-token count) -- tokens whose loss a long
context lowers, found by an evaluator model and cached as character spans (evals/tasks/perplexity/key_tokens.py).

The package: :mod:`.eval` (config, checks, metrics, the registered eval), :mod:`.protocols` (one document scored
under prefix or sliding), :mod:`.accumulate` (per-length NLL, intervals, units, rows), :mod:`.key_tokens`
(LongPPL's key tokens).
"""

from __future__ import annotations

from ...core.scoring.nll import sliding_nll, token_nll
from .accumulate import Accumulator, measurements
from .eval import (
    CALIBRATION_TOKENS,
    PerplexityConfig,
    PerplexityError,
    check_config,
    evaluate,
    metrics,
    reference_config,
    resolve_config,
)

__all__ = [
    "CALIBRATION_TOKENS",
    "Accumulator",
    "PerplexityConfig",
    "PerplexityError",
    "check_config",
    "evaluate",
    "measurements",
    "metrics",
    "reference_config",
    "resolve_config",
    "sliding_nll",
    "token_nll",
]
