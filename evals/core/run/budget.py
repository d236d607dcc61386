"""What a sweep will cost, said before its first job: the forwards each job runs (eval by eval, at which lengths),
the unscaled reference's, and the time they and everything around them take.

A perplexity job (prefix protocol) runs one forward per document it scores at its longest length (the shorter
lengths are its prefixes; ``eval.documents``, at most what the data holds); a needle or passkey job one prompt per
(length, depth, trial) -- an upper bound, prompts share prefixes; the reference runs the lengths a verdict compares
with, unless the sweep's first job is the unscaled one. Seconds per forward come from the forwards that finished runs
of the model under ``resume_from`` or the sweep's directory timed (``timings.forwards``); a length never measured is
estimated from the model's FLOPs and the device's measured rate, plus perplexity's scoring over the vocabulary timed
now (:mod:`evals.core.run.throughput`), and said to be an estimate. The seconds outside the forwards (starting,
the model and tokenizer loaded, the data read, verdicts, results, the report) are those earlier runs measured, else
the ones measured on this project's CPU (:data:`SWEEP_S`; docs/benchmarks.md, "What a sweep's budget says"). Where
the count is unknown (a hub dataset, all of it) the budget says so instead of a time.

How many units decide (a preset's documents and prompts, ``conf/experiment/compare.yaml``): the power of the
verdict's interval at a given margin, simulated through :func:`evals.core.decision.paired.paired_ratio` itself (the t over
documents of Miller 2024, arXiv 2411.00640, for perplexity; Fieller on Agresti-Min-adjusted paired proportions for
accuracies), from the spreads measured on SmolLM2 (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import NamedTuple

from ..config.lengths import parse_length


def _lengths(values, trained: int, target: int | None) -> list[int]:
    return sorted({parse_length(v, trained, "lengths", target) for v in values or []})


def forwards(
    eval_cfg, trained: int, target: int | None, documents: int | None, reference: bool = False
) -> list[tuple[str, int, int | None]]:
    """(eval, length, forwards) of one job of ``eval_cfg`` (a single eval or a suite): perplexity (prefix protocol)
    one per document it scores (``eval.documents``, at most the ``documents`` the data holds:
    :func:`evals.core.inputs.data.document_count`; None when neither says), a needle or passkey job one prompt per
    (length, depth, trial). ``reference``: those of the unscaled reference job a verdict on them runs, at the
    lengths :func:`evals.core.job.lengths.reference_lengths_for` picks."""
    from ..job.lengths import reference_lengths_for

    parts = (
        [(name, eval_cfg[name]) for name in eval_cfg.run]
        if eval_cfg.get("name") == "suite"
        else [(eval_cfg.name, eval_cfg)]
    )
    found = []
    for name, part in parts:
        lengths = _lengths(part.get("lengths"), trained, target)
        lengths = reference_lengths_for(lengths, trained) if reference else lengths
        if not lengths:
            continue
        if name == "perplexity" and part.get("protocol", "prefix") == "prefix":
            wanted = part.get("documents")
            n = min(int(wanted), documents) if wanted and documents is not None else wanted or documents
            found.append((name, lengths[-1], None if n is None else int(n)))
        elif name in ("passkey", "needle"):
            found += [(name, L, len(part.depths) * int(part.trials)) for L in lengths]
    return found


def _finished(roots, model: str):
    """(results.json path, its data) of every finished, not resumed run of ``model`` under ``roots``."""
    for root in roots:
        for path in Path(root).glob("**/results.json") if Path(root).is_dir() else []:
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            job, timings = data.get("job") or {}, data.get("timings") or {}
            if data.get("status") == "done" and job.get("model") == model and not data.get("resumed_from"):
                if timings.get("elapsed_s"):
                    yield path, data


def measured_seconds(roots, model: str) -> dict[int, tuple[float, str]]:
    """{length: (seconds per forward, the run it was measured in)}: the fastest forward over a whole sequence
    (perplexity's, a prompt's prefill) that finished runs of ``model`` under ``roots`` timed at that length
    (``timings.forwards``); a perplexity run without them: its compute over its documents at its longest length."""
    found: dict[int, tuple[float, str]] = {}

    def keep(length, seconds, path):
        if length not in found or seconds < found[length][0]:
            found[length] = (seconds, str(path.parent))

    for path, data in _finished(roots, model):
        timings, summary = data["timings"], data.get("summary") or {}
        timed = [f for f in timings.get("forwards") or [] if f[0] == f[1] and f[3]]
        for length, _, seconds, count in timed:
            keep(int(length), seconds / count, path)
        tokens = {int(k.split("@")[1]): v for k, v in summary.items() if k.startswith("tokens@") and v}
        if timed or not tokens or (data.get("job") or {}).get("eval") != "perplexity":
            continue
        longest = max(tokens)
        documents = max(1, round(tokens[longest] / (longest - 1)))
        keep(longest, (timings["elapsed_s"] - (timings.get("model_load_s") or 0)) / documents, path)
    return found


def measured_overhead(roots, model: str):
    """The seconds outside the forwards, from finished runs of ``model`` under ``roots`` with timed forwards: an
    :class:`Overhead` (a job's median, the slowest model load for the first) or None when no run timed its forwards.
    The sweep's own start and report are not in any results.json: :data:`SWEEP_S`."""
    jobs, loads = [], []
    for _, data in _finished(roots, model):
        timings = data["timings"]
        if timings.get("forwards"):
            load = timings.get("model_load_s") or 0
            loads.append(load)
            jobs.append(max(0.0, timings["elapsed_s"] - load - sum(f[2] for f in timings["forwards"])))
    if not jobs:
        return None
    job = sorted(jobs)[len(jobs) // 2]
    how = f"measured by {len(jobs)} finished run{'s' if len(jobs) > 1 else ''} here, + {SWEEP_S:.0f} s to start and report"
    return Overhead(SWEEP_S, max(loads), job, 0.0, how)


# The seconds outside the forwards where no earlier run measured them, as measured on this project's 2-core CPU
# (docs/benchmarks.md, "What a sweep's budget says"): the sweep's start (imports, Hydra, this preflight) and its
# closing report; the first job's imports of the eval stack and tokenizer load; every job's data reading,
# patching, verdict and writing of results.
SWEEP_S, FIRST_JOB_S, JOB_S = 15.0, 11.0, 5.0


class Overhead(NamedTuple):
    """What a sweep spends outside the FLOPs: ``sweep_s`` once, ``first_s`` in its first job (the model and
    tokenizer loaded), ``job_s`` in every job, ``per_token_s`` per token a perplexity forward scores (the LM head's
    logits and cross-entropy, memory-bound), and where these numbers come from."""

    sweep_s: float
    first_s: float
    job_s: float
    per_token_s: float
    how: str


def describe(
    jobs: int,
    work: list[tuple[str, int, int | None]],
    rates: dict[int, tuple[float, str]],
    estimated: tuple[dict[int, float], str] | None = None,
    overhead: Overhead | None = None,
    reference: list[tuple[str, int, int | None]] | None = None,
) -> list[str]:
    """The lines a sweep prints before it starts. ``estimated``: ({length: seconds per forward}, how), the FLOP
    estimate of :func:`evals.core.run.throughput.estimate` for the lengths no earlier run measured; ``overhead``:
    the seconds outside the forwards (None: the forwards alone are counted); ``reference``: the forwards of the
    unscaled reference job (:func:`forwards`), [] when the sweep's first job is it; None: ``work`` again, an upper
    bound."""
    from .throughput import duration

    each = "; ".join(f"{name} {_count(n)} forward{'s' if n != 1 else ''} at {L}" for name, L, n in work)
    reference = work if reference is None else reference
    runs = jobs + (1 if reference else 0)
    unknown_count = [name for name, _, n in work + reference if n is None]
    total = "an unknown number of" if unknown_count else sum(n for _, _, n in [*work * jobs, *reference])
    lines = [
        f"budget: {jobs} job{'s' if jobs > 1 else ''}{' (+ the unscaled reference once)' if reference else ''}, "
        f"each: {each}; at most {total} forwards in all"
    ]
    if unknown_count:
        return [
            *lines,
            "budget: no time said: how many documents the data holds shows only once it is streamed (a hub "
            "dataset): eval.documents=N counts them; each job says its time after its first forward",
        ]
    everything = [*work * jobs, *reference]
    unknown = sorted({L for _, L, _ in everything if L not in rates})
    guess, how = estimated or ({}, "")
    scoring = overhead.per_token_s if overhead else 0.0

    def seconds(name, L):
        return guess[L] + (scoring * L if name == "perplexity" else 0.0)

    guessed = sum(n * seconds(name, L) for name, L, n in everything if L not in rates and L in guess)
    known = [(n, rates[L][0]) for _, L, n in everything if L in rates]
    computed = sum(n * s for n, s in known) + guessed
    extra = (overhead.sweep_s + overhead.first_s + runs * overhead.job_s) if overhead else 0.0
    besides = (
        f"; {duration(extra)} of it outside the forwards (loading, tokenizing, verdicts, results; {overhead.how})"
        if overhead
        else ""
    )
    scored = f", the scoring at {scoring * 1e6:.0f} µs per token timed now" if scoring else ""
    costlier = "; attention-level methods cost more (docs/benchmarks.md, 'What each method costs')"
    if known:
        source = ", ".join(
            f"{L} tokens: {rates[L][0]:.3g} s per forward ({rates[L][1]})"
            for L in sorted({L for _, L, _ in everything if L in rates})
        )
        never = (
            f"; lengths never measured here ({', '.join(map(str, unknown))}) "
            + (how + scored if guessed else "not counted")
            if unknown
            else ""
        )
        said = f"about {duration(computed + extra)} in all" if overhead else f"about {computed / 3600:.1f} h of compute"
        lines.append(f"budget: {said} at the rates measured here before ({source}){never}{besides}{costlier}")
    elif guessed:
        said = f"{duration(guessed + extra)} in all" if overhead else f"{duration(guessed)} of compute"
        lines.append(
            f"budget: ≈ {said}, {how}{scored}{besides}: no earlier run of this model here measured these lengths, "
            f"finished runs refine it{costlier}"
        )
    else:
        lines.append(
            "budget: no earlier run of this model on this machine measured these lengths: each job says its "
            "time after its first forward"
        )
    return lines


def sweep_budget(config, model, target: int | None, jobs: int) -> tuple[list[str], list]:
    """(the lines :func:`describe` says, the work of one job) for a sweep of ``jobs`` whose first job's config is
    ``config`` (with Hydra's), ``model`` resolved without weights: the documents the data holds counted, the
    reference counted unless the sweep's first job is the unscaled one, the seconds outside the forwards measured
    by earlier runs here (else :data:`SWEEP_S`, :data:`FIRST_JOB_S`, :data:`JOB_S`), the rest estimated from FLOPs
    and a timed scoring (:mod:`evals.core.run.throughput`)."""
    from ..inputs.data import document_count
    from .throughput import estimate, scoring_seconds

    trained, documents = model.trained_context, document_count(config.data)
    work = forwards(config.eval, trained, target, documents)
    if not work:
        return [], []
    roots = [*config.get("resume_from", []), config.hydra.sweep.dir]
    rates = measured_seconds(roots, model.name)
    overhead = measured_overhead(roots, model.name) or Overhead(
        SWEEP_S, FIRST_JOB_S, JOB_S, 0.0, "as measured on this project's 2-core CPU, docs/benchmarks.md"
    )
    unscaled_first = _first_scaling(config) == "none"
    reference = [] if unscaled_first else forwards(config.eval, trained, target, documents, reference=True)
    missing = sorted({L for _, L, _ in work + reference if L not in rates})
    if any(name == "perplexity" and L in missing for name, L, _ in work + reference):
        overhead = overhead._replace(per_token_s=scoring_seconds(config.model, model.config))
    estimated = estimate(config.model, model.config, missing) if missing else None
    return describe(jobs, work, rates, estimated, overhead, reference), work


def _first_scaling(config) -> str | None:
    """The scaling of the sweep's first job: the command line's (composed into ``config``) unless only the
    sweeper's ``params`` sweep it (``experiment=compare``), whose first value Hydra launches first."""
    given = {line.split("=", 1)[0].lstrip("+~") for line in config.hydra.overrides.task}
    swept = (config.hydra.sweeper.get("params") or {}).get("scaling")
    if swept is not None and "scaling" not in given:
        return str(swept).split(",")[0].strip()
    return (config.get("scaling") or {}).get("name")


def _count(n: int | None) -> str:
    return "?" if n is None else str(n)


# ---- how many units decide: the power of the verdict's interval (issue #44, "presets that can decide") --------------
#
# The question a preset's defaults answer: with how many documents (prompts) does a strategy that truly sits a given
# margin inside the limit come out *yes* (the whole 95% interval within the limit) with probability >= POWER? Each
# power is simulated through the verdict's own interval, evals.core.decision.paired.paired_ratio, so the numbers follow its
# method: a change of interval (another helper is moving the proportions to Tang's score interval) changes them, and
# tests/test_power.py, which recomputes the preset's numbers, fails until the preset is updated.

POWER = 0.8  # the chance to decide a strategy that truly passes
PPL_RATIO, PPL_LIMIT = 1.067, 1.1  # perplexity x1.067 against the default limit 1 + verdict.tolerance: 3% inside it
ACC_RETAINED, ACC_LIMIT = 0.95, 0.85  # 95% of the unscaled accuracy kept, against verdict.retained = 0.85
# The between-document spread (sd) of the per-document log ratio strategy at 16384 / unscaled at 8192 on SmolLM2,
# from the t intervals over the six novels in docs/benchmarks.md, "What the answer rests on: paired verdicts at 2x on
# SmolLM2 (issue #34)", table "Perplexity on the first 16,384 tokens of all six novels": each interval is
# exp(mean +/- t_{0.975,5} sd / sqrt(6)), so sd = (log high - log low) / 2 * sqrt(6) / t_{0.975,5}. The strategies
# that pass (the unscaled model's own failure spreads twice as wide and is not the question):
SIX_NOVEL_INTERVALS = {
    "dca": (0.981, 1.054),
    "lm_infinite": (0.972, 1.051),
    "self_extend": (0.988, 1.055),
    "yarn": (1.005, 1.073),
}
PASSKEY_REFERENCE = 0.75  # the unscaled SmolLM2 at 8192: 15/20 prompts (the same section, "Passkey at 8192 and 16384")
PPL_METRIC = {"name": "ppl", "lower_is_better": True, "verdict": True, "nll": True}
ACC_METRIC = {"name": "passkey_acc", "lower_is_better": False, "verdict": True, "bounds": [0, 1]}


def document_sd(intervals: dict = SIX_NOVEL_INTERVALS, documents: int = 6) -> float:
    """The pooled between-document sd of the per-document log ratio, backed out of t intervals over ``documents``."""
    from scipy import stats

    t = stats.t.ppf(0.975, documents - 1)
    sds = [(math.log(high) - math.log(low)) / 2 * math.sqrt(documents) / t for low, high in intervals.values()]
    return math.sqrt(sum(s * s for s in sds) / len(sds))  # pooled: the root mean square


def _yes(metric: dict, own: dict, ref: dict, limit: float) -> bool:
    from ..decision.paired import paired_ratio

    found = paired_ratio(metric, {"value": 1.0, "units": own}, {"value": 1.0, "units": ref})
    if found["low"] is None:
        return False
    return found["high"] <= limit if metric["lower_is_better"] else found["low"] >= limit


def ppl_power(documents: int, sd: float, ratio: float = PPL_RATIO, limit: float = PPL_LIMIT, trials=2000, seed=0):
    """The chance that a strategy whose per-document log ratio is normal around log ``ratio`` with sd ``sd`` comes
    out yes on ``documents`` documents (one unit per document: the verdict's t over documents)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ref = {f"doc{j}/0": (3.0, 1.0) for j in range(documents)}  # a mean NLL of 3 nats: only the difference matters
    hits = 0
    for _ in range(trials):
        d = rng.normal(math.log(ratio), sd, documents)
        hits += _yes(PPL_METRIC, {f"doc{j}/0": (3.0 + d[j], 1.0) for j in range(documents)}, ref, limit)
    return hits / trials


def passkey_power(
    prompts: int,
    reference: float = PASSKEY_REFERENCE,
    retained: float = ACC_RETAINED,
    limit: float = ACC_LIMIT,
    keeps: bool = True,
    trials=2000,
    seed=0,
):
    """The chance that a strategy retaining ``retained`` of the unscaled accuracy ``reference`` comes out yes on
    ``prompts`` paired prompts. ``keeps``: it finds a key where the unscaled model does, with probability
    ``retained``, and never where it misses (what "retained" means prompt by prompt: the pairing helps most);
    otherwise its hits are independent of the reference's (no help from the pairing: the pessimistic case)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(trials):
        ref = rng.random(prompts) < reference
        own = (ref & (rng.random(prompts) < retained)) if keeps else rng.random(prompts) < reference * retained
        units = lambda x: {f"p{i}": (float(v), 1.0) for i, v in enumerate(x)}  # noqa: E731
        hits += _yes(ACC_METRIC, units(own), units(ref), limit)
    return hits / trials


def units_to_decide(power, start: int = 2, stop: int = 400, step: int = 1, **kw) -> tuple[int | None, float]:
    """The fewest units (from ``start`` by ``step``) whose ``power(n, **kw)`` reaches POWER, with that power; (None,
    the last power) when ``stop`` units do not."""
    n, found = start, 0.0
    while n <= stop:
        found = power(n, **kw)
        if found >= POWER:
            return n, found
        n += step
    return None, found
