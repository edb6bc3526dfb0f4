"""The HTML kit of the curator pages (dashboard and Data Docs): one page template, trusted fragments, escaping,
tables, cards, sections and badges. Every string that is not a :class:`Html` fragment made here is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

#: the page template (inline CSS, no script): ``$site $title $run_id $subtitle $release $nav $body``
TEMPLATE_FILE = Path(__file__).with_name("dashboard_template.html")
#: the dashboard's pages: file name and title
PAGES = (
    ("index.html", "Run overview"),
    ("deid.html", "De-identification audit"),
    ("images.html", "Images"),
    ("reports.html", "Reports"),
    ("pairs.html", "Pairs & VQA"),
    ("splits.html", "Splits"),
    ("checks.html", "Quality checks"),
    ("quarantine.html", "Quarantine"),
    ("training.html", "Training"),
)
#: the navigation's way to the quarantine review: the quarantine page's "record decisions" section, which exists
#: whether the dashboard is served or opened from disk (a file has no app behind ``../review``); that section links
#: the served app (:data:`REVIEW_APP_LINK`)
REVIEW_LINK = (
    '<a class="review" href="quarantine.html#record-decisions" id="review-nav">Quarantine review (record decisions)</a>'
)
#: the served app's quarantine review (``/review`` beside ``/dashboard/``, wherever the app is mounted: relative)
REVIEW_APP_LINK = '<a class="review" href="../review" id="review-link">Open the review app</a>'


#: the release slot of every page's header before the run's release is known (the checks run before publishing);
#: :func:`quality.dashboard.stamp_release` replaces it with the release the run published
RELEASE_PENDING = '<!--release--><span id="release">release: not yet published by this run</span><!--/release-->'


def release_label(version: str, content_hash: str) -> str:
    """The header's release slot naming a published release: version and the first 16 hex of its content hash."""
    return (
        f'<!--release--><span id="release">release <span class="mono">{esc(version)}</span> (content hash '
        f'<span class="mono">{esc(content_hash[:16])}</span>)</span><!--/release-->'
    )


class Html(str):
    """A trusted HTML fragment (produced here); every other string is escaped on output."""


def esc(value) -> str:
    """``value`` HTML-escaped (quotes too); a :class:`Html` fragment as it is; None as an empty string."""
    if isinstance(value, Html):
        return str(value)
    return html.escape("" if value is None else str(value), quote=True)


def fmt(v) -> str:
    """A number for a table cell (thousands separators, 3 significant digits); anything else as ``str``."""
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, (int, np.integer)):
        return f"{int(v):,}"
    if isinstance(v, (float, np.floating)):
        return f"{float(v):,.3g}" if abs(v) < 1000 else f"{float(v):,.0f}"
    return str(v)


def table(
    headers: Sequence[str], rows: Iterable[Sequence], numeric: Iterable[int] = (), wrap: Iterable[int] = ()
) -> str:
    """An HTML table; ``numeric`` columns right-aligned and formatted, ``wrap`` columns (long codes, JSON,
    messages) may break anywhere, so the table never overflows its card."""
    num, brk = set(numeric), set(wrap)
    head = "".join(
        f'<th class="num">{esc(h)}</th>' if i in num else f"<th>{esc(h)}</th>" for i, h in enumerate(headers)
    )
    body = []
    for row in rows:
        cells = []
        for i, v in enumerate(row):
            txt = esc(v) if isinstance(v, Html) else esc(fmt(v) if i in num else v)
            cells.append(
                f'<td class="num">{txt}</td>'
                if i in num
                else f'<td class="wrap">{txt}</td>'
                if i in brk
                else f"<td>{txt}</td>"
            )
        body.append("<tr>" + "".join(cells) + "</tr>")
    if not body:
        body.append(f'<tr><td colspan="{len(headers)}" class="empty">none</td></tr>')
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def cards(items: Sequence[tuple[str, object]]) -> str:
    """A row of number cards, one per ``(label, value)``."""
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card"><div class="v">{esc(fmt(v))}</div><div class="k">{esc(k)}</div></div>' for k, v in items
        )
        + "</div>"
    )


def section(title: str, *content: str) -> str:
    """A card (``<section>``) with a heading and the given trusted HTML content."""
    return f"<section><h2>{esc(title)}</h2>{''.join(content)}</section>"


def badge(passed: bool, severity: str = "critical") -> Html:
    """PASS, or FAIL coloured by severity (critical: red, else amber)."""
    if passed:
        return Html('<span class="badge pass">PASS</span>')
    cls = "fail" if severity == "critical" else "warn"
    return Html(f'<span class="badge {cls}">FAIL</span>')
