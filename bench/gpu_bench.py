"""The GPU rows of docs/benchmarks.md in one process: a Llama-3-8B-shaped model with random bf16 weights, loaded
once, measured step by step against a deadline (a lent GPU is time-limited), each result written as a JSON line
as soon as it exists.

Steps (each skipped, and said so, once the deadline has passed):
- ``peak``: the bf16 matrix rate of the card (8192^3 products, random data), the ceiling MFU is read against.
- ``kernels``: the attention-level methods' fused CUDA path (flash / memory-efficient kernels with their
  log-sum-exp, :mod:`rope_ext.attention.assembled`) against a float64 matmul reference on a 2-layer model of the same
  shape, and the frequency path in bf16 (YaRN patched onto a default-RoPE model against transformers' native
  YaRN, same weights): relative logit differences.
- ``curve``: the perplexity curve (prefix, one forward + chunked LM head, :func:`evals.core.scoring.token_nll`) at
  every length up to the longest, against one bare decoder forward at the longest; and the per-length approach
  of public scripts (one ``model(ids, labels)`` per length) until it runs out of memory.
- ``frequency``: a frequency strategy (YaRN), a dynamic one (dynamic NTK) and the log-n query hook at one
  length, against ``none``: decoder forward time.
- ``attention``: each attention-level method at its target setting (:func:`rope_ext.strategies.targets.for_target`) at
  each ``--attention-lengths``, through each of ``--backends`` (FlexAttention, :mod:`rope_ext.attention.flex`, and the
  blocks of :mod:`rope_ext.attention.assembled`): prefill time and peak memory against a plain forward, and decode cost
  per token after the prefill (KV cache). Issue #54's targets, FlexAttention at <= 1.3x a plain prefill at 32k
  and decode <= 1.5x at 128k: ``--steps kernels,attention --attention-lengths 32768,131072``.

    python bench/gpu_bench.py --out gpu.jsonl                       # H100/H200: the whole list, ~6 min
    python bench/gpu_bench.py --device cpu --dtype float32 --layers 2 --lengths 1024,2048 --attention-lengths 2048 \\
        --kernel-length 2048 --frequency-length 2048 --override model.architecture.hidden_size=256 ...  # a smoke run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

ATTENTION_METHODS = ("self_extend", "dca", "rerope", "leaky_rerope", "string", "lm_infinite")
TRAINED = 8192  # Llama-3-8B's trained context (conf/model/llama3.yaml)


class Bench:
    def __init__(self, args):
        self.args, self.start, self.errors = args, time.perf_counter(), 0
        self.out = open(args.out, "a") if args.out else None

    def left(self) -> float:
        return self.args.deadline - (time.perf_counter() - self.start)

    def record(self, step: str, **fields) -> None:
        line = json.dumps({"step": step, "t": round(time.perf_counter() - self.start, 1), **fields})
        print(line, flush=True)
        if self.out:
            self.out.write(line + "\n")
            self.out.flush()

    def sync(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def timed(self, work, repeat: int = 1):
        """(median seconds, peak GiB above the start, result) of ``work()``; OOM -> (None, None, 'oom')."""
        from evals.core.scoring import is_out_of_memory

        times, result = [], None
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() if cuda else 0
        try:
            for _ in range(repeat):
                self.sync()
                begin = time.perf_counter()
                result = work()
                self.sync()
                times.append(time.perf_counter() - begin)
        except Exception as err:
            if not is_out_of_memory(err):
                raise
            if cuda:
                torch.cuda.empty_cache()
            return None, None, "oom"
        peak = (torch.cuda.max_memory_allocated() - base) / 2**30 if cuda else None
        return sorted(times)[len(times) // 2], peak and round(peak, 2), result


def load(args, layers: int | None, overrides=()):
    """(model, token ids) of the Llama-3-8B shape with random weights, via the harness's own loading."""
    from perplexity_bench import load as load_model

    extra = [f"model.architecture.num_hidden_layers={layers}"] if layers else []
    ns = argparse.Namespace(
        model="llama3",
        weights="random",
        device=args.device,
        dtype=args.dtype,
        lengths=[max(args.lengths + args.attention_lengths + [args.kernel_length, args.frequency_length])],
        tokens=None,
        override=[*extra, *overrides],
    )
    loaded, ids = load_model(ns)
    return loaded.model.eval(), ids


def peak_rate(bench: Bench) -> float | None:
    if not torch.cuda.is_available():
        return None
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    seconds, _, _ = bench.timed(lambda: a @ b, repeat=10)
    tflops = 2 * 8192**3 / seconds / 1e12
    bench.record("peak", tflops=round(tflops, 1), device=torch.cuda.get_device_name())
    return tflops


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float(f"{float((a - b).norm() / b.norm()):.3g}")


def setting(method: str, length: int, trained: int | None = None) -> dict:
    """The method set up for ``length`` by its target rule; its defaults where the target is out of its reach
    (STRING cannot reach 2L - W tokens or more)."""
    from rope_ext.strategies import targets

    if method == "none":
        return {"name": "none"}
    try:
        return targets.for_target({"name": method}, trained or TRAINED, length).config
    except targets.TargetError:
        return {"name": method}


