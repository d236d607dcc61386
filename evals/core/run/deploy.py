"""A finished job's ``deploy/`` folder: its scaling as each serving engine takes it (:mod:`rope_ext.export`), one
file per engine that can express it, and README.md that opens with the job's verdict and says, engine by engine, where
the settings are or why the engine cannot express them.

The context served is the length the verdict judged (:func:`judged`): the target; where the target was not
evaluated, the largest length beyond the trained context that is yes (and every shorter one); else the target,
unjudged, said. README.md warns whenever that length is not a "yes". The commands name the model the job ran (its
``model.path``, GGUF file or hub id; a placeholder only for random weights or a GGUF nobody converted). Every file says
what was checked and where (``rope_ext.export.CHECKED``: the engine's own code, in rope_ext's tests -- not a run of
this export), the oldest engine it needs (``MINIMUM``) and the transformers each engine version installs
(``ENGINE_TRANSFORMERS``), or "not verified against <engine> <version>" where the tests did not check that case."""

from __future__ import annotations

import json
from pathlib import Path

from rope_ext.export import CHECKED, ENGINE_TRANSFORMERS, ENGINES, MINIMUM, VERIFIED, Unsupported, covered, export
from rope_ext.export.common import ENGINE_VERIFIED_NAMES
from rope_ext.rotary.native import trained_of

from ...serve import FILE as SERVER_FILE, SERVER, command, route, servable
from ..files import atomic_write

FILES = {"transformers": "transformers.json", "vllm": "vllm.sh", "sglang": "sglang.sh", "llama.cpp": "llama.cpp.sh"}
NAMES = {"transformers": "transformers", "vllm": "vLLM", "sglang": "SGLang", "llama.cpp": "llama.cpp"}


def judged(verdict: dict | None) -> tuple[int | None, str, bool]:
    """(the context to serve, one line saying which verdict stands behind it, whether it is a yes) from results.json's
    ``verdict``: the target when it was evaluated; else the largest length beyond the trained context that is yes at
    it and at every shorter one; else the target (None without one), unjudged."""
    verdict = verdict or {}
    target, trained = verdict.get("target"), verdict.get("trained")
    rows = {row["length"]: row for row in verdict.get("lengths") or []}
    ratio = f", {target / trained:g}x the trained {trained}" if target and trained else ""
    if target in rows:
        state, reason = rows[target]["state"], rows[target]["reason"]
        line = f"verdict at the target {target}{ratio}: {state} ({reason})"
        if state == "yes":
            return target, f"{line}; the commands serve {target} tokens.", True
        return (
            target,
            f"WARNING: {line}; the commands serve {target} tokens, a length the verdict did not accept.",
            False,
        )
    yes = None
    for length in sorted(L for L in rows if trained is None or L > trained):
        if rows[length]["state"] != "yes":
            break
        yes = length
    missing = f"the target {target} was not evaluated" if target else "the job has no target length"
    if yes is not None:
        return yes, f"WARNING: {missing}; the verdict is yes up to {yes}, so the commands serve {yes} tokens.", False
    why = (
        f"no evaluated length beyond the trained {trained} is yes"
        if rows
        else "the job has no verdict (nothing it measured is judged)"
    )
    served = f"the target's {target} tokens, unjudged" if target else "what the scaling covers, unjudged"
    return target, f"WARNING: {missing} and {why}: the commands serve {served}.", False


def models_of(model_cfg: dict | None) -> dict:
    """``{"hf": path or hub id, "gguf": a GGUF file, "why": ...}`` the commands name for the job's model (None where
    not known: random weights, a model without GGUF for llama.cpp)."""
    from omegaconf import OmegaConf

    from ..inputs.models import locate

    keys = ("name", "path", "hub_id", "gguf_file", "gguf_parts", "gguf_package", "tokenizer")
    cfg = {**dict.fromkeys(keys), "weights": "pretrained", **(model_cfg or {})}
    if cfg["weights"] == "random":
        return {"hf": None, "gguf": None, "why": "the job ran random weights: MODEL stands for the real checkpoint"}
    try:
        source = locate(OmegaConf.create(cfg))
    except Exception as err:  # noqa: BLE001 -- a moved checkpoint: the commands keep placeholders, said
        return {"hf": None, "gguf": None, "why": f"the job's model cannot be found here ({err}): MODEL stands for it"}
    if source.kind == "gguf":
        gguf = str(Path(source.location) / source.file)
        return {"hf": cfg.get("hub_id"), "gguf": gguf, "why": None}
    hf = str(Path(source.location).resolve()) if source.kind == "path" else source.location
    why = f"llama.cpp needs a GGUF of {hf} (llama.cpp's convert_hf_to_gguf.py): MODEL.gguf stands for it"
    return {"hf": hf, "gguf": None, "why": why}


