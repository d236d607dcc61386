"""Needle-in-a-haystack and passkey prompts, built in token space so lengths are exact.

A prompt is [chat header] + preamble + haystack with needle(s) inserted + question [+ chat assistant
header] + answer prefix, exactly ``length`` tokens. The target needle starts at token
``round(depth * budget)`` of the haystack, where ``budget`` is what the needles, question and headers
leave -- moved back to the start of its sentence when one begins within ``snap_tokens`` before it. Other needles
(``num_needles`` > 1) and distractors -- needles whose names are near-identical to the target's, with
other keys (RULER, Hsieh et al. 2024, arXiv 2404.06654) -- go at seeded random depths.
Haystack: the corpus (needle, after Kamradt 2023) or the repeated filler of the passkey test
(Mohtashami & Jaggi 2023, arXiv 2305.16300).
"""

from __future__ import annotations

import bisect
import random
from typing import TYPE_CHECKING
from dataclasses import dataclass, field

from ...core.errors import UserError

if TYPE_CHECKING:
    import torch

NAMES = (
    "apple",
    "river",
    "lantern",
    "falcon",
    "meadow",
    "copper",
    "violin",
    "harbor",
    "glacier",
    "orchid",
    "pepper",
    "saddle",
    "thistle",
    "quartz",
    "walnut",
    "ember",
)


class HaystackError(UserError):
    """A retrieval prompt that cannot be built (length, haystack, template)."""


@dataclass
class Prompt:
    length: int
    depth: float
    trial: int
    ids: torch.Tensor  # (length,) the whole prompt, ending with the answer prefix
    needle_position: int  # token index where the target needle starts
    keys: list[str]  # keys the model is asked for (one, or all with ask=all)
    answer_ids: torch.Tensor  # the expected continuation, for teacher-forced scoring
    all_keys: dict = field(default_factory=dict)  # name -> key for every needle and distractor


def distractor_names(name: str, count: int) -> list[str]:
    """Names a character away from ``name``: plural, a swapped pair, a changed letter..."""
    variants = [
        name + "s",
        name[0] + name[2] + name[1] + name[3:],
        name[:-1] + chr((ord(name[-1]) - 96) % 26 + 97),
        name.capitalize() + "e",
        name[:2] + name[3:],
        "the " + name,
    ]
    return [v for v in variants if v != name][:count]


