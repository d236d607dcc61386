"""What a search found, in words: the terminal's lines (:func:`summary_lines`), the best against the setting it is
set against with the paired ratio and its 95% interval (:func:`gain_lines`), the W&B summary keys of that comparison
(:func:`comparison_summary`), and the pieces the sweep's report shares with them. They read ``search.json``
(:mod:`evals.search.outputs`)."""

from __future__ import annotations


def summary_lines(result: dict) -> list[str]:
    """What the search found, for the terminal: the best feasible trial, whether it and the setting it is set
    against (the published default, or the settings given) met the constraints, and the best's paired ratio to
    that setting with its 95% interval; or that no trial met the constraints and the closest one."""
    given = [g for g in result.get("given") or [] if g["trial"] not in {b["trial"] for b in result["best"]}]
    lines = []
    for best in result["best"]:
        lines.append(
            f"search: best: trial {best['trial']}, {shown_values(best['reported'])}{met(best, result)} "
            f"({shown_setting(best['scaling'])})"
        )
    if not result["best"] and result.get("closest"):
        closest = result["closest"]
        lines.append(
            f"search: no trial met the constraints ({'; '.join(result['constraints'])}); the closest: trial "
            f"{closest['trial']}, {shown_values(closest['reported'])} ({shown_setting(closest['scaling'])})"
        )
    elif not result["best"]:
        lines.append("search: no feasible finished trial")
    for g in given:
        lines.append(
            f"search: against {against_short(result, g['trial'])}, trial {g['trial']}: {shown_values(g['reported'])}"
            f"{met(g, result)} "
            f"({shown_setting(g['scaling'])})"
        )
    for best in result["best"]:
        if any(g["trial"] == best["trial"] for g in result.get("given") or []):
            lines.append(f"search: the best is trial {best['trial']}, {against_short(result, best['trial'])} itself")
    lines += [f"search: {line}" for line in gain_lines(result)]
    return lines


def gain_lines(result: dict) -> list[str]:
    """The best against each setting it is set against: ``trial 3 against the published default (trial 0): ppl@512
    x0.912 [0.88, 0.95] (95%, t over paired documents, n=3): better``."""
    lines = []
    names = {g["trial"]: against_short(result, g["trial"]) for g in result.get("given") or []}
    for best in result["best"]:
        for number, compared in (best.get("versus") or {}).items():
            for key, c in compared.items():
                interval = (
                    f" [{c['low']:.5g}, {c['high']:.5g}] (95%, {c['method']}, n={c['n']})"
                    if c.get("low") is not None and c.get("high") is not None
                    else " (no interval: too few units to pair)"
                )
                lines.append(
                    f"best (trial {best['trial']}) against {names.get(int(number), 'trial ' + number)} "
                    f"(trial {number}): {key} x{c['ratio']:.5g}{interval}: {reading(c)}"
                )
    return lines


def comparison_summary(result: dict) -> dict:
    """The W&B summary keys of the setting the best is set against and of the best's paired ratio to it."""
    found = {}
    for g in result.get("given") or []:
        prefix = "default" if g.get("role") == "default" else f"given{g['trial']}"
        found |= {f"{prefix}/{k}": v for k, v in (g.get("reported") or {}).items()}
        found |= {f"{prefix}/trial": g["trial"], f"{prefix}/feasible": g["feasible"]}
    for best in result["best"][:1]:
        for number, compared in (best.get("versus") or {}).items():
            other = next((g for g in result.get("given") or [] if str(g["trial"]) == number), {})
            prefix = "default" if other.get("role") == "default" else f"given{number}"
            for key, c in compared.items():
                found |= {f"best_vs_{prefix}/{key}/{part}": c.get(part) for part in ("ratio", "low", "high")}
    return found


def reading(c: dict) -> str:
    """What a paired ratio says: better or worse when its interval excludes 1, else not distinguishable."""
    if c.get("low") is None or c.get("high") is None:
        return "undecided"
    if c["low"] <= 1 <= c["high"]:
        return "not distinguishable at this sample"
    return "better" if (c["high"] < 1) != c["maximize"] else "worse"


def met(entry: dict, result: dict) -> str:
    if not result.get("constraints"):
        return ""
    return ", meets the constraints" if entry.get("feasible", True) else ", misses the constraints"


def against(entry: dict) -> str:
    if entry.get("role") == "default":
        return "against the published default"
    return "against a setting given (hydra.sweeper.enqueue)"


def against_short(result: dict, trial: int) -> str:
    entry = next((g for g in result.get("given") or [] if g["trial"] == trial), {})
    return "the published default" if entry.get("role") == "default" else "the given setting"


def shown_values(reported: dict | None) -> str:
    return ", ".join(f"{k} = {v:.5g}" for k, v in (reported or {}).items() if v is not None)


def shown_setting(scaling: dict) -> str:
    shown = {
        k: (f"{v:.4g}" if isinstance(v, float) else v)
        for k, v in scaling.items()
        if not isinstance(v, list) and v is not None
    }
    return ", ".join(f"{k}={v}" for k, v in shown.items())
