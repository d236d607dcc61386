"""``python -m evals.setup.books export DIR``: the bundled Austen novels written as UTF-8 text files, read back by
``data=text_files`` as the same six documents (names, characters) that ``data=books`` reads from R's database; bad
input is one line, exit 2, before anything is written. Nothing of the text is kept here: it is exported into a
temporary directory from the fetched cache."""

import os
import subprocess
import sys

import pytest

from evals.core.config.structured import AUSTEN_BOOKS
from evals.core.files import cache_dir
from evals.core.inputs.data import load_texts
from evals.setup.books import AUSTEN_DATA, read_austen
from tests.test_files import _unprivileged
from tests.tiny import ROOT, TINY


def _export(directory, cache=None, prefix=()):
    env = {**os.environ, **({"ROPE_EXT_CACHE": str(cache)} if cache is not None else {})}
    command = [*prefix, sys.executable, "-m", "evals.setup.books", "export", str(directory)]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def novels():
    data_dir = cache_dir() / AUSTEN_DATA
    if not (data_dir / "Rdata.rdb").is_file():
        pytest.skip("the books are not fetched (python -m evals.setup.books fetch)")
    return read_austen(data_dir)


def test_the_exported_novels_are_the_documents_of_a_text_files_job(tmp_path, novels, run_job, compose):
    out = tmp_path / "austen"
    result = _export(out)
    assert result.returncode == 0 and result.stderr == "", result.stderr[-2000:]
    files = sorted(out.iterdir())
    assert [p.name for p in files] == sorted(f"{name}.txt" for name in AUSTEN_BOOKS)
    for path in files:  # UTF-8, exactly the text data=books reads
        assert path.read_bytes().decode("utf-8") == novels[path.stem]
    overrides = ("data=text_files", f"data.glob={out / '*.txt'}", "eval.lengths=[128]", "eval.documents=null")
    texts = load_texts(compose(*TINY, *overrides).data)
    assert {name: len(text) for name, text in texts} == {name: len(novels[name]) for name in AUSTEN_BOOKS}
    _, results = run_job(tmp_path / "run", *overrides)
    assert results["status"] == "done"
    assert sorted(results["identity"]["data"]["content"]) == [str(p.resolve()) for p in files]
    perplexity = results["metrics"]["perplexity"]
    assert perplexity["excluded_documents"] == [] and perplexity["by_length"][0]["documents"] == len(AUSTEN_BOOKS)


def test_bad_export_input_is_one_line_and_writes_nothing(tmp_path, novels):
    full = tmp_path / "full"
    full.mkdir()
    (full / "mine.txt").write_text("my own text")
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    cases = [
        (full, {}, f"error: {full} is not empty; export into a new or empty directory (nothing is overwritten)"),
        (afile / "out", {}, f"error: {afile / 'out'} cannot be written: {afile} is a file, not a directory"),
        (locked / "out", {"prefix": _unprivileged()}, f"error: {locked / 'out'} cannot be written: {locked} is not"),
        (
            tmp_path / "new",
            {"cache": tmp_path / "empty_cache"},
            "error: the books are not fetched yet (no ",
        ),
    ]
    for directory, options, said in cases:
        result = _export(directory, **options)
        assert result.returncode == 2 and result.stdout == "", (directory, result.stdout, result.stderr[-2000:])
        assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(said), result.stderr
    assert "run `python -m evals.setup.books fetch` first" in result.stderr
    assert [p.name for p in full.iterdir()] == ["mine.txt"] and not (tmp_path / "new").exists()
    assert not any(locked.iterdir())


def test_documents_under_data_min_tokens_are_named_in_one_note(tmp_path, compose, capfd):
    from evals.core.inputs.data import load_documents
    from evals.core.inputs.loading import bundled_tokenizer

    (tmp_path / "long.txt").write_text("It is a truth universally acknowledged. " * 40)
    (tmp_path / "short.txt").write_text("A short one.")
    data = compose(*TINY, "data=text_files", f"data.glob={tmp_path / '*.txt'}", "data.min_tokens=50").data
    data.cache_dir = str(tmp_path / "cache")
    documents = load_documents(data, bundled_tokenizer())
    assert [d.name for d in documents] == ["long"]
    said = [line for line in capfd.readouterr().err.splitlines() if "data.min_tokens" in line]
    assert said == ["note: data.min_tokens=50: 1 shorter documents not used: short (4 tokens)"], said
