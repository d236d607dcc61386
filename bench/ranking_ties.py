"""The ranked answer's ties, measured through the real verdicts: simulated compare sweeps at 2x on six documents
(a model trained at 8192 judged at 16384), each strategy judged against the unscaled model by the verdict a job
applies (evals/core/decision/verdict.py via evals/report/judge.py) and ranked by evals/core/decision/ranking.py.

A sweep: the unscaled model at 8192 and 16384 (x2.0 there: it fails), and strategies of known true perplexity
ratios at 16384 (and x1.00 at 8192, their short context). Every run shares each 256-token block's difficulty; each
strategy adds its own per-document effect (what a strategy does differently on a document) and its own block
noise. With these sizes a strategy that loses nothing is yes against the unscaled model in about 40% of sweeps,
so two equal strategies have different verdict states in about half of them: the states cannot decide ties.

Measured per case: how often the equal strategies are split (not all in one tie group) -- at most 5% family-wise is
the ranking's promise; how often their verdict states
differ (what the earlier rule, tied only when the states are equal, split on); and how often one strategy truly
10% better (x0.90 at the target) comes first, and how often it is alone in the first group (the equal ones all
separated from it). And the price a tie must not pay: a strategy that truly loses 15% (x1.15, past the 10%
tolerance) beside one that loses nothing -- how often it is recommended (its own verdict: never yes, so a rule that
recommended strategies tied with a recommended one would recommend it whenever the tie holds).

    python bench/ranking_ties.py                 # prints the table
    python bench/ranking_ties.py --write         # and rewrites it in docs/verdict.md (between the ties markers)
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evals.core.decision.ranking import rank  # noqa: E402
from evals.core.decision.verdict import DEFAULTS  # noqa: E402
from evals.core.measure import Measurement  # noqa: E402
from evals.core.registry import Metric  # noqa: E402
from evals.report.judge import judge_all  # noqa: E402

TRAINED, TARGET, BLOCK, DOCUMENTS = 8192, 16384, 256, 6
PPL = Metric("ppl", lower_is_better=True, verdict=True, count="tokens", nll=True, unit="token block").declared(
    "perplexity"
)
DIFFICULTY, OWN_DOCUMENT, OWN_BLOCK = 0.3, 0.03, 0.03  # sd of the log-perplexity terms (shared, per strategy)
CASES = ((2, None), (3, None), (5, None), (6, None), (4, 0.90))  # (equal strategies at x1.00, one better: ratio)
MARKERS = ("<!-- ties:begin (bench/ranking_ties.py --write) -->", "<!-- ties:end -->")


def _job(strategy: str, measurements: list[Measurement]) -> dict:
    return {
        "job": {
            "scaling": strategy,
            "eval": "perplexity",
            "model_label": "sim",
            "weights": "random",
            "role": "job",
            "trained_context": TRAINED,
            "target_length": TARGET,
            "compare": {"perplexity": "same"},
            "environment": "e",
        },
        "status": "done",
        "state": "done",
        "declared": {"ppl": PPL},
        "dir": f"sim/{strategy}",
        "measurements": [m.record() for m in measurements],
    }


def sweep(rng, ratios: dict[str, float], documents: int = DOCUMENTS) -> list[dict]:
    """One simulated compare sweep: the unscaled model and ``ratios`` ({strategy: true perplexity ratio at the
    target}), as report entries."""
    blocks = TARGET // BLOCK
    shared = rng.normal(0, DIFFICULTY, (documents, blocks)) + math.log(20.0)
    jobs = []
    for strategy, ratio in {"none": 2.0, **ratios}.items():
        own = rng.normal(0, OWN_DOCUMENT, (documents, 1)) if strategy != "none" else 0.0
        nll = shared + own + rng.normal(0, OWN_BLOCK, shared.shape)
        found = []
        for length, shift in ((TRAINED, 0.0), (TARGET, math.log(ratio))):
            n = length // BLOCK
            units = {
                f"doc{d}/{BLOCK * b}": (BLOCK * float(nll[d, b] + shift), BLOCK)
                for d in range(documents)
                for b in range(n)
            }
            value = math.exp(sum(t for t, _ in units.values()) / (BLOCK * len(units)))
            found.append(Measurement("ppl", length, value, BLOCK * len(units), "256-token block", units))
        jobs.append(_job(strategy, found))
    return jobs


def outcome(jobs: list[dict]) -> dict:
    """The ranked answer's rows of one sweep by strategy, judged and ranked as a report does."""
    verdicts, _, _ = judge_all(jobs, dict(DEFAULTS))
    (group,) = rank(jobs, verdicts)
    return {r["strategy"]: r for r in group["rows"]}


