"""What a job runs on: the model resolved once (models.py), loaded (loading.py: tokenizer and weights) and kept
between jobs (model_cache.py), the one hub access (hub.py), the documents loaded and tokenized (data.py), and what
an eval gets of them (context.py: the tokenizer, the documents, the patched model)."""
