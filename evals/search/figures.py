"""The search's figures: Optuna's own plots (matplotlib) of the study -- the objective by trial, parameter importances
(fANOVA, Hutter et al. 2014), parallel coordinates of the most important parameters and, for several objectives, the
Pareto front -- titled, on a log axis where the objective spans decades, infeasible trials named in the legend.
:mod:`evals.search.outputs` writes them into the sweep directory, its report and W&B."""

from __future__ import annotations

from .objective import constraint_values, feasible

FIGURES = ("search_history", "search_importance", "search_parallel", "search_pareto")


# Parameter importances (fANOVA over a random forest of the finished trials) and the parallel-coordinate plot ordered
# by them describe the sampler's first draws, not the parameters, below this many finished trials -- and below two
# per searched value
MIN_TRIALS_FOR_IMPORTANCE = 10


def importance_budget(search) -> int:
    return max(MIN_TRIALS_FOR_IMPORTANCE, 2 * sum(dim.size for dim in search.space))


def figures(search, study) -> dict:
    """Optuna's plots of the study (matplotlib): the history always; importances and the parallel coordinates from
    :func:`importance_budget` finished trials on (said in one line when fewer); a plot Optuna cannot draw is left
    out. Trials that miss the constraints are grey, with a legend entry saying so."""
    import matplotlib

    matplotlib.use("Agg")
    import optuna.visualization.matplotlib as plots

    objective = search.objectives[0]
    kwargs = {} if len(search.objectives) == 1 else {"target": lambda t: t.values[0], "target_name": objective.key}
    found = {}
    complete = sum(t.state.name == "COMPLETE" for t in study.trials)
    enough = complete >= importance_budget(search)
    draw = {"search_history": lambda: plots.plot_optimization_history(study, **kwargs)}
    if enough:
        draw["search_importance"] = lambda: plots.plot_param_importances(study, **kwargs)
    else:
        print(
            f"search: no importance or parallel-coordinate figure from {complete} finished trial(s): importances "
            f"(fANOVA) need at least {importance_budget(search)} ({MIN_TRIALS_FOR_IMPORTANCE}, and 2 per searched "
            f"value); below that they describe the sampler's first draws, not the parameters"
        )
    if len(search.objectives) > 1:  # the trade-off itself: every trial on the first two objectives, the front marked
        draw["search_pareto"] = lambda: plots.plot_pareto_front(
            study,
            targets=lambda t: t.values[:2],
            target_names=[o.key for o in search.objectives[:2]],
            constraints_func=constraint_values if search.constraints else None,
        )
    for name, plot in draw.items():
        try:
            found[name] = plot()
        except Exception as err:  # noqa: BLE001 -- e.g. importances need two finished trials
            print(f"search: no {name} figure ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})")
    try:
        if not enough:
            raise _NotDrawn
        import optuna

        important = list(
            optuna.importance.get_param_importances(study, **{k: v for k, v in kwargs.items() if k == "target"})
        )[:8]
        found["search_parallel"] = plots.plot_parallel_coordinate(study, params=important, **kwargs)
    except _NotDrawn:
        pass
    except Exception as err:  # noqa: BLE001
        print(
            f"search: no search_parallel figure ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
        )
    for name, axes in found.items():
        axes = axes.flat[0] if hasattr(axes, "flat") else axes
        retitle(axes, f"{name.removeprefix('search_')}: {search.strategy.name}, {objective.direction} {objective.key}")
        if name == "search_history":
            log_scale_if_wide(axes)
        if name == "search_parallel":  # long parameter names side by side: slanted, smaller, so they do not overlap
            for label in axes.get_xticklabels():
                label.set_rotation(25)
                label.set_horizontalalignment("right")
                label.set_fontsize("small")
            axes.figure.subplots_adjust(bottom=0.22, left=0.16)
        if search.constraints and any(t.state.name == "COMPLETE" and not feasible(t) for t in study.trials):
            legend_infeasible(axes)
        found[name] = axes.figure
    return found


class _NotDrawn(Exception):
    pass


def legend_infeasible(axes) -> None:
    """A legend entry for the grey points Optuna draws for trials that miss the constraints."""
    from matplotlib.lines import Line2D

    handles, labels = axes.get_legend_handles_labels()
    handles.append(Line2D([], [], marker="o", linestyle="", color="#cccccc", label="infeasible (misses a constraint)"))
    axes.legend(handles=handles, loc="best", fontsize="small")


def retitle(axes, title: str) -> None:
    """Our title in place of Optuna's, whichever slot it used (the importance plot titles on the left)."""
    for loc in ("left", "right"):
        axes.set_title("", loc=loc)
    axes.set_title(title)


def log_scale_if_wide(axes, span: float = 10.0) -> None:
    """A log objective axis when the values span more than ``span``x (a few bad perplexities would squeeze the
    trials that matter into the bottom of a linear axis)."""
    values = [y for c in axes.collections for y in c.get_offsets()[:, 1].tolist()]
    values += [y for line in axes.lines for y in line.get_ydata()]
    if values and min(values) > 0 and max(values) / min(values) > span:
        axes.set_yscale("log")
