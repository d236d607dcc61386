"""Needle and passkey: exact prompt construction, prefix sharing equal to cell-by-cell, bad input."""

import json

import pytest
import torch

from evals.tasks import retrieval as needle
from evals.core.config.fields import check_options
from evals.core.config.lengths import check_lengths
from evals.core.inputs.data import Document
from evals.core.errors import ConfigError
from evals.core.inputs.loading import bundled_tokenizer
from evals.tasks.retrieval.haystack import HaystackError, PromptBuilder, haystack_ids
from evals.tasks.retrieval import RetrievalConfig


@pytest.fixture(scope="module")
def tokenizer():
    return bundled_tokenizer()  # SmolLM2's, what a random-weight model gets


@pytest.fixture(scope="module")
def corpus(tokenizer):
    text = " ".join(f"Sentence number {i} talks about the weather and the sea." for i in range(600))
    return [Document("corpus", torch.tensor(tokenizer(text)["input_ids"]))]


@pytest.fixture(scope="session")
def retrieval(structured):
    """``retrieval(**overrides)``: a typed RetrievalConfig, a small grid unless overridden."""

    def retrieval(**overrides):
        return structured(
            RetrievalConfig,
            **{
                "lengths": [256, 512],
                "depths": [0.0, 0.3, 1.0],
                "trials": 2,
                "max_new_tokens": 4,
                "prefill_chunk": 64,
                **overrides,
            },
        )

    return retrieval


@pytest.mark.parametrize("haystack", ["corpus", "filler"])
@pytest.mark.parametrize("snap", [0, 32])
def test_prompts_have_exact_length_and_needle_at_depth(tokenizer, corpus, haystack, snap, retrieval):
    cfg = retrieval(haystack=haystack, snap_tokens=snap)
    builder = PromptBuilder(cfg, tokenizer, haystack_ids(cfg, tokenizer, corpus))
    for length in cfg.lengths:
        for depth in cfg.depths:
            prompt = builder.build(length, depth, trial=0)
            assert len(prompt.ids) == length
            needle_ids = builder.encode(" " + cfg.needle.format(for_name="", key=prompt.keys[0]))
            at = prompt.needle_position
            assert torch.equal(prompt.ids[at : at + len(needle_ids)], needle_ids)
            question, answer_prefix = cfg.question.format(for_name=""), cfg.answer_prefix.format(for_name="")
            overhead = (
                len(builder.head) + len(needle_ids) + len(builder.encode(question)) + len(builder.encode(answer_prefix))
            )
            budget = length - overhead
            expected = len(builder.head) + round(depth * budget)
            assert expected - snap <= at <= expected
            assert prompt.answer_ids.tolist() == builder.encode(" " + prompt.keys[0]).tolist()
            assert tokenizer.decode(prompt.ids).endswith(question + answer_prefix)
            if haystack == "filler":  # canonical: the text re-tokenizes to the same ids (no " " + "The" joins)
                text = tokenizer.decode(prompt.ids[len(builder.head) :])
                assert "  " not in text
                assert builder.encode(text).tolist() == prompt.ids[len(builder.head) :].tolist()


def test_keys_are_seeded_and_vary_by_trial(tokenizer, corpus, retrieval):
    cfg = retrieval()
    builder = PromptBuilder(cfg, tokenizer, haystack_ids(cfg, tokenizer, corpus))
    assert builder.build(256, 0.5, 0).keys == builder.build(256, 0.5, 0).keys
    assert builder.build(256, 0.5, 0).keys != builder.build(256, 0.5, 1).keys
    assert all(5 <= len(builder.build(256, 0.5, t).keys[0]) <= 7 for t in range(10))


