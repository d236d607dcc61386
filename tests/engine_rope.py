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
``rope_theta`` with rope_type ``default``), or, for DeepSeek-V3 (``case["mla"]``), builds the engine's own MLA
attention module (vllm deepseek_v2.py ``DeepseekV2MLAAttention``, sglang deepseek_v2.py ``DeepseekV2AttentionMLA``)
and reads its rotary embedding and the softmax scale it hands its attention, and rotates q and k with
``forward_native`` (the
PyTorch path; the CUDA kernels compute the same table lookup). The output per case: the rotated q/k, or the error
the engine raised at start-up.

Stubs, only for what has no CPU build (kept minimal); for the DeepSeek module also the packages of
``VLLM_STUBS``/``SGLANG_STUBS`` (imported at module level, not run here) and, in the attention module built, its
projections, norms and attention kernel wrapper (placeholders that receive their arguments: the scale is read there)
and the parallel state (one rank):
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


# packages absent from the fetched code and its deps that the DeepSeek model modules import at module level (JSON
# grammars, the HTTP server, tensor reshaping, SGLang's CUDA kernels and OpenAI protocol): none runs on this path
VLLM_STUBS = ("xgrammar", "fastapi", "partial_json_parser", "llguidance", "einops")
SGLANG_STUBS = (
    "triton",
    "torchvision",
    "einops",
    "sgl_kernel",
    "openai",
    "partial_json_parser",
    "sglang.srt.entrypoints.openai.protocol",
)


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots):
        self.roots = roots

    def find_spec(self, name, path, target=None):
        if any(name == root or name.startswith(root + ".") for root in self.roots):
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
    if case.get("mla"):
        return _vllm_mla(case, config, text)
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


class _Layer:
    """A projection or norm of an attention module (weights only; no rope or scale): built on no device."""

    quant_method = None

    def __init__(self, *args, **kwargs):
        pass


def _mla_sizes(text) -> dict:
    """The sizes both engines' DeepSeek decoder layers pass their attention, from the config."""
    return dict(
        hidden_size=text.hidden_size,
        num_heads=text.num_attention_heads,
        qk_nope_head_dim=text.qk_nope_head_dim,
        qk_rope_head_dim=text.qk_rope_head_dim,
        v_head_dim=text.v_head_dim,
        q_lora_rank=text.q_lora_rank if hasattr(text, "q_lora_rank") else None,
        kv_lora_rank=text.kv_lora_rank,
    )


def _vllm_mla(case, config, text):
    """vLLM's DeepSeek MLA attention (deepseek_v2.py ``DeepseekV2MLAAttention.__init__``, called as its
    ``DeepseekV2DecoderLayer`` does): its rope-type rewrite, ``get_rope`` and softmax scale, run as they are; the
    projections and the attention wrapper (which receives the scale) are placeholders."""
    from types import SimpleNamespace

    from vllm.config import set_current_vllm_config
    from vllm.config.compilation import CompilationConfig
    from vllm.model_executor.models import deepseek_v2

    seen = {}

    def wrapper(hidden_size, num_heads, scale, *args, **kwargs):  # MultiHeadLatentAttentionWrapper: the scale it gets
        seen["scale"] = scale

    for name in ("DeepSeekV2FusedQkvAProjLinear", "ReplicatedLinear", "ColumnParallelLinear", "RowParallelLinear"):
        setattr(deepseek_v2, name, _Layer)
    deepseek_v2.RMSNorm, deepseek_v2.MultiHeadLatentAttentionWrapper = _Layer, wrapper
    deepseek_v2.get_tensor_model_parallel_world_size = lambda: 1
    parallel = SimpleNamespace(dcp_q_replicate=False, decode_context_parallel_size=1, prefill_context_parallel_size=1)
    vllm_config = SimpleNamespace(parallel_config=parallel, compilation_config=CompilationConfig(custom_ops=["none"]))
    with set_current_vllm_config(vllm_config):
        attention = deepseek_v2.DeepseekV2MLAAttention(
            vllm_config=vllm_config,
            config=config,
            **_mla_sizes(text),
            max_position_embeddings=getattr(text, "max_position_embeddings", 8192),
            cache_config=None,
            quant_config=None,
            prefix="model.layers.0.self_attn",
        )
    q, k = attention.rotary_emb.forward_native(case["positions"], case["q"].clone(), case["k"].clone())
    return q, k, seen["scale"]


