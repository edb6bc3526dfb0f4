"""The curator dashboard: a static, self-contained HTML site (inline CSS, inline SVG, no scripts).

Pages: run overview (ledger balance, statuses, quarantine reasons, institutions x modalities, trend over
runs), de-identification audit, images, reports (entity prevalence heat map, negation/uncertainty),
pairs and VQA, splits, quality checks, quarantine list (with curator decisions), training metrics of the release
(filled when its training jobs record them, :mod:`quality.training_page`).

PHI safety: the dashboard reads only codes and counts from the de-identified tables, never report text,
and from the ledger never ``source_uri`` / ``duplicate_of`` (archives name folders after patients): a
quarantined file is shown by its opaque id ``sha256[:12]``; ``detail`` is shown with any fragment of the
row's source path removed. Every string is HTML-escaped. Pages are deterministic for the same inputs.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from string import Template

import numpy as np
import pyarrow as pa

from etl.storage import Storage
from quality.checks import QualityReport
from quality.page_kit import PAGES, RELEASE_PENDING, REVIEW_APP_LINK, REVIEW_LINK, TEMPLATE_FILE
from quality.page_kit import Html as _Html
from quality.page_kit import badge as _badge
from quality.page_kit import cards as _cards
from quality.page_kit import esc as _e
from quality.page_kit import fmt as _fmt
from quality.page_kit import section as _section
from quality.page_kit import table as _table
from quality.training_page import TRAINING_PENDING, stamp_training
from schemas.errors import ReasonCodedError
from schemas.ledger import STATUSES
from schemas.ontology import load_ontology
from schemas.splits import SPLITS
from schemas.tables import SCHEMAS

REVIEW_DECISIONS = ("release", "reject")
PHI_EXPECTATION = "expect_column_values_to_not_match_regex_list"
STATUS_COLOURS = {"ingested": "#2e7d4f", "quarantined": "#b3261e", "duplicate": "#d08a00", "skipped": "#8a94a6"}
PALETTE = ("#2156a5", "#2e7d4f", "#d08a00", "#b3261e", "#6a3d9a", "#1f9aa8", "#8a94a6", "#c2185b")
#: run_info keys that may name locations (source roots, config paths) are never rendered
_LOCATION_KEY = re.compile(r"(path|uri|root|dir|file|source|location|url)", re.IGNORECASE)
_MAX_HEATMAP_ENTITIES = 30
_BAR_LABEL_CHARS = 40
_NONE = "(none)"
_HERE = ' class="here"'


class DashboardInputError(ReasonCodedError, ValueError):
    """Bad input to :func:`build_dashboard`; ``reason`` is ``missing_run_id``, ``bad_history`` or ``bad_review``."""


def _clip(label: str, n: int) -> str:
    """Shorten a chart label to ``n`` characters (the full label stays in the SVG ``<title>`` tooltip)."""
    label = str(label)
    return label if len(label) <= n else label[: n - 1] + "…"


#: width of one character in px per px of font size: an upper bound for system-ui sans-serif (capitals and
#: digits included), so a label given this room is never cut by the SVG's edge
CHAR_EM = 0.68


def text_width(label: str, font_px: float) -> float:
    """Upper bound of the rendered width (px) of ``label`` at ``font_px`` (see :data:`CHAR_EM`)."""
    return len(str(label)) * font_px * CHAR_EM


# ------------------------------------------------------------------------------------------ SVG charts


def svg_bar_chart(
    items: Sequence[tuple[str, float]],
    *,
    title: str = "",
    unit: str = "",
    width: int = 520,
    colour: str = PALETTE[0],
    colours: Mapping[str, str] | None = None,
) -> str:
    """Horizontal bar chart as an inline ``<svg>`` string.

    Parameters
    ----------
    items : sequence of (label, value)
        one bar per item, drawn in the given order; values >= 0 (negative values are drawn as 0).
    title : str
        caption above the bars (escaped).
    unit : str
        appended to the printed values (e.g. ``"%"``).
    width : int
        width in px with a 170 px label column; the label column grows to fit the longest label (labels are
        cut at 40 characters, the full label in the tooltip), widening the chart; bar height is 18 px.
    colour, colours : str, mapping of label to str
        bar fill, optionally per label.

    Returns
    -------
    str
        ``<svg ...>...</svg>`` (or a short "no data" paragraph when ``items`` is empty).
    """
    if not items:
        return f'<p class="empty">{_e(title)}: no data</p>'
    labels = [_clip(label, _BAR_LABEL_CHARS) for label, _ in items]
    label_w = int(max(60, 10 + max(text_width(t, 12) for t in labels)))  # room for the longest label
    value_w, bar_h, gap, top = 70, 18, 4, 22 if title else 4
    plot_w = max(width - 170 - value_w, 120)  # the bars keep their length; a long label widens the chart
    width = label_w + plot_w + value_w
    vmax = max(max(float(v) for _, v in items), 1e-12)
    height = top + len(items) * (bar_h + gap) + 4
    parts = [f'<svg role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}">']
    if title:
        parts.append(f'<text x="0" y="14" font-size="13" font-weight="600">{_e(title)}</text>')
    for i, (label, value) in enumerate(items):
        y = top + i * (bar_h + gap)
        w = max(0.0, float(value)) / vmax * plot_w
        fill = (colours or {}).get(label, colour)
        text = f"{_fmt(value)}{unit}"
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 13}" font-size="12" text-anchor="end">{_e(labels[i])}'
            f"<title>{_e(label)}</title></text>"
            f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{_e(fill)}">'
            f"<title>{_e(label)}: {_e(text)}</title></rect>"
            f'<text x="{label_w + w + 4:.1f}" y="{y + 13}" font-size="12">{_e(text)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def svg_histogram(
    values: Iterable[float],
    *,
    bins: int = 20,
    title: str = "",
    unit: str = "",
    width: int = 520,
    height: int = 180,
    integer: bool = False,
) -> str:
    """Histogram of numeric values as an inline ``<svg>`` string.

    Parameters
    ----------
    values : iterable of float
        the sample; NaN / None values are dropped (and counted in the caption).
    bins : int
        number of equal-width bins over [min, max] (``numpy.histogram``); with ``integer=True`` one bin per
        integer when the range is at most ``bins`` wide.
    title, unit : str
        caption and axis unit (``"mm"``, ``"days"``, ``"px"``).
    width, height : int
        size in px.

    Returns
    -------
    str
        ``<svg>`` with one rect per bin (tooltip: bin range and count) and min/max axis labels.
    """
    arr = np.array([np.nan if v is None else float(v) for v in values], dtype=float)
    dropped = int(np.isnan(arr).sum())
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return f'<p class="empty">{_e(title)}: no data</p>'
    lo, hi = float(arr.min()), float(arr.max())
    if integer:  # whole-number bins centred on integers: one per value, or a whole number of values per bin
        step = max(1.0, float(math.ceil((hi - lo + 1) / bins)))
        edges = np.arange(lo - 0.5, hi + 0.5 + step, step)
        edges = edges[: int(np.searchsorted(edges, hi + 0.5, side="left")) + 1]
    else:
        edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
    counts, edges = np.histogram(arr, bins=edges)
    top, bottom, left = 22, 34, 40
    plot_w, plot_h = width - left - 10, height - top - bottom
    cmax = max(int(counts.max()), 1)
    bw = plot_w / len(counts)
    caption = f"{title} (n={arr.size:,}{f', {dropped:,} missing' if dropped else ''})"
    parts = [
        f'<svg role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
        f'<text x="0" y="14" font-size="13" font-weight="600">{_e(caption)}</text>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#999"/>',
        f'<text x="{left - 4}" y="{top + 10}" font-size="11" text-anchor="end">{cmax:,}</text>',
        f'<text x="{left - 4}" y="{top + plot_h}" font-size="11" text-anchor="end">0</text>',
    ]
    for i, c in enumerate(counts):
        h = c / cmax * plot_h
        a, b = edges[i], edges[i + 1]
        if integer:  # the whole numbers the bin holds
            rng = _fmt(round((a + b) / 2)) if b - a == 1 else f"{_fmt(round(a + 0.5))}–{_fmt(round(b - 0.5))}"
        else:
            rng = f"{_fmt(a)}–{_fmt(b)}"
        parts.append(
            f'<rect x="{left + i * bw + 1:.1f}" y="{top + plot_h - h:.1f}" width="{max(bw - 2, 1):.1f}" '
            f'height="{h:.1f}" fill="{PALETTE[0]}"><title>{_e(rng)} {_e(unit)}: {int(c):,}</title></rect>'
        )
    parts += _histogram_ticks(edges, integer, left, plot_w, top + plot_h)
    parts.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{top + plot_h + 28}" font-size="11" text-anchor="middle">'
        f"{_e(unit)}</text></svg>"
    )
    return "".join(parts)


def _histogram_ticks(
    edges: np.ndarray, integer: bool, left: float, plot_w: float, base_y: float, ticks: int = 5
) -> list[str]:
    """About ``ticks`` x-axis labels under a histogram: bin centres (whole numbers) for integer data, else bin
    edges, spread evenly over the bins, each with a tick mark."""
    n = len(edges) - 1
    bw = plot_w / n
    if integer:
        idx = sorted({round(k * (n - 1) / max(ticks - 1, 1)) for k in range(ticks)}) if n > 1 else [0]
        spots = [(left + (i + 0.5) * bw, (edges[i] + edges[i + 1]) / 2) for i in idx]
    else:
        idx = sorted({round(k * n / max(ticks - 1, 1)) for k in range(ticks)})
        spots = [(left + i * bw, edges[i]) for i in idx]
    out = []
    for x, value in spots:
        label = _fmt(int(round(value))) if integer else _fmt(value)
        anchor = "start" if x <= left + 1 else "end" if x >= left + plot_w - 1 else "middle"
        out.append(
            f'<line x1="{x:.1f}" y1="{base_y}" x2="{x:.1f}" y2="{base_y + 3}" stroke="#999"/>'
            f'<text x="{x:.1f}" y="{base_y + 14}" font-size="11" text-anchor="{anchor}">{_e(label)}</text>'
        )
    return out


def svg_heatmap(
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    matrix: np.ndarray,
    *,
    title: str = "",
    percent: bool = True,
    cell: int = 26,
) -> str:
    """Heat map (white -> blue) as an inline ``<svg>`` string.

    Parameters
    ----------
    row_labels, col_labels : sequence of str
        labels of the ``(n_rows, n_cols)`` matrix.
    matrix : numpy.ndarray, shape (n_rows, n_cols)
        values; with ``percent=True`` fractions in [0, 1] printed as percentages, else counts scaled by
        the matrix maximum. NaN cells are drawn grey ("no data").
    title : str
        caption.
    cell : int
        cell height in px (width is 2.4 x cell).

    Raises
    ------
    ValueError
        if the matrix shape does not match the labels.
    """
    m = np.asarray(matrix, dtype=float)
    if m.shape != (len(row_labels), len(col_labels)):
        raise ValueError(f"heatmap matrix shape {m.shape} != ({len(row_labels)}, {len(col_labels)})")
    if m.size == 0:
        return f'<p class="empty">{_e(title)}: no data</p>'
    rows_txt = [_clip(r, 36) for r in row_labels]
    cols_txt = [_clip(c, 14) for c in col_labels]
    cw = int(cell * 2.4)
    label_w = int(max(60, 10 + max(text_width(t, 11) for t in rows_txt)))
    # column labels are rotated 40 degrees up and to the right of their column's centre: room above and right
    col_w = max(text_width(t, 11) for t in cols_txt)
    top = int(max(22 + 70, 22 + col_w * math.sin(math.radians(40)) + 12))
    right = int(max(10, col_w * math.cos(math.radians(40)) - cw / 2 + 6))
    width, height = label_w + cw * len(col_labels) + right, top + cell * len(row_labels) + 6
    width = int(max(width, text_width(title, 13) + 8))  # the title is never cut (one row, one column)
    scale = 1.0 if percent else max(np.nanmax(m) if np.isfinite(m).any() else 1.0, 1e-12)
    parts = [
        f'<svg role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
        f'<text x="0" y="14" font-size="13" font-weight="600">{_e(title)}</text>',
    ]
    for j, c in enumerate(col_labels):
        x = label_w + j * cw + cw / 2
        parts.append(
            f'<text x="{x:.1f}" y="{top - 6}" font-size="11" transform="rotate(-40 {x:.1f} {top - 6})">'
            f"{_e(cols_txt[j])}<title>{_e(c)}</title></text>"
        )
    for i, r in enumerate(row_labels):
        y = top + i * cell
        parts.append(
            f'<text x="{label_w - 6}" y="{y + cell * 0.65:.1f}" font-size="11" text-anchor="end">'
            f"{_e(rows_txt[i])}<title>{_e(r)}</title></text>"
        )
        for j, c in enumerate(col_labels):
            v = m[i, j]
            if np.isnan(v):
                fill, txt, ink = "#eeeeee", "–", "#777"
            else:
                t = min(max(v / scale, 0.0), 1.0)
                fill = f"rgb({int(255 - 222 * t)},{int(255 - 169 * t)},{int(255 - 90 * t)})"
                txt = f"{100 * v:.0f}%" if percent else _fmt(v)
                ink = "#fff" if t > 0.55 else "#1d2430"
            parts.append(
                f'<rect x="{label_w + j * cw}" y="{y}" width="{cw - 1}" height="{cell - 1}" fill="{fill}">'
                f"<title>{_e(r)} · {_e(c)}: {_e(txt)}</title></rect>"
                f'<text x="{label_w + j * cw + cw / 2:.1f}" y="{y + cell * 0.65:.1f}" font-size="10" '
                f'text-anchor="middle" fill="{ink}">{_e(txt)}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)


_RUN_ID_TIME = re.compile(
    r"^(?P<kind>[a-z_]+?)__(?P<date>\d{4}-\d{2}-\d{2})T(?P<h>\d{2})[_:](?P<m>\d{2})[_:](?P<s>\d{2})"
)


def _short_category(label: str, n: int = 32) -> str:
    """A category label for an axis: an Airflow run id ``manual__2026-12-01T23_46_54.008100_00_00`` becomes
    ``manual 2026-12-01 23:46:54`` (what tells runs apart); anything else is cut at ``n`` characters."""
    m = _RUN_ID_TIME.match(str(label))
    if m:
        return f"{m['kind']} {m['date']} {m['h']}:{m['m']}:{m['s']}"
    return _clip(label, n)


def svg_stacked_bars(
    categories: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    title: str = "",
    colours: Mapping[str, str] | None = None,
    width: int = 640,
    height: int = 240,
) -> str:
    """Vertical stacked bars (one column per category, one stack segment per series) with a legend.

    Parameters
    ----------
    categories : sequence of str
        x-axis labels (run ids, institutions).
    series : mapping of str to sequence of float
        segment name -> one value per category (same length as ``categories``).
    colours : mapping of str to str, optional
        segment colours (default: the palette in order).

    Raises
    ------
    ValueError
        if a series length differs from the number of categories.
    """
    for name, vals in series.items():
        if len(vals) != len(categories):
            raise ValueError(f"series {name!r} has {len(vals)} values for {len(categories)} categories")
    if not categories:
        return f'<p class="empty">{_e(title)}: no data</p>'
    names = list(series)
    col = {n: (colours or {}).get(n, PALETTE[i % len(PALETTE)]) for i, n in enumerate(names)}
    totals = [sum(float(series[n][k]) for n in names) for k in range(len(categories))]
    vmax = max(max(totals), 1e-12)
    # category labels are rotated 30 degrees down-left from under their bar: the bottom margin and the left
    # margin (for the first bar's label) grow with the longest label, so none is cut at the SVG's edge
    cats_txt = [_short_category(c) for c in categories]
    lab_w = max(text_width(t, 10) for t in cats_txt)
    legend_w = int(max(130, 30 + max(text_width(n, 11) for n in names)))
    top, bottom = 22, int(max(80, 24 + lab_w * math.sin(math.radians(30))))
    height = max(height, top + bottom + 120)
    left = 44
    for _ in range(2):
        bw = (width - left - legend_w) / len(categories)
        left = int(max(44, lab_w * math.cos(math.radians(30)) - bw / 2 + 6))
    plot_w, plot_h = width - left - legend_w, height - top - bottom
    bw = plot_w / len(categories)
    parts = [
        f'<svg role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
        f'<text x="0" y="14" font-size="13" font-weight="600">{_e(title)}</text>',
        f'<text x="{left - 4}" y="{top + 10}" font-size="11" text-anchor="end">{_fmt(vmax)}</text>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#999"/>',
    ]
    for k, cat in enumerate(categories):
        y = top + plot_h
        x = left + k * bw + bw * 0.15
        for n in names:
            h = float(series[n][k]) / vmax * plot_h
            y -= h
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw * 0.7:.1f}" height="{h:.1f}" fill="{col[n]}">'
                f"<title>{_e(cat)} · {_e(n)}: {_fmt(series[n][k])}</title></rect>"
            )
        cx = left + k * bw + bw / 2
        parts.append(
            f'<text x="{cx:.1f}" y="{top + plot_h + 12}" font-size="10" text-anchor="end" '
            f'transform="rotate(-30 {cx:.1f} {top + plot_h + 12})">{_e(cats_txt[k])}'
            f"<title>{_e(cat)}</title></text>"
        )
    for i, n in enumerate(names):
        y = top + i * 16
        parts.append(
            f'<rect x="{width - legend_w + 8}" y="{y}" width="10" height="10" fill="{col[n]}"/>'
            f'<text x="{width - legend_w + 22}" y="{y + 9}" font-size="11">{_e(n)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


# ------------------------------------------------------------------------------------------ HTML bits


def _row(*charts: str) -> str:
    return '<div class="row">' + "".join(f"<div>{c}</div>" for c in charts) + "</div>"


# ------------------------------------------------------------------------------------------ data access


def _col(tables: Mapping[str, pa.Table], table: str, column: str) -> list:
    t = tables.get(table)
    if t is None or column not in t.column_names:
        return []
    return t.column(column).to_pylist()


def _counts(values: Iterable) -> list[tuple[str, int]]:
    c = Counter(_NONE if v is None else str(v) for v in values)
    return sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))


def _n(tables: Mapping[str, pa.Table], table: str) -> int:
    t = tables.get(table)
    return 0 if t is None else t.num_rows


_SEP = re.compile(r"[\\/]+")
_PLAIN_WORD = re.compile(r"[A-Za-z]+")
_TOKEN = r"(?<![A-Za-z0-9_]){}(?![A-Za-z0-9_])"


def _path_fragments(*uris: str | None) -> list[str]:
    """What of a source path is removed from a ledger text (longest first; each matched as a whole token).

    - the path as given and every run of two or more of its consecutive components (``a/b/c``, ``b/c``, ``a/b``), with
      either separator;
    - the file name and its stem (``IM0001.dcm``, ``IM0001``);
    - every component that is not a plain word (it holds a digit, ``^``, ``_``, ``.``, a space: the shapes of
      patient-named folders, ids and UIDs, ``SMITH^JANE_1961``, ``2.25.1234``) and its pieces split at
      ``^ _ , . -`` and spaces, except all-lowercase words (``raw`` of ``raw_data``);

    pieces shorter than 3 characters are kept. A component that is a plain word (``data``, ``reports``,
    ``dicom``) is removed only as part of the path (a run of components above), never where it stands as a
    word of the text: the stage name ``reports`` or the word ``data`` are not paths.
    """
    frags: set[str] = set()
    for uri in uris:
        if not uri:
            continue
        frags.add(uri)
        parts = [p for p in _SEP.split(uri) if p]
        for i in range(len(parts)):
            for j in range(i + 2, len(parts) + 1):
                frags.add("/".join(parts[i:j]))
                frags.add("\\".join(parts[i:j]))
        if parts:
            frags.add(parts[-1])
            frags.add(parts[-1].rsplit(".", 1)[0])
        for part in parts:
            if _PLAIN_WORD.fullmatch(part):
                continue
            frags.add(part)
            frags.update(p for p in re.split(r"[\^\s_,.\-]+", part) if not re.fullmatch(r"[a-z]+", p))
    return sorted((f for f in frags if len(f) >= 3), key=lambda f: (-len(f), f))


def _scrub(text: str | None, fragments: Sequence[str]) -> str:
    """``text`` with every fragment of :func:`_path_fragments` (a whole token, any case) replaced by
    ``[source path]``."""
    if not text:
        return ""
    low = text.lower()
    for f in fragments:
        if f.lower() in low:
            text = re.sub(_TOKEN.format(re.escape(f)), "[source path]", text, flags=re.IGNORECASE)
            low = text.lower()
    return text


SAFE_LEDGER_COLUMNS = ("opaque_id", "run_id", "institution", "kind", "status", "stage", "reason", "detail")


def safe_ledger(ledger: pa.Table | None) -> pa.Table:
    """The ledger as the dashboard may show it: no ``source_uri`` / ``duplicate_of``, an ``opaque_id``
    (``sha256[:12]``) instead, and ``stage`` / ``reason`` / ``detail`` with every fragment of the row's
    source path (folder and file names, PN components, >= 3 characters) replaced by ``[source path]``.

    Parameters
    ----------
    ledger : pyarrow.Table or None
        a table of ``schemas.ledger.SCHEMA`` (None gives an empty table).

    Returns
    -------
    pyarrow.Table
        string columns :data:`SAFE_LEDGER_COLUMNS`, one row per ledger row, same order.
    """
    out: dict[str, list] = {c: [] for c in SAFE_LEDGER_COLUMNS}
    if ledger is not None:
        cols = {
            c: ledger.column(c).to_pylist()
            for c in (
                "sha256",
                "run_id",
                "institution",
                "kind",
                "status",
                "stage",
                "reason",
                "detail",
                "source_uri",
                "duplicate_of",
            )
        }
        for k in range(ledger.num_rows):
            keep = {cols["institution"][k], cols["run_id"][k]}
            frags = [f for f in _path_fragments(cols["source_uri"][k], cols["duplicate_of"][k]) if f not in keep]
            out["opaque_id"].append((cols["sha256"][k] or "").lower()[:12])
            for c in ("run_id", "institution", "kind", "status"):
                out[c].append(cols[c][k])
            for c in ("stage", "reason", "detail"):
                out[c].append(_scrub(cols[c][k], frags) if cols[c][k] is not None else None)
    return pa.table({c: pa.array(v, type=pa.string()) for c, v in out.items()})


# ------------------------------------------------------------------------------------------ pages


def _overview(tables, quality: QualityReport, run_info: dict, history: list[dict]) -> str:
    run_id = run_info["run_id"]
    statuses = _col(tables, "ledger", "status")
    status_counts = Counter(statuses)
    info_rows = [
        (k, v)
        for k, v in sorted(run_info.items())
        if k != "deid_audit"
        and not _LOCATION_KEY.search(k)
        and isinstance(v, (str, int, float, bool))
        and v is not None
    ]
    # what this run did to its inputs, apart from what the dataset holds after it (a no-op re-run ingests nothing
    # and records every file as a duplicate, while the dataset keeps all it had)
    this_run = Counter(s for r, s in zip(_col(tables, "ledger", "run_id"), statuses, strict=True) if r == run_id)
    run_cards = _cards(
        [
            ("files seen by this run", sum(this_run.values())),
            *[(s, this_run.get(s, 0)) for s in STATUSES],
            ("critical failures", len(quality.critical_failures)),
            ("warnings", len(quality.warnings)),
        ]
    )
    dataset_cards = _cards(
        [
            ("studies", _n(tables, "studies")),
            ("images", _n(tables, "images")),
            ("reports", _n(tables, "reports")),
            ("pairs", _n(tables, "pairs")),
            ("VQA items", _n(tables, "vqa")),
            ("files in all runs' ledgers", len(statuses)),
        ]
    )
    # ledger balance per run
    per_run: dict[str, Counter] = defaultdict(Counter)
    for r, s in zip(_col(tables, "ledger", "run_id"), statuses, strict=True):
        per_run[r][s] += 1
    bal_rows = []
    for r in sorted(per_run):
        c = per_run[r]
        rows_n, valid = sum(c.values()), sum(c[s] for s in STATUSES)
        bal_rows.append((r, rows_n, *[c[s] for s in STATUSES], valid, _badge(rows_n == valid)))
    balance = _table(
        ["run_id", "rows", *STATUSES, "sum of statuses", "balanced"], bal_rows, numeric=range(1, 2 + len(STATUSES) + 1)
    )
    reasons = [r for r, s in zip(_col(tables, "ledger", "reason"), statuses, strict=True) if s == "quarantined"]
    status_chart = svg_bar_chart(
        [(s, status_counts.get(s, 0)) for s in STATUSES] + [(s, n) for s, n in _counts(statuses) if s not in STATUSES],
        title="Files per status",
        colours=STATUS_COLOURS,
    )
    reason_chart = svg_bar_chart(
        _counts(reasons), title="Quarantined files per reason", colour=STATUS_COLOURS["quarantined"]
    )
    # report records withheld by this run (a language without a pack, no text, ...): counts only, never text
    withheld = {str(k): int(v) for k, v in (run_info.get("withheld_reports") or {}).items()}
    withheld_part = (
        _table(["reason", "report records withheld"], sorted(withheld.items()), numeric=[1])
        if withheld
        else "<p>No report record withheld.</p>"
    )
    # per institution x status
    insts = sorted(set(_col(tables, "ledger", "institution")))
    by_inst = Counter(zip(_col(tables, "ledger", "institution"), statuses, strict=True))
    inst_chart = svg_stacked_bars(
        insts,
        {s: [by_inst[(i, s)] for i in insts] for s in STATUSES},
        title="Files per institution and status",
        colours=STATUS_COLOURS,
    )
    # studies per institution x modality
    sm = Counter(zip(_col(tables, "studies", "institution"), _col(tables, "studies", "modality"), strict=True))
    s_insts = sorted({i for i, _ in sm})
    s_mods = sorted({m for _, m in sm})
    mat = np.array([[sm[(i, m)] for m in s_mods] for i in s_insts], dtype=float).reshape(len(s_insts), len(s_mods))
    inst_mod = svg_heatmap(s_insts, s_mods, mat, title="Studies per institution and modality", percent=False)
    # trend
    trend = _trend(history, per_run, run_id)
    return "".join(
        [
            _section("This run", _table(["key", "value"], info_rows), run_cards),
            _section("The dataset after this run (all runs)", dataset_cards),
            _section(
                "Ledger balance (every discovered file has exactly one status)",
                balance,
                _row(status_chart, reason_chart),
            ),
            _section(
                "Report records withheld by this run",
                _cards([("report records withheld", sum(withheld.values()))]),
                withheld_part,
            ),
            _section("Institutions and modalities", _row(inst_chart, inst_mod)),
            _section("Trend across runs", trend),
        ]
    )


def _trend(history: list[dict], per_run: Mapping[str, Counter], run_id: str) -> str:
    runs = [dict(h) for h in history]
    if run_id not in {h["run_id"] for h in runs} and run_id in per_run:
        runs.append({"run_id": run_id, **{s: per_run[run_id][s] for s in STATUSES}})
    if not runs:
        return '<p class="empty">no run history</p>'
    cats = [str(h["run_id"]) for h in runs]
    chart = svg_stacked_bars(
        cats,
        {s: [float(h.get(s, 0) or 0) for h in runs] for s in STATUSES},
        title="Files per status per run",
        colours=STATUS_COLOURS,
    )
    keys = sorted(
        {
            k
            for h in runs
            for k, v in h.items()
            if k != "run_id" and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
    )
    table = _table(
        ["run_id", *keys], [(h["run_id"], *[h.get(k, "") for k in keys]) for h in runs], numeric=range(1, len(keys) + 1)
    )
    return chart + table


def _flatten_counts(d: Mapping, prefix: str = "") -> list[tuple[str, object]]:
    out = []
    for k in sorted(d, key=str):
        v = d[k]
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out += _flatten_counts(v, name + " / ")
        elif isinstance(v, (list, tuple)):
            out.append((name, len(v)))
        else:
            out.append((name, v))
    return out


def _deid(tables, quality: QualityReport, run_info: dict) -> str:
    audit = run_info.get("deid_audit") or {}
    parts = []
    if not audit:
        parts.append(
            _section(
                "De-identification counts",
                '<p class="empty">no de-identification audit counts were supplied for this run</p>',
            )
        )
    else:
        flat = _flatten_counts(audit)
        groups: dict[str, list[tuple[str, float]]] = defaultdict(list)
        for name, v in flat:
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                head, _, tail = name.rpartition(" / ")
                groups[head or "totals"].append((tail, v))
        charts = [svg_bar_chart(items, title=g) for g, items in sorted(groups.items())]
        parts.append(_section("De-identification counts", _table(["count", "value"], flat, numeric=[1]), _row(*charts)))
    deface = {k.removeprefix("deface:"): v for k, v in audit.items() if k.startswith("deface:")}
    if deface:  # head CT/MR defacing (113102): series per outcome, detector hits before and after
        outcomes = [(k, v) for k, v in sorted(deface.items()) if not k.startswith(("faces_", "quarantined:"))]
        reasons_q = [
            (k.removeprefix("quarantined:"), v) for k, v in sorted(deface.items()) if k.startswith("quarantined:")
        ]
        hits = [("before defacing", deface.get("faces_before", 0)), ("after defacing", deface.get("faces_after", 0))]
        parts.append(
            _section(
                "Head CT/MR defacing (Clean Recognizable Visual Features, 113102)",
                '<p class="muted">Series per outcome; faces found by the frontal-face detector on front renders of '
                "the head surface before and after defacing (after must be 0: a series with a face left is "
                "quarantined).</p>",
                _row(
                    svg_bar_chart(outcomes, title="Head series per outcome"),
                    svg_bar_chart(
                        reasons_q, title="Head series quarantined per reason", colour=STATUS_COLOURS["quarantined"]
                    ),
                    svg_bar_chart(hits, title="Detector hits (faces)"),
                ),
            )
        )
    stage = _col(tables, "ledger", "stage")
    reasons = [
        r
        for r, s, st in zip(_col(tables, "ledger", "reason"), _col(tables, "ledger", "status"), stage, strict=True)
        if s == "quarantined" and st == "deidentify"
    ]
    parts.append(
        _section(
            "Quarantined at de-identification (fail-closed)",
            svg_bar_chart(_counts(reasons), title="Files per reason", colour=STATUS_COLOURS["quarantined"]),
        )
    )
    phi = [r for r in quality.results if r.observed.get("expectation") == PHI_EXPECTATION]
    rows = [
        (
            _badge(r.passed, r.severity),
            r.severity,
            r.table,
            r.check.split(":", 1)[-1].replace("|", ", "),
            r.observed.get("element_count", 0),
            r.observed.get("unexpected_count", 0),
        )
        for r in sorted(phi, key=lambda r: (r.passed, r.severity != "critical", r.table, r.check))
    ]
    parts.append(
        _section(
            "Residual PHI scan of the de-identified tables",
            f'<p class="muted">Great Expectations <span class="mono">{PHI_EXPECTATION}</span> with '
            "the report de-identifier's own patterns (names after titles and signature labels, "
            "phone numbers, e-mail addresses, URLs, labelled ids, DICOM person names; dates outside "
            "report text). Counts only: a flagged value is never shown.</p>",
            _table(
                ["status", "severity", "table", "columns", "values scanned", "values flagged"],
                rows,
                numeric=[4, 5],
                wrap=[3],
            ),
        )
    )
    return "".join(parts)


def _images(tables) -> str:
    failed = [
        (r, i)
        for r, i, s, st in zip(
            _col(tables, "ledger", "reason"),
            _col(tables, "ledger", "institution"),
            _col(tables, "ledger", "status"),
            _col(tables, "ledger", "stage"),
            strict=True,
        )
        if s == "quarantined" and st == "normalise"
    ]
    decode, decode_inst = [r for r, _ in failed], [i for _, i in failed]
    spacing = _col(tables, "images", "spacing_mm")
    kinds = _col(tables, "images", "kind")
    row_sp = [s[0] if s else None for s in spacing]
    slice_sp = [s[2] if s and len(s) > 2 else None for s, k in zip(spacing, kinds, strict=True) if k == "3d"]
    slices = [n for n, k in zip(_col(tables, "images", "n_slices"), kinds, strict=True) if k == "3d"]
    im = Counter(zip(_col(tables, "images", "institution"), _col(tables, "images", "modality"), strict=True))
    insts, mods = sorted({i for i, _ in im}), sorted({m for _, m in im})
    mat = np.array([[im[(i, m)] for m in mods] for i in insts], dtype=float).reshape(len(insts), len(mods))
    return "".join(
        [
            _section(
                "Mix",
                _cards([("images", _n(tables, "images")), ("series", _n(tables, "series"))]),
                _row(
                    svg_bar_chart(_counts(_col(tables, "images", "modality")), title="Images per modality"),
                    svg_bar_chart(_counts(_col(tables, "images", "view")), title="Images per view"),
                    svg_bar_chart(_counts(kinds), title="2D images / 3D volumes"),
                    svg_heatmap(insts, mods, mat, title="Images per institution and modality", percent=False),
                ),
            ),
            _section(
                "Spacing (original, before resampling)",
                _row(
                    svg_histogram(row_sp, title="Row pixel spacing", unit="mm"),
                    svg_histogram(slice_sp, title="Slice spacing (3D)", unit="mm"),
                ),
            ),
            _section(
                "Size (after normalisation)",
                _row(
                    svg_histogram(_col(tables, "images", "rows"), title="Rows", unit="px"),
                    svg_histogram(_col(tables, "images", "cols"), title="Columns", unit="px"),
                    svg_histogram(slices, title="Slices per volume (3D)", unit="slices", integer=True),
                ),
            ),
            _section(
                "Decode failures (quarantined at normalisation)",
                _row(
                    svg_bar_chart(_counts(decode), title="Files per reason", colour=STATUS_COLOURS["quarantined"]),
                    svg_bar_chart(
                        _counts(decode_inst), title="Files per institution", colour=STATUS_COLOURS["quarantined"]
                    ),
                ),
            ),
        ]
    )


def _reports(tables, ontology) -> str:
    rep_ids = _col(tables, "reports", "report_id")
    rep_inst = dict(zip(rep_ids, _col(tables, "reports", "institution"), strict=True))
    reports_per_inst = Counter(rep_inst.values())
    insts = sorted(reports_per_inst)
    sections = [_col(tables, "reports", c) for c in ("indication", "comparison", "findings", "impression")]
    no_sections = Counter(
        i
        for i, *secs in zip(_col(tables, "reports", "institution"), *sections, strict=True)
        if not any(s and s.strip() for s in secs)
    )
    no_link = Counter(
        i
        for i, sk in zip(_col(tables, "reports", "institution"), _col(tables, "reports", "study_key"), strict=True)
        if sk is None
    )
    gaps = _table(
        ["institution", "reports", "without sections", "without a study link"],
        [(i, reports_per_inst[i], no_sections[i], no_link[i]) for i in insts],
        numeric=[1, 2, 3],
    )
    # entity prevalence: share of an institution's reports with >= 1 present mention of the entity
    m_rep = _col(tables, "entity_mentions", "report_id")
    m_ent = _col(tables, "entity_mentions", "entity_id")
    m_ass = _col(tables, "entity_mentions", "assertion")
    present = {(r, e) for r, e, a in zip(m_rep, m_ent, m_ass, strict=True) if a == "present" and r in rep_inst}
    by_entity = Counter(e for _, e in present)
    by_entity_inst = Counter((e, rep_inst[r]) for r, e in present)
    top = sorted(by_entity, key=lambda e: (-by_entity[e], e))[:_MAX_HEATMAP_ENTITIES]
    concepts = getattr(ontology, "concepts", {})
    labels = [f"{e} {concepts[e].preferred_name}" if e in concepts else e for e in top]
    mat = np.array([[by_entity_inst[(e, i)] / reports_per_inst[i] for i in insts] for e in top], dtype=float).reshape(
        len(top), len(insts)
    )
    heat = svg_heatmap(labels, insts, mat, title="Share of reports with the entity present, per institution")
    # negation and uncertainty
    per_inst: dict[str, Counter] = defaultdict(Counter)
    for r, a in zip(m_rep, m_ass, strict=True):
        per_inst[rep_inst.get(r, "(unlinked report)")][a] += 1
    rate_rows = []
    for i in sorted(per_inst):
        c = per_inst[i]
        total = sum(c.values())
        rate_rows.append((i, total, 100.0 * c["absent"] / total, 100.0 * c["uncertain"] / total))
    rates = _table(["institution", "mentions", "negated %", "uncertain %"], rate_rows, numeric=[1, 2, 3])
    neg_chart = svg_bar_chart([(r[0], round(r[2], 1)) for r in rate_rows], title="Negated mentions", unit="%")
    unc_chart = svg_bar_chart(
        [(r[0], round(r[3], 1)) for r in rate_rows], title="Uncertain mentions", unit="%", colour=PALETTE[2]
    )
    return "".join(
        [
            _section(
                "Reports",
                _cards(
                    [
                        ("reports", len(rep_ids)),
                        ("entity mentions", len(m_rep)),
                        ("reports without sections", sum(no_sections.values())),
                        ("reports without a study link", sum(no_link.values())),
                    ]
                ),
                _row(
                    svg_bar_chart(_counts(_col(tables, "reports", "institution")), title="Reports per institution"),
                    svg_bar_chart(_counts(_col(tables, "reports", "language")), title="Reports per language"),
                    svg_bar_chart(_counts(_col(tables, "reports", "link_status")), title="Study link status"),
                ),
                gaps,
            ),
            _section(
                "Entity prevalence (present assertions)",
                heat,
                svg_bar_chart(_counts(_col(tables, "entity_mentions", "category")), title="Mentions per category"),
            ),
            _section("Negation and uncertainty", _row(neg_chart, unc_chart), rates),
        ]
    )


def _pairs_vqa(tables) -> str:
    per_patient = Counter(_col(tables, "pairs", "patient_key"))
    changes = [lab["change"] for labels in _col(tables, "pairs", "change_labels") for lab in (labels or [])]
    letters = _col(tables, "vqa", "answer")
    n_opts = [len(o or []) for o in _col(tables, "vqa", "options")]
    expected: Counter = Counter()
    for k in n_opts:
        for j in range(min(k, 26)):
            expected[chr(65 + j)] += 1.0 / k
    n = len(letters)
    got = Counter(letters)
    balance = (
        [(f"{L} (expected {100 * expected[L] / n:.0f}%)", round(100.0 * got[L] / n, 1)) for L in sorted(expected)]
        if n
        else []
    )
    return "".join(
        [
            _section(
                "Pairs",
                _cards([("pairs", _n(tables, "pairs")), ("patients with pairs", len(per_patient))]),
                _row(
                    svg_histogram(
                        _col(tables, "pairs", "gap_days"), title="Gap between prior and current", unit="days"
                    ),
                    svg_histogram(list(per_patient.values()), title="Pairs per patient", unit="pairs", integer=True),
                    svg_bar_chart(_counts(_col(tables, "pairs", "family")), title="Pairs per modality family"),
                    svg_bar_chart(_counts(changes), title="Change labels"),
                ),
            ),
            _section(
                "VQA",
                _cards([("items", n)]),
                _row(
                    svg_bar_chart(_counts(_col(tables, "vqa", "question_type")), title="Items per question type"),
                    svg_bar_chart(balance, title="Answer letter share", unit="%"),
                    svg_bar_chart(_counts(_col(tables, "vqa", "split")), title="Items per split"),
                ),
            ),
        ]
    )


def _splits(tables) -> str:
    split_of = dict(zip(_col(tables, "splits", "patient_key"), _col(tables, "splits", "split"), strict=True))
    order = {s: i for i, s in enumerate(SPLITS)}

    def per_split(table: str) -> list[tuple[str, int]]:
        c = Counter(split_of.get(p, "(no split)") for p in _col(tables, table, "patient_key"))
        return sorted(c.items(), key=lambda kv: (order.get(kv[0], 99), kv[0]))

    patients = per_split("splits")
    inst_split = Counter(zip(_col(tables, "splits", "institution"), _col(tables, "splits", "split"), strict=True))
    insts = sorted({i for i, _ in inst_split})
    splits_present = [s for s in SPLITS if any(inst_split[(i, s)] for i in insts)]
    table = _table(
        ["institution", *splits_present],
        [(i, *[inst_split[(i, s)] for s in splits_present]) for i in insts],
        numeric=range(1, len(splits_present) + 1),
    )
    return "".join(
        [
            _section(
                "Patient-level splits",
                _row(
                    svg_bar_chart(patients, title="Patients per split"),
                    svg_bar_chart(per_split("studies"), title="Studies per split"),
                    svg_bar_chart(per_split("images"), title="Images per split"),
                    svg_bar_chart(per_split("vqa"), title="VQA items per split"),
                ),
                "<h3>Patients per institution and split</h3>",
                table,
            ),
        ]
    )


def _checks(quality: QualityReport, data_docs_href: str | None = None) -> str:
    res = sorted(quality.results, key=lambda r: (r.passed, r.severity != "critical", r.table, r.check))

    def row(r) -> tuple:
        return (_badge(r.passed, r.severity), r.severity, r.table, r.check, r.message, _observed(r.observed))

    failed = [row(r) for r in res if not r.passed]
    passed = [row(r) for r in res if r.passed]
    headers = ["status", "severity", "table", "check", "message", "observed"]
    flagged = sorted(quality.row_flags.items())
    flags_html = (
        (
            "<h3>Flagged rows</h3><p>Rows failing a row-level expectation (at most "
            '<span class="mono">row_level.max_failed_rate</span> of its values: a warning, the release goes '
            'ahead; listed by key in <span class="mono">reports/quality/row_flags/</span>).</p>'
            + _table(["table: check", "rows flagged"], flagged, numeric=[1])
        )
        if flagged
        else ""
    )
    return _section(
        "Quality checks",
        _cards(
            [
                ("checks", len(quality.results)),
                ("critical failures", len(quality.critical_failures)),
                ("warnings", len(quality.warnings)),
                ("passed", sum(r.passed for r in quality.results)),
                ("flagged rows", sum(quality.row_flags.values())),
            ]
        ),
        flags_html,
        (
            f"<p>Per-table suites run as Great Expectations Checkpoints; their validation results are "
            f"in the <a href=\"{_e(data_docs_href)}\">Data Docs</a> (the project's own pages of GX's "
            "validation results: no script, no external resource). "
            'Checks named without <span class="mono">expect_</span> are the '
            "cross-table checks of quality/checks.py.</p>"
            if data_docs_href
            else ""
        ),
        '<h3 id="failed-checks">Failed checks, critical first</h3>'
        + (
            _table(headers, failed, wrap=[3, 4, 5])
            if failed
            else '<p class="empty" id="no-failures">every check passed</p>'
        ),
        f'<details id="passed-checks"><summary>{len(passed)} passed checks</summary>'
        + _table(headers, passed, wrap=[3, 4, 5])
        + "</details>",
    )


def _observed(observed: object) -> _Html:
    """A check's observed figures as ``key: value`` lines (nested values as compact JSON, 400 characters at most)."""
    if not isinstance(observed, dict):
        text = json.dumps(observed, sort_keys=True)
        return _Html(f'<span class="mono">{_e(text[:400])}</span>')
    lines = []
    for k, v in sorted(observed.items()):
        value = v if isinstance(v, str | int | float) else json.dumps(v, sort_keys=True)
        value = str(value) if len(str(value)) <= 120 else str(value)[:120] + " …"
        lines.append(f"{_e(k)}: {_e(value)}")
    return _Html('<span class="mono">' + "<br>".join(lines[:12]) + ("<br>…" if len(lines) > 12 else "") + "</span>")


