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
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import rope_ext
import torch
from omegaconf import OmegaConf

from .config import DataConfig, LoggerConfig, ModelConfig, check_options
from .data import data_identity
from .errors import ConfigError, scaling_errors_as_user_errors
from .models import (ModelLoadError, RotaryShape, check_attention_hook, gguf_location, meta_model, model_config,
                     model_identity, require_hub, resolve_device, resolve_dtype, rotary_shapes)
from .registry import EVALS, EvalSpec

KEY_PACKAGES = ("torch", "transformers", "gguf", "lm-eval")


@dataclass(frozen=True)
class ModelSpec:
    cfg: Any  # the model config node
    device: torch.device
    dtype: torch.dtype
    trained_context: int
    shapes: tuple[RotaryShape, ...] | None  # every rotary slot (None when the geometry was not needed)
    identity: dict

    @property
    def name(self) -> str:
        return self.cfg.name

    @property
    def label(self) -> str:
        """The model's name, marked when its weights are random (a random run is not the real model)."""
        return self.cfg.name + ("[random]" if self.cfg.weights == "random" else "")


@dataclass(frozen=True)
class Job:
    name: str  # <model>-<scaling label>-<eval>: the W&B run name
    model: ModelSpec
    scaling: rope_ext.Scaling
    scaled: tuple[RotaryShape, ...] | None  # the rotary slots the scaling patches (None: geometry not read)
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
    baseline: "Job | None" = None  # eval.baseline=true: the same job unscaled up to the trained context, run first

    @property
    def trained_context(self) -> int:
        return self.model.trained_context

    def info(self) -> dict:
        """The job as results.json and the report name it."""
        return {"name": self.name, "key": self.key, "model": self.model.name, "model_label": self.model.label,
                "weights": self.model.cfg.weights, "scaling": self.scaling.label, "eval": self.eval.name,
                "data": self.data_cfg.name, "trained_context": self.trained_context}


def _container(node) -> Any:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def parse_model(cfg, geometry: bool, weights: bool) -> ModelSpec:
    """The model's device, dtype, trained context, rotary shapes and identity, without its weights."""
    device = resolve_device(cfg.device) if weights else torch.device("cpu")
    dtype = resolve_dtype(cfg.dtype, device)
    if weights and cfg.weights == "pretrained" and not cfg.path and not gguf_location(cfg):
        require_hub(cfg)
    config = model_config(cfg, allow_architecture=not weights)
    trained = int(cfg.original_max_position or rope_ext.trained_context(config))
    shapes = None
    if geometry or weights:
        model = meta_model(config, cfg.attn_implementation if weights else None)
        try:
            shapes = tuple(rotary_shapes(model)) if geometry else None
        except rope_ext.RotaryNotFoundError as err:
            raise ModelLoadError(f"model '{cfg.name}' ({config.model_type}) has no RoPE rope_ext can patch: {err}") from None
    identity = model_identity(cfg, device, dtype) if weights else {"name": cfg.name, "config": config.to_diff_dict()}
    return ModelSpec(cfg, device, dtype, trained, shapes, identity)


def parse_scaling(cfg, model: ModelSpec, longest: int | None) -> tuple[rope_ext.Scaling, tuple | None]:
    """The scaling resolved once against the model, and its frequencies computed on every slot it patches
    (at the trained length and, for dynamic strategies, beyond it) so any bad value fails now."""
    with scaling_errors_as_user_errors():
        scaling = rope_ext.resolve(_container(cfg), model.trained_context)
        if model.shapes is None:
            return scaling, None
        scaled = tuple(rope_ext.select_slots(model.shapes, scaling.layer_types))
        for shape in scaled:
            scaling.frequencies(shape.dim, shape.base)
            if scaling.dynamic:
                scaling.frequencies(shape.dim, shape.base, max(longest or 0, 2 * model.trained_context))
    return scaling, scaled


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
    files = {str(p) for root in roots for p in root.rglob("*")
             if (p.suffix in (".py", ".yaml") or p.name.endswith("_yaml")) and p.is_file()}
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


def eval_identity(spec: EvalSpec, cfg) -> Any:
    if spec.name == "suite":
        return {"run": list(cfg.run), **{name: _container(cfg[name]) for name in cfg.run}}
    return _container(cfg)


