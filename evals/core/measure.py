"""Measurements: one typed record per number an eval reports at a length, with what it rests on.

A :class:`Measurement` is a declared metric (evals/core/registry.py ``Metric``) at one length: its value,
how many tokens, prompts or samples it rests on (``count``), its 95% interval and how that was computed,
and its *units* -- what it averages over, keyed so that two runs on the same units pair up:

- perplexity and LongPPL: blocks of token positions of each document, ``"<document>/<first position>"`` ->
  (NLL sum, tokens); the unscaled reference and every strategy of a sweep score the same tokens, so their
  blocks pair one to one (and a block of a longer prefix pairs with the same block of a shorter one);
- needle and passkey: prompts, ``"d<depth>-t<trial>"`` -> (score, 1) or (answer NLL, answer tokens);
- RULER and lm-eval tasks: samples, ``"<task>/<index>"`` -> (score, 1).

Evals hand measurements to ``Output.measure``, which refuses a metric the eval did not declare and writes
the record (results.json ``measurements``) and its flat summary keys (``<metric>@L``, ``<count>@L``,
``<metric>_ci95_low@L`` ... for W&B and the search) together; the runner fails a job that declared a verdict
metric and reported none. The verdict (evals/core/decision/verdict.py), the report and the figures read these
records; nothing parses summary keys back.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field


def _round(value: float) -> float:
    """A unit's sum to seven significant digits: results.json stays compact, the statistics unchanged at that precision."""
    return float(f"{value:.7g}") if isinstance(value, float) and math.isfinite(value) else value


@dataclass(frozen=True)
class Measurement:
    metric: str
    length: int
    value: float | None  # None: not measured at this length (out of memory, no key token)
    count: float | None = None  # tokens, prompts or samples the value rests on
    unit: str = ""  # what one unit is ("256-token block", "prompt", "sample")
    units: dict = field(default_factory=dict)  # {key: (sum, weight)}
    low: float | None = None  # 95% interval of the value
    high: float | None = None
    method: str | None = None  # how the interval was computed
    note: str | None = None  # why there is no value

    def record(self) -> dict:
        found = asdict(self)
        found["units"] = {k: [_round(float(s)), _round(float(w))] for k, (s, w) in self.units.items()}
        return found


def summary_keys(record: dict, count_name: str | None) -> dict:
    """The flat summary keys of a measurement record (W&B's summary, a search's objective)."""
    metric, L = record["metric"], record["length"]
    found = {f"{metric}@{L}": record["value"]}
    if count_name and record.get("count") is not None:
        found[f"{count_name}@{L}"] = record["count"]
    if record.get("low") is not None or record.get("high") is not None:
        found[f"{metric}_ci95_low@{L}"], found[f"{metric}_ci95_high@{L}"] = record.get("low"), record.get("high")
    return found


def by_metric(records: list[dict]) -> dict[str, dict[int, dict]]:
    """{metric: {length: record}} (the last record of a metric at a length wins: an eval may refine one)."""
    found: dict[str, dict[int, dict]] = {}
    for record in records or []:
        found.setdefault(record["metric"], {})[int(record["length"])] = record
    return found


def measured_value(record: dict | None) -> float | None:
    value = (record or {}).get("value")
    return (
        float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        else None
    )


def token_blocks(document: str, nll, positions, block: int) -> dict:
    """Units of a perplexity measurement: token NLLs (1-d tensor) at their document ``positions`` (1-d tensor of the
    same length) summed in blocks of ``block`` positions aligned on multiples of ``block``, so the same tokens get
    the same key at every length and in every run: ``{"<document>/<first position of the block>": (sum, tokens)}``."""
    import torch

    starts = (positions.long() // block) * block
    keys, inverse = torch.unique(starts, return_inverse=True)
    sums = torch.zeros(len(keys), dtype=torch.float64).index_add_(0, inverse, nll.double())
    counts = torch.zeros(len(keys), dtype=torch.float64).index_add_(
        0, inverse, torch.ones_like(nll, dtype=torch.float64)
    )
    return {f"{document}/{int(k)}": (float(t), float(n)) for k, t, n in zip(keys, sums, counts)}
