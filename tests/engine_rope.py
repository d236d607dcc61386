"""What vLLM or SGLang does with an exported setting, computed by the engine's own code on the CPU (run by
tests/test_engines.py in its own process, with the engine's code fetched by ``evals.setup.engines``):

    python tests/engine_rope.py vllm|sglang SRC:DEPS CASES.pt OUT.pt

Each case names a saved model folder, the override the export gives the engine, the context it asks for, and q/k
to rotate. The engine loads the config and applies the override its own way (vLLM: ``get_config`` with the flat
keys, ``ModelConfig._apply_dict_overrides`` with the dict ones; SGLang: ``get_config`` with
``model_override_args``), runs its start-up length check (vLLM ``_get_and_verify_max_len``, SGLang
``ModelConfig._derive_context_length``), builds the rotary embedding with its ``get_rope`` from the config as its
Llama/Qwen2/Mistral module does (vllm/model_executor/models/llama.py ``_init_rotary_emb``, mistral.py subclasses it;
sglang/srt/models/llama.py ``LlamaDecoderLayer.__init__``, qwen2.py ``get_rope_config``, mistral.py subclasses
Llama) or its Gemma-3 module does for a ``full_attention`` layer (vllm gemma3.py ``Gemma3Attention.__init__``:
``rope_parameters[layer_type]``; sglang gemma3_causal.py ``Gemma3Attention.__init__``: the layer type's
``rope_theta`` with rope_type ``default``), and rotates q and k with ``forward_native`` (the
PyTorch path; the CUDA kernels compute the same table lookup). The output per case: the rotated q/k, or the error
the engine raised at start-up.

Stubs, only for what has no CPU build (kept minimal):
- vLLM: ``vllm._aiter_ops`` (ROCm AITER kernels; the rotary base class asks it whether a ROCm kernel is enabled:
  False).
- SGLang (run with ``SGLANG_USE_CPU_ENGINE=1``, its CPU platform): ``triton`` and ``torchvision`` (module-level imports of sglang.srt.utils and of vision-language configs; no
  kernel or transform runs on this path) as attribute placeholders, and ``sglang.srt.multimodal.internvl_utils``
  (image normalisation constants for a VLM config).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types


class _Placeholder:
    """Any attribute, call or subscript of a stubbed module: a placeholder (decorators return the function)."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, key):
        if key.startswith("__"):
            raise AttributeError(key)
        return _PlaceholderType(key, (), {}) if key[:1].isupper() else _Placeholder(f"{self._name}.{key}")

    def __call__(self, *args, **kwargs):
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else _Placeholder(self._name + "()")

    def __getitem__(self, key):
        return _Placeholder(self._name + "[]")


class _PlaceholderType(type):
    # classes of a stubbed module (isinstance checks, enum-like attributes)
    def __getattr__(cls, key):
        if key.startswith("__"):
            raise AttributeError(key)
        return f"{cls.__name__}.{key}"


class _StubModule(types.ModuleType):
    def __getattr__(self, key):
        if key.startswith("__"):
            raise AttributeError(key)
        if key[:1].isupper() or key.startswith("_J"):  # torch checks isinstance(x, triton's _JITFunction)
            return _PlaceholderType(key, (), {})
        return _Placeholder(f"{self.__name__}.{key}")


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots):
        self.roots = roots

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__, module.__version__ = [], "0.0.0"
        return module

    def exec_module(self, module):
        pass


