"""Token NLL scoring shared by the evals: per-token NLL of a sequence without materialising [tokens, vocab]
logits (:func:`token_nll`; Gemma-style final soft-capping applied), sliding-window NLL (:func:`sliding_nll`, the
HF recipe: each window scores only the tokens no earlier one did), and a per-layer progress bar for long
forwards on a terminal (:func:`layer_progress`)."""

from __future__ import annotations

from typing import TYPE_CHECKING
import contextlib

from ..progress import interactive

if TYPE_CHECKING:
    import torch


def _decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    import torch

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


def token_nll(
    model: torch.nn.Module, ids: torch.Tensor, chunk_tokens: int = 2048, progress: bool = False
) -> torch.Tensor:
    """NLL (nats, float32, on CPU) of ids[1:] given their prefixes: one forward over ``ids`` (1-D).

    The final hidden states go through the LM head and cross-entropy ``chunk_tokens`` positions at
    a time, so the full [n, vocab] logit tensor never exists.
    """
    import torch
    import torch.nn.functional as F

    with torch.inference_mode():
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
    import torch

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
