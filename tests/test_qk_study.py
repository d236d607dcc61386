"""eval=qk_study: the FFT profiles equal brute force on real captured q and k, the mean-field profile equals
explicit rotations of the means, the eval runs end to end, and bad input is one line before the model loads."""

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import rope_ext
from evals.core.job.parse import parse_job
from evals.tasks.qk_study import QKStudyError, claims
from rope_ext.strategies import analysis


def captured_layers(model_type="llama", tokens=40, **extra):
    fields = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        max_position_embeddings=64,
        **extra,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(model_type, **fields), attn_implementation="sdpa"
    ).eval()
    layers = []
    with rope_ext.capture(model, layers.append), torch.no_grad():
        model(torch.randint(3, 100, (1, tokens), generator=torch.Generator().manual_seed(1)))
    return layers


@pytest.mark.parametrize("model_type, extra", [("llama", {}), ("gpt_neox", {"rotary_pct": 0.5})])
def test_fft_profile_equals_brute_force_over_token_pairs(model_type, extra):
    layer = captured_layers(model_type, **extra)[1]
    q, k = layer.query[0].double(), layer.key[0].double()  # (H, n, d), unrotated
    groups = q.shape[0] // k.shape[0]  # GQA: each key head serves this many query heads
    k = k.repeat_interleave(groups, 0)
    n, d = q.shape[1], q.shape[2]
    rotary = 2 * len(layer.pairs[0])
    for inv_freq in (
        layer.inv_freq,
        layer.inv_freq / 4,
        rope_ext.frequencies({"name": "p_rope", "fraction": 0.5}, rotary, 1e4)[0],
    ):
        # brute force: every query at m + r against every key at m, rotated explicitly, averaged per distance
        positions = torch.arange(n)[None]
        rq = rope_ext.attention.capture.rotate(q[None], positions, inv_freq, layer.pairs)[0]
        rk = rope_ext.attention.capture.rotate(k[None], positions, inv_freq, layer.pairs)[0]
        scores = rq @ rk.transpose(-1, -2)  # (H, n, n): [h, query, key]
        brute = torch.stack([torch.diagonal(scores, offset=-r, dim1=-2, dim2=-1).mean(-1) for r in range(n)], -1)
        zq, zk = analysis.complex_pairs(q, layer.pairs), analysis.complex_pairs(k, layer.pairs)
        theta = inv_freq.double()
        if d > rotary:  # pass-through dims: pairs of their own with theta = 0
            zq = torch.cat([zq, torch.complex(q[..., rotary:], torch.zeros_like(q[..., rotary:]))], -1)
            zk = torch.cat([zk, torch.complex(k[..., rotary:], torch.zeros_like(k[..., rotary:]))], -1)
            theta = torch.cat([theta, torch.zeros(d - rotary, dtype=torch.float64)])
        fft = analysis.profile_from_correlation(analysis.cross_correlation(zq, zk), theta)
        torch.testing.assert_close(fft, brute, atol=1e-9, rtol=1e-9)
        if inv_freq is layer.inv_freq:  # and, with the model's frequencies, the scores attention computed
            model_scores = layer.call.query[0].double() @ layer.call.key[0].double().repeat_interleave(
                groups, 0
            ).transpose(-1, -2)
            torch.testing.assert_close(scores, model_scores, atol=1e-4, rtol=1e-4)


