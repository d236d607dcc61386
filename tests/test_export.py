"""Exported = measured: a strategy exported to transformers' config.json gives, loaded with no rope_ext, the logits of
the patched model; the engines' settings use their own names and say in one line what they cannot express."""

import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import rope_ext
from rope_ext.export import ENGINES, Unsupported, export, geometry, transformers_config
from rope_ext.export.common import read_lock
from tests.tiny import ROOT, TINY_ARCHITECTURE, tinyllama

TRAINED, VOCAB, LENGTH = 64, 96, 200  # 200 tokens on a 64-token model: every strategy changes the logits
FAMILIES = {  # real architectures at toy sizes: plain, q/k/v biases, per-layer-type rope (global scaled), partial rotary
    "llama": dict(
        model_type="llama",
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
    "qwen2": dict(
        model_type="qwen2",
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    ),
    "gemma3": dict(
        model_type="gemma3_text",
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        },
    ),
    "gpt_neox": dict(
        model_type="gpt_neox",
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25},
    ),
}
NATIVE = [
    {"name": "linear", "factor": 4},
    {"name": "ntk", "factor": 4},
    {"name": "base", "base": 5e5},
    {"name": "dynamic_ntk", "factor": 4},
    {"name": "yarn", "factor": 4},
    {"name": "yarn", "factor": 3, "beta_fast": 16, "truncate": False},
    {"name": "ntk_by_parts", "factor": 4},
    # factors 2, 4, 8 with low/high frequency factors off their defaults (1, 4): a factor read from another key differs
    {"name": "llama3", "factor": 2, "low_freq_factor": 2, "high_freq_factor": 6},
    {"name": "llama3", "factor": 4, "low_freq_factor": 2, "high_freq_factor": 6},
    {"name": "llama3", "factor": 8, "low_freq_factor": 2, "high_freq_factor": 6},
]


