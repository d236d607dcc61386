"""``eval=ruler``: RULER (Hsieh et al. 2024, arXiv 2404.06654) offline, on the loaded, patched model.

The 11 synthetic tasks (niah_single_1..3, niah_multikey_1..3, niah_multivalue, niah_multiquery, vt, cwe, fwe)
are lm-eval's own RULER generators and scoring, run through our lm-eval path (``run_simple_evaluate``:
HFLM around the patched model) as the tasks ``rope_ext_ruler_<task>`` of ``evals/lm_eval_tasks`` -- with
the model's own tokenizer, ``eval.limit`` samples per task and length, and the job's corpus (``data=``)
as the essay haystack in place of Paul Graham's essays (see ``rope_ext_ruler_utils.py``). qa_squad and
qa_hotpot download their documents: they run only when named in ``eval.tasks`` (and the network answers).

Results: the score (0-100) of every task at every length (``ruler_scores.csv``, ``ruler_heatmap.png``),
the RULER average per length (``ruler@L``), the effective length (the largest L such that every length up
to it averages >= ``eval.threshold``, 85.6 as RULER: Llama-2-7B's score at 4k) and NoLiMa's relative one
(>= ``eval.relative_threshold`` x the model's own average at the shortest length), a W&B curve over length.
"""

from __future__ import annotations

import difflib
import time
from dataclasses import dataclass
from typing import Any, List, Optional

from ..core.config.fields import option
from ..core.config.lengths import lengths as context_lengths
from ..core.errors import UserError
from ..core.inputs.hub import hub_reachable
from ..core.plots import task_heatmap
from ..core.measure import Measurement
from ..core.registry import Metric, register_eval
from ..core.stats import wilson_interval
from ..lm_eval_tasks.rope_ext_ruler_utils import ESSAY, HUB, SYNTHETIC, TASKS

# below these lengths lm-eval's generators cannot build a prompt (vt: its one-shot example alone is ~500
# tokens, and its generator then loops forever; cwe: below ~510 SmolLM2 tokens it emits samples without
# answers, which lm-eval's scoring divides by; the multi-needle tasks: 4 needles and the template)
MIN_LENGTH = {
    "vt": 1024,
    "cwe": 1024,
    "niah_multikey_1": 512,
    "niah_multikey_3": 512,
    "niah_multivalue": 512,
    "niah_multiquery": 512,
}
DEFAULT_MIN_LENGTH = 256


class RulerError(UserError):
    """A bad RULER task selection or setting."""


@dataclass
class RulerConfig:
    """RULER's synthetic tasks, offline, from lm-eval's generators and scoring."""

    name: str = "ruler"
    tasks: Optional[List[str]] = None  # null: the 11 synthetic tasks (qa_squad, qa_hotpot only when named)
    lengths: List[Any] = context_lengths(
        [1024, 2048, 4096], minimum=DEFAULT_MIN_LENGTH
    )  # incl. generated tokens; or 2x
    limit: int = option(5, minimum=1)  # samples per task and length (RULER: 500)
    threshold: float = option(
        85.6, minimum=0, maximum=100, compare=False
    )  # effective length: average >= this (RULER: 85.6)
    relative_threshold: float = option(
        0.85, above=0, maximum=1, compare=False
    )  # ... >= this x the shortest length's (NoLiMa)
    apply_chat_template: bool = False  # wrap prompts in the tokenizer's chat template (instruct models)
    system_instruction: Optional[str] = None
    seed: int = 42  # set before each task and length is generated (RULER's)
    batch_size: int = option(1, minimum=1, compare=False)
    max_length: Optional[int] = option(None, minimum=1)  # None: trained context x factor, >= the longest length + 128


def selected(cfg) -> list[str]:
    """The tasks to run: ``eval.tasks``, or RULER's 11 synthetic ones (the QA tasks only when asked for, so
    the task set -- part of the job's identity -- never depends on whether the network answers)."""
    return list(dict.fromkeys(cfg.tasks)) if cfg.tasks is not None else list(SYNTHETIC)


