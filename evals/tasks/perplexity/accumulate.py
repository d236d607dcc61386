"""What perplexity accumulates per length: token-weighted NLL, per-document means for the Student-t interval
across documents (or, with a single document, its token NLLs for the block bootstrap; :mod:`evals.core.stats`), the
units the verdict pairs (blocks of token positions per document, :mod:`evals.core.measure`), skipped documents
and out-of-memory lengths; the per-length rows and :class:`~evals.core.measure.Measurement` s made of them
(LongPPL's beside the plain ones), and the loss-by-position bins of the longest prefix pass."""

from __future__ import annotations

from typing import TYPE_CHECKING
import math
from collections import defaultdict

from ...core.measure import Measurement, token_blocks
from ...core.stats import block_bootstrap, t_interval

if TYPE_CHECKING:
    import torch


class Accumulator:
    """Token-weighted NLL per length, per-document means for the t interval, -- with a single document -- its
    token NLLs for the block bootstrap, and the units the verdict pairs: blocks of token positions per document
    (evals/core/measure.py)."""

    def __init__(self, lengths, cfg, keep_tokens: bool):

        self.lengths, self.cfg, self.keep_tokens = lengths, cfg, keep_tokens
        self.sum = defaultdict(float)
        self.count = defaultdict(int)
        self.doc_means = defaultdict(list)
        self.tokens: dict[int, torch.Tensor] = {}
        self.units: dict[int, dict] = defaultdict(dict)
        self.skipped = defaultdict(int)
        self.oom: set[int] = set()

    def add(self, length: int, nll: torch.Tensor, document: str, positions: torch.Tensor) -> None:
        """One document's token NLLs at ``length``, scored at ``positions`` of the document."""
        total = float(nll.double().sum())
        self.sum[length] += total
        self.count[length] += len(nll)
        self.doc_means[length].append(total / len(nll))
        self.units[length].update(token_blocks(document, nll, positions, self.cfg.bootstrap_block))
        if self.keep_tokens:
            self.tokens[length] = nll.clone()

    def interval(self, length: int) -> tuple[float | None, float | None, str | None]:
        means = self.doc_means[length]
        if len(means) >= 2:
            low, high = t_interval(means)
            return math.exp(low), math.exp(high), f"t, {len(means)} documents"
        if len(means) == 1 and length in self.tokens:
            found = block_bootstrap(
                self.tokens[length], self.cfg.bootstrap_block, self.cfg.bootstrap_samples, self.cfg.seed
            )
            if found:
                return (
                    math.exp(found[0]),
                    math.exp(found[1]),
                    f"block bootstrap, {self.cfg.bootstrap_block}-token blocks",
                )
        return None, None, None

    def rows(self) -> list[dict]:
        rows = []
        for L in self.lengths:
            n = self.count[L]
            nll = self.sum[L] / n if n else None
            low, high, method = self.interval(L)
            rows.append(
                {
                    "length": L,
                    "ppl": math.exp(nll) if nll is not None else None,
                    "nll": nll,
                    "tokens": n,
                    "documents": len(self.doc_means[L]),
                    "skipped_documents": self.skipped[L],
                    "ci95_low": low,
                    "ci95_high": high,
                    "ci_method": method,
                    "oom": L in self.oom,
                }
            )
        return rows


def measurements(cfg, rows: list[dict], acc: Accumulator, key_acc: Accumulator | None) -> list[Measurement]:
    """ppl (and LongPPL) at each length scored so far, with their units: blocks of token positions per document."""
    unit = f"{cfg.bootstrap_block}-token block"
    found = []
    for row in rows:
        L = row["length"]
        oom = "out of memory" if row["oom"] else None  # a length cut short is no value, not a partial one
        if row["documents"] or row["oom"]:
            found.append(
                Measurement(
                    "ppl",
                    L,
                    None if oom else row["ppl"],
                    row["tokens"],
                    unit,
                    acc.units.get(L, {}),
                    row["ci95_low"],
                    row["ci95_high"],
                    row["ci_method"],
                    oom,
                )
            )
        if key_acc is not None and (row["documents"] or row["oom"]):
            found.append(
                Measurement(
                    "longppl",
                    L,
                    None if oom else row["longppl"],
                    row["key_tokens"],
                    unit,
                    key_acc.units.get(L, {}),
                    row["longppl_ci95_low"],
                    row["longppl_ci95_high"],
                    row["ci_method"],
                    oom or (None if row["longppl"] is not None else "no key token at this length"),
                )
            )
    return found


def rows_of(acc: Accumulator, key_acc: Accumulator | None) -> list[dict]:
    """Per-length rows; with LongPPL, its perplexity, interval and key-token count beside the plain ones."""
    rows = acc.rows()
    if key_acc is not None:
        for row, key in zip(rows, key_acc.rows()):
            row.update(
                {
                    "longppl": key["ppl"],
                    "longppl_nll": key["nll"],
                    "key_tokens": key["tokens"],
                    "longppl_ci95_low": key["ci95_low"],
                    "longppl_ci95_high": key["ci95_high"],
                }
            )
    return rows


def position_bins(position_sum, position_count, bins: int) -> list[dict]:
    seen = int((position_count > 0).sum())
    rows = []
    if seen:
        width = max(1, math.ceil(seen / bins))
        for start in range(0, seen, width):
            end = min(start + width, seen)
            n = float(position_count[start:end].sum())
            rows.append(
                {"position_start": start + 1, "position_end": end, "mean_nll": float(position_sum[start:end].sum()) / n}
            )
    return rows
