"""Needle grid cost: cell by cell against KV prefix sharing, same grid, same model, one process.

    python bench/needle_bench.py                                  # CPU, SmolLM2, books
    python bench/needle_bench.py --model llama3 --weights random --lengths 8192,32768 --scoring teacher_forced

Prints, for each mode, seconds, tokens run through the model, and whether the answers of the two
modes are identical (they must be, for static strategies). With random weights only time counts.

    python bench/needle_bench.py --chunks 256,512,1024,4096 --lengths 4096 --cached 1024,2048

times instead what sharing pays per prompt: extending a cached prefix of ``--cached`` tokens to the
length in chunks of each size (``eval.prefill_chunk``), against a fresh causal prefill of the same
tokens (the fresh prefill of the whole prompt minus that of the cached part), best of 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--weights", default="pretrained", choices=("pretrained", "random"))
    parser.add_argument("--scaling", default="none")
    parser.add_argument("--lengths", default="1024,4096")
    parser.add_argument("--depths", default="0.0,0.25,0.5,0.75,1.0")
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--scoring", default="generate")
    parser.add_argument("--override", nargs="*", default=[])
    parser.add_argument("--chunks", help="comma-separated prefill chunk sizes: time prefix extension instead")
    parser.add_argument("--cached", default="1024,2048", help="with --chunks: cached prefix lengths")
    args = parser.parse_args()

    from hydra import compose, initialize_config_dir

    from evals import load_evals
    from evals.core.config.store import config_dir, register_configs
    from evals.core.job.parse import parse_job
    from evals.core.run.runner import started
    from evals.tasks.retrieval import evaluate

    load_evals()
    register_configs()
    overrides = [
        f"model={args.model}",
        f"model.weights={args.weights}",
        f"scaling={args.scaling}",
        "eval=needle",
        f"eval.lengths=[{args.lengths}]",
        f"eval.depths=[{args.depths}]",
        f"eval.trials={args.trials}",
        f"eval.scoring={args.scoring}",
        "logger=none",
        *args.override,
    ]
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    rows, answers = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        job = parse_job(cfg, Path(tmp))
        with started(job, Path(tmp)) as ctx:
            model = ctx.model()  # load outside the timed region
            if args.chunks:
                return chunk_costs(
                    model,
                    int(args.lengths.split(",")[-1]),
                    [int(c) for c in args.cached.split(",")],
                    [int(c) for c in args.chunks.split(",")],
                )
            for share in (False, True):
                cfg.eval.prefix_sharing = share
                started = time.perf_counter()
                summary = evaluate(cfg.eval, ctx)
                seconds = time.perf_counter() - started
                trials = [json.loads(line) for line in (Path(tmp) / "needle_trials.jsonl").read_text().splitlines()]
                answers[share] = {
                    (t["length"], t["depth"], t["trial"]): t.get("answer", t.get("tf_correct")) for t in trials
                }
                rows.append(
                    {
                        "mode": "shared prefix" if share else "cell by cell",
                        "seconds": round(seconds, 1),
                        "tokens_computed": summary["needle_tokens_computed"],
                        "mean_acc": summary["needle_mean_acc"],
                        "device": str(next(model.parameters()).device),
                    }
                )
    same = answers[False] == answers[True]
    print(json.dumps({"config": overrides, "rows": rows, "identical_answers": same}))
    print("\n| mode | seconds | tokens computed | mean accuracy |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['seconds']} | {r['tokens_computed']} | {r['mean_acc']:.3f} |")
    print(f"\nshared / cell-by-cell time: {rows[1]['seconds'] / rows[0]['seconds']:.2f}; identical answers: {same}")
    return 0 if same else 1


def chunk_costs(model, length: int, cached_lengths: list[int], chunks: list[int]) -> int:
    """Seconds to extend a cached prefix to ``length`` in chunks, against a fresh prefill of the same tail."""
    import torch

    from evals.tasks.retrieval import PromptScorer

    def best_of_2(step) -> float:
        times = []
        for _ in range(2):
            started = time.perf_counter()
            step()
            times.append(time.perf_counter() - started)
        return min(times)

    vocab = model.get_input_embeddings().num_embeddings
    prompt = torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(0))
    fresh = PromptScorer(model, False, 1, None)
    whole = best_of_2(lambda: fresh.prefill(prompt, prompt[:0]))
    rows = []
    for cached in cached_lengths:
        fresh_tail = whole - best_of_2(lambda: fresh.prefill(prompt[:cached], prompt[:0]))
        for chunk in chunks:
            shared = PromptScorer(model, True, 1, None, chunk)
            shared.prefill(prompt[:cached], prompt[:0])

            def extend():
                shared.cache.crop(cached - shared.cache.get_seq_length())
                shared.cached = prompt[:cached]
                shared.prefill(prompt, prompt[:0])

            rows.append(
                {
                    "length": length,
                    "cached": cached,
                    "chunk": chunk,
                    "extend_s": round(best_of_2(extend), 2),
                    "fresh_s": round(fresh_tail, 2),
                    "whole_fresh_s": round(whole, 2),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    print("\n| cached | chunk | extend (s) | fresh prefill of the same tokens (s) |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['cached']} | {r['chunk']} | {r['extend_s']} | {r['fresh_s']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
