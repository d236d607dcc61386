"""The compatibility suite over transformers' own registry (evals/families.py): every causal-LM model type of the
installed transformers whose modeling uses RoPE, as a tiny random model, patched with every frequency strategy
transformers implements natively and compared with the same weights natively configured (1e-5), the logits moved,
restore() exact. The families that do not build tiny, and those rope_ext refuses, are asserted by name, so a new
transformers family (or a newly failing one) is noticed; docs/models.md is generated from the same survey."""

import os

import pytest

from evals import families
from tests.tiny import ROOT

# the families that do not build tiny, with why (asserted: a new one is noticed)
NOT_BUILT: dict[str, str] = {}
# the families rope_ext refuses, with the reason's words (asserted)
REFUSED: dict[str, str] = {}


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
        (family, strategy): c["detail"]
        for family, entry in survey.items()
        for strategy, c in entry.get("cells", {}).items()
        if c["status"] not in ("exact", "supported", "refused")
    }
    assert bad == {}
    assert sum(families.verdict(e) == "exact" for e in survey.values()) >= 60


def test_docs_models_md_is_the_survey(survey):
    text, path = families.markdown(survey), ROOT / "docs" / "models.md"
    if os.environ.get("ROPE_EXT_WRITE_DOCS"):
        path.write_text(text)
    assert path.read_text() == text, "docs/models.md is stale: ROPE_EXT_WRITE_DOCS=1 pytest tests/test_families.py"


def test_evals_models_says_what_applies_to_a_users_checkpoint_before_any_run(capsys, tmp_path):
    from evals.models import main

    assert main(["gpt_oss"]) == 0
    out = capsys.readouterr().out
    assert "gpt_oss (gpt_oss): trained context 4096; ships yarn x32.0" in out
    assert "yarn: patched on every slot above; yarn inherits the shipped yarn x32's truncate=False" in out
    assert "linear replaces the shipped yarn x32 scaling" in out and "| gpt_oss |" in out
    assert main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is neither a checkpoint directory" in err
