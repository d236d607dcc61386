"""The compatibility suite over transformers' own registry (evals/families.py): every causal-LM model type of the
installed transformers whose modeling uses RoPE, as a tiny random model, patched with every frequency strategy
transformers implements natively and compared with the same weights natively configured (1e-5), the logits moved,
restore() exact. The families that do not build tiny, and those rope_ext refuses, are asserted by name, so a new
transformers family (or a newly failing one) is noticed; docs/models.md is generated from the same survey."""

import os

import pytest

from evals import families, family_table
from tests.tiny import ROOT

# the families that do not build tiny, with the error's kind (asserted: a new one is noticed; the full reason of each
# is in docs/models.md). NotTiny: a sub-config keeps its default sizes (evals.families.MAX_PARAMETERS).
NOT_BUILT: dict[str, str] = {
    "dots3_note": "ValueError",  # transformers passes its default per-layer config (layers 25-41) to a 2-layer text model
    "gemma3n": "ImportError",  # its vision tower needs timm, an optional dependency not installed
}
# the families the suite left out until issue 67 (a sub-config at its default sizes, or a tiny config that did not
# build): each built now
BUILT_SINCE_67 = {
    "gpt_oss",
    "qwen3_next",
    "minimax_m2",
    "glm4_moe_lite",
    "longcat_flash",
    "deepseek_v32",
    "deepseek_v4",
    "hy_v4",
    "gemma4_text",
    "qwen3_5_moe_text",
    "dbrx",
    "dots1",
    "minicpm3",
    "qwen4_exp_text",
    "lfm2_moe",
    "zamba2",
    "gemma3",
    "gemma4",
    "llama4",
    "qwen3_5",
    "phi4_multimodal",
    "blt",  # its hash n-gram vocabulary cut, each sub-config's rotary scaled natively through its own rope_parameters
    "roformer",  # its sin/cos table long enough for the survey (transformers cannot index past it)
}
# the families rope_ext refuses, with the reason's words (asserted)
REFUSED: dict[str, str] = {
    "granitemoehybrid": "RotaryNotFoundError",
    "inkling2_text": "RotaryNotFoundError",  # a relative position bias; its RoPE is its vision tower's
    "jamba": "RotaryNotFoundError",
    "nemotron_h": "RotaryNotFoundError",
    "zamba": "RotaryNotFoundError",  # its modeling file imports apply_rotary_pos_emb, its attention never applies it
    # its rotary's sin/cos table is a frozen nn.Embedding weight (RoFormerSinusoidalPositionalEmbedding), not a buffer:
    # rope_ext finds no table it can grow or rescale (and transformers has no rope_parameters for it)
    "roformer": "RotaryNotFoundError",
}

# cells still open (issue 51): asserted, so one fixed or newly broken is noticed; each one's detail is in docs/models.md
OPEN: dict[tuple[str, str], str] = {}


@pytest.fixture(scope="module")
def survey():
    with families.one_thread():
        return families.survey()


def test_every_rope_family_is_enumerated_from_transformers_registry():
    found = families.rotary_families()
    assert {"llama", "qwen2", "gemma3_text", "gpt_neox", "phi3", "phimoe", "deepseek_v3", "gpt_oss", "gptj"} <= set(
        found
    )
    assert len(found) >= 100


def test_every_family_is_patched_exactly_or_supported_or_refused_saying_why(survey):
    assert {f: e["detail"].split(":")[0] for f, e in survey.items() if not e["built"]} == NOT_BUILT
    assert {f: e["refused"].split(":")[0] for f, e in survey.items() if e.get("refused")} == REFUSED
    bad = {
        (family, strategy): c["status"]
        for family, entry in survey.items()
        for strategy, c in entry.get("cells", {}).items()
        if c["status"] not in ("exact", "supported", "refused", "differs")
    }
    assert bad == OPEN
    differs = {(f, s) for f, e in survey.items() for s, c in e.get("cells", {}).items() if c["status"] == "differs"}
    assert differs == set(families.NOT_IMITATED)  # each said why in docs/models.md
    assert sum(family_table.verdict(e) == "exact" for e in survey.values()) >= 60


