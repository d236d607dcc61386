"""A finished job's ``deploy/`` folder: its scaling as each serving engine takes it (:mod:`rope_ext.export`), one
file per engine that can express it, and README.md saying, engine by engine, where it is or why it cannot be. Every
file names the engine version it was verified against and the oldest it needs (``rope_ext.export.VERIFIED`` and
``MINIMUM``), or says "not verified against <engine> <version>" where the tests did not check that case."""

from __future__ import annotations

import json
from pathlib import Path

from rope_ext.export import ENGINES, MINIMUM, VERIFIED, Unsupported, export

from ..files import atomic_write

FILES = {"transformers": "transformers.json", "vllm": "vllm.sh", "sglang": "sglang.sh", "llama.cpp": "llama.cpp.sh"}


def versions(engine: str, found: dict) -> str:
    """One line: the version the export was verified against (or "not verified against ...") and the oldest needed."""
    note = found.get("note") or ""
    name = {"vllm": "vLLM ", "sglang": "SGLang ", "transformers": "transformers "}.get(engine, "")
    checked = note if note.startswith("not verified") else f"verified against {name}{VERIFIED[engine]}"
    return f"{checked}; needs {MINIMUM[engine]}"


def render(engine: str, found: dict) -> str:
    """What the engine's file holds: config.json keys (transformers; the versions under ``rope_ext_versions``, a key
    transformers keeps and ignores), else the command line with the versions, llama-cpp-python's arguments and
    notes as comments above it."""
    if engine == "transformers":
        return json.dumps({**found["config"], "rope_ext_versions": versions(engine, found)}, indent=2) + "\n"
    lines = [f"# {versions(engine, found)}"]
    if found.get("note") and not found["note"].startswith("not verified"):
        lines.append(f"# {found['note']}")
    if found.get("llama_cpp_python"):
        lines.append("# llama_cpp.Llama(model_path=..., **" + json.dumps(found["llama_cpp_python"]) + ")")
    return "\n".join([*lines, found["command"]]) + "\n"


def write_deploy(scaling, geo, model_config: dict, out: Path) -> list[Path]:
    """``out/deploy/``: a file per engine that can express the scaling, README.md with every engine's line."""
    deploy = Path(out) / "deploy"
    deploy.mkdir(parents=True, exist_ok=True)
    written, readme = [], [f"# Deploying {scaling.label} on {geo.model_type} (trained context {geo.trained})", ""]
    for engine in ENGINES:
        try:
            found = export(scaling, geo, engine, model_config)
        except Unsupported as err:
            readme.append(f"- {engine}: cannot express it ({engine} {VERIFIED[engine]}): {err}")
            continue
        path = deploy / FILES[engine]
        atomic_write(path, render(engine, found))
        written.append(path)
        readme.append(
            f"- {engine}: {path.name}"
            + (" (the keys to set in config.json)" if engine == "transformers" else "")
            + f"; {versions(engine, found)}"
        )
    atomic_write(deploy / "README.md", "\n".join(readme) + "\n")
    return [*written, deploy / "README.md"]
