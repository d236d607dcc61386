"""What a forward will cost before it runs: its peak memory estimated from the model's shape
(:func:`estimate_forward_bytes`) against what the device still has (:func:`evals.core.run.peak.available_bytes`), a warning when it
will likely not fit (:func:`warn_if_too_large`), and the expected time and memory of a length said before the
work (:class:`Cost`, one per loaded model: :func:`cost_of`); and what a strategy's time costs against the unscaled
model's, from repeated paired timings with its spread, or nothing (:func:`time_ratio`, for the ranked answer)."""

from __future__ import annotations

from typing import TYPE_CHECKING
import sys

from ..run.peak import available_bytes

if TYPE_CHECKING:
    import torch


def estimate_forward_bytes(model: torch.nn.Module, length: int, query_tokens: int | None = None) -> int:
    """A rough peak of one forward over ``length`` tokens (``query_tokens`` of them new, the rest cached) beyond the
    weights: the formula of :func:`evals.core.run.memory.forward_bytes` (one layer's working set, the attention
    scores where eager attention materialises them, the LM head's chunk, the KV cache when tokens are cached)."""
    from ..run.memory import forward_bytes

    eager = getattr(model.config, "_attn_implementation", "eager") == "eager"
    width = next(model.parameters()).element_size()
    cached = query_tokens is not None
    head = 64 if cached else 2048  # retrieval keeps its last logits; perplexity's default eval.chunk_tokens
    return forward_bytes(model.config, length, width, query_tokens, head_tokens=head, cache=cached, eager=eager)


def warn_if_too_large(model: torch.nn.Module, length: int, what: str, query_tokens: int | None = None) -> bool:
    """Say before a forward that it will likely not fit (it is still tried; a failure is recorded as OOM)."""
    need = estimate_forward_bytes(model, length, query_tokens)
    have = available_bytes(next(model.parameters()).device)
    if have is not None and need > have:
        print(
            f"memory: {what} at {length} tokens needs about {need / 2**30:.1f} GiB, {max(have, 0) / 2**30:.1f} GiB "
            "available; it will likely fail and be recorded as out of memory",
            flush=True,
        )
        return True
    return False


class Cost:
    """What a forward at a length will cost on this device, said before it runs.

    Time: the forward's FLOPs -- 2 x non-embedding parameters per token, plus causal attention, 2 x layers x
    hidden x (L^2 - cached^2) for the new tokens of a length-L sequence (QK^T and AV) -- divided by the rate the
    earlier forwards of this model in this process achieved (so the first says only its memory). Memory: the
    estimate of :func:`estimate_forward_bytes`, scaled on CUDA by how far the last forward's measured peak was
    from its estimate. One instance per loaded model (:func:`cost_of`), so the jobs of a sweep share the rate."""

    def __init__(self, model: torch.nn.Module):
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        embeddings = sum(
            m.weight.numel()
            for m in (model.get_input_embeddings(), model.get_output_embeddings())
            if m is not None and hasattr(m, "weight")
        )
        self.model, self.params = model, max(1, sum(p.numel() for p in model.parameters()) - embeddings)
        self.layers, self.hidden = config.num_hidden_layers, config.hidden_size
        self.flops_done, self.seconds_done, self.memory_ratio = 0.0, 0.0, 1.0
        self.device = next(model.parameters()).device

    def flops(self, length: int, new: int | None = None) -> float:
        """The forward's FLOPs by the budget's formula (:func:`evals.core.run.throughput.forward_flops`), on this
        model's non-embedding parameters and hidden size: only their ratio to the seconds measured is used."""
        from ..run.throughput import forward_flops

        return sum(forward_flops(self.params, self.layers, self.hidden, length, new))

    def record(self, seconds: float, length: int, new: int | None = None, forwards: int = 1) -> None:
        """``forwards`` forwards measured: ``new`` tokens (default all) of a ``length``-token sequence, in ``seconds``."""
        import torch

        from ..run.peak import note_forward

        self.flops_done += forwards * self.flops(length, new)
        self.seconds_done += seconds
        note_forward(length, length if new is None else new, seconds, forwards)  # the job's timings, kept
        if self.device.type == "cuda" and new != 1:  # a decode step's peak says nothing of a length's; skipped
            peak = torch.cuda.max_memory_allocated(self.device)
            self.memory_ratio = max(1.0, peak / max(1, estimate_forward_bytes(self.model, length, new)))
            torch.cuda.reset_peak_memory_stats(self.device)

    def expected(self, length: int, new: int | None = None, forwards: int = 1) -> tuple[float | None, int]:
        """(seconds or None before any forward was measured, peak bytes) of ``forwards`` such forwards."""
        rate = self.flops_done / self.seconds_done if self.seconds_done > 0 else None
        seconds = forwards * self.flops(length, new) / rate if rate else None
        return seconds, int(self.memory_ratio * estimate_forward_bytes(self.model, length, new))

    def announce(self, what: str, length: int, new: int | None = None, forwards: int = 1) -> None:
        """One line in the log before the work: expected time and memory on this device."""
        seconds, peak = self.expected(length, new, forwards)
        when = (
            f"about {_duration(seconds)} at the rate measured so far"
            if seconds is not None
            else "time known after the first forward"
        )
        many = f" ({forwards} forwards)" if forwards > 1 else ""
        print(
            f"{what}: {length} tokens{many}: {when}, about {peak / 2**30:.2f} GiB on {self.device.type}",
            file=sys.stderr,
            flush=True,
        )