def test_every_family_a_user_brings_is_built_tiny(survey):
    """Issue 67: sub-configs sized down (experts, indexers, MLA ranks, per-layer inputs, a composite's vision and audio
    towers) and configs given what their checkpoints ship: each family the suite left out is built and checked."""
    built = {f for f, e in survey.items() if e["built"]}
    assert BUILT_SINCE_67 <= built
    assert all(family_table.verdict(survey[f]) in ("exact", "supported", "refused") for f in BUILT_SINCE_67)
    assert len(survey) - len(built) == len(NOT_BUILT) <= 2


def test_docs_models_md_is_the_survey(survey):
    text, path = family_table.markdown(survey), ROOT / "docs" / "models.md"
    if os.environ.get("ROPE_EXT_WRITE_DOCS"):
        path.write_text(text)
    assert path.read_text() == text, "docs/models.md is stale: ROPE_EXT_WRITE_DOCS=1 pytest tests/test_families.py"
    counts = next(line for line in text.splitlines() if line.startswith("Families: "))
    # docs/running.md's "Every RoPE family, checked" (typed prose, linked from the README) quotes the counts
    running = (ROOT / "docs" / "running.md").read_text()
    assert counts in running, f"docs/running.md's counts are stale: {counts}"


def test_an_odd_rotary_dim_is_scaled_from_the_frequencies_the_model_holds():
    """MiMo-V2-Flash's tiny config rotates int(16 * 0.334) = 5 dims: transformers holds theta_i = b^(-2i/5) for 3 pairs.
    The slot is RoPE of dim 6 at the base b^(6/5) -- found so on the meta model too -- and linear equals native."""
    import torch
    from transformers import AutoModelForCausalLM

    import rope_ext

    plain = families.build("mimo_v2_flash")
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(plain.config)
    for found in (rope_ext.find_rotary_slots(plain), rope_ext.find_rotary_slots(meta)):
        assert [(s.prefix, s.dim, round(s.base, 3)) for s in found] == [
            ("full_attention_", 6, round(5e6 ** (6 / 5), 3)),
            ("sliding_attention_", 6, round(1e4 ** (6 / 5), 3)),
        ]
    with families.one_thread():
        assert families.cell("mimo_v2_flash", "linear", plain)["status"] == "exact"


def test_evals_models_says_what_applies_to_a_users_checkpoint_before_any_run(capsys, tmp_path):
    from evals.models import main

    assert main(["gpt_oss"]) == 0
    out = capsys.readouterr().out
    assert "gpt_oss (gpt_oss): trained context 4096; ships yarn x32.0" in out
    assert "\n  yarn inherits the shipped yarn x32's truncate=False" in out
    assert "\n  linear replaces the shipped yarn x32 scaling" in out
    assert ", yarn: patched on model.rotary_emb (scaling.layer_types=auto" in out  # every frequency strategy
    # its attention sinks: refused, as a run refuses them before the weights load (it said "re-assembled in")
    assert (
        "dca, leaky_rerope, lm_infinite, rerope, self_extend, string: refused: model.layers.0.self_attn is given "
        in out
    )
    assert "compatibility suite (docs/models.md): | gpt_oss | exact | exact |" in out  # built tiny since issue 67
    assert main(["llama"]) == 0
    out = capsys.readouterr().out
    assert "compatibility suite (docs/models.md): | llama | exact | exact |" in out
    assert "dca, leaky_rerope, lm_infinite, rerope, self_extend, string: attention re-assembled in" in out
    assert main(["gpt_neox_japanese"]) == 0  # its attention does not call transformers' interface: refused, saying why
    assert (
        "logn, dca, leaky_rerope, lm_infinite, rerope, self_extend, string: refused: GPTNeoXJapaneseForCausalLM: "
        in (capsys.readouterr().out)
    )
    assert main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is neither a checkpoint directory" in err