def _review_index(review: list[dict]) -> dict[str, dict]:
    out = {}
    for i, item in enumerate(review):
        sha = item.get("sha256")
        if not isinstance(sha, str) or len(sha) < 12 or not re.fullmatch(r"[0-9a-fA-F]+", sha):
            raise DashboardInputError("bad_review", f"review item {i} needs a hex sha256 of >= 12 characters")
        if item.get("decision") not in REVIEW_DECISIONS:
            raise DashboardInputError("bad_review", f"review item {i}: decision must be one of {REVIEW_DECISIONS}")
        out[sha.lower()[:12]] = item
    return out


def _quarantine(tables, review: list[dict]) -> str:
    decisions = _review_index(review)
    led = tables["ledger"]  # the safe ledger: no source paths
    cols = {c: led.column(c).to_pylist() for c in SAFE_LEDGER_COLUMNS}
    rows, matched = [], set()
    for k in range(led.num_rows):
        if cols["status"][k] != "quarantined":
            continue
        oid = cols["opaque_id"][k]
        d = decisions.get(oid)
        if d:
            matched.add(oid)
            label = "release after fix" if d["decision"] == "release" else "reject"
            decision = _Html(
                f'<span class="badge {"pass" if d["decision"] == "release" else "fail"}" '
                f'data-decision="{_e(d["decision"])}">{_e(label)}</span>'
            )
        else:
            decision = _Html('<span class="muted" data-decision="pending">pending</span>')
        rows.append(
            (
                _Html(f'<span class="mono" id="q-{_e(oid)}">{_e(oid)}</span>'),
                cols["institution"][k],
                cols["run_id"][k],
                cols["kind"][k],
                cols["stage"][k],
                cols["reason"][k],
                cols["detail"][k],
                decision,
                str(d.get("decided_at", ""))[:10] if d else "",
                d.get("curator", "") if d else "",
                d.get("note", "") if d else "",
            )
        )
    rows.sort(key=lambda r: (str(r[1]), str(r[5]), str(r[0])))
    unmatched = sorted(set(decisions) - matched)
    decided = Counter(decisions[o]["decision"] for o in matched)
    return _section(
        "Quarantine list",
        _cards(
            [
                ("quarantined files", len(rows)),
                ("released", decided["release"]),
                ("rejected", decided["reject"]),
                ("pending review", len(rows) - len(matched)),
                ("review entries matching no file", len(unmatched)),
            ]
        ),
        '<p class="muted">Files are shown by opaque id (first 12 hex digits of the file\'s SHA-256); the '
        "source location is only in the restricted ledger. The next run honours the decisions (a rejected file is "
        'recorded as <span class="mono">curator_rejected</span>, a file released after fix flows on once it '
        "passes).</p>",
        f'<p id="record-decisions"><strong>Record decisions</strong>: {REVIEW_APP_LINK} (served by '
        '<span class="mono">medreco dashboard --serve</span> or the Airflow UI\'s MedReCo review page, behind '
        "their login; this page is read-only, and opened from disk it has no app behind the link).</p>",
        _table(
            ["id", "institution", "run", "kind", "stage", "reason", "detail", "decision", "decided", "curator", "note"],
            rows,
            wrap=[6, 10],
        ),
    )


