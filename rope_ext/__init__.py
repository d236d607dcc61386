"""rope_ext: RoPE context-extension strategies as pure functions, and one patcher for any HF model.

    scaling = rope_ext.resolve({"name": "yarn", "factor": 4}, trained_context=4096)  # validated once
    inv_freq, attention_factor = scaling.frequencies(128, 10000.0)
    with rope_ext.patch(model, scaling):
        ...  # the model runs with YaRN; the original is restored on exit

Where things are: the registry and how a strategy declares itself (:mod:`rope_ext.strategies.registry`, one protocol per
kind of strategy); the catalogue, one module per kind: frequency strategies (:mod:`rope_ext.strategies.frequency`: PI, NTK,
YaRN, Llama-3, LongRoPE, ...), query scaling (:mod:`rope_ext.strategies.query_scaling`: ``logn``) and attention-level
strategies (:mod:`rope_ext.strategies.attention_level`: Self-Extend, DCA, ReRoPE, STRING, LM-Infinite); a config resolved into a
:class:`Scaling`, and ``compose`` (:mod:`rope_ext.strategies.scaling`); RoPE's own frequencies (:mod:`rope_ext.strategies.rope`).
Query-scaling and attention-level strategies and q/k captures go through one hook on the model's attention
function (:mod:`rope_ext.attention.hook`).
"""

# The catalogue modules register their strategies on import, in this order (the registry's order): frequency
# strategies, query scaling, compose, attention-level strategies. No module imports torch before it computes, so
# the registry (names, parameters, checks, target rules) loads without it.
from .strategies import frequency, query_scaling, scaling, attention_level  # noqa: F401
from .attention.hook import AttentionCall, AttentionHookError, hook_attention
from .attention.capture import capture, probe
from .patch import RopePatch, patch
from .strategies.registry import ALIASES, STRATEGIES, Param, ScalingError, register
from .strategies.rope import default_inv_freq, wavelengths
from .strategies.scaling import Scaling, frequencies, resolve
from .strategies.shipped import inherit_shipped, shipped_parameters, trained_context
from .rotary.find import find_rotary_slots, select_slots
from .rotary.slot import RotaryNotFoundError, RotarySlot

__all__ = [
    "ALIASES",
    "AttentionCall",
    "AttentionHookError",
    "STRATEGIES",
    "Param",
    "RopePatch",
    "RotaryNotFoundError",
    "RotarySlot",
    "Scaling",
    "ScalingError",
    "capture",
    "default_inv_freq",
    "find_rotary_slots",
    "frequencies",
    "hook_attention",
    "inherit_shipped",
    "patch",
    "probe",
    "register",
    "resolve",
    "select_slots",
    "shipped_parameters",
    "trained_context",
    "wavelengths",
]