def kernels(bench: Bench, args) -> None:
    """Fused CUDA path vs a float64 matmul reference; patched vs native YaRN in bf16 (2-layer models).

    Final hidden states are compared (float64 logits at 16k x 128k vocab would not fit). The reference is a
    copy whose parameters alone are cast to float64: the rotary buffers stay float32, as in the bf16 model."""
    import copy

    import rope_ext
    from rope_ext.attention import assembled, flex

    trained = args.kernel_trained  # a shorter trained context: the float64 reference fits at 2x it
    shorter = [f"model.original_max_position={trained}", f"model.architecture.max_position_embeddings={trained}"]
    model, ids = load(args, 2, [*args.override, *shorter])
    reference = copy.deepcopy(model)
    for param in reference.parameters():
        param.data = param.data.double()
    length = args.kernel_length
    x = ids[None, :length].to(model.device)

    def hidden(m):
        return m.model(input_ids=x, use_cache=False).last_hidden_state

    with torch.no_grad():
        plain = hidden(reference)
        for method in args.methods:
            config = setting(method, length, trained)
            with rope_ext.patch(reference, config):
                exact = hidden(reference)  # float64: the matmul path
            with rope_ext.patch(model, config):
                with flex.backend("blocks"):
                    fused = hidden(model)
                    fused_kernel, assembled.fused_kernel = assembled.fused_kernel, lambda t: False
                    try:
                        matmul = hidden(model)
                    finally:
                        assembled.fused_kernel = fused_kernel
                with flex.backend("flex"):
                    flexed = hidden(model)
            bench.record(
                "kernels",
                method=method,
                length=length,
                fused_vs_float64=rel(fused, exact),
                matmul_vs_float64=rel(matmul, exact),
                flex_vs_float64=rel(flexed, exact),
                method_vs_plain=rel(exact, plain),
            )
    del reference
    # bf16 frequencies: YaRN x4 patched onto default RoPE against transformers' native YaRN (same seed, weights)
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": trained, "rope_theta": 500000.0}
    overrides = [f"++model.architecture.rope_parameters.{key}={value}" for key, value in yarn.items()]
    native, _ = load(args, 2, [*args.override, *shorter, *overrides])
    with torch.no_grad():
        want = hidden(native)
        with rope_ext.patch(model, {"name": "yarn", "factor": 4.0}, trained):
            got = hidden(model)
        unpatched = hidden(model)
    bench.record(
        "kernels",
        method="yarn_bf16_frequencies",
        length=length,
        patched_vs_native=rel(got, want),
        unpatched_vs_native=rel(unpatched, want),
    )
    del native, model


def curve(bench: Bench, args, model, ids, peak) -> None:
    from perplexity_bench import flops

    from evals.core.scoring import token_nll

    longest = max(args.lengths)
    x = ids[None, :longest].to(model.device)
    with torch.inference_mode():
        model.model(input_ids=x[:, :256], use_cache=False)  # warm-up
        body, body_gib, _ = bench.timed(lambda: model.model(input_ids=x, use_cache=False) and None)
        bench.record(
            "curve",
            mode="body",
            length=longest,
            seconds=body and round(body, 2),
            peak_gib=body_gib,
            tflops=body and round(flops(model, [longest], lm_head=False) / body / 1e12, 1),
            mfu=body and peak and round(flops(model, [longest], lm_head=False) / body / 1e12 / peak, 3),
        )
        prefix, prefix_gib, nll = bench.timed(lambda: token_nll(model, ids[:longest], 2048))
        bench.record(
            "curve",
            mode="prefix",
            lengths=args.lengths,
            seconds=prefix and round(prefix, 2),
            peak_gib=prefix_gib,
            vs_body=prefix and body and round(prefix / body, 3),
            ppl={L: round(float(nll[: L - 1].double().mean().exp()), 3) for L in args.lengths} if prefix else None,
        )
        for length in args.lengths:
            if bench.left() < 60:
                bench.record("curve", mode="per_length", length=length, skipped="deadline")
                break

            def per_length():
                return float(model(ids[None, :length].to(model.device), labels=ids[None, :length]).loss)

            seconds, gib, loss = bench.timed(per_length)
            bench.record(
                "curve", mode="per_length", length=length, seconds=seconds and round(seconds, 2), peak_gib=gib,
                oom=loss == "oom",
            )  # fmt: skip
            if loss == "oom":
                break


def forward_seconds(bench: Bench, model, x, spec):
    import rope_ext

    with torch.inference_mode(), rope_ext.patch(model, spec, TRAINED):
        model.model(input_ids=x[:, :256], use_cache=False)
        return bench.timed(lambda: model.model(input_ids=x, use_cache=False) and None)[:2]


def frequency(bench: Bench, args, model, ids) -> None:
    length = args.frequency_length
    x = ids[None, :length].to(model.device)
    factor = length / TRAINED
    specs = [
        {"name": "none"},
        {"name": "yarn", "factor": factor},
        {"name": "dynamic_ntk", "factor": factor},
        {"name": "logn"},
        {"name": "none"},
    ]
    for spec in specs:
        if bench.left() < 30:
            bench.record("frequency", spec=spec, skipped="deadline")
            continue
        seconds, gib = forward_seconds(bench, model, x, spec)
        bench.record("frequency", spec=spec, length=length, seconds=seconds and round(seconds, 3), peak_gib=gib)


