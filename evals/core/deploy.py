"""A finished job's ``deploy/`` folder: its scaling as each serving engine takes it (:mod:`rope_ext.export`), one
file per engine that can express it, and README.md saying, engine by engine, where it is or why it cannot be."""

from __future__ import annotations

import json
from pathlib import Path

from rope_ext.export import ENGINES, Unsupported, export

from .files import atomic_write

FILES = {"transformers": "transformers.json", "vllm": "vllm.sh", "sglang": "sglang.sh", "llama.cpp": "llama.cpp.sh"}


def render(engine: str, found: dict) -> str:
    """What the engine's file holds: config.json keys (transformers), else the command line (llama-cpp-python's
    arguments and notes as comments above it)."""
    if engine == "transformers":
        return json.dumps(found["config"], indent=2) + "\n"
    lines = [found["command"]]
    if found.get("llama_cpp_python"):
        lines.insert(0, "# llama_cpp.Llama(model_path=..., **" + json.dumps(found["llama_cpp_python"]) + ")")
    if found.get("note"):
        lines.insert(0, f"# {found['note']}")
    return "\n".join(lines) + "\n"


def write_deploy(scaling, geo, model_config: dict, out: Path) -> list[Path]:
    """``out/deploy/``: a file per engine that can express the scaling, README.md with every engine's line."""
    deploy = Path(out) / "deploy"
    deploy.mkdir(parents=True, exist_ok=True)
    written, readme = [], [f"# Deploying {scaling.label} on {geo.model_type} (trained context {geo.trained})", ""]
    for engine in ENGINES:
        try:
            found = export(scaling, geo, engine, model_config)
        except Unsupported as err:
            readme.append(f"- {engine}: cannot express it: {err}")
            continue
        path = deploy / FILES[engine]
        atomic_write(path, render(engine, found))
        written.append(path)
        readme.append(
            f"- {engine}: {path.name}" + (" (the keys to set in config.json)" if engine == "transformers" else "")
        )
    atomic_write(deploy / "README.md", "\n".join(readme) + "\n")
    return [*written, deploy / "README.md"]