def test_mean_field_profile_is_the_mean_query_rotated_against_the_mean_key():
    layer = captured_layers()[0]
    mu_q = analysis.complex_pairs(layer.query[0], layer.pairs).mean(1)  # (H, P)
    mu_k = (
        analysis.complex_pairs(layer.key[0], layer.pairs).mean(1).repeat_interleave(2, 0)
    )  # GQA: 2 query heads per key head
    profile = analysis.mean_field_profile(mu_q, mu_k, layer.inv_freq, 300, attention_factor=1.5, chunk=64)
    a, b = layer.pairs
    mean_q, mean_k = layer.query[0].double().mean(1), layer.key[0].double().mean(1)  # (H, d)
    for h in range(4):
        for r in (0, 1, 17, 299):
            # interleave the pair dims so pair_score's (x_2i, x_2i+1) convention applies
            qi = torch.stack([mean_q[h, a], mean_q[h, b]], -1).flatten()
            ki = torch.stack([mean_k[h // 2, a], mean_k[h // 2, b]], -1).flatten()
            # the mean query r positions after the mean key: <R_r mu_q, mu_k>, pair_score's convention at distance r
            explicit = analysis.pair_score(qi, ki, layer.inv_freq, torch.tensor(float(r))) * 1.5**2
            assert float(profile[h, r]) == pytest.approx(float(explicit), rel=1e-9, abs=1e-12)
    # locality: the near mean minus the far half's mean
    flat = torch.cat([torch.full((1, 10), 3.0), torch.zeros(1, 90)], -1)
    assert float(analysis.locality(flat, near=5, window=100)) == pytest.approx(3.0)


def test_claims_read_the_sign_and_size_of_the_means():
    heads = [
        {
            "mean_dot": m,
            "mean_norm": abs(m),
            "locality": 0.8 * m + 0.01 * i,
            "locality_meanfield": m,
            "variance_share_q": 1 - abs(m) / 3,
            "variance_share_k": 1 - abs(m) / 3,
            "relative_locality": m,
        }
        for i, m in enumerate([-2.0, -1.5, -1.0, -0.5, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0])
    ]
    found = claims(heads)
    assert found["mean_predicts_decay"]["verdict"] == "holds" and found["mean_predicts_decay"]["rho"] == pytest.approx(
        1.0
    )
    assert found["signed_mean_orders_decay"]["verdict"] == "holds"
    assert found["opposite_means_rise"]["fraction_rising"] == 1.0 and found["opposite_means_rise"]["verdict"] == "holds"
    assert found["mean_field_explains_decay"]["verdict"] == "holds"
    flipped = claims([{**h, "locality": -h["locality"]} for h in heads])
    assert flipped["signed_mean_orders_decay"]["verdict"] == "contradicted"


QK = [
    "eval=qk_study",
    "eval.tokens=128",
    "eval.near=4",
    "eval.bins=16",
    "eval.pair_samples=256",
    "data.books=[persuasion]",
]


def test_qk_study_runs_end_to_end_and_reports_through_the_output_sink(tmp_path, run_job):
    text = tmp_path / "text.txt"  # a text file instead of the novels: nothing to unpack, the same eval
    text.write_text(" ".join(f"Sentence {i} of a plain text that the tiny model reads once." for i in range(60)))
    summary, results = run_job(
        tmp_path / "run",
        *QK[:-1],
        "data=text_files",
        f"data.glob={text}",
        "scaling=compose",
        "scaling.stages=[{name: yarn, factor: 2}, {name: logn}]",
    )
    assert results["status"] == "done" and summary["heads"] == 2 * 4
    out = tmp_path / "run"
    for name in (
        "qk_heads.csv",
        "qk_layers.csv",
        "qk_pairs.csv",
        "qk_profiles.csv",
        "qk_strategies.csv",
        "qk_dimensions.csv",
        "qk_heatmaps.png",
        "qk_profiles_local.png",
        "qk_profiles_global.png",
        "qk_energy.png",
        "qk_claims.png",
    ):
        assert (out / name).is_file(), name
    metrics = results["metrics"]["qk_study"]
    assert set(metrics["claims"]) == {
        "mean_predicts_decay",
        "signed_mean_orders_decay",
        "variance_weakens_decay",
        "mean_field_explains_decay",
        "opposite_means_rise",
    }
    assert all(0 <= layer["local_fraction"] <= 1 for layer in metrics["layers"])
    # TINY: d = 64 / 4 heads = 16, b = 1e4, L = 2048: lambda_i = 2 pi 10^(i/2); i <= 5 turn within L (1987 < 2048),
    # i = 6, 7 do not (6283, 19869): Liu et al.'s critical dimension is 6 of the 8 pairs
    assert {(layer["critical_pair"], layer["pairs"]) for layer in metrics["layers"]} == {(6, 8)}
    assert summary["energy_changed/linear-factor2"] == pytest.approx(1.0)  # PI changes every pair
    assert 0 < summary["energy_changed/yarn-factor2"] < summary["energy_changed/ntk-factor2"] < 1
    pairs = (out / "qk_pairs.csv").read_text().splitlines()
    assert len(pairs) == 1 + 2 * (4 + 2) * 8  # layers x (q heads + kv heads) x pairs


def test_qk_study_bad_input_is_one_line_before_the_model_loads(tmp_path, compose, run_job):
    text = tmp_path / "short.txt"
    text.write_text("A short text. " * 20)
    with pytest.raises(
        QKStudyError, match=r"eval.tokens=128 exceeds document 0 \(short: \d+ tokens; the longest has \d+\)"
    ):
        run_job(tmp_path / "run", *QK[:2], "data=text_files", f"data.glob={text}")
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert "model_load_s" not in results["timings"] and results["error"]["user_error"]
    with pytest.raises(QKStudyError, match=r"eval.near=80 must be below half"):
        parse_job(compose(*QK, "eval.near=80", "model=tinyllama", "model.weights=random"), tmp_path / "x")
    from evals.core.errors import ScalingConfigError

    with pytest.raises(ScalingConfigError, match="fraction=2.0 must be <= 1"):
        parse_job(
            compose(*QK, "model=tinyllama", "model.weights=random", "eval.compare=[{name: p_rope, fraction: 2.0}]"),
            tmp_path / "y",
        )
