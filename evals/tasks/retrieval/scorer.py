"""Running retrieval prompts through the model: :class:`PromptScorer` scores a prompt by greedy generation or by
teacher forcing (one forward with the answer appended: is every answer token the argmax, and the answer's
log-probability), reusing the KV cache of the previous prompt's common prefix (``DynamicCache.crop``) and
extending a cached prefix in chunks -- or prompts of one length as the rows of one batch (:meth:`score_rows`);
each forward's rate feeds the cost said before a length (:mod:`evals.core.scoring.cost`). :func:`is_correct`: a
generated answer matched against the keys."""

from __future__ import annotations

import inspect
import re
import time

import torch
from transformers import DynamicCache

from ...core.scoring.cost import cost_of


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0]) if len(differ) else n


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The argmax of each row of ``logits`` (the first maximum, NaN counted as the largest, like torch's). On the CPU
    in float32 through NumPy: torch's CPU argmax takes ~75 us over a 49,152-word vocabulary, NumPy's ~9 us, and a
    greedy prompt takes one per generated token (bench/retrieval_overhead.py)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return torch.as_tensor(logits.numpy().argmax(-1))
    return logits.argmax(-1)


class PromptScorer:
    """Runs prompts through the model, reusing the KV cache of the previous prompt's common prefix."""

    def __init__(self, model, share: bool, max_new_tokens: int, eos_id: int | None, prefill_chunk: int = 1024):
        self.model, self.share, self.max_new_tokens, self.eos_id = model, share, max_new_tokens, eos_id
        self.prefill_chunk = prefill_chunk
        self.device = next(model.parameters()).device
        self.cache, self.cached = None, torch.tensor([], dtype=torch.int64)
        self.length = 0  # tokens in the cache (kept here: the cache's own count walks every layer)
        self.computed = 0  # tokens actually run through the model (prefill + decode)
        self.cost = cost_of(model)
        # transformers 5 renamed past_key_values to cache (the old name warns on every call); older ones take the old
        self.cache_arg = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"

    def _forward(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        """``ids`` ([1, new], on the model's device) through the model after the cache; the last ``keep`` logits."""
        return self._forward_rows(ids, keep)[0]

    def _forward_rows(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        """``ids`` ([rows, new]) through the model after the cache: the last ``keep`` logits of each row."""
        rows, new, cached = ids.shape[0], ids.shape[1], self.length
        started = time.perf_counter()
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=keep, **{self.cache_arg: self.cache})
        self.cost.record(time.perf_counter() - started, cached + new, new, forwards=rows)
        self.computed += rows * new
        self.length = cached + new
        return out.logits.float()

    def _crop(self, length: int) -> None:
        self.cache.crop(length - self.length)
        self.length = min(self.length, length)

    @torch.inference_mode()
    def prefill(self, prompt: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        """Bring the cache to ``prompt`` + ``extra`` and return the logits of its last len(extra)+1 positions."""
        if self.share and self.cache is not None:
            keep = min(common_prefix(self.cached, prompt), len(prompt) - 1)
            self._crop(keep)
        else:
            self.cache, self.length, keep = DynamicCache(), 0, 0
        tokens, wanted = torch.cat([prompt[keep:], extra]).to(self.device)[None], len(extra) + 1
        if keep:
            # after a cached prefix, attention takes an explicit mask and computes the whole [new x cached + new]
            # block, masked half included: chunks bound that waste, at a per-forward cost. SmolLM2 on CPU,
            # 1024 cached + 3072 new: 11.2 s in one forward, 9.5 s in 1024-token chunks (docs/benchmarks.md)
            while tokens.shape[1] - self.prefill_chunk >= wanted:
                self._forward(tokens[:, : self.prefill_chunk], keep=1)
                tokens = tokens[:, self.prefill_chunk :]
        logits = self._forward(tokens, keep=wanted)
        self.cached = prompt
        return logits

    def reset(self) -> None:
        """Drop the cache (after a failed allocation)."""
        self.cache, self.cached, self.length = None, torch.tensor([], dtype=torch.int64), 0

    def _rewind(self, prompt: torch.Tensor) -> None:
        self._crop(len(prompt))

    @torch.inference_mode()
    def generate(self, prompt: torch.Tensor) -> list[int]:
        next_token = int(greedy(self.prefill(prompt, prompt[:0])[-1]))
        generated = [next_token]
        while len(generated) < self.max_new_tokens and next_token != self.eos_id:
            step = torch.tensor([[next_token]], device=self.device)
            next_token = int(greedy(self._forward(step, keep=1)[-1]))
            generated.append(next_token)
        self._rewind(prompt)
        return generated

    @torch.inference_mode()
    def teacher_forced(self, prompt: torch.Tensor, answer: torch.Tensor) -> tuple[bool, float]:
        logits = self.prefill(prompt, answer[:-1])
        logprobs = torch.log_softmax(logits, -1)
        picked = logprobs.gather(1, answer[:, None].to(logprobs.device)).flatten()
        self._rewind(prompt)
        return bool((greedy(logits).cpu() == answer).all()), float(picked.sum())

    @torch.inference_mode()
    def score_rows(
        self, prompts: list[torch.Tensor], answers: list[torch.Tensor], generate: bool, teacher_forced: bool
    ) -> tuple[list[list[int]] | None, list[tuple[bool, float]] | None]:
        """Prompts of one length as the rows of one batch, each scored as :meth:`generate` and
        :meth:`teacher_forced` score it alone: no padding inside a prompt (all have the same tokens count), the
        answers right-padded (causal attention: a row's padding comes after everything it is scored on). Rows do
        not share a prefix: the cache starts empty and is dropped after."""
        ids = torch.stack(prompts).to(self.device)
        rows, length = ids.shape
        self.cache, self.cached, self.length = DynamicCache(), torch.tensor([], dtype=torch.int64), 0
        generated = None
        if generate:
            next_tokens = greedy(self._forward_rows(ids, keep=1)[:, -1])
            generated = [[int(t)] for t in next_tokens]
            # a row stops at the end of text or at max_new_tokens, as alone; the batch runs while any row goes on
            going = [t[0] != self.eos_id and self.max_new_tokens > 1 for t in generated]
            while any(going):
                next_tokens = greedy(self._forward_rows(next_tokens.to(self.device)[:, None], keep=1)[:, -1])
                for row, token in enumerate(next_tokens.tolist()):
                    if going[row]:
                        generated[row].append(token)
                        going[row] = token != self.eos_id and len(generated[row]) < self.max_new_tokens
            self._crop(length - 1)
        else:
            self._forward_rows(ids[:, :-1], keep=1)
        scored = None
        if teacher_forced:
            # as alone: the prompt's last token and the answer but its last after the cached prompt, one forward
            width = max(len(a) for a in answers)
            tail = torch.stack([torch.cat([a[:-1], a[-1:].repeat(width - len(a))]) for a in answers])
            logits = self._forward_rows(torch.cat([ids[:, -1:], tail.to(self.device)], 1), keep=width)
            logprobs = torch.log_softmax(logits, -1)
            picks = greedy(logits).cpu()
            scored = []
            for row, answer in enumerate(answers):
                picked = logprobs[row, : len(answer)].gather(1, answer[:, None].to(logprobs.device)).flatten()
                scored.append((bool((picks[row, : len(answer)] == answer).all()), float(picked.sum())))
        self.reset()
        return generated, scored


def is_correct(text: str, keys: list[str], match: str) -> float:
    """Fraction of ``keys`` found in the generated text (substring, or as whole numbers with exact)."""
    if match == "exact":
        numbers = set(re.findall(r"\d+", text))
        return sum(k in numbers for k in keys) / len(keys)
    return sum(k in text for k in keys) / len(keys)
