"""What ``target=`` sets up, and the scaling resolved once: the target length parsed (``4x`` -> 4 x the trained
context), each strategy's parameters derived for it (:mod:`rope_ext.strategies.targets`; a strategy that cannot reach it is
:class:`~evals.core.errors.TargetUnreachable`), the scaling's frequencies computed on every rotary slot it will
patch, the length the verdict answers for, and the settings that cannot do what they are for at the longest
length -- each said in one line before the model loads.
"""

from __future__ import annotations

from pathlib import Path

import rope_ext

from rope_ext.strategies.targets import TargetError, set_up, shortfalls

from ..config.lengths import parse_length
from ..errors import ConfigError, TargetUnreachable, scaling_errors_as_user_errors
from ..files import note_once
from ..inputs.models import ResolvedModel, resolve_model
from .job import Job, container


def parse_target(cfg, trained: int | None = None) -> int | None:
    """``target=`` in tokens (``4x`` -> 4 x the trained context), None when unset; a ConfigError for anything that is
    not a positive length, or one that disagrees with ``verdict.target``. Without ``trained``: the syntax only."""
    value = cfg.get("target")
    if value in (None, ""):
        return None
    target = parse_length(value, trained, "target")  # without trained: the syntax (0.5x is fine)
    if target < 1:
        raise ConfigError(
            f"target={value} is not a positive length: give tokens (32768) or a multiple of the trained "
            f"context, e.g. target=4x"
        )
    if trained is None:
        return None
    given = cfg.verdict.get("target")
    if given is not None and parse_length(given, trained, "verdict.target") != target:
        raise ConfigError(
            f"target={value} ({target} tokens) and verdict.target={given} disagree: the verdict answers "
            f"for the target; give one of them"
        )
    return target


def parse_scaling(
    cfg, model: ResolvedModel, longest: int | None, target: int | None = None
) -> tuple[rope_ext.Scaling, tuple | None, dict]:
    """The scaling resolved once against the model (set up for ``target`` when given: :mod:`rope_ext.strategies.targets`;
    the derived values and why), the slots it patches selected once (handed to the patcher), and its frequencies
    computed on each (at the trained length and, for dynamic strategies, beyond it) so any bad value fails now."""
    derived = {}
    # the one rule for a model that ships a scaling (rope_ext.strategies.shipped): the same-named strategy inherits its parameters
    setting, shipped = rope_ext.inherit_shipped(container(cfg), model.config)
    with scaling_errors_as_user_errors():
        if target is None:
            scaling = rope_ext.resolve(setting, model.trained_context)
        else:
            try:
                scaling, setup = set_up(setting, model.trained_context, target)
            except TargetError as err:  # only this is "cannot reach"; any other bad value stays a config error
                raise TargetUnreachable(str(err)) from None
            derived = setup.why
        if model.slots is None or scaling.name == "none":  # nothing to patch
            return scaling, None, derived
        _say_native(model, scaling, shipped)
        scaled = tuple(rope_ext.select_slots(model.slots, scaling.layer_types))
        for shape in scaled:
            scaling.frequencies(shape.dim, shape.base)
            if scaling.dynamic:
                scaling.frequencies(shape.dim, shape.base, max(longest or 0, target or 0, 2 * model.trained_context))
    return scaling, scaled, derived