class PromptBuilder:
    def __init__(self, cfg, tokenizer, haystack_ids: torch.Tensor):
        import torch

        self.cfg, self.tokenizer, self.haystack = cfg, tokenizer, haystack_ids
        self.encoded: dict[str, torch.Tensor] = {}  # text -> ids: every prompt asks the same question
        head, self.tail = self._chat_wrap()
        self.head = torch.cat([head, self.encode(cfg.preamble)]) if cfg.preamble else head
        window = self.haystack[: max(cfg.lengths)]
        # token i of the haystack starts a sentence when the token before it ends one
        ends = [
            t.rstrip().endswith((".", "!", "?", '."', "\n")) or "\n" in t
            for t in tokenizer.convert_ids_to_tokens(window.tolist())
        ]
        self.sentence_starts = [0] + [i + 1 for i, end in enumerate(ends) if end]

    def snap(self, position: int) -> int:
        """The nearest sentence start at or before ``position``, within ``snap_tokens`` (else ``position``)."""
        window = self.cfg.snap_tokens
        if window <= 0:
            return position
        # the starts are increasing: a bisection, not a scan of every sentence of the haystack per needle
        nearest = self.sentence_starts[bisect.bisect_right(self.sentence_starts, position) - 1]
        return nearest if nearest >= position - window else position

    def encode(self, text: str) -> torch.Tensor:
        import torch

        if text not in self.encoded:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            self.encoded[text] = torch.tensor(ids, dtype=torch.int64)
        return self.encoded[text]

    def _chat_wrap(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids before and after the user message when a chat template is used (else BOS / nothing)."""
        import torch

        tok = self.tokenizer
        if self.cfg.chat_template and getattr(tok, "chat_template", None):
            marker = "\u2063HAYSTACK\u2063"
            text = tok.apply_chat_template(
                [{"role": "user", "content": marker}], tokenize=False, add_generation_prompt=True
            )
            before, after = text.split(marker)
            return self.encode(before), self.encode(after)
        bos = (
            [tok.bos_token_id]
            if tok.bos_token_id is not None and tok("a")["input_ids"][:1] == [tok.bos_token_id]
            else []
        )
        return torch.tensor(bos, dtype=torch.int64), torch.tensor([], dtype=torch.int64)

    def _question(self, target: str | None) -> tuple[str, str]:
        """The question and the answer prefix, for the target needle or (ask=all) for every needle."""
        cfg = self.cfg
        if cfg.ask == "all":
            return cfg.question_all, cfg.answer_prefix_all
        for_name = f" for {target}" if target else ""
        return cfg.question.format(for_name=for_name), cfg.answer_prefix.format(for_name=for_name)

    def build(self, length: int, depth: float, trial: int) -> Prompt:
        import torch

        cfg = self.cfg
        rng = random.Random(f"{cfg.seed}-{length}-{depth}-{trial}")
        named = cfg.num_needles > 1 or cfg.distractors > 0
        names = rng.sample(NAMES, cfg.num_needles) if named else [None]
        target = names[0]
        distractors = distractor_names(target, cfg.distractors) if named else []

        def key() -> str:
            digits = rng.randint(cfg.key_digits[0], cfg.key_digits[1])
            return str(rng.randint(10 ** (digits - 1), 10**digits - 1))

        all_keys = {name: key() for name in [*names, *distractors]}
        # like the haystack's sentences, a needle opens with a space and ends without one (no double spaces)
        needles = [
            self.encode(" " + cfg.needle.format(for_name=f" for {n}" if n else "", key=k)) for n, k in all_keys.items()
        ]
        question, answer_prefix = self._question(target)
        question_ids = self.encode(question)
        answer_prefix_ids = self.encode(answer_prefix)
        overhead = (
            len(self.head) + sum(len(n) for n in needles) + len(question_ids) + len(self.tail) + len(answer_prefix_ids)
        )
        budget = length - overhead
        if budget < 1:
            raise HaystackError(f"length {length} is below what the needles and question need ({overhead} tokens)")
        if budget > len(self.haystack):
            raise HaystackError(
                f"the haystack has {len(self.haystack)} tokens, fewer than the {budget} that length "
                f"{length} needs; use longer data or shorter lengths"
            )
        # target at the requested depth; the rest at seeded random depths (in haystack tokens)
        positions = [self.snap(round(depth * budget))] + [self.snap(rng.randint(0, budget)) for _ in needles[1:]]
        order = sorted(range(len(needles)), key=lambda i: (positions[i], i))
        pieces, cursor, target_at = [self.head], 0, 0
        for i in order:
            pieces.append(self.haystack[cursor : positions[i]])
            if i == 0:
                target_at = sum(len(p) for p in pieces)
            pieces.append(needles[i])
            cursor = positions[i]
        pieces += [self.haystack[cursor:budget], question_ids, self.tail, answer_prefix_ids]
        ids = torch.cat(pieces)
        asked = [all_keys[n] for n in names] if cfg.ask == "all" else [all_keys[target]]
        answer = self.encode(" " + ", ".join(asked))
        return Prompt(length, depth, trial, ids, target_at, asked, answer, {str(k): v for k, v in all_keys.items()})


def haystack_ids(cfg, tokenizer, documents) -> torch.Tensor:
    """The corpus's first document (from ``haystack_offset``) or the filler repeated to the longest length."""
    import torch

    if cfg.haystack == "filler":
        unit = " " + cfg.filler.strip()
        repeats = max(cfg.lengths) // len(tokenizer(unit, add_special_tokens=False)["input_ids"]) + 2
        # one text, so units join as in running text: every sentence starts with a spaced token (" The")
        return torch.tensor(tokenizer(unit * repeats, add_special_tokens=False)["input_ids"], dtype=torch.int64)
    if not documents:
        raise HaystackError("no documents for the haystack; check data=")
    ids = documents[0].ids
    if tokenizer.bos_token_id is not None and len(ids) and int(ids[0]) == tokenizer.bos_token_id:
        ids = ids[1:]
    return ids[cfg.haystack_offset :]
