"""``python -m evals.report DIR [DIR ...]``: the local report (see :mod:`evals.report.cli`)."""

import sys

from .cli import main

sys.exit(main(sys.argv[1:]))
