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
import sys
import time
from importlib import metadata
from pathlib import Path

from . import interrupt
from ..errors import EvalDefect
from ..files import atomic_write
from ..measure import Measurement, summary_keys
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
    """The run's ``results.json``: status, the job's own sections (job, resolved config, identity, what is
    compared with a reference, the metrics it declares), versions, process, timings, metrics, summary and
    verdict; rewritten atomically on every change."""

    def __init__(self, run_dir: Path, sections: dict):
        self.dir = Path(run_dir)
        self.path = self.dir / "results.json"
        self.started = time.time()
        self.data = {
            "status": "running",
            **sections,
            "versions": versions(),
            "process": this_process(),
            "timings": {},
            "metrics": {},
            "summary": {},
        }
        self.data.setdefault("declared", {})
        self.data.setdefault("measurements", [])
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


def with_dropped(judgement: dict, dropped: list[dict] | None) -> dict:
    """The verdict with what the job's numbers leave out (:meth:`Output.dropped`): its ``dropped`` lines (the printed
    verdict) and its summary's ``dropped`` (results.json, W&B) -- what is dropped goes wherever the verdict goes."""
    said = [f"{d['what']}: {d['why']}" for d in dropped or []]
    if not said:
        return judgement
    return {**judgement, "dropped": said, "summary": {**judgement["summary"], "dropped": "; ".join(said)}}


