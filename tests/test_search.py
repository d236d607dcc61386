"""The search (-m hydra/sweeper=optuna, evals/search): the space declared with each strategy, LongRoPE's per-dimension
factors, bad input as one line before any trial, what a search judges, publishes and says, real Optuna searches on
the tiny model through the CLI (searches across processes -- interrupted, resumed, parallel, sharing a study, a
worker dying -- are in tests/test_search_processes.py)."""

import json
import os
from pathlib import Path

import optuna
import pytest

import rope_ext
from evals.core.job.parse import parse_job
from evals.search.space import MonotoneFactors, monotone_factors, monotone_steps
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


def test_per_dimension_factors_meet_longropes_constraints_and_cover_the_range_for_any_sample():
    space = MonotoneFactors("scaling.factors", pairs=32, upper=2.5)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    tops = []
    for _ in range(300):
        trial = study.ask()
        factors, n_hat = space.suggest(trial), trial.params["scaling.factors.n_hat"]
        assert len(factors) == 32 and factors[:n_hat] == [1.0] * n_hat
        assert all(1.0 <= a <= b <= 2.5 for a, b in zip(factors, factors[1:]))
        rope_ext.resolve({"name": "longrope", "factor": 2.0, "short_factor": [1.0] * 32, "long_factor": factors}, 8192)
        tops.append(factors[-1])
        study.tell(trial, 0.0)
    # the largest factor is searched, not pinned at the bound: samples spread over [1, 2.5] (log-uniform)
    assert sum(t >= 2.49 for t in tops) < 15 and sum(t < 1.35 for t in tops) > 60 and sum(t > 1.85 for t in tops) > 60
    assert monotone_factors(2, 2.5, [0, 0, 0, 1.0]) == [1.0, 1.0, 1.0, 2.5]  # one large step: a jump
    assert monotone_factors(0, 1.7, [0.3] + [0.0] * 7) == [1.7] * 8  # one step alone: PI's flat shape
    assert monotone_factors(3, 2.0, [0.5] * 3 + [0.0] * 5) == [1.0] * 8  # no step after n_hat: nothing scaled


def test_a_known_shape_enqueued_as_steps_gives_back_its_factors():
    # NTK-by-parts-like: 1 for the fast pairs, a ramp, then the full factor (< the space's upper bound)
    factors = [1.0] * 5 + [1.1, 1.25, 1.4] + [1.5] * 8
    n_hat, top, steps = monotone_steps(factors)
    assert n_hat == 5 and top == 1.5 and monotone_factors(n_hat, top, steps) == pytest.approx(factors, abs=1e-6)
    assert monotone_factors(*monotone_steps([1.0] * 8)) == [1.0] * 8


def test_search_figures_carry_one_title_and_a_log_axis_for_perplexities_that_span_decades():
    import matplotlib

    matplotlib.use("Agg")
    import optuna.visualization.matplotlib as plots

    from evals.search.figures import log_scale_if_wide, retitle

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(
        lambda t: 25 * (1 + 10 * (t.suggest_float("factor", 1, 4) - 2) ** 2) + t.suggest_float("beta", 1, 2),
        n_trials=12,
    )  # perplexity-like: 25 at the best, hundreds far from it
    importance = plots.plot_param_importances(study)  # Optuna titles this one on the left
    retitle(importance, "importance: yarn, minimize ppl@16384")
    assert [importance.get_title(loc=loc) for loc in ("left", "center", "right")] == [
        "",
        "importance: yarn, minimize ppl@16384",
        "",
    ]
    history = plots.plot_optimization_history(study)
    log_scale_if_wide(history)
    assert history.get_yscale() == "log"
    narrow = optuna.create_study()
    narrow.optimize(lambda t: 25 + t.suggest_float("beta", 1, 2), n_trials=3)
    flat = plots.plot_optimization_history(narrow)
    log_scale_if_wide(flat)
    assert flat.get_yscale() == "linear"


SLOW = pytest.mark.slow  # one CLI run each (~6 s): one case in the default suite, the others after it in CI


