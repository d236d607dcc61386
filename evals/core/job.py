"""A job, parsed and validated once: :func:`parse_job` turns the composed Hydra config into a frozen
:class:`Job` that everything downstream takes as it is.

Parsing does every check that needs no weights and no tokenization, so a bad value is one line within
seconds: option ranges, the eval's own check, the model's source and device, its RoPE geometry (read
from its config or GGUF metadata and a ``meta``-device instance), the scaling resolved once and its
frequencies computed for every rotary slot it will patch, and the data files (readable, non-empty,
UTF-8). It also fixes the job's identity -- everything that changes a number: the model's weights and
tokenizer files, dtype and device type, the effective scaling and the layers it scales, the eval config,
the data content, the seed, the numeric packages' versions and the code -- whose hash is the job key
that resume and the report go by.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
import re
import sys
from dataclasses import dataclass, field, replace
from dataclasses import fields as dataclass_fields
from importlib import metadata
from pathlib import Path
from typing import Any

import rope_ext
from omegaconf import OmegaConf

from rope_ext.targets import TargetError, set_up, shortfalls

from .config.fields import check_options, identity_fields
from .config.lengths import check_lengths, length_fields, parse_length, resolve_lengths
from .config.structured import DataConfig, LoggerConfig, ModelConfig, VerdictConfig
from .data import data_identity
from .errors import ConfigError, TargetUnreachable, scaling_errors_as_user_errors
from .files import cache_dir, note_once, unwritable
from .models import ResolvedModel, check_attention_hook, resolve_model
from .registry import EVALS, EvalSpec
from .verdict import AT

KEY_PACKAGES = ("torch", "transformers", "gguf", "lm-eval")


@dataclass(frozen=True)
class Job:
    name: str  # <model>-<scaling label>-<eval>: the W&B run name
    model: ResolvedModel
    scaling: rope_ext.Scaling
    scaled: (
        tuple[rope_ext.RotarySlot, ...] | None
    )  # the slots the scaling patches, selected once (None: geometry not read)
    eval: EvalSpec
    eval_cfg: Any
    data_cfg: Any
    seed: int
    config: dict  # the resolved config (results.json, W&B)
    identity: dict  # everything that changes a number
    key: str
    out_dir: Path
    logger: Any
    force: bool
    resume_from: tuple[str, ...]
    multirun: bool = False
    verdict: Any = None  # how results are judged (verdict.tolerance, .retained, .baseline): not in the key
    target: int | None = (
        None  # the length the question is about (target=; verdict.target; trained x factor; the longest)
    )
    derived: dict = field(default_factory=dict)  # {scaling parameter: (value, why)} set up for target=
    compare: dict = field(default_factory=dict)  # {eval: its comparison key} -- what must match a reference's
    compare_fields: dict = field(default_factory=dict)  # {eval: the compared fields}, to say what differs
    environment: str = ""  # versions and code: results of another environment are compared with a warning
    reference: "Job | None" = None  # the unscaled job to run first when no finished reference is found
    role: str = "job"  # "reference": run as another job's unscaled reference

    @property
    def trained_context(self) -> int:
        return self.model.trained_context

    def info(self) -> dict:
        """The job as results.json and the report name it."""
        return {
            "name": self.name,
            "key": self.key,
            "model": self.model.name,
            "model_label": self.model.label,
            "weights": self.model.cfg.weights,
            "scaling": self.scaling.label,
            "eval": self.eval.name,
            "data": self.data_cfg.name,
            "trained_context": self.trained_context,
            "target_length": self.target,
            "compare": self.compare,
            "environment": self.environment,
            "role": self.role,
        }

    def sections(self) -> dict:
        """What results.json records of the job before anything runs."""
        return {
            "job": self.info(),
            "config": self.config,
            "identity": self.identity,
            "compare": self.compare_fields,
            "declared": self.declared(),
        }

    def declared(self) -> dict:
        """The per-length metrics its evals declare, as results.json records them."""
        return {
            m.name: m.declared(spec.name)
            for spec, part in self.eval.parts_of(self.eval_cfg)
            for m in spec.metrics_for(part)
        }

    def needs_reference(self) -> bool:
        """Whether the verdict judges anything this job measures: a metric declared with ``verdict``, or an eval
        with lengths whose metrics are known only when it runs (lm-eval's tasks)."""
        return any(m["verdict"] for m in self.declared().values()) or any(
            length_fields(spec.config) and not spec.metrics_for(part)
            for spec, part in self.eval.parts_of(self.eval_cfg)
        )


def _container(node) -> Any:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


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
    """The scaling resolved once against the model (set up for ``target`` when given: :mod:`rope_ext.targets`;
    the derived values and why), the slots it patches selected once (handed to the patcher), and its frequencies
    computed on each (at the trained length and, for dynamic strategies, beyond it) so any bad value fails now."""
    derived = {}
    with scaling_errors_as_user_errors():
        if target is None:
            scaling = rope_ext.resolve(_container(cfg), model.trained_context)
        else:
            try:
                scaling, setup = set_up(_container(cfg), model.trained_context, target)
            except TargetError as err:  # only this is "cannot reach"; any other bad value stays a config error
                raise TargetUnreachable(str(err)) from None
            derived = setup.why
        if model.slots is None or scaling.name == "none":  # nothing to patch
            return scaling, None, derived
        _say_native(model, scaling)
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


def _say_native(model: ResolvedModel, scaling) -> None:
    """One line when the checkpoint ships with rope scaling: the reference (``none``) is the model as shipped, and
    whether the strategy replaces the native scaling (frequency strategies rebuild from ``rope_theta``) or stacks
    on it (query- and attention-level strategies keep the model's own frequencies)."""
    native = native_scaling(model.config)
    if native is None:
        return
    how = (
        "replaces it: its frequencies are rebuilt from rope_theta"
        if scaling.scales_frequencies
        else "stacks on it: the model's own (scaled) frequencies are kept"
    )
    said = (
        f"model '{model.name}' ships with {native} rope scaling; the reference (scaling=none) is the model as shipped, "
        f"and {scaling.name} {how}"
    )
    note_once(f"note: {said}")


@functools.lru_cache(maxsize=None)
def _source_hash(paths: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()[:16]


def code_files(*functions) -> tuple[str, ...]:
    """rope_ext's and evals' source (lm-eval task YAMLs and their ``*_yaml`` templates included), and the
    files defining ``functions`` (plugins)."""
    roots = [Path(rope_ext.__file__).parent, Path(__file__).resolve().parents[1]]
    files = {
        str(p)
        for root in roots
        for p in root.rglob("*")
        if (p.suffix in (".py", ".yaml") or p.name.endswith("_yaml")) and p.is_file()
    }
    for fn in functions:
        with_source = inspect.getsourcefile(fn)
        if with_source:
            files.add(with_source)
    return tuple(sorted(files))


def code_identity(*functions) -> str:
    """A hash of :func:`code_files`: a change to any of them is another job."""
    return _source_hash(code_files(*functions))


def scaling_identity(scaling: rope_ext.Scaling, scaled) -> dict:
    """The effective scaling with the layer types it actually scales (``auto`` and the names it resolves
    to are the same job)."""
    effective = scaling.effective()
    if scaling.name != "none" and scaled is not None:
        effective["layer_types"] = sorted({str(s.layer_type) for s in scaled})
    return effective


def parts(spec: EvalSpec, cfg, path: str = "eval") -> list[tuple[EvalSpec, Any, str]]:
    """(eval, its config node, its config path) of every eval the job runs: the eval itself, or a suite's members."""
    if spec.parts is None:
        return [(spec, cfg, path)]
    return [(part_spec, part, f"{path}.{part_spec.name}") for part_spec, part in spec.parts_of(cfg)]


def eval_identity(spec: EvalSpec, cfg, role: str = "key") -> Any:
    """The eval config as far as it changes a number (``role="key"``), or the number at a given length
    (``role="compare"``): the fields declared otherwise left out; a suite: its members' by name."""
    if spec.parts is None:
        return identity_fields(spec.config, cfg, role)
    return {part_spec.name: identity_fields(part_spec.config, part, role) for part_spec, part, _ in parts(spec, cfg)}


def resolved_config(cfg, spec: EvalSpec, scaling: rope_ext.Scaling, derived: dict | None = None) -> dict:
    """The composed config, its scaling replaced by the resolved one (with its label, and what ``target=`` derived
    and why; ``none`` without the factor it ignores); a suite with the evals it runs only."""
    config = _container(cfg)
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


def _resolve_lengths(spec: EvalSpec, cfg, trained: int, target: int | None = None) -> list[int]:
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


def _hash(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


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
        strategy = rope_ext.STRATEGIES[rope_ext.registry.resolve_name(cfg.scaling.get("name"))]
    geometry = "geometry" in needs or strategy.name != "none"
    if model is None or (geometry and model.slots is None):
        model = resolve_model(cfg.model, geometry=geometry, weights="model" in needs)
    target = parse_target(cfg, model.trained_context)
    if target is not None:
        cfg.verdict.target = target  # the verdict answers for the target
    lengths = _resolve_lengths(spec, cfg.eval, model.trained_context, target)
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
        "versions": {name: _version(name) for name in KEY_PACKAGES},
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
        config=resolved_config(cfg, spec, scaling, derived),
        identity=identity,
        key=_hash(identity),
        out_dir=Path(out_dir),
        logger=cfg.logger,
        force=bool(cfg.force),
        resume_from=tuple(cfg.resume_from),
        multirun=multirun,
        verdict=cfg.verdict,
        target=target_length(cfg.verdict, scaling, model.trained_context, lengths, cfg.scaling.get("factor")),
        compare={name: _hash(fields) for name, fields in compare_fields.items()},
        compare_fields=compare_fields,
        environment=_hash({"versions": identity["versions"], "code": identity["code"]}),
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


def setting_warnings(scaling: rope_ext.Scaling, trained: int, longest: int) -> list[str]:
    """Settings that run but cannot do what they are for at the longest length evaluated, said before the model
    loads (:func:`rope_ext.targets.shortfalls`: a static factor that covers less, an attention-level rule whose last
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
            scaling, setup = set_up(_container(cfg.scaling), model.trained_context, target)
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


def reference_lengths_for(lengths: list[int], trained: int) -> list[int]:
    """The unscaled lengths a verdict on ``lengths`` compares with: each length up to the trained context, and the
    trained context itself only when some length lies beyond it (nothing else: an unneeded reference length
    costs a forward and can clash with the job's own settings, e.g. a sliding ``max_tokens``)."""
    beyond = any(L > trained for L in lengths)
    return sorted({L for L in lengths if L <= trained} | ({trained} if beyond else set()))


def add_trained_context(spec: EvalSpec, cfg, trained: int, scaling: rope_ext.Scaling) -> list[str]:
    """The trained context T added, in place, to the lengths of each eval the verdict judges beyond it, where the
    verdict needs a value there (:func:`evals.core.verdict.judge`): an unscaled job is its own reference, and a
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


def with_eval(job: Job, spec: EvalSpec, cfg) -> Job:
    """The same job running another eval of a suite (same model, scaling, data, output)."""
    return replace(job, eval=spec, eval_cfg=cfg)


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
