"""CI's time limit (tests/conftest.py, .ci/run): past ROPE_EXT_TESTS_UNTIL a slow test is skipped and named in the
summary, so a run near CI's limit reports what it ran instead of being killed with nothing reported; the default
suite runs whole whatever the time."""

import os
import subprocess
import sys

import pytest

from tests.tiny import ROOT


@pytest.mark.slow
def test_nothing_but_to_be_run():
    """What the test below runs in a pytest of its own (slow: past the time, skipped)."""


def test_nothing_but_to_be_run_whatever_the_time():
    """What the test below runs in a pytest of its own (default suite: run past the time too)."""


def test_a_test_past_cis_time_budget_is_skipped_and_counted_by_name():
    targets = [f"{__file__}::test_nothing_but_to_be_run", f"{__file__}::test_nothing_but_to_be_run_whatever_the_time"]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *targets]
    late = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "ROPE_EXT_TESTS_UNTIL": "1"}, timeout=300
    )
    assert late.returncode == 0 and "1 passed, 1 skipped" in late.stdout, late.stdout[-2000:]
    assert "1 tests not run: CI's time budget" in late.stdout and "test_nothing_but_to_be_run" in late.stdout
    assert "ROPE_EXT_TESTS_UNTIL=" in (ROOT / ".ci" / "run").read_text()  # CI sets it
