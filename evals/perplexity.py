"""Perplexity by length, token-weighted, under the two protocols papers use.

- ``prefix`` (LCEG, arXiv 2409.12181): ppl at L over the first L tokens of each document. Under causal
  attention the loss at position t does not depend on later tokens, so for static strategies every
  length comes out of one forward at the largest length a document allows; dynamic strategies
  (frequencies depend on the length) get one forward per length.
- ``sliding`` (Press et al. 2022, arXiv 2108.12409; used by PI and YaRN): windows of L tokens advanced
  by ``stride``; only tokens new to a window are scored; optionally BOS first in every window.

Per length: ppl, mean NLL, tokens, documents, skipped documents, a 95% confidence interval across
documents (normal approximation on per-document mean NLL), and an out-of-memory flag. Also the
loss-by-position curve of the longest prefix pass and the effective length: the largest length up to
which ppl stays within (1 + tolerance) x ppl at the trained length. Results are written after each
document, so nothing computed is lost.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
from tqdm import tqdm

from .lm import token_nll
from .plots import line_plot

PROTOCOLS = ("prefix", "sliding")


class PerplexityError(ValueError):
    pass


def check_config(cfg) -> None:
    if cfg.protocol not in PROTOCOLS:
        raise PerplexityError(f"eval.protocol={cfg.protocol!r} is not one of {', '.join(PROTOCOLS)}")
    bad = [L for L in cfg.lengths if not isinstance(L, int) or L < 2]
    if not cfg.lengths or bad:
        raise PerplexityError(f"eval.lengths must be integers >= 2, got {list(cfg.lengths)}")
    if cfg.chunk_tokens < 1:
        raise PerplexityError(f"eval.chunk_tokens must be >= 1, got {cfg.chunk_tokens}")
    span = min(cfg.lengths) - (1 if cfg.bos_per_window else 0)
    if cfg.protocol == "sliding" and not 1 <= cfg.stride <= span:
        raise PerplexityError(f"eval.stride={cfg.stride} must be between 1 and the smallest window's {span} tokens")


def sliding_nll(model, ids: torch.Tensor, window: int, stride: int, bos_id: int | None, chunk_tokens: int):
    """(sum of NLL, number of scored tokens) over ``ids`` with windows of ``window`` tokens.

    Each window scores only the tokens no earlier window scored; a window's first token is scored
    only when BOS precedes it (otherwise it has no prefix in the window, as in the HF recipe).
    """
    offset = 1 if bos_id is not None else 0  # chunk index of ids[begin]
    span = window - offset
    total, count, scored_until, begin = 0.0, 0, 1 - offset, 0
    while scored_until < len(ids):
        end = min(begin + span, len(ids))
        chunk = ids[begin:end]
        if bos_id is not None:
            chunk = torch.cat([torch.tensor([bos_id]), chunk])
        nll = token_nll(model, chunk, chunk_tokens)  # nll[j] scores chunk[j + 1]
        first = max(scored_until - begin + offset, 1)  # chunk index of the first token to score
        new = nll[first - 1 :]
        total += float(new.double().sum())
        count += len(new)
        scored_until = end
        begin += stride
    return total, count


def _ci(values: list[float]) -> tuple[float | None, float | None]:
    if len(values) < 2:
        return None, None
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    half = 1.96 * sd / math.sqrt(len(values))
    return math.exp(mean - half), math.exp(mean + half)


def effective_length(rows: list[dict], trained: int, tolerance: float) -> int | None:
    """Largest length up to which ppl stays within (1 + tolerance) x ppl at the trained length."""
    scored = [r for r in rows if r["ppl"] is not None]
    reference = [r for r in scored if r["length"] <= trained]
    if not reference:
        return None
    limit = reference[-1]["ppl"] * (1 + tolerance)
    best = reference[-1]["length"]
    for row in scored:
        if row["length"] <= best:
            continue  # shorter contexts: higher ppl there is expected, not degradation
        if row["ppl"] > limit:
            break
        best = row["length"]
    return best


class Accumulator:
    def __init__(self, lengths):
        self.sum = defaultdict(float)
        self.count = defaultdict(int)
        self.doc_means = defaultdict(list)
        self.skipped = defaultdict(int)
        self.oom = set()
        self.lengths = lengths

    def add(self, length: int, nll_sum: float, count: int) -> None:
        self.sum[length] += nll_sum
        self.count[length] += count
        self.doc_means[length].append(nll_sum / count)

    def rows(self) -> list[dict]:
        rows = []
        for L in self.lengths:
            n = self.count[L]
            nll = self.sum[L] / n if n else None
            low, high = _ci(self.doc_means[L])
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
                    "oom": L in self.oom,
                }
            )
        return rows


def _prefix_document(model, ids, lengths, acc, cfg, dynamic, progress):
    """Score one document at every applicable length; returns the NLL of its longest pass."""
    todo = [L for L in lengths if L <= len(ids) and L not in acc.oom]
    longest = None
    while todo:
        passes = [todo[-1]] if not dynamic else list(reversed(todo))
        for L in passes:
            try:
                nll = token_nll(model, ids[:L], cfg.chunk_tokens, progress=progress and L >= 4096)
            except torch.OutOfMemoryError:
                acc.oom.add(L)
                todo.remove(L)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                break
            longest = nll if longest is None or len(nll) > len(longest) else longest
            covered = [L] if dynamic else list(todo)
            for length in covered:  # prefix sums: the first length-1 predictions
                acc.add(length, float(nll[: length - 1].double().sum()), length - 1)
                todo.remove(length)
    return longest


def evaluate(cfg, ctx) -> dict:
    check_config(cfg)
    lengths = sorted(set(cfg.lengths))
    documents = ctx.documents()
    if cfg.documents is not None:
        documents = documents[: cfg.documents]
    longest_doc = max((len(d.ids) for d in documents), default=0)
    too_long = [L for L in lengths if L > longest_doc]
    if too_long:
        raise PerplexityError(
            f"eval.lengths {too_long} exceed every document (longest: {longest_doc} tokens in {len(documents)} "
            f"documents); use shorter lengths or longer data"
        )
    model, trained = ctx.model, ctx.trained_context
    bos = ctx.tokenizer.bos_token_id if cfg.bos_per_window else None
    if cfg.bos_per_window and bos is None:
        raise PerplexityError("eval.bos_per_window=true but the tokenizer has no BOS token")
    acc = Accumulator(lengths)
    position_sum, position_count = torch.zeros(lengths[-1] - 1, dtype=torch.float64), torch.zeros(lengths[-1] - 1)
    for doc in tqdm(documents, desc=f"perplexity ({cfg.protocol})", unit="doc"):
        for L in lengths:
            if L > len(doc.ids):
                acc.skipped[L] += 1
        if cfg.protocol == "prefix":
            nll = _prefix_document(model, doc.ids, lengths, acc, cfg, ctx.dynamic, progress=True)
            if nll is not None:
                position_sum[: len(nll)] += nll.double()
                position_count[: len(nll)] += 1
        else:
            ids = doc.ids[: lengths[-1]]
            for L in lengths:
                if L <= len(doc.ids) and L not in acc.oom:
                    try:
                        acc.add(L, *sliding_nll(model, ids, L, cfg.stride, bos, cfg.chunk_tokens))
                    except torch.OutOfMemoryError:
                        acc.oom.add(L)
        rows = acc.rows()
        ctx.results.table("perplexity", rows)
        ctx.results.update("metrics", {"perplexity": {"protocol": cfg.protocol, "by_length": rows}})
    return _finish(cfg, ctx, acc.rows(), position_sum, position_count, trained)


def _finish(cfg, ctx, rows, position_sum, position_count, trained) -> dict:
    summary = {f"ppl@{r['length']}": r["ppl"] for r in rows}
    summary["effective_length"] = effective_length(rows, trained, cfg.tolerance)
    bins = []
    seen = int((position_count > 0).sum())
    if seen:
        width = max(1, math.ceil(seen / cfg.position_bins))
        for start in range(0, seen, width):
            end = min(start + width, seen)
            n = float(position_count[start:end].sum())
            bins.append({"position_start": start + 1, "position_end": end, "mean_nll": float(position_sum[start:end].sum()) / n})
        ctx.results.table("loss_by_position", bins)
    label = f"{ctx.model_name} / {ctx.scaling_label}"
    scored = [r for r in rows if r["ppl"] is not None]
    plot = line_plot(
        ctx.results.dir / "perplexity.png",
        {label: ([r["length"] for r in scored], [r["ppl"] for r in scored])},
        xlabel="context length (tokens)", ylabel="perplexity", title=f"Perplexity by length ({cfg.protocol})",
        logx=True, logy=True, vline=trained, vlabel=f"trained {trained}",
    )
    images = {"perplexity": plot}
    if bins:
        images["loss_by_position"] = line_plot(
            ctx.results.dir / "loss_by_position.png",
            {label: ([b["position_end"] for b in bins], [b["mean_nll"] for b in bins])},
            xlabel="position (tokens)", ylabel="mean NLL (nats)", title="Loss by position (longest pass)",
            vline=trained, vlabel=f"trained {trained}",
        )
    metrics = {"protocol": cfg.protocol, "by_length": rows, "loss_by_position": bins, **summary}
    ctx.results.update("metrics", {"perplexity": metrics})
    ctx.tracker.summary(summary)
    ctx.tracker.table("perplexity/by_length_table", rows, line=("length", "ppl"))
    ctx.tracker.table("perplexity/loss_by_position_table", bins, line=("position_end", "mean_nll"))
    for key, path in images.items():
        ctx.tracker.image(f"perplexity/{key}_plot", path)
    return summary
