"""The runner: from a composed config to a finished, recorded job.

``run(cfg)`` parses the job once (:mod:`evals.core.job`), reuses a finished run with the same key or
claims a directory (:mod:`evals.core.rundir`), and runs the eval with an :class:`EvalContext` over the
runner's :class:`ModelCache` and one :class:`Output`. Every outcome is recorded in ``results.json``:
``done``, ``failed`` (with the one-line error, and the traceback for a crash) or ``interrupted``.

``run_hydra(cfg)`` is what the Hydra app calls per job: a bad value is one line and exit 2 for a single
run; inside a multirun nothing escapes a job -- its failure is recorded and the sweep goes on (the
report callback lists the failures and makes the sweep exit non-zero).
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import sys
import traceback
from pathlib import Path

import torch

from .cache import atomic_write
from .context import EvalContext
from .errors import ConfigError, UserError
from .job import Job, ModelSpec, parse_job
from .models import LoadedModel, load_model, load_tokenizer, tokenizer_identity
from .output import Output, RunRecord
from .retention import retention_of
from .rundir import claim, find_finished, read_results
from .tracking import Tracker, sweep_group

log = logging.getLogger("rope_ext")


class ModelCache:
    """The model loaded in this process, kept for the next job that uses the same model (a sweep re-patches
    it instead of reloading: 0.002 s against ~14 s for SmolLM2), and tokenizers by source."""

    def __init__(self):
        self._key: str | None = None
        self._loaded: LoadedModel | None = None
        self._tokenizers: dict[str, object] = {}

    @staticmethod
    def _key_of(spec: ModelSpec) -> str:
        return json.dumps(spec.identity, sort_keys=True, default=str) + str(spec.cfg.device_map)

    def tokenizer(self, spec: ModelSpec):
        key = json.dumps(tokenizer_identity(spec.cfg), sort_keys=True, default=str)
        if key not in self._tokenizers:
            self._tokenizers[key] = load_tokenizer(spec.cfg)[0]
        return self._tokenizers[key]

    def get(self, spec: ModelSpec) -> tuple[LoadedModel, bool]:
        """(the loaded model, whether it was already loaded)."""
        key = self._key_of(spec)
        if key == self._key:
            log.info("reusing the loaded %s model (re-patched, not reloaded)", spec.name)
            return self._loaded, True
        self.clear()
        self._loaded = load_model(spec.cfg, spec.device, spec.dtype, self.tokenizer(spec))
        self._key = key
        return self._loaded, False

    def clear(self) -> None:
        self._key, self._loaded = None, None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


MODEL_CACHE = ModelCache()


def _error(err: BaseException, with_traceback: bool) -> dict:
    error = {"type": type(err).__name__, "message": str(err).splitlines()[0] if str(err) else type(err).__name__,
             "user_error": isinstance(err, UserError)}
    if with_traceback:
        error["traceback"] = traceback.format_exc()
    return error


def _reuse(job: Job, finished: Path) -> dict:
    """The finished run's summary; outside the job's own directory a record pointing at it is written."""
    previous = read_results(finished) or {}
    print(f"skip: the same job finished in {finished.parent} (force=true reruns it)")
    if finished.parent.resolve() != job.out_dir.resolve():
        with claim(job.out_dir, job.key) as run_dir:
            record = RunRecord(run_dir, job.info(), job.config, job.identity)
            for section in ("metrics", "summary", "rope"):
                if section in previous:
                    record.data[section] = previous[section]
            record.data["resumed_from"] = str(finished.parent)
            record.finish("done")
    summary = previous.get("summary") or {}
    print_summary(job, summary, finished.parent)
    return summary


@contextlib.contextmanager
def started(job: Job, run_dir: Path, cache: ModelCache = MODEL_CACHE, documents=None):
    """A run of ``job`` in ``run_dir``: its record, tracker and output sink around an :class:`EvalContext`.
    The outcome is recorded on exit -- done, failed (the one-line error; a crash's traceback too) or
    interrupted -- and whatever was reported reaches the tracker. ``documents`` replaces the job's data
    (tests, notebooks)."""
    record = RunRecord(run_dir, job.info(), job.config, job.identity)
    tracker = Tracker(job.logger, job.config, run_dir, job.name, sweep_group())
    output = Output(record, tracker)
    status, error = "failed", None
    try:
        with EvalContext(job, cache, output, documents) as ctx:
            yield ctx
        status = "done"
    except KeyboardInterrupt as err:
        status, error = "interrupted", _error(err, with_traceback=False)
        raise
    except UserError as err:
        error = _error(err, with_traceback=False)
        raise
    except Exception as err:
        error = _error(err, with_traceback=True)
        raise
    finally:
        try:
            output.close()
        finally:
            record.finish(status, error)
            tracker.finish(0 if status == "done" else 1)


def execute(job: Job, cache: ModelCache = MODEL_CACHE) -> dict:
    """Run the job (or reuse its finished twin) and record the outcome; returns the summary."""
    finished = None if job.force else find_finished(job.key, job.out_dir, job.resume_from)
    if finished:
        return _reuse(job, finished)
    base = _baseline(job, cache)
    with claim(job.out_dir, job.key) as run_dir:
        if run_dir != job.out_dir:
            print(f"note: {job.out_dir} holds another run; this one writes to {run_dir}")
        with started(job, run_dir, cache) as ctx:
            summary = job.eval.run(job.eval_cfg, ctx)
            if base is not None:
                summary.update(retention_of(summary, base["summary"], job.trained_context))
                ctx.output.record.update("baseline", {"key": job.baseline.key, "dir": str(base["dir"])})
            ctx.output.summary(summary)
    print_summary(job, summary, run_dir)
    return summary


def _baseline(job: Job, cache: ModelCache) -> dict | None:
    """The unscaled reference (``eval.baseline=true``), run or reused before the job; its summary and
    directory. A failed reference is recorded in its own directory and the job runs without retention."""
    if job.baseline is None:
        return None
    print(f"baseline: {job.baseline.name} at {list(job.baseline.eval_cfg.lengths)} (eval.baseline=true)")
    try:
        summary = execute(job.baseline, cache)
    except Exception as err:  # noqa: BLE001 -- the job itself still runs; the failure is in the baseline's record
        print(f"error: baseline {job.baseline.name} failed ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
              f"{job.name} runs without retention", file=sys.stderr)
        return None
    finished = find_finished(job.baseline.key, job.baseline.out_dir, job.baseline.resume_from)
    return {"summary": summary, "dir": finished.parent if finished else job.baseline.out_dir}


DETAIL = ("tokens@", "ppl_ci95_")  # in results.json and W&B, not in the printed table


def print_summary(job: Job, summary: dict, run_dir: Path) -> None:
    print(f"\n{job.model.label} | {job.scaling.label} | {job.eval.name}  ->  {run_dir}")
    for key, value in summary.items():
        if key.startswith(DETAIL):
            continue
        print(f"  {key:<40} {value:.4g}" if isinstance(value, float) else f"  {key:<40} {value}")


def job_dir(cfg) -> tuple[Path, bool]:
    """(the job's output directory, whether it is part of a Hydra multirun)."""
    from hydra.core.hydra_config import HydraConfig

    hydra = HydraConfig.get() if HydraConfig.initialized() else None
    multirun = hydra is not None and hydra.mode.name == "MULTIRUN"
    if cfg.output_dir:
        base = Path(cfg.output_dir)
        return (base / Path(hydra.runtime.output_dir).name if multirun else base), multirun
    if hydra is None:
        raise ConfigError("output_dir is required outside a Hydra run")
    return Path(hydra.runtime.output_dir), multirun


def run(cfg) -> dict:
    """Run one composed config as a job; bad input raises a UserError before any work."""
    out_dir, multirun = job_dir(cfg)
    return execute(parse_job(cfg, out_dir, multirun))


def _record_invalid(cfg, out_dir: Path, err: UserError) -> None:
    """A job rejected before it started still leaves a record, so a sweep's report can list it."""
    from omegaconf import OmegaConf

    config = OmegaConf.to_container(cfg, resolve=False)
    with claim(out_dir, "invalid") as run_dir:
        data = {"status": "failed", "job": {"name": Path(run_dir).name, "key": None}, "config": config,
                "error": _error(err, with_traceback=False)}
        atomic_write(run_dir / "results.json", json.dumps(data, indent=2, default=str))


def run_hydra(cfg) -> None:
    """One job of the Hydra app. Single run: a user error is one line and exit 2; a crash keeps its
    traceback. Multirun: every failure is recorded and printed as one line, and the sweep goes on."""
    out_dir, multirun = job_dir(cfg)
    try:
        job = parse_job(cfg, out_dir, multirun)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        if not multirun:
            sys.exit(2)
        _record_invalid(cfg, out_dir, err)
        return
    try:
        execute(job)
    except UserError as err:  # recorded in the job's results.json
        print(f"error: {err}", file=sys.stderr)
        if not multirun:
            sys.exit(2)
    except Exception as err:
        if not multirun:
            raise
        print(f"error: job {job.name} crashed: {type(err).__name__}: {err} (traceback in its results.json)",
              file=sys.stderr)
