"""The paired ratio of one metric, strategy / unscaled, on the units both runs share, with its 95% interval
(:mod:`evals.core.stats`, calibrated by simulation in tests/test_calibration.py): for NLL metrics exp of the paired
mean NLL difference -- over several documents a Hall-corrected t on the token-weighted per-document influences
(CR2 variance, Bell-McCaffrey degrees of freedom), within one document a long-run-variance interval over its blocks
in order (fixed-b HAC; from the shared segment where a side holds blocks the other lacks); for scores in a
bounded range Tang's score interval for a ratio of paired proportions. Only units that are the same are paired (:func:`same_units`); the rule that judges the ratio is :mod:`evals.core.decision.verdict`.
"""

from __future__ import annotations

import math

from ..measure import measured_value


def paired_ratio(metric: dict, own: dict, ref: dict, itself: bool = False) -> dict:
    """The paired ratio own / reference of one metric with its 95% interval and what it rests on:
    ``{"ratio", "low", "high", "n", "method", "shared", "clustered"}`` (low/high None: no interval), and
    ``documents`` (the clusters both hold; other documents are left out, never pooled), ``min_units`` (the fewest
    units the method decides on, tests/test_calibration.py), ``lever`` ("documents", "prompts" or "units": what
    more of would narrow it; None: nothing at this length), ``refused`` (why nothing is compared) and, for the
    "more units" estimate, ``critical`` (a function of the unit count). ``itself``: an unscaled job judged
    against its own run (the ratio is 1 by definition: the reference)."""
    from ..stats import (
        MIN_PROMPTS,
        paired_log_ratio,
        paired_proportion_ratio,
        shared_clusters,
        units_mean,
    )

    a, b = units_of(own), units_of(ref)
    shared = len(set(a) & set(b))
    found = {
        "ratio": None,
        "low": None,
        "high": None,
        "n": min(len(a), len(b)),
        "method": None,
        "shared": shared,
        "clustered": False,
        "documents": None,
        "min_units": None,
        "lever": None,
        "refused": None,
    }
    value, reference = measured_value(own), measured_value(ref)
    if metric.get("nll") and a and b:
        found["ratio"] = math.exp(units_mean(a) - units_mean(b))  # the perplexity ratio: exp of the mean NLL difference
    elif value is not None and reference:
        found["ratio"] = value / reference
    if itself:
        found.update(ratio=1.0, low=1.0, high=1.0, n=len(a), method="the reference itself", reference=True)
        return found
    if metric.get("nll") and a and a == b:  # the same units with the same NLLs: exactly 1
        found.update(ratio=1.0, low=1.0, high=1.0, n=len(a), method="identical units")
        return found
    if a and b and not shared_clusters(a, b)[2]:
        found.update(shared=0, refused="no document (or unit) in common with the reference: not compared")
        return found
    unit = (own or {}).get("unit") or metric.get("unit") or "unit"
    bounds = metric.get("bounds")
    if bounds and not metric.get("lower_is_better"):
        lo, hi = bounds
        scale = lambda u: {k: ((t / w - lo) / (hi - lo), 1.0) for k, (t, w) in u.items() if w}  # noqa: E731
        low, high, table = paired_proportion_ratio(scale(a), scale(b)) if a and b else (None, None, None)
        pairs = int(round(table["n"])) if table else 0
        if table and pairs and table["x11"] + table["x21"] > 0:
            found["ratio"] = (table["x11"] + table["x12"]) / (table["x11"] + table["x21"])  # on the paired units
        found.update(low=low, high=high, method="Tang score interval", n=pairs, min_units=MIN_PROMPTS)
        found.update(lever=f"{unit}s", critical=None)
        return found
    interval = paired_log_ratio(a, b, log=not metric.get("nll")) if a and b else None
    if interval:
        found.update(
            ratio=math.exp(interval["estimate"]),
            low=math.exp(interval["low"]),
            high=math.exp(interval["high"]),
            n=interval["n"],
            clustered=interval["clustered"],
            documents=interval["documents"],
            min_units=interval["min_units"],
        )
        if interval["clustered"]:
            whole = all("/" in k for k in a)  # blocks of documents, or units that are their own clusters
            what = "documents" if whole else f"{unit}s"
            found.update(
                method=f"Hall-corrected t over paired {what} (CR2 variance, Bell-McCaffrey df)",
                lever=what,
                critical=interval["critical"],
                df=interval["df"],
                effective=interval["effective"],
                se=interval["se"],
            )
        else:
            found.update(method=interval["description"], lever=None)
    return found


def _log(x):
    import numpy as np

    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(x)


def units_of(record: dict) -> dict:
    return {k: (float(v[0]), float(v[1])) for k, v in ((record or {}).get("units") or {}).items()}


def same_units(own: dict, ref: dict) -> bool:
    """Whether two measurements at one length rest on the same units with the same weights (the same tokens,
    prompts, samples): a partial run (out of memory after some documents), other documents or another block size
    is not the same test."""
    a, b = units_of(own), units_of(ref)
    return set(a) == set(b) and all(math.isclose(a[k][1], b[k][1], rel_tol=1e-6) for k in a)
