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
evals/stats.py), and an out-of-memory flag: a failed allocation at one length, on any device, is
recorded and the other lengths go on. Also the loss-by-position curve of the longest prefix pass. Every
length is scored on the same documents: those with at least ``min_document_tokens`` tokens (default: the
longest length; 0 scores each document at the lengths it reaches, counting it as skipped at the others).
Results are written after each document, so nothing computed is lost. Whether a strategy keeps the model
working is judged against the unscaled model by :mod:`evals.core.verdict`, not here.

With ``longppl=true``, LongPPL (Fang et al., ICLR 2025, arXiv 2410.23771) too: per length, the perplexity
over key tokens only (``longppl@L``, with its interval and the key-token count) -- tokens whose loss a long
context lowers, found by an evaluator model and cached as character spans (evals/perplexity/key_tokens.py).
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch

from ..core.config import lengths as context_lengths
from ..core.config import option
from ..core.errors import UserError
from ..core.plots import line_plot
from ..core.progress import progress
from ..core.measure import Measurement, token_blocks
from ..core.registry import Metric, register_eval
from .key_tokens import KeyTokens, KeyTokensConfig
from .key_tokens import check as check_key_tokens
from ..scoring.cost import Cost, cost_of, warn_if_too_large
from ..scoring.nll import sliding_nll, token_nll
from ..scoring.oom import free_memory, is_out_of_memory
from ..stats import block_bootstrap, t_interval
from .. import bias as biases

log = logging.getLogger(__name__)
CALIBRATION_TOKENS = 4096  # ablate_mode=center: the means removed are those over the first document's first tokens


class PerplexityError(UserError):
    pass


@dataclass
class PerplexityConfig:
    name: str = "perplexity"
    lengths: List[Any] = context_lengths([1024, 2048, 4096, 8192, 16384], minimum=2)  # tokens or multiples (2x)
    protocol: str = option("prefix", choices=("prefix", "sliding"))  # prefix: first L tokens; sliding: window L
    stride: int = option(256, minimum=1)  # sliding: tokens advanced per window; only new tokens are scored
    bos_per_window: bool = False  # sliding: prepend BOS to every window (the yarn script does)
    max_tokens: Optional[int] = option(None, minimum=2)  # sliding: tokens scored per document (null: longest length)
    min_document_tokens: Optional[int] = option(
        None, minimum=0
    )  # shorter documents are not scored (null: longest length)
    documents: Optional[int] = option(None, minimum=1)  # how many documents to evaluate (None: all)
    chunk_tokens: int = option(
        2048, minimum=1, compare=False
    )  # LM head + cross-entropy over this many positions at a time
    position_bins: int = option(64, minimum=1, compare=False)  # bins of the loss-by-position curve
    bootstrap_block: int = option(
        256, minimum=1
    )  # the units: blocks of this many token positions (the verdict pairs them)
    bootstrap_samples: int = option(1000, minimum=100, compare=False)
    seed: int = option(0, compare=False)  # bootstrap resampling
    longppl: bool = option(
        False, compare=False
    )  # also LongPPL: perplexity over key tokens (eval.key_tokens), per length
    key_tokens: KeyTokensConfig = field(default_factory=KeyTokensConfig)
    ablate_bias: List[str] = option(
        [], choices=tuple(biases.PROJECTIONS)
    )  # biases changed while scoring (evals/bias.py)
    ablate_mode: str = option(
        "zero", choices=biases.MODES
    )  # zero: b -> 0; center: b -> b - mean over CALIBRATION tokens


def resolve_config(cfg) -> None:
    """What the longest length decides, made explicit so a reference run at shorter lengths scores the same
    tokens: the documents scored (every length on the documents that reach the longest one) and, sliding,
    the tokens scored per document."""
    longest = max(cfg.lengths)
    if cfg.min_document_tokens is None:
        cfg.min_document_tokens = longest
    if cfg.protocol == "sliding" and cfg.max_tokens is None:
        cfg.max_tokens = longest


def check_config(cfg, job=None) -> None:
    span = min(cfg.lengths) - (1 if cfg.bos_per_window else 0)
    if cfg.protocol == "sliding" and not cfg.stride <= span:
        raise PerplexityError(f"eval.stride={cfg.stride} must be at most the smallest window's {span} new tokens")
    if cfg.protocol == "sliding" and cfg.max_tokens is not None and cfg.max_tokens < max(cfg.lengths):
        raise PerplexityError(
            f"eval.max_tokens={cfg.max_tokens} is below the longest length {max(cfg.lengths)}; "
            f"raise it or leave it null"
        )
    if cfg.ablate_bias and cfg.longppl:
        raise PerplexityError(
            f"eval.ablate_bias={list(cfg.ablate_bias)} with eval.longppl=true: the key tokens would be "
            "found by the ablated model; run LongPPL without the ablation"
        )
    if job is not None:
        biases.check(cfg.ablate_bias, job.model, "eval.ablate_bias", PerplexityError)
    if cfg.longppl:
        from ..core.model_cache import MODEL_CACHE

        try:
            check_key_tokens(cfg.key_tokens, list(cfg.lengths), job, job and (lambda: MODEL_CACHE.tokenizer(job.model)))
        except UserError as err:
            raise PerplexityError(str(err)) from None


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


