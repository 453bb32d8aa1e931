"""HTML building blocks of the report: escaping, tables, the project's Markdown reports as HTML.

Every value that reaches the page goes through :func:`esc` (text and attribute values) or :func:`src`
(file names as URLs): run directories are data, never markup.
"""

from __future__ import annotations

import html
import re
from typing import Any, Optional, Sequence
from urllib.parse import quote

import pandas as pd

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1180px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em} h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;font-size:.85em;margin:.6em 0} th,td{border:1px solid #ddd;padding:3px 7px;text-align:right}
th{background:#f4f4f4} td:first-child,th:first-child{text-align:left}
.bad{background:#fbe3e4} .good{background:#e6f4e6} .note{background:#fff6d6;padding:.6em;border-left:4px solid #e0b000}
.warn{background:#fff6d6}
figure{margin:1em 0} img{max-width:100%} video{max-width:100%;border:1px solid #ccc}
.meta td{text-align:left} .meta table{margin:0} .small{font-size:.85em;color:#555} td{white-space:nowrap}
.scroll{overflow-x:auto;max-width:100%} details{margin:.8em 0} summary{cursor:pointer;font-weight:600}
.lead{border:1px solid #ddd;border-radius:6px;padding:.2em 1em 1em;background:#fcfcfc}
.lead h2{margin-top:.8em;border:none} .badge{padding:1px 6px;border-radius:4px;white-space:nowrap}
.verdicts td{text-align:left;white-space:normal;vertical-align:top}
"""


def esc(value: Any) -> str:
    """Text or an attribute value, HTML-escaped (quotes included)."""
    return html.escape(str(value), quote=True)


def src(name: str) -> str:
    """A file name as a src/href value: percent-encoded as a URL path, then HTML-escaped."""
    return esc(quote(name))


def num(value: Optional[float], spec: str = "+.3f") -> str:
    """A number in ``spec``'s format, or ``-`` when missing."""
    return "-" if value is None else format(value, spec)


def ci(interval: Optional[Sequence[float]]) -> str:
    """An interval as ``[lo, hi]`` with signs, or ``-``."""
    return "-" if interval is None else f"[{interval[0]:+.3f}, {interval[1]:+.3f}]"


def html_table(header: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "") -> str:
    """A table whose cells are values or (value, css class) pairs; every value is escaped."""
    def cell(value: Any) -> str:
        text, css = value if isinstance(value, tuple) else (value, "")
        text = "-" if text is None else text
        return f"<td class='{esc(css)}'>{esc(text)}</td>" if css else f"<td>{esc(text)}</td>"

    head = "<tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>"
    body = "".join("<tr>" + "".join(cell(v) for v in row) + "</tr>" for row in rows)
    return f"<table class='{esc(cls)}'>{head}{body}</table>"


def frame_table(df: pd.DataFrame, cls: str = "") -> str:
    """A data frame as an HTML table (values escaped, floats to 3 decimals)."""
    return df.to_html(index=False, border=0, classes=cls, na_rep="-", float_format=lambda v: f"{v:.3f}", escape=True)


def identity_html(value: Any) -> str:
    """A manifest value (policy identity, renderer, versions) as readable, escaped HTML: dicts as nested tables."""
    if isinstance(value, dict):
        if not value:
            return "-"
        return "<table class='meta'>" + "".join(
            f"<tr><th>{esc(k)}</th><td>{identity_html(v)}</td></tr>" for k, v in value.items()) + "</table>"
    if isinstance(value, list):
        simple = all(not isinstance(v, (dict, list)) for v in value)
        return esc(", ".join(map(str, value))) if simple else "<br>".join(identity_html(v) for v in value)
    return "-" if value is None else esc(value)


def markdown_html(md: str) -> str:
    """Render the project's own Markdown reports (tables, bullets, bold) as HTML."""
    out, in_table, in_list = [], False, False
    for line in md.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if all(set(c) <= set("-:") for c in cells):
                continue
            tag = "th" if not in_table else "td"
            if not in_table:
                out.append("<table>")
                in_table = True
            out.append("<tr>" + "".join(f"<{tag}>{inline(c)}</{tag}>" for c in cells) + "</tr>")
            continue
        if in_table:
            out.append("</table>")
            in_table = False
        if line.startswith("- "):
            if not in_list:
                out.append("<ul>")
                in_list = True
            out.append(f"<li>{inline(line[2:])}</li>")
            continue
        if in_list:
            out.append("</ul>")
            in_list = False
        if line.startswith("# "):
            continue
        if line.startswith("## "):
            out.append(f"<h3>{inline(line[3:])}</h3>")
            continue
        if line.strip():
            out.append(f"<p>{inline(line)}</p>")
    if in_table:
        out.append("</table>")
    if in_list:
        out.append("</ul>")
    return "\n".join(out)


def inline(text: str) -> str:
    """Escaped text with Markdown's bold and code spans."""
    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)