def versions(engine: str, found: dict) -> str:
    """One line: what was checked and where (or "not verified against ..."), the oldest engine needed and the
    transformers that engine version installs."""
    note = found.get("note") or ""
    models = ENGINE_VERIFIED_NAMES
    checked = (
        note
        if note.startswith("not verified")
        else "checked: " + CHECKED[engine].format(version=VERIFIED[engine], models=models)
    )
    needs = f"needs {MINIMUM[engine]}"
    if engine in ENGINE_TRANSFORMERS:
        needs += f"; {NAMES[engine]} {VERIFIED[engine]} installs {ENGINE_TRANSFORMERS[engine]}"
    return f"{checked}; {needs}"


def render(engine: str, found: dict) -> str:
    """What the engine's file holds: config.json keys (transformers; the versions under ``rope_ext_versions``, a key
    transformers keeps and ignores), else the command line with the versions, llama-cpp-python's arguments and
    notes as comments above it."""
    if engine == "transformers":
        return json.dumps({**found["config"], "rope_ext_versions": versions(engine, found)}, indent=2) + "\n"
    lines = [f"# {versions(engine, found)}"]
    if found.get("note") and not found["note"].startswith("not verified"):
        lines.append(f"# {found['note']}")
    if found.get("model_note"):
        lines.append(f"# {found['model_note']}")
    if found.get("llama_cpp_python"):
        lines.append("# llama_cpp.Llama(model_path=..., **" + json.dumps(found["llama_cpp_python"]) + ")")
    return "\n".join([*lines, found["command"]]) + "\n"


def export_for(scaling, geo, engine: str, model_config: dict, context: int | None, models: dict) -> dict:
    """:func:`rope_ext.export.export` with the job's model named in the command (``model_note`` where a placeholder
    stays)."""
    model = models.get("gguf") if engine == "llama.cpp" else models.get("hf")
    found = export(scaling, geo, engine, model_config, context, model)
    if engine != "transformers" and model is None and models.get("why"):
        found["model_note"] = models["why"]
    return found


def results_of(out: Path) -> dict:
    try:
        return json.loads((Path(out) / "results.json").read_text())
    except (OSError, ValueError):
        return {}


def write_deploy(scaling, geo, model_config: dict, out: Path, results: dict | None = None) -> list[Path]:
    """``out/deploy/``: a file per engine that can express the scaling at the length the verdict judged, README.md
    opening with that verdict; ``results`` is the job's results.json (read from ``out`` when not given)."""
    results = results if results is not None else results_of(out)
    context, said, _ = judged(results.get("verdict"))
    models = models_of((results.get("config") or {}).get("model"))
    deploy = Path(out) / "deploy"
    deploy.mkdir(parents=True, exist_ok=True)
    title = f"# Deploying {scaling.label} on {geo.model_type} (trained context {geo.trained})"
    written, readme = [], [said, "", title, ""]
    for engine in ENGINES:
        try:
            found = export_for(scaling, geo, engine, model_config, context, models)
        except Unsupported as err:
            readme.append(f"- {engine}: cannot express it ({engine} {VERIFIED[engine]}): {err}")
            continue
        path = deploy / FILES[engine]
        atomic_write(path, render(engine, found))
        written.append(path)
        serves = f", serves {found['context']} tokens" if found.get("context") else ""
        readme.append(
            f"- {engine}: {path.name}"
            + (" (the keys to set in config.json)" if engine == "transformers" else serves)
            + f"; {versions(engine, found)}"
        )
    written.append(write_server(scaling, geo, model_config, context, models, results, deploy, readme))
    atomic_write(deploy / "README.md", "\n".join(readme) + "\n")
    return [*written, deploy / "README.md"]


def write_server(scaling, geo, model_config: dict, context, models: dict, results: dict, deploy: Path, readme: list):
    """deploy/transformers-serve.sh: transformers' own server with the measured strategy in its model process
    (:mod:`evals.serve`: the exported config.json, or rope_ext's patch where no config expresses it); its line in
    README.md."""
    trained = trained_of(scaling, geo)
    served = context or (covered(scaling, trained) if scaling.factor else None)
    model_cfg = (results.get("config") or {}).get("model")
    how, _ = route(scaling, geo, model_config, served)
    lines = [f"# {servable(how)}"]
    if not (models.get("hf") or models.get("gguf")) and models.get("why"):
        lines.append(f"# {models['why']}")
    if served is None:
        lines.append("# CONTEXT: the job judged no length; give the context to serve")
    path = deploy / SERVER_FILE
    atomic_write(path, "\n".join([*lines, command(scaling, models, trained, served or "CONTEXT", model_cfg)]) + "\n")
    serves = f", serves {served} tokens" if served else ""
    readme.append(f"- {SERVER}: {path.name}{serves}; {servable(how)}")
    return path
