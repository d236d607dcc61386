"""Scoring helpers shared by the evals: per-token NLL without materialising [tokens, vocab] logits, a
per-layer progress bar for long forwards (on a terminal), out-of-memory handling that treats a CPU
allocation failure like a CUDA one, and what a length will cost before it runs (:class:`Cost`)."""

from __future__ import annotations

import contextlib
import gc
import sys

import torch
import torch.nn.functional as F

from .core.progress import interactive

# how allocators word a failed allocation: CUDA / MPS raise torch.OutOfMemoryError; the CPU allocator a
# RuntimeError ("DefaultCPUAllocator: can't allocate memory ..."), and Python a MemoryError
_OOM_WORDS = ("can't allocate memory", "cannot allocate memory", "not enough memory", "out of memory")


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is a failed allocation on any device."""
    if isinstance(err, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(err, RuntimeError) and any(word in str(err).lower() for word in _OOM_WORDS)


def free_memory() -> None:
    """Release what a failed forward left behind, so the next (shorter) one can run."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return max(lists, key=len) if lists else None


@contextlib.contextmanager
def layer_progress(model: torch.nn.Module, desc: str, enabled: bool = True):
    """A tqdm bar that advances once per decoder layer during the forwards inside the block."""
    layers = _decoder_layers(model) if enabled and interactive() else None
    if layers is None:
        yield
        return
    from tqdm import tqdm

    bar = tqdm(total=len(layers), desc=desc, unit="layer", leave=False)

    def advance(*_) -> None:  # must return None: a forward hook's return value replaces the output
        bar.update(1)

    hooks = [layer.register_forward_hook(advance) for layer in layers]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()
        bar.close()


def logit_softcap(model: torch.nn.Module) -> float | None:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return getattr(config, "final_logit_softcapping", None)


@torch.inference_mode()
def token_nll(
    model: torch.nn.Module, ids: torch.Tensor, chunk_tokens: int = 2048, progress: bool = False
) -> torch.Tensor:
    """NLL (nats, float32, on CPU) of ids[1:] given their prefixes: one forward over ``ids`` (1-D).

    The final hidden states go through the LM head and cross-entropy ``chunk_tokens`` positions at
    a time, so the full [n, vocab] logit tensor never exists.
    """
    device = next(model.parameters()).device
    input_ids = ids.to(device)[None]
    with layer_progress(model, f"forward {len(ids)} tok", enabled=progress):
        hidden = model.base_model(input_ids=input_ids, use_cache=False).last_hidden_state[0]
    head, cap = model.get_output_embeddings(), logit_softcap(model)
    targets = input_ids[0, 1:]
    out = torch.empty(len(ids) - 1, dtype=torch.float32)
    for start in range(0, len(ids) - 1, chunk_tokens):
        end = min(start + chunk_tokens, len(ids) - 1)
        logits = head(hidden[start:end]).float()
        if cap:
            logits = torch.tanh(logits / cap) * cap  # Gemma-style final soft-capping
        out[start:end] = F.cross_entropy(logits, targets[start:end], reduction="none").cpu()
    return out


def sliding_nll(
    model, ids: torch.Tensor, window: int, stride: int, bos_id: int | None, chunk_tokens: int
) -> torch.Tensor:
    """NLL of every scored token of ``ids`` with windows of ``window`` tokens, in order.

    Each window scores only the tokens no earlier window scored; a window's first token is scored
    only when BOS precedes it (otherwise it has no prefix in the window, as in the HF recipe).
    """
    offset = 1 if bos_id is not None else 0  # chunk index of ids[begin]
    span = window - offset
    pieces, scored_until, begin = [], 1 - offset, 0
    while scored_until < len(ids):
        end = min(begin + span, len(ids))
        chunk = ids[begin:end]
        if bos_id is not None:
            chunk = torch.cat([torch.tensor([bos_id]), chunk])
        nll = token_nll(model, chunk, chunk_tokens)  # nll[j] scores chunk[j + 1]
        first = max(scored_until - begin + offset, 1)  # chunk index of the first token to score
        pieces.append(nll[first - 1 :])
        scored_until = end
        begin += stride
    return torch.cat(pieces) if pieces else torch.empty(0)


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
        new = length if new is None else new
        # 2 FLOPs per multiply-add: the dense layers once per new token, causal attention over the prefix
        return 2.0 * self.params * new + 2.0 * self.layers * self.hidden * (length**2 - (length - new) ** 2)

    def record(self, seconds: float, length: int, new: int | None = None, forwards: int = 1) -> None:
        """``forwards`` forwards measured: ``new`` tokens (default all) of a ``length``-token sequence, in ``seconds``."""
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
