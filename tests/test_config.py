"""Hydra composition of every config option, the hub models' real shapes, and bad input at the CLI."""

import pytest
import torch
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf

import rope_ext
from evals.core.errors import ScalingConfigError
from evals.core.job.parse import parse_job
from evals.core.inputs.loading import random_model
from evals.core.inputs.models import resolve_model
from tests.tiny import ROOT


def group_options() -> dict[str, list[str]]:
    """Every option of each group as ``--help`` lists them: a YAML in conf/, or generated from the registries
    (``evals.core.config.store``: ``eval=suite``, and each built-in strategy and eval without a YAML)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from evals import load_evals
    from evals.core.config.store import config_dir, register_configs

    load_evals()
    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        return {
            group: sorted(loader.get_group_options(group))
            for group in ("model", "scaling", "eval", "data", "logger", "experiment")
        }


GROUPS = group_options()
REDUCED = [
    "model.architecture.num_hidden_layers=2",
    "model.architecture.hidden_size=64",
    "model.architecture.intermediate_size=96",
    "model.architecture.vocab_size=512",
]


@pytest.mark.parametrize("group,option", [(g, o) for g, options in GROUPS.items() for o in options])
@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_every_option_composes(group, option, compose):
    cfg = compose(f"{group}={option}")
    if group != "experiment":
        assert cfg[group].name in (option, "perplexity", "rope_decay", "base")
    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)


def test_defaults_read_like_a_table_of_contents():
    defaults = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "config.yaml").defaults)
    assert [next(iter(d)) if isinstance(d, dict) else d for d in defaults] == [
        "config_schema",
        "model",
        "scaling",
        "eval",
        "data",
        "logger",
        "hydra",
        "_self_",
        "experiment",
    ]


@pytest.mark.parametrize("option", [o for o in GROUPS["scaling"] if o != "longrope"])
@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_every_scaling_preset_is_valid_for_the_default_model(option, tmp_path, compose):
    job = parse_job(compose(f"scaling={option}"), tmp_path)  # accepted by rope_ext on SmolLM2's geometry
    assert job.scaled is None if option == "none" else [(s.dim, s.base) for s in job.scaled] == [(64, 100000.0)]


def test_longrope_preset_asks_for_its_factor_lists(tmp_path, compose):
    with pytest.raises(ScalingConfigError, match="needs short_factor, long_factor"):
        parse_job(compose("scaling=longrope"), tmp_path)


@pytest.mark.parametrize("option", GROUPS["model"])
def test_every_model_builds_with_random_weights_at_reduced_size(option, compose):
    heads = 4
    cfg = compose(
        f"model={option}",
        "model.weights=random",
        *REDUCED,
        f"model.architecture.num_attention_heads={heads}",
        f"model.architecture.num_key_value_heads={heads // 2 if option != 'llama' else heads}",
    )
    resolved = resolve_model(cfg.model, geometry=True, weights=False)  # from the config alone, on the meta device
    model = random_model(resolved, torch.float32)
    slots = rope_ext.find_rotary_slots(model)
    shapes = resolved.slots
    assert sorted(shapes, key=str) == sorted(slots, key=str)  # the same slots, named alike on meta and real models
    arch = cfg.model.architecture
    rope = arch.rope_parameters  # one set, or one per layer type (Gemma-3: sliding and global)
    bases = [rope.rope_theta] if "rope_theta" in rope else [rope[t].rope_theta for t in set(model.config.layer_types)]
    dim = arch.get("head_dim") or 64 // heads
    assert (
        sorted((s.dim, s.base) for s in slots)
        == sorted((s.dim, s.base) for s in shapes)
        == sorted((dim, base) for base in bases)
    )
    with torch.no_grad():
        assert model(torch.arange(16)[None]).logits.shape == (1, 16, 512)


def test_model_configs_record_real_shapes_and_contexts(compose):
    expected = {
        "llama": (4096, 10000.0, 32, 4096),
        "llama3": (8192, 500000.0, 32, 4096),
        "tinyllama": (2048, 10000.0, 22, 2048),
        "smollm2": (8192, 100000.0, 30, 576),
        "mistral": (8192, 10000.0, 32, 4096),
        "qwen2": (32768, 1000000.0, 28, 3584),
    }
    for name, (trained, base, layers, hidden) in expected.items():
        model = compose(f"model={name}").model
        arch = model.architecture
        assert (
            model.original_max_position,
            arch.rope_parameters.rope_theta,
            arch.num_hidden_layers,
            arch.hidden_size,
        ) == (trained, base, layers, hidden)


@pytest.mark.parametrize(
    "overrides,error",
    [
        (["eval.lenghts=[1]"], ConfigCompositionException),
        (["scaling=yran"], MissingConfigException),
        (["model.pth=/x"], ConfigCompositionException),
        (["scaling.beta_fats=3"], ConfigCompositionException),
    ],
)
def test_typos_fail_at_composition(overrides, error, compose):
    with pytest.raises(error):
        compose(*overrides)


@pytest.mark.parametrize(
    "args,message",
    [
        (["scaling=yran"], "scaling=yran is not an option; available: base, base_20k, compose"),
        (["scaling.name=yran"], "unknown scaling name 'yran'. Valid: base, compose"),
        (["model=gpt"], "model=gpt is not an option; available: gemma3, llama"),
        (["eval=ppl"], "eval=ppl is not an option; available:"),
        (["data=wiki"], "data=wiki is not an option; available: books"),
        (["eval.lengths=[1024,-5]"], "eval.lengths=[1024, -5]: each value must be >= 2"),
        (["model.path=/no/such/dir"], "model.path='/no/such/dir' does not exist"),
        (["scaling=linear", "scaling.factor=0.5"], "factor=0.5 must be >= 1"),
        (["model.weights=fake"], "model.weights='fake': is not one of pretrained, random"),
        (
            ["logger=wandb", "logger.mode=sometimes"],
            "logger.mode='sometimes': is not one of auto, online, offline, disabled",
        ),
        (["model=llama"], "set model.path=/path/to/checkpoint"),
        (
            ["data=text_files", "data.glob=/no/*.txt", "model=tinyllama", "model.weights=random", *REDUCED],
            "data.glob='/no/*.txt' matches no file",
        ),
        (
            ["eval.lengths=[1000000]", "model=tinyllama", "model.weights=random", *REDUCED, "data.books=[persuasion]"],
            "eval.lengths [1000000] exceed every document",
        ),
        (
            ["eval.lengths=[1x,double]"],
            "eval.lengths='double' is not a length: give tokens (4096) or a multiple of the "
            "trained context (8192), e.g. 2x",
        ),
        (["verdict.target=4y"], "verdict.target='4y' is not a length"),
        (["eval=needle", "scaling=yarn", "eval.lengths=[64]"], "length 64 is below what the needles and question need"),
        (["hydra.run.dir=/proc/1/rope"], "the run directory /proc/1/rope cannot be created"),  # even root cannot
    ],
)
@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_bad_input_is_one_clear_line_and_nonzero_exit(args, message, run_cli):
    result = run_cli("logger=none", *args, timeout=120)
    assert result.returncode == 2
    assert message in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert sum(line.startswith("error:") for line in result.stderr.splitlines()) == 1, result.stderr[-2000:]


def test_help_lists_the_groups_a_user_chooses_from(run_cli):
    result = run_cli("logger=none", "--help", timeout=120)
    assert result.returncode == 0
    groups = result.stdout.split("== Configuration groups ==", 1)[1].split("== Config ==", 1)[0]
    assert "scaling: base, base_20k, compose" in groups and "eval: lm_eval, needle" in groups
    assert "schema/" not in groups and "rope_ext: does a RoPE scaling strategy keep your model working" in result.stdout


def test_run_and_sweep_directories_name_the_factor(compose):
    from omegaconf import OmegaConf

    cfg = compose("scaling=yarn", "scaling.factor=4", return_hydra_config=True)
    assert OmegaConf.select(cfg, "hydra.run.dir").endswith("_smollm2_yarn_x4")
    assert "${rope_ext.factor:" in OmegaConf.to_container(cfg.hydra.sweep)["subdir"]  # the sweep's job dirs too
    assert OmegaConf.select(compose("scaling=none", return_hydra_config=True), "hydra.run.dir").endswith("_none")
