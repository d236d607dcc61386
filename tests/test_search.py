"""The search (-m hydra/sweeper=optuna, evals/search): the space declared with each strategy, LongRoPE's per-dimension
factors, bad input as one line before any trial, and a real 4-trial Optuna search on the tiny model run through
the CLI -- interrupted, resumed without repeating a trial, surviving a failing one, writing its best config."""

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest

import rope_ext
from evals.core.job import parse_job
from evals.search.space import monotone_factors, monotone_steps
from tests.tiny import TINY

SEARCH = ["-m", "hydra/sweeper=optuna", *TINY, "data.books=[persuasion]", "eval.lengths=[256,512]", "scaling=yarn"]
ENV = {**os.environ, "WANDB_SILENT": "true", "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1"}


def test_every_declared_search_range_lies_inside_the_parameter_bounds():
    searched = 0
    for strategy in rope_ext.STRATEGIES.values():
        for name, param in strategy.params.items():
            if param.search is None:
                continue
            searched += 1
            if param.search == "monotone":
                assert param.type is list, (strategy.name, name)
                continue
            low, high = param.search
            assert low < high and param.why(low) is None and param.why(high) is None, (strategy.name, name)
            assert not param.log or low > 0, (strategy.name, name)
    assert searched >= 8
    yarn = rope_ext.STRATEGIES["yarn"].params
    # the declared ranges keep every yarn sample valid (beta_fast > beta_slow) and the factor on a log scale
    assert yarn["beta_fast"].search[0] > yarn["beta_slow"].search[1] and yarn["factor"].log


def test_per_dimension_factors_meet_longropes_constraints_for_any_sample():
    generator = random.Random(0)
    for _ in range(200):
        pairs, n_hat = 32, generator.randrange(32)
        steps = [generator.random() * generator.choice([0, 1, 5]) for _ in range(pairs)]
        factors = monotone_factors(n_hat, steps, 2.5)
        assert len(factors) == pairs and factors[:n_hat] == [1.0] * n_hat
        assert all(1.0 <= a <= b <= 2.5 for a, b in zip(factors, factors[1:]))
        rope_ext.resolve({"name": "longrope", "factor": 2.0, "short_factor": [1.0] * pairs, "long_factor": factors}, 8192)
    assert monotone_factors(2, [0, 0, 0, 1.0], 2.5) == [1.0, 1.0, 1.0, 2.5]  # one large step: a jump


def test_a_known_shape_enqueued_as_steps_gives_back_its_factors():
    # NTK-by-parts-like: 1 for the fast pairs, a ramp, then the full factor (< the space's upper bound)
    factors = [1.0] * 5 + [1.1, 1.25, 1.4] + [1.5] * 8
    n_hat, steps = monotone_steps(factors, 2.5)
    assert n_hat == 5 and monotone_factors(n_hat, steps, 2.5) == pytest.approx(factors, abs=1e-6)


def test_search_figures_carry_one_title_and_a_log_axis_for_perplexities_that_span_decades():
    import matplotlib

    matplotlib.use("Agg")
    import optuna.visualization.matplotlib as plots

    from evals.search.outputs import log_scale_if_wide, retitle

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda t: 25 * (1 + 10 * (t.suggest_float("factor", 1, 4) - 2) ** 2) + t.suggest_float("beta", 1, 2),
                   n_trials=12)  # perplexity-like: 25 at the best, hundreds far from it
    importance = plots.plot_param_importances(study)  # Optuna titles this one on the left
    retitle(importance, "importance: yarn, minimize ppl@16384")
    assert [importance.get_title(loc=loc) for loc in ("left", "center", "right")] == [
        "", "importance: yarn, minimize ppl@16384", ""]
    history = plots.plot_optimization_history(study)
    log_scale_if_wide(history)
    assert history.get_yscale() == "log"
    narrow = optuna.create_study()
    narrow.optimize(lambda t: 25 + t.suggest_float("beta", 1, 2), n_trials=3)
    flat = plots.plot_optimization_history(narrow)
    log_scale_if_wide(flat)
    assert flat.get_yscale() == "linear"


SLOW = pytest.mark.slow  # one CLI run each (~6 s): one case in the default suite, the others after it in CI


@pytest.mark.parametrize("args, says", [
    (["objective=longppl@512"], "objective=longppl@512: no job of this search reports longppl"),
    pytest.param(["objective=ppl@1024"], "objective=ppl@1024: the job evaluates [256, 512], not 1024", marks=SLOW),
    pytest.param(["objective=ppl@512", "scaling.beta_fast=interval(0,64)"],
                 "scaling.beta_fast=interval(0,64): 0.0 is outside what 'yarn' declares: beta_fast=0.0 must be > 0",
                 marks=SLOW),
    pytest.param(["objective=ppl@512", 'constraints=["needle_acc_retention@256>=0.9"]'],
                 "constraints=needle_acc_retention@256: no job of this search reports needle_acc_retention", marks=SLOW),
])
def test_bad_search_input_is_one_line_and_exit_2_before_any_trial(tmp_path, run_cli, args, says):
    sweep_dir = tmp_path / "search"
    result = run_cli(*SEARCH, "model.original_max_position=256", f"hydra.sweep.dir={sweep_dir}", *args, env=ENV)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], result.stderr
    assert not sweep_dir.exists()  # no study, no job, no model loaded


def trials(sweep_dir: Path) -> list:
    storage = f"sqlite:///{sweep_dir / 'optuna.db'}"
    return optuna.load_study(study_name="rope_ext", storage=storage).trials


