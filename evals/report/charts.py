"""Self-contained HTML pieces for the report: interactive length charts as inline SVG with a few lines of
script (no library, no network: the page opens offline), read as the paper figures are. A chart has

- a main panel, the metric by length: one line per run in its strategy's fixed colour, its 95% interval as a
  translucent band; the y-axis follows the data (or the metric's bounds, as 0-1 for an accuracy) -- logarithmic
  only where the metric asks for it and the values span more than a decade, else linear over the data with a
  margin -- with at least three labelled ticks (1-2-5 on a log axis where decades alone are too few);
- below it, where runs have an unscaled reference, a ratio panel: each value over the reference the verdict
  compares it with, on a linear axis around 1 with 1 and the verdict's limit dashed, so strategies within a
  percent of each other are told apart (points off its scale sit on its edge, drawn hollow).

Both mark the trained context and the target; clicking a legend entry hides or shows that run in both,
hovering a point shows its run, length, value and interval (or ratio)."""

from __future__ import annotations

import html
import json
import math

from ..core.plots import STYLES, length_label, strategy_colour

WIDTH, LEFT, RIGHT, TOP, BOTTOM, MAIN, GAP, RATIO = 880, 72, 16, 16, 40, 300, 16, 140

SCRIPT = """<script>
document.querySelectorAll('.chart .legend [data-series]').forEach(function (item) {
  item.addEventListener('click', function () {
    var chart = item.closest('.chart'), id = item.getAttribute('data-series');
    var hidden = item.classList.toggle('off');
    chart.querySelectorAll('svg [data-series="' + id + '"]').forEach(function (el) {
      el.style.display = hidden ? 'none' : '';
    });
  });
});
</script>"""

STYLE = """.chart{margin:8px 0 20px} .chart svg{max-width:100%;height:auto;background:#fff;border:1px solid #ddd}
.chart .legend{font-size:12px;margin:4px 0} .chart .legend span{cursor:pointer;margin-right:14px;white-space:nowrap}
.chart .legend span.off{opacity:.35;text-decoration:line-through} .chart .legend i{display:inline-block;width:18px;
height:3px;vertical-align:middle;margin-right:4px} .chart circle:hover{r:6}"""

DASHES = {"-": "", "--": "6,4", ":": "2,3", "-.": "6,3,2,3"}


def _scale(low: float, high: float, size: float, log: bool, flip: bool):
    """value -> pixel offset along an axis of ``size`` pixels spanning [low, high] (log: in log space)."""
    if log:
        low, high = math.log(low), math.log(high)
    span = (high - low) or 1.0

    def place(value: float) -> float:
        v = math.log(value) if log else value
        fraction = (v - low) / span  # 0 at low, 1 at high
        return size * (1 - fraction) if flip else size * fraction

    return place


def _padded(values: list[float], log: bool, least: float = 0.0) -> tuple[float, float]:
    """The data's range with a margin: 10% in log space on a log axis, 8% of the span on a linear one, which
    spans at least ``least`` (so that differences of a millionth do not fill a panel)."""
    low, high = min(values), max(values)
    if high - low < least:  # widened about its middle
        low, high = (low + high - least) / 2, (low + high + least) / 2
    if log:
        margin = (high / low) ** 0.1  # a tenth of the span, as a factor
        return low / margin, high * margin
    pad = (high - low) * 0.08 or abs(high) * 0.05 or 1.0
    return low - pad, high + pad


def _y_ticks(low: float, high: float, log: bool, least: int = 4) -> list[float]:
    """Round ticks inside [low, high], at least ``least`` of them where a round step allows: on a log axis
    decades, then 1-2-5, then 1..9 per decade; on a linear one the largest step of 1, 2 or 5 x 10^k giving enough."""
    if log:
        first = math.floor(math.log10(low))
        for mantissas in ((1,), (1, 2, 5), range(1, 10)):
            ticks = [
                m * 10.0**e
                for e in range(first, math.ceil(math.log10(high)) + 1)
                for m in mantissas
                if low <= m * 10.0**e <= high
            ]
            if len(ticks) >= min(least, 3):
                break
        return ticks
    exponent = math.floor(math.log10((high - low) or abs(high) or 1.0))
    for step in (m * 10.0**e for e in range(exponent + 1, exponent - 3, -1) for m in (5, 2, 1)):
        ticks = [round(k * step, 12) for k in range(math.ceil(low / step), math.floor(high / step) + 1)]
        if len(ticks) >= least:
            return ticks
    return ticks


