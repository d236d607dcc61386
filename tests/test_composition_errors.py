"""evals.cli.composition_error against the installed Hydra: every shape of composition error it handles, from a real
composition, as the one line the user reads. It reads Hydra's and OmegaConf's exceptions (their types and
attributes) where they say what went wrong, and passes Hydra's own text through otherwise; a new Hydra may change
either, so the version these were written against is pinned too."""

import hydra
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from evals import load_evals
from evals.cli import composition_error
from evals.core.config.store import config_dir, register_configs
from tests.test_config import GROUPS

HYDRA = "1.3.8"  # the Hydra whose exceptions and wording composition_error and the lines below were checked against


def test_hydra_is_the_version_composition_error_was_checked_against():
    assert hydra.__version__ == HYDRA, (
        f"Hydra {hydra.__version__} is installed, but evals.cli.composition_error was checked against Hydra {HYDRA}. "
        "Re-check what it reads: MissingConfigException's missing_cfg_file and options (an unknown option), "
        "the key/full_key/object_type of OmegaConf's key error behind Hydra's (an unknown key), and Hydra's own "
        "text for the rest (its 'To append ...' line dropped). Run tests/test_composition_errors.py; if every "
        "line there still reads as it should, set HYDRA in it to the new version."
    )


def one_line(*overrides: str) -> str:
    """The line ``python run.py <overrides>`` prints after ``error:``, from the exception a real composition raises."""
    load_evals()
    register_configs()
    GlobalHydra.instance().clear()
    with pytest.raises((HydraException, OmegaConfBaseException)) as raised:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            compose("config", overrides=list(overrides), return_hydra_config=True)
    return composition_error(raised.value)


def available(group: str) -> str:
    return ", ".join(GROUPS[group])


@pytest.mark.parametrize(
    "overrides,line",
    [
        # an unknown option of a group (MissingConfigException), a hint when one is close; a nested group too
        (["scaling=yran"], f"scaling=yran is not an option; available: {available('scaling')}. Did you mean yarn?"),
        (["eval=rulr"], f"eval=rulr is not an option; available: {available('eval')}. Did you mean ruler?"),
        (["experiment=nope"], f"experiment=nope is not an option; available: {available('experiment')}."),
        (["hydra/sweeper=nope"], "hydra/sweeper=nope is not an option; available: basic, optuna."),
        # a key the chosen strategy does not take (OmegaConf's key error on a generated scaling schema)
        (
            ["scaling=yarn", "scaling.beta_fats=3"],
            "scaling 'yarn' does not take beta_fats. Its parameters: factor, original_max_position, beta_fast, "
            "beta_slow, truncate, attention_factor, mscale, mscale_all_dim, dynamic, layer_types. Did you mean "
            "beta_fast?",
        ),
        (
            ["scaling=dca", "scaling.factor=2"],
            "scaling 'dca' does not take factor. Its parameters: chunk_size, local_window, original_max_position, "
            "layer_types.",
        ),
        # a key another schema does not have
        (
            ["model.pth=/x"],
            "model.pth is not an option here; valid: hub_id, path, gguf_file, gguf_package, gguf_parts, gguf_sha256, "
            "weights, tokenizer, original_max_position, dtype, device, device_map, attn_implementation, seed, "
            "architecture. Did you mean path?",
        ),
        (
            ["eval=ruler", "eval.lenghts=[1]"],
            "eval.lenghts is not an option here; valid: tasks, lengths, limit, threshold, relative_threshold, "
            "apply_chat_template, system_instruction, seed, batch_size, max_length. Did you mean lengths?",
        ),
        # a key in a free-form node (a plain dict in struct mode: no fields to list)
        (
            ["model.architecture.nope=1"],
            "model.architecture.nope is not in the config; to add a key there, write +model.architecture.nope=...",
        ),
        # the rest: Hydra's text, one line
        (
            ["model.seed=abc"],
            "Error merging override model.seed=abc Value 'abc' of type 'str' could not be converted to Integer",
        ),
        (["~model.nope"], "Could not delete from config. 'model.nope' does not exist."),
        # a constraint unquoted (the search's): Hydra's lexer error at '>' said nothing of quoting
        (
            ["constraints=[ppl_retention@4096>=0.98]"],
            "constraints=[ppl_retention@4096>=0.98]: Hydra's override grammar does not take '<' or '>' unquoted; "
            "quote the string that holds it, e.g. 'constraints=[\"ppl_retention@4096>=0.98\"]', the outer quotes "
            "for the shell",
        ),
        (
            ["scaling"],
            "Error parsing override 'scaling' missing EQUAL at '<EOF>' See "
            "https://hydra.cc/docs/1.2/advanced/override_grammar/basic for details",
        ),
    ],
)
def test_each_composition_error_is_the_line_the_user_reads(overrides, line):
    assert one_line(*overrides) == line
