"""Served = measured, checked by the engines themselves: each vLLM/SGLang export, given to vLLM 0.33.0's and SGLang
0.5.23's own config loading, start-up length check and rotary embedding (their wheels' Python code, fetched by
``make setup-engines``, run on the CPU by tests/engine_rope.py), rotates q and k as the patched transformers model
does at every position up to the exported context; every other strategy is refused in one line. The engine runs
under the harness's transformers, or under the one in ``$ROPE_EXT_ENGINE_TRANSFORMERS`` (a folder, e.g. ``pip install
--no-deps --target DIR transformers==5.19.0``: the version SGLang 0.5.23 pins, inside vLLM 0.33.0's range)."""

import os
import re
import subprocess
import sys

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import rope_ext
from evals.setup.engines import fetched
from rope_ext.export import ENGINE_VERIFIED_MODELS, VERIFIED, Unsupported, export, geometry
from tests.test_export import NATIVE
from tests.tiny import ROOT

TRAINED, HEADS, HEAD = 64, 4, 16
FAMILIES = {
    "llama": dict(model_type="llama"),
    "qwen2": dict(model_type="qwen2", rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    # a model whose own rope dict and top level hold keys an override must not leave behind (SGLang merges; vLLM
    # would keep a top-level original_max_position_embeddings)
    "llama-leftovers": dict(
        model_type="llama",
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 1e4,
            "factor": 2.0,
            "original_max_position_embeddings": 32,
            "beta_fast": 8.0,
            "mscale": 0.5,
            "mscale_all_dim": 1.5,
        },
        original_max_position_embeddings=32,
    ),
    "mistral": dict(model_type="mistral", sliding_window=None),
    # per-layer-type rope: the scaling goes to the global layers (checked here), the sliding ones keep theirs
    "gemma3": dict(
        model_type="gemma3_text",
        head_dim=HEAD,
        num_hidden_layers=2,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        },
    ),
    # DeepSeek-V3's multi-head latent attention: rope on qk_rope_head_dim only, interleaved pairs; plain RoPE, the
    # checkpoint's own YaRN with mscale/mscale_all_dim (DeepSeek-V3's: x40, 1, 1; the softmax scale x1.87 it brings
    # stays in the measured model), and rope_interleave=false (rotate_half pairs)
    **{
        name: dict(
            model_type="deepseek_v3",
            kv_lora_rank=16,
            q_lora_rank=16,
            qk_rope_head_dim=HEAD,
            qk_nope_head_dim=8,
            v_head_dim=16,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            **extra,
        )
        for name, extra in {
            "deepseek_v3": {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
            "deepseek_v3-yarn": {
                "rope_parameters": {
                    "rope_type": "yarn",
                    "rope_theta": 1e4,
                    "factor": 40.0,
                    "original_max_position_embeddings": TRAINED,
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "mscale": 1.0,
                    "mscale_all_dim": 1.0,
                }
            },
            "deepseek_v3-neox": {
                "rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
                "rope_interleave": False,
            },
        }.items()
    },
}
LAYER_TYPE = {"gemma3": "full_attention"}
MLA = {name for name, spec in FAMILIES.items() if spec["model_type"] == "deepseek_v3"}
# what an engine's model module cannot take, by (engine, family): the export refuses it in one line
NOT_TAKEN = {
    ("sglang", "gemma3"): (
        "SGLang's Gemma-3 builds every layer's rotary with rope_type 'default'",
        "a per-layer-type truncate=false would be read as true",
    ),
    ("vllm", "gemma3"): (
        "p-RoPE on a model with partial rotary or per-layer-type rope is not exported",
        "a per-layer-type truncate=false would be read as true",  # as transformers reads it: refused for all
    ),
    **{
        (engine, family): (
            "DeepSeek serves every rope type but 'default' as its DeepSeek YaRN",  # linear, llama3, p-RoPE
            "DeepSeek YaRN always truncates its correction range",
            *(("rotates interleaved pairs whatever the config's rope_interleave says",) if engine == "vllm" else ()),
        )
        for engine in ("vllm", "sglang")
        for family in MLA
    },
}
# every frequency strategy the engines can express, as rope_ext measures it: the transformers-native set of
# tests/test_export.py but dynamic NTK (static in vLLM/SGLang: refused), and the model unchanged
SERVED = [{"name": "none"}, *(s for s in NATIVE if s["name"] != "dynamic_ntk")]
# vLLM only: its 'proportional' rope (SGLang's Llama/Qwen2 compute the rotary dim themselves: refused)
SERVED_BY = {"vllm": [{"name": "p_rope"}, {"name": "p_rope", "fraction": 0.5}], "sglang": []}
# strategies without a factor are served at the target the verdict judged (here 4x), beyond the trained context
TARGET = 4 * TRAINED
AT_TARGET = ("base", "p_rope")
ENGINES = {"vllm": ("hf_overrides", "--max-model-len"), "sglang": ("json_model_override_args", "--context-length")}


