"""What a job runs on: the model resolved once and loaded (models.py; the one hub access, hub.py; kept between
jobs, model_cache.py), the documents loaded and tokenized (data.py), and what an eval gets of them
(context.py: the tokenizer, the documents, the patched model)."""
