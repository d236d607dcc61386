"""Progress that reads well both on a terminal and in a log file.

On a terminal: tqdm bars. Otherwise (a redirected log, a SLURM job, CI): no carriage-return bars, and at
most one line every ``ROPE_EXT_LOG_SECONDS`` (default 30) seconds with the items done and the elapsed time,
plus a last line when the loop took long enough to matter -- so a log shows where a long run is without a
line per prompt. ``TQDM_DISABLE=1`` silences both. transformers' own bars are switched off in a log.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")
QUIET_SECONDS = 2.0  # a loop shorter than this leaves no line in a log


def interactive() -> bool:
    return sys.stderr.isatty() and not os.environ.get("TQDM_DISABLE")


def log_every() -> float:
    try:
        return max(0.0, float(os.environ.get("ROPE_EXT_LOG_SECONDS", "30")))
    except ValueError:
        return 30.0


def quiet_libraries() -> None:
    """No carriage-return bars from transformers (weights loading, generation) or the hub in a redirected log:
    huggingface_hub's switch ``HF_HUB_DISABLE_PROGRESS_BARS``, which transformers reads when it is imported (so the
    command line is checked before transformers is imported); one imported already is told directly."""
    if not interactive():
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        if "transformers" in sys.modules:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()


def progress(
    items: Iterable[T], desc: str, unit: str, total: int | None = None, stop: Callable[[], bool] | None = None
) -> Iterator[T]:
    """``items``, with a bar on a terminal or a throttled line in a log; ``stop()`` ends the loop early
    (checked before each item)."""
    if os.environ.get("TQDM_DISABLE"):
        for item in items:
            if stop and stop():
                return
            yield item
        return
    if interactive():
        from tqdm import tqdm

        bar = tqdm(items, desc=desc, unit=unit, total=total)
        for item in bar:
            if stop and stop():
                bar.close()
                return
            yield item
        return
    if total is None and hasattr(items, "__len__"):
        total = len(items)
    of = f"/{total}" if total is not None and stop is None else ""
    started = last = time.perf_counter()
    done, every = 0, log_every()
    for item in items:
        if stop and stop():
            break
        yield item
        done += 1
        now = time.perf_counter()
        if now - last >= every and (total is None or done < total):
            print(f"{desc}: {done}{of} {unit} done, {now - started:.1f} s", file=sys.stderr, flush=True)
            last = now
    elapsed = time.perf_counter() - started
    if elapsed >= QUIET_SECONDS or last != started:
        print(f"{desc}: {done}{of} {unit} done, {elapsed:.1f} s", file=sys.stderr, flush=True)
