"""A scaling as the engines that serve models take it: transformers' ``config.json``
(:mod:`~rope_ext.rotary.native`), vLLM and SGLang (:mod:`~rope_ext.export.servers`) and llama.cpp
(:mod:`~rope_ext.export.llamacpp`); what they share (engine versions, the model's geometry, the context served) in
:mod:`~rope_ext.export.common`.

Each engine gets the exact settings that reproduce the strategy, or, where it cannot express one, a one-line
reason (:class:`Unsupported`) instead of an approximation; each is asked to serve ``context`` (the length a job's
verdict judged; else what the scaling covers, trained x factor) and names the ``model`` it serves where it is known.
"""

from __future__ import annotations

from ..strategies.scaling import Scaling
from ..rotary.native import Geometry, Unsupported, covered, geometry
from .common import CHECKED, ENGINE_TRANSFORMERS, ENGINE_VERIFIED_MODELS, ENGINES, MINIMUM, MODEL, VERIFIED
from ..rotary.native import rope_parameters, transformers_config
from .llamacpp import LLAMA_CPP_ARCH, LLAMA_CPP_SCALING_TYPE, llama_cpp
from .servers import QWEN2_FAMILY, sglang, vllm

__all__ = [
    "CHECKED",
    "ENGINE_TRANSFORMERS",
    "ENGINE_VERIFIED_MODELS",
    "ENGINES",
    "LLAMA_CPP_ARCH",
    "LLAMA_CPP_SCALING_TYPE",
    "MINIMUM",
    "MODEL",
    "QWEN2_FAMILY",
    "VERIFIED",
    "Geometry",
    "Unsupported",
    "covered",
    "export",
    "geometry",
    "llama_cpp",
    "rope_parameters",
    "sglang",
    "transformers_config",
    "vllm",
]


def export(
    scaling: Scaling,
    geo: Geometry,
    engine: str,
    model_config: dict | None = None,
    context: int | None = None,
    model: str | None = None,
) -> dict:
    """The settings ``engine`` needs for ``scaling`` on a model of geometry ``geo``, serving ``context`` tokens (None:
    what the scaling covers) of ``model`` (a path or hub id; None: a placeholder); every answer but transformers' has
    ``"context"``; Unsupported (one line) where the engine cannot express them."""
    if engine in ENGINES and geo.unexportable:
        raise Unsupported(geo.unexportable)
    if engine == "transformers":
        return {"config": transformers_config(scaling, geo, model_config, context)}
    if engine == "vllm":
        return vllm(scaling, geo, model_config, context, model or MODEL)
    if engine == "sglang":
        return sglang(scaling, geo, model_config, context, model or MODEL)
    if engine == "llama.cpp":
        return llama_cpp(scaling, geo, context, model or "MODEL.gguf")
    raise ValueError(f"unknown engine {engine!r}; valid: {', '.join(ENGINES)}")
