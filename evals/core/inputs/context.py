"""What an eval gets: the parsed job, its output sink, and explicit steps to get the tokenizer, the
documents and the patched model.

Nothing happens on attribute access: ``ctx.tokenizer()``, ``ctx.documents()`` and ``ctx.model()`` are
calls, made when the eval is ready for them (so an eval can finish its own checks on tokenized data
before the model loads). ``ctx.model()`` takes the model from the runner's cache and patches it with the
job's scaling once, after a probe proves the patch changes the model exactly where it should
(:mod:`rope_ext.check`); the patch is undone when the context closes.
"""

from __future__ import annotations

import logging
import time

import rope_ext
from rope_ext.check import patch_checked

from .data import Document, load_documents
from ..errors import scaling_errors_as_user_errors
from ..files import note_once

log = logging.getLogger(__name__)


class EvalContext:
    def __init__(self, job, cache, output, documents: list[Document] | None = None):
        self.job, self.output, self._cache = job, output, cache
        self._documents: list[Document] | None = documents
        self._complete = documents is not None  # every document of the data is in _documents
        self._patch: rope_ext.RopePatch | None = None
        self._timed = False

    @property
    def scaling(self) -> rope_ext.Scaling:
        return self.job.scaling

    @property
    def trained_context(self) -> int:
        return self.job.trained_context

    @property
    def title(self) -> str:
        """e.g. ``smollm2 / yarn-factor2``: how figures name the run."""
        return f"{self.job.model.label} / {self.job.scaling.label}"

    def tokenizer(self):
        return self._cache.tokenizer(self.job.model)

    def documents(self, count: int | None = None, min_tokens: int = 0) -> list[Document]:
        """The job's documents, tokenized once (token ids cached on disk by tokenizer and text hash); with
        ``count``, only as many as it takes to find ``count`` of at least ``min_tokens`` tokens."""
        enough = self._documents is not None and (
            self._complete or (count is not None and sum(len(d.ids) >= min_tokens for d in self._documents) >= count)
        )
        if not enough:
            self._documents = load_documents(self.job.data_cfg, self.tokenizer(), count, min_tokens)
            self._complete = count is None
            if self._patch is not None:
                self._fold_vocabulary(self._patch.model)
        return self._documents

    def _loaded(self):
        started = time.perf_counter()
        loaded, reused = self._cache.get(self.job.model)
        if not self._timed:
            self.output.timing("model_load_s", 0.0 if reused else time.perf_counter() - started)
            self._timed = True
        return loaded

    def base_model(self):
        """The job's model without its scaling (a reference pass, e.g. LongPPL's evaluator); only before
        :meth:`model` patches it."""
        if self._patch is not None:
            raise RuntimeError("base_model() after model(): the model is already patched")
        loaded = self._loaded()
        self._fold_vocabulary(loaded.model)
        return loaded.model

    def other_model(self, model):
        """Another model (a resolved ``evals.core.inputs.models.ResolvedModel``, e.g. LongPPL's evaluator), unscaled,
        through the same model cache as the job's."""
        return self._cache.get(model)[0].model

    def model(self):
        """The model with the job's scaling applied (loaded once per process, re-patched per job)."""
        if self._patch is None:
            loaded = self._loaded()
            with scaling_errors_as_user_errors():  # a patch that changes the model elsewhere than declared: one line
                self._patch, checked = patch_checked(
                    loaded.model, self.job.scaling, self.job.scaled, self.trained_context, every=self.job.model.slots
                )
            self._report_check(checked)
            if self._patch.softmax_scale:  # MLA's softmax scale follows the strategy (rope_ext.rotary.softmax_scale)
                note_once(f"note: {self.job.scaling.label}: {self._patch.softmax_scale}")
            self.output.record.update(
                "rope",
                {
                    "scaling": self.job.scaling.to_dict(),
                    "label": self.job.scaling.label,
                    "dynamic": self.job.scaling.dynamic,
                    "patched": self._patch.applied,
                    "model_source": loaded.source,
                    "device": str(loaded.device),
                    "dtype": str(loaded.dtype),
                },
            )
            self._fold_vocabulary(loaded.model)
        return self._patch.model

    def _report_check(self, checked: dict) -> None:
        """The run-time patch check (:mod:`rope_ext.check`) in results.json, the log and the tracker's summary."""
        self.output.record.update("patch_check", checked)
        if self.job.scaling.name == "none":
            return
        line = (
            f"patch check: {self.job.scaling.label} changed {len(checked['changed'])} attention layers (layer types "
            f"{', '.join(checked['targeted_types'])}), left {len(checked['unchanged'])} unchanged, as declared; "
            f"seen in {checked['how']}"
            if "targeted_types" in checked
            else f"patch check: {self.job.scaling.label}: {checked['how']}"
        )
        log.info(line)
        self.output.summary(
            {"patch_check": f"ok: {len(checked['changed'])} changed, {len(checked['unchanged'])} unchanged"}
        )

    def _fold_vocabulary(self, model) -> None:
        """A small random-weight model with a larger tokenizer: fold token ids into its vocabulary."""
        vocab = model.get_input_embeddings().num_embeddings
        if self._documents and any(int(d.ids.max()) >= vocab for d in self._documents):
            log.warning("token ids exceed the model's vocabulary (%d): folding ids modulo %d", vocab, vocab)
            for d in self._documents:
                d.ids = d.ids % vocab

    def close(self) -> None:
        if self._patch is not None:
            self._patch.restore()
            self._patch = None

    def __enter__(self) -> "EvalContext":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
