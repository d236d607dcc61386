"""``eval=needle`` and ``eval=passkey``: their config and check, the lengths x depths x trials grid run through
:class:`~evals.tasks.retrieval.scorer.PromptScorer` (out of memory at a length recorded, the grid goes on), the per-cell
and per-length results with their Wilson intervals and the units the verdict pairs (prompts), the metrics they
declare and their section of the report (see :mod:`evals.tasks.retrieval`)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, fields
from typing import Any, List

from ...core.config.lengths import lengths as context_lengths
from ...core.config.fields import option
from ...core.plots import heatmap, heatmaps
from ...core.progress import progress
from ...core.measure import Measurement
from ...core.registry import Metric, register_eval
from .haystack import HaystackError, PromptBuilder, haystack_ids
from ...core.stats import wilson_interval
from ...core.run.peak import available_bytes
from ...core.scoring.cost import estimate_forward_bytes, warn_if_too_large
from ...core.scoring.oom import free_memory, is_out_of_memory


log = logging.getLogger("evals.tasks.retrieval")


@dataclass
class RetrievalConfig:
    """Needle-in-a-haystack (haystack: corpus) and passkey (haystack: filler)."""

    name: str = "needle"
    haystack: str = option("corpus", choices=("corpus", "filler"))  # corpus (data=...) | filler
    filler: str = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
    haystack_offset: int = option(0, minimum=0)  # corpus: start this many tokens into the first document
    preamble: str = (
        "Some special magic numbers are hidden within the following text. Make sure to memorize it. "
        "I will quiz you about the numbers afterwards.\n"
    )
    snap_tokens: int = option(32, minimum=0)  # move a needle back to a sentence start at most this far (0: exact)
    lengths: List[Any] = context_lengths(
        [1024, 4096, 8192]
    )  # total prompt tokens, or multiples of the trained context (2x)
    depths: List[float] = option(
        [0.1, 0.5, 0.9], minimum=0, maximum=1, nonempty=True
    )  # needle position in the haystack
    trials: int = option(2, minimum=1)  # per cell, each with its own random key(s)
    seed: int = 0
    key_digits: List[int] = option([5, 7], minimum=1, maximum=18)  # [min, max] digits of a key
    needle: str = "The special magic number{for_name} is {key}."
    # question and answer prefix carry their own leading separators (RULER's niah wording)
    question: str = "\nWhat is the special magic number{for_name} mentioned in the provided text?"
    answer_prefix: str = " The special magic number{for_name} mentioned in the provided text is"
    question_all: str = "\nWhat are all the special magic numbers mentioned in the provided text?"
    answer_prefix_all: str = " The special magic numbers mentioned in the provided text are"
    num_needles: int = option(1, minimum=1, maximum=16)  # > 1: named needles, each with its own key
    distractors: int = option(0, minimum=0, maximum=6)  # needles with near-identical names and other keys (RULER)
    ask: str = option("one", choices=("one", "all"))  # one (the target) | all (every needle's key)
    scoring: str = option("both", choices=("generate", "teacher_forced", "both"))
    match: str = option("substring", choices=("substring", "exact"))  # exact: the key as a whole number
    max_new_tokens: int = option(12, minimum=1)
    chat_template: bool = False  # wrap in the tokenizer's chat template when it has one
    prefix_sharing: bool = option(True, compare=False)  # reuse the KV cache of the shared haystack prefix
    prefill_chunk: int = option(1024, minimum=1, compare=False)  # tokens per forward when extending a cached prefix
    # prompts of one length per forward, without prefix sharing; 0: CUDA as many as half the free memory holds, else 1
    batch: int = option(0, minimum=0, compare=False)
    threshold: float = option(0.9, minimum=0, maximum=1, compare=False)  # the largest length with accuracy >= threshold


def check_config(cfg, job=None) -> None:
    import torch

    if len(cfg.key_digits) != 2 or cfg.key_digits[0] > cfg.key_digits[1]:
        raise HaystackError(f"eval.key_digits={list(cfg.key_digits)} must be [min, max] digits")
    for field_name in ("needle", "question", "answer_prefix"):
        template = cfg[field_name]
        try:
            template.format(for_name="", key="1")
        except (KeyError, IndexError, ValueError) as err:
            raise HaystackError(
                f"eval.{field_name}={template!r} has a placeholder other than {{for_name}} and {{key}}: {err}"
            ) from None
    if "{key}" not in cfg.needle:
        raise HaystackError(f"eval.needle={cfg.needle!r} must contain {{key}}")
    if job is not None:
        # every prompt of the shortest length fits its needles and question: said now, not after a reference ran
        from ...core.inputs.model_cache import MODEL_CACHE

        shortest = min(int(L) for L in cfg.lengths)
        builder = PromptBuilder(cfg, MODEL_CACHE.tokenizer(job.model), torch.zeros(shortest + 1, dtype=torch.long))
        for depth in cfg.depths:
            for trial in range(cfg.trials):
                builder.build(shortest, depth, trial)


def _needs(cfg) -> tuple[str, ...]:
    return ("model", "data") if cfg.haystack == "corpus" else ("model",)


def _score(cfg, scorer, tokenizer, prompts: list) -> list[dict]:
    """The records of ``prompts`` (of one length): one alone through the shared prefix, several as the rows of one
    batch (:meth:`~evals.tasks.retrieval.scorer.PromptScorer.score_rows`)."""
    from .scorer import is_correct

    generate, forced = cfg.scoring in ("generate", "both"), cfg.scoring in ("teacher_forced", "both")
    if len(prompts) > 1:
        ids, answers = [p.ids for p in prompts], [p.answer_ids for p in prompts]
        generated, scored = scorer.score_rows(ids, answers, generate, forced)
    else:
        generated = [scorer.generate(prompts[0].ids)] if generate else None
        scored = [scorer.teacher_forced(prompts[0].ids, prompts[0].answer_ids)] if forced else None
    records = []
    for row, prompt in enumerate(prompts):
        record = {
            "length": prompt.length,
            "depth": prompt.depth,
            "trial": prompt.trial,
            "prompt_tokens": len(prompt.ids),
            "needle_position": prompt.needle_position,
            "keys": prompt.keys,
            "all_keys": prompt.all_keys,
        }
        if generate:
            record["answer"] = tokenizer.decode(generated[row], skip_special_tokens=True)
            record["correct"] = is_correct(record["answer"], prompt.keys, cfg.match)
        if forced:
            record["tf_correct"], record["tf_logprob"] = scored[row]
            record["tf_tokens"] = len(prompt.answer_ids)
        records.append(record)
    return records


def _plain(cfg) -> RetrievalConfig:
    """The eval's config as a plain :class:`RetrievalConfig`: read per prompt and per needle, and an OmegaConf
    node's attribute read costs tens of microseconds (bench/retrieval_overhead.py)."""
    from omegaconf import OmegaConf

    if not OmegaConf.is_config(cfg):
        return cfg
    values = OmegaConf.to_container(cfg, resolve=True)
    return RetrievalConfig(**{f.name: values[f.name] for f in fields(RetrievalConfig) if f.name in values})


