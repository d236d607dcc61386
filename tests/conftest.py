import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import rope_ext
from evals.data import Document
from evals.results import Results
from evals.tracking import Tracker

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("WANDB_SILENT", "true")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: heavier tests (real SmolLM2 runs); CI runs them after the default suite")


def tiny_llama(vocab=96, trained=64, seed=0, **extra):
    config = AutoConfig.for_model(
        "llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=vocab, max_position_embeddings=trained, bos_token_id=1, eos_token_id=2, **extra)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


class TinyContext:
    """The eval-context interface (evals.context.EvalContext) over a given model and documents."""

    def __init__(self, model, documents, out_dir, scaling=None, trained=64):
        self.model, self._documents = model, documents
        self.tokenizer = SimpleNamespace(bos_token_id=1)
        self.scaling = rope_ext.strategies.with_trained_context(scaling or {"name": "none"}, trained)
        self.dynamic = rope_ext.is_dynamic(self.scaling)
        self.trained_context, self.model_name, self.scaling_label = trained, "tiny", self.scaling["name"]
        self.results = Results(out_dir, {})
        self.tracker = Tracker(SimpleNamespace(name="none", mode="disabled"), {}, out_dir, "tiny", None)
        self._patch = rope_ext.patch(model, self.scaling, trained)

    def documents(self):
        return self._documents

    def close(self):
        self._patch.restore()


@pytest.fixture
def documents():
    generator = torch.Generator().manual_seed(0)
    return [Document(f"doc{i}", torch.randint(3, 96, (n,), generator=generator)) for i, n in enumerate([300, 260, 150])]


@pytest.fixture
def tiny_context(tmp_path, documents):
    contexts = []

    def make(model=None, scaling=None, docs=None):
        ctx = TinyContext(model or tiny_llama(), docs or documents, tmp_path / f"run{len(contexts)}", scaling)
        contexts.append(ctx)
        return ctx

    yield make
    for ctx in contexts:
        ctx.close()
