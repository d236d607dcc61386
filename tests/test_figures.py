"""The figures checked for legibility as drawn: matplotlib's renderer gives every text's window extent, and no two
visible texts of different axes (tick labels, axis labels, titles, legend texts, cell annotations) overlap, none runs
into another panel or off the figure; in a length figure the unscaled reference is drawn on top of the strategies in
a style of its own (before, the passkey heatmaps' axis labels ran into the neighbouring panels and the perplexity
figure's unscaled line lay under the others)."""

import itertools

import pytest

from evals.core.decision.answer_figures import metric_figure
from evals.core.plots import Curve, heatmap, matrix_heatmaps, task_heatmap
from evals.tasks.retrieval.eval import report_figures


def _drawn_ticks(axis, coordinate: int) -> list:
    """The tick labels drawn: those within the view (matplotlib keeps labels of ticks beyond it, not drawn)."""
    low, high = sorted(axis.get_view_interval())
    slack = (high - low) * 1e-9
    return [t for t in axis.get_ticklabels() if low - slack <= t.get_position()[coordinate] <= high + slack]


def _texts(fig, renderer) -> list[tuple]:
    """(axes or None for the figure's own, text, window extent) of every visible, non-empty text drawn."""
    found = []
    for ax in fig.axes:
        texts = [*_drawn_ticks(ax.xaxis, 0), *_drawn_ticks(ax.yaxis, 1), ax.xaxis.label, ax.yaxis.label, *ax.texts]
        texts += [ax.title, ax._left_title, ax._right_title]  # set_title(loc=...) writes one of the three
        if ax.get_legend() is not None:
            texts += ax.get_legend().get_texts()
        found += [(ax, t, t.get_window_extent(renderer)) for t in texts if t.get_visible() and t.get_text().strip()]
    found += [(None, t, t.get_window_extent(renderer)) for t in fig.texts if t.get_visible() and t.get_text().strip()]
    return found


def assert_legible(fig) -> None:
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = _texts(fig, renderer)
    assert texts
    clashes = [
        (a.get_text(), b.get_text())
        for (ax_a, a, box_a), (ax_b, b, box_b) in itertools.combinations(texts, 2)
        if ax_a is not ax_b and box_a.overlaps(box_b)
    ]
    into = [
        (t.get_text(), other.get_label() or "a panel")
        for ax, t, box in texts
        for other in fig.axes
        if other is not ax and box.overlaps(other.get_window_extent(renderer))
    ]
    frame = fig.bbox.padded(1)
    outside = [
        t.get_text() for _, t, box in texts if not frame.contains(box.x0, box.y0) or not frame.contains(box.x1, box.y1)
    ]
    assert (clashes, into, outside) == ([], [], []), "texts overlap, run into another panel or off the figure"


def _cells(lengths, depths, accuracy):
    return [
        {"length": L, "depth": d, "accuracy": accuracy(i, j), "trials": 5}
        for i, L in enumerate(lengths)
        for j, d in enumerate(depths)
    ]


@pytest.mark.parametrize("runs", [1, 2, 4])
def test_the_passkey_heatmaps_of_a_report_are_legible(runs):
    lengths, depths = [1024, 2048, 4096, 8192], [0.1, 0.5, 0.9]
    jobs = [
        {
            "metrics": {"passkey": {"cells": _cells(lengths, depths, lambda i, j: 1.0 if i <= k else 0.2 * j)}},
            "job": {"trained_context": 2048},
            "label": f"{strategy} ×2 on SmolLM2-135M-Instruct (books, prefix)",
        }
        for k, strategy in enumerate(["none", "yarn", "linear", "ntk"][:runs])
    ]
    (fig,) = report_figures("passkey", jobs, lambda job: job["label"]).values()
    assert_legible(fig)


