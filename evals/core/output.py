"""One output sink for a run: ``results.json`` written as results are produced, and every table and figure
an eval reports written to disk and to the tracker under one name.

An eval calls :class:`Output` only: ``summary``, ``metrics``, ``table`` (``<name>.csv``), ``figure``
(``<name>.png``), ``records`` (``<name>.jsonl``, one record per line as produced) and ``curve`` (a
metric over context length). Files are written at once; the tracker receives the final version of each
under the same name when the run closes -- so what is on disk and what is in W&B cannot differ, and a
table rewritten after every document is uploaded once.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import platform
import time
from importlib import metadata
from pathlib import Path

from .cache import atomic_write
from .rundir import this_process

PACKAGES = ("torch", "transformers", "hydra-core", "wandb", "lm-eval", "gguf", "accelerate", "datasets", "rope_ext")


def versions() -> dict:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


class RunRecord:
    """The run's ``results.json``: status, job, resolved config, identity, versions, process, timings,
    metrics and summary; rewritten atomically on every change."""

    def __init__(self, run_dir: Path, job_info: dict, config: dict, identity: dict):
        self.dir = Path(run_dir)
        self.path = self.dir / "results.json"
        self.started = time.time()
        self.data = {"status": "running", "job": job_info, "config": config, "identity": identity,
                     "versions": versions(), "process": this_process(), "timings": {}, "metrics": {}, "summary": {}}
        self.write()

    def write(self) -> None:
        self.data["timings"]["elapsed_s"] = round(time.time() - self.started, 3)
        atomic_write(self.path, json.dumps(self.data, indent=2, default=str))

    def update(self, section: str, values: dict) -> None:
        self.data.setdefault(section, {}).update(values)
        self.write()

    def finish(self, status: str, error: dict | None = None) -> None:
        self.data["status"] = status
        if error:
            self.data["error"] = error
        self.data["finished"] = round(time.time(), 3)
        self.write()


def write_csv(path: Path, rows: list[dict]) -> Path:
    columns = list(dict.fromkeys(key for row in rows for key in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write(path, buffer.getvalue())
    return path


class Output:
    """Where an eval reports everything; see the module docstring."""

    def __init__(self, record: RunRecord, tracker):
        self.record, self.tracker = record, tracker
        self.dir = record.dir
        self._tables: dict[str, list[dict]] = {}
        self._figures: dict[str, Path] = {}
        self._curves: dict[str, tuple[str, list[dict]]] = {}

    def summary(self, values: dict) -> None:
        """Headline numbers (``ppl@8192``, ``effective_length``...): results.json and the tracker's summary."""
        self.record.update("summary", values)

    def metrics(self, name: str, values: dict) -> None:
        """Structured detail under ``metrics.<name>`` in results.json (the report reads it)."""
        self.record.data["metrics"][name] = values
        self.record.write()

    def timing(self, name: str, seconds: float) -> None:
        self.record.update("timings", {name: round(seconds, 3)})

    def _claim(self, name: str, kind: dict) -> None:
        """One name, one thing: a table and a figure may not share a name (they would share a W&B key)."""
        others = [k for k in (self._tables, self._figures) if k is not kind and name in k]
        if others or not name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"output name {name!r} is taken by another table or figure, or is not [A-Za-z0-9_-]")

    def table(self, name: str, rows: list[dict]) -> Path:
        """``<name>.csv`` now; the W&B table ``<name>`` at close (its latest rows)."""
        self._claim(name, self._tables)
        self._tables[name] = [dict(row) for row in rows]
        return write_csv(self.dir / f"{name}.csv", rows)

    def figure(self, name: str, fig) -> Path:
        """A matplotlib figure as ``<name>.png`` now; the W&B image ``<name>`` at close."""
        import matplotlib.pyplot as plt

        self._claim(name, self._figures)
        path = self.dir / f"{name}.png"
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
        plt.close(fig)
        atomic_write(path, buffer.getvalue())
        self._figures[name] = path
        return path

    def curve(self, name: str, rows: list[dict], step: str = "length") -> None:
        """Per-``step`` metrics (e.g. ppl at each length) as W&B history over ``step``, so the runs of a
        group overlay in the default workspace; locally they are the rows of a table already written."""
        self._curves[name] = (step, [dict(row) for row in rows])

    @contextlib.contextmanager
    def records(self, name: str):
        """``<name>.jsonl`` with one record per line, flushed as each is written; the W&B table ``<name>``
        at close. Yields ``write(record)``."""
        rows: list[dict] = []
        with open(self.dir / f"{name}.jsonl", "w") as handle:
            def write(record: dict) -> None:
                rows.append(record)
                handle.write(json.dumps(record, default=str) + "\n")
                handle.flush()

            self._claim(name, self._tables)
            try:
                yield write
            finally:
                self._tables[name] = [{k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in r.items()}
                                      for r in rows]

    def names(self) -> dict[str, list[str]]:
        return {"tables": sorted(self._tables), "figures": sorted(self._figures), "curves": sorted(self._curves)}

    def close(self) -> None:
        """Send the final version of everything to the tracker, under the names used on disk."""
        self.tracker.summary(self.record.data.get("summary") or {})
        for name, (step, rows) in self._curves.items():
            self.tracker.curve(name, step, rows)
        for name, rows in self._tables.items():
            self.tracker.table(name, rows)
        for name, path in self._figures.items():
            self.tracker.image(name, path)
        self.tracker.artifact(self.record.path, f"results-{self.dir.name}")