def test_multi_needle_with_distractors(tokenizer, corpus, retrieval):
    cfg = retrieval(num_needles=3, distractors=2, snap_tokens=0)
    builder = PromptBuilder(cfg, tokenizer, haystack_ids(cfg, tokenizer, corpus))
    prompt = builder.build(512, 0.5, 0)
    text = tokenizer.decode(prompt.ids)
    assert len(prompt.all_keys) == 5 and all(key in text for key in prompt.all_keys.values())
    target = next(iter(prompt.all_keys))
    assert f"special magic number for {target} mentioned" in text and prompt.keys == [prompt.all_keys[target]]
    assert f"{target}s" in prompt.all_keys  # a near-identical distractor name
    everything = PromptBuilder(retrieval(num_needles=3, ask="all"), tokenizer, builder.haystack).build(512, 0.5, 0)
    assert len(everything.keys) == 3 and "What are all the special magic numbers" in tokenizer.decode(everything.ids)
    assert needle.is_correct(f"{everything.keys[0]}, {everything.keys[2]}", everything.keys, "exact") == pytest.approx(
        2 / 3
    )
    assert (
        needle.is_correct("x1234567y", ["1234567"], "substring") == 1
        and needle.is_correct("x1234567y", ["123456"], "exact") == 0
    )


@pytest.fixture
def run_grid(eval_context, retrieval, corpus):
    """``run_grid(scaling=None, **overrides)``: the needle grid on the corpus in a real eval context of the MICRO model
    (SmolLM2's vocabulary): (summary, trials in grid order, output dir)."""

    def run_grid(scaling=None, **overrides):
        ctx = eval_context(scaling, "model.architecture.vocab_size=49152", docs=corpus)
        summary = needle.evaluate(retrieval(**overrides), ctx)
        trials = [json.loads(line) for line in (ctx.output.dir / "needle_trials.jsonl").read_text().splitlines()]
        return summary, sorted(trials, key=lambda r: (r["length"], r["depth"], r["trial"])), ctx.output.dir

    return run_grid


@pytest.mark.parametrize("scaling", [None, {"name": "yarn", "factor": 4.0}])
def test_prefix_sharing_equals_cell_by_cell(run_grid, scaling):
    shared, shared_trials, shared_dir = run_grid(scaling, prefix_sharing=True)
    alone, alone_trials, _ = run_grid(scaling, prefix_sharing=False)
    assert shared["needle_prefix_sharing"] and not alone["needle_prefix_sharing"]
    assert [r["answer"] for r in shared_trials] == [r["answer"] for r in alone_trials]
    assert [r["tf_correct"] for r in shared_trials] == [r["tf_correct"] for r in alone_trials]
    assert [r["tf_logprob"] for r in shared_trials] == pytest.approx([r["tf_logprob"] for r in alone_trials], abs=1e-3)
    assert shared["needle_tokens_computed"] < 0.8 * alone["needle_tokens_computed"]
    assert shared["needle_nll@256"] == pytest.approx(alone["needle_nll@256"], abs=1e-4) and shared["needle_nll@256"] > 0
    for name in ("needle_cells.csv", "needle_heatmap.png", "needle_trials.jsonl"):
        assert (shared_dir / name).stat().st_size > 0


@pytest.mark.parametrize(
    "scaling",
    [
        None,
        {"name": "dynamic_ntk", "factor": 2.0},  # its frequencies follow each forward's length: the same in a batch
        {"name": "self_extend", "group_size": 4, "window": 64},  # attention-level: grouped positions per row
        {"name": "dca", "chunk_size": 128, "local_window": 32},
    ],
)
@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_prompts_of_one_length_batched_answer_as_one_at_a_time(run_grid, scaling):
    """The batched path (eval.batch; the default on CUDA) against the one-prompt path (prefix sharing where the
    strategy allows it): the same answers, the same teacher-forced verdicts and log-probabilities at the fp32
    floor; a batch of 4 over 6 prompts a length also runs a last batch of 2, and the answers' padding is exercised by
    keys of 5 to 7 digits."""
    alone, alone_trials, _ = run_grid(scaling, lengths=[256, 384])
    batched, batched_trials, _ = run_grid(scaling, lengths=[256, 384], batch=4)
    assert alone["needle_batch"] == 1 and batched["needle_batch"] == 4 and not batched["needle_prefix_sharing"]
    assert len({len(r["keys"][0]) for r in batched_trials}) > 1  # answers of different lengths in one batch
    assert [r["answer"] for r in batched_trials] == [r["answer"] for r in alone_trials]
    assert [r["tf_correct"] for r in batched_trials] == [r["tf_correct"] for r in alone_trials]
    assert [r["tf_logprob"] for r in batched_trials] == pytest.approx([r["tf_logprob"] for r in alone_trials], abs=1e-4)
    assert batched["needle_nll@384"] == pytest.approx(alone["needle_nll@384"], abs=1e-5)


