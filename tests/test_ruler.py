"""eval=ruler: RULER offline from lm-eval's own generators and scoring, with our corpus as the essay haystack."""

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from evals.core.inputs.loading import bundled_tokenizer
from evals.lm_eval_tasks import rope_ext_ruler_utils as R
from evals.tasks.lm_harness import TASKS_DIR
from evals.tasks.ruler import RulerError, effective_length
from tests.tiny import ROOT, TINY


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """The bundled SmolLM2 tokenizer saved as files, so lm-eval's own ``get_tokenizer`` (AutoTokenizer, no GGUF)
    loads the very tokenizer our tasks use."""
    path = tmp_path_factory.mktemp("tokenizer")
    bundled_tokenizer().save_pretrained(path)
    return str(path)


def lm_eval_docs(task: str, length: int, tokenizer_dir: str, monkeypatch, haystack=None) -> list[dict]:
    """lm-eval's own RULER dataset function for ``task`` (its 500 samples), seeded as ours seeds."""
    from lm_eval.tasks.ruler import cwe_utils, fwe_utils, niah_utils, vt_utils

    if haystack is not None:  # lm-eval's essay haystack is Paul Graham's essays from the hub: ours in its place
        original = niah_utils.get_haystack
        monkeypatch.setattr(
            niah_utils,
            "get_haystack",
            lambda type_haystack: haystack if type_haystack == "essay" else original(type_haystack),
        )
    random.seed(R.SEED)
    np.random.seed(R.SEED)
    cwe_utils.RNG.seed(R.SEED)
    function = {"vt": vt_utils.get_vt_dataset, "cwe": cwe_utils.get_cw_dataset, "fwe": fwe_utils.fwe_download}.get(task)
    function = function or getattr(niah_utils, task)
    return list(function(max_seq_lengths=[length], tokenizer=tokenizer_dir)["test"])


CASES = [
    ("niah_single_1", 512),
    ("niah_single_2", 1024),
    ("niah_multikey_3", 512),
    ("niah_multiquery", 1024),
    ("vt", 1024),
    ("cwe", 512),
    ("fwe", 512),
]


@pytest.mark.parametrize("task,length", CASES, ids=[f"{t}@{L}" for t, L in CASES])
@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_our_tasks_generate_lm_evals_prompts(task, length, tokenizer_dir, monkeypatch):
    """Our dataset function = lm-eval's dataset function for the same haystack, tokenizer and seed: the same
    prompts, answers, lengths and answer prefixes, sample for sample."""
    R.ensure_punkt_tab()
    haystack = R.haystack_words() if task in R.ESSAY else None
    ours = list(getattr(R, task)(max_seq_lengths=[length], num_samples=3, tokenizer=tokenizer_dir)["test"])
    theirs = lm_eval_docs(task, length, tokenizer_dir, monkeypatch, haystack)[:3]
    assert len(ours) == 3
    for mine, reference in zip(ours, theirs):
        assert mine["task"] == task
        assert {k: mine[k] for k in reference} == reference
    assert all(row["length"] <= length for row in ours) or task == "fwe"  # fwe sizes its text to the length


def test_the_essay_haystack_is_the_jobs_corpus():
    persuasion = R.haystack_words({"name": "books", "source": "books", "books": ["persuasion"]})
    emma = R.haystack_words()
    assert "Elliot," in persuasion[:200] and "Woodhouse," in emma[:200]
    assert all(word and " " not in word for word in persuasion[:1000])  # lm-eval's word split
    assert (R.nltk_data_dir() / "tokenizers" / "punkt_tab" / "english" / "collocations.tab").is_file()


DOC = {"max_length": 4096, "outputs": ["8090293", "Ada-Lovelace"]}


@pytest.mark.parametrize("prediction", [" 8090293 and ada-lovelace", "only 8090293\x00", "nothing", ""])
def test_scoring_is_lm_evals(prediction):
    from lm_eval.tasks.ruler import common_utils

    ours = R.process_results(DOC, [prediction])
    assert ours["score"] == common_utils.process_results(DOC, [prediction])["4096"] == ours["4096"]
    assert ours["8192"] == -1.0 and ours["score"] in (0.0, 0.5, 1.0)
    part = R.process_results_part(DOC, [prediction])
    assert part["score"] == common_utils.process_results_part(DOC, [prediction])["4096"]
    assert R.aggregate_metrics([1.0, -1, 0.0]) == common_utils.aggregate_metrics([1.0, -1, 0.0]) == 0.5


def test_the_default_task_set_never_depends_on_the_network():
    from evals.tasks.ruler import RulerConfig, selected

    assert selected(RulerConfig()) == list(R.SYNTHETIC) and len(R.SYNTHETIC) == 11
    assert selected(RulerConfig(tasks=["vt", "qa_squad", "vt"])) == ["vt", "qa_squad"]


