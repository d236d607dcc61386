"""Costs with their noise (issue #55): a strategy's time against the unscaled model's is measured on paired forwards
(evals/core/scoring/cost.py) and said with its 95% interval, or not at all; one elapsed time against one is not a ratio.
Checked by simulation with a known truth (timings of a busy machine: lognormal noise per forward, a shared drift),
and on a real job, which keeps its timed forwards."""

import re

import numpy as np

from evals.core.decision.ranking import format_group, rank
from evals.core.decision.verdict import DEFAULTS
from evals.report.judge import judge_all
from evals.core.scoring.cost import time_ratio, time_text
from tests.test_ranking import ppl_job


def forwards(seconds) -> dict:
    return {"timings": {"elapsed_s": float(sum(seconds)), "forwards": [[16384, 16384, s, 1] for s in seconds]}}


def busy(rng, truth: float, documents: int, noise: float = 0.3):
    """(strategy, unscaled) seconds of ``documents`` forwards: the machine's load drifts (shared by the pair's two
    forwards, run in the same sweep) and each forward adds its own noise."""
    load = np.exp(rng.normal(0, 0.5, documents))
    reference = 100 * load * np.exp(rng.normal(0, noise, documents))
    return truth * 100 * load * np.exp(rng.normal(0, noise, documents)), reference


def test_the_interval_covers_the_true_cost_ratio_on_a_busy_machine():
    rng = np.random.default_rng(55)
    for truth in (1.0, 1.3):
        covered = 0
        for _ in range(400):
            own, reference = busy(rng, truth, 6)
            found = time_ratio([(forwards(own), forwards(reference))])
            covered += found["low"] <= truth <= found["high"]
        assert covered / 400 >= 0.92, (truth, covered)


def test_one_timing_against_one_is_no_ratio_and_a_difference_inside_the_noise_says_so():
    own, reference = busy(np.random.default_rng(1), 0.22, 1)  # the old column's "self_extend time x0.22"
    assert time_ratio([(forwards(own), forwards(reference))]) is None
    same = time_ratio([(forwards([100, 150, 90]), forwards([110, 140, 95]))])
    assert time_text(same).endswith(", no difference") and same["n"] == 3
    assert not time_text(time_ratio([(forwards([200, 210, 190]), forwards([100, 99, 101]))])).endswith("difference")


def test_the_ranking_is_the_same_whatever_the_timings_and_prints_the_spread():
    rng = np.random.default_rng(7)
    orders = set()
    for _ in range(3):
        jobs = [
            {**ppl_job(s, v, seed), **forwards(rng.lognormal(4.6, 0.8, 6))}
            for seed, (s, v) in enumerate({"none": 53.0, "dca": 26.20, "yarn": 27.0, "self_extend": 26.21}.items())
        ]
        verdicts, _, _ = judge_all(jobs, dict(DEFAULTS))
        (group,) = rank(jobs, verdicts)
        orders.add(tuple(r["strategy"] for r in group["rows"]))
        printed = "\n".join(format_group(group))
        assert re.search(r"cost: time x[\d.]+ \[[\d.]+, [\d.]+\](, no difference)?", printed), printed
    assert len(orders) == 1, orders


def test_a_job_keeps_its_timed_forwards(run_job, tmp_path):
    _, results = run_job(tmp_path, "eval.lengths=[256]", "eval.documents=3")
    kept = results["timings"]["forwards"]
    assert len(kept) == 3 and all(length == new == 256 and seconds > 0 for length, new, seconds, _ in kept), kept