# ------------------------------------------------------------------------------------------ main


def build_dashboard(
    tables: Mapping[str, pa.Table],
    quality: QualityReport,
    run_info: dict,
    out_dir: Path,
    history: list[dict] | None = None,
    review: list[dict] | None = None,
    *,
    ontology=None,
    data_docs_href: str | None = None,
) -> Path:
    """Write the curator dashboard (static HTML, inline CSS and SVG, no scripts) for one run.

    Parameters
    ----------
    tables : mapping of str to pyarrow.Table
        curated tables and the ledger by name (``schemas.tables.SCHEMAS``); absent tables show as empty.
    quality : QualityReport
        from :func:`quality.checks.run_checks`.
    run_info : dict
        ``run_id`` (required) and scalar facts about the run (shown, except keys naming locations such as
        ``*path*``, ``*uri*``, ``*root*``); ``deid_audit``: a (nested) dict of de-identification counts
        (per action, verification failures, burned-in quarantines, ...), rendered as given; ``withheld_reports``: report
        records the run withheld, per reason (``{"unsupported_language": 3}``; shown on the overview).
    out_dir : pathlib.Path
        folder to write (created); existing dashboard pages are overwritten.
    history : list of dict, optional
        earlier runs, oldest first: ``{"run_id", "ingested", "quarantined", "duplicate", "skipped", ...}``
        (any other numeric keys are tabulated). The current run is appended from the ledger if absent.
    review : list of dict, optional
        curator decisions ``{"sha256", "decision": "release" | "reject", "note"}``; ``sha256`` may be the
        full digest or its first >= 12 hex digits.
    ontology : schemas.ontology.Ontology, optional
        for entity names in the heat map (default: the packaged ontology).
    data_docs_href : str, optional
        link to the Great Expectations Data Docs index, relative to the dashboard (shown on the checks page).

    Returns
    -------
    pathlib.Path
        ``out_dir / "index.html"``; the other pages are siblings (see :data:`PAGES`).

    Raises
    ------
    DashboardInputError
        ``missing_run_id`` without ``run_info["run_id"]``; ``bad_history`` for a history entry without
        ``run_id``; ``bad_review`` for a review entry without a hex sha256 or with an unknown decision.
    KeyError
        for a table name outside ``schemas.tables.SCHEMAS``.
    """
    if not run_info.get("run_id"):
        raise DashboardInputError("missing_run_id", "run_info must contain a non-empty run_id")
    for i, h in enumerate(history or []):
        if not isinstance(h, Mapping) or not h.get("run_id"):
            raise DashboardInputError("bad_history", f"history entry {i} has no run_id")
    unknown = sorted(set(tables) - set(SCHEMAS))
    if unknown:
        raise KeyError(f"unknown_table: {unknown} are not in schemas.tables.SCHEMAS")
    ontology = ontology or load_ontology()
    _review_index(review or [])  # validate before writing anything
    tables = {**tables, "ledger": safe_ledger(tables.get("ledger"))}
    run_id = str(run_info["run_id"])
    subtitle = (
        f"{len(quality.critical_failures)} critical failure(s), {len(quality.warnings)} warning(s)"
        if quality.results
        else "no quality checks recorded"
    )
    bodies = {
        "index.html": _overview(tables, quality, run_info, list(history or [])),
        "deid.html": _deid(tables, quality, run_info),
        "images.html": _images(tables),
        "reports.html": _reports(tables, ontology),
        "pairs.html": _pairs_vqa(tables),
        "splits.html": _splits(tables),
        "checks.html": _checks(quality, data_docs_href),
        "quarantine.html": _quarantine(tables, list(review or [])),
        "training.html": TRAINING_PENDING,
    }
    template = Template(TEMPLATE_FILE.read_text(encoding="utf-8"))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for page, title in PAGES:
        nav = "".join(f'<a href="{p}"{_HERE if p == page else ""}>{_e(t)}</a>' for p, t in PAGES)
        nav += f'<a href="{_e(data_docs_href)}" id="data-docs-nav">Data Docs</a>' if data_docs_href else ""
        nav += REVIEW_LINK
        doc = template.substitute(
            release=RELEASE_PENDING,
            site="MedReCo-DB curator dashboard",
            title=_e(title),
            run_id=_e(run_id),
            subtitle=_e(subtitle),
            nav=nav,
            body=bodies[page],
        )
        (out_dir / page).write_text(doc, encoding="utf-8")
    return out_dir / "index.html"


def stamp_release(storage: Storage, version: str, content_hash: str) -> int:
    """Name the release a run published in the header of every dashboard page (the pages are built by the quality
    stage, before the release exists), and fill the Training page when that release's training is already recorded
    (:func:`quality.training_page.stamp_training`). Returns the number of pages stamped.

    Parameters
    ----------
    storage : etl.storage.Storage
        the build's storage root (pages under ``reports/dashboard/``).
    version, content_hash : str
        the release (``MAJOR.MINOR.PATCH``, 64 hex).
    """
    from etl import zones
    from quality.page_kit import release_label

    stamped = 0
    slot = re.compile(r"<!--release-->.*?<!--/release-->")
    for rel in storage.list_files(zones.DASHBOARD_DIR):
        if not rel.endswith(".html"):
            continue
        page = storage.read_text(rel)
        new, n = slot.subn(lambda _: release_label(version, content_hash), page, count=1)
        if n:
            storage.write_text(rel, new)
            stamped += 1
    stamp_training(storage, version)
    return stamped
