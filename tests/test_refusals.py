"""Every refusal is one line and exit 2, wherever it is found: a user's own tiny checkpoint of each family the README
and docs/models.md list as refused, saved with ``save_pretrained`` (the bundled tokenizer beside it), run through
``python run.py`` as a user would. DiffLlama with ``scaling=self_extend`` passed the checks and ended in a ~150-line
traceback at its first forward (``AttentionHookError: ... (2 attention calls per forward)``); the check before the
weights load (:meth:`rope_ext.attention.Probe.attention_refusal`) now finds it, and ``python -m evals.models`` reports
the same check."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

ATTENTION = ["scaling=self_extend"]  # an attention-level method
FREQUENCIES = ["scaling=yarn", "scaling.factor=2"]
# model type -> the scaling it refuses (its tiny config: evals/families.py, as the compatibility suite builds it)
REFUSED = {
    "diffllama": ATTENTION,  # two attention calls per layer
    "recurrent_gemma": ATTENTION,  # no position embeddings given to its attention
    # attention outside transformers' interface; eager: their only implementation
    "gpt_neox_japanese": [*ATTENTION, "model.attn_implementation=eager"],
    "flint": [*ATTENTION, "model.attn_implementation=eager"],  # attention sinks (gpt-oss, HY-V4: not tiny here)
    "granite_swa": [*ATTENTION, "model.attn_implementation=eager"],  # its only implementation
    "granitemoe_swa": [*ATTENTION, "model.attn_implementation=eager"],
    # no rotary module found (docs/models.md's refused rows)
    "zamba": FREQUENCIES,
    "jamba": FREQUENCIES,
    "granitemoehybrid": FREQUENCIES,
    "nemotron_h": FREQUENCIES,
}
FAST = {"diffllama", "zamba"}  # the rest: make test-slow


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """``checkpoints(model_type)``: the family's tiny checkpoint, built and saved once."""
    from evals.core.inputs.loading import bundled_tokenizer

    root, built = tmp_path_factory.mktemp("refused"), {}

    def checkpoint(model_type):
        if model_type not in built:
            from evals.families import config

            tiny = config(model_type)
            text = tiny.get_text_config()
            # the bundled tokenizer's vocabulary; trained as long as the default preset says (no note on stderr)
            text.vocab_size, text.max_position_embeddings = 49152, 8192
            text.bos_token_id, text.eos_token_id, text.pad_token_id = 1, 2, 0  # within it
            torch.manual_seed(0)
            path = root / model_type
            AutoModelForCausalLM.from_config(tiny).save_pretrained(path)
            bundled_tokenizer().save_pretrained(path)
            built[model_type] = path
        return built[model_type]

    return checkpoint


@pytest.mark.parametrize("model_type", [t if t in FAST else pytest.param(t, marks=pytest.mark.slow) for t in REFUSED])
def test_a_refused_family_is_one_line_and_exit_2(tmp_path, run_cli, checkpoints, model_type):
    scaling = REFUSED[model_type]
    out = tmp_path / "run"
    result = run_cli(
        f"model.path={checkpoints(model_type)}",
        *scaling,
        "data.books=[persuasion]",
        "eval.lengths=[64]",
        "logger=none",
        f"output_dir={out}",
        timeout=240,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-3000:]
    print(model_type, lines[0])  # pytest -s: what each family is refused with


def test_python_m_evals_models_reports_the_refusal_a_run_would_make(checkpoints):
    """``python -m evals.models`` said "attention re-assembled in 2 of 2 attention layers" for DiffLlama."""
    from evals.models import describe

    said = "\n".join(describe(str(checkpoints("diffllama"))))
    assert "re-assembled" not in said and "refused: model.layers.0.self_attn makes 2 attention calls" in said, said
