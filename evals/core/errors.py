"""The one error class for everything a user can get wrong.

A :class:`UserError` carries one line that names the value, says why it is wrong and what is valid.
The runner prints that line and exits 2 (or, inside a sweep, records it for that job and goes on);
the suite and the tests catch this class alone. Every eval declares its own subclass at registration.
"""

from __future__ import annotations

import contextlib


class UserError(Exception):
    """A value a user can get wrong: the message is one line naming it, why, and what is valid."""


class DataError(UserError):
    """Documents cannot be obtained or read; the message says what to do."""


class EvalDefect(Exception):
    """An eval that breaks its own declaration (a verdict metric it never measured, a metric it never declared):
    not the user's doing, so not exit 2, but one line and a failed job -- never a silent run without a verdict."""


class ConfigError(UserError):
    """A config value that cannot work, found before any work starts."""


class ScalingConfigError(UserError):
    """A scaling config rope_ext rejects (its ScalingError, raised again as a user error)."""


class TargetUnreachable(ScalingConfigError):
    """A strategy that cannot be set up for the target length (``target=``): a user error for one run; in a sweep
    an outcome the answer reports ("cannot reach"), not a failed job. ``job``: what the report groups it by."""

    def __init__(self, message: str, job: dict | None = None):
        super().__init__(message)
        self.job = job or {}


@contextlib.contextmanager
def scaling_errors_as_user_errors():
    """rope_ext knows nothing of evals: its ScalingError becomes a ScalingConfigError at this boundary."""
    from rope_ext import ScalingError

    try:
        yield
    except ScalingError as err:
        raise ScalingConfigError(str(err)) from None
