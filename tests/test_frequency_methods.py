"""p-RoPE (Barbero et al. 2024) and log-n query scaling (Su 2021; Qwen; Llama-4) against hand-derived values,
transformers' Llama-4 ``attn_temperature_tuning``, and the patcher on real architectures; bad values are one
line before any model loads."""

import copy
import math

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import rope_ext
from evals.core.errors import UserError
from evals.core.job.parse import parse_job
from rope_ext.strategies import analysis
from tests.tiny import TINY

# --- p-RoPE ------------------------------------------------------------------------------------------------


def test_p_rope_keeps_the_highest_frequencies_and_zeroes_the_rest():
    # d = 8, b = 1e4: theta = 1, 0.1, 0.01, 0.001; p = 0.5 keeps floor(0.5 * 4) = 2 pairs
    inv_freq, factor = rope_ext.frequencies({"name": "p_rope", "fraction": 0.5}, 8, 10000.0)
    torch.testing.assert_close(inv_freq, torch.tensor([1.0, 0.1, 0.0, 0.0]))
    assert factor == 1.0
    # p = 0.75 of d/2 = 32 pairs keeps 24; p = 0.7 keeps floor(22.4) = 22; p = 1 is RoPE
    assert int((rope_ext.frequencies({"name": "p_rope", "fraction": 0.75}, 64, 1e4)[0] > 0).sum()) == 24
    assert int((rope_ext.frequencies({"name": "p_rope", "fraction": 0.7}, 64, 1e4)[0] > 0).sum()) == 22
    torch.testing.assert_close(
        rope_ext.frequencies({"name": "p_rope", "fraction": 1.0}, 64, 1e4)[0], rope_ext.default_inv_freq(64, 1e4)
    )
    assert rope_ext.resolve({"name": "p_rope"}, 64).label == "p_rope-fraction0.75"


def test_p_rope_fraction_outside_0_1_is_one_line_before_the_model(tmp_path, compose):
    for fraction, why in [(0.0, "must be > 0"), (1.5, "must be <= 1"), (-0.2, "must be > 0")]:
        with pytest.raises(rope_ext.ScalingError, match=f"scaling 'p_rope': fraction={fraction!r} {why}"):
            rope_ext.resolve({"name": "p_rope", "fraction": fraction}, 64)
    with pytest.raises(UserError) as err:  # the job is rejected when parsed: nothing loaded, nothing written
        parse_job(compose(*TINY, "scaling=p_rope", "scaling.fraction=1.5"), tmp_path / "out")
    assert str(err.value) == "scaling 'p_rope': fraction=1.5 must be <= 1" and not (tmp_path / "out").exists()


def test_removed_pairs_have_infinite_wavelength_in_the_dimension_table_and_carry_no_position():
    inv_freq = rope_ext.frequencies({"name": "p_rope", "fraction": 0.5}, 8, 10000.0)[0]
    table = analysis.dimension_table(inv_freq, 10000.0, 64)
    assert [r["regime"] for r in table] == ["extrapolated", "extrapolated", "removed", "removed"]
    assert table[2]["scaled_wavelength"] == math.inf and table[2]["factor"] == math.inf
    assert table[2]["wavelength"] == pytest.approx(2 * math.pi * 100)
    assert torch.isinf(rope_ext.wavelengths(inv_freq)[2:]).all()
    # composed with PI: the kept pairs interpolated, the removed ones stay removed
    composed = rope_ext.frequencies(
        {"name": "compose", "stages": [{"name": "p_rope", "fraction": 0.5}, {"name": "linear", "factor": 2.0}]},
        8,
        10000.0,
    )[0]
    torch.testing.assert_close(composed, torch.tensor([0.5, 0.05, 0.0, 0.0]))
    regimes = [r["regime"] for r in analysis.dimension_table(composed, 10000.0, 64)]
    assert regimes == ["interpolated", "interpolated", "removed", "removed"]
    # a removed pair scores the same at every distance: cos(r * 0) = 1
    score = analysis.decay_curve(torch.tensor([0.0]), 100)
    assert torch.equal(score, torch.full((100,), 2.0, dtype=score.dtype))


# --- log-n ----------------------------------------------------------------------------------------------------


def test_logn_factors_are_the_published_forms():
    positions = torch.tensor([0, 63, 64, 127, 4095])  # n = 1, 64, 65, 128, 4096 tokens seen; L = 64
    su = rope_ext.resolve({"name": "logn"}, 64).query_factors(positions)
    # Qwen: math.log(i, L) if i > L else 1, for i = n
    torch.testing.assert_close(su, torch.tensor([1.0, 1.0, math.log(65, 64), 7 / 6, 2.0]))
    llama4 = rope_ext.resolve({"name": "logn", "form": "llama4", "attn_scale": 0.1}, 64).query_factors(positions)
    expected = [1 + 0.1 * math.log1p(math.floor(n / 64)) for n in (1, 64, 65, 128, 4096)]
    torch.testing.assert_close(llama4, torch.tensor(expected))
    assert float(
        rope_ext.resolve({"name": "logn", "form": "llama4", "floor_scale": 8}, 64).query_factors(torch.tensor([15]))
    ) == pytest.approx(1 + 0.1 * math.log(3))
    with pytest.raises(rope_ext.ScalingError, match="scaling 'logn': form='qwen' must be one of su, llama4"):
        rope_ext.resolve({"name": "logn", "form": "qwen"}, 64)


