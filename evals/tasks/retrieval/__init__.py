"""Needle-in-a-haystack (Kamradt 2023, github.com/gkamradt/LLMTest_NeedleInAHaystack) and passkey retrieval
(Mohtashami & Jaggi 2023, arXiv 2305.16300) over a grid of lengths x depths x trials; prompts in
evals/tasks/retrieval/haystack.py.

Scoring (both deterministic): greedy generation with a substring or exact match on the key, and
teacher forcing (one forward with the answer appended: is every answer token the argmax, and the
answer's log-probability).

Prefix sharing: prompts of one length share the haystack up to their first needle. Prompts are run
in order of that divergence point and the KV cache is cropped back to the common prefix of the
previous prompt (``DynamicCache.crop``) instead of recomputed. Dynamic strategies, whose
frequencies depend on the length of each forward, would see a different length per chunk: they
run every prompt on its own, and the results say so.

Batches (``eval.batch``; by default on CUDA, as many as half the free memory holds): prompts of one length, all
the same number of tokens, run as the rows of one forward without padding, the teacher-forced answers right-padded
(causal: a row's padding follows everything it is scored on); a batch that fails to allocate is halved. On a GPU a
small model's prompt is bound by the per-prompt work around the forward, which a batch pays once.

Also per length: the needle-driven NLL (LongRoPE2, Shang et al. 2025, arXiv 2502.20082): the mean NLL of the
answer tokens under teacher forcing, ``<task>_nll@L``. A failed allocation at a length is recorded as
out of memory for that length and the grid goes on.

The package: :mod:`.eval` (config, check, the grid, results, registration of both names), :mod:`.scorer` (prompts
through the model with prefix sharing), :mod:`.haystack` (the prompts).
"""

from __future__ import annotations

from .eval import RetrievalConfig, check_config, evaluate, prompt_key, report_figures
from .haystack import HaystackError

SCORER = ("PromptScorer", "common_prefix", "is_correct")  # .scorer imports torch and transformers: on first use


def __getattr__(name: str):
    if name in SCORER:
        from . import scorer

        return getattr(scorer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "HaystackError",
    "PromptScorer",
    "RetrievalConfig",
    "check_config",
    "common_prefix",
    "evaluate",
    "is_correct",
    "prompt_key",
    "report_figures",
]