def evaluate(cfg, ctx) -> dict:
    """The lengths x depths x trials grid: greedy and/or teacher-forced retrieval of hidden keys."""
    from .scorer import PromptScorer

    cfg = _plain(cfg)
    tokenizer = ctx.tokenizer()
    documents = ctx.documents(count=1) if cfg.haystack == "corpus" else []  # the haystack is the first document
    builder = PromptBuilder(cfg, tokenizer, haystack_ids(cfg, tokenizer, documents))
    prompts = [builder.build(L, d, t) for L in sorted(cfg.lengths) for d in cfg.depths for t in range(cfg.trials)]
    dynamic = ctx.scaling.dynamic
    share = cfg.prefix_sharing and not dynamic
    if cfg.prefix_sharing and dynamic:
        log.warning(
            "prefix sharing is off: dynamic scaling '%s' gives every forward its own frequencies", ctx.scaling.label
        )
    # within a length, run prompts in order of where they leave the plain haystack
    prompts.sort(key=lambda p: (p.length, p.needle_position, p.depth, p.trial))
    scorer = PromptScorer(ctx.model(), share, cfg.max_new_tokens, tokenizer.eos_token_id, cfg.prefill_chunk)
    sizes = {L: _batch_size(cfg, scorer, L, sum(p.length == L for p in prompts)) for L in sorted(set(cfg.lengths))}
    for L in sorted(set(cfg.lengths)):
        warn_if_too_large(scorer.model, L, cfg.name, cfg.prefill_chunk if share and sizes[L] == 1 else None)
    kept = _kept(ctx.output.previous(f"{cfg.name}_trials"), prompts)
    if kept:
        print(f"{cfg.name}: {len(kept)} of {len(prompts)} prompts kept from the interrupted run; running the rest")
    started, records, oom, used = time.perf_counter(), [], set(), {}
    with ctx.output.records(f"{cfg.name}_trials") as write:
        for L in sorted(set(cfg.lengths)):
            at = [p for p in prompts if p.length == L]
            for prompt in at:
                if (L, prompt.depth, prompt.trial) in kept:
                    records.append(kept[L, prompt.depth, prompt.trial])
                    write(records[-1])
            todo = [p for p in at if (L, p.depth, p.trial) not in kept]
            if not todo:
                continue
            size = min(sizes[L], len(todo))
            mode = f"batches of {size}" if size > 1 else "shared prefix" if share else "cell by cell"
            # before a length runs: what it will cost (sharing prefixes: an upper bound)
            said = "at most, sharing prefixes" if mode == "shared prefix" else mode
            scorer.cost.announce(f"{cfg.name} ({said})", L, forwards=len(todo))
            pending = []
            for prompt in progress(todo, f"{cfg.name} ({mode})", "prompt"):
                pending.append(prompt)
                if len(pending) < size and prompt is not todo[-1]:
                    continue
                try:
                    scored, size = _score_fitting(cfg, scorer, tokenizer, pending, size)
                except Exception as err:
                    if not is_out_of_memory(err):
                        raise
                    log.warning("out of memory at length %d; recorded, going on with the other lengths", L)
                    oom.add(L)
                    scorer.reset()
                    free_memory()
                    break
                pending, used[L] = [], max(used.get(L, 1), size)
                for record in scored:
                    records.append(record)
                    write(record)
    batch = max(used.values(), default=1)
    seconds = time.perf_counter() - started
    return _summarise(cfg, ctx, records, share and batch == 1, batch, seconds, scorer.computed, oom)


