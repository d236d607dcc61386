"""Scoring one document under the two perplexity protocols, a length at a time.

- ``prefix`` (LCEG, Lu et al. 2024, arXiv 2409.12181): the first L tokens. Under causal attention the loss at
  position t does not depend on later tokens, so for static strategies every length comes out of one forward at
  the largest length the document allows; dynamic strategies (frequencies depend on the length) get one forward
  per length.
- ``sliding`` (Press et al. 2022, arXiv 2108.12409; used by PI and YaRN): windows of L tokens advanced by
  ``stride``; only tokens new to a window are scored (:func:`evals.core.scoring.nll.sliding_nll`).

Each forward says its expected cost first and records its rate (:mod:`evals.core.scoring.cost`); a failed allocation
at one length, on any device, is recorded in the accumulator and the other lengths go on
(:mod:`evals.core.scoring.oom`). With LongPPL, each length's NLL over the document's key tokens is accumulated too.
"""

from __future__ import annotations

import logging
import math
import time

from ...core.scoring.cost import Cost, cost_of
from ...core.scoring.nll import sliding_nll, token_nll
from ...core.scoring.oom import free_memory, is_out_of_memory
from .accumulate import Accumulator

log = logging.getLogger("evals.tasks.perplexity")


def _forward(acc: Accumulator, length: int, compute, cost: Cost | None = None, forwards: int = 1):
    """``compute()`` (its expected cost said first and its time recorded), or None after recording an
    allocation failure at ``length``."""
    try:
        if cost is None:
            return compute()
        cost.announce("perplexity", length, forwards=forwards)
        started = time.perf_counter()
        result = compute()
        cost.record(time.perf_counter() - started, length, forwards=forwards)
        return result
    except Exception as err:
        if not is_out_of_memory(err):
            raise
        log.warning(
            "out of memory at length %d (%s); recorded, going on with the other lengths",
            length,
            str(err).splitlines()[0][:120],
        )
        acc.oom.add(length)
        free_memory()
        return None


def prefix_document(model, ids, lengths, acc, cfg, dynamic) -> dict:
    """Score one document at every applicable length: {length: NLL of its first length - 1 predictions}
    (the largest length's is its longest pass)."""
    todo = [L for L in lengths if L <= len(ids) and L not in acc.oom]
    scored, cost = {}, cost_of(model)
    while todo:
        for L in [todo[-1]] if not dynamic else list(todo):  # dynamic: shortest first, its rate predicts the next
            nll = _forward(acc, L, lambda: token_nll(model, ids[:L], cfg.chunk_tokens, progress=L >= 4096), cost)
            if nll is None:
                todo.remove(L)
                break
            for length in [L] if dynamic else list(todo):  # prefix sums: the first length-1 predictions
                scored[length] = nll[: length - 1]
                todo.remove(length)
    return scored


def sliding_document(model, ids, lengths, acc, cfg, bos) -> dict:
    """{length: NLL of the tokens its windows score}."""
    scored, cost = {}, cost_of(model)
    for L in lengths:
        if L <= len(ids) and L not in acc.oom:
            windows = 1 + max(0, math.ceil((len(ids) - L) / cfg.stride))
            nll = _forward(acc, L, lambda: sliding_nll(model, ids, L, cfg.stride, bos, cfg.chunk_tokens), cost, windows)
            if nll is not None:
                scored[L] = nll
    return scored


def covered(doc, lengths, cfg, max_tokens) -> int:
    """How many of the document's tokens the eval scores (0: none): its longest prefix, or its sliding span."""
    if cfg.protocol == "prefix":
        return max((L for L in lengths if L <= len(doc.ids)), default=0)
    n = min(len(doc.ids), max_tokens)
    return n if any(L <= n for L in lengths) else 0


def add_key_tokens(keys, key_acc, doc, model, scored, first: int, full) -> None:
    """Each length's NLL over the document's key tokens; ``first``: the token its NLL[0] scores; ``full``:
    the longest prefix pass (the evaluator's full-context losses when the model is the unscaled evaluator)."""
    is_key = keys.mask(doc, model, full)
    if is_key is None:
        return
    for L, nll in scored.items():
        chosen = is_key[first : first + len(nll)]
        if chosen.any():
            key_acc.add(L, nll[chosen], doc.name, chosen.nonzero().flatten() + first)
