"""``python -m evals.serve``: transformers' OpenAI-compatible server with the measured strategy in its model process
(:mod:`evals.serve`). Bad input -- a scaling rope_ext rejects, a model that cannot be read, a flag the server cannot
serve as measured -- is one line and exit 2, before any weight is loaded."""

from __future__ import annotations

import argparse
import json
import sys

from . import refusal, route


def parse(argv: list[str] | None):
    parser = argparse.ArgumentParser(prog="python -m evals.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a local checkpoint directory (or GGUF's directory) or hub id")
    parser.add_argument("--gguf-file", help="the GGUF file in --model's directory (SmolLM2: the bundled one)")
    parser.add_argument("--tokenizer", help="where the tokenizer is, when not beside the model")
    parser.add_argument("--scaling", required=True, help='the strategy as JSON: {"name": "self_extend", ...}')
    parser.add_argument("--trained-context", type=int, help="the trained context the strategy was resolved with")
    parser.add_argument("--context", type=int, help="the context served (default: what the scaling covers)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--device", default="auto", help="auto (cuda, mps, cpu), cpu, cuda, cuda:N")
    parser.add_argument("--dtype", default="auto", help="auto (bfloat16 on GPU, float32 on CPU, as the harness)")
    parser.add_argument("--attn-implementation", default="sdpa")
    parser.add_argument("--log-level", default="warning")
    # transformers serve's flags that would serve something else than the measured model: refused (evals.serve)
    parser.add_argument("--continuous-batching", action="store_true", help="refused")
    parser.add_argument("--compile", action="store_true", help="refused")
    parser.add_argument("--quantization", help="refused")
    return parser.parse_args(argv)


def prepare(args) -> dict:
    """What the model's process needs (:class:`evals.serve.app.RopeLoader`'s ``rope``), and the kwargs of
    transformers' ``Serve``; a UserError or ScalingError (one line) for bad input, before any weight is read."""
    import rope_ext
    from rope_ext.export import covered, geometry
    from transformers import AutoConfig

    from ..core.errors import ConfigError
    from ..core.inputs.device import resolve_device, resolve_dtype
    from ..core.inputs.models import meta_model

    try:
        scaling_cfg = json.loads(args.scaling)
    except ValueError as err:
        raise ConfigError(f"--scaling {args.scaling!r} is not JSON ({err})") from None
    if not isinstance(scaling_cfg, dict):
        raise ConfigError(f'--scaling {args.scaling!r} is not a JSON object ({{"name": "yarn", "factor": 2}})')
    kwargs = {"gguf_file": args.gguf_file} if args.gguf_file else {}
    try:
        config = AutoConfig.from_pretrained(args.model, **kwargs)
    except (OSError, ValueError) as err:
        first = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        raise ConfigError(f"--model {args.model}: its config cannot be read ({first})") from None
    trained = args.trained_context or rope_ext.trained_context(config)
    scaling = rope_ext.resolve(scaling_cfg, trained)
    why = refusal(
        scaling, compile=args.compile, continuous_batching=args.continuous_batching, quantization=args.quantization
    )
    if why:
        raise ConfigError(why)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    meta = meta_model(config, args.attn_implementation)
    geo = geometry(config, scaling, rope_ext.find_rotary_slots(meta), trained)
    if not args.context and not scaling.factor:
        raise ConfigError(f"--context is needed: {scaling.label} declares no factor to derive the context served from")
    context = args.context or covered(scaling, trained)
    how, keys = route(scaling, geo, config.to_dict(), context)
    rope = {
        "scaling": scaling.to_dict(),
        "trained": trained,
        "context": context,
        "route": how,
        "config": keys,
        "tokenizer": args.tokenizer,
    }
    model_id = f"{args.model}:{args.gguf_file}" if args.gguf_file else args.model
    options = dict(
        force_model=model_id,
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        attn_implementation=args.attn_implementation,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        model_timeout=-1,
    )
    said = f"serving {scaling.label} on {model_id} ({how}: {'rope_ext.patch' if how == 'patch' else 'config.json'})"
    print(f"{said}, {context} tokens, on http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    return {"rope": rope, "options": options}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import rope_ext

    from ..core.errors import UserError

    try:
        ready = prepare(args)
    except (UserError, rope_ext.ScalingError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from .app import RopeServe

    try:
        RopeServe(ready["rope"], **ready["options"])
    except RuntimeError as err:  # the model's process failed to load (its traceback logged above): one line
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
