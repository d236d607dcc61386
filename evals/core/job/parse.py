"""A job, parsed and validated once: :func:`parse_job` turns the composed Hydra config into a frozen
:class:`~evals.core.job.job.Job` that everything downstream takes as it is.

Parsing does every check that needs no weights and no tokenization, so a bad value is one line within
seconds: option ranges, the eval's own check, the model's source and device, its RoPE geometry (read
from its config or GGUF metadata and a ``meta``-device instance), the scaling resolved once and its
frequencies computed for every rotary slot it will patch (:mod:`evals.core.job.target`), and the data files
(readable, non-empty, UTF-8). It also fixes the job's identity (:mod:`evals.core.job.identity`), whose hash is
the job key that resume and the report go by, and the unscaled job its verdict compares with
(:func:`parse_reference`).
"""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path

import rope_ext
from omegaconf import OmegaConf

from ..config.fields import check_options, identity_fields
from ..config.lengths import length_fields
from ..config.structured import DataConfig, LoggerConfig, ModelConfig, VerdictConfig
from ..decision.verdict import AT
from ..errors import ConfigError, TargetUnreachable, scaling_errors_as_user_errors
from ..files import cache_dir, unwritable
from ..inputs.data import data_identity
from ..inputs.models import ResolvedModel, check_attention_hook, resolve_model
from ..registry import EVALS, EvalSpec
from .identity import KEY_PACKAGES, code_identity, digest, eval_identity, package_version, scaling_identity
from .job import Job, container, parts, with_eval
from .lengths import add_trained_context, reference_lengths_for, resolve_job_lengths
from ..run.memory import check as memory_check
from .target import describe_target, parse_scaling, parse_target, setting_warnings, target_length


def resolved_config(
    cfg, spec: EvalSpec, scaling: rope_ext.Scaling, derived: dict | None = None, model: ResolvedModel | None = None
) -> dict:
    """The composed config, its scaling replaced by the resolved one (with its label, and what ``target=`` derived
    and why; ``none`` without the factor it ignores); the model's name as recorded (a local checkpoint's own, its
    preset as its family, and its own path, trained context and architecture: :meth:`ResolvedModel.recorded`); a suite with the evals it runs only."""
    config = container(cfg)
    if model is not None:
        config["model"] = model.recorded(config["model"])
    if spec.parts is not None:
        names = {part_spec.name for part_spec, _, _ in parts(spec, cfg.eval)}
        config["eval"] = {k: v for k, v in config["eval"].items() if k not in EVALS or k in names}
    config["scaling"] = {
        "label": scaling.label,
        **({"name": "none", "layer_types": scaling.layer_types} if scaling.name == "none" else scaling.to_dict()),
    }
    if derived:
        config["scaling"]["derived"] = {key: why for key, (value, why) in derived.items()}
    return config