def test_effective_lengths():
    averages = {1024: 90.0, 2048: 86.0, 4096: 50.0, 8192: 95.0}
    assert effective_length(averages, 85.6) == 2048  # every length up to it, not any length
    assert effective_length(averages, 95.0) is None
    assert effective_length({1024: 80.0, 2048: 70.0}, 0.85 * 80.0) == 2048


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_ruler_job_on_a_tiny_model_reports_scores_per_task_and_length(tmp_path, run_job):
    summary, results = run_job(
        tmp_path,
        "eval=ruler",
        "eval.tasks=[niah_single_1,niah_single_2,vt]",
        "eval.lengths=[1024,1536]",
        "eval.limit=2",
        "data.books=[persuasion]",
        "scaling=yarn",
        "scaling.factor=2",
        "eval.apply_chat_template=true",
    )
    metrics = results["metrics"]["ruler"]
    assert metrics["tasks"] == ["niah_single_1", "niah_single_2", "vt"] and metrics["max_length"] == 2048 * 2
    rows = (tmp_path / "ruler_scores.csv").read_text().splitlines()
    assert rows[0] == "task,length,samples,score,seconds,prompt_seconds" and len(rows) == 1 + 3 * 2
    samples = [json.loads(line) for line in (tmp_path / "ruler_samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 * 2 * 2 and {s["length"] for s in samples} == {1024, 1536}
    for cell in metrics["cells"]:
        mine = [s["score"] for s in samples if s["task"] == cell["task"] and s["length"] == cell["length"]]
        assert cell["samples"] == 2 and cell["score"] == pytest.approx(sum(mine) / 2)
    for L in (1024, 1536):
        cells = [c["score"] for c in metrics["cells"] if c["length"] == L]
        assert summary[f"ruler@{L}"] == pytest.approx(sum(cells) / 3) and 0 <= summary[f"ruler@{L}"] <= 100
    assert "ruler_effective_length" in summary and "ruler_effective_length_relative" in summary
    assert summary["ruler_effective_length"] == effective_length({L: summary[f"ruler@{L}"] for L in (1024, 1536)}, 85.6)
    assert (tmp_path / "ruler_heatmap.png").stat().st_size > 1000
    assert results["identity"]["data"]["books"] == ["persuasion"]  # the essay tasks read the job's corpus
    # per sample: generation alone; building the prompts (seconds of lm-eval's generators) is counted apart
    assert summary["ruler_prompt_seconds"] > 0 and summary["ruler_seconds"] > 0
    assert summary["ruler_prompt_seconds"] + summary["ruler_seconds"] < results["timings"]["elapsed_s"]
    assert summary["ruler_seconds_per_sample"] == pytest.approx(summary["ruler_seconds"] / 12, abs=1e-3)
    assert summary["ruler_samples@1024"] == 6 and summary["ruler_ci95_low@1024"] <= summary["ruler@1024"]
    assert summary["verdict@1536"] is None or isinstance(summary["verdict@1536"], bool)  # judged like the rest


BAD = [
    (["eval.tasks=[niah_singel_1]"], "unknown RULER task 'niah_singel_1'; did you mean niah_single_1"),
    (["eval.tasks=[qa_squad]"], "qa_squad download(s) SQuAD / HotpotQA and the Hugging Face hub is not reachable"),
    (["eval.tasks=[]"], "eval.tasks is empty"),
    (["eval.tasks=[vt]", "eval.lengths=[512,2048]"], "RULER vt needs lengths >= 1024"),
    (["eval.tasks=[cwe]", "eval.lengths=[512,2048]"], "RULER cwe needs lengths >= 1024"),  # else answers of 0 words
    (["eval.lengths=[128]"], "eval.lengths=[128]: each value must be >= 256"),
    (["eval.limit=0"], "eval.limit=0: must be >= 1"),
    (["eval.threshold=101"], "eval.threshold=101.0: must be <= 100"),
    (["eval.relative_threshold=0"], "eval.relative_threshold=0.0: must be > 0"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[" ".join(a) for a, _ in BAD])
@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_bad_ruler_input_is_one_line_before_any_work(args, message, tmp_path, monkeypatch, compose):
    from evals import UserError
    from evals.core.job.parse import parse_job

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError) as err:
        parse_job(compose("logger=none", "eval=ruler", *args), tmp_path)
    assert message in str(err.value) and "\n" not in str(err.value)
    if "RULER" in message:
        assert isinstance(err.value, RulerError)


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_an_offline_qa_request_exits_2_with_one_line_from_the_cli(tmp_path, run_cli):
    result = run_cli(
        "logger=none",
        "eval=ruler",
        "eval.tasks=[niah_single_1,qa_hotpot]",
        f"hydra.run.dir={tmp_path}",
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "qa_hotpot download(s)" in lines[0], result.stderr[-2000:]
    assert "loading" not in result.stdout + result.stderr and not (tmp_path / "results.json").exists()


def test_vt_below_its_smallest_prompt_is_an_error_not_a_hang(tokenizer_dir):
    with pytest.raises(ValueError, match="RULER vt needs at least"):
        R.vt(max_seq_lengths=[512], num_samples=1, tokenizer=tokenizer_dir)


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_the_task_yamls_load_in_lm_evals_task_manager():
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(TASKS_DIR), metadata={"max_seq_lengths": [1024, 1280], "num_samples": 2})
    names = [f"rope_ext_ruler_{t}" for t in R.TASKS]
    assert set(names) | {"rope_ext_ruler"} <= set(manager.all_tasks)
    group = manager.load_task_or_group(["rope_ext_ruler"])
    (subtasks,) = group.values()
    assert sorted(t for t in subtasks) == sorted(f"rope_ext_ruler_{t}" for t in R.SYNTHETIC)
    task = subtasks["rope_ext_ruler_niah_single_1"]
    docs = list(task.test_docs())
    assert [d["max_length"] for d in docs] == [1024, 1024, 1280, 1280]
    assert task.config.generation_kwargs["max_gen_toks"] == 128 and task.config.gen_prefix == "{{gen_prefix}}"
    assert subtasks["rope_ext_ruler_vt"].config.generation_kwargs["max_gen_toks"] == 30
    assert task.process_results(docs[0], [str(docs[0]["outputs"][0])])["1024"] == 1.0


@pytest.mark.slow  # the plain lm_eval CLI over the whole group: 11 tasks at 1024 tokens on a tiny local checkpoint
def test_plain_lm_eval_cli_runs_the_ruler_group_offline(tmp_path, tiny_llama):
    """`lm_eval --include_path evals/lm_eval_tasks --tasks rope_ext_ruler` without our CLI (the group's YAMLs, its
    generators and scorers, offline). The model is not the point: a tiny checkpoint saved locally with the bundled
    tokenizer (SmolLM2's GGUF through lm_eval's own loader is tests/test_smollm2.py's)."""
    checkpoint = tmp_path / "tiny"
    tiny_llama(vocab=49152, trained=1024).save_pretrained(checkpoint)
    bundled_tokenizer().save_pretrained(checkpoint)
    command = [
        sys.executable,
        "-m",
        "lm_eval",
        "--model",
        "hf",
        "--model_args",
        f"pretrained={checkpoint}",
        "--include_path",
        str(TASKS_DIR),
        "--tasks",
        "rope_ext_ruler",
        "--device",
        "cpu",
        "--metadata",
        json.dumps({"max_seq_lengths": [1024], "num_samples": 1}),
        "--output_path",
        str(tmp_path / "out"),
    ]
    result = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rope_ext_ruler" in result.stdout and "1024" in result.stdout


@pytest.mark.slow  # two CLI runs of RULER on the tiny model (~1.5 min)
def test_an_interrupted_ruler_run_keeps_its_finished_cells_and_the_rerun_runs_only_the_rest(
    tmp_path, run_cli, interrupted_run
):
    out = tmp_path / "ruler"
    args = [
        *TINY,
        "eval=ruler",
        "eval.tasks=[niah_single_1,niah_single_2,niah_single_3]",
        "eval.lengths=[512,1024]",
        "eval.limit=2",
        "data.books=[persuasion]",
        f"output_dir={out}",
    ]
    kept = interrupted_run(cells := out / "ruler_cells.jsonl", *args)
    interrupted = json.loads((out / "results.json").read_text())
    assert interrupted["status"] == "interrupted"
    assert 1 <= len(kept) < 6 and interrupted["metrics"]["ruler"]["partial"] is True
    assert len(interrupted["metrics"]["ruler"]["cells"]) == len(kept)
    samples = [json.loads(line) for line in (out / "ruler_samples.jsonl").read_text().splitlines()]
    assert len(samples) >= 2 * len(kept)  # every finished cell's samples are on disk

    rerun = run_cli(*args)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert f"ruler: {len(kept)} of 6 task x length cells kept from the interrupted run" in rerun.stdout
    done = json.loads((out / "results.json").read_text())
    assert done["status"] == "done" and not (tmp_path / "ruler-2").exists()
    final = [json.loads(line) for line in cells.read_text().splitlines()]
    assert len(final) == 6 and final[: len(kept)] == kept  # kept as computed (their seconds too), not run again
    assert len((out / "ruler_samples.jsonl").read_text().splitlines()) == 12
    assert done["summary"]["ruler_samples@512"] == 6 and done["summary"]["ruler_samples@1024"] == 6
