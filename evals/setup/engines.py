"""vLLM's and SGLang's own Python code, fetched at set-up, so the tests check an export against the engines
themselves (``tests/test_engines.py``) rather than against a transcription of them.

Each engine's published wheel (``pip download --no-deps``, the versions in :data:`rope_ext.export.VERIFIED`) is
unpacked once into ``<cache>/engines/<engine>-<version>/src`` -- its ``.py`` files only (SGLang also its JIT
kernel sources, whose folder its import checks for) -- with the few pure-Python or CPU-built packages its import
path needs installed beside it (``deps``, ``pip install --target``, pinned, without dependencies). Nothing is
installed into the environment: the engine code is imported in a separate process with these folders first on
``sys.path`` (``tests/engine_rope.py``), so neither engine's import-time patches reach rope_ext's process.

    python -m evals.setup.engines fetch [vllm] [sglang]   # what `make setup-engines` runs; idempotent
    python -m evals.setup.engines path vllm               # where it is (exit 1 when not fetched)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from rope_ext.export import VERIFIED

from ..core.files import cache_dir

# what each engine's rotary-embedding and config modules import at module level, beyond this project's own
# dependencies (torch, transformers, pydantic, ...): found by importing them on the CPU; pinned as tested
DEPS = {
    "vllm": [
        "cachetools==8.0.2",
        "cbor2==6.3.0",
        "msgspec==0.22.0",
        "openai==3.57.0",
        "openai-harmony==0.0.8",
        "prometheus-client==0.26.0",
        "py-cpuinfo==9.0.0",
        "pybase64==1.5.1",
        "pyzmq==27.3.0",
        "uvloop==0.23.0",
    ],
    "sglang": [
        "apache-tvm-ffi==0.1.11",
        "compressed-tensors==0.20.0",
        "ipython==9.18.1",
        "loguru==0.7.3",
        "msgspec==0.22.0",
        "orjson==3.13.0",
        "pybase64==1.5.1",
        "pyzmq==27.3.0",
        "sentencepiece==0.2.3",
        "starlette==1.10.0",
        "traitlets==5.16.1",
    ],
}
# the files of the wheel kept: the package's Python, and (SGLang) the kernel sources its import path checks for
KEEP = {"vllm": ("vllm/",), "sglang": ("sglang/",)}
EXTRA = {"sglang": ("sglang/kernels/jit/",)}


def home(engine: str) -> Path:
    """``<cache>/engines/<engine>-<version>``: ``src`` (the engine's code) and ``deps``."""
    return cache_dir() / "engines" / f"{engine}-{VERIFIED[engine]}"


def fetched(engine: str) -> Path | None:
    """The engine's folder when its code is fetched, else None."""
    root = home(engine)
    return root if (root / ".done").is_file() else None


def _pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", *args, "-q", "--disable-pip-version-check"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"error: {' '.join(command[2:])} failed: {result.stderr.strip()[-500:]}")


def fetch(engine: str) -> Path:
    """Download the wheel, keep its Python (and SGLang's kernel sources), install the deps; once."""
    root = home(engine)
    if fetched(engine):
        return root
    version = VERIFIED[engine]
    with tempfile.TemporaryDirectory() as tmp:
        _pip("download", "--no-deps", f"{engine}=={version}", "-d", tmp)
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            names = [
                n
                for n in archive.namelist()
                if (n.startswith(KEEP[engine]) and n.endswith(".py")) or n.startswith(EXTRA.get(engine, ("\0",)))
            ]
            archive.extractall(root / "src", names)
    _pip("install", "--no-deps", "--target", str(root / "deps"), *DEPS[engine])
    (root / ".done").write_text(f"{engine}=={version}\n")
    return root


def main(argv: list[str]) -> int:
    command, engines = (argv[0] if argv else "fetch"), argv[1:] or ["vllm", "sglang"]
    unknown = [e for e in engines if e not in DEPS]
    if command not in ("fetch", "path") or unknown:
        print(
            f"usage: python -m evals.setup.engines fetch|path [vllm] [sglang] (got {' '.join(argv)})", file=sys.stderr
        )
        return 2
    for engine in engines:
        root = fetch(engine) if command == "fetch" else fetched(engine)
        if root is None:
            print(f"{engine} {VERIFIED[engine]}: not fetched (python -m evals.setup.engines fetch {engine})")
            return 1
        print(f"{engine} {VERIFIED[engine]}: {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