def parse_job(cfg, out_dir: Path, multirun: bool = False, model: ResolvedModel | None = None) -> Job:
    """Validate the composed config once and build the job; raises a UserError (one line) on bad input.
    ``model``: the model already resolved for the same ``cfg.model`` (a job's unscaled reference)."""
    problem = unwritable(out_dir)
    if problem:
        raise ConfigError(f"output_dir {out_dir} cannot be written: {problem}; choose another output_dir")
    if not multirun and (cfg.get("objective") not in (None, "", []) or cfg.get("constraints")):
        # a search forgotten: without -m Hydra runs this one job and nothing is searched
        raise ConfigError(
            f"objective={cfg.get('objective')}: objective and constraints are what a search optimises; "
            f"run it as one: python run.py -m hydra/sweeper=optuna ... (one trial alone: objective=null "
            f"constraints=[])"
        )
    cache_dir(cfg.data.get("cache_dir"))  # a cache that cannot be written is said now, and the run goes on
    name = cfg.eval.get("name")
    if name not in EVALS:
        raise ConfigError(f"eval.name={name!r} is not a registered eval; valid: {', '.join(sorted(EVALS))}")
    spec = EVALS[name]
    check_options(cfg.model, ModelConfig, "model")
    check_options(cfg.data, DataConfig, "data")
    check_options(cfg.logger, LoggerConfig, "logger")
    check_options(cfg.verdict, VerdictConfig, "verdict")
    for part_spec, part, path in parts(spec, cfg.eval):
        check_options(part, part_spec.config, path)
    parse_target(cfg)  # the syntax, before the model's geometry is read
    if cfg.verdict.get("target") is not None:
        target_length(cfg.verdict, None, None, [])  # verdict.target's too
    needs = spec.needs_for(cfg.eval)
    with scaling_errors_as_user_errors():
        strategy = rope_ext.STRATEGIES[rope_ext.strategies.registry.resolve_name(cfg.scaling.get("name"))]
    geometry = "geometry" in needs or strategy.name != "none"
    if model is None or (geometry and model.slots is None):
        model = resolve_model(cfg.model, geometry=geometry, weights="model" in needs)
    target = parse_target(cfg, model.trained_context)
    if target is not None:
        cfg.verdict.target = target  # the verdict answers for the target
    lengths = resolve_job_lengths(spec, cfg.eval, model.trained_context, target)
    try:
        scaling, scaled, derived = parse_scaling(cfg.scaling, model, max(lengths, default=None), target)
    except TargetUnreachable as err:  # what the sweep's answer lists it under
        err.job.update(
            {
                "model": model.name,
                "model_label": model.label,
                "weights": model.cfg.weights,
                "scaling": strategy.name,
                "eval": spec.name,
                "data": cfg.data.get("name"),
                "trained_context": model.trained_context,
                "target_length": target,
                "role": "job",
            }
        )
        raise
    if "model" in needs:  # before the model is built: its peak memory against what the device has (exit 2 if over)
        eval_parts = [(part_spec.name, part) for part_spec, part, _ in parts(spec, cfg.eval)]
        for line in memory_check(model, eval_parts, lengths, scaling.scales_attention):
            print(line, file=sys.stderr if line.startswith("warning:") else sys.stdout)
    for line in add_trained_context(spec, cfg.eval, model.trained_context, scaling):
        print(line, file=sys.stderr if line.startswith("warning:") else sys.stdout)
    if scaling.scales_attention:
        check_attention_hook(
            model, f"scaling '{scaling.label}' sets the relative positions inside attention", rotation=True
        )
    elif scaling.scales_query:
        check_attention_hook(model, f"scaling '{scaling.label}' scales queries inside attention")
    data = data_identity(cfg.data) if "data" in needs else None
    identity = {
        "model": model.identity,
        "scaling": scaling_identity(scaling, scaled),
        "eval": eval_identity(spec, cfg.eval),
        "data": data,
        "seed": cfg.seed,
        "versions": {name: package_version(name) for name in KEY_PACKAGES},
        "code": code_identity(spec.run, strategy.fn),
    }
    compare_fields = {}
    for part_spec, part, _ in parts(spec, cfg.eval):  # what a reference must share, eval by eval
        part_needs = part_spec.needs_for(part)
        compare_fields[part_spec.name] = {
            "model": model.identity,
            "data": data if "data" in part_needs else None,
            "eval": {"name": part_spec.name, **identity_fields(part_spec.config, part, "compare")},
            "seed": cfg.seed,
        }
    job = Job(
        name=f"{model.label}-{scaling.label}-{spec.name}",
        model=model,
        scaling=scaling,
        scaled=scaled,
        eval=spec,
        eval_cfg=cfg.eval,
        data_cfg=cfg.data,
        seed=cfg.seed,
        config=resolved_config(cfg, spec, scaling, derived, model),
        identity=identity,
        key=digest(identity),
        out_dir=Path(out_dir),
        logger=cfg.logger,
        force=bool(cfg.force),
        resume_from=tuple(cfg.resume_from),
        multirun=multirun,
        verdict=cfg.verdict,
        target=target_length(cfg.verdict, scaling, model.trained_context, lengths, cfg.scaling.get("factor")),
        compare={name: digest(fields) for name, fields in compare_fields.items()},
        compare_fields=compare_fields,
        environment=digest({"versions": identity["versions"], "code": identity["code"]}),
        derived=derived,
    )
    for line in describe_target(job):
        print(line)
    for part_spec, part, _ in parts(spec, cfg.eval):
        if part_spec.check:
            part_spec.check(part, with_eval(job, part_spec, part))
    if spec.parts is not None and spec.check:
        spec.check(cfg.eval, job)
    for warning in setting_warnings(scaling, model.trained_context, max(lengths, default=0)):
        print(f"warning: {warning}", file=sys.stderr)
    if job.target and lengths and job.target not in lengths and job.needs_reference():
        print(
            f"warning: the verdict's target {job.target} is not among the lengths evaluated {sorted(set(lengths))}: "
            f"the job will answer at those lengths but not at the target; add it (e.g. eval.lengths=[...,"
            f"{job.target}]) or set verdict.target",
            file=sys.stderr,
        )
    return replace(job, reference=parse_reference(cfg, job))


