"""LongPPL (eval.longppl): against the reference package ``longppl`` (PyPI, Fang et al. 2025) as an oracle, key
spans cached and reused, the sliding protocol, and bad input refused before the model loads."""

import json
import random
import subprocess

import pytest
import torch

from evals.tasks.perplexity import key_tokens
from evals.core.inputs.loading import bundled_tokenizer, random_model
from evals.core.inputs.models import resolve_model
from tests.tiny import TINY

longppl = pytest.importorskip("longppl.longppl")  # the dev extra; only ever a test oracle

SHARP = "+model.architecture.initializer_range=0.2"  # random weights with a wide spread of losses: some are key
SHORT, STRIDE, ALPHA, BETA = 48, 16, 0.5, -13.0  # thresholds for a random model (its losses are ~9-15 nats)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    """(path, text, tokens): a text of ~500 SmolLM2 tokens whose later paragraphs repeat earlier ones."""
    rng = random.Random(0)
    words = (
        "the a of and to in that was her it his she he had for with not be as you at by on could would "
        "Emma Harriet Knightley Elton Weston said very much"
    ).split()
    paras = [" ".join(rng.choice(words) for _ in range(rng.randint(8, 30))).capitalize() + "." for _ in range(15)]
    text = "\n".join(paras + paras[:6])
    path = tmp_path_factory.mktemp("longppl") / "doc.txt"
    path.write_text(text)
    return path, text, len(bundled_tokenizer()(text)["input_ids"])


def overrides(text_file, *extra, short=SHORT, stride=STRIDE):
    path, _, n = text_file
    return [
        "data=text_files",
        f"data.glob={path}",
        f"eval.lengths=[{SHORT * 2},{n}]",
        "eval=perplexity",
        SHARP,
        "eval.longppl=true",
        f"eval.key_tokens.short_context={short}",
        f"eval.key_tokens.stride={stride}",
        f"eval.key_tokens.alpha={ALPHA}",
        f"eval.key_tokens.beta={BETA}",
        *extra,
    ]


@pytest.fixture
def oracle(compose, tmp_path):
    """``oracle(text, short=SHORT, stride=STRIDE)``: (its result, its key spans) from the reference package on the
    same model (evaluator = itself, as the run's unscaled model)."""

    def oracle(text, short=SHORT, stride=STRIDE):
        model = random_model(resolve_model(compose(*TINY, SHARP).model, False, False), torch.float32).eval()
        tokenizer = bundled_tokenizer()
        save = tmp_path / "oracle_keys.txt"
        result = longppl.compute_longppl(
            text,
            model,
            model,
            tokenizer,
            tokenizer,
            save_path=str(save),
            trunc_len=short,
            sliding_window=stride,
            alpha=ALPHA,
            beta=BETA,
        )
        return result, [list(map(int, s)) for s in longppl.load_key_token(str(save))]

    return oracle


def cached_spans(results) -> list:
    docs = results["metrics"]["perplexity"]["longppl"]["documents"]
    return json.loads(open(docs[0]["cache"]).read())["spans"]