def family_model(family):
    spec = dict(FAMILIES[family])
    config = AutoConfig.for_model(spec.pop("model_type"), **spec, vocab_size=VOCAB, max_position_embeddings=TRAINED)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def exported_logits(model, scaling, ids, tmp_path):
    """The model saved with the exported keys written into its config.json, loaded by transformers alone."""
    found = export(scaling, geometry(model, scaling), "transformers", model.config.to_dict())["config"]
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **found}))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.no_grad():
        return loaded(ids).logits


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("setting", NATIVE, ids=lambda s: "-".join(f"{v}" for v in s.values()))
def test_a_config_json_export_gives_the_logits_rope_ext_measured(family, setting, tmp_path):
    model = family_model(family)
    scaling = rope_ext.resolve(setting, TRAINED)
    if family == "gemma3" and setting.get("truncate") is False:  # transformers would read it as true: refused
        with pytest.raises(Unsupported, match="truncate from the top level of rope_parameters only"):
            export(scaling, geometry(model, scaling), "transformers", model.config.to_dict())
        return
    ids = torch.randint(0, VOCAB, (1, LENGTH), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = model(ids).logits
        with rope_ext.patch(model, scaling):
            ours = model(ids).logits
    theirs = exported_logits(model, scaling, ids, tmp_path)
    scale = ours.abs().max()
    # the strategy matters at this length: the check can fail (GPT-NeoX rotates 2 pairs: Llama-3 x2 moves it less)
    assert (plain - ours).abs().max() / scale > (3e-4 if family == "gpt_neox" else 1e-3)
    assert (ours - theirs).abs().max() / scale <= 1e-5


def test_gemma3_exports_its_global_layers_only_and_keeps_the_sliding_ones():
    model = family_model("gemma3")
    scaling = rope_ext.resolve({"name": "yarn", "factor": 4}, TRAINED)
    found = transformers_config(scaling, geometry(model, scaling), model.config.to_dict())
    assert found["rope_parameters"]["sliding_attention"] == {"rope_type": "default", "rope_theta": 1e4}
    assert found["rope_parameters"]["full_attention"]["rope_type"] == "yarn"
    assert found["max_position_embeddings"] == 4 * TRAINED


def test_longrope_exports_its_factor_lists(tmp_path):
    model = family_model("llama")
    half = model.config.head_dim // 2 if getattr(model.config, "head_dim", None) else 8
    scaling = rope_ext.resolve(
        {
            "name": "longrope",
            "factor": 4,
            "short_factor": [1.0] * half,
            "long_factor": [1.0 + i / half * 3 for i in range(half)],
        },
        TRAINED,
    )
    ids = torch.randint(0, VOCAB, (1, LENGTH), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), rope_ext.patch(model, scaling):
        ours = model(ids).logits
    assert (ours - exported_logits(model, scaling, ids, tmp_path)).abs().max() / ours.abs().max() <= 1e-5


@pytest.mark.parametrize(
    "setting,engine,reason",
    [
        ({"name": "self_extend"}, "transformers", "an attention-level method changes which relative position"),
        ({"name": "logn"}, "vllm", "query scaling inside attention has no config key"),
        (
            {"name": "dynamic_ntk", "factor": 4},
            "vllm",
            r"one NTK base at start-up, from max_position_embeddings and max_trained_positions \(static\)",
        ),
        ({"name": "dca"}, "vllm", "dual chunk attention on the Qwen2 family only"),
        ({"name": "yarn", "factor": 2, "dynamic": True}, "transformers", "no dynamic YaRN"),
        ({"name": "yarn", "factor": 2, "truncate": False}, "llama.cpp", "truncate=false"),
        ({"name": "llama3", "factor": 2}, "llama.cpp", "rope_freqs tensor"),
        ({"name": "p_rope"}, "sglang", "build the 'proportional' rope \\(p-RoPE\\) from the rotary dim"),
    ],
)
def test_what_an_engine_cannot_express_is_one_line_not_an_approximation(setting, engine, reason):
    model = family_model("llama")
    scaling = rope_ext.resolve(setting, TRAINED)
    with pytest.raises(Unsupported, match=reason) as err:
        export(scaling, geometry(model, scaling), engine, model.config.to_dict())
    assert "\n" not in str(err.value)


def test_vllm_gets_yarns_attention_factor_and_sglang_its_own_attn_factor():
    from rope_ext.strategies.frequency import yarn_mscale

    model = family_model("llama")
    for setting, expected in (
        ({"name": "yarn", "factor": 4}, 1.0),
        ({"name": "ntk_by_parts", "factor": 4}, 1 / yarn_mscale(4.0)),
    ):
        scaling = rope_ext.resolve(setting, TRAINED)
        vllm = export(scaling, geometry(model, scaling), "vllm", model.config.to_dict())
        # vLLM 0.33 reads attention_factor as it is; SGLang reads attn_factor and multiplies it by 0.1 ln s + 1
        assert vllm["hf_overrides"]["rope_parameters"]["attention_factor"] == pytest.approx(expected * yarn_mscale(4.0))
        assert "attn_factor" not in vllm["hf_overrides"]["rope_parameters"]
        sglang = export(scaling, geometry(model, scaling), "sglang", model.config.to_dict())
        assert sglang["json_model_override_args"]["rope_scaling"]["attn_factor"] == pytest.approx(expected)


def test_dca_goes_to_vllm_and_sglang_as_qwen_dual_chunk_attention():
    model = family_model("qwen2")
    scaling = rope_ext.resolve({"name": "dca"}, TRAINED)
    vllm = export(scaling, geometry(model, scaling), "vllm", model.config.to_dict())
    assert vllm["hf_overrides"] == {
        "dual_chunk_attention_config": {"chunk_size": 48, "local_size": 4, "original_max_position_embeddings": 64}
    }
    assert vllm["command"].startswith("VLLM_ATTENTION_BACKEND=DUAL_CHUNK_FLASH_ATTN vllm serve")
    sglang = export(scaling, geometry(model, scaling), "sglang", model.config.to_dict())
    assert "--attention-backend dual_chunk_flash_attn" in sglang["command"]
    assert vllm["note"] == "not verified against vLLM 0.33.0 (dual chunk attention runs in a GPU attention backend)"


# llama-cpp-python's Llama(...) arguments for RoPE (llama_cpp/llama.py) and llama.cpp's flags (common/arg.cpp)
LLAMA_CPP_PYTHON_ARGS = {
    "rope_scaling_type",
    "rope_freq_base",
    "rope_freq_scale",
    "yarn_ext_factor",
    "yarn_attn_factor",
    "yarn_beta_fast",
    "yarn_beta_slow",
    "yarn_orig_ctx",
    "n_ctx",
    "kv_overrides",
}
LLAMA_CPP_FLAGS = {
    "--rope-scaling",
    "--rope-scale",
    "--rope-freq-base",
    "--rope-freq-scale",
    "--yarn-orig-ctx",
    "--yarn-ext-factor",
    "--yarn-attn-factor",
    "--yarn-beta-slow",
    "--yarn-beta-fast",
    "-c",
    "--grp-attn-n",
    "--grp-attn-w",
    "--override-kv",
}


def test_llama_cpp_gets_yarn_in_its_own_names_and_semantics():
    model = family_model("llama")
    scaling = rope_ext.resolve({"name": "yarn", "factor": 4, "beta_fast": 16}, TRAINED)
    found = export(scaling, geometry(model, scaling), "llama.cpp")
    args = found["llama_cpp_python"]
    assert set(args) <= LLAMA_CPP_PYTHON_ARGS and {f for f in found["flags"] if f.startswith("-")} <= LLAMA_CPP_FLAGS
    # rope_freq_scale = 1/s; llama.cpp applies YaRN's 0.1 ln s + 1 itself, so the default attention factor is 1 there
    # (set as the GGUF key it multiplies by: --yarn-attn-factor is overwritten since llama.cpp PR #17945)
    assert args == {
        "rope_scaling_type": 2,
        "rope_freq_scale": 0.25,
        "yarn_orig_ctx": 64,
        "yarn_ext_factor": 1.0,
        "yarn_beta_fast": 16.0,
        "yarn_beta_slow": 1.0,
        "n_ctx": 256,
        "kv_overrides": {"llama.rope.scaling.attn_factor": pytest.approx(1.0)},
    }
    ntk = export(rope_ext.resolve({"name": "ntk", "factor": 4}, TRAINED), geometry(model, scaling), "llama.cpp")
    dim = geometry(model, scaling).dim
    assert ntk["llama_cpp_python"]["rope_freq_base"] == pytest.approx(10000.0 * 4 ** (dim / (dim - 2)))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "run"
    command = [
        sys.executable,
        str(ROOT / "run.py"),
        *tinyllama(TINY_ARCHITECTURE, original_max_position=256),
        "scaling=yarn",
        "target=2x",
        "eval.lengths=[64]",
        "eval.documents=1",
        "data.books=[persuasion]",
        "verdict.baseline=false",
        f"output_dir={out}",
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def export_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "evals.export", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_a_finished_job_has_a_deploy_folder_for_every_engine(finished_run):
    deploy = finished_run / "deploy"
    config = json.loads((deploy / "transformers.json").read_text())
    assert config["rope_parameters"]["rope_type"] == "yarn" and config["rope_parameters"]["factor"] == 2.0
    assert config["max_position_embeddings"] == 512
    assert "--max-model-len 512" in (deploy / "vllm.sh").read_text()
    assert "--context-length 512" in (deploy / "sglang.sh").read_text()
    assert "--rope-scaling yarn --rope-freq-scale 0.5 --yarn-orig-ctx 256" in (deploy / "llama.cpp.sh").read_text()
    readme = (deploy / "README.md").read_text()
    # the job measured 64 tokens only: its target 512 has no verdict, and the README opens saying so
    assert readme.startswith(
        "WARNING: the target 512 was not evaluated and no evaluated length beyond the trained 256 is yes: the "
        "commands serve the target's 512 tokens, unjudged."
    )
    # what was checked, and where: the engine's own code in rope_ext's tests, not a run of this export
    assert (
        "- vllm: vllm.sh, serves 512 tokens; checked: vLLM 0.33.0's own config loading, start-up length check and "
        "rotary embedding, run on such overrides in rope_ext's tests/test_engines.py for Llama, Qwen2, Mistral, Gemma-3, "
        "DeepSeek-V3; "
        "needs a vLLM with rope_parameters support"
    ) in readme
    assert "vLLM 0.33.0 installs transformers>=5.16.1,<5.21" in readme
    assert "SGLang 0.5.23 installs transformers==5.19.0" in readme and "verified against" not in readme
    for name in ("vllm.sh", "sglang.sh", "llama.cpp.sh"):
        text = (deploy / name).read_text()
        assert text.startswith("# checked: ") and "# the job ran random weights: MODEL stands for" in text
    locked = read_lock()["transformers"]  # the version the tests run on (requirements.lock), not a typed one
    assert config["rope_ext_versions"].startswith(f"checked: transformers {locked} loading such a config.json gives")


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_export_reads_a_run_directory_or_overrides(finished_run):
    from_run = export_cli(str(finished_run), "--to", "vllm")
    assert from_run.returncode == 0, from_run.stderr[-2000:]
    assert '"rope_type": "yarn"' in from_run.stdout and "--max-model-len 512" in from_run.stdout
    overrides = export_cli(
        *tinyllama(TINY_ARCHITECTURE, original_max_position=256), "scaling=yarn", "target=2x", "--to", "transformers"
    )
    assert overrides.returncode == 0, overrides.stderr[-2000:]
    assert json.loads(overrides.stdout) == json.loads((finished_run / "deploy" / "transformers.json").read_text())


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["{run}", "--to", "tensorrt"],
            "--to tensorrt is not an engine rope_ext exports to; valid: transformers, vllm, sglang, llama.cpp",
        ),
        (["{unfinished}", "--to", "vllm"], "is not a finished run (status running)"),
        (["/nonexistent/run", "--to", "vllm"], "/nonexistent/run does not exist"),
        (["scaling=dca", "--to", "transformers"], "transformers cannot express 'dca-chunk_size6144-local_window512'"),
        (["scaling=yran", "--to", "vllm"], "scaling=yran is not an option"),
        # two directories: Hydra's parse error of the first as an override said nothing of what was wrong
        (["{run}", "{run}", "--to", "vllm"], "is not an override (key=value), and a directory is exported alone"),
    ],
)
@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_bad_export_input_is_one_line_and_exit_2(args, message, finished_run, tmp_path):
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    data = json.loads((finished_run / "results.json").read_text())
    (unfinished / "results.json").write_text(json.dumps({**data, "status": "running"}))
    result = export_cli(*[a.format(run=finished_run, unfinished=unfinished) for a in args])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and message in line


