"""Perplexity eval: the one-pass prefix protocol, the per-length path, sliding windows, bookkeeping."""

import json
import math

import pytest
import torch

from evals.tasks import perplexity
from evals.core.config.fields import check_options
from evals.core.config.lengths import check_lengths, resolve_lengths
from evals.core.errors import ConfigError
from evals.tasks.perplexity import PerplexityConfig
from evals.core.scoring.nll import token_nll


@pytest.fixture(scope="session")
def config(structured):
    """``config(**values)``: a typed PerplexityConfig with ``values`` set."""
    return lambda **values: structured(PerplexityConfig, **values)


def test_token_nll_equals_transformers_loss(tiny_llama):
    model = tiny_llama()
    ids = torch.randint(3, 96, (200,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model(ids[None], labels=ids[None]).loss
    nll = token_nll(model, ids, chunk_tokens=37)  # chunking must not change anything
    assert float(nll.mean()) == pytest.approx(float(expected), abs=1e-6)
    assert torch.equal(token_nll(model, ids, chunk_tokens=37, progress=True), nll)  # the per-layer bar changes nothing


@pytest.mark.parametrize("scaling", [{"name": "none"}, {"name": "yarn", "factor": 4.0}])
def test_prefix_one_pass_equals_per_length_runs(eval_context, documents, scaling, config):
    ctx = eval_context(scaling)
    summary = perplexity.evaluate(config(lengths=[32, 100, 256], min_document_tokens=0), ctx)
    for length in (32, 100, 256):
        losses, weights = [], []
        for doc in documents:
            if len(doc.ids) >= length:
                with torch.no_grad():
                    losses.append(float(ctx.model()(doc.ids[None, :length], labels=doc.ids[None, :length]).loss))
                weights.append(length - 1)
        expected = math.exp(sum(l * w for l, w in zip(losses, weights)) / sum(weights))
        assert summary[f"ppl@{length}"] == pytest.approx(expected, rel=1e-5)


def test_static_strategy_takes_one_forward_per_document_and_dynamic_one_per_length(eval_context, config):
    calls = []
    for scaling, expected in [({"name": "ntk", "factor": 2.0}, 3), ({"name": "dynamic_ntk", "factor": 2.0}, 3 + 3 + 1)]:
        ctx = eval_context(scaling)
        hook = ctx.model().get_decoder().register_forward_hook(lambda m, a, k, o: calls.append(1), with_kwargs=True)
        perplexity.evaluate(config(lengths=[32, 200, 256], min_document_tokens=0), ctx)
        hook.remove()
        assert len(calls) == expected, scaling
        calls.clear()


def test_dynamic_per_length_equals_native_per_length(eval_context, documents, config):
    ctx = eval_context({"name": "dynamic_ntk", "factor": 2.0})
    summary = perplexity.evaluate(config(lengths=[128, 280]), ctx)
    doc = documents[0]
    with torch.no_grad():
        loss = float(ctx.model()(doc.ids[None, :280], labels=doc.ids[None, :280]).loss)
    assert summary["ppl@280"] == pytest.approx(math.exp(loss), rel=1e-5)  # only doc0 has 280 tokens


def brute_force_sliding(model, ids, window, stride, bos=None):
    """The Hugging Face perplexity recipe: per window, labels -100 on tokens scored by earlier windows."""
    total, count, prev_end = 0.0, 0, 0
    span = window - 1 if bos is not None else window
    for begin in range(0, len(ids), stride):
        end = min(begin + span, len(ids))
        chunk = ids[begin:end][None]
        labels = chunk.clone()
        labels[:, : max(0, prev_end - begin)] = -100
        if bos is not None:
            chunk = torch.cat([torch.tensor([[bos]]), chunk], 1)
            labels = torch.cat([torch.tensor([[-100]]), labels], 1)
        scored = int((labels[:, 1:] != -100).sum())
        with torch.no_grad():
            total += float(model(chunk, labels=labels).loss) * scored
        count += scored
        prev_end = end
        if end == len(ids):
            break
    return total, count


@pytest.mark.parametrize("bos", [None, 1])
@pytest.mark.parametrize("window,stride", [(64, 16), (100, 100), (256, 50)])
def test_sliding_equals_brute_force(window, stride, bos, tiny_llama):
    model = tiny_llama()
    ids = torch.randint(3, 96, (300,), generator=torch.Generator().manual_seed(5))
    nll = perplexity.sliding_nll(model, ids, window, stride, bos, chunk_tokens=64)
    total, count = float(nll.double().sum()), len(nll)
    expected_total, expected_count = brute_force_sliding(model, ids, window, stride, bos)
    assert count == expected_count
    if stride <= window - 1:  # windows leave no gap: every token is scored (the first only after a BOS)
        assert count == len(ids) - (1 if bos is None else 0)
    assert total == pytest.approx(expected_total, rel=1e-5)


def test_sliding_protocol_end_to_end(eval_context, config):
    ctx = eval_context()
    summary = perplexity.evaluate(config(lengths=[64, 128], protocol="sliding", stride=32, bos_per_window=True), ctx)
    assert summary["ppl@64"] > 1 and summary["ppl@128"] > 1


def test_results_rows_ci_skips_curve_and_files(eval_context, documents, config):
    ctx = eval_context()
    summary = perplexity.evaluate(config(lengths=[64, 200, 300], position_bins=10, min_document_tokens=0), ctx)
    data = json.loads((ctx.output.dir / "results.json").read_text())
    rows = {r["length"]: r for r in data["metrics"]["perplexity"]["by_length"]}
    assert rows[64]["documents"] == 3 and rows[64]["skipped_documents"] == 0 and rows[64]["tokens"] == 3 * 63
    assert rows[200]["documents"] == 2 and rows[200]["skipped_documents"] == 1
    assert rows[300]["documents"] == 1 and rows[300]["ci95_low"] is None
    assert rows[64]["ci95_low"] < rows[64]["ppl"] < rows[64]["ci95_high"]
    bins = data["metrics"]["perplexity"]["loss_by_position"]
    assert bins[0]["position_start"] == 1 and bins[-1]["position_end"] == 299 and len(bins) == 10
    for name in ("perplexity.csv", "loss_by_position.csv", "loss_by_position_plot.png", "loss_by_position_plot.svg"):
        assert (ctx.output.dir / name).stat().st_size > 0
    assert summary["tokens@200"] == 2 * 199 and "effective_length" not in summary  # judged by the verdict, not here


def test_every_length_is_scored_on_the_same_documents_by_default(eval_context, documents, config):
    """Documents too short for the longest length are left out of every length (the reference at a shorter
    length then scores the same text); min_document_tokens=0 scores each document where it reaches."""
    ctx = eval_context()
    summary = perplexity.evaluate(config(lengths=[64, 200]), ctx)
    data = json.loads((ctx.output.dir / "results.json").read_text())["metrics"]["perplexity"]
    rows = {r["length"]: r for r in data["by_length"]}
    assert rows[64]["documents"] == rows[200]["documents"] == 2 and data["excluded_documents"] == ["doc2"]
    assert summary["tokens@64"] == 2 * 63
    every = perplexity.evaluate(config(lengths=[64, 200], min_document_tokens=0), eval_context())
    assert every["tokens@64"] == 3 * 63 and every["tokens@200"] == 2 * 199


def test_out_of_memory_at_one_length_is_recorded_and_the_others_report(eval_context, config):
    ctx = eval_context()

    def fail_long_inputs(module, args, kwargs):  # the failure a GPU gives at a too-long length
        if kwargs["input_ids"].shape[1] > 200:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    hook = ctx.model().get_decoder().register_forward_pre_hook(fail_long_inputs, with_kwargs=True)
    summary = perplexity.evaluate(config(lengths=[64, 128, 256], min_document_tokens=0), ctx)
    hook.remove()
    rows = {
        r["length"]: r
        for r in json.loads((ctx.output.dir / "results.json").read_text())["metrics"]["perplexity"]["by_length"]
    }
    assert rows[256]["oom"] and rows[256]["ppl"] is None
    assert not rows[128]["oom"] and rows[128]["documents"] == 3 and summary["ppl@64"] > 1


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"lengths": [-5]}, "lengths=\\[-5\\]: each value must be >= 2"),
        ({"lengths": []}, "lengths is empty"),
        ({"protocol": "window"}, "is not one of prefix, sliding"),
        ({"lengths": ["2y"]}, "'2y' is not a length"),
    ],
)
def test_bad_options(overrides, message, config):
    with pytest.raises(ConfigError, match=message):
        cfg = config(**overrides)
        check_options(cfg, PerplexityConfig, "eval")
        resolve_lengths(cfg, PerplexityConfig, 8192, "eval")
        check_lengths(cfg, PerplexityConfig, "eval")


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"protocol": "sliding", "stride": 500, "lengths": [128]}, "stride=500"),
        (
            {"protocol": "sliding", "max_tokens": 100, "stride": 64, "lengths": [128]},
            "max_tokens=100 is below the longest length 128",
        ),
    ],
)
def test_bad_eval_config(overrides, message, config):
    with pytest.raises(perplexity.PerplexityError, match=message):
        perplexity.check_config(config(**overrides))


def test_length_beyond_every_document_is_an_error(eval_context, config):
    with pytest.raises(perplexity.PerplexityError, match="exceed every document \\(longest: 300 tokens"):
        perplexity.evaluate(config(lengths=[64, 1000]), eval_context())


def test_each_length_says_its_expected_time_and_memory_before_it_runs(eval_context, capsys, config):
    """Dynamic scaling runs one forward per length, shortest first: the measured rate predicts the next ones."""
    ctx = eval_context({"name": "dynamic_ntk", "factor": 2.0})
    perplexity.evaluate(config(lengths=[64, 128, 256]), ctx)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("perplexity: ")]
    assert [line.split(":")[1].strip() for line in lines] == [
        "64 tokens",
        "128 tokens",
        "256 tokens",
    ] * 2  # 2 documents
    assert "time known after the first forward" in lines[0] and "GiB on cpu" in lines[0]
    # "about 0.1 s at the rate measured so far, about 0.00 GiB on cpu"
    assert all(" s at the rate measured so far, about " in line for line in lines[1:])
