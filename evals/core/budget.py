"""What a sweep will cost, said before its first job: the forwards each job runs (eval by eval, at which lengths)
and, where earlier finished runs of the same model on this machine measured a forward at that length, the time.

A perplexity job (prefix protocol) runs one forward per document at its longest length (the shorter lengths are
its prefixes); a needle or passkey job one prompt per (length, depth, trial) -- an upper bound, prompts share
prefixes. Rates come from finished perplexity runs found under ``resume_from`` (seconds of compute per forward
at their longest length); a length never measured is said to be unknown, not guessed.
"""

from __future__ import annotations

import json
from pathlib import Path

from .config.lengths import parse_length


def _lengths(values, trained: int, target: int | None) -> list[int]:
    return sorted({parse_length(v, trained, "lengths", target) for v in values or []})


def forwards(eval_cfg, trained: int, target: int | None, documents: int) -> list[tuple[str, int, int]]:
    """(eval, length, forwards) of one job of ``eval_cfg`` (a single eval or a suite)."""
    parts = (
        [(name, eval_cfg[name]) for name in eval_cfg.run]
        if eval_cfg.get("name") == "suite"
        else [(eval_cfg.name, eval_cfg)]
    )
    found = []
    for name, part in parts:
        lengths = _lengths(part.get("lengths"), trained, target)
        if not lengths:
            continue
        if name == "perplexity" and part.get("protocol", "prefix") == "prefix":
            found.append((name, lengths[-1], int(part.get("documents") or documents)))
        elif name in ("passkey", "needle"):
            found += [(name, L, len(part.depths) * int(part.trials)) for L in lengths]
    return found


def measured_seconds(roots, model: str) -> dict[int, tuple[float, str]]:
    """{length: (seconds per forward, the run it was measured in)}: the fastest finished perplexity run of ``model``
    (prefix protocol) per longest length under ``roots``."""
    found: dict[int, tuple[float, str]] = {}
    for root in roots:
        for path in Path(root).glob("**/results.json") if Path(root).is_dir() else []:
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            job, timings, summary = data.get("job") or {}, data.get("timings") or {}, data.get("summary") or {}
            if (
                data.get("status") != "done"
                or job.get("model") != model
                or job.get("eval") != "perplexity"
                or data.get("resumed_from")
                or not timings.get("elapsed_s")
            ):
                continue
            tokens = {int(k.split("@")[1]): v for k, v in summary.items() if k.startswith("tokens@") and v}
            if not tokens:
                continue
            longest = max(tokens)
            documents = max(1, round(tokens[longest] / (longest - 1)))
            seconds = (timings["elapsed_s"] - (timings.get("model_load_s") or 0)) / documents
            if longest not in found or seconds < found[longest][0]:
                found[longest] = (seconds, str(path.parent))
    return found


def describe(jobs: int, work: list[tuple[str, int, int]], rates: dict[int, tuple[float, str]]) -> list[str]:
    """The lines a sweep prints before it starts."""
    each = "; ".join(f"{name} {n} forward{'s' if n > 1 else ''} at {L}" for name, L, n in work)
    lines = [f"budget: {jobs} job{'s' if jobs > 1 else ''} (+ the unscaled reference once), each: {each}"]
    known = [(n, rates[L][0]) for _, L, n in work if L in rates]
    unknown = sorted({L for _, L, _ in work if L not in rates})
    if known:
        per_job = sum(n * s for n, s in known)
        hours = per_job * (jobs + 1) / 3600
        source = ", ".join(
            f"{L} tokens: {rates[L][0]:.0f} s per forward ({rates[L][1]})"
            for L in sorted({L for _, L, _ in work if L in rates})
        )
        lines.append(
            f"budget: about {hours:.1f} h of compute at the rates measured here before ({source})"
            + (f"; lengths never measured here ({', '.join(map(str, unknown))}) not counted" if unknown else "")
            + "; attention-level methods cost more (docs/benchmarks.md, 'What each method costs')"
        )
    else:
        lines.append(
            "budget: no earlier run of this model on this machine measured these lengths: each job says its "
            "time after its first forward"
        )
    return lines
