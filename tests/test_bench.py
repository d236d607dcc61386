"""The scripts of bench/ still run. Each Python bench runs as a subprocess, as documented, on a tiny random-weight
Llama-3 (2 layers, hidden 256, its real tokenizer) on CPU: it exits 0 and prints its JSON lines and its table, and
what it measures agrees where it must (the one-pass prefix NLL equals the per-length forwards'; the needle grid
answers the same with and without prefix sharing). The shell scripts parse (``bash -n``), and with ``DRY_RUN=1`` they
print their commands instead of running them: every ``run.py`` command composes (a sweep at its first value), the
first one also through the CLI with ``--cfg job``."""

import json
import os
import shlex
import subprocess
import sys

import pytest

from tests.tiny import ROOT

PY = sys.executable
TINY_LLAMA3 = [
    "--model",
    "llama3",
    "--weights",
    "random",
    "--override",
    "model.architecture.num_hidden_layers=2",
    "model.architecture.hidden_size=256",
    "model.architecture.intermediate_size=512",
    "model.architecture.num_attention_heads=4",
    "model.architecture.num_key_value_heads=2",
]


def bench(script: str, *args: str, timeout: int = 300) -> tuple[list[dict], str]:
    """``python bench/<script> <args>`` from the checkout: (its JSON lines, its whole stdout); it must exit 0."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TQDM_DISABLE": "1"}
    done = subprocess.run(
        [PY, f"bench/{script}", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return rows, done.stdout


@pytest.mark.slow  # ~25 s
def test_perplexity_bench_prefix_and_per_length_agree():
    rows, out = bench(
        "perplexity_bench.py",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--lengths",
        "256,512",
        "--modes",
        "body,prefix,per_length",
        *TINY_LLAMA3,
    )
    by_mode = {r["mode"]: r for r in rows}
    assert list(by_mode) == ["body", "prefix", "per_length"] and not any("error" in r for r in rows)
    assert all(r["lengths"] == [256, 512] and r["oom"] is False and r["seconds"] > 0 for r in rows)
    prefix, per_length = by_mode["prefix"]["values"], by_mode["per_length"]["values"]
    assert set(prefix) == set(per_length) == {"256", "512"}
    for length in prefix:
        assert prefix[length] == pytest.approx(per_length[length], rel=1e-5)  # float32: ~1e-7 apart
    assert "| mode | lengths | seconds |" in out and "| per_length | 256,512 |" in out


MICRO_LLAMA3 = [  # gpu_bench.py's own flags: 2 layers, hidden 64, trained context 256
    "--device",
    "cpu",
    "--dtype",
    "float32",
    "--layers",
    "2",
    "--trained",
    "256",
    "--kernel-trained",
    "256",
    "--override",
    "model.architecture.hidden_size=64",
    "model.architecture.intermediate_size=128",
    "model.architecture.num_attention_heads=4",
    "model.architecture.num_key_value_heads=2",
    "model.original_max_position=256",
    "model.architecture.max_position_embeddings=256",
]


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_gpu_bench_runs_every_step_on_cpu(monkeypatch):
    """bench/gpu_bench.py (the GPU rows) on a micro Llama-3 on CPU: every step writes its lines, none fails, the
    fused, FlexAttention (eager here) and float64 paths of the attention methods agree, each method runs through
    both paths, and patched YaRN equals the native one in float32."""
    monkeypatch.setenv("ROPE_EXT_FLEX_EAGER", "1")  # compiling the C++ kernels takes minutes on this CPU
    rows, _ = bench(
        "gpu_bench.py",
        "--steps",
        "kernels,curve,frequency,attention",
        "--methods",
        "self_extend,dca",
        "--lengths",
        "256,512",
        "--kernel-length",
        "512",
        "--frequency-length",
        "512",
        "--attention-lengths",
        "512",
        "--decode-tokens",
        "2",
        *MICRO_LLAMA3,
    )
    assert not any("error" in r for r in rows), [r for r in rows if "error" in r]
    kernels = {r["method"]: r for r in rows if r["step"] == "kernels"}
    assert set(kernels) == {"self_extend", "dca", "yarn_bf16_frequencies"}
    for method in ("self_extend", "dca"):
        assert kernels[method]["fused_vs_float64"] < 1e-5 and kernels[method]["method_vs_plain"] > 1e-3
        assert kernels[method]["flex_vs_float64"] < 1e-5
    assert kernels["yarn_bf16_frequencies"]["patched_vs_native"] < 1e-6
    assert {r["mode"] for r in rows if r["step"] == "curve"} == {"body", "prefix", "per_length"}
    assert len([r for r in rows if r["step"] == "frequency"]) == 5
    attention = [r for r in rows if r["step"] == "attention"]
    assert [(r["method"], r["backend"]) for r in attention] == [
        ("none", "-"),
        *((m, b) for m in ("self_extend", "dca") for b in ("blocks", "flex")),
    ]
    assert all(r["prefill_s"] > 0 and r["decode_ms_per_token"] > 0 for r in attention)


def test_perplexity_bench_exits_non_zero_when_a_mode_fails():
    """A failed mode was a row with its error and exit 0: a broken bench looked like a finished one."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [PY, "bench/perplexity_bench.py", "--modes", "body", "--model", "no_such_model", "--weights", "random"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 1 and '"error"' in done.stdout


