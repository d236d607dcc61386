"""A job, parsed and validated once from the composed config into a frozen :class:`~evals.core.job.job.Job`."""
