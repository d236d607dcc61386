"""Data and scoring for rope_ext's lm-eval tasks (used through ``!function`` from the YAMLs here).

The tasks build their data offline: passkey and needle prompts with rope_ext's prompt builder
(evals/tasks/retrieval/haystack.py) and the wording of ``conf/eval/{passkey,needle}.yaml``, sized by the tokenizer
named in the metadata (``tokenizer``, else the model's ``pretrained``, else the bundled SmolLM2
tokenizer); the books task reads the Austen novels fetched at set-up. Lengths come from
``metadata.max_seq_lengths`` (lm-eval/RULER style).
"""

from __future__ import annotations

import re
from dataclasses import replace


LENGTH_METRICS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def _tokenizer(name: str | None, gguf_file: str | None):
    """The tokenizer the metadata names (None: the bundled SmolLM2 one), from rope_ext's one tokenizer cache:
    inside a rope_ext job it is the job's own tokenizer object."""
    from evals.core.inputs.loading import tokenizer_of

    return tokenizer_of(name, **({"gguf_file": gguf_file} if gguf_file else {}))


def _retrieval_docs(task: str, overrides: dict, **metadata) -> dict:
    from evals.core.config.structured import DataConfig
    from evals.core.inputs.data import load_documents
    from evals.tasks.retrieval.haystack import PromptBuilder, haystack_ids
    from evals.tasks.retrieval import RetrievalConfig

    tokenizer = _tokenizer(metadata.get("tokenizer") or metadata.get("pretrained"), metadata.get("gguf_file"))
    lengths = [int(L) for L in metadata.get("max_seq_lengths", [1024, 4096])]
    grid = {
        "lengths": lengths,
        "depths": metadata.get("depths", [0.1, 0.5, 0.9]),
        "trials": int(metadata.get("trials", 2)),
    }
    cfg = replace(RetrievalConfig(), **overrides, **grid)
    documents = []
    if cfg.haystack == "corpus":
        books = DataConfig(name="books", source="books", books=[metadata.get("book", "persuasion")])
        documents = load_documents(books, tokenizer)
    builder = PromptBuilder(cfg, tokenizer, haystack_ids(cfg, tokenizer, documents))
    rows = []
    for length in lengths:
        for depth in cfg.depths:
            for trial in range(cfg.trials):
                prompt = builder.build(length, depth, trial)
                rows.append(
                    {
                        "input": tokenizer.decode(prompt.ids, skip_special_tokens=True),
                        "outputs": prompt.keys,
                        "length": length,
                        "depth": depth,
                        "task": task,
                    }
                )
    import datasets  # imported where used: loading the evals stays fast

    return {"test": datasets.Dataset.from_list(rows)}


def _eval_option(name: str) -> dict:
    """The fields of rope_ext's ``conf/eval/<name>.yaml``, so the task asks what ``python run.py eval=<name>`` asks."""
    from omegaconf import OmegaConf

    from evals.core.config.store import config_dir

    option = OmegaConf.to_container(OmegaConf.load(config_dir() / "eval" / f"{name}.yaml"))
    option.pop("defaults", None)
    return option


def passkey_dataset(**metadata) -> dict:
    return _retrieval_docs("passkey", _eval_option("passkey"), **metadata)


def needle_dataset(**metadata) -> dict:
    return _retrieval_docs("needle", _eval_option("needle"), **metadata)


def process_retrieval(doc: dict, results: list[str]) -> dict:
    """1 if every key appears in the generation; reported under the prompt's length and as ``acc``."""
    found = all(key in results[0] for key in doc["outputs"])
    scores = {str(L): -1.0 for L in LENGTH_METRICS}  # -1: no prompt of this length (ignored when aggregating)
    scores[str(doc["length"])] = float(found)
    return {**scores, "acc": float(found)}


def aggregate_scores(values: list[float]) -> float:
    present = [v for v in values if v != -1.0]
    return sum(present) / len(present) if present else -1.0


def books_dataset(**metadata) -> dict:
    """The Austen novels, each cut to ``max_chars`` characters at a line end (default 60000, ~15k tokens)."""
    from evals.core.files import cache_dir
    from evals.core.config.structured import AUSTEN_BOOKS
    from evals.setup.books import fetch_austen, read_austen

    novels = read_austen(fetch_austen(cache_dir()))
    max_chars = int(metadata.get("max_chars", 60000))
    rows = []
    for name in metadata.get("books", list(AUSTEN_BOOKS)):
        text = novels[name][:max_chars]
        rows.append({"title": name, "text": text[: text.rfind("\n") + 1] or text})
    import datasets  # imported where used: loading the evals stays fast

    return {"test": datasets.Dataset.from_list(rows)}


def process_books(doc: dict, results: list) -> dict:
    (loglikelihood,) = results
    words, size = len(re.split(r"\s+", doc["text"])), len(doc["text"].encode("utf-8"))
    return {
        "word_perplexity": (loglikelihood, words),
        "byte_perplexity": (loglikelihood, size),
        "bits_per_byte": (loglikelihood, size),
    }
