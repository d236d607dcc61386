"""The runner: from a composed config to a finished, recorded job.

``run(cfg)`` parses the job once (:mod:`evals.core.job.parse`), reuses a finished run with the same key or
claims a directory (:mod:`evals.core.run.rundir`), has the unscaled reference found or run first
(:mod:`evals.core.run.reference_search`), and runs the eval with an :class:`EvalContext` over the process's
:class:`~evals.core.inputs.model_cache.ModelCache` and one :class:`Output`; the verdict
(:mod:`evals.core.decision.verdict`) judges the measurements against the reference. Every outcome is recorded in ``results.json``:
``done``, ``failed`` (with the one-line error, and the traceback for a crash) or ``interrupted``.

``run_hydra(cfg)`` is what the Hydra app calls per job: a bad value is one line and exit 2 for a single
run; inside a multirun nothing escapes a job -- its failure is recorded and the sweep goes on (the
report callback lists the failures and makes the sweep exit non-zero).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import traceback
from pathlib import Path

from rope_ext import ScalingError

from ..files import atomic_write
from ..inputs.context import EvalContext
from ..errors import ConfigError, EvalDefect, ScalingConfigError, TargetUnreachable, UserError
from .interrupt import as_interrupt
from ..job.job import Job
from ..job.parse import parse_job
from ..inputs.model_cache import MODEL_CACHE, ModelCache
from .output import Output, RunRecord, with_dropped
from .peak import PeakMemory
from .reference_search import find_reference
from ..decision.reference import Reference, own_reference
from ..decision.verdict import criteria_of, judge
from ..decision.verdict_text import format_job
from .rundir import TwinFinished, claim, find_finished, own_dirs, read_results, this_process
from .tracking import Tracker, new_run_id, sweep_group
from .tracking import enabled as tracking_enabled


def _error(err: BaseException, with_traceback: bool) -> dict:
    error = {
        "type": type(err).__name__,
        "message": str(err).splitlines()[0] if str(err) else type(err).__name__,
        "user_error": isinstance(err, UserError),
    }
    if with_traceback:
        error["traceback"] = traceback.format_exc()
    return error


def _reuse(job: Job, finished: Path, cache: ModelCache) -> dict:
    """The finished run's summary, judged again (against the reference found now, with this job's criteria);
    outside the job's own directory a record pointing at it is written."""
    previous = read_results(finished) or {}
    print(f"skip: the same job finished in {finished.parent} (force=true reruns it)")
    measured = {k: v for k, v in (previous.get("summary") or {}).items() if k not in judged_keys(previous)}
    measurements = previous.get("measurements") or []
    judgement = judge_job(
        job,
        measurements,
        previous.get("declared") or job.declared(),
        *find_reference(job, lambda reference: execute(reference, cache)),
    )
    judgement = with_dropped(judgement, previous.get("dropped"))  # what the finished run left out, said again
    summary = {**measured, **judgement["summary"]}
    if finished.parent.resolve() not in {d.resolve() for d in own_dirs(job.out_dir)}:  # no pointer to its own run
        with claim(job.out_dir, job.key) as run_dir:
            record = RunRecord(run_dir, job.sections())
            for section in ("metrics", "rope", "declared", "measurements", "timings", "dropped"):
                if section in previous:
                    record.data[section] = previous[section]
            record.data["summary"], record.data["verdict"] = summary, judgement
            record.data["resumed_from"] = str(finished.parent)
            record.finish("done")
    print_summary(job, summary, finished.parent)
    print_verdict(job, judgement)
    return summary


def judged_keys(results: dict) -> set:
    """The summary keys a stored run's verdict added (judged again, never read back as measurements)."""
    return set(((results.get("verdict") or {}).get("summary") or {}))


