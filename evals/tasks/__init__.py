"""The evals: every module or package here registers at least one with ``register_eval``
(:func:`evals.load_evals` imports each of them; tests/test_run.py fails on one that registers nothing). What they
share lives in ``evals/core/`` (``scoring/``, ``stats.py``, ``projection_bias.py``), the app around them in ``evals/``.
"""
