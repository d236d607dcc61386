"""CI's rotation of the slow set (tests/conftest.py, .ci/run): the default suite runs whole on every landing; one half
of the slow set runs a landing (the parity of main's commit count), the other half is deselected -- never skipped for
time -- and the summary names its files; the slow tests marked ``ci_first`` run before the others."""

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import SLOW_HALF_B, slow_files, slow_half
from tests.tiny import ROOT


@pytest.mark.slow
def test_nothing_but_to_be_run():
    """What the tests below run in a pytest of their own (slow: in this file's half of the rotation)."""


@pytest.mark.slow(ci_first=True)
def test_nothing_but_to_be_run_first():
    """What the ordering test below runs: defined last of the slow ones here, run first."""


def test_nothing_but_to_be_run_whatever_the_half():
    """What the test below runs in a pytest of its own (default suite: runs on every landing)."""


def _pytest(*args, **env):
    """pytest on ``args`` in a subprocess, with ``env``: both halves of the slow set unless it names one (CI's own
    half, in the environment, would deselect this file's slow tests on the landings that run the other half)."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", *args]
    inherited = {k: v for k, v in os.environ.items() if k != "ROPE_EXT_SLOW_HALF"}
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env={**inherited, **env}, timeout=300)


def test_the_other_half_of_the_slow_set_is_deselected_and_named_never_skipped():
    targets = [f"{__file__}::test_nothing_but_to_be_run", f"{__file__}::test_nothing_but_to_be_run_whatever_the_half"]
    mine = slow_half(__file__)
    other = {"A": "B", "B": "A"}[mine]
    elsewhere = _pytest("-q", *targets, ROPE_EXT_SLOW_HALF=other)
    assert elsewhere.returncode == 0 and "1 passed, 1 deselected" in elsewhere.stdout, elsewhere.stdout[-2000:]
    assert "skipped" not in elsewhere.stdout
    named = re.search(r"slow rotation: not run this landing.*", elsewhere.stdout)[0]
    assert "test_ci.py" in named, elsewhere.stdout[-2000:]
    here = _pytest("-q", *targets, ROPE_EXT_SLOW_HALF=mine)
    assert here.returncode == 0 and "2 passed" in here.stdout, here.stdout[-2000:]
    assert re.search(rf"slow rotation: half {mine} ran, the slow tests of .*test_ci\.py", here.stdout)


def test_ci_runs_the_half_of_the_commit_count_within_40_minutes():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "export ROPE_EXT_SLOW_HALF=$(make -s ci-half)" in ci and "ROPE_EXT_TESTS_UNTIL" not in ci
    assert int(re.search(r"CI_MINUTES=(\d+)", ci)[1]) <= 40
    count = int(subprocess.run(["git", "rev-list", "--count", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout)
    half = subprocess.run(["make", "-s", "ci-half"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert half == "AB"[count % 2]


def test_every_file_of_the_second_half_exists_and_holds_slow_tests():
    """A file renamed or slimmed out of the slow set would leave half B shorter than measured: the table is kept true."""
    names = {path.name for path in slow_files()}
    assert SLOW_HALF_B <= names, SLOW_HALF_B - names
    assert names - SLOW_HALF_B, "half A holds no slow test"


def test_the_slow_tests_marked_ci_first_run_before_the_others():
    ran = _pytest("-v", "-m", "slow", __file__).stdout
    order = re.findall(r"::(test_nothing_but_to_be_run\w*) PASSED", ran)
    assert order == ["test_nothing_but_to_be_run_first", "test_nothing_but_to_be_run"], ran[-2000:]
