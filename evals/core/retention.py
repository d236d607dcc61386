"""Short-context retention (LongRoPE2, Shang et al. 2025, arXiv 2502.20082): a scaled model's metrics at
lengths up to its trained context relative to the same model unscaled, 1 = nothing lost.

Lower-is-better metrics (perplexity, LongPPL, answer NLL) give ``reference / value``; accuracies and scores
``value / reference``. The sweep report compares each strategy with the sweep's unscaled job; a job run
with ``eval.baseline=true`` compares itself with its own unscaled reference run.
"""

from __future__ import annotations


LOWER_IS_BETTER = ("ppl", "longppl")  # and every <task>_nll
HIGHER_IS_BETTER = ("ruler",)  # and every <task>_acc


def direction(metric: str) -> int:
    """-1: lower is better, +1: higher is better, 0: not a quality metric (token counts, intervals)."""
    if metric in LOWER_IS_BETTER or metric.endswith("_nll"):
        return -1
    if metric in HIGHER_IS_BETTER or metric.endswith("_acc"):
        return 1
    return 0


def retention_of(values: dict, reference: dict, trained: int | None) -> dict:
    """``{<metric>_retention@L: ratio}`` for every ``<metric>@L`` (L <= ``trained``) measured in both."""
    found = {}
    for key, value in values.items():
        metric, _, length = key.partition("@")
        if not length.isdigit() or not direction(metric) or (trained and int(length) > trained):
            continue
        base = reference.get(key)
        if not isinstance(value, (int, float)) or not isinstance(base, (int, float)) or isinstance(value, bool):
            continue
        numerator, denominator = (base, value) if direction(metric) < 0 else (value, base)
        if denominator:  # an unscaled accuracy of 0 leaves nothing to retain
            found[f"{metric}_retention@{length}"] = numerator / denominator
    return found
