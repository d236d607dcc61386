"""The answer: does a strategy keep the model working at L, judged against the unscaled model on the same tokens
(evals/core/decision/verdict.py), with lengths relative to the trained context and the unscaled reference found or run."""

import json
import os
from pathlib import Path

import pytest

from evals.core.errors import UserError
from evals.core.job.parse import parse_job
from evals.core.registry import Metric
import math
import re

import numpy as np

from evals.core.measure import Measurement
from evals.core.decision.reference import Reference
from evals.core.decision.verdict import DEFAULTS, judge
from tests.tiny import TINY

PPL = {"ppl": Metric("ppl", lower_is_better=True, verdict=True, count="tokens", nll=True).declared("perplexity")}
ACC = {"needle_acc": Metric("needle_acc", verdict=True, count="needle_trials", bounds=(0, 1)).declared("needle")}
LENGTHS = (1024, 2048, 4096, 8192, 16384)
# docs/benchmarks.md, SmolLM2 (trained 8192) on Emma, factor 2
NONE = dict(zip(LENGTHS, (32.8, 28.9, 25.0, 25.7, 53.0)))
YARN = dict(zip(LENGTHS, (33.6, 29.6, 25.6, 26.4, 26.6)))
PI = dict(zip(LENGTHS, (61.1, 55.7, 50.8, 54.0, 54.5)))