def family_model(family):
    spec = dict(FAMILIES[family])
    config = AutoConfig.for_model(
        spec.pop("model_type"),
        hidden_size=HEADS * HEAD,
        intermediate_size=96,
        num_attention_heads=HEADS,
        num_key_value_heads=2,
        vocab_size=96,
        max_position_embeddings=TRAINED,
        **{"num_hidden_layers": 1, **spec},
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def patched_qk(model, scaling, q, k, layer_type=None):
    """q and k rotated by the patched model's rotary embedding (its cos/sin, attention factor included; the layer
    type's where the model has several)."""
    n = q.shape[0]
    positions = torch.arange(n)[None]
    with torch.no_grad(), rope_ext.patch(model, scaling, original_max_position=TRAINED):
        extra = (layer_type,) if layer_type else ()
        cos, sin = model.model.rotary_emb(q[None].transpose(1, 2), positions, *extra)
    rq, rk = apply_rotary_pos_emb(q[None].transpose(1, 2), k[None].transpose(1, 2), cos, sin)
    return rq.transpose(1, 2)[0], rk.transpose(1, 2)[0]


def patched_logits(model, scaling, q, k, q_nope, k_nope):
    """DeepSeek-V3's attention logits in the patched model, per head: its softmax scale times q.k, the rotated part
    by the patched rotary embedding (its cos/sin, attention factor included) as the module applies it (interleaved
    pairs or rotate_half, as its rope_interleave says)."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek

    positions = torch.arange(q.shape[0])[None]
    attention = model.model.layers[0].self_attn
    rotate = deepseek.apply_rotary_pos_emb_interleave if model.config.rope_interleave else deepseek.apply_rotary_pos_emb
    with torch.no_grad(), rope_ext.patch(model, scaling, original_max_position=TRAINED):
        cos, sin = model.model.rotary_emb(q[None].transpose(1, 2), positions)
        rq, rk = rotate(q[None].transpose(1, 2), k[None].transpose(1, 2), cos, sin)
        scale = attention.scaling
    return mla_logits(rq[0].transpose(0, 1), rk[0].transpose(0, 1), scale, q_nope, k_nope)


def mla_logits(q, k, scale, q_nope, k_nope):
    """(heads, n, n): scale x (q_nope.k_nope + q_rope.k_rope), q (n, heads, r), k (n, 1, r) shared by the heads."""
    full_q, full_k = torch.cat([q_nope, q], -1), torch.cat([k_nope, k.expand(-1, q.shape[1], -1)], -1)
    return scale * torch.einsum("ihd,jhd->hij", full_q.double(), full_k.double())


def run_engine(engine, cases, tmp_path):
    root = fetched(engine)
    if root is None:
        pytest.skip(f"{engine} {VERIFIED[engine]}'s code is not fetched here: run `make setup-engines`")
    torch.save(cases, tmp_path / "cases.pt")
    paths = f"{root / 'src'}:{root / 'deps'}"
    if os.environ.get("ROPE_EXT_ENGINE_TRANSFORMERS"):  # a folder holding the transformers the engine version installs
        paths = f"{os.environ['ROPE_EXT_ENGINE_TRANSFORMERS']}:{paths}"
    command = [sys.executable, str(ROOT / "tests" / "engine_rope.py"), engine, paths, str(tmp_path / "cases.pt")]
    result = subprocess.run([*command, str(tmp_path / "out.pt")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(tmp_path / "out.pt", weights_only=False)


def case(engine, family, setting, tmp_path):
    """The export for ``engine``, the model's config saved where the engine reads it, and q/k to rotate."""
    model = family_model(family)
    scaling = rope_ext.resolve(setting, TRAINED)
    target = TARGET if setting["name"] in AT_TARGET else None
    found = export(scaling, geometry(model, scaling, trained=TRAINED), engine, model.config.to_dict(), target)
    key, flag = ENGINES[engine]
    context = int(re.search(rf"{flag} (\d+)", found["command"]).group(1))
    assert context == (target or context) and found["context"] == context
    folder = tmp_path / f"{family}-{'-'.join(map(str, setting.values()))}"
    model.config.save_pretrained(folder)
    generator = torch.Generator().manual_seed(1)
    q, k = torch.randn(context, HEADS, HEAD, generator=generator), torch.randn(context, 2, HEAD, generator=generator)
    if family in MLA:  # the rope part of every head's query, the key's shared by all heads; their no-rope parts
        k = k[:, :1]
        nope = [torch.randn(context, HEADS, model.config.qk_nope_head_dim, generator=generator) for _ in range(2)]
        ours = patched_logits(model, scaling, q, k, *nope), nope
    else:
        ours = patched_qk(model, scaling, q, k, LAYER_TYPE.get(family))
    engine_case = {
        "mla": family in MLA,
        "layer_type": LAYER_TYPE.get(family),
        "model": str(folder),
        "overrides": found[key],
        "context": context,
        "head_dim": HEAD,
        "positions": torch.arange(context),
        "q": q if family in MLA else q.reshape(context, -1),  # MLA: (tokens, heads, rope dim), as its module rotates
        "k": k if family in MLA else k.reshape(context, -1),
    }
    return engine_case, ours, model, scaling


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_the_engine_serves_what_was_measured_at_every_position_up_to_the_exported_context(engine, tmp_path):
    if fetched(engine) is None:
        pytest.skip(f"{engine} {VERIFIED[engine]}'s code is not fetched here: run `make setup-engines`")
    cases, expected, refused = [], [], []
    for family in FAMILIES:
        for setting in SERVED + SERVED_BY[engine]:
            try:
                engine_case, ours, model, scaling = case(engine, family, setting, tmp_path)
            except Unsupported as err:  # only what the engine's model module cannot take
                assert any(why in str(err) for why in NOT_TAKEN.get((engine, family), ())), (family, setting, err)
                refused.append((family, str(setting)))
                continue
            cases.append(engine_case)
            expected.append((family, setting, ours))
    results = run_engine(engine, cases, tmp_path)
    folder = os.environ.get("ROPE_EXT_ENGINE_TRANSFORMERS")
    if folder:  # the engine ran under the transformers given, not the harness's
        from pathlib import Path

        (info,) = Path(folder).glob("transformers-*.dist-info")
        assert {r.get("transformers") for r in results if "q" in r} == {info.name.split("-")[1].removesuffix(".dist")}
    for (family, setting, ours), theirs in zip(expected, results):
        assert "error" not in theirs, f"{engine} refused {family} {setting} at start-up: {theirs.get('error')}"
        if family in MLA:  # what the attention logits are made of: rotated q/k, cos/sin magnitude, softmax scale
            logits, nope = ours
            n = len(logits[0])  # SGLang's rotate_half path gives (1, tokens, heads, dim)
            served = mla_logits(
                theirs["q"].reshape(n, HEADS, -1), theirs["k"].reshape(n, 1, -1), theirs["scale"], *nope
            )
            assert (served - logits).abs().max() <= 1e-4 * logits.abs().max(), (family, setting)
            continue
        q, k = ours
        served_q, served_k = theirs["q"].reshape(q.shape), theirs["k"].reshape(k.shape)
        assert (served_q - q).abs().max() <= 1e-4 * q.abs().max(), (family, setting)
        assert (served_k - k).abs().max() <= 1e-4 * k.abs().max(), (family, setting)
    assert set(refused) == {
        (f, str(s)) for f in FAMILIES for s in SERVED + SERVED_BY[engine] if not_taken(engine, f, s)
    }


def not_taken(engine, family, setting):
    """What the export refuses: SGLang's Gemma-3 takes a base (ntk, base) and nothing else, vLLM's neither p-RoPE nor
    a per-layer-type truncate=false; DeepSeek-V3's modules take plain RoPE, YaRN and NTK-by-parts with their
    correction range truncated (each with the softmax scale the patch measured: rope_ext.rotary.softmax_scale), and vLLM's
    interleaved pairs only; every other case is served."""
    name = setting["name"]
    if family == "gemma3":
        if engine == "sglang":
            return name not in ("none", "ntk", "base")
        return name == "p_rope" or setting.get("truncate") is False
    if family in MLA:
        if engine == "vllm" and FAMILIES[family].get("rope_interleave") is False:
            return True
        return name not in ("none", "ntk", "base", "yarn", "ntk_by_parts") or setting.get("truncate") is False
    return False


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_the_check_can_fail_an_override_without_the_context_is_refused_and_a_wrong_one_differs(engine, tmp_path):
    """The same harness on exports made wrong: no max_position_embeddings (the engine's start-up check refuses the
    context), and NTK-by-parts' attention factor (1) left out (the engine's YaRN then scales by 0.1 ln s + 1)."""
    if fetched(engine) is None:
        pytest.skip(f"{engine} {VERIFIED[engine]}'s code is not fetched here: run `make setup-engines`")
    key = ENGINES[engine][0]
    short, _, _, _ = case(engine, "llama", {"name": "ntk", "factor": 4}, tmp_path)
    short["overrides"] = {k: v for k, v in short["overrides"].items() if k != "max_position_embeddings"}
    wrong, ours, _, _ = case(engine, "llama", {"name": "ntk_by_parts", "factor": 4}, tmp_path)
    name = "rope_parameters" if key == "hf_overrides" else "rope_scaling"
    rope = {k: v for k, v in wrong["overrides"][name].items() if k not in ("attention_factor", "attn_factor")}
    wrong["overrides"] = {**wrong["overrides"], name: rope}
    refused, differs = run_engine(engine, [short, wrong], tmp_path)
    assert "error" in refused and "256" in refused["error"]
    assert (differs["q"].reshape(ours[0].shape) - ours[0]).abs().max() > 1e-2 * ours[0].abs().max()


# every strategy the README lists: served (above) or refused in one line, never an approximation
REFUSED = [
    ({"name": "dynamic_ntk", "factor": 4}, "computes one NTK base at start-up"),
    ({"name": "longrope", "factor": 4, "short_factor": [1.0] * 8, "long_factor": [4.0] * 8}, "long factors"),
    ({"name": "mixed", "factors": [1.0] * 4 + [4.0] * 4}, "no rope type computes 'mixed' frequencies"),
    ({"name": "logn"}, "query scaling inside attention has no config key"),
    ({"name": "compose", "stages": [{"name": "ntk", "factor": 2}, {"name": "logn"}]}, "a composition of stages"),
    ({"name": "self_extend"}, "an attention-level method"),
    ({"name": "rerope"}, "an attention-level method"),
    ({"name": "leaky_rerope"}, "an attention-level method"),
    ({"name": "string", "offset": 40, "local_window": 8}, "an attention-level method"),
    ({"name": "lm_infinite"}, "an attention-level method"),
    ({"name": "dca"}, "dual chunk attention on the Qwen2 family only"),
    ({"name": "yarn", "factor": 2, "dynamic": True}, "no dynamic YaRN"),
]


def test_sglang_refuses_p_rope():
    model = family_model("llama")
    scaling = rope_ext.resolve({"name": "p_rope"}, TRAINED)
    with pytest.raises(Unsupported, match="from the rotary dim they compute themselves"):
        export(scaling, geometry(model, scaling), "sglang", model.config.to_dict())


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("setting,reason", REFUSED, ids=lambda s: s["name"] if isinstance(s, dict) else "")
def test_what_the_engines_would_not_serve_as_measured_is_refused_in_one_line(engine, setting, reason):
    model = family_model("llama")
    scaling = rope_ext.resolve(setting, TRAINED)
    with pytest.raises(Unsupported, match=reason) as err:
        export(scaling, geometry(model, scaling), engine, model.config.to_dict())
    assert "\n" not in str(err.value) and "transformers" not in str(err.value)


def test_sglang_gets_explicit_values_for_the_models_own_rope_keys_and_top_level_original_context():
    model = family_model("llama-leftovers")
    scaling = rope_ext.resolve({"name": "ntk", "factor": 4}, TRAINED)
    found = export(scaling, geometry(model, scaling, trained=TRAINED), "sglang", model.config.to_dict())
    rope = found["json_model_override_args"]["rope_scaling"]
    assert rope["rope_type"] == "default" and rope["factor"] == 1.0 and rope["mscale"] is None
    assert found["json_model_override_args"]["original_max_position_embeddings"] is None


def test_every_family_an_export_calls_checked_is_checked_here():
    """The exports drop "not verified" for ENGINE_VERIFIED_MODELS only: each of them is a family of this file."""
    assert set(ENGINE_VERIFIED_MODELS) <= {spec["model_type"] for spec in FAMILIES.values()}
