"""Every RoPE family of the installed transformers, as a tiny random model, and what rope_ext does on each.

:func:`rotary_families` enumerates transformers' own causal-LM registry (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``)
and keeps the model types whose modeling code uses rotary position embeddings; :func:`build` makes a tiny
random-weight model of one (the sizes of :mod:`evals.family_sizes`; the few that need other arguments get them from its SPECIAL,
the one table of them; one layer of each kind a hybrid's full-size ``layer_types`` mixes, so the layers that use the
rotary are in it; no parameter left all zeros). :func:`cell` judges one family x frequency strategy, the strategies transformers implements
natively (:data:`NATIVE`: linear/PI, dynamic NTK, YaRN, Llama-3, LongRoPE): rope_ext's patch on the plain model
against the same weights natively configured through ``rope_parameters`` -- "exact" when the logits agree to 1e-5;
"supported" where transformers has no native path for that family (its rotary or config rejects it) and the patch is
verified by rope_ext itself (each rotary's cos/sin equal the strategy's frequencies, rope_ext.rotary.output) and
moves the logits -- and, on a family with no ``rope_parameters`` at all (GPT-J, CodeGen: a sin/cos table rotary,
rope_ext.rotary.tables), the patched logits equal the same weights with the table built here from transformers' own
frequencies for the strategy (``ROPE_INIT_FUNCTIONS``, :func:`_table_reference`) to 1e-5; "refused" with rope_ext's
one-line reason. The unpatched model runs under rope_ext's ``none`` (a table rotary's table grown past its end with
its own RoPE; nothing changes on the others), so every family is compared at the same length. The compatibility suite (tests/test_families.py) runs
every cell and writes docs/models.md from them (:mod:`evals.family_table`).
"""

from __future__ import annotations

import re
import time
from functools import lru_cache
from importlib.util import find_spec

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.configuration_auto import model_type_to_module_name
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

import rope_ext

from .family_sizes import LENGTH, TRAINED, VOCAB, config_arguments, layer_kinds, tiny_sizes


# cells where transformers' native computation is one rope_ext does not imitate: status "differs", the reason said
NOT_IMITATED: dict[tuple[str, str], str] = {
    ("mimo_v2_flash", "dynamic"): "transformers' dynamic NTK raises the base by s^(d/(d-2)) at the odd rotary dim "
    "d = int(16 * 0.334) = 5 of this tiny config, so the slowest of its 3 pairs is interpolated by s^(4/3); rope_ext's "
    "by s, as NTK intends (d = 2 * 3 pairs; MiMo-V2-Flash's own 192-wide head gives an even 64, where they agree)",
}


@lru_cache(maxsize=1)
def rotary_families() -> tuple[str, ...]:
    """Every causal-LM model type of the installed transformers whose modeling code applies rotary embeddings."""
    found = []
    for model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        module = model_type_to_module_name(model_type)
        spec = find_spec(f"transformers.models.{module}.modeling_{module}")
        if spec is None or spec.origin is None:
            continue
        with open(spec.origin, encoding="utf-8") as source:
            if re.search(r"RotaryEmbedding|rotary_emb|apply_rotary|rotary_dim", source.read()):
                found.append(model_type)
    return tuple(sorted(found))