def resolved_config(cfg, scaling: rope_ext.Scaling) -> dict:
    """The composed config, its scaling replaced by the resolved one (with its label; ``none`` without the
    factor it ignores)."""
    config = _container(cfg)
    if config["eval"].get("name") == "suite":  # only the evals it runs
        config["eval"] = {k: v for k, v in config["eval"].items() if k in ("name", "run", *config["eval"]["run"])}
    config["scaling"] = {"label": scaling.label, **({"name": "none", "layer_types": scaling.layer_types}
                                                    if scaling.name == "none" else scaling.to_dict())}
    return config


def parse_job(cfg, out_dir: Path, multirun: bool = False) -> Job:
    """Validate the composed config once and build the job; raises a UserError (one line) on bad input."""
    name = cfg.eval.get("name")
    if name not in EVALS:
        raise ConfigError(f"eval.name={name!r} is not a registered eval; valid: {', '.join(sorted(EVALS))}")
    spec = EVALS[name]
    check_options(cfg.model, ModelConfig, "model")
    check_options(cfg.data, DataConfig, "data")
    check_options(cfg.logger, LoggerConfig, "logger")
    check_options(cfg.eval, spec.config, "eval")
    needs = spec.needs_for(cfg.eval)
    with scaling_errors_as_user_errors():
        strategy = rope_ext.STRATEGIES[rope_ext.strategies.resolve_name(cfg.scaling.get("name"))]
    model = parse_model(cfg.model, geometry="geometry" in needs or strategy.name != "none", weights="model" in needs)
    lengths = [int(L) for L in cfg.eval.get("lengths") or [] if isinstance(L, int)]
    scaling, scaled = parse_scaling(cfg.scaling, model, max(lengths, default=None))
    if scaling.scales_query:
        check_attention_hook(cfg.model, f"scaling '{scaling.label}' scales queries inside attention")
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
    key = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
    job = Job(name=f"{model.label}-{scaling.label}-{spec.name}", model=model, scaling=scaling, scaled=scaled, eval=spec,
              eval_cfg=cfg.eval, data_cfg=cfg.data, seed=cfg.seed, config=resolved_config(cfg, scaling),
              identity=identity, key=key, out_dir=Path(out_dir), logger=cfg.logger, force=bool(cfg.force),
              resume_from=tuple(cfg.resume_from), multirun=multirun)
    if spec.check:
        spec.check(cfg.eval, job)
    return replace(job, baseline=parse_baseline(cfg, job))


def parse_baseline(cfg, job: Job) -> Job | None:
    """``eval.baseline=true``: the same model, eval and data unscaled at the lengths up to the trained context
    -- the reference of short-context retention (LongRoPE2, arXiv 2502.20082). Its directory is the sweep's
    ``baseline/<key>/`` (a single run's own), so a sweep computes it once and later jobs reuse it."""
    if not cfg.eval.get("baseline") or job.scaling.name == "none":
        return None
    lengths = [int(L) for L in cfg.eval.lengths]
    short = [L for L in lengths if L <= job.trained_context]
    if not short:
        raise job.eval.error(f"eval.baseline=true compares lengths up to the trained context ({job.trained_context}) "
                             f"with the unscaled model; eval.lengths={lengths} has none")
    base = OmegaConf.to_container(cfg, resolve=True)
    base["scaling"] = {"name": "none"}
    base["eval"].update(lengths=short, baseline=False)
    if base["eval"].get("protocol") == "sliding" and base["eval"].get("max_tokens") is None:
        base["eval"]["max_tokens"] = max(lengths)  # the same tokens as the job (null: its longest length)
    key_tokens = base["eval"].get("key_tokens") or {}
    if base["eval"].get("longppl") and key_tokens["short_context"] + key_tokens["stride"] >= max(short):
        base["eval"]["longppl"] = False  # no key token within the trained context: nothing to retain
    base["force"] = False  # reused whenever its key matches: one baseline per sweep
    root = job.out_dir.parent if job.multirun else job.out_dir
    provisional = parse_job(OmegaConf.create(base), root / "baseline", job.multirun)
    # one directory per reference, named by its key: every job of a sweep (any model, data) finds its own
    return replace(provisional, out_dir=root / "baseline" / provisional.key[:12])


def with_eval(job: Job, spec: EvalSpec, cfg) -> Job:
    """The same job running another eval of a suite (same model, scaling, data, output)."""
    return replace(job, eval=spec, eval_cfg=cfg)


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
