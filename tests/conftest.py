"""Shared test set-up: the Hydra config composed as the CLI composes it (lightning-hydra-template style),
one tiny-model override list, and real eval contexts built from real jobs."""

import contextlib
import json
import os
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
    config.addinivalue_line("markers", "slow: heavier tests (real SmolLM2 runs); CI runs them after the default suite")


def compose_config(*overrides, searchpath: list[str] | None = None):
    """The config ``python run.py <overrides>`` composes."""
    load_evals()
    register_configs()
    extra = [f"hydra.searchpath=[{','.join(searchpath)}]"] if searchpath else []
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose("config", overrides=[*extra, *overrides])


def scaling_overrides(scaling: dict | None) -> list[str]:
    """{"name": "yarn", "factor": 4.0} -> ["scaling=yarn", "scaling.factor=4.0"]."""
    scaling = dict(scaling or {"name": "none"})
    name = scaling.pop("name")
    return [f"scaling={name}"] + [f"scaling.{k}={json.dumps(v)}" for k, v in scaling.items()]


def run_job(out_dir, *overrides):
    """One job through run.run(cfg), forced: (summary, results.json)."""
    import run as rope_run

    cfg = compose_config(*TINY, "force=true", f"output_dir={out_dir}", *overrides)
    summary = rope_run.run(cfg)
    return summary, json.loads((Path(out_dir) / "results.json").read_text())


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