def config(model_type: str, rope_parameters: dict | None = None, trained: int | None = None, subs: dict | None = None):
    """The tiny config of ``model_type`` (its text config carries the rope parameters). Where the family's full-size
    config mixes kinds of layer (``layer_types``: full/sliding/linear attention, ...) that its first two layers do
    not show (a hybrid's attention layer comes every 4th or 6th), the tiny model has one layer of each kind, so the
    layers that use the rotary are in it. With ``trained`` (the survey's models), a trained context the rope parameters
    declare (``original_max_position_embeddings``, a shipped scaling's) is that one, as everywhere else in the tiny
    model (Ministral-3's Llama-4 query temperature starts there); without, the family's own is kept. ``subs``: the
    rope parameters of sub-configs other than the text config whose own rotaries read them (BLT's patcher, byte
    encoder and decoder, global transformer: :func:`_sub_parameters`), by the sub-config's name."""
    sizes = tiny_sizes(model_type)
    cfg = AutoConfig.for_model(model_type, **config_arguments(model_type, sizes))
    kinds = layer_kinds(model_type)
    if kinds and not set(kinds) <= set(getattr(cfg, "layer_types", None) or ()) and "layer_types" not in sizes:
        layers = max(len(kinds), sizes["num_hidden_layers"])
        kinds = (*kinds, *[kinds[-1]] * (layers - len(kinds)))
        more = {**sizes, "num_hidden_layers": layers, "layer_types": list(kinds)}
        cfg = AutoConfig.for_model(model_type, **config_arguments(model_type, more))
    text = cfg.get_text_config()
    own = getattr(text, "rope_parameters", None)
    for params in [own, *own.values()] if isinstance(own, dict) and trained else []:
        if isinstance(params, dict) and params.get("original_max_position_embeddings"):
            params["original_max_position_embeddings"] = trained
    if rope_parameters is not None:
        text.rope_parameters = rope_parameters
    for name, params in (subs or {}).items():
        getattr(cfg, name).rope_parameters = params
    cfg._attn_implementation = "eager"
    return cfg


# a tiny model has ~0.1M; a hybrid or MoE one a few M (Qwen4-exp 3.3M) and builds in well under a second; past 20M a
# sub-config keeps its default sizes (BLT's patcher: 96M), and the build takes seconds more for nothing checked
MAX_PARAMETERS = 20_000_000


class NotTiny(ValueError):
    """A family whose config does not shrink to the tiny sizes."""


def build(model_type: str, rope_parameters: dict | None = None, seed: int = 0, subs: dict | None = None):
    cfg = config(model_type, rope_parameters, TRAINED, subs)
    with torch.device("meta"):  # its size first, without allocating
        size = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())
    if size > MAX_PARAMETERS:
        raise NotTiny(f"{size / 1e6:.0f}M parameters at the tiny sizes (a sub-config keeps its default sizes)")
    torch.manual_seed(seed)
    return switched_on(AutoModelForCausalLM.from_config(config(model_type, rope_parameters, TRAINED, subs)).eval())


def switched_on(model):
    """``model`` with every parameter left all zeros (ZAYA's key temperature: every key 0, attention blind to
    position) drawn as the weights are (N(0, initializer_range)): no path of a tiny random model is switched off."""
    std = getattr(model.config.get_text_config(), "initializer_range", None) or 0.02
    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point() and param.numel() and not param.any():
                param.normal_(0.0, std)
    return model


def ids() -> torch.Tensor:
    return (torch.arange(LENGTH)[None] * 7 + 3) % VOCAB


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids(), use_cache=False).logits.float()


def plain_logits(model) -> torch.Tensor:
    """The unpatched model's logits under rope_ext's ``none``: a sin/cos table rotary's table (it ends at the trained
    context) grown with its own RoPE; no other model changes."""
    with rope_ext.patch(model, {"name": "none"}, TRAINED):
        return logits(model)


def _long_factors(pairs: int) -> list[float]:
    return [1.0 + 3.0 * i / max(pairs - 1, 1) for i in range(pairs)]  # 1 (fastest pair) .. 4 (slowest)


