"""Attention-level methods on transformers' own families (tiny, random weights): the hook recomputes attention as the
model does, and a method that would change nothing is an error.

- Self-Extend with group size 1 and DCA with one chunk are the identity: patched == plain model to 1e-5, on families
  of every shape the hook meets -- full rotary, partial rotary (Phi-3, GPT-NeoX, GLM), interleaved pairs (Cohere),
  multi-head latent attention with a rope sub-dimension and a value head of another size (DeepSeek-V3, MiniCPM3),
  q/k norms (Qwen3, OLMoE), sliding + global layers (Gemma-3). The slow test runs every causal-LM model type of the
  installed transformers that defines a rotary embedding.
- Self-Extend against an independent dense implementation: the paper's positions (m - n < W: own; beyond,
  m // G + W - W // G and n // G), the q and k at those positions computed by the model itself (the same layer
  inputs, the model's own rotary at other position ids), one dense softmax per layer -- no rope_ext code in it.
- GPT-NeoX-Japanese's attention does not call the interface: patching it is a one-line error naming its attention.
"""

import importlib

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.configuration_auto import model_type_to_module_name
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

import rope_ext
from evals.families import switched_on
from evals.family_sizes import tiny_arguments

TOKENS = 40
TRAINED = 64
SMALL = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=100,
    max_position_embeddings=TRAINED,
    # MoE and multi-head latent attention sizes, read only by the families that have them
    moe_intermediate_size=32,
    n_routed_experts=4,
    num_experts=4,
    num_local_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
    q_lora_rank=None,
    kv_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=12,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