def _panel(
    parts: list, top: float, height: float, y, ticks, log: bool, label: str, marks, x, lengths, inner_w, cls: str
) -> None:
    """A panel's frame, horizontal grid with labelled y ticks, the trained/target markers and its y label."""
    parts.append(
        f'<g class="{cls}" transform="translate(0,{top})">'
        f'<rect width="{inner_w}" height="{height}" fill="none" stroke="#ccc"/>'
    )
    step = min((b - a for a, b in zip(ticks, ticks[1:])), default=1.0)
    places = max(0, -math.floor(math.log10(step) + 1e-9))  # the decimals a linear step needs: 0.05 -> 2
    digits = (lambda t: f"{t:.6g}") if log else (lambda t: f"{t:.{places}f}")
    for tick in ticks:
        ty = y(tick)
        parts.append(
            f'<line x1="0" x2="{inner_w}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#eee"/>'
            f'<text class="ytick" x="-6" y="{ty + 4:.1f}" font-size="11" text-anchor="end">'
            f"{digits(tick)}</text>"
        )
    for L in lengths:
        parts.append(f'<line x1="{x(L):.1f}" x2="{x(L):.1f}" y1="0" y2="{height}" stroke="#f4f4f4"/>')
    for mark, dash, name in marks:
        parts.append(
            f'<line x1="{x(mark):.1f}" x2="{x(mark):.1f}" y1="0" y2="{height}" stroke="#555" '
            f'stroke-dasharray="{dash}"><title>{name} {mark}</title></line>'
        )
    parts.append(
        f'<text transform="translate(-58,{height / 2}) rotate(-90)" font-size="12" text-anchor="middle">'
        f"{html.escape(label)}</text>"
    )


def _line(parts: list, k: int, strategy: str, colour: str, dash: str, pts, x, y, low: float, high: float, tip) -> None:
    """One run's polyline and hoverable points; values off [low, high] sit on the edge, drawn hollow."""
    clamp = lambda v: min(max(v, low), high)  # onto the panel
    path = " ".join(f"{x(L):.1f},{y(clamp(v)):.1f}" for L, v, *_ in pts)
    parts.append(
        f'<g data-series="{k}" data-strategy="{html.escape(strategy)}"><polyline points="{path}" '
        f'fill="none" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}"/>'
    )
    for p in pts:
        fill = colour if low <= p[1] <= high else "#fff"
        parts.append(
            f'<circle cx="{x(p[0]):.1f}" cy="{y(clamp(p[1])):.1f}" r="4" fill="{fill}" stroke="{colour}">'
            f"<title>{html.escape(tip(p))}</title></circle>"
        )
    parts.append("</g>")


def _ratios(series: list[dict]) -> list[list[tuple]]:
    """Per series, [(length, value / reference, value, reference)]: over its own "reference" where the series
    carry one, else over the "none" series at the same length (none: no ratios)."""
    unscaled = next((s for s in series if s["strategy"] == "none"), None)
    fallback = {p[0]: p[1] for p in unscaled["points"] if p[1]} if unscaled else {}
    given = any("reference" in s for s in series)
    found = []
    for s in series:
        reference = (s.get("reference") or {}) if given else fallback
        found.append(
            sorted(
                (p[0], p[1] / reference[p[0]], p[1], reference[p[0]])
                for p in s["points"]
                if p[1] is not None and reference.get(p[0])
            )
        )
    return found


