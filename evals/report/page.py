"""Self-contained HTML pieces for the report: interactive length charts as inline SVG with a few lines of
script (no library, no network: the page opens offline). Each chart draws one metric by length, one line per
run in its strategy's fixed colour; clicking a legend entry hides or shows that run, hovering a point shows
its run, length, value and interval, and the trained context and target length are marked."""

from __future__ import annotations

import html
import json
import math

from matplotlib.colors import to_hex

from ..core.plots import STYLES, length_label, strategy_colour

WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 880, 340, 64, 16, 16, 40

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
    if log:
        low, high = math.log(low), math.log(high)
    span = (high - low) or 1.0

    def place(value: float) -> float:
        v = math.log(value) if log else value
        fraction = (v - low) / span
        return size * (1 - fraction) if flip else size * fraction

    return place


def length_chart(title: str, series: list[dict], *, ylabel: str, log: bool, trained: int | None, target: int | None,
                 bounds=None) -> str:
    """An interactive chart; ``series``: [{"label", "strategy", "points": [(length, value, low, high)]}]."""
    points = [p for s in series for p in s["points"] if p[1] is not None]
    if not points:
        return ""
    lengths = sorted({p[0] for p in points} | ({trained} if trained else set()) | ({target} if target else set()))
    values = [p[1] for p in points] + [v for p in points for v in p[2:] if v is not None]
    low, high = (bounds[0], bounds[1]) if bounds else (min(values), max(values))
    use_log = log and low > 0 and high > 2 * low
    if not bounds:
        pad = (high - low) * 0.08 or abs(high) * 0.05 or 1.0
        low, high = (low / 1.1, high * 1.1) if use_log else (low - pad, high + pad)
    inner_w, inner_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    x = _scale(lengths[0] / 1.15, lengths[-1] * 1.15, inner_w, True, False)
    y = _scale(low, high, inner_h, use_log, True)
    parts = [f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{html.escape(title)}">',
             f'<g transform="translate({LEFT},{TOP})">',
             f'<rect width="{inner_w}" height="{inner_h}" fill="none" stroke="#ccc"/>']
    for tick in _y_ticks(low, high, use_log):
        ty = y(tick)
        parts.append(f'<line x1="0" x2="{inner_w}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#eee"/>'
                     f'<text x="-6" y="{ty + 4:.1f}" font-size="11" text-anchor="end">{tick:g}</text>')
    for L in lengths:
        parts.append(f'<text x="{x(L):.1f}" y="{inner_h + 16}" font-size="11" text-anchor="middle">{length_label(L)}</text>')
    for mark, dash, name in ((trained, "5,4", "trained"), (target, "2,3", "target")):
        if mark:
            parts.append(f'<line x1="{x(mark):.1f}" x2="{x(mark):.1f}" y1="0" y2="{inner_h}" stroke="#555" '
                         f'stroke-dasharray="{dash}"><title>{name} {mark}</title></line>')
    seen: dict[str, int] = {}
    legend = []
    for k, s in enumerate(series):
        n = seen.get(s["strategy"], 0)
        seen[s["strategy"]] = n + 1
        colour, dash = to_hex(strategy_colour(s["strategy"])), DASHES[STYLES[n % len(STYLES)]]
        pts = sorted((p for p in s["points"] if p[1] is not None), key=lambda p: p[0])
        path = " ".join(f"{x(p[0]):.1f},{y(min(max(p[1], low), high)):.1f}" for p in pts)
        parts.append(f'<g data-series="{k}"><polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2" '
                     f'stroke-dasharray="{dash}"/>')
        for L, value, lo, hi in pts:
            interval = f" [{lo:.4g}, {hi:.4g}]" if lo is not None and hi is not None else ""
            tip = html.escape(f"{s['label']}: {value:.4g}{interval} at {L} tokens")
            parts.append(f'<circle cx="{x(L):.1f}" cy="{y(min(max(value, low), high)):.1f}" r="4" fill="{colour}">'
                         f'<title>{tip}</title></circle>')
        parts.append("</g>")
        legend.append(f'<span data-series="{k}" title="click to hide or show"><i style="background:{colour}"></i>'
                      f'{html.escape(s["label"])}</span>')
    parts.append(f'<text x="{inner_w / 2}" y="{inner_h + 34}" font-size="12" text-anchor="middle">context length (tokens)</text>')
    parts.append(f'<text transform="translate(-50,{inner_h / 2}) rotate(-90)" font-size="12" text-anchor="middle">'
                 f'{html.escape(ylabel)}</text></g></svg>')
    return (f'<div class="chart" data-title={json.dumps(title)}><div><b>{html.escape(title)}</b></div>'
            f'<div class="legend">{"".join(legend)}</div>{"".join(parts)}</div>')


def _y_ticks(low: float, high: float, log: bool) -> list[float]:
    if log:
        ticks = []
        decade = 10 ** math.floor(math.log10(low))
        while decade <= high:
            ticks += [m * decade for m in (1, 2, 5) if low <= m * decade <= high]
            decade *= 10
        return ticks
    step = 10 ** math.floor(math.log10((high - low) / 4 or 1))
    for m in (1, 2, 5, 10):
        if (high - low) / (m * step) <= 6:
            step *= m
            break
    first = math.ceil(low / step) * step
    return [round(first + i * step, 10) for i in range(int((high - first) / step) + 1)]
