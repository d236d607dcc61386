"""MLA families build their softmax scale from the rope parameters (``mscale_all_dim``, rope_ext.rotary.softmax_scale): a
patch sets it to what transformers builds for the strategy, so the patched model equals the natively configured one,
and restores it exactly."""

import pytest
import torch

import rope_ext
from evals import families

THETA = 10000.0
DEEPSEEK_YARN = {  # DeepSeek-V3's shipped YaRN keys (x40 there), the trained context the tiny model's
    "rope_type": "yarn",
    "rope_theta": THETA,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": families.TRAINED,
}


def native(plain, rope_parameters):
    return families.logits(families._with_weights("deepseek_v3", rope_parameters, plain))


def scales(model) -> list[float]:
    return [layer.self_attn.scaling for layer in model.model.layers]


def test_yarn_with_mscale_all_dim_equals_the_natively_configured_model():
    plain = families.build("deepseek_v3")
    before, own = families.logits(plain), scales(plain)
    setting = {"name": "yarn", "factor": 4, "mscale": 1.0, "mscale_all_dim": 1.0}
    with rope_ext.patch(plain, setting, families.TRAINED) as patch:
        patched = families.logits(plain)
        assert scales(plain) == pytest.approx([s * (0.1 * torch.log(torch.tensor(4.0)).item() + 1) ** 2 for s in own])
        assert "DeepseekV3Attention.scaling" in patch.softmax_scale
    assert float((patched - native(plain, {**DEEPSEEK_YARN, "factor": 4.0})).abs().max()) < 1e-5
    assert scales(plain) == own and torch.equal(families.logits(plain), before)  # restored bit for bit


@pytest.mark.parametrize(
    "setting, rope_parameters",
    [
        ({"name": "none"}, {**DEEPSEEK_YARN, "factor": 40.0}),  # the model as shipped
        ({"name": "yarn", "factor": 4}, {**DEEPSEEK_YARN, "factor": 4.0}),  # inherits mscale, mscale_all_dim
        ({"name": "linear", "factor": 2}, {"rope_type": "linear", "rope_theta": THETA, "factor": 2.0}),  # replaces
    ],
    ids=["none", "yarn", "linear"],
)
def test_on_a_model_shipping_yarn_x40_each_strategy_equals_transformers_build_of_it(setting, rope_parameters):
    shipped_model = families.build("deepseek_v3", {**DEEPSEEK_YARN, "factor": 40.0})
    shipped, own = families.logits(shipped_model), scales(shipped_model)
    assert own[0] == pytest.approx(16**-0.5 * (0.1 * torch.log(torch.tensor(40.0)).item() + 1) ** 2)  # x1.874
    with rope_ext.patch(shipped_model, setting) as patch:
        patched = families.logits(shipped_model)
    assert float((patched - native(shipped_model, rope_parameters)).abs().max()) < 1e-5
    assert scales(shipped_model) == own and torch.equal(families.logits(shipped_model), shipped)
    if setting["name"] != "none":  # the one line says the softmax scale followed
        assert "DeepseekV3Attention.scaling 0.468464 ->" in patch.shipped


def test_a_strategy_transformers_has_no_counterpart_for_gets_the_unscaled_softmax_scale():
    shipped_model = families.build("deepseek_v3", {**DEEPSEEK_YARN, "factor": 40.0})
    with rope_ext.patch(shipped_model, {"name": "ntk", "factor": 2}):  # NTK-aware: a default rope at another base
        assert scales(shipped_model) == [16**-0.5] * 2
    with rope_ext.patch(shipped_model, {"name": "logn"}):  # no frequency changed: the rotary and scale as shipped
        assert scales(shipped_model) == pytest.approx([16**-0.5 * 1.3689**2] * 2, rel=1e-4)


def test_a_model_whose_attention_reads_no_mscale_all_dim_is_left_as_it_is():
    plain = families.build("llama")
    with rope_ext.patch(plain, {"name": "yarn", "factor": 4, "mscale": 1.0, "mscale_all_dim": 1.0}) as patch:
        assert patch.softmax_scale is None


def test_the_transformers_export_of_an_inherited_yarn_carries_mscale_all_dim_and_gives_the_patched_model():
    from rope_ext.export import geometry, transformers_config

    shipped_model = families.build("deepseek_v3", {**DEEPSEEK_YARN, "factor": 40.0})
    with rope_ext.patch(shipped_model, {"name": "yarn", "factor": 4}) as patch:
        patched = families.logits(shipped_model)
        scaling = patch.scaling
    exported = transformers_config(scaling, geometry(shipped_model, scaling), shipped_model.config.to_dict())
    assert exported["rope_parameters"]["mscale_all_dim"] == 1.0
    assert float((patched - native(shipped_model, exported["rope_parameters"])).abs().max()) < 1e-5


def test_evals_models_says_which_strategies_change_a_shipped_mla_softmax_scale(capsys, tmp_path):
    """Before any run, ``python -m evals.models`` on a checkpoint shipping DeepSeek-V3's YaRN x40 says what each
    frequency strategy does to the attention's softmax scale (the values the patch sets, tested above)."""
    from evals.models import main

    config = families.config("deepseek_v3")
    config.rope_parameters = {**DEEPSEEK_YARN, "factor": 40.0}
    config.save_pretrained(tmp_path)
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "\n  yarn: the attention's build-time constants follow the strategy's rope parameters in 2 layers: " in out
    assert (
        "DeepseekV3Attention.scaling 0.468464 -> 0.285858 (x0.6102)" in out
    )  # YaRN x2's (its default factor), not x40's
    assert ", linear, " in out and "DeepseekV3Attention.scaling 0.468464 -> 0.25 (x0.5337)" in out  # unscaled
    assert main(["deepseek_v3"]) == 0  # the tiny config ships no scaling: no strategy changes the softmax scale here
    assert "build-time constants" not in capsys.readouterr().out
