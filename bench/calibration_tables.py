"""The calibration tables of docs/verdict.md, regenerated from the simulations the tests run (tests/test_calibration.py, tests/test_advice.py:
the same functions, seeds and replications, so a table here is what the test asserts on): coverage / false yes of the
cluster interval over documents (normal and skewed), of the paired-accuracy interval (Tang, Tang & Chan 2003), of the
one-document interval at 1x under long memory (fractional Gaussian noise), how often "about k more ..." decides when
followed, and how often the position check warns of a drift.

    python bench/calibration_tables.py              # prints every table
    python bench/calibration_tables.py --write      # and rewrites each in docs/verdict.md, between its markers
    python bench/calibration_tables.py long_memory  # one table

The "earlier" columns of the one-document table stay as written: they measured code that is gone.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import test_advice as advice  # noqa: E402
from tests import test_calibration as sim  # noqa: E402
from evals.core.stats import cluster_interval, tang_interval  # noqa: E402

DOC = ROOT / "docs" / "verdict.md"


def several_documents() -> list[str]:
    """test_several_documents_normal_and_skewed, test_one_large_document_among_tiny_ones_counts_as_about_one and
    test_different_documents_on_each_side_are_compared_on_the_shared_ones."""
    lines = ["| documents | normal: coverage / false yes | lognormal σ 0.5 | lognormal σ 1 |", "|---|---|---|---|"]
    for count in (2, 3, 4, 6, 10, 20):
        cells = []
        for sigma in (0.0, 0.5, 1.0):
            estimate, u, h = sim.documents(np.random.default_rng(count * 10 + int(10 * sigma)), sim.REPS, count, sigma)
            coverage, below, _ = sim.rates(*cluster_interval(u, h, estimate)[:2], sim.DELTA)
            cells.append(f"{coverage:.3f} / {below:.3f}")
        lines.append(f"| {count} | {' | '.join(cells)} |")
    large = []
    for sigma in (0.0, 1.0):
        estimate, u, h = sim.documents(np.random.default_rng(5), sim.REPS, 20, sigma, weights=[39.0] + [1.0] * 19)
        coverage, below, _ = sim.rates(*cluster_interval(u, h, estimate)[:2], sim.DELTA)
        large.append(f"{coverage:.3f} / {below:.3f}")
    lines.append(f"| 1 of 39 blocks + 19 of 1 block | {large[0]} | | {large[1]} (σ 1) |")
    coverage, below = sim.different_document_sets(np.random.default_rng(9), 400)
    lines.append(f"| 6 a side, 3 shared (compared on those 3) | {coverage:.3f} / {below:.3f} | | |")
    return lines


def accuracies() -> list[str]:
    """test_paired_accuracies_at_the_limit: the strategy keeps exactly 85% of the reference's accuracy."""
    lines = [
        "| prompts | reference always right | reference right 95% | reference right 80% |",
        "|---|---|---|---|",
    ]
    for n in (4, 8, 12, 20, 30, 60, 100):
        cells = []
        for p_ref in (1.0, 0.95, 0.8):
            rng = np.random.default_rng(n * 100 + int(100 * p_ref))
            low, high = tang_interval(*sim.paired_scores(rng, sim.REPS, n, p_ref, 0.85))
            coverage, _, above = sim.rates(low, high, 0.85)
            cells.append(f"{coverage:.3f} / {above:.3f}")
        lines.append(f"| {n} | {' | '.join(cells)} |")
    return lines


def long_memory() -> list[str]:
    """test_one_document_at_1x_with_long_memory."""
    lines = ["| H (lag-1 correlation) | 8 blocks | 32 blocks | 128 blocks |", "|---|---|---|---|"]
    for hurst in (0.5, 0.7, 0.75):
        cells = []
        for blocks in (8, 32, 128):
            coverage, below, _, _ = sim.long_memory_rates(blocks, hurst)
            cells.append(f"{coverage:.3f} / {below:.3f}")
        lag1 = 0.5 * (2 ** (2 * hurst) - 2)  # fGn's lag-1 autocorrelation
        lines.append(f"| {hurst:g} ({lag1:.2f}) | {' | '.join(cells)} |")
    return lines


def followed() -> list[str]:
    """test_more_units_followed_decide_it_in_every_scenario (slow: a few minutes)."""
    lines = [
        '| scenario | "would likely decide it": decided / asked | two documents, the rate stated: decided / asked '
        '| "cannot decide" (over 20x), the plan on the current spread: decided / asked | no number: asked |',
        "|---|---|---|---|---|",
    ]
    for scenario, (draw, _) in advice.ADVICE.items():
        found = draw(np.random.default_rng(1), 1000)
        cells = [advice.rate(*found[kind]) for kind in ("promise", "few", "plain")]
        lines.append(f"| {scenario} | {' | '.join(cells)} | {found['none'][1]} |")
    return lines


def drift() -> list[str]:
    """test_a_drift_with_position_is_warned_about."""
    lines = [
        "| documents | own-only half harder by | warned | the 2× interval covers the strategy's own loss |",
        "|---|---|---|---|",
    ]
    for count, shift in ((20, 0.0), (1, 0.0), (20, float(np.log(1.3)))):
        reps = 60
        warned, covered = sim.drift_rates(count, shift, reps)
        lines.append(f"| {count} | ×{np.exp(shift):.2f} | {warned}/{reps} | {f'{covered}/{reps}' if shift else ''} |")
    return lines


TABLES = {
    "several_documents": several_documents,
    "accuracies": accuracies,
    "long_memory": long_memory,
    "followed": followed,
    "drift": drift,
}


def markers(name: str) -> tuple[str, str]:
    return (
        f"<!-- calibration:{name}:begin (bench/calibration_tables.py --write) -->",
        f"<!-- calibration:{name}:end -->",
    )


def replace(text: str, name: str, lines: list[str]) -> str:
    """``text`` with the table between ``name``'s markers replaced by ``lines``."""
    begin, end = markers(name)
    start, stop = text.index(begin) + len(begin), text.index(end)
    return text[:start] + "\n" + "\n".join(lines) + "\n" + text[stop:]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tables", nargs="*", help=f"which tables (default: all): {', '.join(TABLES)}")
    parser.add_argument("--write", action="store_true", help="rewrite them in docs/verdict.md")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.tables) - set(TABLES))
    if unknown:
        parser.error(f"no table {', '.join(unknown)}; the tables: {', '.join(TABLES)}")
    text = DOC.read_text()
    for name in args.tables or TABLES:
        lines = TABLES[name]()
        print(f"{name}:", *lines, sep="\n", flush=True)
        text = replace(text, name, lines)
    if args.write:
        DOC.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
