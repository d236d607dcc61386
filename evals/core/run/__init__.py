"""A job run: the runner (runner.py) reuses a finished run or claims a directory (rundir.py), has the unscaled
reference found or run first (reference_search.py), records what the eval measures (output.py; peak memory,
peak.py; W&B, tracking.py; a clean stop, interrupt.py) and writes the finished job's deploy/ folder (deploy.py);
a sweep's cost is said before its first job (budget.py)."""
