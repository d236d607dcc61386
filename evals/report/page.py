"""The report as one self-contained HTML page (opens offline): its CSS, its tables with cells coloured by verdict,
and the page around the sections, the interactive charts (charts.py) and the embedded figures."""

from __future__ import annotations

import base64
import html

from .charts import SCRIPT as CHART_SCRIPT
from .charts import STYLE as CHART_STYLE
from .tables import format_cell


STYLE = (
    """.answer{font-size:15px;background:#eef6ee;border-left:4px solid #2a7a2a;padding:6px 10px} body{font-family:system-ui,sans-serif;margin:20px auto;max-width:1360px;padding:0 12px;color:#222}
.scroll{overflow-x:auto;max-width:100%;margin:8px 0 20px} table{border-collapse:collapse;font-size:12px}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:right;white-space:nowrap} th{background:#f0f0f0;position:sticky;top:0}
td:first-child,th:first-child{position:sticky;left:0;background:#fafafa;text-align:left}
tr.failed td,tr.dead td,tr.interrupted td,tr.unreadable td{background:#fde2e2} tr.running td{background:#fff6d6}
td.yes{background:#dff3df;color:#14601a;font-weight:600} td.no{background:#fbdcdc;color:#9b1c1c;font-weight:600}
td.unknown{background:#eee;color:#666} td.inconclusive{background:#fff1cc;color:#7a5a00} img{max-width:100%;border:1px solid #ddd;margin:6px 0 18px} h2{margin-top:28px}
.note{color:#555;font-size:13px;max-width:1100px} .warn{background:#fff4e5;border:1px solid #f0b070;padding:8px 12px;
font-size:13px} .warn li{margin:3px 0}"""
    + CHART_STYLE
)


def html_table(rows: list[dict], columns: list[str], cls: str = "") -> str:
    """``rows`` as a scrollable HTML table; a row's class is its job state, a cell's its verdict."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        f'<tr class="{html.escape(str(r.get("state", "done")))}">'
        + "".join(f'<td class="{_cell_class(r.get(c))}">{html.escape(format_cell(r.get(c)))}</td>' for c in columns)
        + "</tr>"
        for r in rows
    )
    return f'<div class="scroll"><table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _cell_class(value) -> str:
    """The CSS class of a verdict cell (yes, no, unknown, inconclusive); none for other values."""
    return (
        {
            "yes": "yes",
            "NO": "no",
            "?": "unknown",
            "not judged": "unknown",
            "inconclusive": "inconclusive",
            "recommended": "yes",
        }.get(value, "")
        if isinstance(value, str)
        else ""
    )


def render_page(
    title: str, sections: list[str], charts: list[str], rows: list[dict], columns: list[str], images: dict[str, bytes]
) -> str:
    """The whole page: the title, the sections' HTML, the interactive charts, the job table and the figures
    (PNG embedded), with the charts' script."""
    page = [
        f'<!doctype html><html><head><meta charset=utf-8><meta name=viewport content="width=device-width">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
        f"<p class=note>{len(rows)} jobs; one row per job identity; lengths in order.</p>",
        *sections,
    ]
    if charts:
        page += ["<h2>By length (interactive: click a legend entry to hide or show a run, hover a point)</h2>", *charts]
    page += ["<h2>Jobs</h2>", html_table(rows, columns, "jobs"), "<h2>Figures</h2>"]
    page += [
        f'<figure><img alt="{n}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'
        f"<figcaption>{n} (report_{n}.svg beside this page)</figcaption></figure>"
        for n, data in images.items()
    ]
    return "\n".join(page) + CHART_SCRIPT + "</body></html>\n"
