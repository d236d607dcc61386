"""Shared test set-up: the Hydra config composed as the CLI composes it (lightning-hydra-template style),
one tiny-model override list, and real eval contexts built from real jobs."""

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from transformers import AutoConfig, AutoModelForCausalLM

from evals import load_evals
from evals.core.config import config_dir, register_configs
from evals.core.data import Document
from evals.core.job import parse_job
from evals.core.runner import ModelCache, started

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TQDM_DISABLE", "1")

# the one tiny random-weight model of a real architecture (TinyLlama's), for jobs run end to end
TINY = ["model=tinyllama", "model.weights=random", "model.architecture.num_hidden_layers=2",
        "model.architecture.hidden_size=64", "model.architecture.intermediate_size=96",
        "model.architecture.num_attention_heads=4", "model.architecture.num_key_value_heads=2",
        "model.architecture.vocab_size=49152", "logger=none"]
# smaller still, eager attention, trained context 64: for evals checked token by token against transformers
MICRO = ["model=tinyllama", "model.weights=random", "model.architecture.num_hidden_layers=2",
         "model.architecture.hidden_size=32", "model.architecture.intermediate_size=64",
         "model.architecture.num_attention_heads=4", "model.architecture.num_key_value_heads=2",
         "model.architecture.max_position_embeddings=64", "model.original_max_position=64",
         "model.attn_implementation=eager", "logger=none"]


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: heavier tests (real SmolLM2 runs, multi-process sweeps, memory-limit runs); CI runs them after the default suite")


def compose_config(*overrides, searchpath: list[str] | None = None, return_hydra_config: bool = False):
    """The config ``python run.py <overrides>`` composes."""
    load_evals()
    register_configs()
    extra = [f"hydra.searchpath=[{','.join(searchpath)}]"] if searchpath else []
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose("config", overrides=[*extra, *overrides], return_hydra_config=return_hydra_config)


def scaling_overrides(scaling: dict | None) -> list[str]:
    """{"name": "yarn", "factor": 4.0} -> ["scaling=yarn", "scaling.factor=4.0"]."""
    scaling = dict(scaling or {"name": "none"})
    name = scaling.pop("name")
    return [f"scaling={name}"] + [f"scaling.{k}={json.dumps(v)}" for k, v in scaling.items()]


def run_job(out_dir, *overrides):
    """One job through run.run(cfg), forced: (summary, results.json). The unscaled reference is not run
    first (``verdict.baseline=false``) unless a test asks for it: most tests are not about the verdict."""
    import run as rope_run

    cfg = compose_config(*TINY, "force=true", "verdict.baseline=false", f"output_dir={out_dir}", *overrides)
    summary = rope_run.run(cfg)
    return summary, json.loads((Path(out_dir) / "results.json").read_text())


def run_cli(*args, env=None, timeout=300, **popen):
    """``python run.py <args>`` in a subprocess: the CompletedProcess, or the Popen with ``popen`` arguments."""
    command = [sys.executable, str(ROOT / "run.py"), *args]
    if popen:
        return subprocess.Popen(command, cwd=ROOT, env=env, **popen)
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


PLUGIN = '''
"""Strategies and evals from outside rope_ext, one function each (and test-only behaviours)."""
import os
import resource
import time
from dataclasses import dataclass

import torch

import rope_ext
from evals import register_eval
from evals.core.config import option
from evals.scoring import token_nll

if os.environ.get("TEST_MEMORY_LIMIT_GIB"):  # a process memory limit, so an allocation fails without harm
    with open("/proc/self/status") as status:
        size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    limit = size + int(float(os.environ["TEST_MEMORY_LIMIT_GIB"]) * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


@rope_ext.register("halve_slow", params={"factor": rope_ext.Param(2.0, float, "slow pairs / factor", minimum=1.0)})
def halve_slow(p, dim, base, seq_len):
    """The slower half of the pairs interpolated by factor, the faster half kept."""
    factors = torch.ones(dim // 2)
    factors[dim // 4 :] = p["factor"]
    return rope_ext.default_inv_freq(dim, base) / factors, 1.0


@dataclass
class FirstTokensConfig:
    name: str = "first_tokens"
    tokens: int = option(64, minimum=2)
    sleep: float = 0.0  # seconds to wait after scoring (to interrupt a running job)
    crash: bool = False  # raise an error that is not a user error (a bug)


@register_eval("first_tokens", config=FirstTokensConfig, needs=("model", "data"))
def first_tokens(cfg, ctx):
    """Mean NLL of the first tokens of the first document."""
    ids = ctx.documents()[0].ids[: cfg.tokens]
    nll = token_nll(ctx.model(), ids)
    ctx.output.table("first_tokens", [{"position": i + 1, "nll": float(v)} for i, v in enumerate(nll)])
    if cfg.crash:
        raise RuntimeError("boom: a bug in an eval")
    time.sleep(cfg.sleep)
    return {"first_tokens_nll": float(nll.mean())}
'''


@pytest.fixture
def plugin(tmp_path):
    """(dir, env): the plugin module and its two YAMLs in a temp dir (nothing of the project touched), and the
    environment that loads it (``ROPE_EXT_PLUGINS``); pass ``searchpath(dir)`` to the CLI."""
    (tmp_path / "my_ext.py").write_text(PLUGIN)
    (tmp_path / "conf" / "scaling").mkdir(parents=True)
    (tmp_path / "conf" / "eval").mkdir()
    (tmp_path / "conf" / "scaling" / "halve_slow.yaml").write_text("defaults:\n  - /schema/scaling@_here_: halve_slow\n  - _self_\n")
    (tmp_path / "conf" / "eval" / "first_tokens.yaml").write_text("defaults:\n  - /schema/eval@_here_: first_tokens\n  - _self_\n")
    env = {**os.environ, "ROPE_EXT_PLUGINS": "my_ext", "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    return tmp_path, env


def searchpath(directory) -> str:
    return f"hydra.searchpath=[file://{Path(directory) / 'conf'}]"


def tiny_llama(vocab=96, trained=64, seed=0, **extra):
    config = AutoConfig.for_model(
        "llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=vocab, max_position_embeddings=trained, bos_token_id=1, eos_token_id=2, **extra)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.fixture
def documents():
    generator = torch.Generator().manual_seed(0)
    return [Document(f"doc{i}", torch.randint(3, 96, (n,), generator=generator)) for i, n in enumerate([300, 260, 150])]


@pytest.fixture
def eval_context(tmp_path, documents):
    """``make(scaling, *overrides, docs=..., eval_cfg=...)``: a real EvalContext of a real job on the MICRO model
    (vocabulary 96 unless overridden), with the given documents in place of the job's data."""
    stack, count = contextlib.ExitStack(), [0]

    def make(scaling=None, *overrides, docs=None):
        count[0] += 1
        cfg = compose_config(*MICRO, "model.architecture.vocab_size=96", *scaling_overrides(scaling), *overrides)
        job = parse_job(cfg, tmp_path / f"run{count[0]}")
        job.out_dir.mkdir(parents=True)
        return stack.enter_context(started(job, job.out_dir, ModelCache(), documents=docs or documents))

    with stack:
        yield make


def structured(schema, **values):
    """An eval config as composition makes it: the registered schema, typed, with ``values`` set."""
    return OmegaConf.structured(schema(**values))
