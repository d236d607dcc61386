"""``eval=lm_eval``: EleutherAI's lm-evaluation-harness tasks on the loaded, patched model.

The model object and tokenizer are wrapped in lm-eval's ``HFLM`` (Gao et al., lm-evaluation-harness),
so the RoPE patch is what lm-eval evaluates. ``max_length`` is always passed: lm-eval otherwise reads
it from the model config and silently left-truncates longer inputs (lm-eval #3421). rope_ext's own
tasks (``evals/lm_eval_tasks``: rope_ext_passkey, rope_ext_needle, rope_ext_books, RULER's rope_ext_ruler_*)
are always on the include path and run offline, but for RULER's two QA tasks; hub tasks (hellaswag, ruler,
longbench, ...) need the hub and fail early without it.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional

from ..core.config.fields import option
from ..core.config.lengths import lengths as context_lengths
from ..core.errors import UserError
from ..core.inputs.hub import hub_reachable
from ..core.measure import Measurement
from ..core.registry import Metric, register_eval
from ..lm_eval_tasks.rope_ext_ruler_utils import HUB as RULER_HUB
from ..core.stats import wilson_interval

TASKS_DIR = Path(__file__).parents[1] / "lm_eval_tasks"  # evals/lm_eval_tasks
LOCAL_BUILDERS = ("json", "csv", "text", "parquet", "arrow")
NETWORK_TASKS = tuple(f"rope_ext_ruler_{task}" for task in RULER_HUB)  # ours, but their documents are downloaded


class HarnessError(UserError):
    """A bad lm-eval task selection or setting."""


@dataclass
class LmEvalConfig:
    """lm-evaluation-harness tasks on the patched model."""

    name: str = "lm_eval"
    tasks: List[str] = option(["rope_ext_passkey", "rope_ext_books"], nonempty=True)
    lengths: List[Any] = context_lengths(
        [1024, 4096]
    )  # tasks with per-length prompts (metadata max_seq_lengths); or 2x
    num_fewshot: Optional[int] = option(None, minimum=0)
    limit: Optional[float] = option(None, above=0)  # documents per task (a fraction when < 1)
    batch_size: int = option(1, minimum=1, compare=False)
    max_length: Optional[int] = option(None, minimum=1)  # None: trained context x factor, >= the longest prompt + 64
    include_path: List[str] = field(default_factory=list)  # more task directories (ours are always included)
    apply_chat_template: bool = False  # wrap prompts in the tokenizer's chat template (instruct models)
    fewshot_as_multiturn: bool = False  # with the chat template: few-shot examples as turns
    system_instruction: Optional[str] = None
    log_samples: bool = option(
        False, key=False
    )  # every sample's prompt, response and score: lm_eval_samples_<task>.jsonl
    metadata: dict = field(default_factory=lambda: {"max_chars": 20000, "books": ["emma", "persuasion"]})


def check_config(cfg, job=None) -> None:
    if "max_seq_lengths" in (cfg.metadata or {}):
        raise HarnessError(
            "eval.metadata.max_seq_lengths: the lengths are eval.lengths, as for every eval (tokens, or "
            "multiples of the trained context such as 2x)"
        )
    if cfg.fewshot_as_multiturn and not cfg.apply_chat_template:
        raise HarnessError("eval.fewshot_as_multiturn=true needs eval.apply_chat_template=true")
    for path in cfg.include_path:
        if not Path(path).is_dir():
            raise HarnessError(f"eval.include_path entry {path!r} is not a directory")


def _needs_hub(config: dict) -> str | None:
    """The hub dataset a task config loads, or None when it builds or reads its data locally."""
    path = config.get("dataset_path")
    if config.get("custom_dataset") or not path or path in LOCAL_BUILDERS or os.path.exists(path):
        return None
    return path


def check_tasks(manager, tasks) -> None:
    """Unknown task names and hub tasks without a reachable hub are errors before anything runs."""
    from lm_eval.tasks._yaml_loader import load_yaml

    known = set(manager.all_tasks)
    for task in tasks:
        if task not in known:
            close = difflib.get_close_matches(task, sorted(known), n=3)
            raise HarnessError(
                f"unknown lm-eval task '{task}'"
                + (f"; did you mean {', '.join(close)}?" if close else "")
                + f" (rope_ext's offline tasks: {', '.join(sorted(p.stem for p in TASKS_DIR.glob('*.yaml')))})"
            )
        entry = manager.task_index[task]  # groups and tags are checked by lm-eval itself
        if task in NETWORK_TASKS and not hub_reachable():
            raise HarnessError(
                f"lm-eval task '{task}' downloads its documents (SQuAD / HotpotQA), and the Hugging Face "
                f"hub is not reachable. Offline, RULER's synthetic tasks: group rope_ext_ruler"
            )
        if entry.yaml_path is None or Path(entry.yaml_path).parent == TASKS_DIR:
            continue
        dataset = _needs_hub(entry.cfg or load_yaml(entry.yaml_path, resolve_func=False))
        if dataset and not hub_reachable():
            raise HarnessError(
                f"lm-eval task '{task}' needs dataset '{dataset}' from the Hugging Face hub, which is not "
                f"reachable. Offline tasks: rope_ext_passkey, rope_ext_needle, rope_ext_books"
            )


def default_max_length(cfg, ctx) -> int:
    """The extended context (trained x factor), and at least the longest synthetic prompt + generation."""
    extended = int(ctx.trained_context * (ctx.scaling.factor or 1))
    return max(extended, max(int(L) for L in cfg.lengths) + 64)


def run_simple_evaluate(
    ctx,
    tasks: list[str],
    *,
    metadata: dict,
    max_length: int,
    include_path=(),
    limit=None,
    num_fewshot=None,
    batch_size: int = 1,
    log_samples: bool = False,
    apply_chat_template: bool = False,
    fewshot_as_multiturn: bool = False,
    system_instruction: str | None = None,
    check: bool = True,
    defaults: bool = True,
    manager=None,
) -> dict:
    """lm-eval's ``simple_evaluate`` of ``tasks`` on the job's loaded, patched model (HFLM around the model
    object and tokenizer; ``max_length`` always passed), our task directory always on the include path (with
    ``defaults=False`` the only one: lm-eval's own ~10 s task index is skipped), the model's tokenizer (GGUF
    included) in the tasks' metadata; unknown and offline hub tasks fail first. Its output gains
    ``model_seconds``: the time the model spent per request type. ``manager``: a :func:`task_manager` built
    once for several calls with the same metadata."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    manager = manager or task_manager(ctx, metadata, include_path, defaults)
    metadata = manager.metadata
    if check:
        check_tasks(manager, list(tasks))
    tokenizer, model = ctx.tokenizer(), ctx.model()
    lm = HFLM(pretrained=model, tokenizer=tokenizer, max_length=max_length, batch_size=batch_size)
    seconds = _time_requests(lm)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    saved = tokenizer.model_max_length, config.max_position_embeddings
    # the scaled model's context is max_length: tokenizer and generation would otherwise warn past the trained one
    tokenizer.model_max_length = max(max_length, saved[0] or 0)
    config.max_position_embeddings = max(max_length, saved[1] or 0)
    try:
        output = simple_evaluate(
            model=lm,
            tasks=list(tasks),
            num_fewshot=num_fewshot,
            limit=limit,
            task_manager=manager,
            log_samples=log_samples,
            metadata=metadata,
            apply_chat_template=apply_chat_template,
            fewshot_as_multiturn=fewshot_as_multiturn,
            system_instruction=system_instruction,
        )
    finally:
        tokenizer.model_max_length, config.max_position_embeddings = saved
    return {**output, "model_seconds": seconds}


def task_manager(ctx, metadata: dict, include_path=(), defaults: bool = True):
    """lm-eval's TaskManager: our task directory on the include path (with ``defaults=False`` the only one), the
    model's tokenizer (GGUF included) in the tasks' metadata."""
    from lm_eval.tasks import TaskManager

    source = ctx.job.model.source
    metadata = {**metadata, "tokenizer": source.tokenizer, **dict(source.tokenizer_kwargs)}
    return TaskManager(include_path=[str(TASKS_DIR), *include_path], include_defaults=defaults, metadata=metadata)


KEPT = ("results", "samples", "configs", "higher_is_better", "versions", "n-samples")  # what the eval reads


def run_tasks(cfg, ctx, metadata: dict, max_length: int) -> dict:
    """lm-eval's output for ``eval.tasks``, one task at a time, each written to ``lm_eval_tasks.jsonl`` as it
    finishes: an interrupted run keeps its finished tasks, and its re-run (same job, same directory) runs only
    the rest. The tasks' outputs merged as one ``simple_evaluate`` of them all would give them."""
    tasks = list(dict.fromkeys(cfg.tasks))
    kept = {r["task"]: r["output"] for r in ctx.output.previous("lm_eval_tasks") if r.get("task") in tasks}
    if kept:
        print(f"lm_eval: {len(kept)} of {len(tasks)} tasks kept from the interrupted run; running the rest")
    manager = None if len(kept) == len(tasks) else task_manager(ctx, metadata, list(cfg.include_path))
    if manager is not None:
        check_tasks(manager, tasks)  # every task before the first runs
    merged: dict = {key: {} for key in KEPT}
    with ctx.output.records("lm_eval_tasks") as write:
        for task in tasks:
            output = kept.get(task)
            if output is None:
                found = run_simple_evaluate(
                    ctx,
                    [task],
                    metadata=metadata,
                    max_length=max_length,
                    manager=manager,
                    check=False,
                    limit=cfg.limit,
                    num_fewshot=cfg.num_fewshot,
                    batch_size=cfg.batch_size,
                    log_samples=True,
                    apply_chat_template=cfg.apply_chat_template,
                    fewshot_as_multiturn=cfg.fewshot_as_multiturn,
                    system_instruction=cfg.system_instruction,
                )
                output = json.loads(json.dumps({key: found.get(key) or {} for key in KEPT}, default=str))
            write({"task": task, "output": output})
            for key in KEPT:
                merged[key].update(output.get(key) or {})
    return merged


def _time_requests(lm) -> dict[str, float]:
    """{request type: seconds the model spent on it}, filled as lm-eval calls the model (generation, log-likelihoods):
    the model's time, apart from lm-eval building its tasks and prompts."""
    seconds: dict[str, float] = {}
    for name in ("generate_until", "loglikelihood", "loglikelihood_rolling"):

        def timed(*args, _run=getattr(lm, name), _name=name, **kwargs):
            started = time.perf_counter()
            try:
                return _run(*args, **kwargs)
            finally:
                seconds[_name] = seconds.get(_name, 0.0) + time.perf_counter() - started

        setattr(lm, name, timed)
    return seconds


@register_eval("lm_eval", config=LmEvalConfig, error=HarnessError, check=check_config, needs=("model",))
def evaluate(cfg, ctx) -> dict:
    """lm-evaluation-harness tasks (ours run offline) on the loaded, patched model, through HFLM; per-length
    results as ``<task>_<metric>@L`` like every eval's, task results as ``<task>_<metric>``."""
    from omegaconf import OmegaConf

    lengths = sorted({int(L) for L in cfg.lengths})
    max_length = cfg.max_length or default_max_length(cfg, ctx)
    metadata = {**OmegaConf.to_container(cfg.metadata or {}, resolve=True), "max_seq_lengths": lengths}
    output = run_tasks(cfg, ctx, metadata, max_length)
    results = {
        task: {k: v for k, v in metrics.items() if not _unevaluated(k, v)}
        for task, metrics in output["results"].items()
    }
    rows, summary = [], {}
    for task, metrics in results.items():
        for key, value in metrics.items():
            metric, _, filter_name = key.partition(",")
            if isinstance(value, (int, float)) and not isinstance(value, bool) and metric != "alias":
                rows.append({"task": task, "metric": metric, "filter": filter_name, "value": value})
                if (
                    not metric.isdigit()
                    and not metric.endswith("_stderr")
                    and not (isinstance(value, float) and math.isnan(value))
                ):
                    summary[_name(task, metric, filter_name)] = value
    per_length, declared = by_length(output, lengths)
    ctx.output.declare(declared)
    ctx.output.measure(*per_length)
    summary.update(ctx.output.flat())
    ctx.output.table("lm_eval", rows)
    curve = [{"length": L, **{m.metric: m.value for m in per_length if m.length == L}} for L in lengths]
    ctx.output.curve("lm_eval", [row for row in curve if len(row) > 1])
    if cfg.log_samples:
        for task, samples in (output.get("samples") or {}).items():
            with ctx.output.records(f"lm_eval_samples_{task}") as write:
                for sample in samples:
                    write(sample)
    ctx.output.metrics(
        "lm_eval",
        {
            "results": results,
            "versions": output.get("versions"),
            "n-samples": output.get("n-samples"),
            "max_length": max_length,
            "lm_eval_version": _version(),
            "higher_is_better": output.get("higher_is_better"),
            "config": {k: str(v) for k, v in (output.get("config") or {}).items()},
        },
    )
    return summary


def _name(task: str, metric: str, filter_name: str) -> str:
    """``rope_ext_passkey`` + ``acc`` (filter ``none``) -> ``rope_ext_passkey_acc``; other filters are named."""
    return f"{task}_{metric}" + ("" if filter_name in ("", "none") else f"_{filter_name}")


def _sample_length(doc: dict, lengths: list[int]) -> int | None:
    """The length a sample was built for (rope_ext's tasks: ``length``, RULER's: ``max_length``), when it is
    one of the lengths asked for."""
    for field_name in ("max_length", "length"):
        value = doc.get(field_name) if isinstance(doc, dict) else None
        if isinstance(value, int) and value in lengths:
            return value
    return None


def by_length(output: dict, lengths: list[int]) -> tuple[list, dict]:
    """([measurements], {metric: declaration}) from lm-eval's logged samples: for tasks whose samples carry the length
    they were built for, the mean of each mean-aggregated metric per length over its samples (the units, by doc id),
    its direction from lm-eval's ``higher_is_better``, a Wilson interval where it is a 0-1 score."""
    found, declared = [], {}
    for task, samples in (output.get("samples") or {}).items():
        metric_list = ((output.get("configs") or {}).get(task) or {}).get("metric_list") or []
        means = [
            m["metric"]
            for m in metric_list
            if isinstance(m.get("metric"), str)
            and not m["metric"].isdigit()
            and str(m.get("aggregation", "mean")) == "mean"
        ]
        groups: dict[int, list[dict]] = {}
        for sample in samples:
            length = _sample_length(sample.get("doc"), lengths)
            if length is not None:
                groups.setdefault(length, []).append(sample)
        filters = list(dict.fromkeys(str(s.get("filter") or "none") for group in groups.values() for s in group))
        for metric, filter_name in [(m, f) for m in means for f in filters]:
            # one sample per document and filter: each filter is its own metric (as lm-eval names them)
            values = {
                L: {
                    f"{task}/{s.get('doc_id', i)}": float(s[metric])
                    for i, s in enumerate(group)
                    if isinstance(s.get(metric), (int, float)) and str(s.get("filter") or "none") == filter_name
                }
                for L, group in groups.items()
            }
            values = {L: v for L, v in values.items() if v}
            if not values:
                continue
            name, unit = _name(task, metric, filter_name), all(0 <= x <= 1 for v in values.values() for x in v.values())
            higher = ((output.get("higher_is_better") or {}).get(task) or {}).get(metric, True)
            declared[name] = Metric(
                name,
                lower_is_better=not higher,
                verdict=True,
                count=f"{task}_samples",
                interval=unit,
                label=f"{task} {metric}",
                bounds=(0, 1) if unit else None,
                unit="sample",
            ).declared("lm_eval")
            for L, v in values.items():
                interval = wilson_interval(sum(v.values()), len(v)) if unit else None
                found.append(
                    Measurement(
                        name,
                        L,
                        sum(v.values()) / len(v),
                        len(v),
                        "sample",
                        {k: (x, 1.0) for k, x in v.items()},
                        interval and interval[0],
                        interval and interval[1],
                        "Wilson" if interval else None,
                    )
                )
    return found, declared


def _unevaluated(key: str, value) -> bool:
    """A per-length metric of a length that had no prompts (our retrieval tasks report -1 there)."""
    metric = key.partition(",")[0].removesuffix("_stderr")
    return metric.isdigit() and (value == -1 or value == "N/A")


def _version() -> str | None:
    from importlib import metadata

    return metadata.version("lm-eval")
