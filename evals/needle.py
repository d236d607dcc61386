"""Needle-in-a-haystack and passkey retrieval over a grid of lengths x depths x trials.

Scoring (both deterministic): greedy generation with a substring or exact match on the key, and
teacher forcing (one forward with the answer appended: is every answer token the argmax, and the
answer's log-probability).

Prefix sharing: prompts of one length share the haystack up to their first needle. Prompts are run
in order of that divergence point and the KV cache is cropped back to the common prefix of the
previous prompt (``DynamicCache.crop``) instead of recomputed. Dynamic strategies, whose
frequencies depend on the length of each forward, would see a different length per chunk: they
run every prompt on its own, and the results say so.
"""

from __future__ import annotations

import json
import logging
import re
import time

import torch
from tqdm import tqdm
from transformers import DynamicCache

from .haystack import HaystackError, PromptBuilder, haystack_ids
from .plots import heatmap

log = logging.getLogger(__name__)
SCORING, MATCH, ASK, HAYSTACKS = ("generate", "teacher_forced", "both"), ("substring", "exact"), ("one", "all"), ("corpus", "filler")


def check_config(cfg) -> None:
    def need(ok, message):
        if not ok:
            raise HaystackError(message)

    need(cfg.lengths and all(isinstance(L, int) and L > 0 for L in cfg.lengths), f"eval.lengths must be positive integers, got {list(cfg.lengths)}")
    need(cfg.depths and all(0 <= d <= 1 for d in cfg.depths), f"eval.depths must lie in [0, 1], got {list(cfg.depths)}")
    need(cfg.trials >= 1 and cfg.prefill_chunk >= 1, f"eval.trials={cfg.trials} and eval.prefill_chunk={cfg.prefill_chunk} must be >= 1")
    need(cfg.scoring in SCORING, f"eval.scoring={cfg.scoring!r} is not one of {', '.join(SCORING)}")
    need(cfg.match in MATCH, f"eval.match={cfg.match!r} is not one of {', '.join(MATCH)}")
    need(cfg.ask in ASK, f"eval.ask={cfg.ask!r} is not one of {', '.join(ASK)}")
    need(cfg.haystack in HAYSTACKS, f"eval.haystack={cfg.haystack!r} is not one of {', '.join(HAYSTACKS)}")
    need(cfg.num_needles >= 1 and cfg.distractors >= 0, "eval.num_needles must be >= 1 and eval.distractors >= 0")
    need(1 <= cfg.key_digits[0] <= cfg.key_digits[1], f"eval.key_digits={list(cfg.key_digits)} must be [min, max] digits")


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0]) if len(differ) else n