def _sglang_mla(case, config, text):
    """SGLang's DeepSeek MLA attention (deepseek_v2.py ``DeepseekV2AttentionMLA.__init__``, given the rope theta and
    scaling as ``DeepseekV2DecoderLayer.__init__`` reads them from ``config.rope_parameters``): its rope-type rewrite,
    ``get_rope_wrapper`` (the GPU servers' ``get_rope``) and softmax scale (``compute_mla_mscale_scaling``), run as
    they are; the projections and the attention (``RadixAttention``, which receives the scale) are placeholders, and
    the forward-method set-up after them does not run."""
    from types import SimpleNamespace

    import torch
    from sglang.srt.models import deepseek_v2

    seen = []

    class Radix(_Layer):  # RadixAttention: the scale it gets
        def __init__(self, num_heads, head_dim, scaling, *args, **kwargs):
            seen.append(scaling)

    for name in ("ReplicatedLinear", "ColumnParallelLinear", "RowParallelLinear", "RMSNorm"):
        setattr(deepseek_v2, name, _Layer)
    deepseek_v2.RadixAttention = Radix
    deepseek_v2.get_parallel = lambda: SimpleNamespace(attn_tp_size=1, attn_dcp_size=1)
    deepseek_v2.get_model = lambda: SimpleNamespace(kv_cache_dtype=torch.bfloat16)
    deepseek_v2.get_device = lambda: SimpleNamespace(device="cuda")  # a GPU server's rotary (get_rope)
    attention_class = deepseek_v2.DeepseekV2AttentionMLA
    for name in ("init_mha_forward", "init_mla_forward", "init_mla_fused_rope_rocm_forward"):
        setattr(attention_class, name, lambda self: None)
    attention_class.init_mla_fused_rope_cpu_forward = lambda self: None
    # DeepseekV2DecoderLayer.__init__: what it passes the attention
    rope_theta = text.rope_parameters["rope_theta"]
    rope_scaling = text.rope_parameters if text.rope_parameters.get("rope_type") != "default" else None
    attention = attention_class(
        config=text,
        **_mla_sizes(text),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=text.max_position_embeddings,
        layer_id=0,
        prefix="model.layers.0.self_attn",
    )
    assert len(set(seen)) == 1, seen  # its MQA and MHA attentions get the same scale
    q, k = attention.rotary_emb.forward_native(case["positions"], case["q"].clone(), case["k"].clone())
    return q, k, seen[0]


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
    if case.get("mla"):
        return _sglang_mla(case, config, text)
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
        sys.meta_path.insert(0, _Stubs(VLLM_STUBS))
    else:
        os.environ["SGLANG_USE_CPU_ENGINE"] = "1"  # SGLang's own CPU platform (no CUDA kernel is looked up)
        sys.meta_path.insert(0, _Stubs(SGLANG_STUBS))
        stub = types.ModuleType("sglang.srt.multimodal.internvl_utils")
        stub.IMAGENET_MEAN, stub.IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
        sys.modules[stub.__name__] = stub
    import torch

    run = _vllm if engine == "vllm" else _sglang
    results = []
    for case in torch.load(cases_file, weights_only=False):
        try:
            q, k, *scale = run(case)
            result = {"q": q, "k": k, "transformers": sys.modules["transformers"].__version__}
            results.append({**result, "scale": scale[0]} if scale else result)
        except Exception as err:  # the engine's start-up refusal, reported to the test
            results.append({"error": f"{type(err).__name__}: {err}"})
    torch.save(results, out_file)


if __name__ == "__main__":
    main(*sys.argv[1:])
