"""A job, parsed and validated once from the composed config (parse.py) into a frozen Job (job.py): its identity
and key (identity.py), what ``target=`` sets up and the scaling resolved once (target.py), its lengths and the
reference's (lengths.py)."""