def length_chart(
    title: str,
    series: list[dict],
    *,
    ylabel: str,
    log: bool,
    trained: int | None,
    target: int | None,
    bounds=None,
    limit: float | None = None,
) -> str:
    """An interactive chart; ``series``: [{"label", "strategy", "points": [(length, value, low, high)],
    "reference": {length: unscaled value}}]. Without any "reference" key, the "none" series is the reference
    at each length; ``limit``, the verdict's limit on the ratio, is drawn when given."""
    from matplotlib.colors import to_hex

    points = [p for s in series for p in s["points"] if p[1] is not None]
    if not points:
        return ""
    marks = [(m, dash, name) for m, dash, name in ((trained, "5,4", "trained"), (target, "2,3", "target")) if m]
    lengths = sorted({p[0] for p in points} | {m[0] for m in marks})
    values = [p[1] for p in points] + [v for p in points for v in p[2:] if v is not None]
    use_log = log and not bounds and min(values) > 0 and max(values) > 10 * min(values)  # only over a decade
    low, high = (bounds[0], bounds[1]) if bounds else _padded(values, use_log)
    ratios = _ratios(series)
    # the ratio axis spans 1, the limit and the scaled runs' ratios: the reference's own (its value beyond the
    # trained context over its value at it) may fall off the scale rather than squash the runs it judges
    scaled = [r[1] for s, rs in zip(series, ratios) if s["strategy"] != "none" for r in rs]
    r_low, r_high = _padded(
        [1.0, *([limit] if limit else []), *(scaled or [r[1] for rs in ratios for r in rs])], False, least=0.02
    )
    inner_w, inner_h = WIDTH - LEFT - RIGHT, MAIN + (GAP + RATIO if any(ratios) else 0)
    x = _scale(lengths[0] / 1.15, lengths[-1] * 1.15, inner_w, True, False)
    y, ry = _scale(low, high, MAIN, use_log, True), _scale(r_low, r_high, RATIO, False, True)
    height = TOP + inner_h + BOTTOM
    parts = [
        f'<svg viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" '
        f'aria-label="{html.escape(title)}"><g transform="translate({LEFT},{TOP})">'
    ]
    banded = any(v is not None for p in points for v in p[2:])
    _panel(
        parts,
        0,
        MAIN,
        y,
        _y_ticks(low, high, use_log),
        use_log,
        ylabel + (" (band: 95% interval)" if banded else ""),
        marks,
        x,
        lengths,
        inner_w,
        "values",
    )
    seen: dict[str, int] = {}
    styles, legend = [], []
    for s in series:
        n = seen.get(s["strategy"], 0)
        seen[s["strategy"]] = n + 1
        styles.append((to_hex(strategy_colour(s["strategy"])), DASHES[STYLES[n % len(STYLES)]]))
        legend.append(
            f'<span data-series="{len(legend)}" title="click to hide or show"><i style="background:{styles[-1][0]}">'
            f"</i>{html.escape(s['label'])}</span>"
        )
    # the unscaled reference drawn last, on top: drawn first it vanished under the strategies that equal it
    order = sorted(range(len(series)), key=lambda k: series[k]["strategy"] == "none")
    for k in order:
        s, (colour, dash) = series[k], styles[k]
        pts = sorted((p for p in s["points"] if p[1] is not None), key=lambda p: p[0])
        within = [p for p in pts if p[2] is not None and p[3] is not None]
        if within:  # upper edge left to right, lower edge back: one polygon
            edge = [(p[0], p[3]) for p in within] + [(p[0], p[2]) for p in reversed(within)]
            outline = " ".join(f"{x(L):.1f},{y(min(max(v, low), high)):.1f}" for L, v in edge)
            parts.append(
                f'<polygon class="band" data-series="{k}" points="{outline}" fill="{colour}" '
                f'fill-opacity="0.15" stroke="none"/>'
            )
        _line(
            parts,
            k,
            s["strategy"],
            colour,
            dash,
            pts,
            x,
            y,
            low,
            high,
            lambda p, s=s: (
                f"{s['label']}: {p[1]:.4g}"
                + (f" [{p[2]:.4g}, {p[3]:.4g}]" if p[2] is not None and p[3] is not None else "")
                + f" at {p[0]} tokens"
            ),
        )
    parts.append("</g>")
    if any(ratios):
        _panel(
            parts,
            MAIN + GAP,
            RATIO,
            ry,
            _y_ticks(r_low, r_high, False, least=3),
            False,
            "÷ unscaled",
            marks,
            x,
            lengths,
            inner_w,
            "ratio",
        )
        for level, colour, name in [(1.0, "#555", "1: the unscaled value")] + (
            [(limit, "#c00", f"verdict limit {limit:g}")] if limit else []
        ):
            parts.append(
                f'<line class="level" x1="0" x2="{inner_w}" y1="{ry(level):.1f}" y2="{ry(level):.1f}" '
                f'stroke="{colour}" stroke-dasharray="6,4"><title>{name}</title></line>'
            )
        for k in order:
            s, rs, (colour, dash) = series[k], ratios[k], styles[k]
            if rs:
                _line(
                    parts,
                    k,
                    s["strategy"],
                    colour,
                    dash,
                    rs,
                    x,
                    ry,
                    r_low,
                    r_high,
                    lambda p, s=s: f"{s['label']}: {p[1]:.4g} x unscaled ({p[2]:.4g} / {p[3]:.4g}) at {p[0]} tokens",
                )
        parts.append("</g>")
    for L in lengths:
        parts.append(
            f'<text x="{x(L):.1f}" y="{inner_h + 16}" font-size="11" text-anchor="middle">{length_label(L)}</text>'
        )
    parts.append(
        f'<text x="{inner_w / 2}" y="{inner_h + 34}" font-size="12" text-anchor="middle">'
        f"context length (tokens)</text></g></svg>"
    )
    return (
        f'<div class="chart" data-title={json.dumps(title)}><div><b>{html.escape(title)}</b></div>'
        f'<div class="legend">{"".join(legend)}</div>{"".join(parts)}</div>'
    )
