"""The options the ConfigStore generates (evals.core.config.store): which exist, and that each composes exactly as
the schema-only YAML it replaces did."""

import pytest
from omegaconf import OmegaConf

from evals import load_evals
from evals.core.config.store import ABOUT, built_in, register_configs, written_options
from tests.test_config import GROUPS

# what --help listed when every option was a YAML: the generated options must keep every one of them
OPTIONS = {
    "scaling": "base base_20k compose dca dynamic_ntk leaky_rerope linear llama3 lm_infinite logn longrope mixed none "
    "ntk ntk_by_parts p_rope pi rerope self_extend string yarn",
    "eval": "lm_eval needle passkey perplexity qk_study rope_decay ruler suite",
}


def generated_options() -> list[tuple[str, str]]:
    """(group, option) of every generated option but the suite: a built-in registration without a YAML."""
    import rope_ext
    from evals.core.registry import EVALS

    load_evals()
    register_configs()
    scaling = [n for n, s in rope_ext.STRATEGIES.items() if n not in written_options("scaling") and built_in(s.fn)]
    evals = [n for n, e in EVALS.items() if n not in written_options("eval") and n != "suite" and built_in(e.run)]
    return [("scaling", n) for n in scaling] + [("eval", n) for n in evals]


def test_every_option_is_still_listed():
    for group, options in OPTIONS.items():
        assert GROUPS[group] == options.split(), group


def test_generated_options_are_documented_and_none_has_a_yaml():
    made = generated_options()
    assert made, "no generated option: the schema-only YAMLs are back?"
    for group, documented in ABOUT.items():
        stale = set(documented) - {name for g, name in made if g == group}
        assert not stale, f"ABOUT[{group!r}] documents {sorted(stale)}, which are not generated options (a YAML now?)"


def test_a_plugin_registration_gets_no_generated_option():
    def halve_slow(p, dim, base, seq_len): ...

    halve_slow.__module__ = "my_ext"  # a plugin brings its own YAML (a ConfigStore option would collide with it)
    assert not built_in(halve_slow)
    assert built_in(__import__("rope_ext").STRATEGIES["yarn"].fn)


@pytest.mark.parametrize("group,name", generated_options())
@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_a_generated_option_composes_as_its_schema_yaml_did(group, name, compose, tmp_path):
    (tmp_path / group).mkdir()
    (tmp_path / group / f"{name}_yaml.yaml").write_text(f"defaults:\n  - /schema/{group}@_here_: {name}\n  - _self_\n")
    generated_cfg = compose(f"{group}={name}")[group]
    yaml_cfg = compose(f"{group}={name}_yaml", searchpath=[f"file://{tmp_path}"])[group]
    assert (
        OmegaConf.get_type(generated_cfg).__name__ == OmegaConf.get_type(yaml_cfg).__name__
    )  # made anew per registration
    assert OmegaConf.to_container(generated_cfg) == OmegaConf.to_container(yaml_cfg)
