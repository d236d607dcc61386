"""The lock (requirements.lock): complete for what pyproject.toml asks, the versions the tests run on, and the source
of every version the product states as checked (issue #65: a fresh set-up once took transformers 5.25.0 the day it
appeared and 8 tests failed; deploy/ said "checked: transformers 5.24.0" from a hand-typed constant)."""

import os
import subprocess
import sys
import tomllib
from importlib import metadata

import pytest
from packaging.requirements import Requirement

from evals.setup.lock import NOT_LOCKED, installed
from rope_ext.export import VERIFIED
from rope_ext.export.common import LOCK, canonical, read_lock
from tests.tiny import ROOT

NEWEST = bool(os.environ.get("ROPE_EXT_NEWEST"))  # `make newest`: the newest releases, which differ from the lock


def test_every_requirement_of_pyproject_is_pinned():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    locked = read_lock()
    known = locked | dict.fromkeys(NOT_LOCKED)
    missing = [spec for spec in wanted if canonical(Requirement(spec).name) not in known]
    assert not missing, f"not in {LOCK.name} (run `make newest` then `make lock`): {missing}"
    for spec in wanted:  # and the pin satisfies the range pyproject states
        requirement = Requirement(spec)
        if (pin := locked.get(canonical(requirement.name))) is not None:
            assert requirement.specifier.contains(pin, prereleases=True), f"{LOCK.name} pins {pin}, outside {spec}"


@pytest.mark.skipif(NEWEST, reason="make newest runs the newest releases, not the lock's")
def test_the_tests_run_on_the_locked_versions():
    locked, running = read_lock(), installed()  # a locked package not installed here (an optional engine's) is no run
    differ = {name: (pin, running[name]) for name, pin in locked.items() if name in running and running[name] != pin}
    assert not differ, f"installed versions differ from {LOCK.name} (make setup installs it): {differ}"


@pytest.mark.skipif(NEWEST, reason="make newest runs the newest releases, not the lock's")
def test_the_transformers_deploy_states_as_checked_is_the_one_the_tests_run():
    assert VERIFIED["transformers"] == read_lock()["transformers"] == metadata.version("transformers")


def test_the_lock_tool_reads_what_is_installed_and_refuses_bad_usage(tmp_path):
    tool = [sys.executable, "-m", "evals.setup.lock"]
    written = tmp_path / "requirements.lock"
    subprocess.run([*tool, "write", str(written)], cwd=ROOT, check=True, capture_output=True)
    assert read_lock(written) == installed() and "torch" not in read_lock(written)
    same = subprocess.run([*tool, "diff", str(written)], cwd=ROOT, capture_output=True, text=True)
    assert same.returncode == 0 and same.stdout.startswith("lock: every version as in"), same.stdout
    bad = subprocess.run([*tool, "diff", str(tmp_path / "none.lock")], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
