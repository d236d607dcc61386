"""Local results, written as they are produced: ``results.json`` (config, metrics, versions, timings),
one CSV per table, and PNG plots, all in the run directory."""

from __future__ import annotations

import csv
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

    def finish(self, status: str = "done") -> None:
        self.data["status"] = status
        self.write()
