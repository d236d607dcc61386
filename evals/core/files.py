"""File helpers: where rope_ext keeps what it derives once and reuses (token ids, model configs, key-token spans,
base bounds, Punkt), file fingerprints for the job key, and writes that readers never see half done.

A cache is an optimisation, never a failure: a damaged entry (unreadable, truncated, of the wrong shape) is named
once, removed and recomputed (:func:`read_cache`); a cache that cannot be written (read-only, a file where the
directory should be, a full disk) is named once and the run goes on without caching (:func:`write_cache`)."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Callable

_SAID: set[str] = set()
_UNWRITABLE: set[Path] = set()  # cache directories already said to be unwritable: their writes are skipped quietly


def note_once(message: str) -> None:
    """``message`` on stderr, the first time this process has it to say."""
    if message not in _SAID:
        _SAID.add(message)
        print(message, file=sys.stderr, flush=True)


def _reason(err: OSError) -> str:
    return err.strerror or type(err).__name__


def cache_dir(configured: str | None = None) -> Path:
    """``configured``, else ``$ROPE_EXT_CACHE``, else ``~/.cache/rope_ext`` (created when it can be)."""
    path = Path(configured or os.environ.get("ROPE_EXT_CACHE") or Path.home() / ".cache" / "rope_ext")
    problem = unwritable(path)
    if problem is None:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            problem = _reason(err)
    if problem:
        _UNWRITABLE.add(path)
        note_once(
            f"note: the cache directory {path} cannot be written ({problem}); what it holds is read, nothing "
            f"new is cached (set data.cache_dir or $ROPE_EXT_CACHE to a writable directory)"
        )
    return path


def unwritable(path: Path) -> str | None:
    """Why the directory ``path`` cannot be created or written in (a file in the way, no permission), or None."""
    path = Path(path)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


def read_cache(path: Path, load: Callable[[Path], object], what: str):
    """``load(path)`` of a cache entry, or None when there is none. A damaged one -- ``load`` raises on an
    unreadable file or one of the wrong shape -- is named once, removed and None returned: the caller
    recomputes it."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return load(path)
    except Exception as err:  # json, torch, nltk and transformers raise many types on damaged files
        note_once(f"note: damaged cache entry {path} ({what}; {type(err).__name__}: {str(err)[:120]}); recomputing it")
        try:
            path.unlink()
        except OSError:
            pass
        return None


def write_cache(path: Path, data: str | bytes) -> bool:
    """Write a cache entry (atomically); when the cache cannot be written say so once and go on."""
    path = Path(path)
    if any(root in path.parents for root in _UNWRITABLE):
        return False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data)
        return True
    except OSError as err:
        note_once(f"note: cannot write the cache in {path.parent} ({_reason(err)}); going on without caching it")
        return False


def file_identity(path: Path) -> dict:
    """A file's identity without reading it whole: resolved path, size and modification time."""
    path = Path(path).resolve()
    stat = path.stat()
    return {"path": str(path), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write through a temp file unique to this process and call, then rename it into place: readers
    never see half a file, and two writers never share a temp file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
