"""Strategy functions against transformers' own ROPE_INIT_FUNCTIONS, and their published formulas."""

import itertools
import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import rope_ext
from rope_ext import ScalingError, frequencies
from rope_ext.strategies.rope import default_inv_freq, effective_base, wavelengths

GRID = list(itertools.product([64, 128], [10000.0, 500000.0], [2.0, 4.0, 8.0], [2048, 4096]))


def hf_config(head_dim, base, trained, rope_parameters):
    return LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        max_position_embeddings=trained,
        rope_parameters={"rope_theta": base, **rope_parameters},
    )


def assert_same(ours, theirs):
    (inv, attention), (hf_inv, hf_attention) = ours, theirs
    torch.testing.assert_close(inv, hf_inv.float(), rtol=1e-6, atol=1e-6)
    assert attention == pytest.approx(hf_attention, rel=1e-6)


@pytest.mark.parametrize("dim,base,factor,trained", GRID)
def test_linear_matches_transformers(dim, base, factor, trained):
    config = hf_config(dim, base, trained, {"rope_type": "linear", "factor": factor})
    assert_same(frequencies({"name": "linear", "factor": factor}, dim, base), ROPE_INIT_FUNCTIONS["linear"](config))


@pytest.mark.parametrize("dim,base,factor,trained", GRID)
@pytest.mark.parametrize("seq_len", [None, 1000, 3 * 4096, 40000])
def test_dynamic_ntk_matches_transformers(dim, base, factor, trained, seq_len):
    config = hf_config(dim, base, trained, {"rope_type": "dynamic", "factor": factor})
    ours = frequencies({"name": "dynamic_ntk", "factor": factor, "original_max_position": trained}, dim, base, seq_len)
    assert_same(ours, ROPE_INIT_FUNCTIONS["dynamic"](config, seq_len=seq_len))


@pytest.mark.parametrize("dim,base,factor,trained", GRID)
@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"beta_fast": 16.0, "beta_slow": 2.0},
        {"truncate": False},
        {"mscale": 0.707, "mscale_all_dim": 1.0},
        {"attention_factor": 1.3},
    ],
)
def test_yarn_matches_transformers(dim, base, factor, trained, extra):
    rope = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": trained, **extra}
    config = hf_config(dim, base, trained * int(factor), rope)
    ours = frequencies({"name": "yarn", "factor": factor, "original_max_position": trained, **extra}, dim, base)
    assert_same(ours, ROPE_INIT_FUNCTIONS["yarn"](config))


@pytest.mark.parametrize("dim,base,factor,trained", GRID)
@pytest.mark.parametrize("low,high", [(1.0, 4.0), (2.0, 8.0)])
def test_llama3_matches_transformers(dim, base, factor, trained, low, high):
    rope = {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": trained,
    }
    config = hf_config(dim, base, trained, rope)
    ours = frequencies(
        {
            "name": "llama3",
            "factor": factor,
            "original_max_position": trained,
            "low_freq_factor": low,
            "high_freq_factor": high,
        },
        dim,
        base,
    )
    assert_same(ours, ROPE_INIT_FUNCTIONS["llama3"](config))