@pytest.mark.parametrize("stride", [STRIDE, SHORT // 2])
def test_longppl_equals_the_reference_package(text_file, tmp_path, monkeypatch, stride, run_job, oracle):
    monkeypatch.setenv("ROPE_EXT_CACHE", str(tmp_path / "cache"))
    _, text, n = text_file
    summary, results = run_job(tmp_path / "run", *overrides(text_file, stride=stride))
    expected, spans = oracle(text, stride=stride)
    assert 20 < expected["n_key_token"] < n // 2  # the thresholds pick some tokens, not all
    assert summary[f"key_tokens@{n}"] == expected["n_key_token"]
    assert summary[f"longppl@{n}"] == pytest.approx(float(expected["longppl"]), rel=1e-4)
    assert summary[f"ppl@{n}"] == pytest.approx(float(expected["ppl"]), rel=1e-4)
    assert cached_spans(results) == spans
    rows = {r["length"]: r for r in results["metrics"]["perplexity"]["by_length"]}
    assert rows[n]["longppl"] == summary[f"longppl@{n}"] and rows[n]["key_tokens"] == expected["n_key_token"]
    assert rows[SHORT * 2]["key_tokens"] < rows[n]["key_tokens"]  # a prefix holds fewer of them
    assert (tmp_path / "run" / "longppl_by_length.png").stat().st_size > 0


def test_key_spans_are_cached_and_reused_across_strategies(text_file, tmp_path, monkeypatch, run_job):
    monkeypatch.setenv("ROPE_EXT_CACHE", str(tmp_path / "cache"))
    _, first = run_job(tmp_path / "none", *overrides(text_file))
    doc = first["metrics"]["perplexity"]["longppl"]
    assert doc["documents"][0]["source"] == "shared" and doc["evaluator_forwards"] > 0  # only the short windows
    summary, second = run_job(tmp_path / "yarn", *overrides(text_file, "scaling=yarn", "scaling.factor=2.0"))
    doc2 = second["metrics"]["perplexity"]["longppl"]
    assert doc2["documents"][0]["source"] == "cache" and doc2["evaluator_forwards"] == 0
    assert doc2["documents"][0]["cache"] == doc["documents"][0]["cache"]
    # without the cache, a scaled run finds the same spans with a separate pass of the unscaled model
    monkeypatch.setenv("ROPE_EXT_CACHE", str(tmp_path / "fresh"))
    _, third = run_job(tmp_path / "yarn_fresh", *overrides(text_file, "scaling=yarn", "scaling.factor=2.0"))
    doc3 = third["metrics"]["perplexity"]["longppl"]
    assert doc3["documents"][0]["source"] == "evaluator" and doc3["evaluator_forwards"] > doc["evaluator_forwards"]
    assert cached_spans(third) == cached_spans(first)
    assert third["summary"] == second["summary"]


def test_sliding_protocol_with_one_full_window_equals_prefix(text_file, tmp_path, monkeypatch, run_job):
    monkeypatch.setenv("ROPE_EXT_CACHE", str(tmp_path / "cache"))
    _, _, n = text_file
    prefix, _ = run_job(tmp_path / "prefix", *overrides(text_file, f"eval.lengths=[{n}]"))
    sliding, _ = run_job(tmp_path / "sliding", *overrides(text_file, f"eval.lengths=[{n}]", "eval.protocol=sliding"))
    assert sliding[f"key_tokens@{n}"] == prefix[f"key_tokens@{n}"] > 0
    assert sliding[f"longppl@{n}"] == pytest.approx(prefix[f"longppl@{n}"], rel=1e-5)


def test_span_helpers_match_the_reference():
    rng = random.Random(1)
    offsets, position = [], 0
    for _ in range(300):
        width = rng.randint(1, 6)
        offsets.append((position, position + width))
        position += width
    chosen = sorted(rng.sample(range(300), 80))
    spans = key_tokens.merge_spans([offsets[i] for i in chosen])
    assert spans == longppl.merge_intervals(torch.tensor([offsets[i] for i in chosen])).tolist()
    # another tokenizer's offsets (coarser tokens): key where a token lies inside a span, as cal_overlap says
    other = [(offsets[i][0], offsets[min(i + 1, 299)][1]) for i in range(0, 300, 2)]
    mask = key_tokens.tokens_in_spans(other, spans)
    expected = [i + 1 for i in longppl.cal_overlap(other, spans)]  # it returns loss indices (token - 1)
    assert torch.nonzero(mask).flatten().tolist() == expected and 0 < len(expected) < len(other)


def test_evaluator_given_as_a_model_config_finds_the_same_spans(text_file, tmp_path, monkeypatch, compose, run_job):
    """Another evaluator (here a mapping describing the same weights) runs its own passes before the scaled
    model; spans are text, so they come out as the run model's own."""
    import run as rope_run
    from omegaconf import OmegaConf

    monkeypatch.setenv("ROPE_EXT_CACHE", str(tmp_path / "cache"))
    _, shared = run_job(tmp_path / "self", *overrides(text_file))
    # no unscaled reference first: it would find the spans with the same evaluator, and this job read them cached
    cfg = compose(
        *TINY,
        "force=true",
        f"output_dir={tmp_path / 'other'}",
        *overrides(text_file),
        "scaling=yarn",
        "scaling.factor=2.0",
        "verdict.baseline=false",
    )
    cfg.eval.key_tokens.evaluator = OmegaConf.to_container(cfg.model)
    rope_run.run(cfg)
    results = json.loads((tmp_path / "other" / "results.json").read_text())
    found = results["metrics"]["perplexity"]["longppl"]
    assert found["evaluator"] == "tinyllama" and found["documents"][0]["source"] == "evaluator"
    assert found["evaluator_forwards"] > 0 and found["documents"][0]["cache"] != cached_spans(shared)
    assert cached_spans(results) == cached_spans(shared)


@pytest.mark.parametrize(
    "values,message",
    [
        ({"short_context": 300, "stride": 16}, r"short_context=300 \+ stride=16 is at least every eval.lengths"),
        (
            {"short_context": 250},
            r"short_context=250 \+ stride=1024 is at least every eval.lengths",
        ),  # the default stride
        (
            {"short_context": 64, "stride": 16, "evaluator": "nosuchmodel"},
            "is not a model; valid: gemma3, llama, llama3",
        ),
        ({"short_context": 64, "stride": 0}, "stride=0: must be >= 1"),
        ({"short_context": 64, "stride": 16, "alpha": -1.0}, "alpha=-1.0: must be >= 0"),
    ],
)
def test_check_without_a_job(values, message, structured):
    from evals.tasks import perplexity

    cfg = structured(
        perplexity.PerplexityConfig, lengths=[128, 300], longppl=True, key_tokens=key_tokens.KeyTokensConfig(**values)
    )
    with pytest.raises(perplexity.PerplexityError, match=message):
        perplexity.check_config(cfg)


@pytest.fixture(scope="module")
def slow_tokenizer(tmp_path_factory):
    from transformers import ByT5Tokenizer

    path = tmp_path_factory.mktemp("byt5")
    ByT5Tokenizer().save_pretrained(str(path))
    return path


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_bad_input_is_one_line_before_the_model_loads(text_file, slow_tokenizer, tmp_path, run_cli):
    _, _, n = text_file
    cases = {
        "is at least every eval.lengths": [f"eval.key_tokens.short_context={n}"],
        "without character offsets": [f"model.tokenizer={slow_tokenizer}"],
        "is not a model; valid: gemma3, llama": ["eval.key_tokens.evaluator=nosuchmodel"],
        f"stride={n - SHORT} is at least every eval.lengths": [f"eval.key_tokens.stride={n - SHORT}"],
    }
    running = {
        message: run_cli(
            *TINY,
            *overrides(text_file),
            *extra,
            f"output_dir={tmp_path / str(i)}",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, (message, extra) in enumerate(cases.items())
    }
    for message, process in running.items():
        out, err = process.communicate(timeout=300)
        assert process.returncode == 2, (message, err[-2000:])
        assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert "random weights" not in out + err  # refused before the model loads


@pytest.mark.slow
def test_smollm2_evaluator_by_name_finds_the_spans_of_the_unscaled_run_model(tmp_path, monkeypatch, compose):
    """SmolLM2 named as the evaluator is the run's own model: the same spans, found by a separate pass."""
    import run as rope_run

    monkeypatch.setenv("ROPE_EXT_CACHE", str(tmp_path / "cache"))
    common = [
        "model=smollm2",
        "logger=none",
        "force=true",
        "eval=perplexity",
        "eval.lengths=[1024,2048]",
        "eval.longppl=true",
        "eval.key_tokens.short_context=512",
        "eval.key_tokens.stride=256",
    ]
    results = []
    for i, evaluator in enumerate(["null", "smollm2"]):
        cfg = compose(*common, f"eval.key_tokens.evaluator={evaluator}", f"output_dir={tmp_path / str(i)}")
        summary = rope_run.run(cfg)
        results.append((summary, json.loads((tmp_path / str(i) / "results.json").read_text())))
    (plain, first), (named, second) = results
    assert first["metrics"]["perplexity"]["longppl"]["documents"][0]["source"] == "shared"
    assert second["metrics"]["perplexity"]["longppl"]["documents"][0]["source"] == "evaluator"
    assert cached_spans(first) == cached_spans(second)
    assert plain["key_tokens@2048"] == named["key_tokens@2048"] > 0
    assert plain["longppl@2048"] == pytest.approx(named["longppl@2048"], rel=1e-4)
    assert plain["longppl@2048"] < plain["ppl@2048"]  # key tokens: the ones a long context predicts well