@pytest.mark.slow  # ~25 s
def test_attention_bench_runs_each_method_between_two_plain_forwards():
    rows, out = bench("attention_bench.py", "--length", "512", "--methods", "self_extend", *TINY_LLAMA3)
    assert [r["method"] for r in rows] == ["none", "self_extend", "none"]
    assert all(r["length"] == 512 and r["seconds"] > 0 and r["device"] == "cpu" for r in rows)
    assert "| self_extend | blocks | group_size=4, window=1024 |" in out and "| none | - | defaults |" in out


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_needle_bench_answers_the_same_with_and_without_prefix_sharing():
    rows, out = bench("needle_bench.py", "--lengths", "256,512", "--depths", "0.5", "--trials", "1", *TINY_LLAMA3)
    (result,) = rows
    assert result["identical_answers"] is True
    assert [r["mode"] for r in result["rows"]] == ["cell by cell", "shared prefix"]
    cell, shared = result["rows"]
    assert shared["tokens_computed"] < cell["tokens_computed"]  # the shared prefix is run once
    assert "identical answers: True" in out


@pytest.mark.slow  # in CI's rotation: a landing in two (tests/conftest.py); ~1 min or more on 2 cores
def test_needle_bench_times_prefix_extension_by_chunk():
    rows, out = bench("needle_bench.py", "--lengths", "512", "--chunks", "64,128", "--cached", "256", *TINY_LLAMA3)
    assert [(r["cached"], r["chunk"]) for r in rows] == [(256, 64), (256, 128)]
    assert all(isinstance(r["extend_s"], float) and isinstance(r["fresh_s"], float) for r in rows)
    assert "| cached | chunk | extend (s) |" in out


# --- the shell scripts ----------------------------------------------------------------------------------------


def dry_run(script: str, *args: str) -> list[list[str]]:
    """The commands ``DRY_RUN=1 bash bench/<script> <args>`` prints, split as the shell would."""
    done = subprocess.run(
        ["bash", f"bench/{script}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DRY_RUN": "1"},
    )
    assert done.returncode == 0, done.stderr
    return [shlex.split(line) for line in done.stdout.splitlines() if line and not line.startswith("==")]


def first_values(overrides: list[str]) -> list[str]:
    """A sweep's overrides at its first value (an interval at its lower end), as one run composes them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import IntervalSweep

    first = []
    for override in OverridesParser.create().parse_overrides(overrides):
        if not override.is_sweep_override():
            first.append(override.input_line)
        elif isinstance(override.value(), IntervalSweep):
            first.append(f"{override.get_key_element()}={override.value().start}")
        else:
            first.append(f"{override.get_key_element()}={next(iter(override.sweep_string_iterator()))}")
    return first


@pytest.mark.parametrize("script", ["search_smollm2.sh", "trust_smollm2.sh"])
def test_a_bench_shell_script_parses_and_its_commands_compose(script, compose):
    assert subprocess.run(["bash", "-n", f"bench/{script}"], cwd=ROOT).returncode == 0
    commands = dry_run(script)
    runs = [c for c in commands if c[1:2] == ["run.py"]]
    assert len(runs) >= 7, commands
    composed = 0
    for command in runs:
        overrides = [a for a in command[2:] if a != "-m" and not a.startswith("<from ")]
        if "scaling=yarn_searched" in overrides:  # the config the yarn search writes: checked by test_search.py
            continue
        cfg = compose(*first_values(overrides), return_hydra_config=True)
        assert cfg.model.name and cfg.eval.name and cfg.scaling.name
        composed += 1
    assert composed >= 7
    others = [c for c in commands if c[1:2] != ["run.py"]]
    assert all(c[1:3] == ["-m", "evals.report"] for c in others)


def test_the_first_bench_shell_command_composes_through_the_cli(run_cli):
    command = next(c for c in dry_run("trust_smollm2.sh", "ppl_core") if c[1:2] == ["run.py"])
    done = run_cli(*first_values([a for a in command[2:] if a != "-m"]), "--cfg", "job")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "name: perplexity" in done.stdout and "name: none" in done.stdout
