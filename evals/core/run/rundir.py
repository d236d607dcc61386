"""Which directory a job writes to, and which finished job it may reuse, so that nothing computed is lost
or silently replaced.

- A finished result (status ``done``) is never written over: re-running the same job skips it, a
  different job (or ``force=true``) aimed at that directory writes to a sibling ``<dir>-2``, ``-3``...
- A directory is claimed with a lock file created exclusively (``O_EXCL``) that records the process (pid,
  host, start time). A second run aimed at a live run's directory takes a sibling too; a lock whose
  process is dead is taken over. An unfinished result of the *same* job (failed, interrupted, killed) is
  replaced by the re-run -- a job is resumed in place; one of another job is kept, and the re-run takes a sibling.
  A job rejected before it started (bad input, a target its strategy cannot reach) left only a record without a
  key and nothing computed: any re-run of that directory's job replaces it in place (a resumed sweep that rejects
  the same job again must not add ``<dir>-2``).
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

from ..files import note_once

LOCK = ".rope_ext.lock"
SWEEP = "ROPE_EXT_SWEEP"  # set by a multirun for its jobs (their processes inherit it): which sweep ran a job


def _proc_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid from the original."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def this_process() -> dict:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": round(time.time(), 3),
        "proc_start": _proc_start(os.getpid()),
        "sweep": os.environ.get(SWEEP),
    }


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


def _read_json(path: Path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def load_results(path: Path) -> tuple[dict | None, str | None]:
    """(a rope_ext ``results.json``, None) -- a JSON object with a status and a job section -- or (None, why
    not): absent, unreadable, damaged or another tool's file."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None, "is absent"
    except OSError as err:
        return None, f"cannot be read ({err.strerror or type(err).__name__})"
    except ValueError as err:
        return None, f"is not valid JSON ({str(err)[:80]})"
    if not isinstance(data, dict) or not isinstance(data.get("status"), str) or not isinstance(data.get("job"), dict):
        return None, "is not a rope_ext result (no status and job sections)"
    return data, None


def read_results(path: Path) -> dict | None:
    """A rope_ext ``results.json``, or None; a file there that is damaged or another tool's is skipped, and
    named once."""
    data, why = load_results(path)
    if data is None and Path(path).exists():
        note_once(f"note: skipping {path}: it {why}")
    return data


def state(results: dict | None) -> str | None:
    """A run's state as recorded, with ``running`` refined into ``dead`` when its process is gone."""
    if results is None:
        return None
    status = results.get("status")
    if status == "running" and is_alive(results.get("process")) is False:
        return "dead"
    return status


def own_dirs(directory: Path) -> list[Path]:
    """``directory`` and the siblings :func:`claim` moves a job to when it holds another run (``<name>-2``, ...)."""
    directory = Path(directory)
    n = len(directory.name) + 1
    siblings = [p for p in directory.parent.glob(f"{directory.name}-*") if p.name[n:].isdigit()]
    return [directory, *sorted(siblings, key=lambda p: int(p.name[n:]))]


def find_finished(key: str, own_dir: Path, roots) -> Path | None:
    """A finished run with this job key: the job's own directory first (and where :func:`claim` moved it when that
    held another run: run again, the same command finds it there), then any under ``roots``."""
    for directory in own_dirs(own_dir):
        own = read_results(directory / "results.json")
        if own and own.get("status") == "done" and own.get("job", {}).get("key") == key:
            return directory / "results.json"
    for root in roots:
        for path in sorted(Path(root).glob("**/results.json")):
            data = read_results(path)
            if data and data.get("status") == "done" and data.get("job", {}).get("key") == key:
                return path
    return None


class TwinFinished(Exception):
    """Another process on this host computed this same job in the directory while this one waited: reuse it."""

    def __init__(self, results: Path):
        super().__init__(str(results))
        self.results = results


def _take_lock(directory: Path, key: str) -> dict | None:
    """Create the lock file exclusively (recording this process and the job's key); take over a dead owner's.
    None when taken, else the live owner's record."""
    lock = directory / LOCK
    owner = None
    for _ in range(3):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            owner = _read_json(lock)
            if owner is None:  # being written right now by its creator
                time.sleep(0.05)
                owner = _read_json(lock)
            if is_alive(owner) is not False:
                return owner or {}
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()
            continue
        with os.fdopen(fd, "w") as handle:
            json.dump({**this_process(), "key": key}, handle)
        return None
    return owner or {}


def _usable(directory: Path, key: str) -> bool:
    """Whether this job may write its results in ``directory`` (whose lock it holds): empty, or holding an
    unfinished run of the same job (which the re-run replaces); never a finished result."""
    if not (directory / "results.json").exists():
        return True
    previous = read_results(directory / "results.json")
    if previous is None:  # damaged or another tool's: kept, never written over
        return False
    return previous.get("status") != "done" and (previous.get("job", {}).get("key") == key or rejected(previous))


def rejected(results: dict) -> bool:
    """Whether ``results`` records a job rejected before it started (``runner._record_invalid``): no key, nothing
    computed."""
    return (
        results.get("status") in ("failed", "unreachable")
        and (results.get("job") or {}).get("key") is None
        and not results.get("measurements")
    )


@contextlib.contextmanager
def claim(directory: Path, key: str, wait_for_twin: bool = False, poll: float = 1.0):
    """The directory this job writes to (``directory`` or its first free sibling), locked while in use. With
    ``wait_for_twin``, a directory where another live process on this host computes this same job (two identical
    sweeps started into one directory) is waited for, and :class:`TwinFinished` raised when it finished there."""
    directory = Path(directory)
    candidate, n, said = directory, 1, False
    while True:
        candidate.mkdir(parents=True, exist_ok=True)
        owner = _take_lock(candidate, key)
        if owner is None:
            if _usable(candidate, key):
                break
            (candidate / LOCK).unlink(missing_ok=True)
            done = read_results(candidate / "results.json") if said else None
            if done and done["status"] == "done" and done["job"].get("key") == key:
                raise TwinFinished(candidate / "results.json")
        elif wait_for_twin and owner.get("key") == key and is_alive(owner) is True:
            if not said:
                print(
                    f"wait: {candidate} is computing this same job (pid {owner.get('pid')}); its result will be reused",
                    flush=True,
                )
                said = True
            time.sleep(poll)
            continue
        n += 1
        candidate = directory.with_name(f"{directory.name}-{n}")
    try:
        yield candidate
    finally:
        (candidate / LOCK).unlink(missing_ok=True)
