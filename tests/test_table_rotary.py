"""Sin/cos-table rotaries (GPT-J, CodeGen: a buffer ``embed_positions`` of sin(p*theta) | cos(p*theta) rows for
p < max_position_embeddings, indexed by the position ids; rope_ext.rotary.tables) patched by the one generic patcher with
every frequency strategy rope_ext registers, past the table's end (72 positions on a 32-row table).

The reference is independent of rope_ext: the same tiny model (same weights) whose table is built here, directly from
each method's own formulas -- RoPE theta_i = b^(-2i/d) (arXiv 2104.09864); PI theta/s (arXiv 2306.15595); NTK-aware
b*s^(d/(d-2)) and its dynamic form; YaRN's ramp over the dimensions between beta_fast and beta_slow rotations, as in
the paper's released code (jquesnelle/yarn: floor/ceil of the correction range, linear ramp mask), with the attention
factor 0.1*ln(s)+1 (arXiv 2309.00071); Llama-3.1's wavelength bands (arXiv 2407.21783); LongRoPE's per-pair factors
and sqrt(1+ln s/ln L) (arXiv 2402.13753); p-RoPE's zeroed slow pairs (arXiv 2410.06205) -- and written into the
table slot as sin(p*theta')*a | cos(p*theta')*a. The patched logits equal it to 1e-5; they moved from the unpatched
model's; restore() gives back the very table (torch.equal) and the unpatched logits.
"""

import math

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import rope_ext
from rope_ext.strategies.registry import STRATEGIES

TRAINED, LENGTH, DIM, BASE, VOCAB = 32, 72, 8, 10000.0, 128
PAIRS = DIM // 2
LONG = [1.0, 2.0, 3.0, 4.0]
FAMILIES = ("gptj", "codegen")


def theta(base=BASE):
    # RoPE: theta_i = b^(-2i/d)
    return base ** (-np.arange(PAIRS) * 2.0 / DIM)


def ntk(base, s):
    # NTK-aware base: b * s^(d/(d-2))
    return base * s ** (DIM / (DIM - 2))


def yarn_ramp(s, beta_fast=32.0, beta_slow=1.0):
    # YaRN's released code: the dimension with r rotations over L is d*ln(L/(2*pi*r))/(2*ln b); floor/ceil the range,
    # a linear mask 0 (extrapolated) .. 1 (interpolated) over the pair index; theta' = theta/s*mask + theta*(1-mask)
    def dim_of(r):
        return DIM * math.log(TRAINED / (r * 2 * math.pi)) / (2 * math.log(BASE))

    low, high = max(math.floor(dim_of(beta_fast)), 0), min(math.ceil(dim_of(beta_slow)), DIM - 1)
    mask = np.clip((np.arange(PAIRS) - low) / ((high - low) or 0.001), 0, 1)
    return theta() / s * mask + theta() * (1 - mask)


def llama3(s, low=1.0, high=4.0):
    # Llama-3.1: wavelength > L/low -> theta/s; < L/high -> theta; between, smooth = (L/lambda - low)/(high - low)
    wavelength = 2 * math.pi / theta()
    smooth = np.clip((TRAINED / wavelength - low) / (high - low), 0, 1)
    return (1 - smooth) * theta() / s + smooth * theta()


def p_rope(fraction):
    kept = int(math.floor(fraction * PAIRS))  # the floor(p*d/2) fastest pairs rotate, the others not at all
    return np.where(np.arange(PAIRS) < kept, theta(), 0.0)


# strategy -> (rope_ext's setting, the reference frequencies at length LENGTH, the attention factor)
CASES = {
    "none": ({"name": "none"}, theta(), 1.0),
    "linear": ({"name": "linear", "factor": 4}, theta() / 4, 1.0),
    "ntk": ({"name": "ntk", "factor": 4}, theta(ntk(BASE, 4)), 1.0),
    "base": ({"name": "base", "base": 50000.0}, theta(50000.0), 1.0),
    # dynamic NTK at n > L: b * ((s*n/L) - (s-1))^(d/(d-2))
    "dynamic_ntk": ({"name": "dynamic_ntk", "factor": 2}, theta(BASE * (2 * LENGTH / TRAINED - 1) ** (DIM / 6)), 1.0),
    "ntk_by_parts": ({"name": "ntk_by_parts", "factor": 4}, yarn_ramp(4), 1.0),
    "yarn": ({"name": "yarn", "factor": 4}, yarn_ramp(4), 0.1 * math.log(4) + 1),
    # dynamic YaRN: s = n/L at length n
    "yarn_dynamic": (
        {"name": "yarn", "dynamic": True},
        yarn_ramp(LENGTH / TRAINED),
        0.1 * math.log(LENGTH / TRAINED) + 1,
    ),
    "llama3": ({"name": "llama3", "factor": 4}, llama3(4), 1.0),
    "longrope": (
        {"name": "longrope", "short_factor": [1.0] * PAIRS, "long_factor": LONG, "factor": 4},
        theta() / np.array(LONG),
        math.sqrt(1 + math.log(4) / math.log(TRAINED)),
    ),
    "mixed": ({"name": "mixed", "factors": LONG}, theta() / np.array(LONG), 1.0),
    "p_rope": ({"name": "p_rope", "fraction": 0.5}, p_rope(0.5), 1.0),
    "compose": (
        {"name": "compose", "stages": [{"name": "base", "base": 50000.0}, {"name": "linear", "factor": 2}]},
        theta(50000.0) / 2,
        1.0,
    ),
}


