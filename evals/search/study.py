"""The search loop (Optuna's ask-and-tell, Akiba et al. 2019, arXiv 1907.10902) around Hydra's launcher.

Before any trial: the command line is split into fixed overrides and ranges; a probe config (the fixed overrides
and one value per searched key) is parsed as a job -- every check a job does, with the model's geometry for
per-dimension factors -- and the objective and constraints are checked against what it reports. Any problem is
one line and exit 2 (:class:`evals.core.errors.UserError`).

Then, in batches of ``hydra.sweeper.n_jobs`` trials, each trial's overrides go to the launcher as an ordinary job
(numbered by the trial: ``<sweep dir>/<trial>_<model>_<strategy>...``); the objective values are read from the
summary the job returns. A job that fails, or that does not report the objective, is a failed trial and the search
goes on. The study is ``optuna.db`` in the sweep directory; a re-run with the same arguments continues it: a trial
a killed run left running is marked failed and tried again first (its job is reused when it had finished; a trial
another live process runs is left to it: :mod:`evals.search.claims`), and the budget counts finished trials only.
"""

from __future__ import annotations

import json
import re
import sys
import warnings
from pathlib import Path

from omegaconf import OmegaConf, open_dict

from ..core.errors import ConfigError, scaling_errors_as_user_errors
from ..core.inputs.models import model_name
from ..core.run.rundir import read_results
from . import claims
from . import objective as objectives_of
from . import default as defaults_of
from . import space as spaces

SAMPLERS = ("auto", "tpe", "cmaes", "random", "nsga2")
LAUNCHER_FAILED = "launcher failed"  # a trial's outcome when the launcher, not its job, failed: a re-run retries it
MANY = 8  # more searched values than this: CMA-ES (unconstrained, one objective); TPE otherwise


def split(arguments: list[str], params: dict | None, parser) -> tuple[list[str], list]:
    """(fixed overrides as given, the sweep overrides) of the command line and ``hydra.sweeper.params``."""
    texts = [f"{k}={v}" for k, v in (params or {}).items()] + list(arguments)
    fixed, ranges = [], {}
    for override in parser.parse_overrides(texts):
        key = override.get_key_element()
        if override.is_sweep_override():
            if key == "scaling" or key.startswith("scaling@"):
                raise ConfigError(
                    f"{override.input_line}: a search explores one strategy; run "
                    f"one search per strategy (scaling=yarn, then scaling=ntk_by_parts)"
                )
            ranges[key] = override
        else:
            ranges.pop(key, None)
            fixed = [f for f in fixed if f.split("=", 1)[0].lstrip("+~") != key] + [override.input_line]
    return fixed, list(ranges.values())


