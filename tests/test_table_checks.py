"""Sin/cos-table rotaries in the precisions and places a harness meets them (rope_ext.rotary.tables, rope_ext.patch).

- A GPT-J in float16 or bfloat16 (``model.half()``, ``.to(torch.bfloat16)``) holds its table rounded to that dtype
  (bf16: 2^-8 relative): it is still found, its base read as 10000, and a patch moves the logits and restores them.
- A large bf16 table's frequencies are read turn by turn (rows 1, 2, 4, ... to the last), not from row 1 alone.
- A slot handed to the patcher with a wrong geometry (found on ``meta`` where the initialiser could not run: the
  config's base, not the held b^(d/d') of an odd rotary dim) is scaled from what the live buffer holds.
- A table with no values here (``meta``, offloaded) is a one-line ScalingError naming the module, not a traceback.
- A table patched already is not grown under ``none`` with NaN rows: refused in one line.
"""

import dataclasses
import math

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import rope_ext
from rope_ext.rotary.tables import held_frequencies, read_table, table_base

TRAINED, DIM, VOCAB = 32, 8, 128


def tiny(dtype=torch.float32):
    config = AutoConfig.for_model(
        "gptj", n_layer=2, n_embd=64, n_head=4, rotary_dim=DIM, n_positions=TRAINED, vocab_size=VOCAB
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval().to(dtype)


def logits(model, length=72):
    with torch.no_grad():
        return model(input_ids=(torch.arange(length)[None] * 7 + 3) % VOCAB, use_cache=False).logits.float()


def sinusoidal(rows, dim, base=10000.0):
    # GPT-J's create_sinusoidal_positions at another base: sin | cos of p * b^(-2i/d)
    theta = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.int64) / dim)
    angles = torch.arange(rows).float()[:, None] * theta
    return torch.cat([angles.sin(), angles.cos()], 1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_gptj_is_found_and_patched(dtype):
    model = tiny(dtype)
    (slot,) = rope_ext.find_rotary_slots(model)
    assert slot.table == "embed_positions" and slot.dim == DIM
    assert math.isclose(slot.base, 1e4, rel_tol=1e-2 if dtype == torch.bfloat16 else 1e-3), slot.base
    short = logits(model, TRAINED)
    table = model.transformer.rotary_emb.embed_positions
    with rope_ext.patch(model, {"name": "yarn", "factor": 2}, TRAINED) as patch:
        assert patch.slots == [slot] and all("equal the patched" in a["verified"] for a in patch.applied)
        patched = logits(model)
        assert model.transformer.rotary_emb.embed_positions.dtype == dtype
    assert torch.isfinite(patched).all() and float((patched[:, :TRAINED] - short).abs().max()) > 1e-3
    assert model.transformer.rotary_emb.embed_positions is table and torch.equal(logits(model, TRAINED), short)


@pytest.mark.parametrize("base", [1e4, 5e5])
def test_a_large_bf16_table_is_read_turn_by_turn(base):
    table = sinusoidal(8192, 64, base).to(torch.bfloat16)
    theta, a = read_table(table)
    want = 1.0 / base ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    assert a == 1.0 and float(((theta - want) / want).abs().max()) < 1e-2
    found = table_base(table)
    assert found is not None and math.isclose(found, base, rel_tol=1e-2), found


def test_a_slot_with_a_wrong_base_is_scaled_from_what_the_buffer_holds():
    """MiMo-V2-Flash's tiny config holds theta_i = b^(-2i/5) over 3 pairs: RoPE of dim 6 at b^(6/5). A slot handed to
    the patcher with the config's b (as a meta read without the initialiser gives) is scaled from the held base."""
    from evals import families

    plain = families.build("mimo_v2_flash")
    right = rope_ext.find_rotary_slots(plain)
    wrong = [dataclasses.replace(s, base=s.base ** (5 / 6)) for s in right]  # the config's rope_theta
    held_now = {s: getattr(s.module(plain), s.buffer).clone() for s in right}
    with rope_ext.patch(plain, {"name": "linear", "factor": 2}, families.TRAINED, slots=wrong):
        for s in right:
            assert torch.allclose(getattr(s.module(plain), s.buffer), held_now[s] / 2, rtol=1e-6, atol=0)


def test_a_table_with_no_values_is_a_one_line_error():
    model = tiny()
    (slot,) = rope_ext.find_rotary_slots(model)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(model.config)
    with pytest.raises(rope_ext.ScalingError, match="transformer.rotary_emb") as err:
        held_frequencies(meta.transformer.rotary_emb, slot)
    assert "\n" not in str(err.value)
    with pytest.raises(rope_ext.ScalingError, match="transformer.rotary_emb") as err:
        rope_ext.patch(meta, {"name": "yarn", "factor": 2}, TRAINED, slots=[slot])
    assert "\n" not in str(err.value)


def test_a_patched_table_is_not_grown_with_nan_rows_under_none():
    model = tiny()
    with rope_ext.patch(model, {"name": "yarn", "factor": 2}, TRAINED):
        with pytest.raises(rope_ext.ScalingError, match="patched already") as err:
            rope_ext.patch(model, {"name": "none"}, TRAINED)
        assert "\n" not in str(err.value)
    assert torch.isfinite(logits(model, TRAINED)).all()


def test_the_survey_checks_a_single_rotating_pair():
    """families._still_check on a slot with one rotating pair: no base to read from one frequency, no IndexError."""
    from evals import families

    slot = rope_ext.rotary.slot.RotarySlot("rotary", "", 2, 1e4, still=3)
    held_theta = torch.tensor([1.0, 0.0, 0.0, 0.0])
    said = families._still_check({slot: held_theta}, {slot: (held_theta / 2, 1.0)}, {"rope_type": "linear"})
    assert "3 pairs held at frequency 0 stay 0" in said
    moved = families._still_check({slot: held_theta}, {slot: (torch.ones(4), 1.0)}, {"rope_type": "linear"})
    assert moved.startswith("mismatch")


def test_the_survey_reference_table_takes_its_base_from_the_family_code_not_from_rope_ext():
    """families._table_reference builds GPT-J's / CodeGen's reference table at the base their own
    create_sinusoidal_positions writes (10000): a slot whose base rope_ext read wrongly cannot agree with itself."""
    from evals import families

    native = {"rope_type": "linear", "factor": 2.0}
    for family in ("gptj", "codegen"):
        plain = families.build(family)
        (slot,) = rope_ext.find_rotary_slots(plain)
        assert families.family_table_base(slot.module(plain), slot.dim) == 1e4
        right = families._table_reference(family, plain, [slot], native)
        wrong = families._table_reference(family, plain, [dataclasses.replace(slot, base=5e4)], native)
        assert torch.equal(right, wrong)


def test_one_buffer_setter_and_one_stand_in_config():
    """The patcher sets buffers with rope_ext.rotary.tables.put (persistence kept), as rope_ext.rotary.tables.grown
    does; the survey writes its Llama stand-in config in one place."""
    import importlib
    import inspect

    from evals import families
    from rope_ext.rotary import tables

    patch = importlib.import_module("rope_ext.patch")  # the module (rope_ext.patch is also the function)
    assert patch.put is tables.put and not hasattr(patch, "_put")
    assert inspect.getsource(families).count("LlamaConfig(") == 1
