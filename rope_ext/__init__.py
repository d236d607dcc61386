"""rope_ext: RoPE context-extension strategies as pure functions, and one patcher for any HF model.

    scaling = rope_ext.resolve({"name": "yarn", "factor": 4}, trained_context=4096)  # validated once
    inv_freq, attention_factor = scaling.frequencies(128, 10000.0)
    with rope_ext.patch(model, scaling):
        ...  # the model runs with YaRN; the original is restored on exit
"""

from .patch import RopePatch, RotaryNotFoundError, RotarySlot, find_rotary_slots, patch, select_slots, trained_context
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
    "STRATEGIES",
    "Param",
    "RopePatch",
    "RotaryNotFoundError",
    "RotarySlot",
    "Scaling",
    "ScalingError",
    "default_inv_freq",
    "find_rotary_slots",
    "frequencies",
    "patch",
    "register",
    "resolve",
    "select_slots",
    "trained_context",
    "wavelengths",
]