def test_the_engine_is_read_in_any_case(capsys):
    from evals.export import main

    overrides = [*tinyllama(TINY_ARCHITECTURE, original_max_position=256), "scaling=yarn", "target=2x"]
    assert main([*overrides, "--to", "VLLM"]) == 0
    upper = capsys.readouterr().out
    assert main([*overrides, "--to", "vllm"]) == 0
    assert upper == capsys.readouterr().out and "--max-model-len 512" in upper
    assert main([*overrides, "--to", "Llama.CPP"]) == 0 and "--yarn-orig-ctx 256" in capsys.readouterr().out


# every strategy an engine may accept, set up for a target as run.py sets it up (rope_ext.strategies.targets: the factor N/L)
TARGETED = [
    {"name": "none"},
    {"name": "linear"},
    {"name": "ntk"},
    {"name": "base", "base": 5e5},
    {"name": "dynamic_ntk"},
    {"name": "yarn"},
    {"name": "ntk_by_parts"},
    {"name": "llama3", "low_freq_factor": 2, "high_freq_factor": 6},
    {"name": "p_rope"},
    {"name": "dca"},
]


def exported_contexts(engine: str, found: dict) -> set[int]:
    """Every context an export sets: the flag and the max_position_embeddings the engine's start-up check reads."""
    import re

    if engine == "transformers":
        return {found["config"]["max_position_embeddings"]}
    flag, key = {
        "vllm": ("--max-model-len", "hf_overrides"),
        "sglang": ("--context-length", "json_model_override_args"),
    }.get(engine, ("-c", None))
    values = {int(v) for v in re.findall(rf"{flag} (\d+)", found["command"])} | {found["context"]}
    if key:
        values.add(found[key]["max_position_embeddings"])
    else:
        values.add(found["llama_cpp_python"]["n_ctx"])
    return values