def test_dynamic_strategy_falls_back_to_cell_by_cell(run_grid):
    summary, _, _ = run_grid({"name": "dynamic_ntk", "factor": 2.0}, lengths=[256], trials=1)
    assert summary["needle_prefix_sharing"] is False


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"depths": [0.5, 1.5]}, "each value must be <= 1"),
        ({"depths": [-0.1]}, "must be >= 0"),
        ({"scoring": "judge"}, "generate, teacher_forced, both"),
        ({"lengths": [0]}, "each value must be >= 1 tokens"),
        ({"num_needles": 40}, "must be <= 16"),
    ],
)
def test_bad_options(overrides, message, retrieval):
    with pytest.raises(ConfigError, match=message):
        cfg = retrieval(**overrides)
        check_options(cfg, RetrievalConfig, "eval")
        check_lengths(cfg, RetrievalConfig, "eval")


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"key_digits": [7, 5]}, "must be \\[min, max\\]"),
        ({"needle": "The number is {code}."}, "placeholder other than"),
        ({"needle": "No key here."}, "must contain \\{key\\}"),
    ],
)
def test_bad_config(overrides, message, retrieval):
    with pytest.raises(HaystackError, match=message):
        needle.check_config(retrieval(**overrides))


def test_length_below_needle_and_question_and_short_haystack(tokenizer, corpus, retrieval):
    cfg = retrieval()
    builder = PromptBuilder(cfg, tokenizer, haystack_ids(cfg, tokenizer, corpus))
    with pytest.raises(HaystackError, match="length 40 is below what the needles and question need"):
        builder.build(40, 0.5, 0)
    with pytest.raises(HaystackError, match="the haystack has .* tokens, fewer than"):
        builder.build(100_000, 0.5, 0)


def test_chat_template_wraps_the_prompt_and_keeps_the_exact_length(tokenizer, corpus, retrieval):
    cfg = retrieval(chat_template=True)
    builder = PromptBuilder(cfg, tokenizer, haystack_ids(cfg, tokenizer, corpus))
    prompt = builder.build(512, 0.5, 0)
    text = tokenizer.decode(prompt.ids)
    assert len(prompt.ids) == 512
    assert text.startswith("<|im_start|>") and "<|im_start|>assistant" in text
    assert text.index("special magic number is") < text.rindex("<|im_end|>") < text.rindex("provided text is")


@pytest.mark.parametrize("snap", [0, 1, 7, 32])
def test_a_needle_snaps_to_the_nearest_sentence_start_within_the_window(tokenizer, corpus, snap, retrieval):
    """The bisection that replaced a scan of every sentence start per needle (bench/retrieval_overhead.py) keeps
    the rule: the last sentence start at or before the position, if within ``snap_tokens``, else the position."""
    cfg = retrieval(snap_tokens=snap, lengths=[1024])
    builder = PromptBuilder(cfg, tokenizer, haystack_ids(cfg, tokenizer, corpus))
    for position in range(1024):
        within = [s for s in builder.sentence_starts if position - snap <= s <= position] if snap > 0 else []
        assert builder.snap(position) == (within[-1] if within else position), position


def test_passkey_prompts_are_the_ones_built_before_the_overhead_work(tokenizer, retrieval):
    """Every prompt of a passkey grid, token for token, as the code before the overhead work built it (a digest
    taken then): the answers of a model on them cannot differ."""
    import hashlib

    cfg = retrieval(
        haystack="filler",
        lengths=[1024, 2048],
        depths=[0.0, 0.1, 0.5, 0.9, 1.0],
        trials=3,
        filler="The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.",
    )
    builder = PromptBuilder(cfg, tokenizer, haystack_ids(cfg, tokenizer, []))
    digest = hashlib.sha256()
    for length in cfg.lengths:
        for depth in cfg.depths:
            for trial in range(cfg.trials):
                prompt = builder.build(length, depth, trial)
                digest.update(prompt.ids.numpy().tobytes() + prompt.answer_ids.numpy().tobytes())
    assert digest.hexdigest()[:16] == PROMPTS_DIGEST


