"""Position rules keep their tensors on the device of the positions they are given.

The first GPU run (an H200, bench/gpu_bench.py) found DCA, ReRoPE and LM-Infinite failing on CUDA with
"Expected all tensors to be on the same device": their constant query/key positions were built with
``torch.full``/``torch.zeros`` on the CPU. The ``meta`` device stands in for the GPU here: a tensor made
without ``device=`` lands on the CPU and shows.
"""

import pytest
import torch

import rope_ext

ATTENTION = sorted(name for name, strategy in rope_ext.STRATEGIES.items() if strategy.kind == "attention")


@pytest.mark.parametrize("name", ATTENTION)
def test_every_piece_of_a_position_rule_stays_on_the_device_of_its_positions(name):
    rule = rope_ext.resolve({"name": name}, trained_context=4096).position_rule()
    positions = torch.arange(16384, device="meta")[None]
    for piece in rule.pieces:
        for part in ("lo", "hi", "query", "key"):
            function = getattr(piece, part)
            if function is not None:
                assert function(positions).device.type == "meta", f"{name}: piece {piece.name}'s {part}"
    if rule.query_scale is not None:
        assert rule.query_scale(positions).device.type == "meta", f"{name}: query scale"
