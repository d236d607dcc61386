"""Progress that reads well both on a terminal and in a log file.

On a terminal: tqdm bars. Otherwise (a redirected log, a SLURM job, CI): no carriage-return bars, but one
line per finished item with the elapsed time, so a log shows where a long run is. ``TQDM_DISABLE=1``
silences both.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")


def interactive() -> bool:
    return sys.stderr.isatty() and not os.environ.get("TQDM_DISABLE")


def progress(items: Iterable[T], desc: str, unit: str, total: int | None = None) -> Iterator[T]:
    """``items``, with a bar on a terminal or a line per finished item in a log."""
    if os.environ.get("TQDM_DISABLE"):
        yield from items
        return
    if interactive():
        from tqdm import tqdm

        yield from tqdm(items, desc=desc, unit=unit, total=total)
        return
    items = list(items) if total is None and not hasattr(items, "__len__") else items
    total = total if total is not None else len(items)
    started = time.perf_counter()
    for done, item in enumerate(items, 1):
        yield item
        print(f"{desc}: {done}/{total} {unit} done, {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