PROMPTS_DIGEST = "0ad04ea56adf1393"


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_an_interrupted_passkey_run_keeps_its_finished_prompts_and_the_rerun_scores_only_the_rest(
    tmp_path, interrupted_run, run_cli
):
    """A long retrieval job (hours at 16k on a CPU) stopped half-way loses nothing: the re-run keeps every prompt the
    interrupted run scored -- where the prompt built now is the same -- and runs only the others."""
    from tests.tiny import TINY

    out = tmp_path / "passkey"
    length, depths, trials = 2048, [0.1, 0.3, 0.5, 0.7, 0.9], 4
    args = [
        *TINY,
        "eval=passkey",
        f"eval.lengths=[{length}]",
        f"eval.depths=[{','.join(map(str, depths))}]",
        f"eval.trials={trials}",
        "eval.prefix_sharing=false",  # each prompt a whole forward: the cost of a prompt is its length
        "eval.scoring=generate",  # one prefill a prompt (teacher forcing would add a second)
        "eval.max_new_tokens=4",
        "logger=none",
        f"output_dir={out}",
    ]
    prompts = len(depths) * trials
    kept = interrupted_run(out / "passkey_trials.jsonl", *args)
    assert json.loads((out / "results.json").read_text())["status"] == "interrupted"
    assert 1 <= len(kept) < prompts
    rerun = run_cli(*args)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert f"passkey: {len(kept)} of {prompts} prompts kept from the interrupted run" in rerun.stdout
    done = json.loads((out / "results.json").read_text())
    final = [json.loads(line) for line in (out / "passkey_trials.jsonl").read_text().splitlines()]
    assert done["status"] == "done" and len(final) == prompts and final[: len(kept)] == kept
    assert {(r["depth"], r["trial"]) for r in final} == {(d, t) for d in depths for t in range(trials)}
    computed = done["metrics"]["passkey"]["passkey_tokens_computed"]
    rest = sum(r["prompt_tokens"] for r in final[len(kept) :])
    assert rest <= computed <= rest + 4 * (prompts - len(kept))  # the rest's prefills and answers, not the kept


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_greedy_picks_the_first_maximum_like_torch(dtype):
    from evals.tasks.retrieval.scorer import greedy

    logits = torch.randn(5, 49152, generator=torch.Generator().manual_seed(0)).to(dtype)
    logits[1, [7, 300]] = 40.0  # a tie: the first one
    logits[2, [9, 11]] = float("nan")  # NaN counts as the largest: the first one
    logits[3, 49151] = 40.0
    picked = greedy(logits)
    assert picked.tolist() == logits.argmax(-1).tolist() and picked.tolist()[1:4] == [7, 9, 49151]
    assert int(greedy(logits[4])) == int(logits[4].argmax())  # one row: a scalar, as generation reads it


def test_the_scorer_keeps_the_cache_length_it_tracks(eval_context, retrieval, tokenizer):
    """The scorer counts the cached tokens itself (the cache's own count walks every layer); after every prompt,
    teacher-forced answer and rewind the count is the cache's."""
    from evals.tasks.retrieval.scorer import PromptScorer

    ctx = eval_context(None, "model.architecture.vocab_size=49152")
    cfg = retrieval(haystack="filler", lengths=[512])
    builder = PromptBuilder(cfg, tokenizer, haystack_ids(cfg, tokenizer, []))
    scorer = PromptScorer(ctx.model(), True, 4, None, prefill_chunk=64)
    for depth in (0.1, 0.5, 0.9):
        prompt = builder.build(512, depth, 0)
        scorer.generate(prompt.ids)
        assert scorer.length == scorer.cache.get_seq_length() == len(prompt.ids)
        scorer.prefill(prompt.ids, prompt.answer_ids[:-1])
        assert scorer.length == scorer.cache.get_seq_length() == len(prompt.ids) + len(prompt.answer_ids) - 1
        scorer.teacher_forced(prompt.ids, prompt.answer_ids)
        assert scorer.length == scorer.cache.get_seq_length() == len(prompt.ids)
