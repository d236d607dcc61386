"""Ctrl-C and SIGTERM, one outcome wherever they land: the job recorded as interrupted, one line, exit 130.

Python raises the interrupt (a KeyboardInterrupt) wherever the main thread happens to be, and some of those places
turn it into something else:

- Python 3.11 wraps whatever a descriptor's ``__set_name__`` raises during class creation in a ``RuntimeError``
  ("Error calling __set_name__ on 'Field' instance ..."): dataclass fields and ``functools.cached_property`` are
  such descriptors, so an interrupt landing while a module is imported -- lm-eval's task loading imports rdata,
  xarray and scipy, seconds of class bodies -- came out as a RuntimeError with the interrupt as its cause: a crash,
  its traceback and exit 1;
- a library catches it and raises its own error from it, or swallows it (``except:`` in datasets' fingerprinting);
- Python cannot raise it at all inside a ``__del__``, a weakref callback or a GC callback: it prints "Exception
  ignored in ..." with a traceback, and the run goes on.

So the handler records that the signal came, :func:`interrupted` says whether an error is the interrupt (a
KeyboardInterrupt, an error raised from or during one, or any error once the signal came), :func:`as_interrupt`
turns such an error back into a KeyboardInterrupt around a job's run and raises one when the run finished although
the signal came (it was swallowed), and an interrupt Python could not raise is delivered again, silently.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

_received: list[int] = []  # the signals that came, in order


def _handler(signum, frame):
    _received.append(signum)
    raise KeyboardInterrupt(f"signal {signum}")


def _unraisable(unraisable, _default=sys.unraisablehook) -> None:
    """Python's hook for an exception it cannot raise (in ``__del__``, a callback): an interrupt is delivered again a
    moment later, raised where the main thread has gone on; anything else is printed as usual."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _received:
        # from another thread, a moment later: here the handler would run inside this hook again
        timer = threading.Timer(0.01, os.kill, (os.getpid(), _received[-1]))
        timer.daemon = True
        timer.start()
        return
    _default(unraisable)


def install() -> None:
    """SIGTERM, and SIGINT unless it is ignored (a job started in the background), raise the interrupt; an
    interrupt Python could not raise is delivered again. Signals that came before (an earlier run in this process)
    are forgotten."""
    _received.clear()
    signal.signal(signal.SIGTERM, _handler)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _handler)
    sys.unraisablehook = _unraisable


def received() -> bool:
    """Whether SIGTERM or SIGINT came since :func:`install`."""
    return bool(_received)


def _chain(err: BaseException | None):
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def interrupted(err: BaseException) -> bool:
    """Whether ``err`` is the interrupt: a KeyboardInterrupt, an error raised from or while handling one (a library's
    own type around it, a failure on the way out), or any failure once the signal came (what an interrupt a library
    swallowed left behind). A clean ``sys.exit(0)`` is not."""
    if isinstance(err, SystemExit) and not err.code:
        return False
    return received() or any(isinstance(e, KeyboardInterrupt) for e in _chain(err))


def check() -> None:
    """Raise the interrupt if the signal came: before keeping what was computed while it may have been swallowed."""
    if _received:
        raise KeyboardInterrupt(f"signal {_received[-1]}")


@contextlib.contextmanager
def as_interrupt():
    """Around a job's run: an error that is the interrupt (:func:`interrupted`) leaves as a KeyboardInterrupt (from
    it), and so does a run that finished after the signal came."""
    try:
        yield
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as err:
        if not interrupted(err):
            raise
        first = next((e for e in _chain(err) if isinstance(e, KeyboardInterrupt)), None)
        raise KeyboardInterrupt(*(first.args if first else (f"signal {_received[-1]}",))) from err
    check()