@contextlib.contextmanager
def started(job: Job, run_dir: Path, cache: ModelCache = MODEL_CACHE, documents=None):
    """A run of ``job`` in ``run_dir``: its record, tracker and output sink around an :class:`EvalContext`.
    The outcome is recorded on exit -- done, failed (the one-line error; a crash's traceback too) or
    interrupted -- and whatever was reported reaches the tracker. ``documents`` replaces the job's data
    (tests, notebooks)."""
    previous = read_results(run_dir / "results.json")  # claim() let only an unfinished run of this job be here
    resumed = previous is not None and previous["status"] != "done" and previous["job"].get("key") == job.key
    record = RunRecord(run_dir, job.sections())
    if tracking_enabled(job.logger):  # one W&B run per job: a resumed job continues the interrupted attempt's
        earlier = (previous or {}).get("tracking") or {} if resumed else {}
        # recorded before W&B starts: an interrupt landing in its start-up still leaves the id for the resume
        record.update("tracking", {"id": earlier.get("id") or new_run_id(), "continued": bool(earlier.get("id"))})
    tracker, output = None, None
    status, error = "failed", None
    peak = PeakMemory()
    try:
        with as_interrupt():  # W&B's start-up takes seconds: an interrupt there is recorded like any other
            tracker = Tracker(
                job.logger,
                job.config,
                run_dir,
                job.name,
                sweep_group(),
                tags=job_tags(job),
                job_type=job.eval.name,
                run_id=(record.data.get("tracking") or {}).get("id"),
            )
        output = Output(record, tracker, target=job.target, artifact=f"results-{job.key}", resumed=resumed)
        with as_interrupt(), peak, EvalContext(job, cache, output, documents) as ctx:  # evals/core/run/interrupt.py
            yield ctx
        status = "done"
    except KeyboardInterrupt as err:
        status, error = "interrupted", _error(err, with_traceback=False)
        raise
    except (UserError, EvalDefect) as err:
        error = _error(err, with_traceback=False)
        raise
    except ScalingError as err:  # rope_ext refusing at the first forward: one line and exit 2, like every refusal
        refused = ScalingConfigError(str(err).splitlines()[0] if str(err) else type(err).__name__)
        error = _error(refused, with_traceback=False)
        raise refused from None
    except Exception as err:
        error = _error(err, with_traceback=True)
        raise
    finally:
        if peak.bytes is not None:
            record.data["timings"].update(peak_memory_bytes=peak.bytes, peak_memory_kind=peak.kind)
        if peak.forwards:  # the repeated timings a cost ratio rests on (evals/core/scoring/cost.py)
            record.data["timings"]["forwards"] = peak.forwards
        try:
            if output is not None:
                output.close(status)
        finally:
            record.finish(status, error)
            if tracker is not None:
                tracker.finish(0 if status == "done" else 1)


def job_tags(job: Job) -> list[str]:
    """W&B tags that filter a workspace the way the question is asked: strategy, model, eval, target."""
    tags = [f"scaling:{job.scaling.name}", f"model:{job.model.label}", f"eval:{job.eval.name}"]
    if job.target:
        tags.append(f"target:{job.target / job.trained_context:g}x")
    if job.role != "job":
        tags.append(job.role)
    return tags


def execute(job: Job, cache: ModelCache = MODEL_CACHE) -> dict:
    """Run the job (or reuse its finished twin), judge it against the unscaled model and record the outcome;
    returns the summary (measurements and verdict)."""
    # a sweep's own directory too: a search's trials are numbered anew on a re-run, so the same job may sit elsewhere in it
    roots = (*job.resume_from, str(job.out_dir.parent)) if job.multirun else job.resume_from
    finished = None if job.force else find_finished(job.key, job.out_dir, roots)
    if finished:
        return _reuse(job, finished, cache)
    reference, missing = find_reference(job, lambda reference: execute(reference, cache))
    try:
        return _compute(job, reference, missing, cache)
    except TwinFinished as twin:  # another process computed this very job meanwhile
        return _reuse(job, twin.results, cache)


_COMPUTED: set[str] = set()  # the keys of the jobs this process computed (not reused): see :func:`last_job_ran`
_LAST: list[str] = []  # the key of the last job run_hydra was given


