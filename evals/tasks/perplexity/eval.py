"""``eval=perplexity``: its config and checks, the metrics it declares, and the eval -- each document scored at
every length under the configured protocol (:mod:`.protocols`), accumulated per length (:mod:`.accumulate`),
results written after each document, then the loss-by-position curve and the summary (see :mod:`evals.tasks.perplexity`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from ...core.config.lengths import lengths as context_lengths
from ...core.config.fields import option
from ...core.errors import UserError
from ...core.plots import line_plot
from ...core.progress import progress
from ...core.registry import Metric, register_eval
from .accumulate import Accumulator, measurements, position_bins, rows_of
from .key_tokens import KeyTokens, KeyTokensConfig
from .key_tokens import check as check_key_tokens
from .protocols import add_key_tokens, covered, prefix_document, sliding_document
from ...core.scoring.cost import warn_if_too_large
from ...core import projection_bias as biases

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
    )  # biases changed while scoring (evals/core/projection_bias.py)
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
        from ...core.inputs.model_cache import MODEL_CACHE

        try:
            check_key_tokens(cfg.key_tokens, list(cfg.lengths), job, job and (lambda: MODEL_CACHE.tokenizer(job.model)))
        except UserError as err:
            raise PerplexityError(str(err)) from None


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
    short = [d for d in documents if len(d.ids) < minimum]
    excluded = [d.name for d in short]
    if short:  # said where the user looks, not only in results.json's excluded_documents
        ctx.output.dropped(
            ", ".join(f"document {d.name} ({len(d.ids)} tokens)" for d in short),
            f"shorter than the {minimum} tokens eval.min_document_tokens asks for (default: the longest length); "
            f"eval.min_document_tokens=0 scores a document at the lengths it reaches",
        )
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
            {d.name: covered(d, lengths, cfg, max_tokens) for d in documents},
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
    import torch

    acc = Accumulator(lengths, cfg, keep_tokens=len(documents) == 1)
    position_sum, position_count = torch.zeros(lengths[-1] - 1, dtype=torch.float64), torch.zeros(lengths[-1] - 1)
    for doc in progress(documents, f"perplexity ({cfg.protocol})", "document"):
        for L in lengths:
            if L > len(doc.ids):
                acc.skipped[L] += 1
        if cfg.protocol == "prefix":
            scored = prefix_document(model, doc.ids, lengths, acc, cfg, ctx.scaling.dynamic)
            if scored:
                nll = scored[max(scored)]
                position_sum[: len(nll)] += nll.double()
                position_count[: len(nll)] += 1
        else:
            scored = sliding_document(model, doc.ids[:max_tokens], lengths, acc, cfg, bos)
        first = 1 if cfg.protocol == "prefix" or bos is None else 0  # the document position NLL[0] scores
        for L, nll in scored.items():
            acc.add(L, nll, doc.name, torch.arange(first, first + len(nll)))
        if keys is not None and scored:
            add_key_tokens(
                keys, key_acc, doc, model, scored, first, scored[max(scored)] if cfg.protocol == "prefix" else None
            )
        rows = rows_of(acc, key_acc)
        ctx.output.measure(*measurements(cfg, rows, acc, key_acc))  # kept if stopped now
        ctx.output.table("perplexity", rows)
        ctx.output.metrics(
            "perplexity",
            {"protocol": cfg.protocol, "by_length": rows, **({"longppl": keys.describe()} if keys else {})},
        )
    return _finish(cfg, ctx, rows_of(acc, key_acc), position_sum, position_count, max_tokens, keys, excluded)


def _finish(cfg, ctx, rows, position_sum, position_count, max_tokens, keys=None, excluded=()) -> dict:
    trained = ctx.trained_context
    summary = ctx.output.flat()  # ppl (LongPPL) by length, counts and intervals: the measurements recorded
    if keys is not None:
        ctx.output.timing("key_tokens_s", keys.seconds)
    bins = position_bins(position_sum, position_count, cfg.position_bins)
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
