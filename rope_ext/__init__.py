"""rope_ext: RoPE context-extension strategies as pure functions, and one patcher for any HF model.

    inv_freq, attention_factor = rope_ext.frequencies({"name": "yarn", "factor": 4,
                                                       "original_max_position": 4096}, 128, 10000.0)
    with rope_ext.patch(model, {"name": "ntk", "factor": 2}):
        ...  # the model runs with NTK-aware RoPE; the original is restored on exit
"""

from .patch import RopePatch, RotaryNotFoundError, RotarySlot, find_rotary_slots, patch, trained_context
from .strategies import (
    ALIASES,
    STRATEGIES,
    ScalingError,
    default_inv_freq,
    frequencies,
    is_dynamic,
    register,
    validate,
    wavelengths,
)

__all__ = [
    "ALIASES",
    "STRATEGIES",
    "RopePatch",
    "RotaryNotFoundError",
    "RotarySlot",
    "ScalingError",
    "default_inv_freq",
    "find_rotary_slots",
    "frequencies",
    "is_dynamic",
    "patch",
    "register",
    "trained_context",
    "validate",
    "wavelengths",
]
