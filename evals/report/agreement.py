"""The agreement between metrics across strategies beyond the trained context: Spearman and Pearson correlations
(scipy) -- does perplexity rank strategies the way retrieval does?"""

from __future__ import annotations

from ..core.measure import by_metric, measured_value
from .load import job_info


def agreement(jobs: list[dict]) -> list[dict]:
    """Across finished jobs (same model, weights, data), at each length beyond the trained context: the
    Spearman and Pearson correlation between every two declared quality metrics measured there by at least
    three strategies. Does perplexity rank strategies the way retrieval does on this model?"""
    from scipy import stats

    found = []
    by_group: dict[tuple, list[dict]] = {}
    for job in jobs:
        if job["state"] == "done" and job.get("declared"):
            info = job_info(job)
            by_group.setdefault((info.get("model_label"), info.get("weights"), info.get("data")), []).append(job)
    for (model, _, data), members in by_group.items():
        merged: dict[str, dict[str, float]] = {}  # strategy -> metric@L -> value (a suite's evals merge)
        names: list[str] = []
        for job in members:
            declared = job["declared"]
            names += [m for m, d in declared.items() if d.get("verdict") or d.get("lower_is_better")]
            merged.setdefault(job_info(job).get("scaling"), {}).update(
                {
                    f"{name}@{L}": measured_value(r)
                    for name, by_length in by_metric(job.get("measurements") or []).items()
                    if name in declared
                    for L, r in by_length.items()
                    if measured_value(r) is not None
                }
            )
        trained = max((job_info(j).get("trained_context") or 0) for j in members)
        names = list(dict.fromkeys(names))
        lengths = sorted({int(k.split("@")[1]) for m in merged.values() for k in m if int(k.split("@")[1]) > trained})
        for L in lengths:
            present = [m for m in names if sum(f"{m}@{L}" in v for v in merged.values()) >= 3]
            for i, a in enumerate(present):
                for b in present[i + 1 :]:
                    pairs = [
                        (v[f"{a}@{L}"], v[f"{b}@{L}"]) for v in merged.values() if f"{a}@{L}" in v and f"{b}@{L}" in v
                    ]
                    xs, ys = zip(*pairs)
                    if len(pairs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
                        continue
                    spearman, pearson = stats.spearmanr(xs, ys), stats.pearsonr(xs, ys)
                    found.append(
                        {
                            "model": model,
                            "data": data,
                            "length": L,
                            "metrics": f"{a} vs {b}",
                            "jobs": len(pairs),
                            "spearman": float(spearman.statistic),
                            "spearman_p": float(spearman.pvalue),
                            "pearson": float(pearson.statistic),
                            "pearson_p": float(pearson.pvalue),
                        }
                    )
    return found
