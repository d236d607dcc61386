"""SmolLM2 served with Self-Extend on transformers' own server (``python -m evals.serve``), against the same server
unpatched: one passkey prompt of ``--length`` tokens (the harness's own, ``eval=passkey``'s PromptBuilder, depth 0.5,
trial 0) answered over HTTP, greedy, as many tokens as the eval generates; prefill tokens/s (prompt tokens over the
time to the first streamed token) and decode tokens/s (the tokens after it over the time they took). The harness's
own answer (PromptScorer.generate under rope_ext.patch, in this process) is printed beside the server's.

    python bench/serve_bench.py --length 2048
    python bench/serve_bench.py --length 16384    # SmolLM2's 2x: minutes per server on a 2-core CPU

Prints one markdown row per server (docs/benchmarks.md's table). Both servers serve ``--context`` tokens (default:
16384, 2x SmolLM2's trained 8192, or the prompt and its answer where longer: the server refuses a prompt that leaves
no room for the answer)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SELF_EXTEND = {"name": "self_extend", "group_size": 4, "window": 1024}  # SmolLM2 at 2x (group_for_target, L/8)


def passkey(length: int):
    """(the composed config, its tokenizer, the harness's passkey prompt of ``length`` tokens, max_new_tokens)."""
    from hydra import compose, initialize_config_dir

    from evals import load_evals
    from evals.core.config.store import config_dir, register_configs
    from evals.core.inputs.loading import load_tokenizer
    from evals.core.inputs.models import resolve_model
    from evals.tasks.retrieval.haystack import PromptBuilder, haystack_ids

    load_evals()
    register_configs()
    overrides = ["model=smollm2", "model.device=cpu", "eval=passkey", f"eval.lengths=[{length}]", "logger=none"]
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    tokenizer = load_tokenizer(resolve_model(cfg.model, geometry=False, weights=False))  # from the GGUF served
    builder = PromptBuilder(cfg.eval, tokenizer, haystack_ids(cfg.eval, tokenizer, []))
    return cfg, tokenizer, builder.build(length, 0.5, 0), int(cfg.eval.max_new_tokens)


def harness_answer(cfg, prompt, max_new: int, scaling: dict, trained: int) -> str:
    """What the harness answers: PromptScorer.generate on the prompt's ids under rope_ext.patch."""
    import rope_ext

    from evals.core.inputs.loading import load_model
    from evals.core.inputs.models import resolve_model
    from evals.tasks.retrieval.scorer import PromptScorer

    loaded = load_model(resolve_model(cfg.model, geometry=False, weights=True))
    scorer = PromptScorer(loaded.model, share=False, max_new_tokens=max_new, eos_id=loaded.tokenizer.eos_token_id)
    with rope_ext.patch(loaded.model, rope_ext.resolve(scaling, trained)):
        return loaded.tokenizer.decode(scorer.generate(prompt.ids), skip_special_tokens=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=2048, help="prompt tokens")
    parser.add_argument(
        "--context", type=int, help="the context both servers serve (default: 2x trained, or the prompt and answer)"
    )
    parser.add_argument("--scaling", default=json.dumps(SELF_EXTEND), help="the strategy served, as JSON")
    parser.add_argument("--trained-context", type=int, default=8192)
    parser.add_argument("--no-harness", action="store_true", help="skip the harness's own answer")
    args = parser.parse_args()

    from evals.core.inputs.models import SMOLLM2_GGUF, SMOLLM2_PACKAGE, package_dir
    from evals.tasks.retrieval.scorer import is_correct
    from evals.serve import client

    cfg, tokenizer, prompt, max_new = passkey(args.length)
    text = tokenizer.decode(prompt.ids, skip_special_tokens=False)
    sent = tokenizer(text)["input_ids"]
    same_ids = sent == prompt.ids.tolist()
    print(
        f"prompt: {len(prompt.ids)} tokens, key {prompt.keys[0]}; re-encoded as sent: {len(sent)} tokens, "
        f"{'the same ids' if same_ids else 'OTHER ids'}",
        file=sys.stderr,
    )
    scaling = json.loads(args.scaling)
    expected = None if args.no_harness else harness_answer(cfg, prompt, max_new, scaling, args.trained_context)
    where = ["--model", str(package_dir(SMOLLM2_PACKAGE)), "--gguf-file", SMOLLM2_GGUF, "--dtype", "float32"]
    context = args.context or max(2 * args.trained_context, len(prompt.ids) + max_new)  # the server's limit: both
    common = ["--trained-context", str(args.trained_context), "--context", str(context)]
    print("| length | served | prompt tokens | prefill tok/s | decode tok/s | answer | passkey | = harness |")
    print("|---|---|---|---|---|---|---|---|")
    for served in (scaling, {"name": "none"}):
        with client.running([*where, "--scaling", json.dumps(served), *common], start_timeout=600) as url:
            client.complete(url, "Hello", 2, timeout=120)  # warm-up: the first request's one-off costs
            started = time.perf_counter()
            answer, ttft, decode_s, usage = client.stream(url, text, max_new, timeout=7200)
            total = time.perf_counter() - started
        generated = int(usage.get("completion_tokens") or 0)
        decode = (generated - 1) / decode_s if generated > 1 and decode_s > 0 else float("nan")
        harness = "-" if expected is None or served["name"] == "none" else ("yes" if answer == expected else "NO")
        print(
            f"| {args.length} | {served['name']} | {usage.get('prompt_tokens')} | {usage['prompt_tokens'] / ttft:.0f} "
            f"| {decode:.1f} | {answer.strip()!r} | {'yes' if is_correct(answer, prompt.keys, 'substring') else 'no'} "
            f"| {harness} |",
            flush=True,
        )
        print(f"{served['name']}: {total:.1f} s over HTTP (first token {ttft:.1f} s)", file=sys.stderr)
    if expected is not None:
        print(f"harness answer under {scaling['name']}: {expected.strip()!r}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