def _pairs(cfg, model):
    import rope_ext

    def pairs() -> int:
        with scaling_errors_as_user_errors():
            slots = rope_ext.select_slots(model.slots or (), cfg.scaling.get("layer_types") or "auto")
        sizes = sorted({slot.dim // 2 for slot in slots})
        if len(sizes) != 1:
            raise ConfigError(
                f"scaling.layer_types: the scaled layers have rotary sizes d/2 = {sizes}; a per-dimension "
                f"search needs one: choose the layer types with scaling.layer_types"
            )
        return sizes[0]

    return pairs


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9@._-]+", "_", text).strip("_")


class Search:
    """One search: validated at construction (nothing runs), then :meth:`run`."""

    def __init__(self, sweeper, arguments: list[str]):
        from hydra.core.override_parser.overrides_parser import OverridesParser

        from rope_ext import STRATEGIES
        from rope_ext.strategies.registry import resolve_name

        from ..core.job.parse import parse_job
        from ..core.inputs.models import resolve_model
        from ..core.registry import EVALS

        self.sweeper, self.conf = sweeper, sweeper.conf
        self.loader = sweeper.hydra_context.config_loader
        if self.conf.sampler not in SAMPLERS:
            raise ConfigError(f"hydra.sweeper.sampler={self.conf.sampler!r} is not one of {', '.join(SAMPLERS)}")
        for key in ("n_trials", "n_jobs"):
            if int(self.conf[key]) < 1:
                raise ConfigError(f"hydra.sweeper.{key}={self.conf[key]} must be at least 1")
        self.fixed, ranges = split(arguments, self.conf.params, OverridesParser.create(config_loader=self.loader))
        base = self.compose(self.fixed)
        with scaling_errors_as_user_errors():
            self.strategy = STRATEGIES[resolve_name(base.scaling.get("name"))]
        spec = EVALS.get(base.eval.get("name"))
        model = self.model = None
        if (
            spec is not None
        ):  # resolved once: the probe job reuses it (parse_job says what is wrong with an unknown eval)
            model = self.model = resolve_model(base.model, geometry=True, weights="model" in spec.needs_for(base.eval))
        given = [spaces.given(o, self.strategy) for o in ranges]
        fixed_keys = {f.split("=", 1)[0].lstrip("+~") for f in self.fixed}
        skip = fixed_keys | {s.key for s in given}
        # the extension the objective asks for bounds per-dimension factors; its lengths are read from the config here
        # and checked with the probe job below
        lengths = [int(m.group(2)) for m in map(objectives_of.AT.match, map(str, _listed(base.get("objective")))) if m]
        trained = model.trained_context if model is not None else 1
        extension = max(lengths, default=trained) / trained
        self.space = given + spaces.declared(
            self.strategy, skip, _pairs(base, model), extension, self.floors(base, skip, trained)
        )
        self.check_enqueue()
        if not self.space:
            raise ConfigError(
                f"nothing to search: scaling '{self.strategy.name}' declares no searched parameter and no "
                f"range was given (e.g. scaling.factor=tag(log,interval(1,8)))"
            )
        # one length for every trial: the target's, or the objective's (its verdict answers there)
        self.length, self.length_from = defaults_of.judged_length(base, trained) if model is not None else (None, "")
        self.judged = (
            [f"verdict.target={self.length}"]
            if self.length is not None and base.get("target") in (None, "") and base.verdict.get("target") is None
            else []
        )
        self.model = model
        defaults = {f"scaling.{k}": p.default for k, p in self.strategy.params.items()}
        # the probe checks the objective against the job's lengths (its own verdict target: a length the job does
        # not evaluate is said once, by the objective's check)
        probe = self.compose(self.fixed + self.overrides({s.key: s.probe(defaults.get(s.key)) for s in self.space}))
        self.sweep_dir = self.choose_dir(base)
        job = parse_job(probe, self.sweep_dir / "probe", multirun=True, model=model)
        self.objectives = objectives_of.objectives(probe, job)
        self.constraints = objectives_of.constraints(probe, job)
        self.sampler_name = self.choose_sampler()
        self.config, self.trained = base, job.trained_context
        self.signature = {
            "strategy": self.strategy.name,
            "objective": [t.key for t in self.objectives],
            "constraints": [c.text for c in self.constraints],
            "space": [s.describe() for s in self.space],
            "fixed": sorted(self.fixed),
        }

    def floors(self, base, skip: set, trained: int) -> dict:
        """{parameter: its lower bound} for ``target=`` (:func:`evals.search.space.target_floors`), said in one line."""
        from ..core.job.target import parse_target

        target = parse_target(base, trained) if self.model is not None else None
        scaling = OmegaConf.to_container(base.scaling, resolve=True)
        floors, line = spaces.target_floors(self.strategy, scaling, skip, trained, target, base.get("target"))
        if line:
            print(line)
        return floors

    def published_default(self) -> list[dict]:
        """The published default for the search's length (:func:`evals.search.default.published`), as one setting
        to try first; none when a searched value has none inside its range. Said in one line either way."""
        if self.length is None:
            return []
        scaling = OmegaConf.to_container(self.config.scaling, resolve=True)
        setting, why = defaults_of.published(
            self.strategy, scaling, self.space, self.trained, self.length, self.model.slots if self.model else None
        )
        if setting is None:
            print(f"search: no published default to set the best against at {self.length} tokens: {why}")
            return []
        shown = ", ".join(f"{k.split('.', 1)[1]}={defaults_of.shown(v)}" for k, v in setting.items())
        print(
            f"search: trial 0 is the published default for {self.length} tokens ({shown}"
            + (f"; {why}" if why else "")
            + "), the setting the best is set against (hydra.sweeper.enqueue=[] leaves it out)"
        )
        return [setting]

    def check_enqueue(self) -> None:
        """Every setting in ``hydra.sweeper.enqueue`` names searched values only (a typo would be silently dropped)."""
        names = [name for s in self.space for name in s.names()]
        for setting in self.conf.enqueue or []:
            if not hasattr(setting, "keys"):
                raise ConfigError(
                    f"hydra.sweeper.enqueue: {setting} is not a mapping of searched values, e.g. "
                    f"[{{{names[0] if names else 'scaling.factor'}:2.0}}]"
                )
            unknown = [str(k) for k in setting.keys() if str(k) not in names]
            if unknown:
                shown = names if len(names) <= 8 else [*names[:6], "...", names[-1]]
                raise ConfigError(
                    f"hydra.sweeper.enqueue: {', '.join(unknown)} is not searched; the searched values: "
                    f"{', '.join(shown)}"
                )

    # --- configs -------------------------------------------------------------------------------------------------

    def compose(self, overrides: list[str]):
        """The job config these overrides give, as a trial's job sees it (without the ``hydra`` node)."""
        cfg = self.loader.load_sweep_config(master_config=self.sweeper.config, sweep_overrides=list(overrides))
        with _writable(cfg), open_dict(cfg):
            del cfg["hydra"]
        return cfg

    @staticmethod
    def overrides(values: dict) -> list[str]:
        return [f"{key}={spaces.value_text(value)}" for key, value in values.items()]

    def choose_dir(self, base) -> Path:
        """The sweep directory: ``hydra.sweep.dir`` when given on the command line, else one named by the search
        (``multirun/search/<model>_<strategy>_<objective>``), so re-running the same command continues its study."""
        config = self.sweeper.config
        given = any(str(o).lstrip("+~").startswith("hydra.sweep.dir=") for o in config.hydra.overrides.hydra)
        if not given:
            objective = "+".join(map(str, _listed(base.get("objective"))))
            chosen = f"multirun/search/{_slug(f'{model_name(base.model)}_{self.strategy.name}_{objective}')}"
            with open_dict(config), _writable(config):
                config.hydra.sweep.dir = chosen
                # the launcher composes each trial's config anew from these overrides: without this one its jobs
                # would go to the default (dated) sweep directory, apart from the study
                config.hydra.overrides.hydra.append(f"hydra.sweep.dir={chosen}")
        return Path(str(config.hydra.sweep.dir))

    # --- the study -----------------------------------------------------------------------------------------------

    def study(self):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        storage = self.conf.storage or f"sqlite:///{(self.sweep_dir / 'optuna.db').resolve()}"
        directions = [t.direction for t in self.objectives]
        try:
            # several processes write one SQLite file: wait for its lock (pysqlite gives up after 5 s by default),
            # and create its tables one process at a time (SQLAlchemy's create_all checks, then creates: two processes
            # starting together both create, and the second fails "table ... already exists")
            with claims.opening(storage):
                store = (
                    optuna.storages.RDBStorage(storage, engine_kwargs={"connect_args": {"timeout": 120}})
                    if storage.startswith("sqlite:///")
                    else storage
                )
                study = optuna.create_study(
                    study_name=self.conf.study_name, storage=store, directions=directions, load_if_exists=True
                )
        except Exception as err:  # noqa: BLE001 -- SQLAlchemy's DatabaseError on a truncated or foreign file
            if "DatabaseError" not in type(err).__name__ and "database" not in str(err).lower():
                raise
            raise ConfigError(
                f"the study {storage.removeprefix('sqlite:///')} cannot be read ({type(err).__name__}: "
                f"{str(err).splitlines()[0][:120]}); it is damaged: move it away to start the search "
                f"anew (its finished trials' jobs are reused), or give another hydra.sweep.dir"
            ) from None
        stored = study.user_attrs.get("search")
        if stored is None:
            study.set_user_attr("search", self.signature)
        elif stored != self.signature:
            differs = ", ".join(k for k in self.signature if stored.get(k) != self.signature[k])
            raise ConfigError(
                f"hydra.sweep.dir={self.sweep_dir} holds the study of another search ({differs} differ); "
                f"re-run it with its own arguments or give another hydra.sweep.dir"
            )
        study.sampler = self.sampler(len(study.trials))
        return study

    def choose_sampler(self) -> str:
        """The sampler's name, checked against the objectives and constraints (before anything runs)."""
        name, multi, constrained = self.conf.sampler, len(self.objectives) > 1, bool(self.constraints)
        if name == "auto":
            name = "cmaes" if sum(s.size for s in self.space) > MANY and not multi and not constrained else "tpe"
        if name == "cmaes" and multi:
            raise ConfigError("hydra.sweeper.sampler=cmaes takes one objective; use tpe or nsga2 for several")
        if name in ("cmaes", "random") and constrained:
            print(
                f"search: hydra.sweeper.sampler={name} samples without the constraints; the best is chosen among "
                f"the trials that meet them (tpe and nsga2 steer towards them)"
            )
        return name

    def sampler(self, seen: int):
        import optuna

        name, constrained = self.sampler_name, bool(self.constraints)
        seed = None if self.conf.seed is None else int(self.conf.seed) + seen  # a resumed study draws new points
        feasible = objectives_of.constraint_values if constrained else None
        if name == "cmaes":
            return optuna.samplers.CmaEsSampler(seed=seed)
        if name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if name == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=seed, constraints_func=feasible)
        startup = max(2, min(10, int(self.conf.n_trials) // 3))
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, n_startup_trials=startup, constraints_func=feasible
        )

    def resume(self, study) -> int:
        """Trials a killed run left running are failed and tried again first; the finished trials' count."""
        for number in claims.recover(study):  # never a trial another live process runs (evals.search.claims)
            print(f"search: trial {number} was cut off; it runs again (its job is reused if it finished)")
        retried = {t.user_attrs.get("retry_of") for t in study.trials}
        for trial in study.trials:  # the launcher failed under them: their jobs never said how the setting does
            if trial.user_attrs.get("outcome") == LAUNCHER_FAILED and trial.number not in retried:
                study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number}, skip_if_exists=False)
                print(
                    f"search: trial {trial.number} was lost with its launcher; it runs again (its job is reused if "
                    f"it finished)"
                )
        if not study.trials:
            if self.conf.enqueue is not None:
                for params in self.conf.enqueue:
                    study.enqueue_trial(dict(params), user_attrs={"role": "given"})
            for params in self.published_default() if self.conf.enqueue is None else []:
                # skip_if_exists: two processes starting the same search together enqueue it once
                study.enqueue_trial(dict(params), user_attrs={"role": "default"}, skip_if_exists=True)
        elif self.conf.enqueue:
            print(
                f"search: hydra.sweeper.enqueue is not enqueued again: the study already holds {len(study.trials)} "
                f"trial(s)"
            )
        finished = [t for t in study.trials if t.user_attrs.get("outcome") in ("done", "failed")]
        if finished:
            print(f"search: {len(finished)} trial(s) of {self.sweep_dir / 'optuna.db'} already finished; not repeated")
        return len(finished)

    def run(self) -> list:
        from . import outputs, summary

        study = self.study()
        OmegaConf.save(self.sweeper.config, self.sweep_dir / "multirun.yaml")
        done = self.resume(study)
        goal = int(self.conf.n_trials)
        print(
            f"search: {self.strategy.name}, {' and '.join(t.direction + ' ' + t.key for t in self.objectives)}"
            + (f" subject to {', '.join(c.text for c in self.constraints)}" if self.constraints else "")
            + f"; {self.sampler_name}, {max(0, goal - done)} trial(s) to run; {self.sweep_dir}"
        )
        if self.length is not None:
            print(f"search: every trial is judged at {self.length} tokens ({self.length_from})")
        for line in (s.describe() for s in self.space):
            print(f"  {line}")
        returns, launcher_failures, lost = [], 0, 0
        while True:
            # the budget is the study's: trials that finished or run now, in any process searching it, count
            taken = len(self.spent(study)) + lost
            if taken >= goal:
                break
            batch = self.within_budget(
                study, [claims.claim(study) for _ in range(min(int(self.conf.n_jobs), goal - taken))], goal - lost
            )
            if not batch:
                break
            jobs = []
            for trial in batch:
                values = {s.key: s.suggest(trial) for s in self.space}
                jobs.append(self.fixed + self.judged + self.overrides(values))
                trial.set_user_attr("overrides", self.overrides(values))
            try:
                results = self.sweeper.launcher.launch(jobs, initial_job_idx=batch[0].number)
            except Exception as err:  # noqa: BLE001 -- the launcher itself failed (a worker killed, a cluster job lost)
                error = f"the launcher failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                for trial in batch:  # failed now; a re-run tries them again (reusing the jobs that finished)
                    self.fail(study, trial, error, outcome=LAUNCHER_FAILED)
                lost += len(batch)
                launcher_failures += 1
                if launcher_failures == 2:  # twice in a row: the launcher, not a setting, is at fault
                    outputs.write(self, study)
                    print(
                        f"error: {error}, on two batches in a row; fix the launcher and re-run the same command: "
                        f"the study continues and those trials run again",
                        file=sys.stderr,
                    )
                    raise SystemExit(1) from None
                continue
            launcher_failures = 0
            for trial, result in zip(batch, results):
                self.tell(study, trial, result)
            returns.append(results)
        written = outputs.write(self, study)
        complete = [t for t in study.trials if t.state.name == "COMPLETE"]
        if not complete:
            print(
                f"error: no trial of the search finished; see {self.sweep_dir / 'search_trials.csv'}", file=sys.stderr
            )
            raise SystemExit(1)
        for path in written:
            print(f"search: {path}")
        for line in summary.summary_lines(json.loads((self.sweep_dir / outputs.RESULT).read_text())):
            print(line)
        return returns

    @staticmethod
    def spent(study) -> list[int]:
        """The numbers of the trials that take a place in the budget: finished (done or failed) or running."""
        return sorted(
            t.number
            for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get("outcome") in ("done", "failed") or t.state.name == "RUNNING"
        )

    def within_budget(self, study, batch: list, goal: int) -> list:
        """The asked trials that fit the budget: two processes searching one study may ask at once, so the first
        ``goal`` places go by trial number, and a trial past them is pruned unrun (another process runs its place)."""
        import optuna

        allowed = set(self.spent(study)[:goal])
        for trial in batch:
            if trial.number not in allowed:
                trial.set_user_attr("outcome", "over budget")
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                print(
                    f"search: trial {trial.number} not run: the study's {goal} trials are taken (another process "
                    f"searches the same study)"
                )
        return [t for t in batch if t.number in allowed]

    def tell(self, study, trial, result) -> None:
        error, summary = None, None
        try:
            summary = result.return_value
        except Exception as err:  # noqa: BLE001 -- the job raised: a failed trial, the search goes on
            error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        job_dir = OmegaConf.select(result.hydra_cfg, "hydra.runtime.output_dir") if result.hydra_cfg else None
        trial.set_user_attr("dir", str(job_dir) if job_dir else None)
        if summary is None and error is None:
            error = _job_error(job_dir)
        values = [t.value(summary) for t in self.objectives]
        if error is None and None in values:
            missing = [t.key for t, v in zip(self.objectives, values) if v is None]
            error = f"the job did not report {', '.join(missing)}"
        violations = [c.violation(summary) for c in self.constraints]
        trial.set_user_attr(
            "reported",
            {t.key: v for t, v in zip(self.objectives, values)}
            | {c.target.key: c.target.value(summary) for c in self.constraints},
        )
        # a constraint that was not reported (no unscaled reference) is not met
        trial.set_user_attr("constraints", [1.0 if v is None else float(v) for v in violations])
        if error:
            self.fail(study, trial, error)
            return
        trial.set_user_attr("outcome", "done")
        study.tell(trial, values)
        shown = ", ".join(f"{t.key} {v:.5g}" for t, v in zip(self.objectives, values))
        print(
            f"search: trial {trial.number}: {shown}"
            + ("" if all(v <= 0 for v in trial.user_attrs["constraints"]) else " (a constraint is not met)")
        )

    @staticmethod
    def fail(study, trial, error: str, outcome: str = "failed") -> None:
        """A failed trial: recorded with its error, and the search goes on."""
        import optuna

        trial.set_user_attr("outcome", outcome)
        trial.set_user_attr("error", error)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        print(f"search: trial {trial.number} failed ({error}); the search goes on", file=sys.stderr)


def _listed(value) -> list:
    if value is None:
        return []
    return [value] if isinstance(value, str) or not hasattr(value, "__iter__") else list(value)


def _job_error(job_dir) -> str:
    results = read_results(Path(job_dir) / "results.json") if job_dir else None
    error = (results or {}).get("error") or {}
    return error.get("message") or "the job failed (see its directory)"


class _writable:
    """Hydra's config is read-only; the sweep directory is chosen before anything reads it."""

    def __init__(self, config):
        self.config = config

    def __enter__(self):
        self.flag = OmegaConf.is_readonly(self.config)
        OmegaConf.set_readonly(self.config, False)

    def __exit__(self, *exc):
        OmegaConf.set_readonly(self.config, self.flag)