def _prefix_document(model, ids, lengths, acc, cfg, dynamic) -> dict:
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


def _sliding_document(model, ids, lengths, acc, cfg, bos) -> dict:
    """{length: NLL of the tokens its windows score}."""
    scored, cost = {}, cost_of(model)
    for L in lengths:
        if L <= len(ids) and L not in acc.oom:
            windows = 1 + max(0, math.ceil((len(ids) - L) / cfg.stride))
            nll = _forward(acc, L, lambda: sliding_nll(model, ids, L, cfg.stride, bos, cfg.chunk_tokens), cost, windows)
            if nll is not None:
                scored[L] = nll
    return scored


def _covered(doc, lengths, cfg, max_tokens) -> int:
    """How many of the document's tokens the eval scores (0: none): its longest prefix, or its sliding span."""
    if cfg.protocol == "prefix":
        return max((L for L in lengths if L <= len(doc.ids)), default=0)
    n = min(len(doc.ids), max_tokens)
    return n if any(L <= n for L in lengths) else 0


def _add_key_tokens(keys, key_acc, doc, model, scored, first: int, full) -> None:
    """Each length's NLL over the document's key tokens; ``first``: the token its NLL[0] scores; ``full``:
    the longest prefix pass (the evaluator's full-context losses when the model is the unscaled evaluator)."""
    is_key = keys.mask(doc, model, full)
    if is_key is None:
        return
    for L, nll in scored.items():
        chosen = is_key[first : first + len(nll)]
        if chosen.any():
            key_acc.add(L, nll[chosen], doc.name, chosen.nonzero().flatten() + first)


def reference_config(cfg) -> None:
    """The unscaled reference runs at lengths up to the trained context: no LongPPL where no key token can be."""
    if cfg.longppl and cfg.key_tokens.short_context + cfg.key_tokens.stride >= max(cfg.lengths):
        cfg.longppl = False


def metrics(cfg) -> tuple[Metric, ...]:
    """ppl by length, and LongPPL when it runs."""
    ppl = Metric(
        "ppl",
        lower_is_better=True,
        verdict=True,
        count="tokens",
        interval=True,
        label="perplexity",
        log=True,
        nll=True,
        unit="token block",
    )
    longppl = Metric(
        "longppl",
        lower_is_better=True,
        verdict=True,
        count="key_tokens",
        interval=True,
        label="LongPPL",
        log=True,
        nll=True,
        unit="token block",
    )
    return (ppl, longppl) if cfg.longppl else (ppl,)


@register_eval(
    "perplexity",
    config=PerplexityConfig,
    error=PerplexityError,
    check=check_config,
    needs=("model", "data"),
    metrics=metrics,
    resolve=resolve_config,
    reference=reference_config,
)
def evaluate(cfg, ctx) -> dict:
    """Perplexity at each of ``eval.lengths`` (prefix or sliding protocol), with intervals and the effective length."""
    lengths = sorted(set(cfg.lengths))
    minimum = lengths[-1] if cfg.min_document_tokens is None else cfg.min_document_tokens
    documents = ctx.documents(count=cfg.documents, min_tokens=minimum)
    longest_doc = max((len(d.ids) for d in documents), default=0)
    too_long = [L for L in lengths if L > longest_doc]
    if too_long:
        raise PerplexityError(
            f"eval.lengths {too_long} exceed every document (longest: {longest_doc} tokens in {len(documents)} "
            f"documents); use shorter lengths or longer data"
        )
    eligible = [d for d in documents if len(d.ids) >= minimum]
    if not eligible:
        raise PerplexityError(
            f"no document has the {minimum} tokens eval.min_document_tokens asks for (longest: "
            f"{longest_doc}); lower it, or 0 to score each document at the lengths it reaches"
        )
    excluded = [d.name for d in documents if len(d.ids) < minimum]
    documents = eligible[: cfg.documents] if cfg.documents is not None else eligible
    bos = ctx.tokenizer().bos_token_id if cfg.bos_per_window else None
    if cfg.bos_per_window and bos is None:
        raise PerplexityError("eval.bos_per_window=true but the tokenizer has no BOS token")
    max_tokens = cfg.max_tokens or lengths[-1]
    keys = key_acc = None
    if cfg.longppl:  # key spans first: an evaluator pass, if any, runs before the model is patched
        keys = KeyTokens(cfg.key_tokens, ctx, cfg.chunk_tokens)
        unscaled = not (ctx.scaling.scales_frequencies or ctx.scaling.scales_query)
        keys.prepare(
            documents,
            {d.name: _covered(d, lengths, cfg, max_tokens) for d in documents},
            share=unscaled and cfg.protocol == "prefix",
        )
        key_acc = Accumulator(lengths, cfg, keep_tokens=len(documents) == 1)
    model = ctx.model()
    for L in lengths:
        warn_if_too_large(model, L, "perplexity")
    calibration = documents[0].ids[:CALIBRATION_TOKENS].to(next(model.parameters()).device)[None]
    with biases.ablated(
        model, cfg.ablate_bias, cfg.ablate_mode, lambda m: m.base_model(input_ids=calibration)
    ) as ablation:
        if ablation:
            ctx.output.metrics("ablation", ablation)
        return _score(cfg, ctx, model, documents, lengths, max_tokens, bos, keys, key_acc, excluded)