def _duration(seconds: float) -> str:
    return (
        f"{seconds:.1f} s"
        if seconds < 120
        else f"{seconds / 60:.1f} min"
        if seconds < 7200
        else f"{seconds / 3600:.1f} h"
    )


_COSTS: dict[int, Cost] = {}


def cost_of(model: torch.nn.Module) -> Cost:
    """The :class:`Cost` of a loaded model (kept while the model is, so a sweep's jobs share its rate)."""
    found = _COSTS.get(id(model))
    if found is None or found.model is not model:
        found = _COSTS[id(model)] = Cost(model)
    return found


# ---- what a strategy's time costs, with its noise (issue #55) --------------------------------------------------------
#
# A job's elapsed time on a shared machine is one draw of a noisy quantity: two timings of one forward on the project's
# busy 2-core box differ by up to 2x. The ratio is measured on the forwards themselves: every job keeps its timed
# forwards ([length, new tokens, seconds, forwards], evals/core/run/peak.py); a strategy's forward is paired with the
# unscaled job's forward of the same shape in the same eval (the k-th of that shape with the k-th: the same document,
# prompt or chunk), and the ratio is the geometric mean of the paired ratios with a t interval over the pairs (95%).
# Decode steps (fewer than PREFILL new tokens) count only when a job has no longer forward. Fewer than MIN_PAIRS
# pairs: no ratio (it would be one timing against one timing, printed as if it meant something).

MIN_PAIRS = 3
PREFILL = 64


def _shapes(job: dict) -> dict[tuple[int, int], list[float]]:
    """{(length, new tokens): [seconds per forward, in order]} of a job's timed forwards."""
    found: dict[tuple[int, int], list[float]] = {}
    for length, new, seconds, forwards in (job.get("timings") or {}).get("forwards") or []:
        found.setdefault((int(length), int(new)), []).append(float(seconds) / max(1, int(forwards)))
    return found


def paired_seconds(own: dict, reference: dict) -> list[tuple[float, float]]:
    """(own seconds, reference seconds) of the forwards of one shape the two jobs both ran, k-th with k-th."""
    mine, theirs = _shapes(own), _shapes(reference)
    shared = [key for key in mine if key in theirs]
    long = [key for key in shared if key[1] >= PREFILL]
    return [pair for key in (long or shared) for pair in zip(mine[key], theirs[key]) if pair[0] > 0 and pair[1] > 0]


def time_ratio(jobs: list[tuple[dict, dict]]) -> dict | None:
    """The time of a strategy's jobs over the unscaled model's, from their paired forwards (``jobs``: [(the
    strategy's job, the unscaled job of the same eval)]): {"ratio", "low", "high", "n"}, a 95% t interval over
    the pairs; None under :data:`MIN_PAIRS` pairs."""
    import math

    from scipy import stats

    logs = [math.log(a / b) for own, reference in jobs for a, b in paired_seconds(own, reference)]
    n = len(logs)
    if n < MIN_PAIRS:
        return None
    mean = sum(logs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)  # the mean log ratio's 95% t interval
    return {"ratio": math.exp(mean), "low": math.exp(mean - half), "high": math.exp(mean + half), "n": n}


def time_text(found: dict | None) -> str | None:
    """``time x1.12 [1.05, 1.19]`` (``x1.00 [0.93, 1.08], no difference``), or None: not measured so it means
    something."""
    if found is None:
        return None
    same = found["low"] <= 1 <= found["high"]
    return f"time x{found['ratio']:.2f} [{found['low']:.2f}, {found['high']:.2f}]" + (", no difference" if same else "")
