"""What share of a timed square matmul's FLOP rate a real forward reaches (``evals.core.run.throughput.FORWARD_SHARE``,
which a first run's budget divides by), and the 16k forward it predicts.

Each measurement is timed between two timings of the matmul (``device_rate``), in one process, and its share is
its FLOP rate (``forward_flops`` of the model's geometry) over the mean of the two rates around it, so a shared
machine's load weighs on both alike. First one layer's causal attention alone (SDPA, the model's heads and head_dim)
at ``--attention-length``: the attention share; then a forward of the whole model (LM head included, as perplexity
scores every token) at ``--length``, whose time less its attention's (at that share) gives the weight matrices'
share. Prints one JSON line per measurement, then the shares and the forward they predict at ``--predict`` tokens at
the last matmul rate measured.

    nice python bench/throughput_share.py                       # SmolLM2 fp32 on the CPU, 2048 tokens, 3 rounds
    nice python bench/throughput_share.py --length 1024 --rounds 2 --weights random
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    import torch
    import torch.nn.functional as F

    from evals.core.run import throughput
    from perplexity_bench import load

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--weights", default="pretrained", choices=("pretrained", "random"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--attention-length", type=int, default=16384)
    parser.add_argument("--predict", type=int, default=16384)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--override", nargs="*", default=[])
    args = parser.parse_args()
    args.lengths, args.tokens = [args.length], args.length
    loaded, ids = load(args)
    model, device, dtype = loaded.model, loaded.device, loaded.dtype
    params, layers, width = throughput.geometry(model.config)
    ids = ids[None, : args.length].to(device)

    def rate() -> float:
        throughput._RATES.clear()
        return throughput.device_rate(device, dtype)

    def timed(fn) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    attention_shares, dense_shares = [], []
    heads = model.config.get_text_config().num_attention_heads
    with torch.inference_mode():
        model(input_ids=ids[:, :128])  # warm-up
        before = rate()
        for _ in range(args.rounds):  # one layer's causal attention alone: its share
            q, k, v = (
                torch.randn(1, heads, args.attention_length, width // heads, device=device, dtype=dtype) for _ in "qkv"
            )
            seconds = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
            after = rate()
            flops = 2.0 * args.attention_length**2 * width  # one layer's (evals.core.run.throughput's docstring)
            attention_shares.append(flops / seconds / ((before + after) / 2))
            print(json.dumps({"attention_s": round(seconds, 2), "length": args.attention_length,
                              "matmul_gflops": [round(before / 1e9, 1), round(after / 1e9, 1)],
                              "share": round(attention_shares[-1], 3)}), flush=True)  # fmt: skip
            before = after
        attention = statistics.median(attention_shares)
        for _ in range(args.rounds):  # the whole model: the weight matrices' share, its attention's time taken out
            seconds = timed(lambda: model(input_ids=ids))
            after = rate()
            mean = (before + after) / 2
            dense, attn = throughput.forward_flops(params, layers, width, args.length)
            dense_shares.append(dense / (seconds - attn / (attention * mean)) / mean)
            print(json.dumps({"forward_s": round(seconds, 2), "length": args.length,
                              "tflop": [round(dense / 1e12, 3), round(attn / 1e12, 3)],
                              "matmul_gflops": [round(before / 1e9, 1), round(after / 1e9, 1)],
                              "dense_share": round(dense_shares[-1], 3)}), flush=True)  # fmt: skip
            before = after
    dense = statistics.median(dense_shares)
    flops = throughput.forward_flops(params, layers, width, args.predict)
    print(
        json.dumps(
            {
                "model": args.model,
                "matmul_params": params,
                "layers": layers,
                "attention_width": width,
                "shares": [round(dense, 3), round(attention, 3)],
                f"tflop@{args.predict}": [round(f / 1e12, 2) for f in flops],
                f"predicted_s@{args.predict}": round(flops[0] / (dense * after) + flops[1] / (attention * after), 1),
                "at_matmul_gflops": round(after / 1e9, 1),
                "threads": torch.get_num_threads(),
            }
        )
    )


if __name__ == "__main__":
    main()
