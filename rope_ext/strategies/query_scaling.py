"""Query-scaling strategies: the query at each position multiplied by a factor inside attention.

Their function maps 0-based query positions to factors (the signature :class:`rope_ext.strategies.registry.QueryScaleFn`);
the frequencies stay the model's own (L = the trained context, ``original_max_position``). The patcher applies the factors through rope_ext's attention hook
(:mod:`rope_ext.attention.hook`); they compose with any frequency strategy through ``compose`` (:mod:`rope_ext.strategies.scaling`).

- ``logn``          query scaling beyond L growing with log n (Su 2021, kexue.fm/archives/8823; Qwen logn-attn; Llama-4).
"""

from __future__ import annotations

import math

from .registry import TRAINED, Param, ScalingError, register

LOGN_FORMS = ("su", "llama4")


def check_logn(p: dict) -> None:
    if p["form"] == "su" and p["original_max_position"] < 2:
        raise ScalingError(
            f"scaling: form su needs original_max_position >= 2 (log base L), got {p['original_max_position']}"
        )


@register(
    "logn",
    params={
        "form": Param(
            "su",
            str,
            "su: max(1, log n / log L); llama4: 1 + attn_scale * log1p(floor(n / floor_scale))",
            choices=LOGN_FORMS,
        ),
        "original_max_position": TRAINED,
        "attn_scale": Param(0.1, float, "llama4 form: the slope of the log term", above=0.0),
        "floor_scale": Param(None, int, "llama4 form: n is counted in steps of floor_scale (default: L)", minimum=1),
    },
    check=check_logn,
    kind="query",
)
def logn(p, positions):
    """Log-n query scaling ("entropy invariance", Su 2021, kexue.fm/archives/8823): the query at 0-based
    position m, which sees n = m + 1 tokens, is multiplied by

    - ``su``: max(1, log n / log L) -- log_L n beyond the trained length L, 1 within it (Qwen's
      ``use_logn_attn``: ``math.log(i, seq_length) if i > seq_length else 1`` for i = n);
    - ``llama4``: 1 + attn_scale * log1p(floor(n / floor_scale)) (transformers' Llama-4
      ``attn_temperature_tuning``, floor_scale 8192 and attn_scale 0.1 there; here floor_scale defaults
      to L): 1 for the first L - 1 queries; the query at m = L - 1, the last of the trained length, already
      sees n = L and is scaled, as in Llama-4.

    >>> p = {"form": "llama4", "original_max_position": 8192, "attn_scale": 0.1, "floor_scale": None}
    >>> import torch
    >>> [round(f, 4) for f in logn(p, torch.tensor([0, 8190, 8191, 16383])).tolist()]
    [1.0, 1.0, 1.0693, 1.1099]
    >>> [round(f, 4) for f in logn({**p, "form": "su"}, torch.tensor([8190, 8191, 16383])).tolist()]
    [1.0, 1.0, 1.0769]
    """
    import torch

    n = positions.double() + 1
    trained = p["original_max_position"]
    if p["form"] == "su":
        factors = (n.log() / math.log(trained)).clamp(min=1.0)
    else:
        floor_scale = p["floor_scale"] or trained
        factors = torch.log1p(torch.floor(n / floor_scale)) * p["attn_scale"] + 1.0
    return factors.float()