def check_config(cfg, job=None) -> None:
    if cfg.tasks is not None:
        if not cfg.tasks:
            raise RulerError("eval.tasks is empty; null runs the 11 synthetic tasks")
        for task in cfg.tasks:
            if task not in TASKS:
                close = difflib.get_close_matches(task, TASKS, n=3)
                raise RulerError(
                    f"eval.tasks: unknown RULER task '{task}'"
                    + (f"; did you mean {', '.join(close)}?" if close else "")
                    + f" (valid: {', '.join(TASKS)})"
                )
        hub = [t for t in cfg.tasks if t in HUB]
        if hub and not hub_reachable():
            raise RulerError(
                f"eval.tasks: RULER {', '.join(hub)} download(s) SQuAD / HotpotQA and the Hugging Face hub is "
                f"not reachable; offline, the synthetic tasks: {', '.join(SYNTHETIC)}"
            )
    shortest = min(int(L) for L in cfg.lengths)
    for task in selected(cfg):
        need = MIN_LENGTH.get(task, DEFAULT_MIN_LENGTH)
        if shortest < need:
            raise RulerError(
                f"eval.lengths={list(cfg.lengths)}: RULER {task} needs lengths >= {need} (lm-eval's generator "
                f"cannot fit its prompt below); drop {shortest} or the task (eval.tasks=[...])"
            )
    if cfg.max_length is not None and cfg.max_length < max(cfg.lengths):
        raise RulerError(f"eval.max_length={cfg.max_length} is below the longest eval.lengths ({max(cfg.lengths)})")


def _needs(cfg) -> tuple:
    """The corpus is read only for the essay-haystack tasks."""
    return ("model", "data") if set(selected(cfg)) & set(ESSAY) else ("model",)


def effective_length(averages: dict[int, float], threshold: float) -> int | None:
    """The largest length such that every length up to it averages >= ``threshold`` (None: not even the shortest)."""
    found = None
    for length in sorted(averages):
        if averages[length] is None or averages[length] < threshold:
            break
        found = length
    return found


def sample_rows(task: str, output: dict) -> list[dict]:
    """One record per sample of one task x length from lm-eval's logged samples: its prompt length, the
    expected outputs, the response and its score (0-100)."""
    rows = []
    for row in next(iter((output.get("samples") or {}).values()), []):
        doc = row["doc"]
        rows.append(
            {
                "task": task,
                "length": int(doc["max_length"]),
                "index": doc["index"],
                "prompt_tokens": doc["length"],
                "outputs": doc["outputs"],
                "response": (row.get("filtered_resps") or [""])[0],
                "score": 100.0 * float(row["score"]),
            }
        )
    return rows


def run_cells(cfg, ctx, tasks: list[str], lengths: list[int], max_length: int, metadata: dict) -> tuple[list, list]:
    """(cells, samples): every task x length run by lm-eval on its own and written as it finishes --
    ``ruler_samples.jsonl`` (its samples) then ``ruler_cells.jsonl`` (the cell: score, samples, seconds) -- so an
    interrupted run keeps every finished cell, and its re-run (same job, same directory) runs only the missing
    ones. Each cell's samples are what one run over all lengths generates: the generator is seeded per task and
    length (rope_ext_ruler_utils.generate)."""
    from .lm_harness import run_simple_evaluate

    wanted = [(task, length) for task in tasks for length in lengths]
    kept = {
        (c["task"], c["length"]): c
        for c in ctx.output.previous("ruler_cells")
        if (c.get("task"), c.get("length")) in wanted
    }
    kept_samples = [r for r in ctx.output.previous("ruler_samples") if (r.get("task"), r.get("length")) in kept]
    if kept:
        print(
            f"ruler: {len(kept)} of {len(wanted)} task x length cells kept from the interrupted run; running the rest"
        )
    cells, samples = [], list(kept_samples)
    with ctx.output.records("ruler_samples") as write_sample, ctx.output.records("ruler_cells") as write_cell:
        for row in kept_samples:
            write_sample(row)
        for task, length in wanted:
            cell = kept.get((task, length))
            if cell is None:
                started = time.perf_counter()
                output = run_simple_evaluate(
                    ctx,
                    [f"rope_ext_ruler_{task}"],
                    metadata={**metadata, "max_seq_lengths": [length]},
                    max_length=max_length,
                    batch_size=cfg.batch_size,
                    log_samples=True,
                    apply_chat_template=cfg.apply_chat_template,
                    system_instruction=cfg.system_instruction,
                    check=False,
                    defaults=False,
                )
                rows = sample_rows(task, output)
                for row in rows:
                    write_sample(row)
                samples += rows
                seconds = output["model_seconds"].get("generate_until", 0.0)  # generation only, as RULER reports it
                values = [r["score"] for r in rows]
                cell = {
                    "task": task,
                    "length": length,
                    "samples": len(values),
                    "score": sum(values) / len(values) if values else None,
                    "seconds": round(seconds, 3),
                    "prompt_seconds": round(time.perf_counter() - started - seconds, 3),
                    "lm_eval_results": output.get("results"),
                }
            write_cell(cell)
            cells.append(cell)
            ctx.output.metrics(
                "ruler",
                {
                    "cells": [{k: v for k, v in c.items() if k != "lm_eval_results"} for c in cells],
                    "partial": len(cells) < len(wanted),
                },
            )
    return cells, samples