@pytest.mark.parametrize("times", [2, 4])
def test_every_engine_serves_trained_x_target_for_every_strategy_it_accepts(times):
    from rope_ext.strategies.targets import set_up

    target, accepted = times * TRAINED, set()
    for family in ("llama", "qwen2"):
        model = family_model(family)
        for setting in TARGETED:
            scaling, _ = set_up(setting, TRAINED, target)
            geo = geometry(model, scaling)
            for engine in ENGINES:
                try:
                    found = export(scaling, geo, engine, model.config.to_dict(), context=target)
                except Unsupported:
                    continue
                accepted.add((setting["name"], engine))
                if engine == "transformers" and scaling.name == "dynamic_ntk":  # grown from the trained context
                    assert found["config"]["max_position_embeddings"] == TRAINED
                    continue
                assert exported_contexts(engine, found) == {target}, (family, setting, engine)
                if scaling.factor and scaling.name != "dca":  # without a context: what the factor covers, the same
                    assert exported_contexts(engine, export(scaling, geo, engine, model.config.to_dict())) == {target}
    # base and p_rope (no factor) and DCA too, in every engine that accepts them
    assert {("base", e) for e in ENGINES} | {("p_rope", "vllm"), ("dca", "vllm"), ("dca", "sglang")} <= accepted
    assert len(accepted) == 31, sorted(accepted)