@pytest.mark.parametrize("dim,base,factor,trained", GRID)
@pytest.mark.parametrize("seq_len", [None, 100, 10**6])
def test_longrope_matches_transformers(dim, base, factor, trained, seq_len):
    generator = torch.Generator().manual_seed(dim + int(factor))
    short = (1 + torch.rand(dim // 2, generator=generator)).tolist()
    long = (1 + 4 * torch.rand(dim // 2, generator=generator)).tolist()
    rope = {
        "rope_type": "longrope",
        "short_factor": short,
        "long_factor": long,
        "factor": factor,
        "original_max_position_embeddings": trained,
    }
    config = hf_config(dim, base, int(trained * factor), rope)
    ours = frequencies(
        {
            "name": "longrope",
            "short_factor": short,
            "long_factor": long,
            "factor": factor,
            "original_max_position": trained,
        },
        dim,
        base,
        seq_len,
    )
    assert_same(ours, ROPE_INIT_FUNCTIONS["longrope"](config, seq_len=seq_len))


def test_ntk_is_base_times_factor_power_and_interpolates_the_lowest_frequency_by_factor():
    inv, attention = frequencies({"name": "ntk", "factor": 4}, 128, 10000)
    expected_base = 10000 * 4 ** (128 / 126)
    torch.testing.assert_close(inv, default_inv_freq(128, expected_base))
    lowest_ratio = default_inv_freq(128, 10000)[-1] / inv[-1]
    assert float(lowest_ratio) == pytest.approx(4.0, rel=1e-5) and attention == 1.0
    assert float(inv[0]) == 1.0  # the highest frequency is untouched


def test_base_sets_the_base_and_pi_is_linear():
    torch.testing.assert_close(frequencies({"name": "base", "base": 5e5}, 64, 1e4)[0], default_inv_freq(64, 5e5))
    torch.testing.assert_close(frequencies({"name": "pi", "factor": 3}, 64, 1e4)[0], default_inv_freq(64, 1e4) / 3)


def test_ntk_by_parts_is_yarn_without_temperature():
    params = {"factor": 4.0, "original_max_position": 4096}
    yarn_inv, yarn_attention = frequencies({"name": "yarn", **params}, 128, 10000)
    parts_inv, parts_attention = frequencies({"name": "ntk_by_parts", **params}, 128, 10000)
    torch.testing.assert_close(yarn_inv, parts_inv)
    assert parts_attention == 1.0 and yarn_attention == pytest.approx(0.1 * math.log(4) + 1)


def test_dynamic_yarn_follows_length():
    params = {"name": "yarn", "dynamic": True, "original_max_position": 4096}
    assert (
        rope_ext.resolve(params).dynamic
        and not rope_ext.resolve({"name": "yarn", "original_max_position": 4096}).dynamic
    )
    short, short_attention = frequencies(params, 64, 1e4, seq_len=2000)
    torch.testing.assert_close(short, default_inv_freq(64, 1e4))
    assert short_attention == 1.0
    long_inv, long_attention = frequencies(params, 64, 1e4, seq_len=4 * 4096)
    fixed_inv, fixed_attention = frequencies({**params, "dynamic": False, "factor": 4.0}, 64, 1e4)
    torch.testing.assert_close(long_inv, fixed_inv)
    assert long_attention == pytest.approx(fixed_attention)


def test_mixed_bands_by_wavelength_and_by_dims_and_list_agree():
    base, dim = 1e4, 64
    lam = wavelengths(default_inv_freq(dim, base))
    by_wavelength = frequencies(
        {"name": "mixed", "bands": [{"max_wavelength": 2048, "factor": 1.0}, {"min_wavelength": 2048, "factor": 3.0}]},
        dim,
        base,
    )[0]
    cut = int((lam < 2048).sum())
    by_dims = frequencies(
        {"name": "mixed", "bands": [{"dims": [0, cut], "factor": 1.0}, {"dims": [cut, dim // 2], "factor": 3.0}]},
        dim,
        base,
    )[0]
    listed = frequencies({"name": "mixed", "factors": [1.0] * cut + [3.0] * (dim // 2 - cut)}, dim, base)[0]
    torch.testing.assert_close(by_wavelength, by_dims)
    torch.testing.assert_close(by_dims, listed)
    assert 0 < cut < dim // 2


def test_compose_base_then_linear_and_base_then_yarn():
    composed = frequencies(
        {"name": "compose", "stages": [{"name": "base", "base": 5e5}, {"name": "linear", "factor": 2}]}, 64, 1e4
    )[0]
    torch.testing.assert_close(composed, default_inv_freq(64, 5e5) / 2)
    yarn = {"name": "yarn", "factor": 4.0, "original_max_position": 2048}
    composed, attention = frequencies({"name": "compose", "stages": [{"name": "base", "base": 5e5}, yarn]}, 64, 1e4)
    direct, direct_attention = frequencies(yarn, 64, 5e5)
    torch.testing.assert_close(composed, direct)
    assert attention == pytest.approx(direct_attention)
    assert effective_base(default_inv_freq(64, 5e5), 64) == pytest.approx(5e5, rel=1e-4)


@pytest.mark.parametrize(
    "scaling,dim,message",
    [
        ({"name": "yran"}, 64, "Did you mean 'yarn'"),
        ({"name": "nope"}, 64, "Valid: base, compose, dca, dynamic_ntk"),
        ({"name": "linear", "factor": 0.5}, 64, "factor=0.5 must be >= 1"),
        ({"name": "ntk", "factor": 0.9}, 64, "factor=0.9 must be >= 1"),
        ({"name": "linear", "factor": 2}, 63, "positive even number, got head_dim=63"),
        ({"name": "linear", "beta_fast": 3}, 64, "does not take beta_fast"),
        ({"name": "yarn", "factor": 2}, 64, "needs original_max_position"),
        ({"name": "mixed", "factors": [1.0] * 31}, 64, "needs d/2 = 32 values"),
        (
            {
                "name": "longrope",
                "short_factor": [1.0] * 32,
                "long_factor": [2.0] * 3,
                "factor": 2,
                "original_max_position": 100,
            },
            64,
            "long_factor needs d/2 = 32",
        ),
        ({"name": "mixed", "bands": [{"dims": [0, 20], "factor": 1}, {"dims": [10, 32], "factor": 2}]}, 64, "overlaps"),
        ({"name": "mixed", "bands": [{"dims": [0, 20], "factor": 1}]}, 64, "uncovered"),
        ({"name": "mixed", "bands": [{"max_wavelength": 100, "factor": 1}]}, 64, "uncovered"),
        ({"name": "base", "base": 0.5}, 64, "must be > 1"),
        ({"name": "linear", "factor": 0}, 64, "factor=0 must be >= 1"),
        ({"name": "ntk", "factor": float("inf")}, 64, "factor=inf must be a finite number"),
        ({"name": "linear", "factor": "2"}, 64, "factor='2' must be a number"),
        ({"name": "yarn", "factor": 2, "original_max_position": 0}, 64, "original_max_position=0 must be >= 1"),
        ({"name": "yarn", "factor": 2, "original_max_position": 100, "beta_fast": 0}, 64, "beta_fast=0 must be > 0"),
        (
            {"name": "yarn", "factor": 2, "original_max_position": 100, "beta_fast": 1, "beta_slow": 2},
            64,
            "scaling 'yarn': beta_fast=1 must be > beta_slow=2",
        ),
        (
            {"name": "yarn", "factor": 2, "original_max_position": 100, "truncate": 1},
            64,
            "truncate=1 must be true or false",
        ),
        (
            {"name": "llama3", "factor": 2, "original_max_position": 100, "low_freq_factor": 4, "high_freq_factor": 1},
            64,
            "high_freq_factor=1 must be > low_freq_factor=4",
        ),
        ({"name": "mixed", "factors": [1.0] * 31 + [float("nan")]}, 64, "values must be finite and > 0"),
        ({"name": "mixed", "bands": [{"dims": [0, 32], "factor": 0}]}, 64, "needs a finite factor > 0"),
    ],
)
def test_bad_scaling_is_a_clear_error(scaling, dim, message):
    with pytest.raises(ScalingError, match=message.replace("(", r"\(").replace("[", r"\[")):
        frequencies({**scaling}, dim, 10000.0, seq_len=10**6)


def test_resolve_once_fills_defaults_and_the_trained_context_and_labels_the_scaling():
    yarn = rope_ext.resolve({"name": "yarn", "factor": 4}, trained_context=4096)
    assert yarn.params == {
        "factor": 4.0,
        "original_max_position": 4096,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": True,
        "attention_factor": None,
        "mscale": None,
        "mscale_all_dim": None,
        "dynamic": False,
    }
    assert rope_ext.resolve(yarn) is yarn  # a resolved scaling is taken as it is
    assert rope_ext.resolve(yarn.to_dict()) == yarn
    assert yarn.label == "yarn-factor4"
    assert rope_ext.resolve({"name": "yarn", "factor": 2, "beta_fast": 16}, 4096).label == "yarn-factor2-beta_fast16"
    assert rope_ext.resolve({"name": "pi", "factor": 2, "layer_types": "all"}).label == "linear-factor2-layers_all"
    assert rope_ext.resolve({"name": "none", "factor": 4}).label == "none"
    assert rope_ext.resolve({"name": "none", "factor": 4}).effective() == {"name": "none"}
    compose = rope_ext.resolve(
        {"name": "compose", "stages": [{"name": "base", "base": 5e5}, {"name": "yarn", "factor": 2}]},
        trained_context=2048,
    )
    assert compose.label == "compose[base-base500000,yarn-factor2]"
    assert compose.params["stages"][1].params["original_max_position"] == 2048 and not compose.dynamic


def test_docstring_examples_hold():
    """The examples in rope_ext's docstrings run (logn's llama4 form scales the query at m = L - 1)."""
    import doctest

    import rope_ext.strategies.query_scaling

    failed, tried = doctest.testmod(rope_ext.strategies.query_scaling, raise_on_error=False)
    assert tried >= 2 and failed == 0


def test_the_documented_python_api_example_runs(tiny_llama):
    """The Python API block (docs/extending.md, linked from the README), as a user would paste it, on a tiny model."""
    import re
    from pathlib import Path

    from tests.tiny import ROOT

    readme = (Path(ROOT) / "docs" / "extending.md").read_text()
    block = re.search(r"## The Python API\s+```python\n(.*?)```", readme, re.S).group(1)
    namespace = {"model": tiny_llama()}
    exec(compile(block, "docs/extending.md", "exec"), namespace)  # noqa: S102 -- our own docs
    assert namespace["inv_freq"].shape == (64,) and namespace["attention_factor"] > 1