@pytest.mark.parametrize(
    "args, says",
    [
        (["objective=longppl@512"], "objective=longppl@512: no job of this search reports longppl"),
        pytest.param(["objective=ppl@1024"], "objective=ppl@1024: the job evaluates [256, 512], not 1024", marks=SLOW),
        pytest.param(
            ["objective=ppl@512", "scaling.beta_fast=interval(0,64)"],
            "scaling.beta_fast=interval(0,64): 0.0 is outside what 'yarn' declares: beta_fast=0.0 must be > 0",
            marks=SLOW,
        ),
        pytest.param(
            ["objective=ppl@512", 'constraints=["needle_acc_retention@256>=0.9"]'],
            "constraints=needle_acc_retention@256: no job of this search reports needle_acc_retention",
            marks=SLOW,
        ),
        # several objectives written as a sweep, not a list: not a searched parameter
        pytest.param(
            ["objective=ppl@512,ppl@256"],
            "objective=ppl@512,ppl@256: a search explores the strategy's "
            "parameters (scaling.<name>), not objective; several objectives are a list: objective=[ppl@512,ppl@256]",
            marks=SLOW,
        ),
        pytest.param(
            ["objective=ppl@512", "hydra.sweeper.n_jobs=0"], "hydra.sweeper.n_jobs=0 must be at least 1", marks=SLOW
        ),
        pytest.param(  # the objective at the trained 256, the target at 512: judged where it is not optimised
            ["objective=ppl@256", "target=2x"],
            "error: objective=ppl@256 and target=2x (512 tokens) are two lengths; a search optimises and is judged at "
            "one: objective=ppl@512 with target=2x, or no target (the search is then judged at 256)",
            marks=SLOW,
        ),
        pytest.param(
            ["objective=ppl@512", "scaling.factor=tag(log,range(1,8,0.5))"],
            "a log scale takes interval(a,b) (or range(a,b) of an int parameter), not range() with a step of 0.5",
            marks=SLOW,
        ),
        pytest.param(
            ["objective=ppl@512", "hydra.sweeper.enqueue=[{scaling.betafast:32}]"],
            "hydra.sweeper.enqueue: scaling.betafast is not searched; the searched values: scaling.factor, "
            "scaling.beta_fast, scaling.beta_slow, scaling.attention_factor",
            marks=SLOW,
        ),
    ],
)
@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_bad_search_input_is_one_line_and_exit_2_before_any_trial(tmp_path, run_cli, args, says):
    sweep_dir = tmp_path / "search"
    result = run_cli(*SEARCH, "model.original_max_position=256", f"hydra.sweep.dir={sweep_dir}", *args, env=ENV)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], result.stderr
    assert not sweep_dir.exists()  # no study, no job, no model loaded


def test_an_objective_without_a_search_is_one_line_and_exit_2_before_the_job(tmp_path, run_cli):
    # -m forgotten: Hydra would run one plain job and search nothing
    result = run_cli(*SEARCH[2:], "objective=ppl@512", f"hydra.run.dir={tmp_path}", env=ENV)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == (
        "error: objective=ppl@512: objective and constraints are what a search "
        "optimises; run it as one: python run.py -m hydra/sweeper=optuna ... (one trial "
        "alone: objective=null constraints=[])"
    )
    assert not list(tmp_path.rglob("results.json"))


def trials(sweep_dir: Path) -> list:
    storage = f"sqlite:///{sweep_dir / 'optuna.db'}"
    return optuna.load_study(study_name="rope_ext", storage=storage).trials


