"""Key tokens for LongPPL (Fang et al., "What is Wrong with Perplexity for Long-context Language Modeling?",
ICLR 2025, arXiv 2410.23771), found by an evaluator model and kept as character spans of the text.

A token is key when a long context is what lets the evaluator predict it: its loss with a short context
minus its loss with the full context exceeds ``alpha`` (the paper's LSD > alpha) and its full-context
log-probability exceeds ``beta`` (LCL > beta, i.e. loss < -beta). As the reference package does (PyPI
``longppl`` 0.3.0, ``find_key_token`` / ``cal_overlap``):

- full context: one forward over the whole text -- here the text the eval's longest pass covers;
- short context: windows of ``short_context + stride`` tokens advanced by ``stride``, only the last
  ``stride`` tokens of each scored, so every token past the first ``short_context`` sees between
  ``short_context`` and ``short_context + stride - 1`` tokens (the package's ``trunc_len = short_context``,
  default 4096, and ``sliding_window = stride``, default 1024); the first window's tokens see their full
  context and are never key;
- the key tokens' character offsets, adjacent ones merged, are the key spans; a token of the evaluated
  model is key when its character span lies inside a key span (so any tokenizer can use them).

Both losses come from :func:`evals.core.scoring.nll.token_nll` / :func:`evals.core.scoring.nll.sliding_nll`, never full
``[tokens, vocab]`` logits. The evaluator is the run's model without its scaling (default), a
``conf/model`` option by name, or a model config mapping. Spans are cached on disk under
``<cache>/key_tokens/``, keyed by the evaluator's identity, the text's hash and the parameters, so a sweep
finds them once; with the run's own unscaled model the full pass is the perplexity pass itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ...core.files import cache_dir, read_cache, write_cache
from ...core.config.fields import check_options, option
from ...core.config.store import config_dir
from ...core.config.structured import ModelConfig
from ...core.errors import UserError
from ...core.inputs.loading import load_tokenizer
from ...core.inputs.models import resolve_model
from ...core.scoring.nll import sliding_nll, token_nll

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
FORMAT = 2  # bump when what a cached span file means changes


class KeyTokenError(UserError):
    pass


@dataclass
class KeyTokensConfig:
    evaluator: Any = (
        None  # null: the run's model without its scaling; a conf/model name (smollm2, gemma3); or a model config
    )
    short_context: int = option(4096, minimum=1)  # the short context: tokens each short-pass token sees at least
    stride: int = option(1024, minimum=1)  # short windows (short_context + stride tokens) advance by this many
    alpha: float = option(2.0, minimum=0)  # key: short-context loss - full-context loss > alpha (LSD)
    beta: float = option(-2.0, maximum=0)  # key: full-context log-prob > beta, i.e. loss < -beta (LCL)


def model_options() -> list[str]:
    return sorted(p.stem for p in (config_dir() / "model").glob("*.yaml"))


def evaluator_config(cfg):
    """The evaluator's model config, or None for the run's own model."""
    chosen = cfg.evaluator
    if chosen is None:
        return None
    if isinstance(chosen, str):
        path = config_dir() / "model" / f"{chosen}.yaml"
        if not path.is_file():
            raise KeyTokenError(
                f"eval.key_tokens.evaluator={chosen!r} is not a model; valid: {', '.join(model_options())} "
                f"(or null: the run's model without its scaling)"
            )
        node = OmegaConf.load(path)
    elif OmegaConf.is_dict(chosen) or isinstance(chosen, dict):
        node = OmegaConf.create(chosen)
    else:
        raise KeyTokenError(
            f"eval.key_tokens.evaluator={chosen!r}: give a model name ({', '.join(model_options())}), "
            f"a model config, or null"
        )
    values = {k: v for k, v in OmegaConf.to_container(node).items() if k != "defaults"}
    try:
        model = OmegaConf.merge(OmegaConf.structured(ModelConfig), values)
        model.name  # noqa: B018 -- a mapping without a name fails here
    except OmegaConfBaseException as err:
        raise KeyTokenError(f"eval.key_tokens.evaluator: {str(err).splitlines()[0]}") from None
    check_options(model, ModelConfig, "eval.key_tokens.evaluator")
    return model


def evaluator_model(cfg):
    """The evaluator resolved as a model (None: the run's own model without its scaling)."""
    node = evaluator_config(cfg)
    return None if node is None else resolve_model(node, geometry=False, weights=True)


def require_offsets(tokenizer, who: str) -> None:
    """A tokenizer that cannot give character offsets (a slow, Python one) cannot map key spans."""
    try:
        found = "offset_mapping" in tokenizer("key tokens", return_offsets_mapping=True)
    except (NotImplementedError, ValueError, TypeError):
        found = False
    if not found:
        raise KeyTokenError(
            f"{who} has a tokenizer without character offsets ({type(tokenizer).__name__}; "
            f"return_offsets_mapping needs a fast tokenizer), which LongPPL maps key spans through; "
            f"give a tokenizer.json (model.tokenizer=...) or another eval.key_tokens.evaluator"
        )


def check(cfg, lengths: list[int], job=None, run_tokenizer=None) -> None:
    """Everything about key tokens that can go wrong, before any weights load (tokenizers only; with a job)."""
    check_options(cfg, KeyTokensConfig, "eval.key_tokens")
    if cfg.short_context + cfg.stride >= max(lengths):  # the first short window is the full context: no key token
        raise KeyTokenError(
            f"eval.key_tokens.short_context={cfg.short_context} + stride={cfg.stride} is at least every "
            f"eval.lengths (longest {max(lengths)}): no token would see less than its full context in "
            f"the short pass; lower them or add a longer length"
        )
    evaluator_config(cfg)
    if job is None:
        return
    require_offsets(run_tokenizer(), f"model '{job.model.name}'")
    evaluator = evaluator_model(cfg)
    if evaluator is not None:
        require_offsets(load_tokenizer(evaluator), f"eval.key_tokens.evaluator '{evaluator.name}'")


def merge_spans(offsets: list[tuple[int, int]]) -> list[list[int]]:
    """Key tokens' character offsets, in order, with adjacent ones (end == next start) merged."""
    spans: list[list[int]] = []
    for start, end in offsets:
        if spans and spans[-1][1] == start:
            spans[-1][1] = end
        else:
            spans.append([start, end])
    return spans


def tokens_in_spans(offsets: list[tuple[int, int]], spans: list[list[int]]) -> torch.Tensor:
    """Which tokens (by their character offsets) lie inside a key span: longppl's ``cal_overlap`` walk."""
    import torch

    key = torch.zeros(len(offsets), dtype=torch.bool)
    i = j = 0
    while i < len(offsets) and j < len(spans):
        (a_start, a_end), (b_start, b_end) = offsets[i], spans[j]
        if a_start >= b_start and a_end <= b_end:
            key[i] = True
            i += 1
        elif a_start < b_start:
            i += 1
        else:
            j += 1
    return key


def key_positions(full: torch.Tensor, short: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """Indices (into the given losses) of key tokens."""
    import torch

    return torch.nonzero((short - full > alpha) & (full < -beta)).flatten()  # LSD > alpha and log p > beta


@contextlib.contextmanager
def counting(model, counter: list):
    """Count the model's forwards (one entry per decoder call) while the block runs."""
    hook = model.get_decoder().register_forward_pre_hook(lambda *_: counter.append(1))
    try:
        yield
    finally:
        hook.remove()


def find_spans(model, ids: torch.Tensor, offsets: list, cfg, chunk_tokens: int, full: torch.Tensor | None = None):
    """Key spans of a text the evaluator tokenized as ``ids`` (character ``offsets``); ``full``: the
    full-context losses of ``ids[1:]`` when a pass already has them."""
    window, stride = cfg.short_context + cfg.stride, cfg.stride
    if len(ids) <= window:
        return []
    if full is None:
        full = token_nll(model, ids, chunk_tokens)
    # windows [k*stride, k*stride + window), k >= 1, score tokens window.. (loss index j: token stride + 1 + j)
    short = sliding_nll(model, ids[stride:], window, stride, None, chunk_tokens)[window - stride - 1 :]
    found = key_positions(full[window - 1 :], short, cfg.alpha, cfg.beta) + window  # token positions
    return merge_spans([tuple(offsets[p]) for p in found.tolist()])


def _spans(path: Path) -> list:
    """A cached key-span file's spans ([[start, end], ...] character offsets), else an error (damaged)."""
    stored = json.loads(path.read_text())
    spans = stored["spans"]
    if stored.get("format") != FORMAT or not all(
        isinstance(s, list) and len(s) == 2 and all(isinstance(x, int) for x in s) for s in spans
    ):
        raise ValueError(f"not key spans of format {FORMAT}")
    return spans


@dataclass
class Text:
    """A document's text as the eval scores it: the covered prefix, its tokens' character offsets under the
    evaluated model's tokenizer, and where its key spans are (or will be) kept."""

    name: str
    text: str
    offsets: list
    path: Path
    spans: list | None = None
    source: str = "cache"  # cache | evaluator | shared (found with the perplexity pass)


class KeyTokens:
    """Key spans of one job's documents: from the cache, else from the evaluator (before the model is
    patched), else -- run model, unscaled -- with the perplexity pass itself (:meth:`mask` gets its losses)."""

    def __init__(self, cfg, ctx, chunk_tokens: int):
        self.cfg, self.ctx, self.chunk_tokens = cfg, ctx, chunk_tokens
        self.evaluator = evaluator_model(cfg)
        if self.evaluator is None:
            identity = {"run_model": ctx.job.model.identity, "scaling": "none"}
        else:
            identity = self.evaluator.identity
        self.params = {
            "format": FORMAT,
            "evaluator": identity,
            "short_context": cfg.short_context,
            "stride": cfg.stride,
            "alpha": cfg.alpha,
            "beta": cfg.beta,
        }
        self.root = cache_dir(ctx.job.data_cfg.cache_dir if ctx.job.data_cfg is not None else None) / "key_tokens"
        self.texts: dict[str, Text] = {}
        self.forwards: list = []  # one entry per evaluator forward
        self.seconds = 0.0  # spent finding key spans (reading the cache, the evaluator's passes)

    @property
    def label(self) -> str:
        return self.evaluator.name if self.evaluator is not None else f"{self.ctx.job.model.label} (unscaled)"

    def _text(self, doc, tokens: int) -> Text:
        encoded = self.ctx.tokenizer()(doc.text, return_offsets_mapping=True)
        if len(encoded["input_ids"]) != len(doc.ids):
            raise KeyTokenError(
                f"document {doc.name}: its text gives {len(encoded['input_ids'])} tokens, its ids "
                f"{len(doc.ids)}; LongPPL needs the text the ids came from"
            )
        offsets = [tuple(o) for o in encoded["offset_mapping"][:tokens]]
        text = doc.text[: max(end for _, end in offsets)]
        digest = hashlib.sha256(
            json.dumps(
                {**self.params, "text": hashlib.sha256(text.encode()).hexdigest()}, sort_keys=True, default=str
            ).encode()
        ).hexdigest()[:24]
        found = Text(doc.name, text, offsets, self.root / f"{digest}.json")
        found.spans = read_cache(found.path, _spans, "LongPPL key-token spans")
        return found

    def _evaluator_ids(self, tokenizer, text: str, vocab: int):
        import torch

        encoded = tokenizer(text, return_offsets_mapping=True)
        ids = torch.tensor(encoded["input_ids"], dtype=torch.int64)
        return (ids % vocab if len(ids) and int(ids.max()) >= vocab else ids), [
            tuple(o) for o in encoded["offset_mapping"]
        ]

    def _save(self, found: Text, spans: list, source: str, tokens: int) -> None:
        found.spans, found.source = spans, source
        write_cache(
            found.path,
            json.dumps(
                {
                    **self.params,
                    "document": found.name,
                    "characters": len(found.text),
                    "evaluator_tokens": tokens,
                    "spans": spans,
                },
                default=str,
            ),
        )

    def prepare(self, documents, covered: dict[str, int], share: bool) -> None:
        """Key spans for every document with ``covered[name]`` tokens scored: read, or found now by the
        evaluator (its only pass); with ``share`` the run's unscaled model finds them later, in :meth:`mask`."""
        started = time.perf_counter()
        try:
            self._prepare(documents, covered, share)
        finally:
            self.seconds += time.perf_counter() - started

    def _prepare(self, documents, covered: dict[str, int], share: bool) -> None:
        for doc in documents:
            if covered.get(doc.name):
                if doc.text is None:
                    raise KeyTokenError(f"document {doc.name} has no text; LongPPL maps key spans through it")
                self.texts[doc.name] = self._text(doc, covered[doc.name])
        missing = [doc for doc in documents if doc.name in self.texts and self.texts[doc.name].spans is None]
        if share and self.evaluator is None:
            missing = [doc for doc in missing if not self._shareable(doc)]
        if not missing:
            return
        if self.evaluator is None:
            model, tokenizer = self.ctx.base_model(), self.ctx.tokenizer()
        else:
            log.info("loading evaluator %s for key tokens", self.evaluator.name)
            tokenizer, model = load_tokenizer(self.evaluator), self.ctx.other_model(self.evaluator)
        vocab = model.get_input_embeddings().num_embeddings
        with counting(model, self.forwards):
            for doc in missing:
                found = self.texts[doc.name]
                ids, offsets = self._evaluator_ids(tokenizer, found.text, vocab)
                self._save(found, find_spans(model, ids, offsets, self.cfg, self.chunk_tokens), "evaluator", len(ids))

    def _shareable(self, doc) -> bool:
        """The evaluator (the run's model) tokenizes the covered text as the eval's ids: its pass is ours."""
        import torch

        found = self.texts[doc.name]
        ids, _ = self._evaluator_ids(self.ctx.tokenizer(), found.text, 1 << 62)
        n = len(found.offsets)
        shareable = len(ids) == n and torch.equal(ids, doc.ids[:n])
        found.source = "shared" if shareable else found.source
        return shareable

    def mask(self, doc, model, full: torch.Tensor | None) -> torch.Tensor | None:
        """Which of the document's covered tokens are key (None: not covered). ``model`` (unscaled) and
        ``full`` (its losses of ``doc.ids[1:n]``) find spans the cache and evaluator did not."""
        found = self.texts.get(doc.name)
        if found is None:
            return None
        if found.spans is None:
            started, n = time.perf_counter(), len(found.offsets)
            full = full if full is not None and len(full) == n - 1 else None
            with counting(model, self.forwards):
                self._save(
                    found, find_spans(model, doc.ids[:n], found.offsets, self.cfg, self.chunk_tokens, full), "shared", n
                )
            self.seconds += time.perf_counter() - started
        return tokens_in_spans(found.offsets, found.spans)

    def describe(self) -> dict:
        return {
            "evaluator": self.label,
            "short_context": self.cfg.short_context,
            "stride": self.cfg.stride,
            "alpha": self.cfg.alpha,
            "beta": self.cfg.beta,
            "evaluator_forwards": len(self.forwards),
            "seconds": round(self.seconds, 3),
            "documents": [
                {
                    "name": t.name,
                    "key_spans": len(t.spans or []),
                    "source": t.source,
                    "characters": len(t.text),
                    "cache": str(t.path),
                }
                for t in self.texts.values()
            ],
        }