def decode_seconds(bench: Bench, model, x, spec, tokens: int) -> float | None:
    """Seconds for ``tokens`` greedy decode steps after a prefill of ``x`` (KV cache), under ``spec``."""
    import rope_ext

    with torch.inference_mode(), rope_ext.patch(model, spec, TRAINED):
        cache = model(x[:, :-1], use_cache=True, logits_to_keep=1).past_key_values

        def decode_steps():
            nonlocal cache
            token = x[:, -1:]
            for _ in range(tokens):
                out = model(token, past_key_values=cache, use_cache=True, logits_to_keep=1)
                cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)

        return bench.timed(decode_steps)[0]


def attention(bench: Bench, args, model, ids) -> None:
    """Each method through each of ``--backends`` (rope_ext.attention.flex: FlexAttention, or the blocks of
    rope_ext.attention.assembled) against the plain model, at each ``--attention-lengths``."""
    from rope_ext.attention import flex

    for length in args.attention_lengths:
        x = ids[None, :length].to(model.device)
        runs = [("none", "-"), *((m, b) for m in args.methods for b in args.backends)]
        for method, backend in runs:
            if bench.left() < 45:
                bench.record("attention", method=method, backend=backend, length=length, skipped="deadline")
                continue
            spec = setting(method, length)
            with flex.backend(backend if backend != "-" else "auto"):
                seconds, gib = step(bench, "attention", forward_seconds, bench, model, x, spec) or (None, None)
                decode = None
                if seconds is not None and args.decode_tokens:
                    decode = step(bench, "attention", decode_seconds, bench, model, x, spec, args.decode_tokens)
            bench.record(
                "attention",
                method=method,
                backend=backend,
                setting={k: v for k, v in spec.items() if k != "name"},
                length=length,
                prefill_s=seconds and round(seconds, 3),
                peak_gib=gib,
                decode_ms_per_token=decode and round(1000 * decode / args.decode_tokens, 2),
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the model's 32)")
    parser.add_argument("--lengths", default="4096,8192,16384,32768,65536,131072")
    parser.add_argument("--frequency-length", type=int, default=131072)
    parser.add_argument("--attention-lengths", default="32768")
    parser.add_argument("--kernel-length", type=int, default=4096, help="the kernels step's sequence (2-layer model)")
    parser.add_argument("--kernel-trained", type=int, default=2048, help="the kernels step's trained context")
    parser.add_argument("--methods", default=",".join(ATTENTION_METHODS), help="attention-level methods")
    parser.add_argument("--trained", type=int, default=TRAINED, help="the model's trained context (with --override)")
    parser.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides (a smaller model)")
    parser.add_argument("--decode-tokens", type=int, default=16)
    parser.add_argument(
        "--backends", default="blocks,flex", help="attention-level paths: blocks, flex (rope_ext.attention.flex)"
    )
    parser.add_argument("--steps", default="peak,kernels,curve,frequency,attention")
    parser.add_argument("--deadline", type=float, default=480.0, help="seconds; later steps are skipped")
    parser.add_argument("--out", default=None, help="append JSON lines here")
    args = parser.parse_args()
    args.lengths = [int(v) for v in args.lengths.split(",")]
    args.attention_lengths = [int(v) for v in args.attention_lengths.split(",")]
    args.methods = args.methods.split(",")
    args.backends = args.backends.split(",")
    steps = args.steps.split(",")
    globals()["TRAINED"] = args.trained
    bench = Bench(args)
    import transformers

    bench.record("versions", torch=torch.__version__, transformers=transformers.__version__, args=vars(args))
    peak = step(bench, "peak", peak_rate, bench) if "peak" in steps else None
    if "kernels" in steps:
        step(bench, "kernels", kernels, bench, args)
    if {"curve", "frequency", "attention"} & set(steps):
        model, ids = load(args, args.layers, args.override)
        params = sum(p.numel() for p in model.parameters())
        bench.record("loaded", layers=model.config.num_hidden_layers, params=params)
        if "curve" in steps:
            step(bench, "curve", curve, bench, args, model, ids, peak)
        if "frequency" in steps:
            step(bench, "frequency", frequency, bench, args, model, ids)
        if "attention" in steps:
            step(bench, "attention", attention, bench, args, model, ids)
    if bench.errors:  # each step ran on; the failures are in the JSON lines
        raise SystemExit(f"{bench.errors} step(s) failed: see the lines with an 'error'")


def step(bench: Bench, name: str, work, *args):
    """``work(*args)``; a failure is recorded (its last lines) and the next step runs: device time is scarce."""
    import traceback

    try:
        return work(*args)
    except Exception as err:
        bench.errors += 1
        bench.record(name, error=f"{type(err).__name__}: {err}"[:500], where=traceback.format_exc()[-1500:])
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
