"""Out-of-memory detection and recovery shared by the evals: a failed allocation is recognised on any device
(a CPU allocator's RuntimeError and Python's MemoryError like CUDA's ``OutOfMemoryError``), and what the failed
forward left behind is released so a shorter one can run; the eval records the length as out of memory."""

from __future__ import annotations

import gc


# how allocators word a failed allocation: CUDA / MPS raise torch.OutOfMemoryError; the CPU allocator a
# RuntimeError ("DefaultCPUAllocator: can't allocate memory ..."), and Python a MemoryError
_OOM_WORDS = ("can't allocate memory", "cannot allocate memory", "not enough memory", "out of memory")


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is a failed allocation on any device."""
    import torch

    if isinstance(err, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(err, RuntimeError) and any(word in str(err).lower() for word in _OOM_WORDS)


def free_memory() -> None:
    """Release what a failed forward left behind, so the next (shorter) one can run."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
