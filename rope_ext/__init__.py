"""rope_ext: RoPE context-extension strategies as pure functions, and one patcher for any HF model.

    scaling = rope_ext.resolve({"name": "yarn", "factor": 4}, trained_context=4096)  # validated once
    inv_freq, attention_factor = scaling.frequencies(128, 10000.0)
    with rope_ext.patch(model, scaling):
        ...  # the model runs with YaRN; the original is restored on exit

Query-scaling strategies (``logn``), attention-level ones (Self-Extend, DCA, ReRoPE, STRING, LM-Infinite:
:mod:`rope_ext.positions`) and q/k captures go through one hook on the model's attention function
(:mod:`rope_ext.attention`).
"""

from . import positions  # noqa: F401  (registers the attention-level strategies)
from .attention import AttentionCall, AttentionHookError, capture, hook_attention, probe
from .patch import RopePatch, patch
from .slots import RotaryNotFoundError, RotarySlot, find_rotary_slots, select_slots, trained_context
from .strategies import (
    ALIASES,
    STRATEGIES,
    Param,
    Scaling,
    ScalingError,
    default_inv_freq,
    frequencies,
    register,
    resolve,
    wavelengths,
)

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
    "patch",
    "probe",
    "register",
    "resolve",
    "select_slots",
    "trained_context",
    "wavelengths",
]
