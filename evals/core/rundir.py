"""Which directory a job writes to, and which finished job it may reuse, so that nothing computed is lost
or silently replaced.

- A finished result (status ``done``) is never written over: re-running the same job skips it, a
  different job (or ``force=true``) aimed at that directory writes to a sibling ``<dir>-2``, ``-3``...
- A directory is claimed with a lock file created exclusively (``O_EXCL``) that records the process (pid,
  host, start time). A second run aimed at a live run's directory takes a sibling too; a lock whose
  process is dead is taken over. An unfinished result of the *same* job (failed, interrupted, killed) is
  replaced by the re-run; one of another job is kept, and the re-run takes a sibling.
- A finished job is reused only when its key -- the hash of everything that changes a number -- is
  equal: first in the job's own directory, then under ``resume_from``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path

LOCK = ".rope_ext.lock"


def _proc_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid from the original."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def this_process() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": round(time.time(), 3),
            "proc_start": _proc_start(os.getpid())}


def is_alive(process: dict | None) -> bool | None:
    """Whether the recorded process still runs: True, False, or None when it ran on another host."""
    if not process:
        return False
    if process.get("host") != socket.gethostname():
        return None
    pid = int(process["pid"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    recorded = process.get("proc_start")
    current = _proc_start(pid)
    return not (recorded is not None and current is not None and recorded != current)


def read_results(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def state(results: dict | None) -> str | None:
    """A run's state as recorded, with ``running`` refined into ``dead`` when its process is gone."""
    if results is None:
        return None
    status = results.get("status")
    if status == "running" and is_alive(results.get("process")) is False:
        return "dead"
    return status


def find_finished(key: str, own_dir: Path, roots) -> Path | None:
    """A finished run with this job key: the job's own directory first, then any under ``roots``."""
    own = read_results(Path(own_dir) / "results.json")
    if own and own.get("status") == "done" and own.get("job", {}).get("key") == key:
        return Path(own_dir) / "results.json"
    for root in roots:
        for path in sorted(Path(root).glob("**/results.json")):
            data = read_results(path)
            if data and data.get("status") == "done" and data.get("job", {}).get("key") == key:
                return path
    return None


def _take_lock(directory: Path) -> bool:
    """Create the lock file exclusively; take over a dead owner's. False when a live process holds it."""
    lock = directory / LOCK
    for _ in range(3):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            owner = read_results(lock)
            if owner is None:  # being written right now by its creator
                time.sleep(0.05)
                owner = read_results(lock)
            if is_alive(owner) is not False:
                return False
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()
            continue
        with os.fdopen(fd, "w") as handle:
            json.dump(this_process(), handle)
        return True
    return False


def _usable(directory: Path, key: str) -> bool:
    """Whether this job may write its results in ``directory`` (whose lock it holds): empty, or holding an
    unfinished run of the same job (which the re-run replaces); never a finished result."""
    previous = read_results(directory / "results.json")
    if previous is None:
        return True
    return previous.get("status") != "done" and previous.get("job", {}).get("key") == key


@contextlib.contextmanager
def claim(directory: Path, key: str):
    """The directory this job writes to (``directory`` or its first free sibling), locked while in use."""
    directory = Path(directory)
    candidate, n = directory, 1
    while True:
        candidate.mkdir(parents=True, exist_ok=True)
        if _take_lock(candidate):
            if _usable(candidate, key):
                break
            (candidate / LOCK).unlink(missing_ok=True)
        n += 1
        candidate = directory.with_name(f"{directory.name}-{n}")
    try:
        yield candidate
    finally:
        (candidate / LOCK).unlink(missing_ok=True)