class PromptScorer:
    """Runs prompts through the model, reusing the KV cache of the previous prompt's common prefix."""

    def __init__(self, model, share: bool, max_new_tokens: int, eos_id: int | None, prefill_chunk: int = 1024):
        self.model, self.share, self.max_new_tokens, self.eos_id = model, share, max_new_tokens, eos_id
        self.prefill_chunk = prefill_chunk
        self.device = next(model.parameters()).device
        self.cache, self.cached = None, torch.tensor([], dtype=torch.int64)
        self.computed = 0  # tokens actually run through the model (prefill + decode)

    def _forward(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        self.computed += len(ids)
        out = self.model(input_ids=ids[None].to(self.device), past_key_values=self.cache, use_cache=True, logits_to_keep=keep)
        return out.logits[0].float()

    @torch.inference_mode()
    def prefill(self, prompt: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        """Bring the cache to ``prompt`` + ``extra`` and return the logits of its last len(extra)+1 positions."""
        if self.share and self.cache is not None:
            keep = min(common_prefix(self.cached, prompt), len(prompt) - 1)
            self.cache.crop(keep - self.cache.get_seq_length())
        else:
            self.cache, keep = DynamicCache(), 0
        tokens, wanted = torch.cat([prompt[keep:], extra]), len(extra) + 1
        if keep:
            # after a cached prefix, attention takes an explicit mask and computes the whole [new x cached + new]
            # block, masked half included: chunks bound that waste, at a per-forward cost. SmolLM2 on CPU,
            # 1024 cached + 3072 new: 11.2 s in one forward, 9.5 s in 1024-token chunks (docs/benchmarks.md)
            while len(tokens) - self.prefill_chunk >= wanted:
                self._forward(tokens[: self.prefill_chunk], keep=1)
                tokens = tokens[self.prefill_chunk :]
        logits = self._forward(tokens, keep=wanted)
        self.cached = prompt
        return logits

    def _rewind(self, prompt: torch.Tensor) -> None:
        self.cache.crop(len(prompt) - self.cache.get_seq_length())

    @torch.inference_mode()
    def generate(self, prompt: torch.Tensor) -> list[int]:
        next_token = int(self.prefill(prompt, prompt[:0])[-1].argmax())
        generated = [next_token]
        while len(generated) < self.max_new_tokens and next_token != self.eos_id:
            next_token = int(self._forward(torch.tensor([next_token]), keep=1)[-1].argmax())
            generated.append(next_token)
        self._rewind(prompt)
        return generated

    @torch.inference_mode()
    def teacher_forced(self, prompt: torch.Tensor, answer: torch.Tensor) -> tuple[bool, float]:
        logits = self.prefill(prompt, answer[:-1])
        logprobs = torch.log_softmax(logits, -1)
        picked = logprobs.gather(1, answer[:, None].to(logprobs.device)).flatten()
        self._rewind(prompt)
        return bool((logits.argmax(-1).cpu() == answer).all()), float(picked.sum())


def is_correct(text: str, keys: list[str], match: str) -> float:
    """Fraction of ``keys`` found in the generated text (substring, or as whole numbers with exact)."""
    if match == "exact":
        numbers = set(re.findall(r"\d+", text))
        return sum(k in numbers for k in keys) / len(keys)
    return sum(k in text for k in keys) / len(keys)


def evaluate(cfg, ctx) -> dict:
    check_config(cfg)
    tokenizer = ctx.tokenizer
    documents = ctx.documents() if cfg.haystack == "corpus" else []
    builder = PromptBuilder(cfg, tokenizer, haystack_ids(cfg, tokenizer, documents))
    prompts = [builder.build(L, d, t) for L in sorted(cfg.lengths) for d in cfg.depths for t in range(cfg.trials)]
    share = cfg.prefix_sharing and not ctx.dynamic
    if cfg.prefix_sharing and ctx.dynamic:
        log.warning("prefix sharing is off: dynamic scaling '%s' gives every forward its own frequencies", ctx.scaling_label)
    # within a length, run prompts in order of where they leave the plain haystack
    prompts.sort(key=lambda p: (p.length, p.needle_position, p.depth, p.trial))
    scorer = PromptScorer(ctx.model, share, cfg.max_new_tokens, tokenizer.eos_token_id, cfg.prefill_chunk)
    started, trials_path = time.perf_counter(), ctx.results.dir / f"{cfg.name}_trials.jsonl"
    records = []
    with open(trials_path, "w") as trials_file:
        for prompt in tqdm(prompts, desc=f"{cfg.name} ({'shared prefix' if share else 'cell by cell'})", unit="prompt"):
            record = {"length": prompt.length, "depth": prompt.depth, "trial": prompt.trial, "prompt_tokens": len(prompt.ids),
                      "needle_position": prompt.needle_position, "keys": prompt.keys, "all_keys": prompt.all_keys}
            if cfg.scoring in ("generate", "both"):
                generated = scorer.generate(prompt.ids)
                record["answer"] = tokenizer.decode(generated, skip_special_tokens=True)
                record["correct"] = is_correct(record["answer"], prompt.keys, cfg.match)
            if cfg.scoring in ("teacher_forced", "both"):
                record["tf_correct"], record["tf_logprob"] = scorer.teacher_forced(prompt.ids, prompt.answer_ids)
            records.append(record)
            trials_file.write(json.dumps(record) + "\n")
            trials_file.flush()
    seconds = time.perf_counter() - started
    return _summarise(cfg, ctx, records, share, seconds, scorer.computed)


def _summarise(cfg, ctx, records, share, seconds, computed) -> dict:
    score_key = "correct" if cfg.scoring in ("generate", "both") else "tf_correct"
    cells = []
    for L in sorted(cfg.lengths):
        for d in cfg.depths:
            cell = [r for r in records if r["length"] == L and r["depth"] == d]
            row = {"length": L, "depth": d, "trials": len(cell), "accuracy": sum(float(r[score_key]) for r in cell) / len(cell)}
            if "tf_logprob" in cell[0]:
                row["tf_accuracy"] = sum(r["tf_correct"] for r in cell) / len(cell)
                row["tf_mean_logprob"] = sum(r["tf_logprob"] for r in cell) / len(cell)
            cells.append(row)
    ctx.results.table(f"{cfg.name}_cells", cells)
    by_length = {L: sum(c["accuracy"] for c in cells if c["length"] == L) / len(cfg.depths) for L in sorted(cfg.lengths)}
    passing = [L for L, acc in by_length.items() if acc >= cfg.threshold]
    summary = {f"{cfg.name}_acc@{L}": acc for L, acc in by_length.items()}
    summary[f"{cfg.name}_mean_acc"] = sum(by_length.values()) / len(by_length)
    summary[f"{cfg.name}_max_length_at_threshold"] = max(passing) if passing else None
    summary[f"{cfg.name}_prefix_sharing"] = share
    summary[f"{cfg.name}_seconds"] = round(seconds, 2)
    summary[f"{cfg.name}_tokens_computed"] = computed
    grid = [[next(c["accuracy"] for c in cells if c["length"] == L and c["depth"] == d) for L in sorted(cfg.lengths)]
            for d in cfg.depths]
    image = heatmap(ctx.results.dir / f"{cfg.name}_heatmap.png", grid, sorted(cfg.lengths), list(cfg.depths),
                    title=f"{cfg.name}: {ctx.model_name} / {ctx.scaling_label}", trained=ctx.trained_context)
    ctx.results.update("metrics", {cfg.name: {**summary, "cells": cells}})
    ctx.tracker.summary(summary)
    ctx.tracker.table(f"{cfg.name}/cells", cells)
    ctx.tracker.image(f"{cfg.name}/heatmap", image)
    return summary