def blocks(length: int, ppl: float, documents: int = 6, noise: float = 0.02, seed: int = 0) -> dict:
    """Units of a perplexity at ``length``: 256-token blocks of ``documents`` documents whose mean NLL is log(ppl),
    each block's own difficulty shared by every run (the same tokens) plus a little run noise."""
    shared = np.random.default_rng(7).normal(0, 0.1, (documents, length // 256))
    own = np.random.default_rng(seed).normal(0, noise, shared.shape)
    nll = shared - shared.mean() + own - own.mean() + math.log(ppl)
    return {
        f"doc{d}/{256 * b}": (256 * float(nll[d, b]), 256.0) for d in range(documents) for b in range(length // 256)
    }


def ppl(values: dict, seed: int = 0) -> list[dict]:
    return [
        Measurement("ppl", L, v, 6 * L, "256-token block", blocks(L, v, seed=seed)).record() for L, v in values.items()
    ]


def acc(length: int, correct: list[float], metric: str = "needle_acc") -> dict:
    units = {f"d0.5-t{i}": (float(c), 1.0) for i, c in enumerate(correct)}
    return Measurement(metric, length, sum(correct) / len(correct), len(correct), "prompt", units).record()


def verdict(measurements, reference, declared=PPL, target=16384, **criteria):
    ref = None if reference is None else Reference(records={(r["metric"], r["length"]): r for r in reference})
    return judge(measurements, declared, ref, 8192, target, {**DEFAULTS, **criteria}, "no reference here")


def test_a_strategy_is_judged_against_the_unscaled_model_not_itself():
    """PI x2 is flat at twice the unscaled ppl: it kept 'working' against its own ppl at 8192; it fails here."""
    pi = verdict(ppl(PI, seed=1), ppl(NONE))["summary"]
    assert pi["verdict"] is False and pi["verdict@16384"] is False and pi["verdict@1024"] is False
    assert pi["effective_length"] is None and "not working at 1024" in pi["effective_length_reason"]
    assert pi["ppl_stable_length"] == 16384  # the old, self-referenced quantity, under its honest name
    assert (
        "ppl 54.5 vs 25.7 unscaled @8192: x2.12" in pi["verdict_reason@16384"] and "> 1.1" in pi["verdict_reason@16384"]
    )
    yarn = verdict(ppl(YARN, seed=1), ppl(NONE))["summary"]
    assert yarn["verdict"] is True and yarn["effective_length"] == 16384 and yarn["ppl@target"] == 26.6
    assert yarn["ppl_retention@4096"] == pytest.approx(25.0 / 25.6)
    assert yarn["ppl_ratio@16384"] == pytest.approx(26.6 / 25.7, rel=1e-6)  # exp of the paired mean NLL difference
    assert yarn["ppl_ratio_ci95_low@16384"] < 26.6 / 25.7 < yarn["ppl_ratio_ci95_high@16384"] < 1.1
    none = verdict(ppl(NONE), ppl(NONE))["summary"]
    assert none["verdict@16384"] is False and none["verdict@8192"] is True and none["effective_length"] == 8192
    strict = verdict(ppl(YARN, seed=1), ppl(NONE), tolerance=0.01)["summary"]  # 25.6 vs 25.0 is 2.4% worse at 4096
    assert strict["verdict@4096"] is False and strict["verdict@16384"] is False
    assert "short context: ppl 25.6 vs 25 unscaled @4096" in strict["verdict_reason@16384"]
    # 33.6 vs 32.8 at 1024 (4 blocks a document): the calibrated interval over six documents [1.005, 1.053] holds 1.01
    assert strict["verdict_state@1024"] == "inconclusive" and "more documents" in strict["verdict_reason@1024"]


def test_identical_runs_give_a_ratio_of_exactly_one_and_yes():
    same = verdict(ppl(YARN), ppl(YARN))
    assert all(same["summary"][f"ppl_ratio@{L}"] == 1.0 for L in (1024, 2048, 4096, 8192))
    assert all(same["summary"][f"verdict_state@{L}"] == "yes" for L in (1024, 2048, 4096, 8192))
    row = next(r for r in same["lengths"] if r["length"] == 4096)
    assert (row["checks"][0]["low"], row["checks"][0]["high"]) == (1.0, 1.0)
    thirty = verdict([acc(4096, [1] * 30)], [acc(4096, [1] * 30)], ACC, target=4096)["summary"]
    assert thirty["needle_acc_ratio@4096"] == 1.0 and thirty["verdict_state@4096"] == "yes"
    # 20/20 against 20/20 cannot yet tell "keeps all" from "keeps 85%" (Tang's interval: 24 prompts are needed); a
    # plan that holds in the suite (evals/core/planning.py) asks for more than 20x: said plainly, with the current plan
    twenty = verdict([acc(4096, [1] * 20)], [acc(4096, [1] * 20)], ACC, target=4096)["summary"]
    assert (
        twenty["verdict_state@4096"] == "inconclusive" and "20 prompts cannot decide" in twenty["verdict_reason@4096"]
    )


def test_a_difference_inside_the_noise_is_inconclusive_and_names_the_lever_that_would_decide_it():
    """ppl 8% worse with a noisy, short test: the interval straddles the 10% limit. One document at a fixed length
    has no more blocks to add: more documents would decide it."""
    noisy = [
        Measurement(
            "ppl", 4096, 27.0, 4096, "256-token block", blocks(4096, 27.0, documents=1, noise=0.4, seed=3)
        ).record()
    ]
    base = [
        Measurement(
            "ppl", 4096, 25.0, 4096, "256-token block", blocks(4096, 25.0, documents=1, noise=0.4, seed=4)
        ).record()
    ]
    found = verdict(noisy, base, target=4096)
    check = found["lengths"][0]["checks"][0]
    assert found["summary"]["verdict_state@4096"] == "inconclusive" and found["summary"]["verdict@4096"] is None
    assert check["low"] < 1.1 < check["high"] and check["more_units"] is None
    assert (
        "one document cannot decide it at this length; more documents would" in found["summary"]["verdict_reason@4096"]
    )
    several = verdict(ppl({4096: 27.0}, seed=3), ppl({4096: 25.0}), target=4096, tolerance=0.07)
    check = several["lengths"][0]["checks"][0]
    assert check["low"] < 1.07 < check["high"] and check["more_units"] >= 1
    assert (
        f"about {check['more_units']} more documents would likely decide it"
        in several["summary"]["verdict_reason@4096"]
    )

    assert found["summary"]["effective_length"] is None


@pytest.mark.parametrize("prompts", [1, 2, 3])
@pytest.mark.parametrize("retained", [0.5, 0.85, 0.99])
def test_an_accuracy_on_one_to_three_prompts_is_never_yes_or_no(prompts, retained):
    for own, ref in (([1] * prompts, [1] * prompts), ([0] * prompts, [1] * prompts), ([1] * prompts, [0.5] * prompts)):
        found = verdict([acc(4096, own)], [acc(4096, ref)], ACC, target=4096, retained=retained)["summary"]
        assert found["verdict_state@4096"] == "inconclusive", (own, ref, found["verdict_reason@4096"])


def test_accuracies_are_judged_by_the_share_they_keep_with_enough_prompts():
    reference = [acc(4096, [1] * 30), acc(8192, [1] * 27 + [0] * 3)]
    kept = verdict([acc(4096, [1] * 30), acc(8192, [1] * 29 + [0]), acc(16384, [1] * 28 + [0] * 2)], reference, ACC)
    assert kept["summary"]["verdict@16384"] is True, kept["summary"]["verdict_reason@16384"]
    lost = verdict([acc(4096, [1] * 30), acc(8192, [1] * 29 + [0]), acc(16384, [0] * 26 + [1] * 4)], reference, ACC)
    assert (
        lost["summary"]["verdict@16384"] is False
        and "needle_acc 0.1333 vs 0.9 unscaled @8192" in lost["summary"]["verdict_reason@16384"]
    )
    assert (
        verdict(
            [acc(4096, [1] * 30), acc(8192, [1] * 30), acc(16384, [0] * 26 + [1] * 4)], reference, ACC, retained=0.01
        )["summary"]["verdict@16384"]
        is not False
    )
    zero = verdict([acc(8192, [0] * 10), acc(16384, [0] * 10)], [acc(8192, [0] * 10)], ACC)["summary"]
    assert zero["verdict@16384"] is None and "scores 0 on needle_acc" in zero["verdict_reason@16384"]


def test_no_reference_or_another_test_is_no_answer_with_its_reason():
    found = verdict(ppl(YARN), None)["summary"]
    assert found["verdict"] is None and found["verdict_reason@16384"] == "no reference here"
    assert not any("_retention@" in k for k in found)
    other = [
        Measurement(
            "ppl", 1024, 33.6, 1023, "256-token block", {"elsewhere/0": (100.0, 30.0), "elsewhere/256": (90.0, 30.0)}
        ).record()
    ]
    found = verdict(other + ppl({L: YARN[L] for L in LENGTHS[1:]}), ppl(NONE))["summary"]
    assert found["verdict@1024"] is None and "rests on other 256-token blocks here" in found["verdict_reason@1024"]
    assert found["verdict@16384"] is None  # the short context could not be checked at 1024
    short_only = verdict(ppl({16384: 26.6}), ppl(NONE))["summary"]
    assert short_only["verdict@16384"] is None and "short context not measured" in short_only["verdict_reason@16384"]
    untargeted = verdict(ppl(YARN), ppl(NONE), target=32768)["summary"]
    assert untargeted["verdict"] is None and "32768 was not evaluated" in untargeted["verdict_reason"]


def read(path: Path) -> dict:
    return json.loads(Path(path).read_text())


BOOKS = ["data.books=[persuasion]", "eval.lengths=[256,512,1x,2x]"]  # the tiny model is trained at 2048


def test_relative_lengths_are_resolved_per_model_and_name_the_same_job(tmp_path, compose):
    relative = parse_job(compose(*TINY, *BOOKS, "scaling=yarn", "scaling.factor=4"), tmp_path)
    absolute = parse_job(
        compose(
            *TINY,
            "data.books=[persuasion]",
            "eval.lengths=[256,512,2048,4096,2048]",
            "scaling=yarn",
            "scaling.factor=4",
        ),
        tmp_path,
    )
    assert list(relative.eval_cfg.lengths) == [256, 512, 2048, 4096] and relative.key == absolute.key
    assert relative.target == 8192  # trained x factor
    other = parse_job(compose(*TINY, *BOOKS, "model.original_max_position=1024", "verdict.target=3x"), tmp_path)
    assert list(other.eval_cfg.lengths) == [256, 512, 1024, 2048] and other.target == 3072
    suite = parse_job(
        compose(*TINY, "eval=suite", "eval.perplexity.lengths=[0.5x]", "eval.needle.lengths=[1x]"), tmp_path
    )
    assert list(suite.eval_cfg.perplexity.lengths) == [1024] and list(suite.eval_cfg.needle.lengths) == [2048]
    for bad, message in (
        ("eval.lengths=[2y]", "eval.lengths='2y' is not a length"),
        ("verdict.target=far", "verdict.target='far' is not a length"),
        ("verdict.target=0x", "verdict.target=0x is 0 tokens: a target is a positive length"),
        ("verdict.target=-4096", "verdict.target=-4096 is -4096 tokens"),
    ):
        with pytest.raises(UserError, match=message):
            parse_job(compose(*TINY, bad), tmp_path)


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_a_scaled_job_runs_its_unscaled_reference_first_and_answers(tmp_path, capsys, run_job):
    summary, results = run_job(tmp_path / "yarn", *BOOKS, "scaling=yarn", "scaling.factor=2", "verdict.baseline=true")
    (path,) = (tmp_path / "yarn" / "baseline").glob("*/results.json")  # baseline/<its key>
    base = read(path)
    assert base["status"] == "done" and base["job"]["scaling"] == "none" and base["job"]["role"] == "reference"
    assert base["config"]["eval"]["lengths"] == [256, 512, 2048]  # up to the trained context, which is included
    assert base["config"]["eval"]["min_document_tokens"] == 4096  # the job's documents: the same tokens
    assert base["job"]["compare"] == results["job"]["compare"]
    assert summary["target_length"] == 4096 and summary["verdict_state"] in ("yes", "NO", "inconclusive")
    assert set(k for k in summary if k.startswith("verdict@")) == {
        "verdict@256",
        "verdict@512",
        "verdict@2048",
        "verdict@4096",
    }
    assert summary["ppl_retention@512"] == pytest.approx(base["summary"]["ppl@512"] / summary["ppl@512"])
    assert results["verdict"]["reference"]["sources"] == [str(path.parent)]
    assert (
        results["declared"]["ppl"]["lower_is_better"] and results["summary"]["verdict@4096"] == summary["verdict@4096"]
    )
    out = capsys.readouterr().out
    assert "verdict: does yarn-factor2 on tinyllama[random] keep working?" in out and "<- target" in out
    assert (tmp_path / "yarn" / "ppl_by_length.png").is_file() and (tmp_path / "yarn" / "ppl_by_length.svg").is_file()

    # another strategy that may resume from the first run finds the same reference instead of computing it
    summary, results = run_job(
        tmp_path / "ntk", *BOOKS, "scaling=ntk", f"resume_from=[{tmp_path / 'yarn'}]", "verdict.baseline=true"
    )
    assert not (tmp_path / "ntk" / "baseline").exists()
    assert results["verdict"]["reference"]["sources"] == [str(path.parent)]

    # the unscaled job is its own reference: nothing more runs, and it fails beyond its trained context or not
    summary, results = run_job(tmp_path / "none", *BOOKS)
    assert not (tmp_path / "none" / "baseline").exists() and results["verdict"]["reference"]["sources"] == ["itself"]


def test_without_a_reference_the_answer_is_missing_and_says_why(tmp_path, capsys, run_job):
    summary, results = run_job(tmp_path / "yarn", *BOOKS, "scaling=yarn", "verdict.baseline=false", "resume_from=[]")
    assert not (tmp_path / "yarn" / "baseline").exists()
    assert summary["verdict"] is None and "verdict.baseline=false" in summary["verdict_reason"]
    assert "no answer: no unscaled run on the same tokens" in capsys.readouterr().out


def test_the_reference_scores_the_same_tokens_and_drops_what_cannot_exist_below_the_trained_context(tmp_path, compose):
    common = [
        *TINY,
        "scaling=yarn",
        "data.books=[persuasion]",
        "eval.lengths=[256,512,4096]",
        "eval.protocol=sliding",
        "eval.longppl=true",
    ]
    job = parse_job(compose(*common, "eval.key_tokens.short_context=64", "eval.key_tokens.stride=16"), tmp_path)
    base = job.reference
    assert base.scaling.name == "none" and list(base.eval_cfg.lengths) == [256, 512, 2048]
    assert base.eval_cfg.max_tokens == 4096  # sliding: the job's tokens, not only the first 2048
    assert base.eval_cfg.longppl and base.out_dir == tmp_path / "baseline" / base.key[:12]
    assert base.compare == job.compare  # the same test, eval by eval
    # key tokens need more than short_context + stride tokens: none within 2048, so the reference has no LongPPL
    job = parse_job(compose(*common, "eval.key_tokens.short_context=2048", "eval.key_tokens.stride=1024"), tmp_path)
    assert job.eval_cfg.longppl and not job.reference.eval_cfg.longppl and job.reference.compare == job.compare
    # another protocol, another document count: another comparison key
    other = parse_job(
        compose(*TINY, "scaling=yarn", "data.books=[persuasion]", "eval.lengths=[256,512,4096]", "eval.documents=2"),
        tmp_path,
    )
    assert other.compare != job.compare


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_a_sweep_with_the_unscaled_model_uses_it_as_the_reference_and_prints_the_verdict_table(tmp_path, run_cli):
    sweep_dir = tmp_path / "sweep"
    result = run_cli(
        "-m",
        *TINY,
        *BOOKS,
        "scaling=none,yarn,linear",
        "scaling.factor=2",
        f"hydra.sweep.dir={sweep_dir}",
        "resume_from=[]",
        timeout=600,
        env={**os.environ, "TQDM_DISABLE": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert not (sweep_dir / "baseline").exists()  # the sweep's own unscaled job is the reference
    jobs = {read(p)["job"]["scaling"]: read(p) for p in sweep_dir.glob("*/results.json")}
    none_dir = next(p.parent for p in sweep_dir.glob("*/results.json") if read(p)["job"]["scaling"] == "none")
    assert jobs["yarn-factor2"]["verdict"]["reference"]["sources"] == [str(none_dir)]
    table = result.stdout.split("verdict: tinyllama[random], perplexity on books", 1)[1]
    head = next(line for line in table.splitlines() if line.startswith("| strategy"))
    assert [c.strip() for c in head.strip("|").split("|")] == [
        "strategy",
        "target",
        "256 (0.125x)",
        "512 (0.25x)",
        "2048 (1x)",
        "4096 (2x)",
        "effective length",
    ]
    assert "| yarn-factor2   | 4096   |" in table and "| linear-factor2 | 4096   |" in table
    verdicts = (sweep_dir / "report_verdict.csv").read_text().splitlines()
    assert verdicts[0].startswith("model,data,eval,strategy,trained,target,verdict@256") and len(verdicts) == 4


def test_a_verdict_metric_the_eval_never_measures_fails_the_job_and_an_undeclared_one_is_refused(tmp_path, compose):
    """A key typo (``ppl@265`` returned, nothing measured) used to run to the end without a verdict."""
    from dataclasses import replace

    from evals.core.errors import EvalDefect
    from evals.core.inputs.model_cache import ModelCache
    from evals.core.run.runner import execute

    def typo(cfg, ctx):
        ctx.model()
        return {"ppl@265": 3.0}

    def undeclared(cfg, ctx):
        ctx.output.measure(Measurement("pplx", 256, 3.0))
        return {}

    cfg = compose(*TINY, *BOOKS, "verdict.baseline=false", "resume_from=[]")
    for name, run, message in (
        ("typo", typo, "declares ppl for the verdict but reported no measurement of it"),
        ("undeclared", undeclared, r"pplx is not among the metrics this job declares \(ppl\)"),
    ):
        job = parse_job(cfg, tmp_path / name)
        with pytest.raises(EvalDefect, match=message):
            execute(replace(job, eval=replace(job.eval, run=run)), ModelCache())
        results = read(tmp_path / name / "results.json")
        assert results["status"] == "failed" and "traceback" not in results["error"]
        assert results["error"]["message"].count("\n") == 0 and re.search(message, results["error"]["message"])


def test_the_reference_runs_only_the_lengths_the_verdict_compares_with(tmp_path, compose):
    """All lengths within the trained context: no reference at the trained context itself (it cost a forward, and
    with a sliding window it broke the user's own settings: "eval.max_tokens=256 is below the longest length")."""
    sliding = [*TINY, "scaling=yarn", "data.books=[persuasion]", "eval.protocol=sliding", "eval.stride=128"]
    job = parse_job(compose(*sliding, "eval.lengths=[256]"), tmp_path)
    assert list(job.reference.eval_cfg.lengths) == [256] and job.reference.eval_cfg.max_tokens == 256
    job = parse_job(compose(*sliding, "eval.lengths=[256,4096]"), tmp_path)
    assert list(job.reference.eval_cfg.lengths) == [256, 2048] and job.reference.eval_cfg.max_tokens == 4096
    for attention in ("scaling=self_extend", "scaling=dca"):
        job = parse_job(
            compose(*sliding[:-3], attention, "eval.protocol=sliding", "eval.stride=128", "eval.lengths=[256]"),
            tmp_path,
        )
        assert list(job.reference.eval_cfg.lengths) == [256]


def test_plausible_but_wrong_settings_are_said_in_one_line_before_the_model_loads(tmp_path, compose, capsys):
    """The tiny model is trained at 2048; 8192 is evaluated (4x)."""
    common = [*TINY, "data.books=[persuasion]", "eval.lengths=[1024,8192]", "verdict.target=8192"]
    cases = {
        "scaling=yarn scaling.factor=1.2": "covers 2458 tokens (2048 x factor 1.2), not 8192: positions beyond "
        "are extrapolated; scaling.factor=4 covers it",
        "scaling=self_extend scaling.group_size=2 scaling.window=256": "sees relative positions up to 4223, beyond "
        "the 2048 the model covers",
        "scaling=dca scaling.chunk_size=4096 scaling.local_window=128": "beyond the 2048 the model covers (trained "
        "2048); choose its parameters for this length "
        "(target=8192 sets them",
    }
    for overrides, message in cases.items():
        capsys.readouterr()
        parse_job(compose(*common, *overrides.split()), tmp_path)
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    for fine in (
        "scaling=yarn scaling.factor=4",
        "scaling=self_extend scaling.group_size=8 scaling.window=256",
        "scaling=dynamic_ntk",
        "scaling=dca",
    ):
        parse_job(compose(*common, *fine.split()), tmp_path)
        assert "warning" not in capsys.readouterr().err, fine


def test_the_reference_row_says_reference_and_other_documents_are_compared_on_the_shared_ones_only():
    from evals.core.decision.reference import own_reference
    from evals.core.decision.verdict_text import format_job

    found = judge(ppl(NONE), PPL, own_reference(ppl(NONE)), 8192, 16384, dict(DEFAULTS))
    assert found["summary"]["verdict_state@8192"] == "yes"  # read by the ranking and the report: unchanged
    assert found["summary"]["verdict_reason@8192"] == "ppl 25.7: the reference itself"
    lines = format_job("none on smollm2", found)
    row = next(line for line in lines if line.lstrip().startswith("8192"))
    assert "reference" in row and "x1 [1, 1]" not in row and "[1, 1]" not in "\n".join(lines)

    def docs(d_range, value, length=4096, seed=0):
        units = {k: v for k, v in blocks(length, value, documents=9, seed=seed).items() if int(k[3]) in d_range}
        return [Measurement("ppl", length, value, 256 * len(units), "256-token block", units).record()]

    some = verdict(docs(range(6), 26.0, length=16384, seed=1), docs(range(3, 9), 25.0, length=8192), target=16384)
    check = some["lengths"][0]["checks"][0]
    assert "(on the 3 document(s) both hold)" in check["why"] and check["n"] == 3
    none = verdict(docs(range(3), 26.0, length=16384), docs(range(3, 9), 25.0, length=8192), target=16384)
    assert "no document (or unit) in common" in none["lengths"][0]["checks"][0]["why"]
    assert none["summary"]["verdict_state@16384"] == "?"


def test_too_few_units_are_never_decided_and_prompt_level_nll_is_labelled_by_its_prompts():
    two = [Measurement("ppl", 512, 25.0, 512, "256-token block", blocks(512, 25.0, documents=1)).record()]
    worse = [Measurement("ppl", 512, 40.0, 512, "256-token block", blocks(512, 40.0, documents=1, seed=1)).record()]
    found = verdict(worse, two, target=512)["summary"]  # 2 blocks, 1.6x worse: was decided on 512 tokens
    assert found["verdict_state@512"] == "inconclusive"
    assert "on 2 blocks of one document: at least 8 are needed to decide" in found["verdict_reason@512"]
    nll = {"passkey_nll": Metric("passkey_nll", lower_is_better=True, verdict=True, nll=True).declared("passkey")}
    rng = np.random.default_rng(0)
    units = {f"d{d / 10:g}-t{t}": (float(rng.normal(2, 0.5)), 1.0) for d in range(10) for t in range(2)}
    other = {k: (s + 0.01, w) for k, (s, w) in units.items()}
    own = Measurement("passkey_nll", 8192, 2.0, 20, "prompt", other).record()
    ref = Measurement("passkey_nll", 8192, 2.0, 20, "prompt", units).record()
    check = verdict([own], [ref], nll, target=8192)["lengths"][0]["checks"][0]
    assert check["method"].startswith("Hall-corrected t over paired prompts") and check["n"] == 20


def test_a_length_nobody_could_judge_is_inconclusive_never_not_working():
    """One 256-token block beyond the trained context has no interval: the effective length said ``none (not working
    at 16384: ... [no interval])`` -- a failure for what is undecided. One vocabulary: yes / NO / inconclusive / not
    judged, and "not working" for NO only."""
    from evals.core.decision.verdict_text import format_job

    def block(length, ppl):
        return Measurement(
            "ppl", length, ppl, 256, "256-token block", {"doc0/0": (256 * math.log(ppl), 256.0)}
        ).record()

    scaled = [block(4096, 25.2), block(16384, 26.0)]
    found = verdict(scaled, [block(4096, 25.0), block(8192, 25.0)])
    summary = found["summary"]
    assert summary["verdict_state@4096"] == "inconclusive" and "no interval" in summary["verdict_reason@4096"]
    assert summary["effective_length"] is None and summary["effective_length_reason"].startswith("inconclusive at 4096")
    printed = "\n".join(format_job("yarn on tiny", found))
    assert "not working" not in printed and "effective length: none (inconclusive at 4096" in printed
    nothing = verdict(scaled, None)  # no reference: not judged, with its reason
    assert nothing["summary"]["effective_length_reason"].startswith("not judged at 4096: no reference here")
    rows = format_job("yarn on tiny", nothing)[1:]  # the head asks "keep working?"
    assert all("not judged" in row and "?" not in row for row in rows if "4096" in row), rows
    failing = verdict(ppl(PI, seed=1), ppl(NONE))["summary"]
    assert failing["effective_length_reason"].startswith("not working at 1024")  # NO is still "not working"
