"""Honest intervals (evals/core/stats.py): the t interval and Wilson's interval against scipy, and the interval each
perplexity row gets (a block bootstrap for one document, t for several)."""

import json
import math

import pytest
import torch
from scipy import stats

from evals.tasks import perplexity
from evals.core.inputs.data import Document
from evals.core.stats import block_bootstrap, t_interval


@pytest.mark.parametrize("n", [2, 5])
def test_t_interval_matches_scipy(n):
    values = [2.0 + 0.3 * math.sin(i) for i in range(n)]
    low, high = t_interval(values)
    expected = stats.t.interval(0.95, n - 1, loc=sum(values) / n, scale=stats.sem(values))
    assert (low, high) == pytest.approx(expected, rel=1e-12)
    normal = 1.96 * stats.sem(values)
    assert (high - low) / 2 > normal  # wider than the normal approximation it replaces (6.5x for n = 2)


def test_one_document_gets_a_block_bootstrap_interval_and_two_a_t_interval(eval_context, structured):
    generator = torch.Generator().manual_seed(1)
    one = [Document("one", torch.randint(3, 96, (1200,), generator=generator))]
    ctx = eval_context(None, docs=one)
    perplexity.evaluate(structured(perplexity.PerplexityConfig, lengths=[64, 1024], bootstrap_block=128), ctx)
    rows = {
        r["length"]: r
        for r in json.loads((ctx.output.dir / "results.json").read_text())["metrics"]["perplexity"]["by_length"]
    }
    assert rows[1024]["ci_method"] == "block bootstrap, 128-token blocks"
    assert rows[1024]["ci95_low"] < rows[1024]["ppl"] < rows[1024]["ci95_high"]
    assert rows[64]["ci_method"] is None and rows[64]["ci95_low"] is None  # one block: no interval claimed
    nll = torch.rand(1000, generator=generator)
    assert block_bootstrap(nll, 100, seed=3) == block_bootstrap(nll, 100, seed=3)  # seeded
    ctx = eval_context(None)  # three documents (300, 260, 150 tokens)
    summary = perplexity.evaluate(
        structured(perplexity.PerplexityConfig, lengths=[64, 200], min_document_tokens=0), ctx
    )
    rows = {
        r["length"]: r
        for r in json.loads((ctx.output.dir / "results.json").read_text())["metrics"]["perplexity"]["by_length"]
    }
    assert rows[64]["ci_method"] == "t, 3 documents" and rows[200]["ci_method"] == "t, 2 documents"
    assert summary["ppl_ci95_low@200"] == rows[200]["ci95_low"] and summary["tokens@200"] == 2 * 199


@pytest.mark.parametrize("k,n", [(0, 3), (2, 3), (3, 3), (7, 20)])
def test_wilson_interval_matches_scipy(k, n):
    from evals.core.stats import wilson_interval

    expected = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert wilson_interval(k, n) == pytest.approx((expected.low, expected.high), abs=1e-12)


def test_advice_says_plainly_when_the_units_at_hand_cannot_decide_and_never_claims_the_limit_wrongly():
    """Two documents x0.94-1.05 with an interval of many decades printed "the estimate sits on the limit"; an
    estimate that prints as the limit still does. More than 20x the units at hand: said plainly (the cautious plan's
    number overstated what decides it 10x and more: none is promised, the one on the current spread is given when
    it is within 20x)."""
    from evals.core.decision.verdict import judge
    from evals.core.decision.reference import Reference
    from evals.core.measure import Measurement

    def run(nlls: dict) -> dict:
        units = {f"{d}/{256 * b}": (256 * v, 256.0) for d, row in nlls.items() for b, v in enumerate(row)}
        mean = sum(t for t, _ in units.values()) / sum(w for _, w in units.values())
        return Measurement("ppl", 4096, math.exp(mean), 4096, "256-token block", units).record()

    declared = {"ppl": {"name": "ppl", "lower_is_better": True, "verdict": True, "nll": True, "eval": "perplexity"}}

    def reason(own: dict, ref: dict) -> str:
        reference = Reference(records={("ppl", 4096): run(ref)}, sources=["x"])
        found = judge([run(own)], declared, reference, 4096, 4096, {"tolerance": 0.1, "retained": 0.85})
        return found["summary"]["verdict_reason@4096"]

    ref = {"a": [3.0] * 16, "b": [3.2] * 16}
    two = reason({"a": [3.0 + 0.13] * 16, "b": [3.2 - 0.12] * 16}, ref)
    assert "2 documents cannot decide a x1.01 vs x1.1 question: with 2 the spread itself is unknown" in two
    assert "a plan that holds needs over 20x as many" in two and "sits on the limit" not in two
    assert "sits on the limit (x1.1)" in reason({"a": [3.0 + 0.25] * 16, "b": [3.2 - 0.0594] * 16}, ref)


def test_a_position_drift_warning_travels_with_the_verdict():
    """Twenty documents whose text gets 30% harder past T: the 2x verdict is what it is, and one line says the data
    show a drift that large, in results.json's summary (W&B's too) and the printed notes."""
    import numpy as np

    from evals.core.decision.reference import Reference
    from evals.core.decision.verdict import judge
    from evals.core.decision.verdict_text import format_job
    from evals.core.measure import Measurement
    from tests.test_calibration import drifting_documents

    own, ref = drifting_documents(np.random.default_rng(4), 20, 16, math.log(1.3))
    declared = {"ppl": {"name": "ppl", "lower_is_better": True, "verdict": True, "nll": True, "eval": "perplexity"}}

    def record(units, length):
        mean = sum(t for t, _ in units.values()) / sum(w for _, w in units.values())
        return Measurement("ppl", length, math.exp(mean), length, "256-token block", units).record()

    reference = Reference(records={("ppl", 4096): record(ref, 4096)}, sources=["x"])
    found = judge([record(own, 8192)], declared, reference, 4096, 8192, {"tolerance": 0.1, "retained": 0.85})
    assert found["summary"]["verdict_state"] == "NO"
    assert found["summary"]["verdict_notes"].startswith("ppl: position effect at 8192")
    assert any("note: ppl: position effect" in line for line in format_job("yarn on x", found))