def tiny(family: str, seed: int = 0):
    config = AutoConfig.for_model(
        family, n_layer=2, n_embd=64, n_head=4, rotary_dim=DIM, n_positions=TRAINED, vocab_size=VOCAB
    )
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


def ids(length=LENGTH):
    return (torch.arange(length)[None] * 7 + 3) % VOCAB


def logits(model, length=LENGTH):
    with torch.no_grad():
        return model(input_ids=ids(length), use_cache=False).logits.float()


def reference(model, freqs, attention):
    """``model``'s weights with its table replaced by sin(p*theta')*a | cos(p*theta')*a for p < LENGTH."""
    angles = np.arange(LENGTH)[:, None] * freqs[None, :]
    table = torch.tensor(np.concatenate([np.sin(angles), np.cos(angles)], axis=1) * attention, dtype=torch.float32)
    other = tiny(model.config.model_type)
    other.load_state_dict(model.state_dict())
    other.transformer.rotary_emb.embed_positions = table  # the buffer, assigned
    return logits(other)


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return tiny(request.param)


def test_every_frequency_strategy_rope_ext_registers_is_covered():
    registered = {
        n for n, s in STRATEGIES.items() if s.kind == "frequencies" and s.fn.__module__.startswith("rope_ext")
    }
    assert registered <= {setting["name"] for setting, _, _ in CASES.values()}


def test_the_table_rotary_is_found_from_its_values(model):
    (slot,) = rope_ext.find_rotary_slots(model)
    assert (slot.module_name, slot.table, slot.dim, slot.base, slot.rows) == (
        "transformer.rotary_emb",
        "embed_positions",
        DIM,
        BASE,
        TRAINED,
    )
    theta_held, attention = slot.frequencies(model)
    assert attention == 1.0 and torch.allclose(theta_held.double(), torch.tensor(theta()), rtol=1e-5)


@pytest.mark.parametrize("case", list(CASES))
def test_patched_logits_equal_the_table_built_from_the_papers(model, case):
    setting, freqs, attention = CASES[case]
    table = model.transformer.rotary_emb.embed_positions
    short = logits(model, TRAINED)  # the unpatched model runs up to its table's end only
    with rope_ext.patch(model, setting, TRAINED) as patch:
        patched = logits(model)
        assert all("equal the patched frequencies" in a["verified"] for a in patch.applied)
    gap = float((patched - reference(model, freqs, attention)).abs().max())
    assert gap <= 1e-5, f"{case}: patched vs the independent table, max logit gap {gap:.1e}"
    moved = float((patched[:, :TRAINED] - short).abs().max())
    assert moved <= 1e-5 if case == "none" else moved > 1e-6
    assert model.transformer.rotary_emb.embed_positions is table  # restore(): the very buffer
    assert "embed_positions" not in model.state_dict() and torch.equal(logits(model, TRAINED), short)


def test_a_forward_past_the_grown_table_grows_it_again(model):
    """A static strategy's table covers the probe positions (up to 4L) after patching; a longer forward grows it."""
    with rope_ext.patch(model, {"name": "linear", "factor": 8}, TRAINED):
        rotary = model.transformer.rotary_emb
        rows = rotary.embed_positions.shape[0]
        with torch.no_grad():
            sin, cos = rotary(torch.zeros(1, 1, 1), position_ids=torch.tensor([[rows + 5]]))
        assert rotary.embed_positions.shape[0] >= rows + 6
        angle = (rows + 5) * torch.tensor(theta()) / 8
        assert torch.allclose(
            torch.cat([sin, cos], -1).double().flatten(), torch.cat([angle.sin(), angle.cos()]), atol=1e-5
        )
    assert rotary.embed_positions.shape[0] == TRAINED


