"""The decision: what a job's measurements answer. The verdict of one job against the unscaled model (verdict.py:
the rule; paired.py: the paired ratio and its interval; reference.py: the unscaled measurements; verdict_text.py:
the verdict as printed), the ranked answer of a sweep at its target (ranking.py; its ties held jointly,
simultaneous.py; its answer per serving engine, engines.py) and the figures of that answer (answer_figures.py)."""
