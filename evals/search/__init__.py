"""A search for the best setting of one strategy on one model and target length: ``-m hydra/sweeper=optuna``.

    python run.py -m hydra/sweeper=optuna scaling=yarn objective=ppl@16384 hydra.sweeper.n_trials=30 \\
        'eval.lengths=[4096,16384]' 'constraints=["ppl_retention@4096>=0.98"]'

What is implemented (the Hydra sweeper class is ``hydra_plugins/rope_ext_optuna_sweeper``; the work is here):

- The engine is Optuna >= 4 (Akiba et al. 2019, arXiv 1907.10902) through its ask-and-tell interface: TPE for a
  handful of parameters, with constraints, or with several objectives; CMA-ES for many unconstrained ones.
- ``space``: the search space is taken from the strategy's registration (``rope_ext.Param.search`` and ``log``),
  unless the user gives ranges in Hydra's sweep syntax (``scaling.factor=tag(log,interval(1.5,8))``,
  ``choice(...)``, ``range(...)``, ``a,b``), which are checked against the parameter's declared bounds.
  Per-dimension factors (``scaling=longrope`` or ``mixed``) are searched LongRoPE-style (Ding et al. 2024, arXiv
  2402.13753): >= 1, non-decreasing with the dimension, the first n-hat dimensions left alone, at most 1.25 x the
  extension asked for -- parameterised so that every sample is valid.
- ``objective``: any per-length metric the eval declares (``ppl@L``, ``longppl@L``, ``needle_nll@L``, LongRoPE2's
  needle-driven perplexity, Shang et al. 2025, arXiv 2502.20082, ``ruler@L``, accuracies), its direction from its
  ``Metric`` declaration; ``constraints`` such as LongRoPE2's short-context guard ``ppl_retention@4096>=0.98``
  against the unscaled model (``verdict.baseline``). Several objectives give the Pareto front. All of it is
  checked against the eval's declarations and the job's lengths before any trial runs.
- ``study``: every trial is an ordinary job of the configured launcher (its own directory, key and resume);
  the Optuna study is ``optuna.db`` in the sweep directory, so re-running the same command continues it: trials
  that finished are not repeated, a trial cut off is tried again (its job reused if it had finished), a failed
  job is a failed trial and the search goes on. ``claims``: which process runs a trial, so several processes
  share one study's budget and only a dead one's trial is taken for cut off.
- ``outputs``: the trial table, the best parameters and a ready-to-use ``conf/scaling/<strategy>_searched.yaml``,
  a section of the sweep's report and a W&B run of the sweep's group; ``figures``: objective-by-trial,
  parameter-importance, parallel-coordinate and Pareto figures; ``summary``: what the terminal says it found.
"""

# the sweeper's class, as the Hydra config names it (conf: hydra_plugins/rope_ext_optuna_sweeper/config.py)
SWEEPER = "hydra_plugins.rope_ext_optuna_sweeper.optuna_sweeper.OptunaSweeper"


def is_search(config) -> bool:
    """Whether a multirun's config is a search (its failed trials are the search's business, not the sweep's)."""
    from omegaconf import OmegaConf

    return OmegaConf.select(config, "hydra.sweeper._target_", default=None) == SWEEPER
