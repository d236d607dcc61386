"""A position-effect check for comparisons past the trained context T (2x, 4x): does the text itself get harder or
easier along the document, so that the strategy's own-only blocks (past T, which the reference never sees) differ
from the shared ones for a reason that is not the strategy?

Within one text a block's difficulty and its position cannot be told apart (docs/verdict.md: the one-document and
the several-document intervals assume stationary text difficulty), so a shift that starts exactly at T is invisible
to every method; a drift that is already under way within T is not. Here the unscaled model's own NLL on each
document's blocks up to T (the shared segment) is regressed on position (weighted least squares, one slope per
document), the slope is carried to the own-only blocks -- their mean position against the shared blocks' -- and
weighted as those blocks weigh in the strategy's mean: the bias that drift would put on the log ratio. Its interval
is the verdict's own (:func:`evals.core.stats.cluster_interval` over the documents' biases, or :func:`evals.core.stats.hac_interval`
on one document's block influences). The check warns when that interval lies wholly beyond ``FRACTION`` of
the tolerance's log (either way); the verdict is left as it is. Calibrated in tests/test_calibration.py.
"""

from __future__ import annotations

import math

FRACTION = 0.1  # warn when the drift would move the comparison by more than a tenth of log(1 + tolerance)
LEVEL = 0.98  # the drift is "shown" when its 98% interval lies wholly beyond the threshold


def _blocks(units: dict) -> dict:
    """{document: [(position, sum, weight)]} of block units keyed ``"<document>/<first position>"``."""
    found: dict = {}
    for key, (total, weight) in units.items():
        if "/" not in key or not weight:
            continue
        doc, at = key.rsplit("/", 1)
        try:
            found.setdefault(doc, []).append((float(at), float(total), float(weight)))
        except ValueError:
            return {}
    return found


def _document(shared: list, own_only: list, strategy_weight: float):
    """One document: (bias on the log ratio, each shared block's influence on it in position order, own-only tokens),
    or None."""
    import numpy as np

    if len(shared) < 3 or not own_only:
        return None
    shared, own_only = sorted(shared), sorted(own_only)
    at, total, weight = (np.array(c) for c in zip(*shared))
    x = at + weight / 2  # block centres
    y = total / weight  # the block's mean NLL
    xbar, ybar = np.average(x, weights=weight), np.average(y, weights=weight)
    sxx = float((weight * (x - xbar) ** 2).sum())
    if sxx <= 0:
        return None
    slope = float((weight * (x - xbar) * (y - ybar)).sum()) / sxx  # weighted least squares
    o_at, _, o_weight = (np.array(c) for c in zip(*own_only))
    centre = float(np.average(o_at + o_weight / 2, weights=o_weight))
    scale = float(o_weight.sum()) / strategy_weight * (centre - xbar)  # own share x distance between the segments
    # the slope's influence per block: w (x - xbar) (OLS residual) / Sxx
    residual = y - ybar - slope * (x - xbar)
    return scale * slope, scale * weight * (x - xbar) * residual / sxx, float(o_weight.sum())


def position_drift(own: dict, ref: dict, tolerance: float, length: int, trained: int) -> dict | None:
    """The position check of one NLL metric at ``length`` (> ``trained``): ``own`` the strategy's units there,
    ``ref`` the reference's at T ({"<document>/<position>": (sum, tokens)}). Returns ``{"bias", "low", "high",
    "documents", "warn", "note"}`` (the bias on the log ratio and its interval; ``documents`` those whose own drift
    exceeds the threshold in the same direction) or None when there is nothing to check."""
    import numpy as np

    from ..stats import cluster_interval, hac_interval

    a, b = _blocks(own), _blocks(ref)
    docs = sorted(set(a) & set(b))
    strategy_weight = sum(w for d in docs for _, _, w in a[d])
    found = {}
    for doc in docs:
        positions = {p for p, _, _ in b[doc]}
        result = _document(b[doc], [blk for blk in a[doc] if blk[0] not in positions], strategy_weight)
        if result is not None:
            found[doc] = result
    if not found:
        return None
    names = sorted(found)
    biases = np.array([found[d][0] for d in names])
    bias = float(biases.sum())
    if len(names) >= 2:
        # bias = (W_own / W_a) sum_j h_j d_j: a weighted mean of the documents' shifts d_j (own-only text against
        # shared, from the drift), h_j each one's share of the own-only tokens; its interval the verdict's own
        own_weight = np.array([found[d][2] for d in names])
        factor = float(own_weight.sum()) / strategy_weight
        share = own_weight / own_weight.sum()
        shift = biases / (own_weight / strategy_weight)
        mean = float((share * shift).sum())
        low, high, _, _ = cluster_interval(share * (shift - mean), share, np.array([mean]), LEVEL)
        low, high = factor * float(low[0]), factor * float(high[0])
        alone = dict(zip(names, factor * shift))  # each document's bias were every document like it
    else:
        doc = names[0]
        low, high, _, _ = hac_interval(found[doc][1], np.array([bias]), LEVEL)
        low, high = float(low[0]), float(high[0])
        alone = {doc: bias}
    threshold = FRACTION * math.log(1 + tolerance)
    warn = low > threshold or high < -threshold  # the data show a drift that large
    sign = 1 if bias > 0 else -1
    documents = [d for d in names if sign * alone[d] > threshold]
    note = None
    if warn:
        listed = ", ".join(documents[:5]) + (f" and {len(documents) - 5} more" if len(documents) > 5 else "")
        note = (
            f"position effect at {length}: the unscaled model's NLL drifts with position within {trained} "
            f"({'harder' if bias > 0 else 'easier'} text further in; {listed or 'over all documents together'}); "
            f"carried past {trained} it would move the ratio by x{math.exp(bias):.3f} "
            f"[{math.exp(low):.3f}, {math.exp(high):.3f}], more than {FRACTION:g} of the tolerance's x{1 + tolerance:g}: "
            f"the verdict assumes stationary text (docs/verdict.md) and may read the text's drift as the strategy's"
        )
    return {
        "bias": bias,
        "low": low,
        "high": high,
        "documents": documents,
        "warn": warn,
        "note": note,
    }