def _batch_size(cfg, scorer, length: int, count: int) -> int:
    """Prompts of ``length`` scored together: ``eval.batch`` when set; else on CUDA as many of the ``count`` as half
    the free memory holds by the forward's estimate (a failed allocation halves it), elsewhere 1 (on a CPU the
    forward is compute-bound and prefix sharing, which batching gives up, saves more)."""
    if cfg.batch:
        return min(cfg.batch, count)
    if scorer.device.type != "cuda":
        return 1
    have = available_bytes(scorer.device) or 0
    return max(1, min(count, int(0.5 * have) // max(1, estimate_forward_bytes(scorer.model, length, length))))


def _score_fitting(cfg, scorer, tokenizer, prompts: list, size: int) -> tuple[list[dict], int]:
    """The records of ``prompts``, scored ``size`` at a time (one alone: with prefix sharing); a batch that does
    not fit is halved and tried again. The size that fitted is returned; a prompt alone that does not fit raises."""
    records = []
    while prompts:
        rows = prompts[:size]
        try:
            records += _score(cfg, scorer, tokenizer, rows)
        except Exception as err:
            if len(rows) == 1 or not is_out_of_memory(err):
                raise
            scorer.reset()
            free_memory()
            size = len(rows) // 2
            log.warning(
                "out of memory at length %d in a batch of %d prompts; trying %d", rows[0].length, len(rows), size
            )
            continue
        prompts = prompts[len(rows) :]
    return records, size


def _kept(previous: list[dict], prompts: list) -> dict:
    """The records an interrupted run of this same job wrote (:meth:`Output.previous`), by (length, depth, trial),
    each kept only where the prompt built now is the one it scored (same tokens count, needle position and keys)."""
    built = {(p.length, p.depth, p.trial): p for p in prompts}
    kept = {}
    for record in previous:
        prompt = built.get((record.get("length"), record.get("depth"), record.get("trial")))
        if prompt is not None and (record.get("prompt_tokens"), record.get("needle_position"), record.get("keys")) == (
            len(prompt.ids),
            prompt.needle_position,
            prompt.keys,
        ):
            kept[prompt.length, prompt.depth, prompt.trial] = record
    return kept


def _summarise(cfg, ctx, records, share, batch, seconds, computed, oom) -> dict:
    score_key = "correct" if cfg.scoring in ("generate", "both") else "tf_correct"
    lengths = sorted(cfg.lengths)
    cells = []
    for L in lengths:
        for d in cfg.depths:
            cell = [r for r in records if r["length"] == L and r["depth"] == d]
            row = {
                "length": L,
                "depth": d,
                "trials": len(cell),
                "oom": L in oom,
                "accuracy": sum(float(r[score_key]) for r in cell) / len(cell) if cell else None,
            }
            if cell and "tf_logprob" in cell[0]:
                row["tf_accuracy"] = sum(r["tf_correct"] for r in cell) / len(cell)
                row["tf_mean_logprob"] = sum(r["tf_logprob"] for r in cell) / len(cell)
            cells.append(row)
    ctx.output.table(f"{cfg.name}_cells", cells)
    by_length, curve = {}, []
    for L in lengths:
        trials = [float(r[score_key]) for r in records if r["length"] == L]
        by_length[L] = sum(trials) / len(trials) if trials and L not in oom else None
        interval = wilson_interval(sum(trials), len(trials)) if by_length[L] is not None else None
        scored = [r for r in records if r["length"] == L and "tf_logprob" in r]
        nll = -sum(r["tf_logprob"] for r in scored) / sum(r["tf_tokens"] for r in scored) if scored else None
        curve.append(
            {
                "length": L,
                "accuracy": by_length[L],
                "trials": len(trials),
                "answer_nll": nll,
                "oom": L in oom,
                "ci95_low": interval and interval[0],
                "ci95_high": interval and interval[1],
            }
        )
        # the units the verdict pairs: prompts, keyed by depth and trial (the same prompts in every run of the seed)
        at = [r for r in records if r["length"] == L]
        note = "out of memory" if L in oom else None
        ctx.output.measure(
            Measurement(
                f"{cfg.name}_acc",
                L,
                by_length[L],
                len(trials),
                "prompt",
                {prompt_key(r): (float(r[score_key]), 1.0) for r in at},
                interval and interval[0],
                interval and interval[1],
                "Wilson",
                note,
            )
        )
        if cfg.scoring in ("teacher_forced", "both"):
            ctx.output.measure(
                Measurement(
                    f"{cfg.name}_nll",
                    L,
                    nll,
                    len(scored),
                    "prompt",
                    {prompt_key(r): (-r["tf_logprob"], float(r["tf_tokens"])) for r in scored},
                    note=note,
                )
            )
    passing = [L for L, acc in by_length.items() if acc is not None and acc >= cfg.threshold]
    summary = ctx.output.flat()  # accuracy, answer NLL, trials and intervals by length: the measurements above
    measured = [a for a in by_length.values() if a is not None]
    summary[f"{cfg.name}_mean_acc"] = sum(measured) / len(measured) if measured else None
    summary[f"{cfg.name}_max_length_at_threshold"] = max(passing) if passing else None
    summary[f"{cfg.name}_prefix_sharing"] = share
    summary[f"{cfg.name}_batch"] = batch  # the most prompts of one length scored in one forward
    summary[f"{cfg.name}_seconds"] = round(seconds, 2)
    summary[f"{cfg.name}_tokens_computed"] = computed
    grid = [
        [next(c["accuracy"] for c in cells if c["length"] == L and c["depth"] == d) for L in lengths]
        for d in cfg.depths
    ]
    grid = [[float("nan") if v is None else v for v in row] for row in grid]
    ctx.output.figure(
        f"{cfg.name}_heatmap",
        heatmap(grid, lengths, list(cfg.depths), title=f"{cfg.name}: {ctx.title}", trained=ctx.trained_context),
    )
    ctx.output.curve(cfg.name, [row for row in curve if row["accuracy"] is not None])
    ctx.output.metrics(cfg.name, {**summary, "cells": cells, "by_length": curve})
    return summary


def prompt_key(record: dict) -> str:
    """A prompt as a unit: its depth and trial (its key digits and haystack follow from the seed, in every run)."""
    return f"d{record['depth']:g}-t{record['trial']}"


def _metrics(cfg) -> tuple[Metric, ...]:
    """Accuracy (judged) and the answer NLL under teacher forcing (shown beside it: the continuous, paired look)."""
    found = (
        Metric(
            f"{cfg.name}_acc",
            verdict=True,
            count=f"{cfg.name}_trials",
            interval=True,
            label=f"{cfg.name} accuracy",
            bounds=(0, 1),
            unit="prompt",
        ),
    )
    if cfg.scoring in ("teacher_forced", "both"):
        found += (
            Metric(
                f"{cfg.name}_nll",
                lower_is_better=True,
                count=f"{cfg.name}_trials",
                label=f"{cfg.name} answer NLL",
                nll=True,
                unit="prompt",
            ),
        )
    return found


def report_figures(name: str, jobs: list[dict], label) -> dict:
    """The report's section: the ``name`` heatmaps of every run side by side on one colour scale, with the
    trials behind each cell."""
    panels, trials = [], set()
    for job in jobs:
        cells = ((job.get("metrics") or {}).get(name) or {}).get("cells")
        if not cells:
            continue
        lengths, depths = sorted({c["length"] for c in cells}), sorted({c["depth"] for c in cells})
        value = {(c["length"], c["depth"]): c["accuracy"] for c in cells}
        trials |= {c.get("trials") for c in cells if c.get("trials")}
        grid = [[float("nan") if value.get((L, d)) is None else value[(L, d)] for L in lengths] for d in depths]
        panels.append((label(job), grid, lengths, depths, (job.get("job") or {}).get("trained_context")))
    return {f"{name}_heatmaps": heatmaps(panels, trials=trials.pop() if len(trials) == 1 else None)} if panels else {}


for _name in ("needle", "passkey"):
    register_eval(
        _name,
        config=RetrievalConfig,
        error=HaystackError,
        check=check_config,
        needs=_needs,
        metrics=_metrics,
        report=report_figures,
    )(evaluate)
