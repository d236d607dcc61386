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