@register_eval(
    "ruler",
    config=RulerConfig,
    error=RulerError,
    check=check_config,
    needs=_needs,
    metrics=(
        Metric(
            "ruler",
            verdict=True,
            count="ruler_samples",
            interval=True,
            label="RULER average",
            bounds=(0, 100),
            unit="sample",
        ),
    ),
)
def evaluate(cfg, ctx) -> dict:
    """RULER's synthetic tasks (lm-eval's generators and scoring, our corpus as the essay haystack) per length."""
    from omegaconf import OmegaConf

    tasks = selected(cfg)
    skipped = [task for task in HUB if task not in tasks]
    if skipped:
        print(
            f"ruler: {', '.join(skipped)} not run: they download SQuAD / HotpotQA; ask for them with "
            f"eval.tasks=[...] when the network is reachable"
        )
    lengths = sorted({int(L) for L in cfg.lengths})
    factor = ctx.scaling.params.get("factor") if ctx.scaling.name != "none" else None
    max_length = cfg.max_length or max(int(ctx.trained_context * (factor or 1)), lengths[-1] + 128)
    metadata = {
        "num_samples": int(cfg.limit),
        "seed": int(cfg.seed),
        "data": OmegaConf.to_container(ctx.job.data_cfg, resolve=True) if ctx.job.data_cfg is not None else None,
    }
    ctx.model()  # loaded (and patched) before the clock starts: the load is the job's, not RULER's
    cells, samples = run_cells(cfg, ctx, tasks, lengths, max_length, metadata)
    seconds = sum(c["seconds"] for c in cells)
    scores: dict[str, dict[int, list[float]]] = {}
    for row in samples:
        scores.setdefault(row["task"], {}).setdefault(int(row["length"]), []).append(row["score"])
    lm_eval_results = {f"{c['task']}@{c['length']}": c.get("lm_eval_results") for c in cells}
    cells = [{k: v for k, v in c.items() if k != "lm_eval_results"} for c in cells]
    ctx.output.table("ruler_scores", cells)
    averages = {}
    for length in lengths:
        done = [c["score"] for c in cells if c["length"] == length and c["score"] is not None]
        averages[length] = sum(done) / len(done) if done else None
    shortest = averages[lengths[0]]
    relative = cfg.relative_threshold * shortest if shortest else None
    by_length = []
    for L in lengths:  # what each average rests on (its samples, the units the verdict pairs) and a binomial interval
        pooled = [s for task in tasks for s in scores.get(task, {}).get(L, [])]
        interval = wilson_interval(sum(pooled) / 100, len(pooled))
        low, high = (100 * interval[0], 100 * interval[1]) if interval else (None, None)
        units = {f"{r['task']}/{r['index']}": (r["score"], 1.0) for r in samples if int(r["length"]) == L}
        ctx.output.measure(Measurement("ruler", L, averages[L], len(pooled), "sample", units, low, high, "Wilson"))
        by_length.append(
            {"length": L, "average": averages[L], "samples": len(pooled), "ci95_low": low, "ci95_high": high}
        )
    summary = ctx.output.flat()
    summary["ruler_effective_length"] = effective_length(averages, cfg.threshold)
    summary["ruler_effective_length_relative"] = effective_length(averages, relative) if relative else None
    summary["ruler_seconds"] = round(seconds, 2)
    summary["ruler_prompt_seconds"] = round(sum(c["prompt_seconds"] for c in cells), 2)  # lm-eval building prompts
    count = sum(c["samples"] for c in cells)
    summary["ruler_seconds_per_sample"] = round(seconds / count, 3) if count else None
    grid = [[float("nan") if c["score"] is None else c["score"] for c in cells if c["task"] == t] for t in tasks]
    grid.append([float("nan") if averages[L] is None else averages[L] for L in lengths])
    ctx.output.figure(
        "ruler_heatmap",
        task_heatmap(grid, lengths, [*tasks, "average"], title=f"RULER: {ctx.title}", trained=ctx.trained_context),
    )
    curve = [
        {
            "length": L,
            "average": averages[L],
            **{c["task"]: c["score"] for c in cells if c["length"] == L and c["score"] is not None},
        }
        for L in lengths
        if averages[L] is not None
    ]
    ctx.output.curve("ruler", curve)
    ctx.output.metrics(
        "ruler",
        {
            **summary,
            "tasks": tasks,
            "skipped": skipped,
            "threshold": cfg.threshold,
            "relative_threshold_score": relative,
            "max_length": max_length,
            "cells": cells,
            "by_length": by_length,
            "lm_eval_results": lm_eval_results,
            "partial": False,
        },
    )
    return summary