def native_scaling(config) -> str | None:
    """The rope scaling a checkpoint ships with (``llama3 x8``, ``yarn x4``), from its config's rope parameters
    (any layer type's), or None for plain RoPE."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    params = dict(getattr(text, "rope_parameters", None) or {})
    entries = [v for v in params.values() if isinstance(v, dict)] or [params]
    for entry in entries:
        kind = entry.get("rope_type") or entry.get("type")
        if kind and kind != "default":
            factor = entry.get("factor")
            return f"{kind}" + (f" x{factor:g}" if isinstance(factor, (int, float)) else "")
    return None


def _say_native(model: ResolvedModel, scaling, shipped: str | None = None) -> None:
    """One line when the checkpoint ships with rope scaling: the reference (``none``) is the model as shipped, and
    whether the strategy replaces the native scaling (frequency strategies rebuild from ``rope_theta``) or stacks
    on it (query- and attention-level strategies keep the model's own frequencies)."""
    native = native_scaling(model.config)
    if native is None:
        return
    how = (
        f"{shipped.split(' ', 1)[1]}"  # rope_ext.inherit_shipped's line: what it inherits, or that it replaces it
        if shipped and scaling.scales_frequencies
        else "stacks on it: the model's own (scaled) frequencies are kept"
    )
    said = (
        f"model '{model.name}' ships with {native} rope scaling; the reference (scaling=none) is the model as shipped, "
        f"and {scaling.name} {how}"
    )
    note_once(f"note: {said}")


def target_length(cfg, scaling: rope_ext.Scaling, trained: int, lengths: list[int], factor=None) -> int | None:
    """The length the verdict answers for (``cfg``: the verdict config; ``target=`` already made it its target):
    ``verdict.target``, else trained x the scaling's factor (``none`` ignores its factor, but in a factor sweep it
    still names the question), else the longest length evaluated (None when the eval has no lengths)."""
    if cfg.target is not None:
        target = parse_length(cfg.target, trained, "verdict.target")  # without trained: the syntax
        if target < 1:
            raise ConfigError(
                f"verdict.target={cfg.target} is {target} tokens: a target is a positive length, in tokens "
                f"(16384) or as a multiple of the trained context{f' ({trained})' if trained else ''}, e.g. 2x"
            )
        return target
    factor = scaling.factor or (factor if scaling.name == "none" else None)
    if factor and factor > 1:
        return round(trained * factor)
    return max(lengths) if lengths else None


def setting_warnings(scaling: rope_ext.Scaling, trained: int, longest: int) -> list[str]:
    """Settings that run but cannot do what they are for at the longest length evaluated, said before the model
    loads (:func:`rope_ext.strategies.targets.shortfalls`: a static factor that covers less, an attention-level rule whose last
    query sees relative positions beyond what the model was trained on), with where to look."""
    return [
        problem
        if problem.endswith("covers it")
        else f"{problem}; choose its parameters for this length (target={longest} sets them, python run.py --cfg job "
        f"scaling={scaling.name} target={longest} shows them)"
        for problem in shortfalls(scaling, trained, longest)
    ]


def target_setup(cfg) -> list[str]:
    """What ``target=`` sets up for a composed config, as :func:`describe_target` prints it at a job's start, for
    ``python run.py --cfg job target=4x scaling=...`` (which shows the config before anything is derived); a
    UserError (one line) when the target is bad or cannot be reached. Empty without a target."""
    if cfg.get("target") in (None, ""):
        return []
    parse_target(cfg)  # the syntax, before the model's geometry is read
    model = resolve_model(cfg.model, geometry=False, weights=False)
    target = parse_target(cfg, model.trained_context)
    with scaling_errors_as_user_errors():
        try:
            scaling, setup = set_up(container(cfg.scaling), model.trained_context, target)
        except TargetError as err:
            raise TargetUnreachable(str(err)) from None
    job = Job(
        name="",
        model=model,
        scaling=scaling,
        scaled=None,
        eval=None,
        eval_cfg=None,
        data_cfg=None,
        seed=0,
        config={"target": cfg.get("target")},
        identity={},
        key="",
        out_dir=Path("."),
        logger=None,
        force=False,
        resume_from=(),
        target=target,
        derived=setup.why,
    )
    return describe_target(job)


def describe_target(job: "Job") -> list[str]:
    """What ``target=`` set up, one line each: the target, then every derived parameter with why."""
    if not job.derived and job.config.get("target") in (None, ""):
        return []
    trained = job.trained_context
    lines = [
        f"target: {job.target} tokens ({job.target / trained:g}x {job.model.label}'s trained {trained}); "
        f"{job.scaling.name}: "
        + ("nothing derived (explicit or no target rule)" if not job.derived else "set up for it")
    ]
    lines += [
        f"  scaling.{key}={value:g}" if isinstance(value, float) else f"  scaling.{key}={value}"
        for key, (value, _) in job.derived.items()
    ]
    lines = lines[:1] + [f"{line:<34} # {why}" for line, (_, (_, why)) in zip(lines[1:], job.derived.items())]
    return lines
