"""Scoring helpers shared by the evals: per-token NLL without materialising [tokens, vocab] logits, a
per-layer progress bar for long forwards (on a terminal), and out-of-memory handling that treats a CPU
allocation failure like a CUDA one."""

from __future__ import annotations

import contextlib
import gc

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
def token_nll(model: torch.nn.Module, ids: torch.Tensor, chunk_tokens: int = 2048, progress: bool = False) -> torch.Tensor:
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


def sliding_nll(model, ids: torch.Tensor, window: int, stride: int, bos_id: int | None, chunk_tokens: int) -> torch.Tensor:
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
        print(f"memory: {what} at {length} tokens needs about {need / 2**30:.1f} GiB, {max(have, 0) / 2**30:.1f} GiB "
              "available; it will likely fail and be recorded as out of memory", flush=True)
        return True
    return False
