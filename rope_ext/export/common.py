"""What every engine's export shares: the engines and the versions their exports were checked against, the model's
:class:`Geometry`, the context an export serves and the one-line :class:`Unsupported`."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from ..scaling import Compose, Scaling

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


class Unsupported(ValueError):
    """An engine that cannot express a scaling: the message says why, in one line."""


@dataclass(frozen=True)
class Geometry:
    """What an export needs to know of the model: its type, trained context, rotary dim, base and layer types
    (None: one shared rotary), and the layer types the scaling applies to."""

    model_type: str
    trained: int
    dim: int
    base: float
    layer_types: tuple[str, ...] | None = None
    scaled_types: tuple[str, ...] | None = None
    unexportable: str | None = None  # why no engine config can describe the scaled rotary (:func:`unexportable`)


def geometry(model_or_config, scaling: Scaling, slots=None, trained: int | None = None, scaled=None) -> Geometry:
    """The :class:`Geometry` of a transformers model (or its config with ``slots``, and the ``scaled`` ones, as a job
    resolves and selects them): the rotary dim and base of the slots the scaling patches (Gemma-3: the global
    layers')."""
    from ..slots import find_rotary_slots, select_slots, trained_context

    config = getattr(model_or_config, "config", model_or_config)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    slots = list(slots if slots is not None else find_rotary_slots(model_or_config))
    if scaled is None:
        scaled = select_slots(slots, scaling.layer_types) if scaling.name != "none" else slots
    types = sorted({s.layer_type for s in slots if s.layer_type is not None}) or None
    scaled_types = sorted({s.layer_type for s in scaled if s.layer_type is not None}) or None
    return Geometry(
        config.model_type,
        int(trained or trained_context(config)),
        scaled[0].dim,
        float(scaled[0].base),
        tuple(types) if types else None,
        tuple(scaled_types) if scaled_types else None,
        unexportable(scaled, config),
    )


def unexportable(scaled, config) -> str | None:
    """Why an engine's config cannot describe the scaled slots (one line; None where it can): a sin/cos table
    (GPT-J, CodeGen: their rotary reads no rope_parameters), pairs held still (proportional RoPE: a
    partial_rotary_factor would rotate other pairs), or frequencies of another base than the config's rope_theta (an
    odd rotary dim: the engine recomputes over its own)."""
    parameters = getattr(config, "rope_parameters", None) or {}
    parameters = parameters if isinstance(parameters, dict) else {}
    for slot in scaled:
        own = parameters.get(slot.layer_type) if isinstance(parameters.get(slot.layer_type), dict) else parameters
        theta = own.get("rope_theta") or (None if slot.layer_type else getattr(config, "rope_theta", None))
        if slot.table:
            why = f"its rotary is a sin/cos table ({slot.table}) that reads no rope_parameters"
        elif slot.still:
            why = f"its rotary holds {slot.still} pairs still (proportional RoPE), which rope_parameters cannot say"
        elif theta and abs(float(slot.base) / float(theta) - 1) > 1e-4:  # a float32 read of the base: ~1e-6
            why = f"its frequencies have base {float(slot.base):.6g}, not the config's rope_theta {float(theta):g}"
        else:
            continue
        return f"{config.model_type}: not exported: {why}; the measured model is rope_ext's patch alone"
    return None


def covered(scaling: Scaling, trained: int) -> int:
    """The context the scaled model is set up for: trained x factor (the trained context without a factor)."""
    factor = scaling.factor or 1.0
    return round(trained * factor)


def trained_of(scaling: Scaling, geo: Geometry) -> int:
    """The trained context the scaling was resolved with (scaling.original_max_position), else the model's."""
    return int(scaling.params.get("original_max_position") or geo.trained)


def served(scaling: Scaling, geo: Geometry, context: int | None) -> int:
    """The context an engine is asked to serve: ``context`` (the length the job's verdict judged, e.g. the target),
    else what the scaling covers (:func:`covered`)."""
    return int(context) if context else covered(scaling, trained_of(scaling, geo))


def table(scaling: Scaling, geo: Geometry, context: int | None) -> int:
    """``max_position_embeddings``: at least what the scaling covers (YaRN and LongRoPE in transformers derive their
    defaults from it), at least the context served (vLLM's cos/sin table of ``default``/``llama3`` has that many
    rows; its start-up check and SGLang's read it)."""
    return max(covered(scaling, trained_of(scaling, geo)), served(scaling, geo, context))


def why_not(scaling: Scaling) -> str:
    """Why no config key expresses a strategy (one clause)."""
    kind = scaling.strategy.kind
    if isinstance(scaling, Compose):
        return "a composition of stages has no rope type"
    if kind == "attention":
        return "an attention-level method changes which relative position each pair sees, not the frequencies"
    if kind == "query":
        return "query scaling inside attention has no config key"
    return f"no rope type computes '{scaling.name}' frequencies"


def scaled_types(scaling: Scaling, geo: Geometry) -> tuple[str, ...] | None:
    if geo.layer_types is None:
        return None
    return geo.scaled_types if geo.scaled_types is not None else geo.layer_types


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