_OUTCOMES: list[str] = []  # how each job run_hydra was given ended: see :func:`last_job_outcome`


def last_job_ran() -> bool:
    """Whether the last job of this process's Hydra app was computed here -- not reused from a finished run nor
    rejected before it started: a sweep's time left is estimated from such jobs only."""
    return bool(_LAST) and _LAST[-1] in _COMPUTED


def last_job_outcome() -> str | None:
    """How the last job of this process's Hydra app ended: ``ran`` (computed here), ``reused`` (a finished run found
    again), ``failed`` (refused or crashed: never counted as reused) or ``unreachable`` (its strategy cannot reach
    the target); None before any."""
    return _OUTCOMES[-1] if _OUTCOMES else None


def _compute(job: Job, reference: Reference | None, missing: str | None, cache: ModelCache) -> dict:
    _COMPUTED.add(job.key)
    with claim(job.out_dir, job.key, wait_for_twin=not job.force) as run_dir:
        if run_dir != job.out_dir:
            print(f"note: {job.out_dir} holds another run; this one writes to {run_dir}")
        with started(job, run_dir, cache) as ctx:
            ctx.output.summary(job.eval.run(job.eval_cfg, ctx) or {})
            unreported = ctx.output.unreported()
            if unreported:  # a key typo or a forgotten measure() would otherwise leave the job without a verdict
                raise EvalDefect(
                    f"the eval {job.eval.name} declares {', '.join(unreported)} for the verdict but "
                    f"reported no measurement of it: a defect in the eval (evals/core/measure.py)"
                )
            measurements = ctx.output.measurements
            reference = own_reference(measurements) if job.scaling.name == "none" else reference
            judgement = judge(
                measurements,
                ctx.output.declared,
                reference,
                job.trained_context,
                job.target,
                criteria_of(job.verdict),
                missing,
            )
            ctx.output.verdict(judgement)
            summary = dict(ctx.output.record.data["summary"])
            # matplotlib: loaded when a job draws, not at start-up
            from ..decision.answer_figures import describe, job_figures

            for name, figure in job_figures(
                ctx.title,
                job.scaling.name,
                measurements,
                ctx.output.declared,
                reference,
                job.trained_context,
                job.target,
                criteria_of(job.verdict),
                describe(job.compare_fields),
            ).items():
                ctx.output.figure(name, figure)
    deploy(job, run_dir)
    print_summary(job, summary, run_dir)
    print_verdict(job, judgement)
    return summary


def deploy(job: Job, run_dir: Path) -> None:
    """The finished job's ``deploy/`` folder (:mod:`evals.core.run.deploy`); the job is done whatever happens here."""
    if job.scaling.name == "none" or not job.model.slots or not job.scaled or job.role != "job":
        return
    from rope_ext.export import geometry

    from .deploy import write_deploy

    try:
        write_deploy(
            job.scaling,
            geometry(job.model.config, job.scaling, job.model.slots, job.trained_context, job.scaled),
            job.model.config.to_dict(),
            run_dir,
        )
    except Exception as err:  # noqa: BLE001 -- an export defect must not undo a finished measurement
        print(f"warning: {run_dir / 'deploy'} not written: {type(err).__name__}: {err}", file=sys.stderr)


def judge_job(
    job: Job, measurements: list[dict], declared: dict, reference: Reference | None, missing: str | None
) -> dict:
    """The verdict of the job's measurements against ``reference`` (from
    :func:`evals.core.run.reference_search.find_reference`; None: ``missing`` says why); an unscaled job is its own
    reference."""
    if job.scaling.name == "none":
        reference = own_reference(measurements)
    return judge(measurements, declared, reference, job.trained_context, job.target, criteria_of(job.verdict), missing)


DETAIL = (
    "tokens@",
    "ppl_ci95_",
    "verdict",
    "target_length",
    "effective_length_reason",
    "dropped",
)  # not in the printed summary
DETAIL_PARTS = ("_ci95_", "_trials@", "_samples@", "_ratio@")


