"""Cost of the attention-level strategies against a plain forward: one forward of the decoder stack at one
length (16k by default, SmolLM2), each method at its recommended setting, side by side.

Each run is its own subprocess, so its memory is its own: on CPU the resident memory is sampled every 20 ms
during the forward and the peak above what was resident before it is reported (loading the GGUF peaks higher
than a forward, so the process's peak RSS would hide it); on CUDA the max allocated during the forward. The plain forward runs first and last, so drift on a shared machine shows.
Prints one JSON line per run and a markdown table with the time and memory against the plain forward.

    python bench/attention_bench.py                          # CPU, SmolLM2, 16384 tokens
    python bench/attention_bench.py --length 8192 --methods none,self_extend,dca
    python bench/attention_bench.py --device cuda --backend flex   # through FlexAttention (rope_ext.attention.flex; CUDA only)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# the recommended settings for SmolLM2 (trained 8192) at 16k: Self-Extend by its rule (1/2-2/3) L > W + (N-W)/G
# with W=1024, G=4 (4864); the others at their reference defaults (rope_ext/strategies/attention_level.py)
METHODS = {
    "none": {"name": "none"},
    "self_extend": {"name": "self_extend", "group_size": 4, "window": 1024},
    "rerope": {"name": "rerope"},
    "leaky_rerope": {"name": "leaky_rerope"},
    "string": {"name": "string"},
    "lm_infinite": {"name": "lm_infinite"},
    "dca": {"name": "dca"},
}


def resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakResident:
    """The peak resident memory while the block runs, sampled every 20 ms in a thread."""

    def __enter__(self):
        self.start = self.peak = resident()
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while self.running:
            self.peak = max(self.peak, resident())
            time.sleep(0.02)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, resident())


def measure(args) -> dict:
    import torch

    import rope_ext
    from perplexity_bench import load

    args.lengths, args.tokens = [args.length], args.length
    loaded, ids = load(args)
    model, device = loaded.model, loaded.device
    ids = ids[None, : args.length].to(device)
    cuda = device.type == "cuda"
    with rope_ext.patch(model, METHODS[args.method]), torch.no_grad():
        for warm in (256, 384):  # warm-up; two lengths, so a compiled FlexAttention kernel is the dynamic one
            model.model(input_ids=ids[:, :warm])
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        with PeakResident() as memory:
            start = time.perf_counter()
            model.model(input_ids=ids)
            if cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() if cuda else memory.peak - memory.start
    return {
        "method": args.method,
        "backend": flex_backend(args.method, ids),
        "setting": METHODS[args.method],
        "length": args.length,
        "seconds": round(seconds, 4),  # a tiny model's forward can take under 5 ms
        "peak_gib": round(peak / 2**30, 3),
        "threads": torch.get_num_threads(),
        "device": str(device),
    }


def flex_backend(method: str, ids) -> str:
    """Which path an attention-level method took here (rope_ext.attention.flex.available), "-" for the others."""
    from rope_ext.attention import flex
    from rope_ext.strategies.registry import STRATEGIES

    if STRATEGIES[METHODS[method]["name"]].kind != "attention":
        return "-"
    return "flex" if flex.available(ids.float()) else "blocks"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--weights", default="pretrained", choices=("pretrained", "random"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--method", help=argparse.SUPPRESS)  # one run, in a subprocess
    parser.add_argument("--override", nargs="*", default=[])
    parser.add_argument(
        "--backend", default="auto", choices=("auto", "flex", "blocks"), help="rope_ext.attention.flex.BACKEND"
    )
    args = parser.parse_args()
    if args.method:
        print(json.dumps(measure(args)), flush=True)
        return
    methods = [m for m in args.methods.split(",") if m != "none"]
    results = []
    for method in ["none", *methods, "none"]:
        command = [
            sys.executable,
            __file__,
            "--method",
            method,
            "--model",
            args.model,
            "--weights",
            args.weights,
            "--device",
            args.device,
            "--dtype",
            args.dtype,
            "--length",
            str(args.length),
            "--override",
            *args.override,
        ]
        env = {**os.environ, "ROPE_EXT_ATTENTION": args.backend}
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        if done.returncode:
            print(done.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{method}: exit {done.returncode}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    plain = [r for r in results if r["method"] == "none"]
    seconds = sum(r["seconds"] for r in plain) / len(plain)
    peak = max(r["peak_gib"] for r in plain)
    print(
        "\n| method | path | setting | seconds | x plain | forward memory GiB | x plain |\n|---|---|---|---|---|---|---|"
    )
    for r in results:
        setting = ", ".join(f"{k}={v}" for k, v in r["setting"].items() if k != "name") or "defaults"
        # a short forward on a tiny model may grow the resident set by less than the 1 MiB reported: no ratio then
        versus = f"{r['peak_gib'] / peak:.2f}" if peak else "-- (plain below 1 MiB)"
        print(
            f"| {r['method']} | {r['backend']} | {setting} | {r['seconds']} | {r['seconds'] / seconds:.2f} | {r['peak_gib']} "
            f"| {versus} |"
        )


if __name__ == "__main__":
    main()