def search_reference_lengths(cfg, trained: int) -> set[int] | None:
    """In a search (``objective=`` set): the unscaled lengths its objective and constraints need -- a retention or
    ratio at L is judged against the unscaled model at L (up to the trained context) or at the trained context
    (beyond it); a plain value (ppl@16384) needs none. None outside a search: the verdict's own lengths."""
    objective = cfg.get("objective")
    if objective in (None, "", []):
        return None
    texts = [
        str(o)
        for o in (objective if not isinstance(objective, str) and hasattr(objective, "__iter__") else [objective])
    ]
    texts += [re.split(r"[<>]=", str(c))[0] for c in cfg.get("constraints") or []]
    needed = set()
    for text in texts:
        match = AT.match(text.strip())
        if (
            match
            and match.group(1).endswith(("_retention", "_ratio"))
            or match
            and match.group(1).startswith("verdict")
        ):
            length = int(match.group(2))
            needed.add(length if length <= trained else trained)
    return needed


def parse_reference(cfg, job: Job) -> Job | None:
    """The unscaled job the verdict compares a scaled one with (LongRoPE2, arXiv 2502.20082, for short-context
    retention): the same model, evals and data without scaling, at the lengths the verdict compares with
    (:func:`reference_lengths_for`). Run first when no finished twin is found and ``verdict.baseline`` is
    on; its directory is the sweep's ``baseline/<key>/`` (a single run's own), so a sweep computes it once."""
    if job.scaling.name == "none" or not cfg.verdict.baseline or not job.needs_reference():
        return None
    trained = job.trained_context
    base = OmegaConf.to_container(cfg, resolve=True)
    base["scaling"] = {"name": "none"}
    base["force"] = False  # reused whenever its key matches: one reference per sweep
    base["verdict"] = {**base["verdict"], "target": None}  # it answers nothing itself: its longest length
    base["target"] = None
    node = OmegaConf.create(base)
    for part_spec, part, _ in parts(job.eval, node.eval):
        for name in length_fields(part_spec.config):
            if part.get(name) is not None:
                part[name] = reference_lengths_for([int(L) for L in part[name]], trained)
        if part_spec.reference:
            part_spec.reference(part)
    needed = search_reference_lengths(cfg, trained)
    if needed is not None:  # a search's trial: only the lengths its objective and constraints judge
        left = []
        for part_spec, part, _ in parts(job.eval, node.eval):
            fields = [name for name in length_fields(part_spec.config) if part.get(name) is not None]
            for name in fields:
                part[name] = [L for L in part[name] if L in needed]
            if any(part[name] for name in fields):
                left.append(part_spec.name)
        if not left:
            return None
        if job.eval.parts is not None:  # a suite: only its evals that still have a length to judge
            node.eval.run = [name for name in node.eval.run if name in left]
    root = job.out_dir.parent if job.multirun else job.out_dir
    provisional = parse_job(node, root / "baseline", job.multirun, model=job.model)
    # one directory per reference, named by its key: every job of a sweep (any model, data) finds its own
    return replace(provisional, out_dir=root / "baseline" / provisional.key[:12], role="reference")
