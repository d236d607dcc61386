"""The biases of the attention projections (W_Q, W_K, W_V), found by their module names and ablated for a job.

Qwen2/Qwen2.5 (Qwen team 2024, arXiv 2412.15115) keep a bias on exactly the q, k and v projections; under RoPE a
constant b added to every query or key is a per-head mean, and the mean is what sets a head's long-distance
decay (``eval=qk_study``). ``eval.ablate_bias=[q,k]`` (qk_study and perplexity) changes those biases on the
loaded model for the duration of the eval and restores them exactly afterwards (the loaded model is shared by
the jobs of a process). Two ways (``eval.ablate_mode``):

- ``zero``: b -> 0. The head's mean becomes the mean of W.x alone; its variance is unchanged (a constant shift
  has none). Does the decay go with the bias?
- ``center`` (the variance-only control): b -> b - mu, mu the mean of the projection's output over the
  calibration tokens, measured layer by layer in one forward (each layer sees the already-centred layers before
  it), so q and k keep all of their token-to-token variation and have mean 0. What decay is left without any
  mean -- bias or W.x -- at all?

Both are fixed biases during the eval (causal: nothing is measured on the tokens being scored). The projections
are the ``q_proj`` / ``k_proj`` / ``v_proj`` linear modules (Llama, Qwen2, Mistral, Gemma naming); a model whose
projections have no bias, or are fused, cannot take the ablation: :func:`check` says so before the model loads.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Callable, Iterator

from .errors import UserError

if TYPE_CHECKING:
    from torch import nn
    import torch

PROJECTIONS = {"q": "q_proj", "k": "k_proj", "v": "v_proj"}
MODES = ("zero", "center")


def biased(model: nn.Module, tensor: str) -> list[tuple[str, nn.Linear]]:
    """(name, module) of every ``<tensor>_proj`` linear with a bias, in model order."""
    suffix = PROJECTIONS[tensor]
    return [
        (name, module)
        for name, module in model.named_modules()
        if name.rsplit(".", 1)[-1] == suffix and getattr(module, "bias", None) is not None
    ]


def layer_bias(attention: nn.Module, tensor: str) -> torch.Tensor | None:
    """The bias of an attention module's ``<tensor>_proj``, None without one (or behind a q/k norm, where it is no
    longer an additive part of the q or k RoPE rotates)."""
    projection = getattr(attention, PROJECTIONS[tensor], None)
    if getattr(projection, "bias", None) is None or getattr(attention, f"{tensor}_norm", None) is not None:
        return None
    return projection.bias.detach()


def check(tensors, model, why: str, error: type[UserError] = UserError) -> None:
    """Every tensor named has a biased projection in ``model`` (a ResolvedModel; its meta model, no weights)."""
    if not tensors:
        return
    from .inputs.models import meta_model

    meta = meta_model(model.config)
    missing = [t for t in tensors if not biased(meta, t)]
    if missing:
        names = ", ".join(PROJECTIONS[t] for t in missing)
        raise error(
            f"{why}={list(tensors)} but model '{model.name}' ({model.config.model_type}) has no bias on {names}; "
            f"it needs a model with q/k/v biases (model=qwen25)"
        )


def _center_shifts(model: nn.Module, modules: list[nn.Linear], calibrate: Callable[[nn.Module], None]) -> dict:
    """Per module, the mean of its output over one calibration forward, each centred before the next layer runs."""
    import torch

    shifts: dict[int, torch.Tensor] = {}

    def hook(module, args, output):
        shift = output.detach().double().mean(dim=tuple(range(output.dim() - 1)))
        shifts[id(module)] = shift
        return output - shift.to(output.dtype)

    handles = [m.register_forward_hook(hook) for m in modules]
    try:
        with torch.inference_mode():
            calibrate(model)
    finally:
        for handle in handles:
            handle.remove()
    return shifts


def _norm(modules) -> float:
    import torch

    return float(torch.stack([m.bias.detach().double().norm() for m in modules]).mean()) if modules else 0.0


@contextlib.contextmanager
def ablated(
    model: nn.Module, tensors, mode: str = "zero", calibrate: Callable[[nn.Module], None] | None = None
) -> Iterator[dict]:
    """The model with the named biases changed (``zero`` or ``center``; ``center`` runs ``calibrate(model)`` once);
    yields what was done, per tensor the mean bias norm before and after. Restored exactly on exit."""
    import torch

    if mode not in MODES:
        raise ValueError(f"ablation mode {mode!r}; valid: {', '.join(MODES)}")
    found = {t: [m for _, m in biased(model, t)] for t in tensors}
    saved = {id(m): m.bias.detach().clone() for modules in found.values() for m in modules}
    done = {
        t: {"mode": mode, "layers": len(modules), "bias_norm_before": _norm(modules)} for t, modules in found.items()
    }
    try:
        with torch.no_grad():
            if mode == "zero":
                for modules in found.values():
                    for m in modules:
                        m.bias.zero_()
            elif found:
                shifts = _center_shifts(model, [m for modules in found.values() for m in modules], calibrate)
                for modules in found.values():
                    for m in modules:
                        m.bias.sub_(shifts[id(m)].to(m.bias.dtype))
        for t, modules in found.items():
            done[t]["bias_norm_after"] = _norm(modules)
        yield done
    finally:
        with torch.no_grad():
            for modules in found.values():
                for m in modules:
                    m.bias.copy_(saved[id(m)])