def print_summary(job: Job, summary: dict, run_dir: Path) -> None:
    print(f"\n{job.model.label} | {job.scaling.label} | {job.eval.name}  ->  {run_dir}")
    for key, value in summary.items():
        if key.startswith(DETAIL) or any(part in key for part in DETAIL_PARTS):
            continue
        print(f"  {key:<40} {value:.4g}" if isinstance(value, float) else f"  {key:<40} {value}")


def print_verdict(job: Job, judgement: dict) -> None:
    if judgement["lengths"] and job.role == "job":
        print("\n".join(format_job(f"{job.scaling.label} on {job.model.label}", judgement)))


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
    """A job rejected before it started still leaves a record, so a sweep's report can list it: ``failed``, or
    ``unreachable`` for a strategy that cannot be set up for the sweep's target (an answer, not a failure)."""
    from omegaconf import OmegaConf

    config = OmegaConf.to_container(cfg, resolve=False)
    unreachable = isinstance(err, TargetUnreachable)
    with claim(out_dir, "invalid") as run_dir:
        data = {
            "status": "unreachable" if unreachable else "failed",
            "job": {"name": Path(run_dir).name, "key": None, **(err.job if unreachable else {})},
            "config": config,
            "process": this_process(),
            "error": _error(err, with_traceback=False),
        }
        atomic_write(run_dir / "results.json", json.dumps(data, indent=2, default=str))


def _discard_hydra_dir() -> None:
    """A single run refused for bad input leaves nothing behind: Hydra made its run directory (``outputs/<date>/
    <time>_...`` with ``.hydra/`` and an empty log) before the job saw its config; it is removed when it holds only
    those, and so are the parents left empty by it, up to the working directory."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    run_dir = Path(HydraConfig.get().runtime.output_dir).resolve()
    cwd = Path.cwd().resolve()
    if not run_dir.is_dir() or run_dir == cwd or run_dir in cwd.parents:
        return
    if any(p.name != ".hydra" and not (p.is_file() and p.suffix == ".log") for p in run_dir.iterdir()):
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    for parent in run_dir.parents:
        if parent == cwd or cwd not in parent.parents:
            break
        try:
            parent.rmdir()  # only when empty
        except OSError:
            break


def run_hydra(cfg) -> dict | None:
    """One job of the Hydra app; returns its summary (a sweeper reads a trial's objective from it), None when it
    failed. Single run: a user error is one line and exit 2; a crash keeps its traceback. Multirun: every failure
    is recorded and printed as one line, and the sweep goes on."""
    out_dir, multirun = job_dir(cfg)
    _LAST.append("")
    _OUTCOMES.append("failed")  # until it is known to have ended otherwise
    try:
        job = parse_job(cfg, out_dir, multirun)
    except UserError as err:
        if isinstance(err, TargetUnreachable):
            _OUTCOMES[-1] = "unreachable"
        if multirun and isinstance(err, TargetUnreachable):
            print(f"unreachable: {err} (recorded; the sweep's answer lists it)", file=sys.stderr)
        else:
            print(f"error: {err}", file=sys.stderr)
        if not multirun:
            _discard_hydra_dir()
            sys.exit(2)
        _record_invalid(cfg, out_dir, err)
        return None
    _LAST[-1] = job.key
    computed = job.key in _COMPUTED
    try:
        summary = execute(job)
        _OUTCOMES[-1] = "ran" if job.key in _COMPUTED and not computed else "reused"
        return summary
    except UserError as err:  # recorded in the job's results.json
        print(f"error: {err}", file=sys.stderr)
        if not multirun:
            _discard_hydra_dir()  # kept when the job wrote its record there
            sys.exit(2)
    except EvalDefect as err:  # recorded too: one line, and the job has failed
        print(f"error: job {job.name} failed: {err}", file=sys.stderr)
        if not multirun:
            sys.exit(1)
    except Exception as err:
        if not multirun:
            raise
        print(
            f"error: job {job.name} crashed: {type(err).__name__}: {err} (traceback in its results.json)",
            file=sys.stderr,
        )
    return None
