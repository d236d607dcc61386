"""A job's lengths: every eval's lengths resolved to tokens (``2x``, ``target``), the trained context added where
the verdict needs a value there (with what it costs), and the unscaled lengths a verdict compares with.
"""

from __future__ import annotations

import math
from dataclasses import fields as dataclass_fields

import rope_ext

from ..config.lengths import check_lengths, length_fields, resolve_lengths
from ..registry import EvalSpec
from .job import parts


def resolve_job_lengths(spec: EvalSpec, cfg, trained: int, target: int | None = None) -> list[int]:
    """Every eval's lengths in tokens (``2x`` -> 2 x trained, ``target`` -> the target), each eval's ``resolve``
    applied; all of them."""
    found = []
    for part_spec, part, path in parts(spec, cfg):
        resolve_lengths(part, part_spec.config, trained, path, target)
        check_lengths(part, part_spec.config, path)
        if part_spec.resolve:
            part_spec.resolve(part)
        found += [int(L) for name in length_fields(part_spec.config) if part.get(name) is not None for L in part[name]]
    return found


def reference_lengths_for(lengths: list[int], trained: int) -> list[int]:
    """The unscaled lengths a verdict on ``lengths`` compares with: each length up to the trained context, and the
    trained context itself only when some length lies beyond it (nothing else: an unneeded reference length
    costs a forward and can clash with the job's own settings, e.g. a sliding ``max_tokens``)."""
    beyond = any(L > trained for L in lengths)
    return sorted({L for L in lengths if L <= trained} | ({trained} if beyond else set()))


def add_trained_context(spec: EvalSpec, cfg, trained: int, scaling: rope_ext.Scaling) -> list[str]:
    """The trained context T added, in place, to the lengths of each eval the verdict judges beyond it, where the
    verdict needs a value there (:func:`evals.core.decision.verdict.judge`): an unscaled job is its own reference, and a
    length beyond T compares with its value at T; a scaled job needs a short-context check, at T when none of its
    lengths is up to T. Returns one line per addition, with what it costs (nothing under the prefix protocol: a
    prefix of the forward at the longest length), or why it was not added."""
    judged = []
    for part_spec, part, path in parts(spec, cfg):
        fields = [name for name in length_fields(part_spec.config) if part.get(name) is not None]
        declared = part_spec.metrics_for(part)
        if fields and (any(m.verdict for m in declared) or not declared):  # no metrics: known when it runs (lm-eval)
            judged.append((part_spec, part, path, fields))
    lengths = {int(L) for _, part, _, fields in judged for name in fields for L in part[name]}
    if not any(L > trained for L in lengths):
        return []
    if scaling.name == "none":
        why = "the verdict beyond it compares with the unscaled model there"
    elif not any(L <= trained for L in lengths):
        why = "the verdict beyond it needs the short context kept, and no length is up to it"
    else:
        return []
    lines = []
    for part_spec, part, path, fields in judged:
        for name in fields:
            values = [int(L) for L in part[name]]
            if trained in values or not any(L > trained for L in values):
                continue
            accepts = next(f for f in dataclass_fields(part_spec.config) if f.name == name).metadata["accepts"]
            refused = accepts.why(trained) or _stride_refuses(part_spec, part, trained)
            head = f"lengths: {trained} (1x, the trained context)"
            if refused:
                lines.append(f"warning: {head} not added to {path}.{name} ({why}): it {refused}")
                continue
            part[name] = sorted([*values, trained])
            lines.append(f"{head} added to {path}.{name}: {why}; {_cost_at(part_spec, part, trained, scaling)}")
    return lines


def _stride_refuses(spec: EvalSpec, cfg, length: int) -> str | None:
    """Why a sliding perplexity cannot take ``length`` (its stride is longer than the window's new tokens)."""
    if spec.name == "perplexity" and cfg.protocol == "sliding":
        span = length - (1 if cfg.bos_per_window else 0)
        if cfg.stride > span:
            return f"is shorter than eval.stride={cfg.stride} (sliding windows advance by the stride)"
    return None


def _cost_at(spec: EvalSpec, cfg, length: int, scaling: rope_ext.Scaling) -> str:
    """What measuring ``length`` too costs a job of ``spec``."""
    if spec.name == "perplexity" and cfg.protocol == "prefix":
        if scaling.dynamic:
            return f"it costs one forward of {length} tokens per document (a dynamic strategy: one forward per length)"
        return f"no extra forward (prefix protocol: the first {length} tokens of the forward at {max(cfg.lengths)})"
    if spec.name == "perplexity":
        windows = 1 + max(0, math.ceil((cfg.max_tokens - length) / cfg.stride))  # as sliding_document runs them
        return (
            f"it costs one more sliding pass per document ({windows} windows of {length} tokens advanced by "
            f"{cfg.stride} over its {cfg.max_tokens} tokens)"
        )
    if cfg.get("depths") is not None and cfg.get("trials") is not None:
        return f"it costs {len(cfg.depths) * int(cfg.trials)} more prompts of {length} tokens"
    return f"it costs the {spec.name} samples at {length} tokens"
