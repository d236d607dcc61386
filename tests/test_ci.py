"""CI's time budget (tests/conftest.py, .ci/run): past ROPE_EXT_TESTS_UNTIL a slow test is skipped and named in the
summary, so a run near the budget reports what it ran instead of running past it; the default suite runs whole
whatever the time; the slow tests marked ``ci_first`` run before the others."""

import re

import os
import subprocess
import sys

import pytest

from tests.tiny import ROOT


@pytest.mark.slow
def test_nothing_but_to_be_run():
    """What the test below runs in a pytest of its own (slow: past the time, skipped)."""


@pytest.mark.slow(ci_first=True)
def test_nothing_but_to_be_run_first():
    """What the ordering test below runs: defined last of the slow ones here, run first."""


def test_nothing_but_to_be_run_whatever_the_time():
    """What the test below runs in a pytest of its own (default suite: run past the time too)."""


def _pytest(*args, **env):
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **env}, timeout=300)


def test_a_test_past_cis_time_budget_is_skipped_and_counted_by_name():
    targets = [f"{__file__}::test_nothing_but_to_be_run", f"{__file__}::test_nothing_but_to_be_run_whatever_the_time"]
    late = _pytest("-q", *targets, ROPE_EXT_TESTS_UNTIL="1")
    assert late.returncode == 0 and "1 passed, 1 skipped" in late.stdout, late.stdout[-2000:]
    assert "1 tests not run: CI's time budget" in late.stdout and "test_nothing_but_to_be_run" in late.stdout
    ci = (ROOT / ".ci" / "run").read_text()
    assert "ROPE_EXT_TESTS_UNTIL=" in ci  # CI sets it, to end inside a budget of at most 40 minutes
    assert int(re.search(r"CI_MINUTES=(\d+)", ci)[1]) <= 40


def test_the_slow_tests_marked_ci_first_run_before_the_others():
    ran = _pytest("-v", "-m", "slow", __file__).stdout
    order = re.findall(r"::(test_nothing_but_to_be_run\w*) PASSED", ran)
    assert order == ["test_nothing_but_to_be_run_first", "test_nothing_but_to_be_run"], ran[-2000:]
