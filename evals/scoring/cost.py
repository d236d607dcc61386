"""What a forward will cost before it runs: its peak memory estimated from the model's shape
(:func:`estimate_forward_bytes`) against what the device still has (:func:`available_bytes`), a warning when it
will likely not fit (:func:`warn_if_too_large`), and the expected time and memory of a length said before the
work (:class:`Cost`, one per loaded model: :func:`cost_of`)."""

from __future__ import annotations

from typing import TYPE_CHECKING
import sys

if TYPE_CHECKING:
    import torch


def estimate_forward_bytes(model: torch.nn.Module, length: int, query_tokens: int | None = None) -> int:
    """A rough peak of one forward over ``length`` tokens (``query_tokens`` of them new, the rest cached):
    one layer's activations (hidden, q/k/v, MLP), the KV cache, and the attention scores where the kernel
    materialises them (eager attention; or any attention after a cache, whose mask is explicit)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    new = query_tokens or length
    width = next(model.parameters()).element_size()
    hidden, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    intermediate = getattr(config, "intermediate_size", 4 * hidden)
    layer = new * (4 * hidden + 2 * kv * head_dim + 3 * intermediate) * width
    cache = 2 * config.num_hidden_layers * length * kv * head_dim * width
    materialised = getattr(config, "_attn_implementation", "eager") == "eager" or query_tokens is not None
    scores = 2 * heads * new * length * max(width, 4) if materialised else 0
    return layer + cache + scores


def available_bytes(device: torch.device) -> int | None:
    """Memory a new allocation can still get on ``device`` (CUDA: free memory; CPU: the least of available
    RAM, the cgroup limit and the process's address-space limit), or None when it cannot be told."""
    import torch

    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    limits = []
    try:
        meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo"))
        limits.append(int(meminfo["MemAvailable"].split()[0]) * 1024)
        status = dict(line.split(":", 1) for line in open("/proc/self/status"))
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            limits.append(soft - int(status["VmSize"].split()[0]) * 1024)
        cgroup = open("/sys/fs/cgroup/memory.max").read().strip()
        if cgroup != "max":
            limits.append(int(cgroup) - int(open("/sys/fs/cgroup/memory.current").read()))
    except (OSError, KeyError, ValueError):
        pass
    return min(limits) if limits else None


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
        from ..core.run.throughput import forward_flops

        return sum(forward_flops(self.params, self.layers, self.hidden, length, new))

    def record(self, seconds: float, length: int, new: int | None = None, forwards: int = 1) -> None:
        """``forwards`` forwards measured: ``new`` tokens (default all) of a ``length``-token sequence, in ``seconds``."""
        import torch

        self.flops_done += forwards * self.flops(length, new)
        self.seconds_done += seconds
        if self.device.type == "cuda":
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
