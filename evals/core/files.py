"""File helpers: where rope_ext keeps what it derives once and reuses (token ids, model configs, key-token spans),
file fingerprints for the job key, and writes that readers never see half done."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_dir(configured: str | None = None) -> Path:
    """``configured``, else ``$ROPE_EXT_CACHE``, else ``~/.cache/rope_ext`` (created)."""
    path = Path(configured or os.environ.get("ROPE_EXT_CACHE") or Path.home() / ".cache" / "rope_ext")
    path.mkdir(parents=True, exist_ok=True)
    return path


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
