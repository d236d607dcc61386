"""Published claims about RoPE's long-distance decay and base bound, as tests (RoFormer; Barbero et al. 2024;
the tinymind mean/variance experiment; Men et al. 2024)."""

import pytest
import torch

import rope_ext
from rope_ext.strategies import analysis


def curve(base, dim=512, max_distance=65536, **vectors):
    inv_freq, attention = rope_ext.frequencies({"name": "none"}, dim, base)
    return analysis.decay_curve(inv_freq, max_distance, attention_factor=attention, **vectors)


def test_all_ones_score_is_twice_the_cosine_sum_and_matches_explicit_rotation():
    inv_freq = rope_ext.default_inv_freq(8, 10000.0)
    q = torch.ones(8, dtype=torch.float64)
    for r in (0, 1, 7, 300):
        # explicit block-diagonal rotation R_r applied to k, then q^T R_r k
        angle = r * inv_freq.double()
        rotated = torch.empty(8, dtype=torch.float64)
        rotated[0::2] = q[0::2] * angle.cos() - q[1::2] * angle.sin()
        rotated[1::2] = q[0::2] * angle.sin() + q[1::2] * angle.cos()
        assert float(q @ rotated) == pytest.approx(float(analysis.decay_curve(inv_freq, r + 1)[r]), abs=1e-9)


def test_roformer_base_1e4_decays_over_4096_but_rises_again_near_15000():
    score = curve(10000.0)
    assert analysis.decay_strength(score[:4096]) > 0.3
    assert analysis.first_rise(score[:4096]) is None
    rise = analysis.first_rise(score)
    assert rise is not None and 10000 < rise < 20000


def test_roformer_base_5e6_keeps_decaying_over_65536():
    score = curve(5e6)
    assert analysis.first_rise(score) is None
    assert analysis.decay_strength(score) > 0.3


def strengths(q_mean, k_mean, std=1.0, seeds=range(4)):
    return [
        analysis.decay_strength(
            curve(10000.0, dim=768, max_distance=5000, q_mean=q_mean, k_mean=k_mean, std=std, seed=seed)
        )
        for seed in seeds
    ]


def test_zero_mean_gaussian_qk_show_no_decay():
    assert all(abs(s) < 0.1 for s in strengths(0.0, 0.0))


def test_gaussian_qk_same_sign_means_decay_more_as_mean_grows():
    weak, strong = strengths(0.2, 0.2), strengths(1.0, 1.0)
    assert min(weak) > 0.05 and sum(strong) > sum(weak) + 0.5
    assert all(s > 0.3 for s in strengths(-1.0, -1.0))


def test_gaussian_qk_opposite_sign_means_rise_with_distance():
    assert all(s < -0.3 for s in strengths(1.0, -1.0))


def test_gaussian_qk_larger_variance_weakens_decay():
    assert sum(strengths(1.0, 1.0, std=3.0)) < sum(strengths(1.0, 1.0, std=0.5))


@pytest.mark.slow  # a bound search per table cell (~25 s)
def test_base_bound_matches_men_et_al_table():
    # Men et al. 2024 (arXiv 2405.14591) Table 1, d = 128: L = 1k -> 4.3e3, 4k -> 2.7e4 (2.9e4 on our finer search)
    assert analysis.base_lower_bound(128, 1024) == pytest.approx(4.3e3, rel=0.05)
    assert analysis.base_lower_bound(128, 4096) == pytest.approx(2.8e4, rel=0.06)


@pytest.mark.slow  # ~20 s of bound searches
def test_base_bound_is_tight_and_grows_with_context():
    b = analysis.base_lower_bound(64, 2048)
    assert analysis.satisfies_bound(b, 64, 2048) and not analysis.satisfies_bound(b * 0.99, 64, 2048)
    assert analysis.base_lower_bound(64, 512) < b < 10 * 2048 * 100
    with pytest.raises(ValueError, match="even dim"):
        analysis.base_lower_bound(63, 100)


def test_dimension_table_regimes_for_yarn_and_pi():
    inv_freq, _ = rope_ext.frequencies({"name": "yarn", "factor": 4.0, "original_max_position": 4096}, 128, 10000.0)
    table = analysis.dimension_table(inv_freq, 10000.0, 4096)
    regimes = [r["regime"] for r in table]
    # YaRN: fast pairs (wavelength << L) extrapolated, slow ones (wavelength > L) interpolated, a ramp between
    assert regimes[0] == "extrapolated" and regimes[-1] == "interpolated" and "blended" in regimes
    assert regimes == sorted(regimes, key=["extrapolated", "blended", "interpolated"].index)
    assert all(r["wavelength_over_context"] > 1 for r in table if r["regime"] == "interpolated")
    linear, _ = rope_ext.frequencies({"name": "linear", "factor": 2.0}, 128, 10000.0)
    assert {r["regime"] for r in analysis.dimension_table(linear, 10000.0, 4096)} == {"interpolated"}
