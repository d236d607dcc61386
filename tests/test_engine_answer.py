"""An answer per engine (evals/core/decision/engines.py): a sweep's ranked answer names, for transformers, vLLM, SGLang and
llama.cpp, the best recommended strategy that engine can serve (rope_ext.export decides) and its ratio to the best;
``python -m evals.export SWEEP --to ENGINE`` exports that one and says why, or exits 2 when none can be served.

The sweep's results.json files hold what a job records before it runs (parse_job on the config the CLI composes:
job, config, declared) and perplexity measured on the same 64-token blocks of six documents."""

import csv
import json
import math

import numpy as np
import pytest

from evals.core.job.parse import parse_job
from evals.core.measure import Measurement
from evals.export import main as export_main
from evals.report import write_report
from tests.tiny import TINY_ARCHITECTURE, tinyllama

MODEL = tinyllama(TINY_ARCHITECTURE, original_max_position=256)  # a Llama: no dual chunk attention in vLLM/SGLang
DIFFICULTY = np.random.default_rng(3).normal(0, 0.02, (6, 8))  # the same tokens in every run


def blocks(length: int, ppl: float, seed: int) -> dict:
    own = np.random.default_rng(seed).normal(0, 0.01, DIFFICULTY.shape)[:, : length // 64]
    nll = DIFFICULTY[:, : length // 64] - DIFFICULTY.mean() + own - own.mean() + math.log(ppl)
    return {f"doc{d}/{64 * b}": (64 * float(nll[d, b]), 64.0) for d in range(6) for b in range(length // 64)}


def finished(compose, sweep, index: int, scaling: str, at_target: float) -> str:
    """A finished perplexity job of ``scaling`` at 0.5x, 1x and the target 2x (512) in the sweep; its label."""
    out = sweep / f"{index}_{scaling}"
    job = parse_job(
        compose(
            *MODEL,
            f"scaling={scaling}",
            "target=2x",
            "eval=perplexity",
            "eval.lengths=[128,256,512]",
            f"output_dir={out}",
        ),
        out,
    )
    values = {128: 25.0, 256: 25.7, 512: at_target}
    data = {
        **json.loads(json.dumps(job.sections(), default=str)),
        "status": "done",
        "measurements": [
            Measurement("ppl", L, v, 6 * L, "64-token block", blocks(L, v, index if L == 512 else 0)).record()
            for L, v in values.items()
        ],
        "timings": {"elapsed_s": 10.0, "model_load_s": 1.0, "peak_memory_bytes": 2**20},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(data))
    return data["job"]["scaling"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, compose):
    """dca best, self_extend tied with it, yarn 4% worse: all recommended; the unscaled model 2x worse at 2x."""
    root = tmp_path_factory.mktemp("engines") / "sweep"
    finished(compose, root, 0, "none", 53.0)
    labels = {
        s: finished(compose, root, i, s, v)
        for i, (s, v) in enumerate((("dca", 26.2), ("self_extend", 26.21), ("yarn", 26.9)), 1)
    }
    write_report([root])
    return root, labels


def test_the_answer_names_the_best_strategy_each_engine_can_serve(sweep):
    root, labels = sweep
    dca, self_extend, yarn = labels["dca"], labels["self_extend"], labels["yarn"]
    answer = (root / "report_answer.txt").read_text().splitlines()
    assert answer[0].startswith(f"at 512 (2x) on tinyllama[random]: {dca} ≈ {self_extend} (tied), then {yarn}; ")
    engines = {line.split(":")[0].strip(): line.strip() for line in answer[1:]}
    assert set(engines) == {"transformers", "vllm", "sglang", "llama.cpp", "transformers serve"}
    # transformers' own server serves what was measured: the best, attention-level as it is (evals.serve)
    assert engines["transformers serve"] == (
        f"transformers serve: {dca} (the best; servable on transformers' server (rope_ext's patch in the server "
        f"process), checked by tests/test_serve.py)"
    )
    # dca and self_extend are attention-level: no config.json or vLLM setting, and dca is vLLM's on Qwen2 only
    assert (
        engines["vllm"].startswith(f"vllm: {yarn}, x1.02")
        and f"of {dca} ({dca}: vLLM runs dual chunk" in engines["vllm"]
        and f"; vLLM cannot express '{self_extend}': an attention-level method" in engines["vllm"]
    )
    assert engines["transformers"].startswith(f"transformers: {yarn}, x1.02")
    # llama-cli's Self-Extend (--grp-attn-n/-w) regroups a whole window of the KV cache: not the method measured
    assert engines["llama.cpp"].startswith(f"llama.cpp: {yarn}, x1.02")
    assert f"- vllm: {yarn}" in (root / "report.md").read_text()
    chosen = {r["strategy"]: r["best_for_engines"] for r in csv.DictReader((root / "report_ranking.csv").open())}
    assert chosen[yarn] == "transformers, vllm, sglang, llama.cpp" and not chosen[self_extend]
    assert chosen[dca] == "transformers serve"
    ratio = engines["vllm"].split(", ", 1)[1].split(" of ")[0]
    low, high = (float(x) for x in ratio.split("[")[1].rstrip("]").split(", "))
    assert 1 < low < 1.027 < high  # the simultaneous interval of the ranking's own comparison: yarn is worse than dca


def test_export_of_a_sweep_takes_the_best_the_engine_can_serve_and_says_why(sweep, capsys):
    root, labels = sweep
    assert export_main([str(root), "--to", "vllm"]) == 0
    out, err = capsys.readouterr()
    assert (
        json.loads(out.split("--hf-overrides ")[1].split("' ")[0].strip("'"))["rope_parameters"]["rope_type"] == "yarn"
    )
    (line,) = err.strip().splitlines()
    assert line.startswith(f"{labels['dca']}, {labels['self_extend']} rank higher but vllm cannot serve them (")
    assert f"; exporting {labels['yarn']}, x1.02" in line and f"of {labels['dca']} at 512 on tinyllama[random]" in line
    assert export_main([str(root), "--to", "llama.cpp"]) == 0
    out, err = capsys.readouterr()
    assert "--grp-attn-n" not in out and "--rope-scaling yarn" in out and f"exporting {labels['yarn']}, x1.02" in err


def test_a_sweep_no_engine_method_of_which_can_be_served_is_one_line_and_exit_2(tmp_path, compose, capsys):
    root = tmp_path / "sweep"
    finished(compose, root, 0, "none", 53.0)
    dca = finished(compose, root, 1, "dca", 26.2)
    write_report([root], print_verdict=True)
    assert "vllm: none of the recommended methods can be served by vllm: " in (root / "report_answer.txt").read_text()
    assert "\n  vllm: none of the recommended methods can be served by vllm: " in capsys.readouterr().out
    assert export_main([str(root), "--to", "sglang"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(
        f"error: none of the recommended methods of {root} can be served by sglang: {dca}: SGLang runs"
    )


UNCHECKED = [*MODEL, "model.architecture.model_type=qwen3"]  # a Qwen3: its vLLM/SGLang module is not checked


def test_the_per_engine_answer_keeps_not_verified_where_the_export_says_it(tmp_path, compose):
    from evals.core.decision.engines import engine_line, per_engine
    from rope_ext.export.common import ENGINE_VERIFIED_NAMES

    configs = {}
    for model, name in ((UNCHECKED, "qwen3"), (MODEL, "llama")):
        out = tmp_path / name
        job = parse_job(compose(*model, "scaling=yarn", "target=2x", f"output_dir={out}"), out)
        configs[name] = json.loads(json.dumps(job.sections(), default=str))["config"]
    lines = {}
    for name, config in configs.items():
        for entry in per_engine([{"strategy": "yarn", "recommended": True, "vs_best": None}], {"yarn": config}):
            lines[name, entry["engine"]] = engine_line(entry)
    for engine, label in (("vllm", "vLLM 0.33.0"), ("sglang", "SGLang 0.5.23")):
        assert lines["qwen3", engine] == (
            f"{engine}: yarn (the best; not verified against {label} for qwen3 (checked: {ENGINE_VERIFIED_NAMES}))"
        )
        assert lines["llama", engine] == f"{engine}: yarn (the best)"  # tinyllama: a Llama, checked
    assert lines["qwen3", "transformers"] == "transformers: yarn (the best)"


def test_an_export_resolves_a_local_checkpoint_as_its_preset_not_under_its_own_name(
    tmp_path, compose, tiny_llama, capsys, monkeypatch
):
    import evals.core.files
    from evals.core.decision.engines import setup
    from evals.core.inputs.loading import bundled_tokenizer
    from tests.tiny import TINY

    checkpoint = tmp_path / "mycheckpoint"
    tiny_llama(vocab=49152, trained=256).save_pretrained(checkpoint)
    bundled_tokenizer().save_pretrained(checkpoint)
    out = tmp_path / "job"
    cfg = compose(*TINY, "model.weights=pretrained", f"model.path={checkpoint}", "scaling=yarn", f"output_dir={out}")
    config = json.loads(json.dumps(parse_job(cfg, out).sections(), default=str))["config"]
    assert config["model"]["name"] == "mycheckpoint" and config["model"]["family"] == "tinyllama"
    monkeypatch.setattr(evals.core.files, "_SAID", set())  # the note again, as a new process (python -m evals.export)
    capsys.readouterr()
    scaling, geo, _ = setup(config)
    err = capsys.readouterr().err
    # the record is the checkpoint's own (its trained 256, issue #67): nothing of the preset's 2048 to correct, and no
    # lookup under the checkpoint's name
    assert geo.trained == 256 and "2048" not in err and "mycheckpoint's" not in err