@pytest.mark.slow  # heavy: a CLI search; CI runs it after the default suite
def test_per_dimension_two_objective_search_gives_a_pareto_front_of_valid_longrope_configs(tmp_path, run_cli):
    sweep_dir = tmp_path / "longrope"
    result = run_cli(
        "-m",
        "hydra/sweeper=optuna",
        *TINY,
        "data.books=[persuasion]",
        "eval.lengths=[256,512]",
        "model.original_max_position=256",
        "scaling=longrope",
        "objective=[ppl@512,ppl@256]",
        "hydra.sweeper.n_trials=3",
        "logger=wandb",
        "logger.mode=offline",
        f"hydra.sweep.dir={sweep_dir}",
        env=ENV,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((sweep_dir / "search.json").read_text())
    assert (
        summary["directions"] == ["minimize", "minimize"] and summary["sampler"] == "tpe" and summary["complete"] == 3
    )
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
    assert (sweep_dir / "search_pareto.png").stat().st_size > 0  # the trade-off, in the report and W&B
    assert "![search_pareto](search_pareto.png)" in (sweep_dir / "report.md").read_text()
    (run,) = (sweep_dir / "search").glob("wandb/offline-run-*")  # the search's own W&B run in the sweep's group
    assert run.is_dir()


def test_the_search_says_in_the_terminal_when_no_trial_met_the_constraints():
    from evals.search.summary import summary_lines

    closest = {
        "trial": 2,
        "reported": {"ppl@4096": 27.5, "ppl_retention@2048": 0.97},
        "feasible": False,
        "scaling": {"factor": 2.0, "beta_fast": 20.0},
    }
    lines = summary_lines({"best": [], "closest": closest, "constraints": ["ppl_retention@2048>=0.98"], "given": []})
    assert lines == [
        "search: no trial met the constraints (ppl_retention@2048>=0.98); the closest: trial 2, "
        "ppl@4096 = 27.5, ppl_retention@2048 = 0.97 (factor=2, beta_fast=20)"
    ]
    best = {"trial": 1, "reported": {"ppl@4096": 26.1}, "scaling": {"factor": 2.0}}
    given = [{**closest, "trial": 0, "feasible": True}]
    assert summary_lines({"best": [best], "closest": None, "constraints": [], "given": given}) == [
        "search: best: trial 1, ppl@4096 = 26.1 (factor=2)",
        "search: against the given setting, trial 0: ppl@4096 = 27.5, ppl_retention@2048 = 0.97 (factor=2, beta_fast=20)",
    ]


def test_a_search_trial_runs_only_the_references_its_objective_and_constraints_judge(tmp_path, compose):
    from evals.core.config.lengths import length_fields

    def reference_lengths(*extra):
        cfg = compose(*TINY, "data.books=[persuasion]", "eval.lengths=[1024,4096]", "scaling=yarn", *extra)
        job = parse_job(cfg, tmp_path / "job", multirun=True)
        if job.reference is None:
            return None
        return [L for name in length_fields(job.reference.eval.config) for L in job.reference.eval_cfg[name]]

    assert reference_lengths() == [1024, 2048]  # not a search: the verdict's lengths (2048 for the ratio at 4096)
    assert reference_lengths("objective=ppl@4096") is None  # a plain value needs no unscaled run
    assert reference_lengths("objective=ppl@4096", 'constraints=["ppl_retention@1024>=0.9"]') == [1024]
    assert reference_lengths("objective=ppl_ratio@4096") == [2048]


def test_a_search_suite_reference_keeps_only_the_evals_whose_lengths_are_judged(tmp_path, compose):
    cfg = compose(
        *TINY,
        "data.books=[persuasion]",
        "eval=suite",
        "eval.run=[perplexity,passkey]",
        "eval.perplexity.lengths=[1024,4096]",
        "eval.passkey.lengths=[4096]",
        "scaling=yarn",
        "objective=ppl@4096",
        'constraints=["ppl_retention@1024>=0.9"]',
    )
    job = parse_job(cfg, tmp_path / "job", multirun=True)
    assert list(job.reference.eval_cfg.run) == ["perplexity"]  # passkey's reference would have no length left
    assert list(job.reference.eval_cfg.perplexity.lengths) == [1024]


def test_the_published_default_of_a_search_is_the_targets_setting_inside_the_searched_ranges(compose):
    import math

    from evals.core.errors import ConfigError
    from evals.search.default import judged_length, published
    from evals.search.space import Scalar, declared

    yarn = rope_ext.STRATEGIES["yarn"]
    space = declared(yarn, set(), None, 2.0)
    slots = [rope_ext.RotarySlot("model.rotary_emb", "", 16, 10000.0)]
    setting, why = published(yarn, {"name": "yarn"}, space, 256, 512, slots)
    # target=2x sets YaRN up as its paper publishes it: s = target / trained, betas 32 and 1, cos/sin 0.1 ln s + 1
    assert setting == {
        "scaling.factor": 2.0,
        "scaling.beta_fast": 32.0,
        "scaling.beta_slow": 1.0,
        "scaling.attention_factor": pytest.approx(0.1 * math.log(2.0) + 1),
    }
    assert "target / trained = 512 / 256" in why
    # a fixed value stays; a default outside the searched range is not tried, and the line says why
    narrow = [Scalar("scaling.factor", "float", 3.0, 8.0)]
    assert published(yarn, {"name": "yarn", "beta_fast": 16.0}, narrow, 256, 512, slots) == (
        None,
        "its factor=2 lies outside the searched scaling.factor in [3, 8]",
    )
    assert published(yarn, {"name": "yarn"}, space, 256, 128, slots)[0] is None  # below the trained context
    # the one length: the objective's (the longest of several); target= or verdict.target may name it, not another
    base = [*TINY, "data.books=[persuasion]", "eval.lengths=[256,512,1024]", "scaling=yarn"]
    assert judged_length(compose(*base, "target=4x", "objective=ppl@1024"), 256) == (1024, "target=4x")
    assert judged_length(compose(*base, "verdict.target=1024", "objective=[ppl@1024,ppl_retention@256]"), 256) == (
        1024,
        "verdict.target=1024",
    )
    assert judged_length(compose(*base, "objective=[ppl@512,ppl@1024]"), 256) == (1024, "objective=ppl@1024")
    for given, said in (("target=2x", "target=2x (512 tokens)"), ("verdict.target=512", "verdict.target=512")):
        with pytest.raises(ConfigError) as err:
            judged_length(compose(*base, given, "objective=ppl@1024"), 256)
        key = given.split("=")[0]
        assert str(err.value) == (
            f"objective=ppl@1024 and {said} are two lengths; a search optimises and is judged at one: "
            f"objective=ppl@512 with {given}, or no {key} (the search is then judged at 1024)"
        )


def test_the_search_summary_says_whether_the_best_and_the_default_met_the_constraints_and_the_gain():
    from evals.search.summary import comparison_summary, summary_lines

    default = {
        "trial": 0,
        "role": "default",
        "reported": {"ppl@4096": 27.5, "ppl_retention@2048": 0.97},
        "feasible": False,
        "scaling": {"factor": 2.0, "beta_fast": 32.0},
    }
    versus = {"ppl@4096": {"ratio": 0.9, "low": 0.85, "high": 0.95, "n": 4, "method": "t", "maximize": False}}
    best = {
        "trial": 3,
        "reported": {"ppl@4096": 24.8, "ppl_retention@2048": 0.99},
        "feasible": True,
        "scaling": {"factor": 2.5},
        "versus": {"0": versus},
    }
    result = {"best": [best], "closest": None, "constraints": ["ppl_retention@2048>=0.98"], "given": [default]}
    assert summary_lines(result) == [
        "search: best: trial 3, ppl@4096 = 24.8, ppl_retention@2048 = 0.99, meets the constraints (factor=2.5)",
        "search: against the published default, trial 0: ppl@4096 = 27.5, ppl_retention@2048 = 0.97, misses the "
        "constraints (factor=2, beta_fast=32)",
        "search: best (trial 3) against the published default (trial 0): ppl@4096 x0.9 [0.85, 0.95] (95%, t, n=4): "
        "better",
    ]
    assert comparison_summary(result) == {
        "default/ppl@4096": 27.5,
        "default/ppl_retention@2048": 0.97,
        "default/trial": 0,
        "default/feasible": False,
        "best_vs_default/ppl@4096/ratio": 0.9,
        "best_vs_default/ppl@4096/low": 0.85,
        "best_vs_default/ppl@4096/high": 0.95,
    }
    tied = {**versus["ppl@4096"], "low": 0.97, "high": 1.02}
    lines = summary_lines({**result, "best": [{**best, "versus": {"0": {"ppl@4096": tied}}}]})
    assert lines[-1].endswith("x0.9 [0.97, 1.02] (95%, t, n=4): not distinguishable at this sample")


@pytest.mark.slow  # heavy: a CLI search of two trials (about a minute)
def test_a_search_tries_the_published_default_first_and_judges_every_trial_at_its_one_length(tmp_path, run_cli):
    import math

    sweep_dir = tmp_path / "search"
    result = run_cli(
        *SEARCH,
        "model.original_max_position=256",
        "objective=ppl@512",
        'constraints=["ppl_retention@256>=0.5"]',
        "hydra.sweeper.n_trials=2",
        f"hydra.sweep.dir={sweep_dir}",
        env=ENV,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "search: trial 0 is the published default for 512 tokens (factor=2, beta_fast=32, beta_slow=1" in (
        result.stdout
    )
    assert "search: every trial is judged at 512 tokens (objective=ppl@512)" in result.stdout
    study = trials(sweep_dir)
    assert study[0].params == pytest.approx(
        {
            "scaling.factor": 2.0,
            "scaling.beta_fast": 32.0,
            "scaling.beta_slow": 1.0,
            "scaling.attention_factor": 0.1 * math.log(2.0) + 1,
        }
    )
    assert study[1].params["scaling.factor"] != 2.0  # sampled: its own factor, the same verdict length
    targets = {json.loads(p.read_text())["job"]["target_length"] for p in sweep_dir.glob("[01]_*/results.json")}
    assert targets == {512}
    answers = (sweep_dir / "report_answer.txt").read_text().splitlines()
    assert len(answers) == 1 and answers[0].startswith("at 512 (2x) on tinyllama")  # one answer, at one length
    summary = json.loads((sweep_dir / "search.json").read_text())
    best = summary["best"][0]
    assert summary["given"][0]["role"] == "default" and summary["given"][0]["feasible"] is True
    assert f"search: best: trial {best['trial']}, ppl@512 = " in result.stdout
    assert ", meets the constraints (factor=" in result.stdout
    if best["trial"] == 0:
        assert "search: the best is trial 0, the published default itself" in result.stdout
    else:
        compared = best["versus"]["0"]["ppl@512"]
        assert compared["low"] <= compared["ratio"] <= compared["high"]
        line = f"search: best (trial {best['trial']}) against the published default (trial 0): ppl@512 x"
        assert line in result.stdout
        assert line.removeprefix("search: ") in (sweep_dir / "report.md").read_text()


@pytest.mark.slow  # a CLI search of three trials (about 25 s)
def test_a_search_with_a_target_samples_only_factors_that_reach_it(tmp_path, run_cli):
    """target=2x with YaRN's declared factor range 1..16 (log): a quarter of the samples fell below 2 and failed as
    "cannot reach"; the factor's lower bound is target / trained now, said in one line."""
    sweep_dir = tmp_path / "search"
    result = run_cli(
        *SEARCH,
        "model.original_max_position=256",
        "logger=none",
        "objective=ppl@512",
        "target=2x",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.enqueue=[]",
        f"hydra.sweep.dir={sweep_dir}",
        env=ENV,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        "search: target=2x (512 tokens) needs scaling.factor >= 2 (512 / trained 256): the searched factor starts "
        "there, not at 1" in result.stdout
    )
    assert "scaling.factor in [2, 16] (log)" in (sweep_dir / "search.json").read_text()
    study = trials(sweep_dir)
    assert len(study) == 3 and all(t.state == optuna.trial.TrialState.COMPLETE for t in study)
    assert all(t.params["scaling.factor"] >= 2 for t in study)


@pytest.mark.parametrize(
    "scaling, floor",
    [
        (["scaling=yarn"], 2.0),
        (["scaling=pi"], 2.0),
        (["scaling=yarn", "scaling.dynamic=true"], None),  # a dynamic factor does not set its reach
        (["scaling=dynamic_ntk"], None),
    ],
)
def test_the_searched_factor_starts_at_what_the_target_needs_where_the_factor_sets_the_reach(compose, scaling, floor):
    from evals.core.job.target import parse_target
    from evals.search.space import declared, target_floors
    from omegaconf import OmegaConf

    cfg = compose(*TINY, "model.original_max_position=256", "target=2x", *scaling)
    strategy = rope_ext.STRATEGIES[rope_ext.strategies.registry.resolve_name(cfg.scaling.name)]
    scaling_cfg = OmegaConf.to_container(cfg.scaling, resolve=True)
    floors, line = target_floors(strategy, scaling_cfg, set(), 256, parse_target(cfg, 256), "2x")
    space = {s.key: s for s in declared(strategy, set(), lambda: 32, 2.0, floors)}
    high = strategy.params["factor"].search[1]  # the registry's range, its low end raised
    assert (space["scaling.factor"].low, space["scaling.factor"].high) == (floor or 1.0, high)
    assert bool(line) == (floor is not None)
    assert target_floors(strategy, scaling_cfg, {"scaling.factor"}, 256, 512, "2x") == ({}, "")  # fixed or given
    assert target_floors(strategy, scaling_cfg, set(), 256, None) == ({}, "")  # no target
    if floor is not None:  # a target beyond the declared range: one line saying how to search it
        from evals.core.errors import ConfigError

        with pytest.raises(
            ConfigError, match=rf"needs scaling.factor >= 32, beyond its searched range \[1, {high:g}\]"
        ):
            declared(strategy, set(), lambda: 32, 32.0, target_floors(strategy, scaling_cfg, set(), 256, 256 * 32)[0])
