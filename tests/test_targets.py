"""A target length instead of parameters (rope_ext.strategies.targets): every strategy that declares how its parameters follow
from the target reaches it; explicit values win; what cannot reach says so in one line, before any model loads."""

import json

import pytest

import rope_ext
from rope_ext.strategies.registry import STRATEGIES
from rope_ext.strategies.targets import derives, for_target, set_up, shortfalls
from tests.tiny import TINY_ARCHITECTURE, tinyllama

TARGETED = sorted(name for name, s in STRATEGIES.items() if s.targets)


def config_for(name):
    config = {"name": name}
    if name == "longrope":
        config.update(short_factor=[1.0] * 32, long_factor=[2.0] * 32)
    return config


def test_every_extension_method_declares_how_it_follows_the_target():
    assert set(TARGETED) == {
        "linear",
        "ntk",
        "dynamic_ntk",
        "yarn",
        "ntk_by_parts",
        "llama3",
        "longrope",
        "self_extend",
        "dca",
        "rerope",
        "leaky_rerope",
        "string",
        "lm_infinite",
    }


@pytest.mark.parametrize("name", TARGETED)
@pytest.mark.parametrize("trained,multiple", [(2048, 1.5), (4096, 2), (8192, 2), (8192, 4), (4096, 8)])
def test_a_derived_setting_reaches_its_target(name, trained, multiple):
    target = int(trained * multiple)
    if name == "string" and target > 2 * trained - 128:
        with pytest.raises(rope_ext.ScalingError, match=r"cannot reach .* only up to \d+ tokens \(2L - W\)"):
            set_up(config_for(name), trained, target)
        return
    scaling, derived = set_up(config_for(name), trained, target)
    assert derived.why and set(derived.why) == set(derives(name))
    assert shortfalls(scaling, trained, target) == []
    # the model's own setting with the registry's defaults does not necessarily reach: the target is what changes it
    if "factor" in derived.why:
        assert scaling.params["factor"] == pytest.approx(multiple)


def test_the_registry_defaults_do_not_reach_4x_but_the_target_does():
    # a user who only picks the strategy (factor 2, G 8 / W 1024 ...) at 4x would extrapolate
    for name in ("yarn", "linear", "ntk_by_parts"):
        assert shortfalls(rope_ext.resolve({"name": name}, 8192), 8192, 32768)
    scaling, _ = set_up({"name": "yarn"}, 8192, 32768)
    assert scaling.params["factor"] == 4.0 and not shortfalls(scaling, 8192, 32768)


def test_self_extend_follows_the_longlm_rule():
    # (1/2 to 2/3) L > W + (N - W) / G: docs/benchmarks.md's hand-derived G = 4, W = 1024 for 16k on an 8k model
    scaling, derived = set_up({"name": "self_extend"}, 8192, 16384)
    assert (scaling.params["group_size"], scaling.params["window"]) == (4, 1024)
    assert scaling.params["window"] + (16384 - 1024) / 4 <= 2 * 8192 / 3
    assert (set_up({"name": "self_extend"}, 8192, 32768)[0].params["group_size"]) == 8
    assert "W + (N - W) / G <= 2L/3" in derived.why["group_size"][1]


def test_an_explicit_value_wins_and_the_rest_follow_it():
    derived = for_target({"name": "self_extend", "window": 512}, 8192, 32768)
    assert "window" not in derived.why and derived.config["window"] == 512
    assert derived.config["group_size"] == 7  # 512 + 32256 / 7 <= 5461.3
    assert for_target({"name": "yarn", "factor": 3.0}, 8192, 32768).config["factor"] == 3.0


def test_an_explicit_value_that_cannot_reach_the_target_is_one_line_naming_it():
    with pytest.raises(rope_ext.ScalingError) as err:
        set_up({"name": "yarn", "factor": 2.0}, 8192, 32768)
    message = str(err.value)
    assert "\n" not in message and "covers 16384 tokens" in message and "given: factor" in message
    with pytest.raises(rope_ext.ScalingError, match="window=6000 leaves no group size"):
        set_up({"name": "self_extend", "window": 6000}, 8192, 32768)
    with pytest.raises(rope_ext.ScalingError, match="dca-chunk_size12000.*beyond the 8192.*given: chunk_size"):
        set_up({"name": "dca", "chunk_size": 12000}, 8192, 32768)