def measure(equal: int, better: float | None = None, sweeps: int = 400, seed: int = 0) -> dict:
    """Over ``sweeps`` sweeps of ``equal`` strategies at x1.00 (and one at ``better``): the share split, the share
    whose states differ, the share each equal one is yes, and the share the better one is alone in group 1."""
    rng = np.random.default_rng(seed)
    split = states_differ = yes = alone = leads = 0
    names = [f"s{i}" for i in range(equal)]
    for _ in range(sweeps):
        ratios = dict.fromkeys(names, 1.0) | ({"better": better} if better else {})
        rows = outcome(sweep(rng, ratios))
        split += len({rows[n]["tie_group"] for n in names}) > 1
        states_differ += len({rows[n]["state"] for n in names}) > 1
        yes += sum(rows[n]["state"] == "yes" for n in names)
        if better:
            first = rows["better"]["tie_group"]
            alone += first == 1 and all(rows[n]["tie_group"] != first for n in names)
            leads += next(iter(rows)) == "better"
    return {
        "equal": equal,
        "better": better,
        "sweeps": sweeps,
        "split": split / sweeps,
        "states_differ": states_differ / sweeps,
        "yes": yes / (sweeps * equal),
        "alone": alone / sweeps if better else None,
        "leads": leads / sweeps if better else None,
    }


def failing_recommended(bad: float = 1.15, sweeps: int = 400, seed: int = 99) -> dict:
    """Over ``sweeps`` sweeps of a strategy at x1.00 and one at ``bad``: the share where the bad one is recommended,
    and the share where it is tied with the good one (named beside it, not recommended)."""
    rng = np.random.default_rng(seed)
    recommended = tied = 0
    for _ in range(sweeps):
        rows = outcome(sweep(rng, {"good": 1.0, "bad": bad}))
        recommended += rows["bad"]["recommended"]
        tied += rows["bad"]["tie_group"] == rows["good"]["tie_group"]
    return {"bad": bad, "sweeps": sweeps, "recommended": recommended / sweeps, "tied": tied / sweeps}


def table(results: list[dict]) -> list[str]:
    head = [
        "| equal strategies (x1.00) | one x0.90 | sweeps | split by the ranking | verdict states differ "
        "(the earlier rule's splits) | an equal one yes | the x0.90 one first | the x0.90 one alone in group 1 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    return head + [
        f"| {r['equal']} | {'yes' if r['better'] else 'no'} | {r['sweeps']} | {pct(r['split'])} | "
        f"{pct(r['states_differ'])} | {pct(r['yes'])} | {pct(r['leads'])} | {pct(r['alone'])} |"
        for r in results
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=400)
    parser.add_argument("--write", action="store_true", help="rewrite the table in docs/verdict.md")
    args = parser.parse_args(argv)
    results = [measure(k, better, args.sweeps, seed=10 * k + bool(better)) for k, better in CASES]
    bad = failing_recommended(sweeps=args.sweeps)
    lines = table(results) + [
        "",
        f"A strategy at x{bad['bad']:.2f} (past the 10% tolerance) beside one at x1.00, {bad['sweeps']} sweeps: tied "
        f"with it in {100 * bad['tied']:.1f}%, recommended in {100 * bad['recommended']:.1f}% (a tie is not a yes).",
    ]
    print("\n".join(lines))
    if args.write:
        doc = ROOT / "docs" / "verdict.md"
        text = doc.read_text()
        start, end = text.index(MARKERS[0]) + len(MARKERS[0]), text.index(MARKERS[1])
        doc.write_text(text[:start] + "\n" + "\n".join(lines) + "\n" + text[end:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
