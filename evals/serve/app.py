"""transformers' server with the measured strategy in its model process (:mod:`evals.serve`).

transformers 5.25's ``Serve`` runs its model in a process of its own, which calls its ``ModelLoader`` to load it
(``EngineClient.run_engine``; ``transformers/cli/serving/model_manager.py``). :class:`RopeLoader` is that loader with
the strategy added: the model loaded as the harness loads it (``AutoModelForCausalLM.from_pretrained`` with its dtype
and attention kernel, :func:`evals.core.inputs.loading.load_model`), with the exported ``rope_parameters`` in its
config (route ``config``) or :func:`rope_ext.patch` applied after loading (route ``patch``), and the API side's config
admitting the context served. :class:`RopeServe` is transformers' ``Serve`` given that loader; everything else --
handlers, app, uvicorn -- is transformers' own.
"""

from __future__ import annotations

from transformers.cli.serve import Serve
from transformers.cli.serving.model_manager import ModelLoader
from transformers.cli.serving.utils import parse_model_id

# the caches a request may ask for that generate exactly as measured under an attention-level method: greedy decode
# equal to the dynamic cache's (tests/test_cache_paths.py; the offloaded ones on CUDA); a quantized cache's keys are
# lossy (other numbers than the ones measured)
EXACT_CACHES = (None, "dynamic", "static", "offloaded", "offloaded_static")


class RopeLoader(ModelLoader):
    """transformers' loader with the measured strategy: ``rope`` is ``{"scaling": Scaling.to_dict(), "trained": int,
    "context": int | None, "route": "config" | "patch", "config": the config.json keys | None, "tokenizer": str |
    None}`` (plain values: the loader travels to the model's process by pickling)."""

    def __init__(self, base: ModelLoader, rope: dict):
        self.__dict__.update(base.__dict__)
        self.rope = rope

    def _configured(self, config, api: bool):
        text = config.get_text_config()
        if self.rope["route"] == "config":
            for key, value in self.rope["config"].items():
                setattr(text, key, value)
        context = self.rope.get("context")
        if api and context:  # the API side's prompt-length check: the context served (dynamic NTK keeps its trained)
            text.max_position_embeddings = max(int(getattr(text, "max_position_embeddings", 0) or 0), int(context))
        return config

    def load_config(self, model_id: str):
        config, generation_config = super().load_config(model_id)
        return self._configured(config, api=True), generation_config

    def load_processor(self, model_id: str):
        if not self.rope.get("tokenizer"):
            return super().load_processor(model_id)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.rope["tokenizer"], trust_remote_code=self.trust_remote_code)

    def _load_model(self, model_id: str, tqdm_class=None, progress_callback=None):
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        import rope_ext

        repo, revision, gguf_file = parse_model_id(model_id)
        where = {"revision": revision, "trust_remote_code": self.trust_remote_code}
        if gguf_file is not None:
            where["gguf_file"] = gguf_file
        config = self._configured(AutoConfig.from_pretrained(repo, **where), api=False)
        model = AutoModelForCausalLM.from_pretrained(
            repo, config=config, dtype=self.dtype, attn_implementation=self.attn_implementation, **where
        )
        model.to(torch.device(self.device)).eval()
        scaling = rope_ext.resolve(self.rope["scaling"], self.rope["trained"])
        if self.rope["route"] == "patch" and scaling.name != "none":
            # applied for the life of the process: the handle is kept on the model, never restored
            model._rope_ext_patch = rope_ext.patch(model, scaling)
            if scaling.scales_attention:
                guard_cache(model, scaling.label)
        return model


def guard_cache(model, label: str) -> None:
    """``model.generate`` refusing (ValueError: the server answers 400) a cache that does not decode as the dynamic
    one attention-level methods are measured with (a request may ask for one in its ``generation_config``)."""
    generate = model.generate

    def guarded(*args, **kwargs):
        asked = kwargs.get("cache_implementation")
        if asked not in EXACT_CACHES:
            raise ValueError(
                f"cache_implementation={asked!r} is refused: {label}'s generation is exact with the {', '.join(map(str, EXACT_CACHES[1:]))} caches only"
            )
        return generate(*args, **kwargs)

    model.generate = guarded


class RopeServe(Serve):
    """transformers' ``Serve``, its model loaded by :class:`RopeLoader` (``rope``: see there)."""

    def __init__(self, rope: dict, **options):
        self.rope = rope
        super().__init__(**options)  # builds its loader, then runs the server (self.run)

    def run(self, socket=None, engine_connection=None) -> None:
        if not isinstance(self.loader, RopeLoader):
            self.loader = RopeLoader(self.loader, self.rope)
        super().run(socket, engine_connection)
