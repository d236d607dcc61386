"""Perplexity-by-length cost: our one-pass prefix curve against a bare forward and the per-length
approach of public scripts; our sliding windows against the Hugging Face per-window recipe.

Each mode runs in its own subprocess, so peak memory is that mode's alone (CUDA: max allocated;
CPU: the process's peak RSS). Prints one JSON line per mode and a markdown table.

    python bench/perplexity_bench.py                                  # CPU, SmolLM2, one 16k document
    python bench/perplexity_bench.py --model llama3 --weights random --lengths 4096,8192,16384,32768,65536,131072
    python bench/perplexity_bench.py --modes sliding,sliding_naive --lengths 4096 --tokens 32768 --stride 256

Modes: body (decoder stack only, longest length), forward (plain ``model(ids)`` with full logits),
prefix (our eval: one forward + chunked LM head/CE, every length), per_length (``model(ids[:L],
labels=ids[:L])`` for every L), sliding (ours), sliding_naive (per window ``model(w, labels=masked)``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

MODES = ("body", "forward", "prefix", "per_length", "sliding", "sliding_naive")


def load(args):
    import torch
    from hydra import compose, initialize_config_dir

    from evals import load_evals
    from evals.core.config.store import config_dir, register_configs
    from evals.core.inputs.data import load_documents
    from evals.core.inputs.loading import load_model
    from evals.core.inputs.models import resolve_model

    load_evals()
    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                f"model={args.model}",
                f"model.weights={args.weights}",
                f"model.device={args.device}",
                f"model.dtype={args.dtype}",
                *args.override,
            ],
        )
    loaded = load_model(resolve_model(cfg.model, geometry=False, weights=True))
    need = max(args.lengths + [args.tokens or 0])
    vocab = loaded.model.get_input_embeddings().num_embeddings
    if args.weights == "pretrained":
        ids = load_documents(cfg.data, loaded.tokenizer)[0].ids[:need]
    else:  # random weights: token values do not matter for cost
        ids = torch.randint(0, vocab, (need,), generator=torch.Generator().manual_seed(0))
    return loaded, ids


def flops(model, lengths, lm_head: bool = True) -> float:
    """Matrix-product FLOPs of one forward at each length: 2 * weights * tokens over the decoder's weights (the input
    embedding is a lookup, not a product) and the LM head's when it runs, plus causal attention: 2 * L^2 * width per
    layer (QK^T and AV, halved)."""
    config = model.config.get_text_config()
    weights = sum(p.numel() for p in model.base_model.parameters()) - model.get_input_embeddings().weight.numel()
    if lm_head:
        weights += model.get_output_embeddings().weight.numel()
    attention_width = config.num_attention_heads * getattr(
        config, "head_dim", config.hidden_size // config.num_attention_heads
    )
    return sum(2 * weights * L + 2 * L * L * attention_width * config.num_hidden_layers for L in lengths)


def run_mode(args) -> dict:
    import torch
    import torch.nn.functional as F

    from evals.tasks.perplexity import sliding_nll
    from evals.core.scoring.nll import token_nll
    from evals.core.scoring.oom import is_out_of_memory

    loaded, ids = load(args)
    model, lengths, device = loaded.model, sorted(args.lengths), loaded.device
    cuda = device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def per_window_naive(window, stride, tokens):
        total, count, prev_end = 0.0, 0, 0
        for begin in range(0, len(tokens), stride):
            end = min(begin + window, len(tokens))
            chunk = tokens[begin:end][None].to(device)
            labels = chunk.clone()
            labels[:, : max(0, prev_end - begin)] = -100
            scored = int((labels[:, 1:] != -100).sum())
            total += float(model(chunk, labels=labels).loss) * scored
            count, prev_end = count + scored, end
            if end == len(tokens):
                break
        return total, count

    def work():
        with torch.inference_mode():
            if args.mode == "body":
                model.base_model(input_ids=ids[None, : lengths[-1]].to(device), use_cache=False)
            elif args.mode == "forward":
                model(ids[None, : lengths[-1]].to(device), use_cache=False)
            elif args.mode == "prefix":
                nll = token_nll(model, ids[: lengths[-1]], args.chunk_tokens)
                return {L: float(nll[: L - 1].double().mean()) for L in lengths}
            elif args.mode == "per_length":
                out = {}
                for L in lengths:
                    x = ids[None, :L].to(device)
                    logits = model(x, use_cache=False).logits
                    out[L] = float(F.cross_entropy(logits[0, :-1].float(), x[0, 1:]))
                    del logits
                return out
            elif args.mode == "sliding":
                nll = sliding_nll(model, ids[: args.tokens], lengths[-1], args.stride, None, args.chunk_tokens)
                return {"nll": float(nll.double().mean()), "scored": len(nll)}
            elif args.mode == "sliding_naive":
                total, count = per_window_naive(lengths[-1], args.stride, ids[: args.tokens])
                return {"nll": total / count, "scored": count}

    if cuda:  # warm up kernels on a short input, then measure from a clean peak
        with torch.inference_mode():
            model(ids[None, :256].to(device))
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    sync()
    start = time.perf_counter()
    oom, values = False, None
    try:
        values = work()
    except Exception as err:  # a failed allocation on any device is a result (OOM), anything else a bug
        if not is_out_of_memory(err):
            raise
        oom = True
    sync()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    scored_lengths = {"body": lengths[-1:], "forward": lengths[-1:], "prefix": lengths[-1:], "per_length": lengths}
    result = {
        "mode": args.mode,
        "model": args.model,
        "weights": args.weights,
        "device": str(device),
        "dtype": str(loaded.dtype).replace("torch.", ""),
        "lengths": lengths,
        "seconds": round(seconds, 3),
        "peak_gib": round(peak / 2**30, 2),
        "oom": oom,
        "values": values,
    }
    if args.mode in scored_lengths and not oom:
        tflops = flops(model, scored_lengths[args.mode], lm_head=args.mode != "body") / seconds / 1e12
        result["tflops"] = round(tflops, 1)
        if cuda and args.peak_tflops:
            result["mfu"] = round(tflops / args.peak_tflops, 3)
    if args.mode.startswith("sliding") and not oom:
        result["tokens_per_s"] = round(values["scored"] / seconds, 1)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--weights", default="pretrained", choices=("pretrained", "random"))
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--lengths", default="1024,2048,4096,8192,16384")
    parser.add_argument("--modes", default="body,forward,prefix,per_length")
    parser.add_argument("--tokens", type=int, default=None, help="sliding modes: tokens scored")
    parser.add_argument("--stride", type=int, default=256)
    parser.add_argument("--chunk-tokens", type=int, default=2048)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="bf16 dense peak (H100 SXM: 989)")
    parser.add_argument(
        "--override", nargs="*", default=[], help="extra Hydra overrides, e.g. model.architecture.num_hidden_layers=2"
    )
    parser.add_argument("--out", default=None, help="append JSON lines here")
    parser.add_argument("--mode", default=None, help=argparse.SUPPRESS)  # child process
    args = parser.parse_args()
    args.lengths = [int(x) for x in args.lengths.split(",")]
    if args.mode:
        print("RESULT " + json.dumps(run_mode(args)), flush=True)
        return 0
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown modes {unknown}; valid: {', '.join(MODES)}")
    rows = []
    for mode in modes:
        child = [sys.executable, __file__, "--mode", mode] + [a for a in sys.argv[1:]]
        proc = subprocess.run(child, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"})
        lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
        row = json.loads(lines[-1][7:]) if lines else {"mode": mode, "error": proc.stderr[-800:]}
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:
            with open(args.out, "a") as handle:
                handle.write(json.dumps(row) + "\n")
    print(
        "\n| mode | lengths | seconds | peak GiB | TFLOP/s | MFU | tokens/s | OOM |\n|---|---|---|---|---|---|---|---|"
    )
    for r in rows:
        print(
            f"| {r['mode']} | {','.join(map(str, r.get('lengths', [])))} | {r.get('seconds', '-')} | {r.get('peak_gib', '-')} "
            f"| {r.get('tflops', '-')} | {r.get('mfu', '-')} | {r.get('tokens_per_s', '-')} | {r.get('oom', r.get('error', ''))} |"
        )
    return 1 if any("error" in r for r in rows) else 0  # a mode that failed is not a measurement


if __name__ == "__main__":
    sys.exit(main())