def test_a_narrow_heatmap_and_the_other_heatmaps_are_legible():
    assert_legible(heatmap([[1.0, 0.5]] * 3, [512, 1024], [0.1, 0.5, 0.9], title="needle: yarn ×2", trained=512))
    assert_legible(
        task_heatmap([[90.0, 80.0, 40.0]] * 12, [1024, 2048, 4096], [f"task_{i}" for i in range(11)] + ["average"],
                     title="RULER: yarn ×2 on SmolLM2-135M", trained=2048, samples=5)
    )  # fmt: skip
    assert_legible(
        matrix_heatmaps(
            [("layer 0: q·k by rotary pair", [[1.0, -2.0], [3.0, -1.0]]), ("layer 1", [[1.0, 2.0], [3.0, 4.0]])],
            xlabel="rotary pair",
            ylabel="head",
            suptitle="q/k study",
        )
    )


def test_the_perplexity_figure_draws_the_unscaled_line_on_top_in_its_own_style():
    """Up to the trained context every strategy equals the unscaled model: drawn first, at the same zorder, its line
    was covered by theirs. It is drawn above every other line and band, dashed with hollow markers, and legible."""
    lengths, trained = [1024, 2048, 4096, 8192], 2048
    strategies = ["none", "linear", "yarn", "ntk"]
    curves = [
        Curve(
            f"{name} ×2",
            name,
            [{"length": L, "value": 10.0 + k * (L > trained), "ci95_low": 9.0, "ci95_high": 12.0 + k} for L in lengths],
            {L: 10.0 for L in lengths},
        )
        for k, name in enumerate(strategies)
    ]
    metric = {"label": "perplexity", "lower_is_better": True, "verdict": True, "interval": True, "log": True}
    fig = metric_figure(
        metric,
        curves,
        trained=trained,
        target=8192,
        criteria={"tolerance": 0.1, "retained": 0.85},
        title="perplexity by length: SmolLM2-135M\nbooks | prefix | 4 runs",
    )
    assert_legible(fig)
    main, ratio = fig.axes[:2]
    for ax in (main, ratio):
        curve_lines = [line for line in ax.get_lines() if len(line.get_xdata()) == len(lengths)]
        assert len(curve_lines) == len(strategies)
        unscaled = curve_lines[0]  # the curves in their order, "none" first
        assert unscaled.get_color() == "black"
        others = [a for a in (*ax.lines, *ax.collections, *ax.patches) if a is not unscaled]
        assert all(unscaled.get_zorder() > a.get_zorder() for a in others), [
            (a, a.get_zorder()) for a in others if a.get_zorder() >= unscaled.get_zorder()
        ]
        for line in curve_lines[1:]:  # told apart from every strategy by its style, not its colour alone
            assert (unscaled.get_linestyle(), unscaled.get_markerfacecolor()) != (
                line.get_linestyle(),
                line.get_markerfacecolor(),
            )
    assert main.get_legend().get_zorder() > main.get_lines()[0].get_zorder()  # the legend stays readable


def test_the_report_chart_draws_the_unscaled_line_last():
    """The report's SVG chart paints in document order: the unscaled series comes after the strategies' (on top),
    in both panels, while the legend keeps the runs' order."""
    from evals.report.charts import length_chart

    series = [
        {"label": f"{name} ×2", "strategy": name, "points": [(L, 10.0, None, None) for L in (1024, 2048)]}
        for name in ("none", "yarn", "linear")
    ]
    chart = length_chart("perplexity", series, ylabel="perplexity", log=False, trained=1024, target=2048, limit=1.1)
    drawn = [chart[i:].split('"', 2)[1] for i in range(len(chart)) if chart.startswith('data-strategy="', i)]
    assert drawn == ["yarn", "linear", "none", "yarn", "linear", "none"]
    legend = chart.split('class="legend"')[1].split("<svg")[0]
    assert [legend.index(f"{name} ×2") for name in ("none", "yarn", "linear")] == sorted(
        legend.index(f"{name} ×2") for name in ("none", "yarn", "linear")
    )
