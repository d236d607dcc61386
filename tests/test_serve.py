"""Served = measured: transformers' own OpenAI-compatible server started by ``python -m evals.serve`` (uvicorn on
127.0.0.1) answers greedy ``/v1/completions`` with the tokens the harness generates under ``rope_ext.patch``
(``model.generate``), on a prompt past the trained context where the server without the strategy answers otherwise;
what it cannot serve as measured is one line and exit 2. (No endpoint of transformers 5.25's server returns
log-probabilities: ``/v1/completions`` lists ``logprobs`` among the fields it does not support.)"""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import rope_ext
from evals.serve import client
from evals.serve.__main__ import main as serve_main
from tests.tiny import MICRO_TRAINED, tiny_llama

PROMPT = " ".join(f"The quick brown fox number {i} jumps over the lazy dog near the river." for i in range(12))
NEW = 24  # tokens generated: long enough that the strategies' answers part
STRATEGIES = {
    "none": {"name": "none"},
    "yarn": {"name": "yarn", "factor": 4},
    "self_extend": {"name": "self_extend", "group_size": 4, "window": 16},
    "dca": {"name": "dca"},
}
STATIC = json.dumps({"cache_implementation": "static"})  # a request asking for a static cache: decodes as measured
QUANTIZED = json.dumps({"cache_implementation": "quantized"})  # lossy keys: other numbers than the measured ones


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The micro Llama (trained context 64, random weights drawn wide enough -- initializer_range 0.2 -- that its
    greedy answer follows positions; at 0.02 every strategy answers alike) saved with the bundled tokenizer."""
    from evals.core.inputs.loading import bundled_tokenizer

    path = tmp_path_factory.mktemp("serve") / "tiny"
    tiny_llama(vocab=49152, initializer_range=0.2).save_pretrained(path)
    bundled_tokenizer().save_pretrained(path)
    return path


def harness(checkpoint, setting: dict) -> tuple[str, int]:
    """(text, tokens) the harness generates: greedy ``model.generate`` under rope_ext.patch (none: the model as it
    is), on the checkpoint as the server loads it (float32, sdpa)."""
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32, attn_implementation="sdpa").eval()
    inputs = tokenizer(PROMPT, return_tensors="pt")
    assert inputs["input_ids"].shape[1] > 2 * MICRO_TRAINED  # past the trained context
    with torch.no_grad(), rope_ext.patch(model, rope_ext.resolve(setting, MICRO_TRAINED)):
        out = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
    generated = out[0, inputs["input_ids"].shape[1] :]
    return tokenizer.decode(generated, skip_special_tokens=True), len(generated)


def args(checkpoint, setting: dict, *extra: str) -> list[str]:
    return [
        "--model",
        str(checkpoint),
        "--scaling",
        json.dumps(setting),
        "--trained-context",
        str(MICRO_TRAINED),
        "--context",
        "512",
        "--dtype",
        "float32",
        *extra,
    ]


@pytest.fixture(scope="module")
def unpatched(checkpoint):
    """What the server without the strategy answers (none, its prompt-length limit raised to 512)."""
    with client.running(args(checkpoint, STRATEGIES["none"])) as url:
        return client.complete(url, PROMPT, NEW, timeout=120)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_the_server_answers_the_tokens_the_harness_generates_under_the_patch(name, checkpoint, unpatched):
    setting = STRATEGIES[name]
    text, count = harness(checkpoint, setting)
    if name == "none":
        served = unpatched
    else:
        with client.running(args(checkpoint, setting)) as url:
            served = client.complete(url, PROMPT, NEW, timeout=120)
            if name == "self_extend":  # a static cache decodes as measured; a lossy one is refused, not served
                status, body = client.post(
                    url, "/v1/completions", {"prompt": PROMPT, "max_tokens": NEW, "generation_config": STATIC}, 120
                )
                assert status == 200 and body["choices"][0]["text"] == text, body
                status, body = client.post(
                    url, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "generation_config": QUANTIZED}, 120
                )
                assert status == 400 and "cache_implementation='quantized' is refused" in json.dumps(body)
        # not vacuous: past the trained context the unpatched server answers otherwise
        assert unpatched["choices"][0]["text"] != text
    assert served["usage"]["completion_tokens"] == count == NEW
    assert served["choices"][0]["text"] == text


@pytest.mark.parametrize(
    "setting,extra,message",
    [
        (
            STRATEGIES["self_extend"],
            ["--compile"],
            "--compile is refused for self_extend-group_size4-window16: torch.compile",
        ),
        (STRATEGIES["yarn"], ["--compile"], "--compile is refused: static-cache compiled generation is not checked"),
        (STRATEGIES["dca"], ["--continuous-batching"], "--continuous-batching is refused: continuous batching runs"),
        (STRATEGIES["none"], ["--quantization", "bnb-4bit"], "--quantization is refused: quantization serves other"),
        ({"name": "self_extnd"}, [], "self_extnd"),
        ({"name": "yarn", "factor": -2}, [], "factor"),
    ],
)
def test_what_the_server_cannot_serve_as_measured_is_one_line_and_exit_2(setting, extra, message, checkpoint, capsys):
    assert serve_main(args(checkpoint, setting, *extra)) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and message in line


def test_bad_scaling_json_and_a_missing_model_are_one_line_and_exit_2(checkpoint, tmp_path, capsys):
    assert serve_main(["--model", str(checkpoint), "--scaling", "{yarn"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: --scaling '{yarn' is not JSON")
    assert serve_main(["--model", str(tmp_path / "nothing"), "--scaling", '{"name": "yarn", "factor": 2}']) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: --model {tmp_path / 'nothing'}: its config cannot be read")


@pytest.mark.slow
def test_smollm2_served_with_self_extend_answers_as_the_harness(compose):
    """The bundled SmolLM2 GGUF, Self-Extend resolved at a small trained context (256) so that a short prompt is
    past it: the server's greedy tokens are the harness's (its own loader, load_model)."""
    from evals.core.inputs.loading import load_model
    from evals.core.inputs.models import SMOLLM2_GGUF, SMOLLM2_PACKAGE, package_dir, resolve_model

    trained, setting, new = 256, {"name": "self_extend", "group_size": 4, "window": 64}, 16
    loaded = load_model(resolve_model(compose().model, geometry=False, weights=True))
    prompt = " ".join(f"Line {i}: the special magic number is {1000 + 37 * i}." for i in range(40))
    inputs = loaded.tokenizer(prompt, return_tensors="pt")
    assert 2 * trained < inputs["input_ids"].shape[1] < 1024
    with torch.no_grad(), rope_ext.patch(loaded.model, rope_ext.resolve(setting, trained)):
        out = loaded.model.generate(**inputs, max_new_tokens=new, do_sample=False)
    text = loaded.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    where = ["--model", str(package_dir(SMOLLM2_PACKAGE)), "--gguf-file", SMOLLM2_GGUF]
    common = ["--trained-context", str(trained), "--context", "1024", "--dtype", "float32"]
    answers = {}
    for name, scaling in (("self_extend", setting), ("none", {"name": "none"})):
        with client.running([*where, "--scaling", json.dumps(scaling), *common]) as url:
            answers[name] = client.complete(url, prompt, new, timeout=300)["choices"][0]["text"]
    assert answers["self_extend"] == text
    assert answers["none"] != text


def test_a_self_extend_job_deploys_the_server_command_and_the_answer_names_it(checkpoint, tmp_path):
    """deploy/ of a Self-Extend job: transformers-serve.sh, whose command the launcher takes as it is (the job's
    model, scaling, trained context and judged context), README.md saying it is servable there and keeping the
    other engines' reasons."""
    import shlex

    from evals.core.run.deploy import write_deploy
    from evals.serve.__main__ import parse, prepare
    from rope_ext.export import geometry

    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    scaling = rope_ext.resolve(STRATEGIES["self_extend"], MICRO_TRAINED)
    verdict = {"target": 256, "trained": MICRO_TRAINED, "lengths": [{"length": 256, "state": "yes", "reason": "r"}]}
    results = {"config": {"model": {"name": "mine", "path": str(checkpoint), "dtype": "float32"}}, "verdict": verdict}
    write_deploy(scaling, geometry(model, scaling), model.config.to_dict(), tmp_path, results)
    readme = (tmp_path / "deploy" / "README.md").read_text()
    assert (
        "- transformers serve: transformers-serve.sh, serves 256 tokens; servable on transformers' server "
        "(rope_ext's patch in the server process), checked by tests/test_serve.py"
    ) in readme
    for engine in ("transformers", "vllm", "sglang", "llama.cpp"):
        assert f"- {engine}: cannot express it (" in readme
    assert readme.startswith("verdict at the target 256, 4x the trained 64: yes (r); the commands serve 256 tokens.")
    script = (tmp_path / "deploy" / "transformers-serve.sh").read_text().splitlines()
    assert script[0] == "# servable on transformers' server (rope_ext's patch in the server process), " + (
        "checked by tests/test_serve.py"
    )
    line = shlex.split(script[-1])
    assert line[:3] == ["python", "-m", "evals.serve"]
    ready = prepare(parse(line[3:]))
    assert ready["rope"]["route"] == "patch" and ready["rope"]["context"] == 256 and ready["rope"]["trained"] == 64
    assert rope_ext.resolve(ready["rope"]["scaling"]) == scaling
    assert ready["options"]["force_model"] == str(checkpoint) and ready["options"]["dtype"] == "float32"