# strategy -> (rope_ext's setting, transformers' native rope_parameters for the same), given d/2 of the rotary
NATIVE = {
    "linear": (lambda n: {"name": "linear", "factor": 2}, lambda n: {"rope_type": "linear", "factor": 2.0}),
    "dynamic": (
        lambda n: {"name": "dynamic_ntk", "factor": 2},
        lambda n: {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": TRAINED},
    ),
    "yarn": (
        lambda n: {"name": "yarn", "factor": 4},
        lambda n: {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": TRAINED},
    ),
    # DeepSeek's split YaRN temperature: cos/sin x mscale(s, mscale) / mscale(s, mscale_all_dim), and MLA families
    # (DeepSeek-V2/V3, GLM-4-MoE-Lite, MiniCPM3, ...) build their softmax scale x mscale(s, mscale_all_dim)^2
    # (rope_ext.rotary.softmax_scale): the patch must set both
    "yarn_mscale": (
        lambda n: {"name": "yarn", "factor": 4, "mscale": 1.0, "mscale_all_dim": 1.0},
        lambda n: {
            "rope_type": "yarn",
            "factor": 4.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": TRAINED,
        },
    ),
    "llama3": (
        lambda n: {"name": "llama3", "factor": 4},
        lambda n: {
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": TRAINED,
        },
    ),
    "longrope": (
        lambda n: {"name": "longrope", "short_factor": [1.0] * n, "long_factor": _long_factors(n), "factor": 4},
        lambda n: {
            "rope_type": "longrope",
            "short_factor": [1.0] * n,
            "long_factor": _long_factors(n),
            "factor": 4.0,
            "original_max_position_embeddings": TRAINED,
        },
    ),
}


def _native_parameters(own: dict, native: dict, scaled_types: set) -> dict:
    """The model's rope_parameters with the native strategy in the scaled layer types (nested per layer type where
    the model keeps them so, a layer type's None -- no RoPE -- kept), its other keys (rope_theta,
    partial_rotary_factor) kept."""
    per_type = own and all(v is None or isinstance(v, dict) for v in own.values()) and any(own.values())
    if not per_type:
        return {**own, **native}
    # None: a layer type without RoPE (Beam's NoPE full-attention layers), kept so
    return {t: ({**v, **native} if t in scaled_types else v and dict(v)) for t, v in own.items()}


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {text}"[:240]


def cell(model_type: str, strategy: str, plain=None, before=None, check_restore: bool = True) -> dict:
    """One family x strategy: ``{"status": exact|supported|differs|refused|mismatch|silent|not restored, "detail":
    ...}`` (differs: a gap :data:`NOT_IMITATED` explains)."""
    plain = plain if plain is not None else build(model_type)
    before = before if before is not None else plain_logits(plain)
    slots = rope_ext.find_rotary_slots(plain)
    ours, theirs = NATIVE[strategy]
    setting = ours(slots[0].dim // 2)
    held = {s: s.frequencies(plain)[0].detach().clone() for s in slots}  # what the model holds, before the patch
    try:
        patch = rope_ext.patch(plain, setting, TRAINED)
    except rope_ext.ScalingError as err:
        return {"status": "refused", "detail": _one_line(err)}
    try:
        patched = logits(plain)
        scaled = {s.layer_type for s in patch.slots}
        subs = _sub_parameters(plain, patch.slots)
        now = {s: tuple(s.frequencies(plain)) for s in patch.slots}  # dynamic ones: at this length
    finally:
        patch.restore()
    if check_restore and not torch.equal(plain_logits(plain), before):
        return {"status": "not restored", "detail": "the logits after restore() differ from the plain model's"}
    moved = float((patched - before).abs().max())
    if not moved > 1e-6:  # tiny random models move little; a silent patch moves nothing
        return {"status": "silent", "detail": f"the logits moved by {moved:.1e} only"}
    if not hasattr(plain.config.get_text_config(), "rope_parameters"):  # no native RoPE parameters at all
        gap = float((patched - _table_reference(model_type, plain, slots, theirs(slots[0].dim // 2))).abs().max())
        if gap > 1e-5:
            return {"status": "mismatch", "detail": f"patched vs the table of transformers' {strategy}: gap {gap:.1e}"}
        return {
            "status": "supported",
            "detail": f"no rope_parameters in transformers here; the patched logits equal the sin/cos table built from "
            f"transformers' own {strategy} frequencies (max logit gap {gap:.0e})",
        }
    own = dict(plain.config.get_text_config().rope_parameters or {})
    try:
        wanted = theirs(slots[0].dim // 2)
        subs = {name: _native_parameters(params, wanted, scaled) for name, params in subs.items()}
        native = logits(_with_weights(model_type, _native_parameters(own, wanted, scaled), plain, subs))
    except Exception as err:  # transformers has no native path for this strategy on this family
        still = _still_check(held, now, theirs(slots[0].dim // 2))
        if still.startswith("mismatch"):
            return {"status": "mismatch", "detail": still}
        return {"status": "supported", "detail": f"no native {strategy} in transformers here ({_one_line(err)}){still}"}
    gap = float((patched - native).abs().max())
    if gap > 1e-5 and (model_type, strategy) in NOT_IMITATED:
        return {"status": "differs", "detail": f"{NOT_IMITATED[model_type, strategy]} (max logit gap {gap:.1e})"}
    if gap > 1e-5:
        return {"status": "mismatch", "detail": f"patched vs native {strategy}: max logit gap {gap:.1e}"}
    return {"status": "exact", "detail": f"max logit gap {gap:.0e}"}


def _sub_parameters(model, slots) -> dict[str, dict]:
    """The rope parameters of each sub-config other than the text config that a patched rotary reads (its module's
    ``config``: BLT's four rotaries read their patcher's, byte encoder's, byte decoder's and global transformer's own,
    none the top-level config's), by the sub-config's name: transformers scales those rotaries only through them."""
    cfg = model.config
    read = {id(getattr(model.get_submodule(s.module_name), "config", None)) for s in slots}
    subs = [n for n in cfg.sub_configs or {} if getattr(cfg, n, None) is not cfg.get_text_config()]
    return {n: dict(getattr(cfg, n).rope_parameters or {}) for n in subs if id(getattr(cfg, n, None)) in read}


def _with_weights(model_type: str, rope_parameters: dict, plain, subs: dict | None = None):
    import warnings

    from transformers.initialization import no_init_weights

    with warnings.catch_warnings(), no_init_weights():  # the weights are the plain model's
        warnings.simplefilter("ignore")
        native = build(model_type, rope_parameters, subs=subs)
    native.load_state_dict(plain.state_dict())
    return native


def _still_check(held: dict, now: dict, native: dict) -> str:
    """Where a patched slot holds pairs at frequency 0 (transformers' proportional RoPE): that they are still 0, and
    that the rotating pairs' frequencies and attention factor equal transformers' own for the strategy
    (``ROPE_INIT_FUNCTIONS`` at the survey's length) on RoPE of their wavelengths: a stand-in config of dim 2a and base
    b' = theta_1^(-a), read from the frequencies the model held (theta_i = b'^(-2i/(2a))). "" where none holds still
    pairs; "mismatch: ..." where a check fails; else the line saying what was checked."""
    said = []
    for slot, (inv_freq, attention) in now.items():
        theta = held[slot]
        still = theta == 0
        if not still.any():
            continue
        if bool((inv_freq[still] != 0).any()):
            return f"mismatch: {int((inv_freq[still] != 0).sum())} pairs {slot.buffer} held at frequency 0 rotate"
        rotating = theta[~still].double()
        a = rotating.numel()
        if a < 2:  # one rotating pair (theta_0 = 1 at every base): no base to read, its frequency not compared
            said.append(
                f"; {slot.buffer}'s {still.numel() - a} pairs held at frequency 0 stay 0 (one pair rotates: no base to "
                "read from it, its frequency not compared)"
            )
            continue
        base = float(rotating[1] ** -a)  # theta_1 = b'^(-2/(2a))
        want, want_attention = _native_frequencies(2 * a, base, native)
        gap = float(((inv_freq[~still].double() - want.double()) / want.double()).abs().max())
        if gap > 1e-5 or abs(attention - want_attention) > 1e-6:
            return f"mismatch: {slot.buffer}'s rotating pairs vs transformers' {native['rope_type']}: gap {gap:.1e}"
        said.append(
            f"; {slot.buffer}'s {still.numel() - a} pairs held at frequency 0 stay 0, its {a} rotating ones equal "
            f"transformers' own {native['rope_type']} on RoPE of their wavelengths (dim {2 * a}, base {base:.4g}; "
            f"max relative gap {gap:.0e})"
        )
    return "".join(said)


def _native_frequencies(dim: int, base: float, native: dict) -> tuple[torch.Tensor, float]:
    """transformers' own frequencies and attention factor for ``native`` (``ROPE_INIT_FUNCTIONS`` at the survey's
    length) on RoPE of ``dim`` and ``base``: a Llama stand-in config of that head dim (its notes on the native
    parameters' keys silenced: the survey's settings, on purpose)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        stand_in = LlamaConfig(
            hidden_size=dim,
            num_attention_heads=1,
            head_dim=dim,
            max_position_embeddings=TRAINED,
            rope_parameters={**native, "rope_theta": base},
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    return ROPE_INIT_FUNCTIONS[native["rope_type"]](stand_in, "cpu", seq_len=LENGTH)


def family_table_base(module, dim: int) -> float:
    """The base the family's own modeling code builds its sin/cos table at, independently of rope_ext: its module's
    ``create_sinusoidal_positions`` (GPT-J's, CodeGen's: b = 10000 written in it) at 2 rows, theta_1 = atan2 of row 1
    (an angle < pi), b = theta_1^(-d/2), to the whole number it is (float32 reads it to ~d/2 x 1e-7)."""
    import math
    import sys

    build = getattr(sys.modules[type(module).__module__], "create_sinusoidal_positions", None)
    if build is None:
        raise LookupError(f"{type(module).__module__} has no create_sinusoidal_positions: no base of its own to read")
    row = build(2, dim)[1].double()
    theta_1 = math.atan2(float(row[1]), float(row[dim // 2 + 1]))  # its sines, then its cosines
    base = theta_1 ** (-dim / 2)
    return float(round(base)) if abs(base - round(base)) < 1e-3 * base else base


def _table_reference(model_type: str, plain, slots, native: dict) -> torch.Tensor:
    """The logits of ``plain``'s weights with each sin/cos table slot's buffer built here, from transformers' own
    frequencies and attention factor for ``native`` (:func:`_native_frequencies`) at the base the family's own code
    writes (:func:`family_table_base`, not rope_ext's read of it): sin(p * theta) * a in the table's sine columns
    (row 0's zeros), cos(p * theta) * a in the others, for p < LENGTH."""
    other = _with_weights(model_type, None, plain)
    for slot in slots:
        module = other.get_submodule(slot.module_name)
        inv_freq, attention = _native_frequencies(slot.dim, family_table_base(module, slot.dim), native)
        old = getattr(module, slot.table)
        angles = torch.arange(LENGTH).float()[:, None] * inv_freq.float()[None, :]
        table = torch.empty(LENGTH, old.shape[1])
        table[:, old[0] == 0], table[:, old[0] != 0] = angles.sin() * attention, angles.cos() * attention
        module.register_buffer(slot.table, table.to(old.dtype), persistent=False)
    return logits(other)


def survey(families=None, strategies=None) -> dict:
    """{family: {"built": ..., "cells": {strategy: cell}, "seconds": ...}} over every (or the given) family."""
    out = {}
    for model_type in families or rotary_families():
        start = time.perf_counter()
        try:
            plain = build(model_type)
            before = plain_logits(plain)
        except Exception as err:
            out[model_type] = {"built": False, "detail": _one_line(err)}
            continue
        try:
            rope_ext.find_rotary_slots(plain)
        except rope_ext.ScalingError as err:
            out[model_type] = {"built": True, "refused": _one_line(err), "cells": {}}
            continue
        cells = {s: cell(model_type, s, plain, before, check_restore=False) for s in strategies or NATIVE}
        if not torch.equal(plain_logits(plain), before):  # every patch restored: the plain model computes what it did
            cells = {s: {"status": "not restored", "detail": "logits after restore() differ"} for s in cells}
        out[model_type] = {"built": True, "cells": cells, "seconds": time.perf_counter() - start}
    return out


def one_thread():
    """A context where torch uses one thread: tiny forwards on a shared box cost ~50 ms instead of ~2 s."""
    from contextlib import contextmanager

    @contextmanager
    def threads():
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    return threads()
