"""Where and in what precision a model runs: ``model.device`` (``auto``: cuda, mps, cpu; or a device this machine has)
and ``model.dtype`` (``auto``: bfloat16 on CUDA, float32 elsewhere), each refused in one line when wrong."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .hub import ModelLoadError

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "bfloat16", "float16")  # torch dtypes by name


def resolve_device(device: str) -> torch.device:
    """``auto`` (cuda, mps, cpu) or a device this machine has; anything else is a ModelLoadError."""
    import torch

    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ModelLoadError(f"model.device={device!r} is not a device; valid: auto, cpu, cuda, cuda:N, mps") from None
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ModelLoadError(
                f"model.device={device!r} but this machine has no CUDA device (torch "
                f"{torch.__version__}); use model.device=auto or cpu"
            )
        if resolved.index is not None and resolved.index >= count:
            raise ModelLoadError(
                f"model.device={device!r} but this machine has {count} CUDA device(s): cuda:0..cuda:{count - 1}"
            )
    elif resolved.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ModelLoadError(f"model.device={device!r} but MPS is not available here; use model.device=auto or cpu")
    elif resolved.type not in ("cpu", "cuda", "mps"):
        raise ModelLoadError(f"model.device={device!r}: rope_ext runs on auto, cpu, cuda, cuda:N or mps")
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {name: getattr(torch, name) for name in DTYPES}[dtype]