def test_a_target_below_the_trained_context_is_refused_for_strategies_that_only_extend():
    with pytest.raises(
        rope_ext.ScalingError, match="target=4096 is below the trained context 8192: 'yarn' only extends"
    ):
        for_target({"name": "yarn"}, 8192, 4096)
    assert for_target({"name": "none"}, 8192, 4096).why == {}  # the unscaled model names the question only


def test_string_reaches_up_to_2l_minus_its_local_window():
    scaling, derived = set_up({"name": "string"}, 8192, 12000)  # the reference's int(0.33 L) would not reach
    assert scaling.params["offset"] == 12000 - 8192 + 128 and not shortfalls(scaling, 8192, 12000)
    default, _ = set_up({"name": "string"}, 8192, 9000)
    assert default.params["offset"] == int(0.33 * 8192)  # the reference's offset where it reaches
    assert set_up({"name": "string", "local_window": 0}, 8192, 16384)[0].params["offset"] == 8192


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_a_run_with_a_target_records_its_derivation_and_answers_for_the_target(run_cli, tmp_path):
    out = tmp_path / "out"
    result = run_cli(
        *tinyllama(TINY_ARCHITECTURE, original_max_position=256),
        "scaling=yarn",
        "target=2x",
        "eval.lengths=[64,target]",
        "eval.documents=1",
        "data.books=[persuasion]",
        f"output_dir={out}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "target: 512 tokens (2x" in result.stdout and "scaling.factor=2" in result.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["job"]["target_length"] == 512 and results["config"]["scaling"]["factor"] == 2.0
    assert results["config"]["scaling"]["derived"]["factor"] == "target / trained = 512 / 256"
    assert results["config"]["eval"]["lengths"] == [64, 512]
    assert "verdict_state@512" in results["summary"]  # the verdict answers for the target


@pytest.mark.parametrize(
    "args,message",
    [
        (["target=abc"], "target='abc' is not a length"),
        (["target=0x"], "target=0x is not a positive length"),
        (["target=-4096"], "target=-4096 is not a positive length"),
        (["scaling=yarn", "target=4096"], "target=4096 is below the trained context 8192: 'yarn' only extends"),
        (["scaling=string", "target=2x"], "scaling 'string' cannot reach 16384 tokens"),
        (["target=2x", "verdict.target=4x"], "target=2x (16384 tokens) and verdict.target=4x disagree"),
        (["eval.lengths=[1x,target]"], "eval.lengths has 'target', but no target= is set"),
        # a bad setting is a bad setting, not "cannot reach" (which a sweep records as an answer)
        (["scaling=longrope", "target=2x"], "scaling 'longrope' needs short_factor, long_factor"),
    ],
)
@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_a_bad_target_is_one_line_and_exit_2_before_the_model_loads(args, message, run_cli):
    result = run_cli(*args, "logger=none")
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "Converting and de-quantizing" not in result.stderr


def test_a_compare_sweep_without_target_is_one_line_before_any_job(run_cli, tmp_path):
    result = run_cli("-m", "experiment=compare", "logger=none", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: this sweep's eval lengths include 'target' but no target= "
        "is given: add one, e.g. python run.py -m experiment=compare target=2x"
    )
    assert not (tmp_path / "sweep").exists()


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_a_compare_sweep_lists_a_method_that_cannot_reach_the_target_in_its_answer(run_cli, tmp_path):
    sweep = tmp_path / "sweep"
    result = run_cli(
        "-m",
        "experiment=compare",
        "target=2x",
        "logger=none",
        "hydra.sweeper.params.scaling=string",
        f"hydra.sweep.dir={sweep}",
    )
    assert result.returncode == 0, result.stderr[-3000:]  # an answer, not a failed job
    assert (
        "budget: 1 job (+ the unscaled reference once), each: perplexity 6 forwards at 16384; passkey 115 forwards "
        "at 16384; at most 242 forwards in all" in result.stdout  # the preset's units: tests/test_power.py
    )
    assert "unreachable: scaling 'string' cannot reach 16384 tokens" in result.stderr
    assert (sweep / "report_answer.txt").read_text() == (
        "at 16384 (2x) on smollm2: no strategy is yes on every metric; string cannot reach 16384\n"
    )
    assert "Not finished" not in (sweep / "report.md").read_text()


@pytest.mark.slow  # 13 jobs and a reference on a tiny model (~1.5 min on 2 cores)
def test_one_command_compares_every_method_at_the_target_and_ends_in_the_ranked_answer(run_cli, tmp_path):
    import csv

    sweep = tmp_path / "compare"
    result = run_cli(
        "-m",
        "experiment=compare",
        "target=2x",
        *tinyllama(TINY_ARCHITECTURE, original_max_position=512),
        "eval.passkey.trials=1",
        f"hydra.sweep.dir={sweep}",
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        "budget: 13 jobs, each: perplexity 6 forwards at 1024; passkey 5 forwards at 1024; at most 143 forwards in "
        "all" in result.stdout  # the unscaled job, launched first, is the others' reference: none runs besides
    )
    assert "sweep: job 13/13 finished" in result.stdout
    ranked = {row["strategy"]: row for row in csv.DictReader((sweep / "report_ranking.csv").open())}
    # every method at its derived setting, named by the values it used
    for label in (
        "linear-factor2",
        "yarn-factor2",
        "dynamic_ntk-factor2",
        "llama3-factor2",
        "self_extend-group_size4-window64",
        "dca-chunk_size384-local_window32",
        "rerope-window64",
        "leaky_rerope-window64-leak2.15",
        "lm_infinite-local_span512",
        "none",
    ):
        assert label in ranked, sorted(ranked)
    assert ranked["string"]["answer"] == "cannot reach" and "2L - W" in ranked["string"]["note"]
    assert (sweep / "report_answer.txt").read_text().startswith("at 1024 (2x) on tinyllama[random]: ")
    assert (
        json.loads((sweep / "4_tinyllama_yarn_to2x" / "deploy" / "transformers.json").read_text())["rope_parameters"][
            "factor"
        ]
        == 2.0
    )


def test_a_fractional_target_passes_the_syntax_check_and_a_sweep_preflight_leaves_hydras_sweeps_alone(compose):
    from evals.cli import _sweep_preflight
    from evals.core.job.target import parse_target

    assert parse_target(compose("target=0.5x")) is None  # the syntax only: 0.5x is a length (4096 on SmolLM2)
    assert parse_target(compose("target=0.5x"), 8192) == 4096
    # Hydra's own sweep syntax composes (the first value) and counts as Hydra expands it
    assert _sweep_preflight(["-m", "scaling=yarn", "scaling.factor=range(2,5)", "target=2x"])[0].startswith(
        "budget: 3 jobs (+ the unscaled reference once)"
    )
    assert _sweep_preflight(["-m", "scaling=yarn", "scaling.factor=choice(2,4)", "target=2x"])[0].startswith(
        "budget: 2 jobs"
    )
    assert _sweep_preflight(["-m", "scaling=glob(yarn*)", "target=2x"]) == []  # not composable alone: Hydra's
    assert _sweep_preflight(["-m", "scaling=yarn", "scaling.factor=range(2,5)"]) == []  # no target: not ours


@pytest.mark.parametrize("override", ["target=3y", "verdict.target=far"])
def test_a_malformed_target_before_the_model_is_read_names_no_made_up_trained_context(run_cli, override):
    """The syntax is checked before the model's config is read; the line said "(1048576)", a placeholder, as if it
    were the model's trained context."""
    result = run_cli(*tinyllama(TINY_ARCHITECTURE), override)
    key, value = override.split("=")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {key}='{value}' is not a length: give tokens (4096) or a multiple of the trained context, e.g. 2x"
    ]
