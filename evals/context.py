"""What an eval gets: the run's configs, lazily loaded and patched model, tokenized documents,
the results writer and the tracker. The model is loaded on first use and kept for the next job
of the same process (a Hydra multirun re-patches it instead of reloading it)."""

from __future__ import annotations

import logging
import time
from functools import cached_property

import rope_ext
from omegaconf import OmegaConf
from rope_ext.strategies import effective, with_trained_context

from .data import load_documents
from .models import LoadedModel, load_model, load_tokenizer, rope_geometry

log = logging.getLogger(__name__)
_LOADED: dict[str, LoadedModel] = {}  # one model kept per process, keyed by its resolved config


def scaling_dict(cfg) -> dict:
    """The scaling config as a plain dict, unset (None) keys dropped, trained context filled in."""
    scaling = {k: v for k, v in OmegaConf.to_container(cfg.scaling, resolve=True).items() if v is not None}
    return with_trained_context(scaling, cfg.model.original_max_position)


def job_description(cfg) -> dict:
    """What determines a job's results (its resume key): model, effective scaling, eval, data, seed."""
    keep = {group: OmegaConf.to_container(cfg[group], resolve=True) for group in ("model", "eval", "data")}
    return {**keep, "scaling": effective(scaling_dict(cfg)), "seed": cfg.seed}


def scaling_label(cfg) -> str:
    """e.g. ``yarn-factor2``, ``base-base1e+06``, ``none`` (parameters a strategy ignores are left out)."""
    scaling = effective(scaling_dict(cfg))
    parts = [scaling["name"]] + [f"{k}{scaling[k]:g}" for k in ("factor", "base") if scaling.get(k) is not None]
    return "-".join(parts)


class EvalContext:
    def __init__(self, cfg, results, tracker):
        self.cfg, self.results, self.tracker = cfg, results, tracker
        self.scaling = scaling_dict(cfg)
        self.scaling_label = scaling_label(cfg)
        self.model_name = cfg.model.name
        self.trained_context = int(cfg.model.original_max_position)
        self.dynamic = rope_ext.is_dynamic(self.scaling)
        self._patch = None

    @cached_property
    def tokenizer(self):
        loaded = _LOADED.get(self._model_key)
        return loaded.tokenizer if loaded else load_tokenizer(self.cfg.model)[0]

    @property
    def _model_key(self) -> str:
        return OmegaConf.to_yaml(self.cfg.model, resolve=True)

    @cached_property
    def loaded(self) -> LoadedModel:
        started = time.perf_counter()
        if self._model_key not in _LOADED:
            _LOADED.clear()
            _LOADED[self._model_key] = load_model(self.cfg.model, self.__dict__.get("tokenizer"))
        else:
            log.info("reusing the loaded %s model (re-patched, not reloaded)", self.model_name)
        self.results.update("timings", {"model_load_s": round(time.perf_counter() - started, 3)})
        loaded = _LOADED[self._model_key]
        self._patch = rope_ext.patch(loaded.model, self.scaling, self.trained_context)
        self.results.update("rope", {"scaling": self.scaling, "dynamic": self.dynamic, "patched": self._patch.applied,
                                     "model_source": loaded.source, "device": str(loaded.device), "dtype": str(loaded.dtype)})
        return loaded

    @property
    def model(self):
        return self.loaded.model

    def documents(self):
        documents = load_documents(self.cfg.data, self.tokenizer)
        vocab = self.model.get_input_embeddings().num_embeddings
        if any(int(d.ids.max()) >= vocab for d in documents):
            # a small random-weight model with a larger tokenizer: fold ids into its vocabulary
            log.warning("token ids exceed the model's vocabulary (%d): folding ids modulo %d", vocab, vocab)
            for d in documents:
                d.ids = d.ids % vocab
        return documents

    def rope_geometry(self) -> tuple[int, float]:
        return rope_geometry(self.cfg.model)

    def close(self) -> None:
        if self._patch is not None:
            self._patch.restore()
            self._patch = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
