"""Local results, written as they are produced: ``results.json`` (config, metrics, versions, timings),
one CSV per table, and PNG plots, all in the run directory."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import platform
import time
from importlib import metadata
from pathlib import Path

PACKAGES = ("torch", "transformers", "hydra-core", "wandb", "lm-eval", "gguf", "accelerate", "datasets")


def versions() -> dict:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Results:
    """The run's results document; every update rewrites results.json atomically."""

    def __init__(self, out_dir: Path, config: dict):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.started = time.time()
        self.data = {"status": "running", "config": config, "versions": versions(), "metrics": {}, "timings": {}}
        self.write()

    def write(self) -> None:
        self.data["timings"]["elapsed_s"] = round(time.time() - self.started, 3)
        _atomic_write(self.dir / "results.json", json.dumps(self.data, indent=2, default=str))

    def set(self, key: str, value):
        self.data[key] = value
        self.write()
        return value

    def update(self, section: str, values: dict) -> None:
        self.data.setdefault(section, {}).update(values)
        self.write()

    def table(self, name: str, rows: list[dict]) -> Path:
        path = self.dir / f"{name}.csv"
        columns = list(dict.fromkeys(key for row in rows for key in row))
        with open(path.with_suffix(".tmp"), "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(path.with_suffix(".tmp"), path)
        return path

    def resume(self, finished: Path) -> dict:
        """Take over a finished job's results (same job key) instead of recomputing them."""
        previous = json.loads(Path(finished).read_text())
        self.data.update({k: previous[k] for k in ("metrics", "summary", "rope") if k in previous})
        self.data["resumed_from"] = str(Path(finished).parent)
        self.finish("done")
        return previous.get("summary", {})

    def finish(self, status: str = "done") -> None:
        self.data["status"] = status
        self.write()


def job_key(job: dict) -> str:
    """A hash of what determines a job's results: model, effective scaling, eval, data and seed."""
    return hashlib.sha256(json.dumps(job, sort_keys=True, default=str).encode()).hexdigest()[:16]


def find_finished(key: str, roots, exclude: Path | None = None) -> Path | None:
    """A results.json of a finished job with this key under any of ``roots``, or None."""
    for root in roots:
        for path in sorted(Path(root).glob("**/results.json")):
            if exclude is not None and path.parent.resolve() == Path(exclude).resolve():
                continue
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # a file being written, or not ours
            if data.get("job_key") == key and data.get("status") == "done":
                return path
    return None
