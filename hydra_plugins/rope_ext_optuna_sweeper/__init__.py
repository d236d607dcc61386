"""rope_ext's Optuna sweeper for Hydra (``hydra/sweeper=optuna``): a search over a strategy's parameters.

Our own, on Optuna >= 4 and Hydra's Sweeper API: the official ``hydra-optuna-sweeper`` (1.3.0, its latest
release) requires ``optuna>=2.10.0,<3.0.0``. This package only declares the config and the class Hydra finds;
the search itself is :mod:`evals.search`.
"""
