"""``python -m evals.report DIR [DIR ...]``: the local report (see :mod:`evals.report`)."""

import sys

from . import main

sys.exit(main(sys.argv[1:]))
