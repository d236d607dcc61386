"""RULER (Hsieh et al. 2024) offline, from lm-eval's own RULER generators and scoring (used through
``!function`` from the ``rope_ext_ruler_*.yaml`` files here).

What differs from lm-eval's ``ruler`` tasks, and nothing else:

- the essay haystack (niah_single_2/3, niah_multikey_1, niah_multivalue, niah_multiquery) is the job's
  corpus (``metadata.data``: a rope_ext data config; default the Austen novels, ``data=books``), made into
  words exactly as lm-eval makes Paul Graham's essays (``re.sub(r"\\s+", " ", text).split(" ")``);
- nltk's ``punkt_tab`` (the essay tasks split sentences; only nltk's downloader ships it) is a Punkt model
  trained offline on the Austen novels once and cached in ``<cache>/nltk_data`` (``$ROPE_EXT_CACHE`` or
  ``~/.cache/rope_ext``), put first on nltk's path so every machine splits the same way;
- the tokenizer is the model's own, GGUF included (``tokenizer``/``pretrained`` + ``gguf_file``, else the
  bundled SmolLM2 one), where lm-eval's ``get_tokenizer`` cannot read a GGUF file;
- ``num_samples`` per length (metadata, default 500 as RULER) instead of a fixed 500, and a seed
  (``seed``, default 42 as RULER) set before each task and length is generated (RULER prepares each task
  and length in its own run with seed 42; lm-eval's ``simple_evaluate`` seeds python's ``random`` with 0
  once per call, so without this a task's samples would depend on which tasks were generated before it);
- each document reports ``score`` (lm-eval's ``process_results``, 0-1) and its score under its length for
  the lengths of ``LENGTH_METRICS`` (-1 elsewhere, lm-eval's convention).

The generator arguments of each task are those of lm-eval's ``niah_utils`` / ``vt_utils`` / ``cwe_utils``
/ ``fwe_utils`` / ``qa_utils`` dataset functions (``tests/test_ruler.py`` checks the prompts are theirs).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import tempfile
from functools import cache
from pathlib import Path


# metric names of the per-length scores (the group averages them); other lengths report `score` only
LENGTH_METRICS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
SEED = 42  # RULER's random_seed
NUM_SAMPLES = 500  # RULER's default per length

# lm-eval's niah_utils functions, argument for argument
NIAH = {
    "niah_single_1": dict(type_haystack="repeat", type_needle_k="words", type_needle_v="numbers"),
    "niah_single_2": dict(type_haystack="essay", type_needle_k="words", type_needle_v="numbers"),
    "niah_single_3": dict(type_haystack="essay", type_needle_k="words", type_needle_v="uuids"),
    "niah_multikey_1": dict(type_haystack="essay", type_needle_k="words", type_needle_v="numbers", num_needle_k=4),
    "niah_multikey_2": dict(type_haystack="needle", type_needle_k="words", type_needle_v="numbers"),
    "niah_multikey_3": dict(type_haystack="needle", type_needle_k="uuids", type_needle_v="uuids"),
    "niah_multivalue": dict(type_haystack="essay", type_needle_k="words", type_needle_v="numbers", num_needle_v=4),
    "niah_multiquery": dict(type_haystack="essay", type_needle_k="words", type_needle_v="numbers", num_needle_q=4),
}
SYNTHETIC = (*NIAH, "vt", "cwe", "fwe")
HUB = ("qa_squad", "qa_hotpot")  # SQuAD / HotpotQA are downloaded
TASKS = (*SYNTHETIC, *HUB)
ESSAY = tuple(name for name, spec in NIAH.items() if spec["type_haystack"] == "essay")


# --- offline resources: nltk's punkt_tab, the corpus haystack, the tokenizer ------------------------------


def nltk_data_dir() -> Path:
    from evals.core.files import cache_dir

    return cache_dir() / "nltk_data"


def ensure_punkt_tab() -> Path:
    """``<cache>/nltk_data`` with a ``punkt_tab/english`` model trained on the Austen novels (once), first on
    nltk's data path. Must run before lm-eval's ``prepare_niah`` is imported (it looks for punkt_tab then)."""
    import nltk

    root = nltk_data_dir()
    if str(root) not in nltk.data.path:
        nltk.data.path.insert(0, str(root))  # first; also where nltk lets save_punkt_params write
    target = root / "tokenizers" / "punkt_tab" / "english"
    if target.is_dir() and not _punkt_readable(target):
        from evals.core.files import note_once

        note_once(f"note: damaged cache entry {target} (Punkt sentence splitter); retraining it")
        shutil.rmtree(target, ignore_errors=True)
    if not (target / "ortho_context.tab").is_file():
        from nltk.tokenize.punkt import PunktTrainer, save_punkt_params

        from evals.core.files import cache_dir
        from evals.setup.books import fetch_austen, read_austen

        trainer = PunktTrainer()
        for text in read_austen(fetch_austen(cache_dir())).values():
            trainer.train(text, finalize=False)
        trainer.finalize_training()
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".english-", dir=target.parent)  # private (0700), as nltk requires
        save_punkt_params(trainer.get_params(), dir=staging)
        try:
            os.rename(staging, target)  # atomic; another process may have won
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    return root


def _punkt_readable(target: Path) -> bool:
    """Whether nltk loads the Punkt model kept in ``target`` (first on nltk's path) as lm-eval will: a truncated
    or emptied table cannot be loaded, or loads empty."""
    from nltk.tokenize.punkt import PunktTokenizer

    try:
        params = PunktTokenizer(target.name)._params
    except Exception:  # nltk raises many types on damaged tables
        return False
    return bool(params.abbrev_types and params.ortho_context)


def haystack_words(data: dict | None = None) -> list[str]:
    """The essay haystack from a rope_ext data config (dict; None: the Austen novels), as lm-eval's
    ``get_haystack("essay")`` makes it from Paul Graham's essays."""
    return list(_haystack_words(_freeze(dict(data)) if data else None))


@cache
def _haystack_words(data: tuple | None) -> tuple[str, ...]:
    from evals.core.config.structured import DataConfig
    from evals.core.inputs.data import load_texts

    fields = dict(data) if data else {"name": "books", "source": "books"}
    fields = {k: (list(v) if isinstance(v, tuple) else v) for k, v in fields.items()}
    cfg = DataConfig(**fields)
    text = " ".join(text for _, text in load_texts(cfg))
    return tuple(re.sub(r"\s+", " ", text).split(" "))


def tokenizer(metadata: dict):
    from evals.lm_eval_tasks.rope_ext_utils import _tokenizer

    return _tokenizer(metadata.get("tokenizer") or metadata.get("pretrained"), metadata.get("gguf_file"))


def _seed(seed: int) -> None:
    import numpy as np

    random.seed(seed)
    np.random.seed(seed)


def _freeze(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


# --- one function per task: lm-eval's generator with our haystack, tokenizer, sample count and seed ------


def generate(task: str, length: int, tok, num_samples: int, seed: int = SEED, data: dict | None = None) -> list[dict]:
    """lm-eval's RULER samples of ``task`` at ``length`` tokens (each ``length`` includes the tokens to
    generate, as in RULER)."""
    if task in NIAH:
        ensure_punkt_tab()
        from lm_eval.tasks.ruler import niah_utils, prepare_niah

        spec = NIAH[task]
        kind = spec["type_haystack"]
        haystack = haystack_words(data) if kind == "essay" else prepare_niah.get_haystack(type_haystack=kind)
        _seed(seed)
        return prepare_niah.generate_samples(
            haystack,
            max_seq_length=length,
            template=niah_utils.TEMPLATE,
            num_samples=num_samples,
            TOKENIZER=tok,
            **spec,
        )
    if task == "vt":
        from lm_eval.tasks.ruler import vt_utils

        _seed(seed)  # vt_utils.get_dataset, with num_samples
        icl_example = vt_utils.sys_vartrack_w_noise_random(
            tokenizer=tok, num_samples=1, max_seq_length=500, incremental=5
        )[0]
        _check_vt_fits(vt_utils, tok, icl_example, length)
        return vt_utils.sys_vartrack_w_noise_random(
            tokenizer=tok, num_samples=num_samples, max_seq_length=length, icl_example=icl_example
        )
    if task == "cwe":
        from lm_eval.tasks.ruler import cwe_utils

        _seed(seed)
        cwe_utils.RNG.seed(seed)  # the module's own generator (list shuffles)
        return cwe_utils.sys_word_pair_random(num_samples=num_samples, max_seq_length=length, tokenizer=tok)
    if task == "fwe":
        from lm_eval.tasks.ruler import fwe_utils

        _seed(seed)
        return fwe_utils.sys_kwext(tokenizer=tok, max_seq_length=length, num_samples=num_samples)
    if task in HUB:
        from lm_eval.tasks.ruler import qa_utils

        qas, docs = qa_utils.read_squad() if task == "qa_squad" else qa_utils.read_hotpotqa()
        _seed(seed)
        return qa_utils.generate_samples(
            tokenizer=tok, docs=docs, qas=qas, max_seq_length=length, num_samples=num_samples, tokens_to_generate=32
        )
    raise ValueError(f"unknown RULER task {task!r}; valid: {', '.join(TASKS)}")


def _check_vt_fits(vt_utils, tok, icl_example: dict, length: int) -> None:
    """lm-eval's vt generator loops forever when its smallest prompt (the one-shot example, built at 500
    tokens, and 10 noise sentences) does not fit ``length``: a ValueError instead. The random state is
    restored, so the samples are those lm-eval would draw."""
    import numpy as np

    state, np_state = random.getstate(), np.random.get_state()
    try:
        example = icl_example["input"] + " " + " ".join(icl_example["outputs"]) + "\n\n"
        smallest, _ = vt_utils.generate_input_output(10, 1, 4)
        needed = len(tok(example).input_ids) + len(tok(smallest).input_ids) + 30
    finally:
        random.setstate(state)
        np.random.set_state(np_state)
    if needed > length:
        raise ValueError(
            f"RULER vt needs at least ~{needed} tokens with this tokenizer (its one-shot example and "
            f"smallest prompt), not {length}: use a longer length"
        )


def ruler_dataset(task: str, **metadata) -> dict:
    """The task's samples at every ``max_seq_lengths`` length, in order of length."""
    tok = tokenizer(metadata)
    lengths = [int(L) for L in metadata.get("max_seq_lengths", [4096])]
    num_samples = int(metadata.get("num_samples", NUM_SAMPLES))
    seed = int(metadata.get("seed", SEED))
    rows = []
    for length in lengths:
        for row in generate(task, length, tok, num_samples, seed, metadata.get("data")):
            rows.append({**row, "task": task})
    import datasets  # imported where used: loading the evals stays fast

    return {"test": datasets.Dataset.from_list(rows, split=datasets.Split.TEST)}


def niah_single_1(**metadata):
    return ruler_dataset("niah_single_1", **metadata)


def niah_single_2(**metadata):
    return ruler_dataset("niah_single_2", **metadata)


def niah_single_3(**metadata):
    return ruler_dataset("niah_single_3", **metadata)


def niah_multikey_1(**metadata):
    return ruler_dataset("niah_multikey_1", **metadata)


def niah_multikey_2(**metadata):
    return ruler_dataset("niah_multikey_2", **metadata)


def niah_multikey_3(**metadata):
    return ruler_dataset("niah_multikey_3", **metadata)


def niah_multivalue(**metadata):
    return ruler_dataset("niah_multivalue", **metadata)


def niah_multiquery(**metadata):
    return ruler_dataset("niah_multiquery", **metadata)


def vt(**metadata):
    return ruler_dataset("vt", **metadata)


def cwe(**metadata):
    return ruler_dataset("cwe", **metadata)


def fwe(**metadata):
    return ruler_dataset("fwe", **metadata)


def qa_squad(**metadata):
    return ruler_dataset("qa_squad", **metadata)


def qa_hotpot(**metadata):
    return ruler_dataset("qa_hotpot", **metadata)


# --- scoring: lm-eval's own ---------------------------------------------------------------------------


def _scored(doc: dict, score: float) -> dict:
    metrics = {str(L): -1.0 for L in LENGTH_METRICS}  # -1: no prompt of this length (ignored when aggregating)
    if int(doc["max_length"]) in LENGTH_METRICS:
        metrics[str(doc["max_length"])] = score
    return {**metrics, "score": score}


def process_results(doc: dict, results: list[str]) -> dict:
    """lm-eval's RULER score (string_match_all: the fraction of the answers found), as ``score`` and under
    the document's length."""
    from lm_eval.tasks.ruler.common_utils import process_results as ruler_process_results

    return _scored(doc, ruler_process_results(doc, results)[str(doc["max_length"])])


def process_results_part(doc: dict, results: list[str]) -> dict:
    """lm-eval's RULER QA score (string_match_part: any of the answers found)."""
    from lm_eval.tasks.ruler.common_utils import process_results_part as ruler_process_results_part

    return _scored(doc, ruler_process_results_part(doc, results)[str(doc["max_length"])])


def aggregate_metrics(values: list[float]) -> float:
    from lm_eval.tasks.ruler.common_utils import aggregate_metrics as ruler_aggregate

    return ruler_aggregate(values)
