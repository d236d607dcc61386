"""The compare preset's units (issue #44, "presets that can decide"), recomputed: how many documents and passkey
prompts make a strategy that truly passes by a margin come out yes with >= 80% probability, simulated through the
verdict's own interval (evals.core.decision.paired.paired_ratio). A change of the interval method that moves these numbers
fails here until conf/experiment/compare.yaml says the new ones."""

import math

import pytest
from omegaconf import OmegaConf
from scipy import stats

from evals.core.run.budget import (
    POWER,
    SIX_NOVEL_INTERVALS,
    document_sd,
    passkey_power,
    ppl_power,
)
from tests.tiny import ROOT

PRESET = ROOT / "conf" / "experiment" / "compare.yaml"


def test_the_document_spread_is_backed_out_of_the_six_novel_intervals():
    sd = document_sd()
    assert sd == pytest.approx(0.0336, abs=5e-5)
    # each interval back again from its sd: exp(mean +/- t sd / sqrt 6)
    t = stats.t.ppf(0.975, 5)
    for low, high in SIX_NOVEL_INTERVALS.values():
        one = document_sd({"x": (low, high)})
        assert math.log(high) - math.log(low) == pytest.approx(2 * t * one / math.sqrt(6))


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_the_compare_preset_has_the_documents_and_prompts_the_power_calculation_gives():
    text = PRESET.read_text()
    preset = OmegaConf.load(PRESET).eval
    books = OmegaConf.load(ROOT / "conf" / "data" / "books.yaml").books
    sd = document_sd()
    # perplexity: 21 documents reach 80% power, 20 do not; the six novels give 0.10
    assert ppl_power(21, sd) >= POWER > ppl_power(20, sd)
    six = ppl_power(len(books), sd)
    nc = (math.log(1.1) - math.log(1.067)) * math.sqrt(6) / sd
    plain_t = 1 - stats.nct.cdf(stats.t.ppf(0.975, 5), 5, nc)  # a plain t over the 6 documents: 0.44
    assert six < plain_t - 0.2  # the calibrated interval pays for its coverage under skew with power
    assert f"power {six:.2f}" in text and "21 documents\n#   (power 0.81)" in text
    assert len(books) < 21 and preset.perplexity.documents is None  # all the data there is, and said to be short
    # passkey: 115 prompts (5 depths x 23 trials) reach 80%, 110 do not
    prompts = len(preset.passkey.depths) * preset.passkey.trials
    enough = passkey_power(115)
    assert prompts == 115 and enough >= POWER > passkey_power(110)
    assert f"115 prompts (5 depths x 23 trials; power {enough:.2f})" in text