@pytest.mark.slow  # heavy: two CLI searches (about a minute); CI runs it after the default suite
def test_a_four_trial_search_resumes_after_a_kill_survives_a_failing_trial_and_writes_its_best_config(
        tmp_path, run_cli, compose):
    sweep_dir = tmp_path / "search"
    args = [*SEARCH, "model.original_max_position=256", "logger=none", "objective=ppl@512", "hydra.sweeper.n_trials=4",
            'constraints=["ppl_retention@256>=0.5"]', f"hydra.sweep.dir={sweep_dir}",
            # the first trial fails: beta_fast 0.5 is not above beta_slow 1 (the job rejects it; the search goes on);
            # the second is the published default, which the report sets the best against
            "hydra.sweeper.enqueue=[{scaling.beta_fast:0.5,scaling.beta_slow:1.0},{scaling.beta_fast:32.0,scaling.beta_slow:1.0}]"]
    process = run_cli(*args, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and not list(sweep_dir.glob("1_*/results.json")):
        time.sleep(0.1)
    while time.time() < deadline and json.loads(next(sweep_dir.glob("1_*/results.json")).read_text())["status"] != "done":
        time.sleep(0.1)
    time.sleep(1.0)  # trial 1 told to the study, trial 2 under way
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    before = {t.number: t.state.name for t in trials(sweep_dir)}
    assert before[0] == "FAIL" and before[1] == "COMPLETE"
    first = {p.parent.name: p.stat().st_mtime_ns for p in sweep_dir.glob("[01]_*/results.json")}

    result = run_cli(*args, env=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "already finished; not repeated" in result.stdout
    assert ("RUNNING" in before.values()) == ("was cut off; it runs again" in result.stdout)
    study = trials(sweep_dir)
    finished = [t for t in study if "outcome" in t.user_attrs]
    assert len(finished) == 4  # the budget counts finished trials: none repeated, the cut-off one tried again
    assert {p.parent.name: p.stat().st_mtime_ns for p in sweep_dir.glob("[01]_*/results.json")} == first
    assert "beta_fast" in study[0].user_attrs["error"] and study[0].state.name == "FAIL"
    assert sum(t.state.name == "COMPLETE" for t in finished) == 3
    rows = (sweep_dir / "search_trials.csv").read_text().splitlines()
    assert rows[0].startswith("trial,state,ppl@512,ppl_retention@256>=0.5,feasible")
    summary = json.loads((sweep_dir / "search.json").read_text())
    best = summary["best"][0]
    values = {t.number: t.values[0] for t in finished if t.state.name == "COMPLETE"}
    assert best["values"]["ppl@512"] == min(values.values()) and best["trial"] in values
    for name in ("search_history", "search_importance", "search_parallel"):
        assert (sweep_dir / f"{name}.png").stat().st_size > 0
    report = (sweep_dir / "report.md").read_text()
    assert "## Search" in report
    given = summary["given"]
    assert [g["trial"] for g in given] == [1] and given[0]["scaling"]["beta_fast"] == 32.0
    assert given[0]["reported"]["ppl@512"] == values[1] and "ppl_retention@256" in given[0]["reported"]
    assert (f"against a setting given (hydra.sweeper.enqueue), trial 1: ppl@512 = {values[1]:.5g}" in report) == (
        best["trial"] != 1)
    # the best setting is a ready-to-use scaling option: composed, parsed and equal to the best trial's
    config = sweep_dir / "conf" / "scaling" / "yarn_searched.yaml"
    cfg = compose(*TINY, "model.original_max_position=256", f"hydra.searchpath=[file://{sweep_dir / 'conf'}]",
                  "scaling=yarn_searched")
    job = parse_job(cfg, tmp_path / "use")
    ran = json.loads((Path(best["dir"]) / "results.json").read_text())
    stored = {k: v for k, v in ran["config"]["scaling"].items() if k != "label"}
    assert job.scaling.to_dict() == stored, config.read_text()


@pytest.mark.slow  # heavy: a CLI search; CI runs it after the default suite
def test_per_dimension_two_objective_search_gives_a_pareto_front_of_valid_longrope_configs(tmp_path, run_cli):
    sweep_dir = tmp_path / "longrope"
    result = run_cli("-m", "hydra/sweeper=optuna", *TINY, "data.books=[persuasion]", "eval.lengths=[256,512]",
                     "model.original_max_position=256", "scaling=longrope", "objective=[ppl@512,ppl@256]",
                     "hydra.sweeper.n_trials=3", "logger=wandb", "logger.mode=offline", f"hydra.sweep.dir={sweep_dir}",
                     env=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((sweep_dir / "search.json").read_text())
    assert summary["directions"] == ["minimize", "minimize"] and summary["sampler"] == "tpe" and summary["complete"] == 3
    # the tiny model's head_dim is 64 / 4 heads = 16, so d/2 = 8 factors per list, both searched under LongRoPE's rule
    for best in summary["best"]:
        for key in ("short_factor", "long_factor"):
            factors = best["scaling"][key]
            assert len(factors) == 8
            assert all(1.0 <= a <= b <= 1.25 * 2 for a, b in zip(factors, factors[1:])), factors
        assert Path(best["config"]).name == f"longrope_pareto{best['trial']}.yaml"
    front = {b["trial"] for b in summary["best"]}
    values = {t.number: t.values for t in trials(sweep_dir)}
    for number in front:  # nothing in the study dominates a front member
        assert not any(all(x <= y for x, y in zip(v, values[number])) and v != values[number] for v in values.values())
    (run,) = (sweep_dir / "search").glob("wandb/offline-run-*")  # the search's own W&B run in the sweep's group
    assert run.is_dir()
