"""An answer per serving engine: of a sweep's recommended strategies (ranking.py), the best one each engine
(transformers' config.json, vLLM, SGLang, llama.cpp, and transformers' own server with the strategy in its model
process, :mod:`evals.serve`, which serves every strategy measured) can serve, and how far it is from the overall best.

Whether an engine serves a strategy is :func:`rope_ext.export.export` itself (its :class:`Unsupported` says why
not): the scaling and the model's geometry are rebuilt from what the finished job recorded in results.json
(``config.scaling``, ``config.model``; the model's config read again, no weights), as ``python -m evals.export``
rebuilds them. Where the export says "not verified against <engine> <version> ..." (a model family or method whose
engine code path the tests did not run: Gemma-3, MLA, dual chunk attention, ...), the engine's line says it too.
"""

from __future__ import annotations

import functools
import json

import rope_ext
from rope_ext.export import ENGINES, Unsupported, export, geometry

from ...serve import SERVER
from ..errors import UserError


@functools.lru_cache(maxsize=16)
def _model(model_json: str):
    from omegaconf import OmegaConf

    from ..inputs.models import resolve_model

    return resolve_model(OmegaConf.create(json.loads(model_json)), geometry=True, weights=False)


def setup(config: dict):
    """(scaling, geometry, model config dict) of a finished job from its recorded ``config``: the scaling resolved at
    the model's trained context, as the job resolved it."""
    recorded = dict(config["model"])
    if recorded.get("family"):  # a local checkpoint recorded under its own name: resolved as its preset, as it ran
        recorded["name"] = recorded["family"]
    model = _model(json.dumps(recorded, sort_keys=True))
    scaling_cfg = {k: v for k, v in config["scaling"].items() if k not in ("label", "derived")}
    scaling = rope_ext.resolve(scaling_cfg, model.trained_context)
    return scaling, geometry(model.config, scaling, model.slots, model.trained_context), model.config.to_dict()


def refusal(config: dict, engine: str) -> tuple[str | None, str | None]:
    """(why ``engine`` cannot serve the job's scaling (one line), None where it can; the export's "not verified ..."
    note, None where the tests checked the engine's code path for it -- for transformers' server, how it serves the
    strategy and what checks it)."""
    scaling, geo, model_config = setup(config)
    if engine == SERVER:  # transformers' own server serves every strategy measured (evals.serve): how, said
        from ...serve import route, servable

        return None, servable(route(scaling, geo, model_config)[0])
    try:
        found = export(scaling, geo, engine, model_config)
    except Unsupported as err:
        return str(err), None
    note = found.get("note") or ""
    return None, note if note.startswith("not verified") else None


def per_engine(rows: list[dict], configs: dict[str, dict]) -> list[dict]:
    """For each engine: ``{"engine", "strategy" (None: none can be served), "vs_best" (its ratio to the overall
    best, the ranking's own comparison), "best", "skipped": [(strategy, why), ...], "note" (the export's "not
    verified ..." for the chosen one, else None)}`` over the recommended ``rows``
    in their ranked order; [] where nothing is recommended or a recommended strategy has no recorded config (entries
    that are not results.json)."""
    recommended = [r for r in rows if r["recommended"]]
    if not recommended or any(r["strategy"] not in configs for r in recommended):
        return []
    found = []
    for engine in (*ENGINES, SERVER):
        skipped, chosen, note = [], None, None
        for r in recommended:
            try:
                why, note = refusal(configs[r["strategy"]], engine)
            except (UserError, rope_ext.ScalingError, KeyError, OSError, ValueError) as err:
                # a model config that cannot be read again here (offline, moved): said, and the report goes on
                why, note = f"cannot tell ({type(err).__name__}: {err})", None
            if why is None:
                chosen = r
                break
            skipped.append((r["strategy"], why))
        found.append(
            {
                "engine": engine,
                "strategy": chosen["strategy"] if chosen else None,
                "vs_best": chosen.get("vs_top") if chosen else None,  # against recommended[0], the one named
                "best": recommended[0]["strategy"],
                "skipped": skipped,
                "note": note if chosen else None,
            }
        )
    return found


def engine_line(entry: dict) -> str:
    """``vllm: yarn-factor2, x1.021 [1.004, 1.038] of dca (dca: vLLM runs dual chunk attention on ...)``; ``vllm: dca
    (the best)``; ``vllm: none of the recommended methods can be served by vllm: dca: ...; self_extend: ...``."""
    engine, reasons = entry["engine"], reasons_text(entry["skipped"])
    if entry["strategy"] is None:
        return f"{engine}: none of the recommended methods can be served by {engine}: {reasons}"
    unverified = f"; {entry['note']}" if entry.get("note") else ""
    if not entry["skipped"]:
        return f"{engine}: {entry['strategy']} (the best{unverified})"
    return f"{engine}: {entry['strategy']}, {ratio_text(entry['vs_best'])} of {entry['best']} ({reasons}{unverified})"


def reasons_text(skipped: list[tuple[str, str]]) -> str:
    """``dca: why; self_extend: why``, the strategy named once (the engines' reasons often name it already)."""
    return "; ".join(why if strategy in why else f"{strategy}: {why}" for strategy, why in skipped)


def ratio_text(versus: dict | None) -> str:
    """``x1.021 [1.004, 1.038]`` (the interval simultaneous, as the ranking gives it); ``x?`` without a ratio."""
    if not versus or versus.get("ratio") is None:
        return "x?"
    interval = f" [{versus['low']:.4g}, {versus['high']:.4g}]" if versus.get("low") is not None else ""
    return f"x{versus['ratio']:.4g}{interval}"
