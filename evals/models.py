"""``python -m evals.models MODEL``: before any long run, which frequency strategies apply to a checkpoint and how.

MODEL is a local checkpoint directory, a Hub id already in the local cache, or a transformers model type (a tiny
config of it). Printed: the rotary slots rope_ext found (rotary dim, base, layer type), the trained context and
the shipped scaling it reads (:func:`rope_ext.trained_context`, :func:`rope_ext.shipped_parameters`), what each
frequency strategy (every one the registry holds) does with the shipped scaling (:func:`rope_ext.inherit_shipped`:
inherits or replaces), what each also sets on the attention modules (MLA's softmax scale: :func:`softmax_scale_lines`), in how many attention layers the query-scaling and attention-level methods act or why they are
refused (:func:`attention_lines`), and the family's line of docs/models.md (the compatibility suite,
tests/test_families.py). Bad input: one line, exit 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

import rope_ext


def _config(name: str):
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if name in CONFIG_MAPPING:
        from evals.families import config

        return config(name)
    try:
        return AutoConfig.from_pretrained(name, local_files_only=True)
    except Exception as err:
        raise SystemExit(
            f"evals.models: {name!r} is neither a checkpoint directory or cached Hub id with a config.json nor a "
            f"transformers model type ({type(err).__name__}); give e.g. a path, or llama"
        ) from None


KINDS = (
    "frequencies",
    "query",
    "attention",
)  # rope_ext.strategies.registry: how each kind of strategy reaches the model


def attention_lines(model, query: list[str], attention: list[str]) -> list[str]:
    """What the strategies that act inside attention (``query``: a factor on the query; ``attention``: the relative
    positions each pair sees) do on ``model`` (a meta instance): a forward with rope_ext's attention hook attached
    (:func:`rope_ext.probe`) finds the layers that call transformers' attention interface and those that receive the
    rotation the attention-level methods re-rotate (the check a run makes before it loads the weights)."""
    try:
        found = rope_ext.probe(model)
    except Exception as err:  # AttentionHookError, or a forward the meta device cannot run: said, never raised
        why = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        return [f"  {', '.join(query + attention)}: refused: {why}"]
    lines = [f"  {', '.join(query)}: query scaled in the {len(found.called)} attention layers that call the interface"]
    refusal = found.attention_refusal()  # the check a run makes before it loads the weights
    if refusal:
        lines.append(f"  {', '.join(attention)}: refused: {refusal}")
    else:
        lines.append(
            f"  {', '.join(attention)}: attention re-assembled in {len(found.with_rotation)} of "
            f"{len(found.called)} attention layers (those that receive the rotation)"
        )
    return lines


def softmax_scale_lines(model, strategies: list[str], slots, trained: int, every) -> list[str]:
    """What each frequency strategy (at its default parameters) also sets on the attention modules of ``model`` (a
    meta instance): the build-time constants transformers derives from the rope parameters, such as multi-head latent
    attention's softmax scale (:mod:`rope_ext.rotary.softmax_scale`); strategies with the same effect share a line.
    ``slots``: the scaled ones of ``every`` slot of the model."""
    from rope_ext.rotary.softmax_scale import describe, native_changes

    said: dict[str, list[str]] = {}
    rotaries = [s.module(model) for s in slots]
    for strategy in strategies:
        try:
            scaling, _ = rope_ext.inherit_shipped({"name": strategy}, model.config)
            changes = native_changes(model, rope_ext.resolve(scaling, trained), slots, rotaries, every=every)
        except Exception:  # a strategy that needs parameters (compose's stages): nothing to say at its defaults
            continue
        line = describe(changes)
        if line:
            said.setdefault(line, []).append(strategy)
    return [f"  {', '.join(names)}: {line}" for line, names in said.items()]


def _ships(shipped: dict) -> str:
    """``ships yarn x32.0``; ``ships proportional`` for a shipped RoPE without a factor."""
    factor = shipped.get("factor")
    return f"ships {shipped.get('rope_type')}" + (f" x{factor}" if factor is not None else "")


def describe(name: str) -> list[str]:
    import torch
    from transformers import AutoModelForCausalLM

    config = _config(name)
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        slots = rope_ext.find_rotary_slots(model)
    except rope_ext.ScalingError as err:
        return [f"{name}: refused: {err}"]
    except Exception as err:
        return [f"{name}: refused: transformers cannot build it as a causal LM ({type(err).__name__}: {err})"[:300]]
    trained = rope_ext.trained_context(config)
    shipped = rope_ext.shipped_parameters(config)
    lines = [
        f"{name} ({config.model_type}): trained context {trained}; {_ships(shipped) if shipped else 'plain RoPE'}",
        *(
            f"  rotary {s.module_name} {s.layer_type or ''}: dim {s.dim}, base {s.base:g}"
            + (f" (sin/cos table {s.table}, {s.rows} rows)" if s.table else "")
            for s in slots
        ),
    ]
    kinds = {kind: sorted(n for n, s in rope_ext.STRATEGIES.items() if s.kind == kind) for kind in KINDS}
    chosen = rope_ext.select_slots(slots, "auto")  # the default layer_types (sliding-window layers left alone)
    where = ", ".join(f"{s.module_name}{' ' + s.layer_type if s.layer_type else ''}" for s in chosen)
    frequency = [n for n in kinds["frequencies"] if n != "none"]
    lines.append(f"  {', '.join(frequency)}: patched on {where} (scaling.layer_types=auto; =all for every slot)")
    for strategy in frequency:
        _, said = rope_ext.inherit_shipped({"name": strategy}, config)
        if said:
            lines.append(f"  {said}")
    lines += softmax_scale_lines(model, frequency, chosen, trained, slots)
    lines += attention_lines(model, kinds["query"], kinds["attention"])
    docs = Path(__file__).resolve().parent.parent / "docs" / "models.md"
    row = (
        next((r for r in docs.read_text().splitlines() if r.startswith(f"| {config.model_type} |")), None)
        if docs.is_file()
        else None
    )
    lines.append(f"  compatibility suite (docs/models.md): {row or 'this family is not in the suite'}")
    return lines


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print(
            "usage: python -m evals.models MODEL (a checkpoint directory, a cached Hub id or a model type)",
            file=sys.stderr,
        )
        return 2
    try:
        print("\n".join(describe(argv[0])))
    except SystemExit as err:
        print(err, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
