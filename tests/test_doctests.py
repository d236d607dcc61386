"""The examples in the docstrings of rope_ext's public API (``rope_ext.__all__``) run, with the standard doctest module.

Each public function or class states its arguments, what it returns and what it raises, with a short ``>>>`` example
on tiny tensors or a tiny transformers config; this runs every example there is, so CI keeps them true.
"""

from __future__ import annotations

import doctest
import inspect

import pytest

import rope_ext

PUBLIC = [name for name in rope_ext.__all__ if callable(getattr(rope_ext, name))]
WITH_EXAMPLES = [name for name in PUBLIC if ">>>" in (inspect.getdoc(getattr(rope_ext, name)) or "")]


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_docstring_example_runs(name):
    obj = getattr(rope_ext, name)
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    globs = {**vars(inspect.getmodule(obj)), "rope_ext": rope_ext}
    for test in finder.find(obj, name, globs=globs):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted and not result.failed, f"{name}: {result.failed} of {result.attempted} examples failed"


def test_every_public_name_has_an_example():
    """A public function or class without a ``>>>`` example fails here (its docstring also states its arguments,
    what it returns and what it raises)."""
    assert set(rope_ext.__all__) - set(PUBLIC) == {"ALIASES", "STRATEGIES"}  # the registries: dicts, no docstring
    missing = sorted(set(PUBLIC) - set(WITH_EXAMPLES))
    assert not missing, f"no >>> example in the docstring of {', '.join(missing)}"
