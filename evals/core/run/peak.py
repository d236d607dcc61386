"""The peak memory of a job, for the cost column of the ranked answer and the check of the memory estimate
(:mod:`evals.core.run.memory`): on CUDA the allocator's peak since the job started; otherwise the process's resident
memory sampled every 0.05 s by a daemon thread (a chunk of the LM head lives a fraction of a second; Linux
``/proc/self/statm``; elsewhere ``resource``'s lifetime peak, which a sweep in one process shares). The job's
forwards and their seconds are kept with it (:func:`note_forward`, called by :class:`evals.core.scoring.cost.Cost`): the
repeated timings a cost ratio is measured from (:func:`evals.core.scoring.cost.time_ratio`)."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _resident() -> int | None:
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return None


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


MAX_FORWARDS = 4000  # forwards kept per job (a retrieval job's decode steps beyond it are not)
_CURRENT: list["PeakMemory"] = []


def note_forward(length: int, new: int, seconds: float, forwards: int = 1) -> None:
    """One timed forward (``forwards`` alike, in ``seconds`` together) of the job now running, if any."""
    if _CURRENT and len(_CURRENT[-1].forwards) < MAX_FORWARDS:
        _CURRENT[-1].forwards.append([int(length), int(new), round(float(seconds), 4), int(forwards)])


class PeakMemory:
    """``with PeakMemory() as peak: ...`` then ``peak.bytes`` and ``peak.kind``."""

    def __init__(self, interval: float = 0.05):
        self.interval, self.bytes, self.kind = interval, None, None
        self.forwards: list[list] = []  # [length, new tokens, seconds, forwards] per timed forward of the job
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        while True:
            value = _resident()
            if value is not None:
                self.bytes = max(self.bytes or 0, value)
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> "PeakMemory":
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()
        if _resident() is not None:
            self.kind = "resident (sampled)"
            self._thread = threading.Thread(target=self._sample, daemon=True, name="rope_ext-peak-memory")
            self._thread.start()
        _CURRENT.append(self)
        return self

    def __exit__(self, *exc) -> None:
        import torch

        self._stop.set()
        if self in _CURRENT:
            _CURRENT.remove(self)
        if self._thread is not None:
            self._thread.join(timeout=1)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self.bytes, self.kind = int(torch.cuda.max_memory_allocated()), "cuda allocated"
        elif self.bytes is None:
            import resource

            self.bytes, self.kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process lifetime peak"
