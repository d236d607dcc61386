"""What every engine's export shares: the engines and the versions their exports were checked against, and how a
setting or a command is written. The model's :class:`~rope_ext.rotary.native.Geometry`, the context an export serves
and the one-line :class:`~rope_ext.rotary.native.Unsupported` are in :mod:`rope_ext.rotary.native`, beside the
``rope_parameters`` transformers builds from (the patcher reads them too)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..rotary.native import Geometry
    from ..strategies.scaling import Scaling

# the lock the tests run on (`make setup` installs it; tests/test_lock.py checks the running versions are its)
LOCK = Path(__file__).resolve().parents[2] / "requirements.lock"


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares them (``lm_eval`` and ``LM-Eval`` are one)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path = LOCK) -> dict[str, str]:
    """The pins of a lock file (``name==version`` lines): canonical name -> version; {} when there is none (an
    install without the checkout)."""
    if not path.is_file():
        return {}
    pins = (line.split("#", 1)[0].strip().split("==") for line in path.read_text().splitlines())
    return {canonical(pin[0]): pin[1].strip() for pin in pins if len(pin) == 2}


ENGINES = ("transformers", "vllm", "sglang", "llama.cpp")
# the engine versions each export was checked against, and where: transformers loading the exported config.json gives
# the patched model's logits (tests/test_export.py) -- the transformers of the lock, which the tests run on;
# vLLM's and SGLang's own config loading, start-up length check and rotary code, run on the CPU (tests/test_engines.py;
# these versions are also what evals.setup.engines fetches for them); llama-cpp-python running the flags
# (tests/test_llama_cpp*.py; the version the Makefile installs)
VERIFIED = {
    "transformers": read_lock().get("transformers", "(not recorded: requirements.lock is not beside this install)"),
    "vllm": "0.33.0",
    "sglang": "0.5.23",
    "llama.cpp": "llama-cpp-python 0.3.36 (llama.cpp 0c1e570)",
}
CHECKED = {
    "transformers": "transformers {version} loading such a config.json gives the patched model's logits "
    "(rope_ext's tests/test_export.py)",
    "vllm": "vLLM {version}'s own config loading, start-up length check and rotary embedding, run on such overrides "
    "in rope_ext's tests/test_engines.py for {models}",
    "sglang": "SGLang {version}'s own config loading, context-length check and rotary embedding, run on such "
    "overrides in rope_ext's tests/test_engines.py for {models}",
    "llama.cpp": "{version} running such settings in rope_ext's tests/test_llama_cpp.py",
}
# ... and the oldest that reads what the export gives it
MINIMUM = {
    "transformers": "transformers 5.0.0 (rope_parameters)",
    "vllm": "a vLLM with rope_parameters support (PR #28542, 2025-11); an older one ignores the override and "
    "serves plain RoPE",
    "sglang": "SGLang 0.5.23 (older versions not checked)",
    # the host multiplying <arch>.rope.scaling.attn_factor into the rope's magnitude (PR #7225), before PR #17945 as
    # after it; --yarn-attn-factor, which #17945 overwrites, is left at its default 1
    "llama.cpp": "llama.cpp with PR #7225 (2024-05, <arch>.rope.scaling.attn_factor); verified: 0.3.36 only",
}
# the transformers each engine version installs beside it (its wheel's Requires-Dist; tests/test_engines.py reads the
# fetched wheels' metadata and checks these)
ENGINE_TRANSFORMERS = {"vllm": "transformers>=5.16.1,<5.21", "sglang": "transformers==5.19.0"}
# the model families whose vLLM and SGLang modules the tests check (others: "not verified" in deploy/README.md and in
# the per-engine answer)
ENGINE_VERIFIED_MODELS = ("llama", "qwen2", "mistral", "gemma3_text", "deepseek_v3")
ENGINE_VERIFIED_NAMES = "Llama, Qwen2, Mistral, Gemma-3, DeepSeek-V3"
MODEL = "MODEL"  # the placeholder of a command whose model path is not known


def note(geo: Geometry, engine: str, scaling: Scaling | None = None) -> str | None:
    """ "not verified against <engine> <version> ..." where the tests did not run the engine's code path for this
    model family (or this method); None where they did."""
    version = VERIFIED[engine.lower()]
    if scaling is not None and scaling.name == "dca":
        return f"not verified against {engine} {version} (dual chunk attention runs in a GPU attention backend)"
    if geo.model_type in ENGINE_VERIFIED_MODELS:
        return None
    return f"not verified against {engine} {version} for {geo.model_type} (checked: {ENGINE_VERIFIED_NAMES})"


def number(value) -> str:
    return f"{value:.10g}" if isinstance(value, float) else str(value)


def shell(command: list[str], env: dict) -> str:
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return (prefix + " " if prefix else "") + " ".join(shlex.quote(part) for part in command)