def test_logn_llama4_form_equals_transformers_llama4_attn_temperature_tuning():
    fields = dict(
        hidden_size=32,
        intermediate_size=64,
        intermediate_size_mlp=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=96,
        num_local_experts=1,
        moe_layers=[],
        use_qk_norm=False,
        no_rope_layers=[0, 0],
        attn_temperature_tuning=True,
        floor_scale=16,
        attn_scale=0.1,
        max_position_embeddings=64,
    )
    config = AutoConfig.for_model("llama4_text", **fields)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    native = AutoModelForCausalLM.from_config(config).eval()  # NoPE layers with Llama-4's query temperature
    plain_config = copy.deepcopy(config)
    plain_config.attn_temperature_tuning = False
    plain = AutoModelForCausalLM.from_config(plain_config).eval()
    plain.load_state_dict(native.state_dict())
    ids = torch.randint(3, 96, (1, 80), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, unscaled = native(ids).logits, plain(ids).logits
        assert not torch.allclose(expected, unscaled)
        with rope_ext.patch(plain, {"name": "logn", "form": "llama4", "floor_scale": 16, "attn_scale": 0.1}):
            torch.testing.assert_close(plain(ids).logits, expected, atol=1e-6, rtol=1e-6)
        assert torch.equal(plain(ids).logits, unscaled)


def gemma(**extra):
    config = AutoConfig.for_model(
        "gemma3_text",
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=6,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        vocab_size=100,
        sliding_window=16,
        max_position_embeddings=32,
        **extra,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def test_logn_scales_queries_of_the_scaled_layers_only_and_composes_with_frequencies():
    model = gemma()
    scaled_layers, factors = [], {}

    def observe(call):
        factors.setdefault(call.layer, []).append(call.query)

    ids = torch.randint(3, 100, (1, 96), generator=torch.Generator().manual_seed(2))
    with rope_ext.patch(
        model, {"name": "compose", "stages": [{"name": "linear", "factor": 2.0}, {"name": "logn"}]}
    ) as patched:
        rope_ext.hook_attention(model, observe, transform=True)  # after the patch's transform: sees scaled queries
        with rope_ext.hook_attention(
            model, lambda call: factors.setdefault(("raw", call.layer), []).append(call.query)
        ):
            with torch.no_grad():
                model(ids)
        assert [s.layer_type for s in patched.slots] == ["full_attention"]
        assert patched.applied[-1] == {
            "query_scaling": "compose[linear-factor2,logn]",
            "layer_types": ["full_attention"],
        }
        for layer in range(6):
            ratio = factors[layer][0] / factors[("raw", layer)][0]
            expected = (torch.arange(96) + 1).double().log().div(math.log(32)).clamp(min=1).float()
            if model.config.layer_types[layer] == "full_attention":
                scaled_layers.append(layer)
                torch.testing.assert_close(ratio[0, 0, :, 0], expected)
            else:
                torch.testing.assert_close(ratio, torch.ones_like(ratio))
        rotary = patched.slots[0].module(model)
        torch.testing.assert_close(rotary.full_attention_inv_freq, rope_ext.default_inv_freq(16, 1e6) / 2)
    assert scaled_layers == [5]


def test_logn_alone_changes_no_frequency_and_nothing_within_the_trained_length():
    model = gemma(
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
        }
    )
    rotary = model.model.rotary_emb
    native = rotary.full_attention_inv_freq
    ids = torch.randint(3, 100, (1, 32), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        before = model(ids).logits
        with rope_ext.patch(model, {"name": "logn"}):
            assert rotary.full_attention_inv_freq is native  # the model's own (here natively scaled) frequencies
            assert torch.equal(model(ids).logits, before)  # n <= L: every factor is 1


# --- bad input, one line, before the model -----------------------------------------------------------------------


def test_logn_on_a_model_whose_attention_cannot_be_hooked_is_one_line_before_loading(tmp_path, compose, models):
    cfg = compose("model=tinyneoxjapanese", "logger=none", "scaling=linear", models)
    parse_job(cfg, tmp_path / "ok")  # its frequencies can be patched
    for scaling in (["scaling=logn"], ["scaling=compose", "scaling.stages=[{name: yarn, factor: 2}, {name: logn}]"]):
        with pytest.raises(
            UserError,
            match="scales queries inside attention, but model 'tinyneoxjapanese' cannot be hooked: "
            r"GPTNeoXJapaneseForCausalLM: its attention \(GPTNeoXJapaneseAttention\) does not call",
        ):
            parse_job(compose("model=tinyneoxjapanese", "logger=none", *scaling, models), tmp_path / "bad")
    with pytest.raises(
        UserError, match="eval=qk_study captures q and k inside attention, but model 'tinyneoxjapanese' cannot"
    ):
        parse_job(compose("model=tinyneoxjapanese", "logger=none", "eval=qk_study", models), tmp_path / "qk")