# the few families that need more than SMALL to build tiny (or to show what they are about)
SPECIAL = {
    "gemma3_text": dict(head_dim=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"]),
    "olmoe": dict(head_dim=16),  # its q/k norms are sized from hidden_size / heads
    "phi3": dict(partial_rotary_factor=0.5),
    "falcon": dict(new_decoder_architecture=True),  # grouped key/value heads, on the attention interface since 5.25
    "gptj": dict(rotary_dim=8),  # partial rotary (the default 64 exceeds the tiny head)
    "codegen": dict(rotary_dim=8),
    "helium": dict(head_dim=16),
    "bamba": dict(attn_layer_indices=[1]),  # no attention layer by default
    "recurrent_gemma": dict(block_types=["recurrent", "attention"]),
    "lfm3": dict(layer_types=["sliding_attention", "full_attention"], sliding_window=8),  # 2 conv layers otherwise
    "flint": dict(layer_types=["full_attention", "sliding_attention"], sliding_window=8),  # its full layers are NoPE
    "zaya": dict(num_experts_per_tok=1, head_dim=16),  # the only value it takes; 128 by default
    "kolibri1_1": dict(index_num_heads=2),  # its indexer's heads are query heads of one key head (12 by default)
    "ergo": dict(first_dense_intermediate_size=96, shared_intermediate_size=32, num_experts=8),
    # MLA whose config requires a query low-rank projection (DeepSeek-V3.2 and kin: a sparse-attention indexer reads it)
    **{t: dict(q_lora_rank=16) for t in ("axk1", "axk2", "deepseek_v32", "deepseek_v4", "glm_moe_dsa", "hy_v4")},
    "longcat_flash": dict(q_lora_rank=16),
    **{t: dict(q_lora_rank=16, num_key_value_heads=4) for t in ("dots3_note", "dots3_note_text")},
    # its rotary is sized from head_dim (256 by default; the frequency suite's TINY gives 16), within its indexer's head
    "qwen4_exp": dict(head_dim=16),
    "qwen4_exp_text": dict(head_dim=16, layer_types=["linear_attention", "full_attention"]),
    "hunyuan_v1_dense": dict(head_dim=16),  # None by default: sized from hidden_size / heads in the model only
    "hunyuan_v1_moe": dict(head_dim=16),
    "ministral": dict(head_dim=16),
    # hybrids whose first two layers are linear attention: one of each kind
    "bailing_hybrid": dict(layer_types=["linear_attention", "full_attention"]),
    "qwen3_next": dict(layer_types=["linear_attention", "full_attention"]),
    "qwen3_5_text": dict(layer_types=["linear_attention", "full_attention"]),
    "qwen3_5_moe_text": dict(layer_types=["linear_attention", "full_attention"]),
    # its per-layer input embeddings are sized apart (262,144 x 256 by default)
    "gemma4_text": dict(
        vocab_size_per_layer_input=100,
        hidden_size_per_layer_input=16,
        head_dim=16,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
    ),
    "gpt_neox": dict(rotary_pct=0.25),
    "deepseek_v3": dict(first_k_dense_replace=1),
    # its default split (8 input + 8 output layers around a looped middle) exceeds 2 layers: transformers then runs
    # each layer twice under one cache index, the second pass attending 80 keys at 40 positions -- a model no
    # checkpoint is; one layer each way and one looped between (run twice, its own cache copy per loop)
    "dory": dict(num_hidden_layers=3, n_input_layers=1, n_output_layers=1),
}


def small(model_type, more=None) -> dict:
    """The config's arguments at SMALL's sizes with the compatibility suite's cuts and fixes (evals.families: experts,
    indexers, per-layer inputs, a composite's towers, what a default config lacks), then this file's SPECIAL."""
    return tiny_arguments(model_type, {**SMALL, **SPECIAL.get(model_type, {}), **(more or {})})


DEFAULT = ["llama", "gemma3_text", "deepseek_v3", "phi3", "olmoe", "cohere", "ministral3"]


def build(model_type, implementation="sdpa", seed=0):
    extra = SPECIAL.get(model_type, {})
    config = AutoConfig.for_model(model_type, **small(model_type))
    # MLA (the family's own config has a rope sub-dimension; SMALL's MLA sizes become attributes of every config):
    # every head a query head
    if getattr(AutoConfig.for_model(model_type), "qk_rope_head_dim", None) and "head_dim" not in extra:
        mla = {"num_key_value_heads": 4, "head_dim": config.qk_rope_head_dim}
        config = AutoConfig.for_model(model_type, **small(model_type, mla))
    torch.manual_seed(seed)
    try:
        model = AutoModelForCausalLM.from_config(config, attn_implementation=implementation)
    except ValueError as err:  # softcapping, sinks, ... : families that have eager attention only
        if "does not support an attention implementation" not in str(err):
            raise
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return switched_on(model.eval())


def tokens(length=TOKENS):
    return torch.randint(3, 100, (1, length), generator=torch.Generator().manual_seed(1))


IDENTITIES = {
    "self_extend": {"name": "self_extend", "group_size": 1, "window": 8},  # grouped positions = own positions
    "dca": {"name": "dca", "chunk_size": 2 * TOKENS, "local_window": 4},  # one chunk holds every token
}


def identity_errors(model) -> dict:
    ids = tokens()
    with torch.no_grad():
        plain = model(ids).logits
        errors = {}
        for name, scaling in IDENTITIES.items():
            with rope_ext.patch(model, scaling, original_max_position=TRAINED):
                errors[name] = float((model(ids).logits - plain).abs().max())
            assert torch.equal(model(ids).logits, plain)  # restored exactly
    return errors


@pytest.mark.parametrize("model_type", DEFAULT)
def test_identity_methods_leave_the_model_exactly_as_it_was(model_type):
    model = build(model_type)
    assert max(identity_errors(model).values()) <= 1e-5
    # and the method is not a no-op: group size 4 moves the logits
    with torch.no_grad(), rope_ext.patch(model, {"name": "self_extend", "group_size": 4, "window": 8}, TRAINED):
        moved = model(tokens()).logits
    with torch.no_grad():
        assert float((moved - model(tokens()).logits).abs().max()) > 1e-4


def _attention_modules(model) -> dict:
    return {name: model.get_submodule(name) for name in rope_ext.probe(model).called}


def _input_hooks(modules, record=None, replace=None, outputs=None) -> list:
    """Forward hooks on the attention modules: record or replace their hidden-states input, record their output."""
    handles = []
    for name, module in modules.items():

        def before(mod, args, kwargs, name=name):
            hidden = args[0] if args else kwargs["hidden_states"]
            if record is not None:
                record.setdefault(name, hidden.detach().clone())  # not the layout read inside the patched call
            if replace is not None:
                hidden = replace[name]
                return ((hidden, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": hidden})

        handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
        if outputs is not None:
            handles.append(
                module.register_forward_hook(lambda mod, a, out, name=name: outputs.__setitem__(name, out[0]))
            )
    return handles


DENSE = [
    "llama",
    "gemma3_text",
    "deepseek_v3",
    "phi3",
    "gpt_neox",
    "gptj",
    "doge",
    "beam",
    "deepseek_v2",
    "llama4_text",
    # a sparse-attention indexer (QSA) masks keys out of the causal mask, at times the last query's own: the keys'
    # positions are read from the mask the module was given
    "qwen4_exp_text",
]


@pytest.mark.parametrize("model_type", DENSE)
def test_self_extend_equals_an_independent_dense_implementation(model_type):
    group, window = 4, 8
    model = build(model_type, implementation="eager")  # eager: every mask (causal, sliding) materialised
    modules = _attention_modules(model)
    ids = tokens()
    inputs, patched = {}, {}
    with (
        torch.no_grad(),
        rope_ext.patch(model, {"name": "self_extend", "group_size": group, "window": window}, TRAINED) as p,
    ):
        handles = _input_hooks(modules, record=inputs, outputs=patched)
        model(ids, use_cache=False)
        selected = p.attention_slots()
    for h in handles:
        h.remove()
    # the model's own q and k at the paper's grouped positions, from the same layer inputs
    m = torch.arange(TOKENS)
    positions = {"query": m // group + window - window // group, "key": m // group}
    seen = {}
    for which, position_ids in positions.items():
        handles = _input_hooks(modules, replace=inputs)
        with (
            torch.no_grad(),
            rope_ext.hook_attention(model, lambda call, w=which: seen.__setitem__((w, call.name), call)),
        ):
            model(ids, position_ids=position_ids[None], use_cache=False)
        for h in handles:
            h.remove()

    def dense(call):
        q, k, v = call.query.double(), call.key.double(), call.value.double()
        q_far, k_far = seen["query", call.name].query.double(), seen["key", call.name].key.double()
        rep = q.shape[1] // k.shape[1]
        k, v, k_far = (x.repeat_interleave(rep, 1) for x in (k, v, k_far))
        distance = m[:, None] - m[None, :]
        # NoPE layers (Beam's full attention: no rotation given) keep their own attention
        applies = call.rotation is not None and (selected is None or call.slot() in selected)
        grouped = (distance >= window) if applies else torch.zeros_like(distance, dtype=torch.bool)
        scores = torch.where(grouped, q_far @ k_far.transpose(-1, -2), q @ k.transpose(-1, -2)) * call.scaling
        mask = call.attention_mask
        allowed = distance >= 0 if mask is None else mask[:, :, :, :TOKENS] > torch.finfo(mask.dtype).min / 2
        if mask is not None and mask.is_floating_point():  # an additive mask's bias (per head: Doge's) kept
            scores = scores + mask[:, :, :, :TOKENS].double().masked_fill(~allowed, 0)
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        return (weights @ v).transpose(1, 2).to(call.value.dtype).contiguous(), None

    reference = {}
    handles = _input_hooks(modules, replace=inputs, outputs=reference)
    with torch.no_grad(), rope_ext.hook_attention(model, dense, replace=True):
        model(ids, use_cache=False)
    for h in handles:
        h.remove()
    assert set(reference) == set(patched) == set(modules)
    changed = 0
    for name in modules:
        torch.testing.assert_close(patched[name], reference[name], atol=1e-5, rtol=1e-4)
        changed += selected is None or seen["query", name].slot() in selected
    assert changed >= 1


SILENT = {  # attention that does not call transformers' AttentionInterface (Falcon's did, up to transformers 5.24)
    "gpt_neox_japanese": dict(intermediate_multiple_size=2),
}


@pytest.mark.parametrize("model_type", list(SILENT))
def test_a_method_that_would_change_nothing_is_an_error(model_type):
    config = AutoConfig.for_model(model_type, **{**SMALL, **SILENT[model_type]})
    model = AutoModelForCausalLM.from_config(config).eval()
    implementation = model.config._attn_implementation
    with pytest.raises(rope_ext.AttentionHookError, match=r"does not call transformers' AttentionInterface") as err:
        rope_ext.patch(model, {"name": "self_extend", "group_size": 4, "window": 8}, original_max_position=TRAINED)
    assert "\n" not in str(err.value)
    assert model.config._attn_implementation == implementation  # nothing left attached


def test_a_layer_whose_keys_another_layer_made_is_refused_not_computed_wrong():
    """Gemma-4's KV sharing: its last layer attends the keys an earlier layer rotated and stored. The probe gets its
    own copy of the shared store (a probe that wrote its 4 tokens into the model's would put the identity 0.37 off),
    and the sharing layer, whose key does not turn with its own position embeddings, is refused in one line."""
    extra = dict(SPECIAL["gemma4_text"], num_hidden_layers=3, num_kv_shared_layers=1)
    config = AutoConfig.for_model(
        "gemma4_text", **{**SMALL, **extra, "layer_types": ["sliding_attention", "full_attention", "full_attention"]}
    )
    torch.manual_seed(0)
    model = switched_on(AutoModelForCausalLM.from_config(config).eval())
    assert [layer.self_attn.is_kv_shared_layer for layer in model.model.layers] == [False, False, True]
    with pytest.raises(rope_ext.AttentionHookError, match=r"layers\.2\.self_attn .* shared from another layer") as err:
        identity_errors(model)
    assert "\n" not in str(err.value)


def test_a_meta_moe_model_is_probed_in_a_dtype_its_kernels_take():
    """A float32 meta instance of a bf16 MoE checkpoint: grouped_mm's meta kernel takes bf16 only."""
    config = AutoConfig.for_model("olmoe", **SMALL)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    found = rope_ext.probe(model)
    assert found.called == found.with_rotation and len(found.called) == 2
    assert next(model.parameters()).dtype == torch.float32  # put back


def rotary_model_types() -> list[str]:
    """Every causal-LM model type of the installed transformers whose modeling file defines a rotary embedding."""
    found = []
    for model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        name = model_type_to_module_name(model_type)  # llama4_text: models/llama4
        try:
            module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        except ImportError:
            continue
        if any("RotaryEmbedding" in name for name in dir(module)):
            found.append(model_type)
    return found


# families where the hook does not yet recompute attention exactly as the model does (issue 51, open): strict xfail,
# so a fix is noticed (and this list shrinks) as surely as a new mismatch fails
OPEN: dict[str, str] = {}


@pytest.mark.slow
@pytest.mark.parametrize(
    "model_type",
    [
        pytest.param(t, marks=pytest.mark.xfail(strict=True, reason=OPEN[t])) if t in OPEN else t
        for t in rotary_model_types()
    ],
)
def test_every_rotary_family_is_exact_or_refused_in_one_line(model_type):
    from evals.families import MAX_PARAMETERS

    try:
        config = AutoConfig.for_model(model_type, **small(model_type))
        with torch.device("meta"):  # its size first: a sub-config that keeps its default sizes is not tiny (blt: 4.6B)
            size = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
        if size > MAX_PARAMETERS:
            raise ValueError(f"{size / 1e6:.0f}M parameters at the tiny sizes")
        model = build(model_type)
        with torch.no_grad():
            model(tokens())
    except Exception as err:  # cannot be built tiny here: said, not counted
        pytest.skip(f"{model_type} does not build tiny: {type(err).__name__}: {str(err).splitlines()[0][:120]}")
    try:
        errors = identity_errors(model)
    except (rope_ext.AttentionHookError, rope_ext.ScalingError) as err:  # refused (no rotary: inkling2_text's RoPE
        # is its vision tower's, as the frequency suite says): one line, naming why
        assert "\n" not in str(err) and str(err)
        # the plain model ran above: a forward failing under the hook is rope_ext's crash, not a refusal (DeepSeek-V4's
        # position_embeddings, one (cos, sin) per kind of layer in a dict, once broke the hook)
        assert "forward of the model fails" not in str(err), err
        return
    assert max(errors.values()) <= 1e-5, errors
