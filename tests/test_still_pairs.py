"""Pairs a model holds at frequency zero do not rotate, before or after a patch (rope_ext.patch's rule).

transformers' ``proportional`` RoPE (``modeling_rope_utils._compute_proportional_rope_parameters``; LFM3's
full-attention layers, Gemma-4) holds theta_i = b^(-2i/D) for the first a = int(partial_rotary_factor * D/2) of the
D/2 pairs of a D-wide head and 0 for the rest: those pairs carry content, no position. On a tiny LFM3 (the suite's,
evals/families.py) and a tiny Llama configured with proportional RoPE (partial_rotary_factor 0.5), every frequency
strategy keeps them at exactly 0 and gives the rotating pairs what the method's own formula gives for their wavelengths
lambda_i = 2*pi / theta_i (computed here from the frequencies transformers holds, not with rope_ext's code); the logits
move and restore() gives the model back bit for bit. Before the rule, linear x2 on LFM3 set the 4 still pairs to
5e-4 .. 2.8e-6 (the head's RoPE at b = 1e6, divided by 2): a silently different model."""

import math
import re

import pytest
import torch
from transformers import AutoModelForCausalLM

import rope_ext
from evals import families
from tests.tiny import tiny_llama

TRAINED, LENGTH = families.TRAINED, families.LENGTH  # 32, 72: the forward runs past 2L
LONG = [1.0, 2.0, 3.0, 4.0]  # LongRoPE's long factors, one per rotating pair (4 of the 8)
SETTINGS = {
    "linear": {"name": "linear", "factor": 2},
    "ntk": {"name": "ntk", "factor": 2},
    "yarn": {"name": "yarn", "factor": 4},
    "dynamic_ntk": {"name": "dynamic_ntk", "factor": 2},
    "llama3": {"name": "llama3", "factor": 4, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    "longrope": {"name": "longrope", "short_factor": [1.0] * 4, "long_factor": LONG, "factor": 4},
}


def proportional_llama():
    return tiny_llama(
        trained=TRAINED,
        head_dim=16,
        rope_parameters={"rope_type": "proportional", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
    )


BUILDERS = {"lfm3": lambda: families.build("lfm3"), "llama": proportional_llama}


@pytest.fixture(scope="module")
def models():
    return {}


def model_of(models, which):
    if which not in models:
        models[which] = BUILDERS[which]()
    return models[which]


def logits(model):
    with torch.no_grad():
        return model(input_ids=families.ids() % model.config.get_text_config().vocab_size, use_cache=False).logits


def expected(name: str, theta: torch.Tensor, trained: int, n: int) -> tuple[torch.Tensor, float]:
    """Each method's formula on pairs of frequencies theta (wavelengths lambda = 2*pi/theta, equally spaced in
    log lambda, as RoPE's are), at a forward of length n > trained L."""
    theta = theta.double()
    a, i = theta.numel(), torch.arange(theta.numel(), dtype=torch.float64)
    lam = 2 * math.pi / theta
    p = SETTINGS[name]
    if name == "linear":  # PI, Chen et al. 2023 (arXiv 2306.15595): positions / s
        return theta / p["factor"], 1.0
    if name in ("ntk", "dynamic_ntk"):
        # NTK-aware base b * s^(d/(d-2)) (bloc97): lambda_i * s^(i/(a-1)), the slowest pair stretched by exactly s;
        # dynamic (emozilla): s replaced by s*n/L - (s-1) at length n
        s = p["factor"] if name == "ntk" else p["factor"] * n / trained - (p["factor"] - 1)
        return theta * s ** (-i / (a - 1)), 1.0
    if name == "yarn":
        # YaRN (Peng et al. 2023, arXiv 2309.00071, and its code's find_correction_range / linear_ramp_mask): the ramp
        # runs over the pair axis between the pairs that turn beta_fast = 32 and beta_slow = 1 times over L (floor, ceil,
        # clamped to [0, 2a - 1]); 0 extrapolated, 1 interpolated by s; cos/sin times 0.1 ln s + 1
        s = p["factor"]
        step = math.log(float(lam[1] / lam[0]))  # log-wavelength between neighbouring pairs

        def at(rotations):  # the pair whose wavelength is L / rotations
            return math.log(trained / (rotations * float(lam[0]))) / step

        low, high = max(math.floor(at(32.0)), 0), min(math.ceil(at(1.0)), 2 * a - 1)
        high = high + 0.001 if low == high else high
        ramp = ((i - low) / (high - low)).clamp(0, 1)
        return theta / s * ramp + theta * (1 - ramp), 0.1 * math.log(s) + 1
    if name == "llama3":
        # Llama-3.1 (arXiv 2407.21783): lambda > L/low -> theta/s, lambda < L/high -> theta, blended by L/lambda between
        s, lo, hi = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
        smooth = ((trained / lam - lo) / (hi - lo)).clamp(0, 1)
        return (1 - smooth) * theta / s + smooth * theta, 1.0
    # LongRoPE (Ding et al. 2024, arXiv 2402.13753): theta_i / long_i past L, cos/sin times sqrt(1 + ln s / ln L)
    return theta / torch.tensor(LONG, dtype=torch.float64), math.sqrt(1 + math.log(p["factor"]) / math.log(trained))


@pytest.mark.parametrize("which", list(BUILDERS))
def test_the_rotary_slot_is_its_rotating_pairs_and_the_still_ones(which, models):
    """The rotating a = 4 pairs of the 16-wide head are RoPE of dim 8 at the base b^(8/16), on the meta model too."""
    model = model_of(models, which)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(model.config)
    base = 1e6 if which == "lfm3" else 1e4
    for found in (rope_ext.find_rotary_slots(model), rope_ext.find_rotary_slots(meta)):
        still = [s for s in found if s.still]
        assert [(s.dim, s.still, s.width) for s in still] == [(8, 4, 16)]
        assert still[0].base == pytest.approx(base ** (8 / 16), rel=1e-9)


@pytest.mark.parametrize("which", list(BUILDERS))
@pytest.mark.parametrize("name", list(SETTINGS))
def test_still_pairs_stay_still_and_the_rotating_ones_follow_the_method(which, name, models):
    model = model_of(models, which)
    slots = rope_ext.find_rotary_slots(model)
    held = {s: tuple(t.clone() if torch.is_tensor(t) else t for t in s.frequencies(model)) for s in slots}
    before = logits(model)
    with rope_ext.patch(model, SETTINGS[name], TRAINED) as patch:
        patched = logits(model)  # dynamic strategies: the frequencies of this length, n = 72
        checked = 0
        for slot in patch.slots:
            theta, _ = held[slot]
            zero = theta == 0
            if not zero.any():
                continue
            now, attention = slot.frequencies(model)
            assert torch.equal(now[zero], theta[zero])  # still: exactly 0
            want, want_attention = expected(name, theta[~zero], TRAINED, LENGTH)
            assert torch.allclose(now[~zero].double(), want, rtol=2e-6, atol=0), (now, want)
            assert attention == pytest.approx(want_attention, rel=1e-6)
            checked += 1
        assert checked == 1
        assert all("verified" in a for a in patch.applied)
    assert float((patched - before).abs().max()) > 1e-4  # the logits moved
    assert torch.equal(logits(model), before)  # restore() exact
    assert all(torch.equal(s.frequencies(model)[0], held[s][0]) for s in slots)


def test_a_factor_list_for_every_pair_is_refused_saying_which_rotate_and_the_model_is_untouched(models):
    model = model_of(models, "lfm3")
    before = logits(model)
    setting = {"name": "longrope", "short_factor": [1.0] * 8, "long_factor": [1.0] * 8, "factor": 4}
    with pytest.raises(rope_ext.ScalingError, match="needs d/2 = 4 values.*rotates 4 of its 8 pairs"):
        rope_ext.patch(model, setting, TRAINED)
    assert torch.equal(logits(model), before)
    assert model.model.rotary_emb.rope_type == {"full_attention": "proportional", "sliding_attention": "default"}


def test_a_model_shipping_proportional_rope_is_scaled_on_its_rotating_pairs_and_says_so(models):
    setting, said = rope_ext.inherit_shipped({"name": "yarn", "factor": 4}, model_of(models, "lfm3").config)
    assert setting == {"name": "yarn", "factor": 4}
    assert said == (
        "yarn scales the rotating pairs of the shipped proportional RoPE (partial_rotary_factor 0.5: the other pairs "
        "hold frequency 0 and stay still; the rotating ones rebuilt from rope_theta)"
    )


def test_no_engine_config_is_exported_for_pairs_held_still_or_a_sin_cos_table(models):
    """Neither can be said in rope_parameters (a partial_rotary_factor rotates other pairs; GPT-J's table reads none):
    every engine refuses in one line, never a config that serves another model."""
    from rope_ext.export import ENGINES, Unsupported, export, geometry

    cases = [(model_of(models, "llama"), "pairs still (proportional RoPE)"), (families.build("gptj"), "sin/cos table")]
    for model, why in cases:
        scaling = rope_ext.resolve({"name": "yarn", "factor": 2}, TRAINED)
        geo = geometry(model, scaling)
        for engine in ENGINES:
            with pytest.raises(Unsupported, match=f"not exported: its rotary .*{re.escape(why)}") as err:
                export(scaling, geo, engine)
            assert "\n" not in str(err.value)
    plain = tiny_llama(trained=TRAINED)
    export(
        rope_ext.resolve({"name": "yarn", "factor": 2}, TRAINED),
        geometry(plain, rope_ext.resolve({"name": "yarn", "factor": 2}, TRAINED)),
        "vllm",
    )


def test_the_qk_study_compares_the_rotating_pairs_and_keeps_the_still_ones_still(models):
    """The q/k study's own and strategy frequencies (evals/tasks/qk_study/measure.py) are the patcher's: the strategy on
    the rotating pairs, the pairs held at 0 still -- never rebuilt over the whole head from the rotating base."""
    from evals.tasks.qk_study.measure import _changed, slot_frequencies

    (slot,) = rope_ext.find_rotary_slots(model_of(models, "llama"))
    own, _ = slot_frequencies(slot, slot.width)
    held = slot.frequencies(model_of(models, "llama"))[0]
    torch.testing.assert_close(own, held.to(own.dtype), rtol=1e-6, atol=0)
    scaled, _ = slot_frequencies(slot, slot.width, rope_ext.resolve({"name": "linear", "factor": 2}, TRAINED))
    assert torch.equal(scaled[slot.dim // 2 :], torch.zeros(slot.still, dtype=scaled.dtype))
    torch.testing.assert_close(scaled[: slot.dim // 2], own[: slot.dim // 2] / 2)
    assert _changed(own, scaled).tolist() == [True] * (slot.dim // 2) + [False] * slot.still