def test_an_absolute_sinusoidal_table_is_not_a_rotary():
    """A module whose forward returns one tensor of table rows is a position embedding, not a rotary: not a slot."""
    from rope_ext.rotary.find import find_table_slots

    class Absolute(torch.nn.Module):
        def __init__(self):
            super().__init__()
            angles = torch.arange(TRAINED).float()[:, None] * torch.tensor(theta(), dtype=torch.float32)
            self.register_buffer("table", torch.cat([angles.sin(), angles.cos()], 1), persistent=False)

        def forward(self, x, position_ids):
            return self.table[position_ids]

    assert find_table_slots(Absolute()) == []


def test_generation_past_the_table_with_a_cache_grows_it_one_token_at_a_time(model):
    """Cached generation asks one position per step: the hook grows the table past its end (doubling)."""
    with rope_ext.patch(model, {"name": "linear", "factor": 4}, TRAINED), torch.no_grad():
        out = model.generate(ids(8), max_new_tokens=2 * TRAINED, do_sample=False, pad_token_id=0)
        rows = model.transformer.rotary_emb.embed_positions.shape[0]
    assert out.shape[1] == 8 + 2 * TRAINED and rows >= 8 + 2 * TRAINED


def test_patch_checked_sees_the_patched_table_reach_every_layer(model):
    from rope_ext.check import patch_checked
    from rope_ext.strategies.scaling import resolve

    patch, found = patch_checked(model, resolve({"name": "yarn", "factor": 4}, TRAINED))
    patch.restore()
    assert found["changed"] == ["transformer.h.0.attn", "transformer.h.1.attn"], found


def test_a_patched_table_is_the_same_slot_and_is_not_scaled_again(model):
    (slot,) = rope_ext.find_rotary_slots(model)
    with rope_ext.patch(model, {"name": "yarn", "factor": 4}, TRAINED):
        assert rope_ext.find_rotary_slots(model) == [slot]  # the same place, its base no longer RoPE's form
        with pytest.raises(rope_ext.ScalingError, match=r"is not RoPE's theta_i = b\^\(-2i/d\) \(patched already"):
            rope_ext.patch(model, {"name": "linear", "factor": 2}, TRAINED)


def test_the_table_rotary_is_found_on_the_meta_device_as_it_will_load(model):
    """A harness reads the slots on a ``meta`` instance before the weights load: the table slot is found there too
    (the values the model's own initialiser writes), the same place, dim, base and rows as on the loaded model."""
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(model.config)
    (found,) = rope_ext.find_rotary_slots(meta)
    (loaded,) = rope_ext.find_rotary_slots(model)
    assert found == loaded and (found.dim, found.base, found.rows) == (DIM, BASE, TRAINED)
    assert meta.transformer.rotary_emb.embed_positions.is_meta  # read from a copy: the meta model is left as it was


def test_a_gptj_checkpoint_runs_through_the_harness_past_its_table(tmp_path, run_job):
    """A local GPT-J checkpoint (its table ends at 32 positions) scored at 64 tokens by ``run.py``'s job: the slots are
    found on the meta model before loading, YaRN x2 is patched into the table, ``none`` grows it with its own RoPE.
    Cheap: a word-level tokenizer of the text's own words (no GGUF to parse), one text file."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [f"w{i}" for i in range(VOCAB - 2)]
    (tmp_path / "text.txt").write_text(" ".join(words[(i * 7 + 3) % len(words)] for i in range(400)))
    tokenizer = Tokenizer(models.WordLevel({"<s>": 0, "</s>": 1, **{w: i + 2 for i, w in enumerate(words)}}, "</s>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    checkpoint = tmp_path / "gptj"
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>").save_pretrained(checkpoint)
    config = AutoConfig.for_model(
        "gptj",
        n_layer=2,
        n_embd=64,
        n_head=4,
        rotary_dim=DIM,
        n_positions=TRAINED,
        vocab_size=VOCAB,
        bos_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(checkpoint)
    ppl = {}
    for name, scaling in (("yarn", ["scaling=yarn", "scaling.factor=2"]), ("none", ["scaling=none"])):
        summary, results = run_job(
            tmp_path / name,
            "model.weights=pretrained",
            f"model.path={checkpoint}",
            "data=text_files",
            f"data.glob={tmp_path / 'text.txt'}",
            "eval.lengths=[64]",
            *scaling,
        )
        assert results["job"]["trained_context"] == TRAINED and (tmp_path / name / "results.json").is_file()
        ppl[name] = summary["ppl@64"]
    assert all(math.isfinite(v) and v > 1 for v in ppl.values()) and ppl["yarn"] != ppl["none"], ppl


def test_evals_models_lists_the_table_slot(capsys):
    from evals.models import main

    assert main(["gptj"]) == 0
    out = capsys.readouterr().out
    assert "  rotary transformer.rotary_emb : dim 8, base 10000 (sin/cos table embed_positions, 32 rows)" in out
    assert ", yarn: patched on transformer.rotary_emb (scaling.layer_types=auto" in out
