"""Honest intervals (evals/stats.py): the t interval and Wilson's interval against scipy, and the interval each
perplexity row gets (a block bootstrap for one document, t for several)."""

import json
import math

import pytest
import torch
from scipy import stats

from evals import perplexity
from evals.core.inputs.data import Document
from evals.stats import block_bootstrap, t_interval


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
    from evals.stats import wilson_interval

    expected = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert wilson_interval(k, n) == pytest.approx((expected.low, expected.high), abs=1e-12)
