"""rope_ext entry point: compose model x scaling x eval x data with Hydra and run the job.

    python run.py scaling=yarn scaling.factor=2 eval.lengths=[4096,16384]
    python run.py -m scaling=none,ntk,yarn scaling.factor=2,4

The Hydra app lives in ``evals/cli.py`` (the ``rope-ext`` console script runs the same one); ``run(cfg)``
runs one composed config without Hydra's decorator (tests, notebooks).
"""

import sys

from evals.cli import main
from evals.core.run.runner import run

__all__ = ["main", "run"]

if __name__ == "__main__":
    sys.exit(main())