def _score(cfg, ctx, model, documents, lengths, max_tokens, bos, keys, key_acc, excluded) -> dict:
    """Every document at every length; results written after each."""
    acc = Accumulator(lengths, cfg, keep_tokens=len(documents) == 1)
    position_sum, position_count = torch.zeros(lengths[-1] - 1, dtype=torch.float64), torch.zeros(lengths[-1] - 1)
    for doc in progress(documents, f"perplexity ({cfg.protocol})", "document"):
        for L in lengths:
            if L > len(doc.ids):
                acc.skipped[L] += 1
        if cfg.protocol == "prefix":
            scored = _prefix_document(model, doc.ids, lengths, acc, cfg, ctx.scaling.dynamic)
            if scored:
                nll = scored[max(scored)]
                position_sum[: len(nll)] += nll.double()
                position_count[: len(nll)] += 1
        else:
            scored = _sliding_document(model, doc.ids[:max_tokens], lengths, acc, cfg, bos)
        first = 1 if cfg.protocol == "prefix" or bos is None else 0  # the document position NLL[0] scores
        for L, nll in scored.items():
            acc.add(L, nll, doc.name, torch.arange(first, first + len(nll)))
        if keys is not None and scored:
            _add_key_tokens(
                keys, key_acc, doc, model, scored, first, scored[max(scored)] if cfg.protocol == "prefix" else None
            )
        rows = _rows(acc, key_acc)
        ctx.output.measure(*measurements(cfg, rows, acc, key_acc))  # kept if stopped now
        ctx.output.table("perplexity", rows)
        ctx.output.metrics(
            "perplexity",
            {"protocol": cfg.protocol, "by_length": rows, **({"longppl": keys.describe()} if keys else {})},
        )
    return _finish(cfg, ctx, _rows(acc, key_acc), position_sum, position_count, max_tokens, keys, excluded)


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


def _rows(acc: Accumulator, key_acc: Accumulator | None) -> list[dict]:
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


def _position_bins(position_sum, position_count, bins: int) -> list[dict]:
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


def _finish(cfg, ctx, rows, position_sum, position_count, max_tokens, keys=None, excluded=()) -> dict:
    trained = ctx.trained_context
    summary = ctx.output.flat()  # ppl (LongPPL) by length, counts and intervals: the measurements recorded
    if keys is not None:
        ctx.output.timing("key_tokens_s", keys.seconds)
    bins = _position_bins(position_sum, position_count, cfg.position_bins)
    if bins:
        ctx.output.table("loss_by_position", bins)
    scored = [r for r in rows if r["ppl"] is not None]
    if bins:
        ctx.output.figure(
            "loss_by_position_plot",
            line_plot(
                {ctx.title: ([b["position_end"] for b in bins], [b["mean_nll"] for b in bins])},
                xlabel="position (tokens)",
                ylabel="mean NLL (nats)",
                title="Loss by position (longest pass)",
                vline=trained,
                vlabel=f"trained {trained}",
            ),
        )
    ctx.output.curve(
        "perplexity", [{k: r[k] for k in ("length", "ppl", "nll", "ci95_low", "ci95_high", "tokens")} for r in scored]
    )
    ctx.output.metrics(
        "perplexity",
        {
            "protocol": cfg.protocol,
            "by_length": rows,
            "loss_by_position": bins,
            "excluded_documents": list(excluded),
            **({"longppl": keys.describe()} if keys is not None else {}),
            **({"max_tokens": max_tokens} if cfg.protocol == "sliding" else {}),
            **summary,
        },
    )
    return summary
