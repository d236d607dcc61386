"""Serving what a job measured on transformers' own OpenAI-compatible server (``transformers serve``: ``/v1/completions``,
``/v1/chat/completions``), every strategy rope_ext measures, attention-level ones included.

    python -m evals.serve --model /path/to/checkpoint --scaling '{"name": "self_extend", "group_size": 4,
        "window": 1024}' --trained-context 8192 --context 16384 --host 127.0.0.1 --port 8000

The server is transformers' own (``transformers.cli.serve.Serve``: its handlers, its FastAPI app, uvicorn); the one
seam used is its ``ModelLoader``, which the model's process calls to load the model (:mod:`evals.serve.app`). There
the measured strategy is made active, by one of two routes (:func:`route`):

- ``config``: a strategy transformers' ``config.json`` expresses (YaRN, linear, NTK, Llama-3, LongRoPE, ...) is loaded
  with the exported ``rope_parameters`` (:func:`rope_ext.export.transformers_config`, the keys ``deploy/transformers.json``
  holds) -- transformers' own rotary, which tests/test_export.py checks gives the patched model's logits;
- ``patch``: every other strategy (attention-level: Self-Extend, DCA, ReRoPE, STRING, LM-Infinite; query scaling;
  compositions) is applied with :func:`rope_ext.patch` to the loaded model, in the server's model process, where it
  stays for the life of the process.

The API side reads the model's config with ``max_position_embeddings`` set to the context served (``--context``), so
transformers' prompt-length check admits prompts past the trained context.

What the server cannot do as measured is refused in one line (exit 2) when it starts, never served differently
(:func:`refusal`): continuous batching (paged attention: another attention path, not checked against the measured
model), ``--compile`` (compiled graphs: not checked against the measured model; the static cache they decode with is
exact under every method, tests/test_cache_paths.py, but torch.compile around rope_ext's attention hook is not), quantization (other weights than the ones measured). A request asking for a cache
(``generation_config`` with ``cache_implementation``) gets it where it decodes as measured -- dynamic, static,
offloaded (tests/test_cache_paths.py) --; a lossy one (quantized) under an attention-level method fails with a 400.

``tests/test_serve.py`` starts this server on 127.0.0.1 and checks, over HTTP, that greedy ``/v1/completions`` give the
tokens of ``model.generate`` under :func:`rope_ext.patch` (none, YaRN, Self-Extend, DCA) on prompts past the trained
context, where the unpatched server answers differently. No endpoint of transformers 5.25's server returns
log-probabilities (``/v1/completions`` lists ``logprobs`` among the fields it does not support).
"""

from __future__ import annotations

import json

SERVER = "transformers serve"  # the per-engine answer's and deploy/README.md's name for it
FILE = "transformers-serve.sh"
CHECKED = "checked by tests/test_serve.py"
# the server flags that would serve something else than the measured model: refused in one line at start-up
REFUSED = {
    "continuous_batching": "continuous batching runs paged attention, another attention path than the one measured "
    "(not checked against it)",
    "quantization": "quantization serves other weights than the ones measured",
}


def route(scaling, geo, model_config: dict | None, context: int | None = None) -> tuple[str, dict | None]:
    """("config", the config.json keys) where transformers' config expresses the strategy; ("patch", None) where
    rope_ext's patch applies it in the server's model process."""
    from rope_ext.export import Unsupported, export

    if scaling.name == "none":
        return "patch", None  # the model as it is: nothing to patch (rope_ext.patch of none changes nothing)
    try:
        return "config", export(scaling, geo, "transformers", model_config, context)["config"]
    except Unsupported:
        return "patch", None


def servable(how: str) -> str:
    """The per-engine answer's and deploy/README.md's words for the route."""
    where = "the exported config.json" if how == "config" else "rope_ext's patch"
    return f"servable on transformers' server ({where} in the server process), {CHECKED}"


def refusal(scaling, compile: bool = False, **flags) -> str | None:
    """Why the server cannot serve ``scaling`` as measured with these flags (one line); None where it can."""
    for flag, why in REFUSED.items():
        if flags.get(flag):
            return f"--{flag.replace('_', '-')} is refused: {why}"
    if compile:
        if scaling.scales_attention:
            return (
                f"--compile is refused for {scaling.label}: torch.compile around rope_ext's attention hook is not "
                f"checked against the measured model (serve without it: the static cache alone is exact)"
            )
        return "--compile is refused: static-cache compiled generation is not checked against the measured model"
    return None


def command(scaling, models: dict, trained: int, context: int | None, model_cfg: dict | None = None) -> str:
    """The shell line of deploy/transformers-serve.sh: this launcher on the job's model (``MODEL`` where not known),
    its scaling as resolved, trained context, context served, dtype and attention kernel."""
    from rope_ext.export.common import MODEL, shell

    model_cfg = model_cfg or {}
    gguf = models.get("gguf")
    where = ["--model", models.get("hf") or MODEL]
    if gguf:
        directory, _, name = gguf.rpartition("/")
        where = ["--model", directory or ".", "--gguf-file", name]
    line = ["python", "-m", "evals.serve", *where, "--scaling", json.dumps(scaling.to_dict(), sort_keys=True)]
    line += ["--trained-context", str(trained)]
    if context:
        line += ["--context", str(context)]
    if model_cfg.get("tokenizer"):
        line += ["--tokenizer", str(model_cfg["tokenizer"])]
    for key in ("dtype", "attn_implementation"):
        if model_cfg.get(key):
            line += [f"--{key.replace('_', '-')}", str(model_cfg[key])]
    return shell([*line, "--host", "127.0.0.1", "--port", "8000"], {})