def test_an_export_from_overrides_serves_the_target_for_strategies_without_a_factor(capsys):
    from evals.export import main

    overrides = [*tinyllama(TINY_ARCHITECTURE, original_max_position=256), "scaling=base", "target=2x"]
    for engine, flag in (("vllm", "--max-model-len 512"), ("sglang", "--context-length 512"), ("llama.cpp", "-c 512")):
        assert main([*overrides, "--to", engine]) == 0
        assert flag in capsys.readouterr().out


def judged_verdict(states: dict, target: int = 4 * TRAINED) -> dict:
    """results.json's verdict with these states by length (trained context TRAINED)."""
    rows = [{"length": length, "state": state, "reason": f"why at {length}"} for length, state in states.items()]
    return {"target": target, "trained": TRAINED, "lengths": rows}


@pytest.mark.parametrize(
    "states,context,first",
    [
        ({64: "yes", 256: "yes"}, 256, "verdict at the target 256, 4x the trained 64: yes (why at 256); the commands"),
        ({64: "yes", 256: "NO"}, 256, "WARNING: verdict at the target 256, 4x the trained 64: NO (why at 256)"),
        (
            {64: "yes", 128: "yes", 192: "inconclusive"},
            128,
            "WARNING: the target 256 was not evaluated; the verdict is yes up to 128, so the commands serve 128",
        ),
        (
            {64: "yes", 128: "NO"},
            256,
            "WARNING: the target 256 was not evaluated and no evaluated length beyond the trained 64 is yes",
        ),
    ],
    ids=["yes", "NO", "largest-yes", "unjudged"],
)
def test_deploy_serves_the_length_the_verdict_judged_and_opens_with_that_verdict(states, context, first, tmp_path):
    from evals.core.run.deploy import write_deploy

    model = family_model("llama")
    for setting in ({"name": "yarn", "factor": 4}, {"name": "base", "base": 5e5}):
        scaling = rope_ext.resolve(setting, TRAINED)
        results = {"verdict": judged_verdict(states)}
        write_deploy(scaling, geometry(model, scaling), model.config.to_dict(), tmp_path, results)
        deploy = tmp_path / "deploy"
        assert (deploy / "README.md").read_text().startswith(first), setting
        assert f"--max-model-len {context}" in (deploy / "vllm.sh").read_text()
        assert f"--context-length {context}" in (deploy / "sglang.sh").read_text()
        assert f" -c {context}" in (deploy / "llama.cpp.sh").read_text()
        # YaRN keeps the table of its factor (transformers and vLLM derive from it); served: the judged length
        table = json.loads((deploy / "transformers.json").read_text())["max_position_embeddings"]
        assert table == max(context, 256 if setting["name"] == "yarn" else 0)


def test_deploy_commands_name_the_model_the_job_ran(tmp_path):
    from evals.core.run.deploy import write_deploy

    model = family_model("llama")
    checkpoint = tmp_path / "mine"
    model.save_pretrained(checkpoint)
    scaling = rope_ext.resolve({"name": "yarn", "factor": 4}, TRAINED)
    results = {"config": {"model": {"name": "mine", "path": str(checkpoint)}}, "verdict": judged_verdict({256: "yes"})}
    write_deploy(scaling, geometry(model, scaling), model.config.to_dict(), tmp_path / "run", results)
    deploy = tmp_path / "run" / "deploy"
    assert f"vllm serve {checkpoint} --hf-overrides" in (deploy / "vllm.sh").read_text()
    assert f"--model-path {checkpoint} " in (deploy / "sglang.sh").read_text()
    llama_cpp = (deploy / "llama.cpp.sh").read_text()  # no GGUF of it: said, and the placeholder kept
    assert f"# llama.cpp needs a GGUF of {checkpoint} (llama.cpp's convert_hf_to_gguf.py)" in llama_cpp
    assert "-m MODEL.gguf" in llama_cpp