def save_figure(fig, dpi: int = 120) -> dict[str, bytes]:
    """{"png": ..., "svg": ...} of a matplotlib figure, which is closed: raster for screens, vector for papers."""
    import matplotlib.pyplot as plt

    found = {}
    for suffix in ("png", "svg"):
        buffer = io.BytesIO()
        fig.savefig(
            buffer, format=suffix, dpi=dpi, bbox_inches="tight", metadata={"Date": None} if suffix == "svg" else None
        )
        found[suffix] = buffer.getvalue()
    plt.close(fig)
    return found


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

    def __init__(
        self, record: RunRecord, tracker, target: int | None = None, artifact: str | None = None, resumed: bool = False
    ):
        self.record, self.tracker, self.target = record, tracker, target
        self.resumed = resumed  # the directory holds what an interrupted run of this same job wrote
        self.artifact = artifact or f"results-{record.dir.name}"
        self.dir = record.dir
        self._tables: dict[str, list[dict]] = {}
        self._figures: dict[str, Path] = {}
        self._curves: dict[str, tuple[str, list[dict]]] = {}
        self.unwritten: dict[str, str] = {}  # artefact file -> why it could not be written (a full disk...)

    def _failed_write(self, path: Path, err: OSError) -> None:
        """A table or figure that cannot be written is not a failed measurement: the numbers stay in results.json,
        the job goes on, and results.json names the file that is missing and why."""
        why = err.strerror or type(err).__name__
        self.unwritten[path.name] = why
        print(
            f"warning: could not write {path} ({why}); the run goes on, its numbers are in results.json",
            file=sys.stderr,
            flush=True,
        )
        self.record.update("unwritten", {path.name: why})

    def dropped(self, what: str, why: str) -> None:
        """Something the job leaves out (a document too short for the lengths, a prompt skipped), with why: said at
        once in the terminal, kept in results.json's ``dropped``, and carried with the verdict (:meth:`verdict`) to
        the printed verdict, W&B's summary and the report's warnings."""
        print(f"warning: dropped {what}: {why}", file=sys.stderr, flush=True)
        entries = self.record.data.setdefault("dropped", [])
        if {"what": what, "why": why} not in entries:
            entries.append({"what": what, "why": why})
        self.record.write()

    def declare(self, metrics: dict) -> None:
        """Metrics known only at run time (lm-eval's tasks), as {name: declaration}: the verdict reads them."""
        self.record.update("declared", metrics)

    @property
    def declared(self) -> dict:
        return self.record.data["declared"]

    def summary(self, values: dict) -> None:
        """Headline numbers (``ppl@8192``, ``effective_length``...): results.json and the tracker's summary."""
        self.record.update("summary", values)

    def verdict(self, judgement: dict) -> None:
        """The verdict (evals/core/decision/verdict.py): its keys join the summary, its detail is results.json's
        ``verdict``."""
        judgement = with_dropped(judgement, self.record.data.get("dropped"))
        self.record.data["summary"].update(judgement["summary"])
        self.record.update("verdict", judgement)

    def measure(self, *measurements: Measurement) -> None:
        """Record measurements (evals/core/measure.py): each must be of a metric the eval declared; it replaces
        an earlier record of the same metric and length (an eval refines its numbers document by document), and
        its flat keys (``<metric>@L``, its count and interval) join the summary -- one call, disk and tracker."""
        declared = self.declared
        records = self.record.data["measurements"]
        for m in measurements:
            if m.metric not in declared:
                raise EvalDefect(
                    f"measurement {m.metric}@{m.length}: {m.metric} is not among the metrics this job "
                    f"declares ({', '.join(sorted(declared)) or 'none'}); declare it in the eval's "
                    f"registration (evals/core/registry.py Metric)"
                )
            record = m.record()
            records[:] = [r for r in records if (r["metric"], r["length"]) != (m.metric, m.length)] + [record]
            self.record.data["summary"].update(summary_keys(record, declared[m.metric].get("count")))
        self.record.write()

    def unreported(self) -> list[str]:
        """The declared verdict metrics with no measurement at any length: a job that leaves one out has failed."""
        seen = {r["metric"] for r in self.record.data["measurements"]}
        return [name for name, d in self.declared.items() if d.get("verdict") and name not in seen]

    @property
    def measurements(self) -> list[dict]:
        return self.record.data["measurements"]

    def flat(self) -> dict:
        """The summary keys of every measurement so far (what an eval returns beside its own headline numbers)."""
        found = {}
        for record in self.measurements:
            found.update(summary_keys(record, (self.declared.get(record["metric"]) or {}).get("count")))
        return found

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
        path = self.dir / f"{name}.csv"
        try:
            return write_csv(path, rows)
        except OSError as err:
            self._failed_write(path, err)
            return path

    def figure(self, name: str, fig) -> Path:
        """A matplotlib figure as ``<name>.png`` and ``<name>.svg`` (for a paper) now; the W&B image ``<name>`` at close."""
        self._claim(name, self._figures)
        path = self.dir / f"{name}.png"
        for suffix, data in save_figure(fig).items():
            try:
                atomic_write(self.dir / f"{name}.{suffix}", data)
            except OSError as err:
                self._failed_write(self.dir / f"{name}.{suffix}", err)
        if path.name not in self.unwritten:
            self._figures[name] = path
        return path

    def curve(self, name: str, rows: list[dict], step: str = "length") -> None:
        """Per-``step`` metrics (e.g. ppl at each length) as W&B history over ``step``, so the runs of a
        group overlay in the default workspace; locally they are the rows of a table already written."""
        self._curves[name] = (step, [dict(row) for row in rows])

    def previous(self, name: str) -> list[dict]:
        """The records of ``<name>.jsonl`` that an interrupted run of this same job wrote here (none unless the
        run resumes one; a line cut short by the interruption is dropped), to be kept rather than recomputed.
        Call it before :meth:`records` opens the file again."""
        path = self.dir / f"{name}.jsonl"
        if not self.resumed or name in self._tables or not path.is_file():
            return []
        found = []
        for line in path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                found.append(record)
        return found

    @contextlib.contextmanager
    def records(self, name: str):
        """``<name>.jsonl`` with one record per line, flushed as each is written; the W&B table ``<name>``
        at close. Yields ``write(record)``."""
        rows: list[dict] = []
        path = self.dir / f"{name}.jsonl"
        handle = open(path, "w", buffering=1)  # line-buffered: each record reaches the disk as it is written

        def write(record: dict) -> None:
            interrupt.check()  # computed after an interrupt a library swallowed: not kept as finished
            rows.append(record)
            if path.name not in self.unwritten:
                try:
                    handle.write(json.dumps(record, default=str) + "\n")
                    handle.flush()
                except OSError as err:
                    self._failed_write(path, err)

        self._claim(name, self._tables)
        try:
            yield write
        finally:
            self._tables[name] = [
                {k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in r.items()} for r in rows
            ]
            try:
                handle.close()
            except OSError as err:  # what a full disk refused at the last flush
                if path.name not in self.unwritten:
                    self._failed_write(path, err)

    def close(self, status: str = "done") -> None:
        """Send the final version of everything to the tracker, under the names used on disk. A run that did not
        finish (``status`` interrupted or failed) sends its summary so far and its status only: the re-run of the same
        job continues the same tracker run (evals/core/run/tracking.py) and sends the complete version once."""
        if status != "done":
            self.tracker.summary({**(self.record.data.get("summary") or {}), "status": status})
            return
        for name, (step, rows) in self._curves.items():
            self.tracker.curve(name, step, rows, at=self.target)
        self.tracker.summary(self.record.data.get("summary") or {})
        for name, rows in self._tables.items():
            self.tracker.table(name, rows)
        for name, path in self._figures.items():
            self.tracker.image(name, path)
        self.tracker.artifact(self.record.path, self.artifact)