def _vllm(case):
    from types import SimpleNamespace

    from vllm.config import set_current_vllm_config
    from vllm.config.compilation import CompilationConfig
    from vllm.config.model import ModelConfig, _get_and_verify_max_len
    from vllm.model_executor.layers.rotary_embedding import get_rope
    from vllm.transformers_utils.config import get_config, get_hf_text_config
    from vllm.transformers_utils.model_arch_config_convertor import (
        MODEL_ARCH_CONFIG_CONVERTORS,
        ModelArchConfigConvertorBase,
    )

    overrides = case["overrides"]
    flat = {k: v for k, v in overrides.items() if not isinstance(v, dict)}
    config = get_config(case["model"], False, hf_overrides_kw=flat)
    ModelConfig._apply_dict_overrides(None, config, {k: v for k, v in overrides.items() if isinstance(v, dict)})
    text = get_hf_text_config(config)
    convertor = MODEL_ARCH_CONFIG_CONVERTORS.get(config.model_type, ModelArchConfigConvertorBase)
    arch = convertor(config, text, revision=None).convert(supports_multimodal=False)
    _get_and_verify_max_len(text, arch, None, case["context"], False, None)
    # a CustomOp reads the current config's compilation settings when built: custom ops off, i.e. the native path
    # that forward_native runs (a whole VllmConfig()
    # would import the structured-output stack)
    rope_parameters = getattr(text, "rope_parameters", None)
    if case.get("layer_type"):  # gemma3.py: config.rope_parameters[layer_type]
        rope_parameters = rope_parameters[case["layer_type"]]
    with set_current_vllm_config(SimpleNamespace(compilation_config=CompilationConfig(custom_ops=["none"]))):
        rope = get_rope(
            case["head_dim"],
            max_position=text.max_position_embeddings,
            rope_parameters=rope_parameters,
            is_neox_style=True,
        )
    return rope.forward_native(case["positions"], case["q"].clone(), case["k"].clone())


def _sglang(case):
    from types import SimpleNamespace

    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.layers.rotary_embedding import get_rope
    from sglang.srt.utils.hf_transformers.common import get_hf_text_config, get_rope_config
    from sglang.srt.utils.hf_transformers.config import get_config

    config = get_config(case["model"], trust_remote_code=False, model_override_args=dict(case["overrides"]))
    text = get_hf_text_config(config)
    ModelConfig._derive_context_length(
        SimpleNamespace(is_draft_model=False, hf_text_config=text, hf_config=config), case["context"]
    )
    if case.get("layer_type"):  # gemma3_causal.py: the layer type's rope_theta, rope_type default, whatever the config
        rope_theta, rope_scaling = text.rope_parameters[case["layer_type"]].get("rope_theta"), {"rope_type": "default"}
    else:
        rope_theta, rope_scaling = get_rope_config(text)
    if (
        text.model_type in ("llama", "mistral")  # sglang's Mistral is its Llama
        and rope_scaling is not None
        and getattr(text, "original_max_position_embeddings", None)
    ):
        # sglang/srt/models/llama.py: a top-level original_max_position_embeddings replaces the rope dict's
        rope_scaling["original_max_position_embeddings"] = text.original_max_position_embeddings
    rope = get_rope(
        case["head_dim"],
        rotary_dim=case["head_dim"],
        max_position=getattr(text, "max_position_embeddings", 8192),
        base=rope_theta,
        rope_scaling=rope_scaling,
        is_neox_style=True,
    )
    return rope.forward_native(case["positions"], case["q"].clone(), case["k"].clone())


def main(engine: str, paths: str, cases_file: str, out_file: str) -> None:
    sys.path[:0] = paths.split(":")
    if engine == "vllm":
        stub = types.ModuleType("vllm._aiter_ops")
        stub.rocm_aiter_ops = types.SimpleNamespace(
            is_triton_rotary_embed_enabled=lambda: False, get_triton_rotary_embedding_op=lambda: None
        )
        sys.modules[stub.__name__] = stub
    else:
        os.environ["SGLANG_USE_CPU_ENGINE"] = "1"  # SGLang's own CPU platform (no CUDA kernel is looked up)
        sys.meta_path.insert(0, _Stubs(("triton", "torchvision")))
        stub = types.ModuleType("sglang.srt.multimodal.internvl_utils")
        stub.IMAGENET_MEAN, stub.IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
        sys.modules[stub.__name__] = stub
    import torch

    run = _vllm if engine == "vllm" else _sglang
    results = []
    for case in torch.load(cases_file, weights_only=False):
        try:
            q, k = run(case)
            results.append({"q": q, "k": k, "transformers": sys.modules["transformers"].__version__})
        except Exception as err:  # the engine's start-up refusal, reported to the test
            results.append({"error": f"{type(err).__name__}: {err}"})
    torch.save(results, out_file)


if __name__ == "__main__":
    main(*sys.argv[1:])
