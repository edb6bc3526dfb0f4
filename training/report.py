"""The training page of a snapshot: ``reports/training/<version>.html`` beside the JSON training record.

A static, self-contained HTML page (no scripts, every value escaped) with, per finished job, the evaluation in the
paper's cells: retrieval Recall@k / NDCG@k per modality family x entity category and split, VQA accuracy per
question type, per modality family and for longitudinal change; plus the checkpoint kept by the best metric.
(Training sits beside ``quality`` in the layers, so the page has its own small HTML helpers.)
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence


def esc(value) -> str:
    """HTML-escaped text of a value (None as empty)."""
    return html.escape("" if value is None else str(value))


def _fmt(v) -> str:
    if v is None:
        return "–"
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def table(headers: Sequence[str], rows: Iterable[Sequence], numeric: Iterable[int] = ()) -> str:
    """An HTML table, ``numeric`` columns right-aligned (floats to 4 decimals, None as a dash)."""
    num = set(numeric)
    head = "".join(
        f'<th class="num">{esc(h)}</th>' if i in num else f"<th>{esc(h)}</th>" for i, h in enumerate(headers)
    )
    body = [
        "<tr>"
        + "".join(f'<td class="num">{esc(_fmt(v))}</td>' if i in num else f"<td>{esc(v)}</td>" for i, v in enumerate(r))
        + "</tr>"
        for r in rows
    ]
    if not body:
        body = [f'<tr><td colspan="{len(headers)}" class="empty">none</td></tr>']
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def section(title: str, *content: str) -> str:
    """A ``<section>`` with a heading and trusted HTML content."""
    return f"<section><h2>{esc(title)}</h2>{''.join(content)}</section>"


_STYLE = (
    "body{font-family:sans-serif;margin:2em;color:#1b1f24}table{border-collapse:collapse;margin:.5em 0 1.5em}"
    "td,th{border:1px solid #d0d7de;padding:3px 8px}td.num,th.num{text-align:right}td.empty{color:#8a94a6}"
)


def _metric_order(name: str) -> tuple:
    """Recall@k by k, then NDCG@k (records are stored with sorted keys: ``NDCG@10`` would come first)."""
    kind, _, k = name.partition("@")
    return (kind != "R", int(k) if k.isdigit() else 0, name)


def _retrieval(ev: dict) -> str:
    out = []
    for split, res in ev.items():
        if not isinstance(res, dict) or "cells" not in res:
            continue
        names = sorted(res["cells_mean"], key=_metric_order)
        rows = [
            [cell, c["n_queries"], c["gallery"], *[c.get(n) for n in names]] for cell, c in sorted(res["cells"].items())
        ]
        rows.append(["mean of cells", res["n_queries"], res["gallery"], *[res["cells_mean"][n] for n in names]])
        out.append(
            f"<h3>{esc(split)}</h3>"
            + table(["family | category", "queries", "gallery", *names], rows, numeric=range(1, 3 + len(names)))
        )
    return "".join(out) or "<p>no retrieval evaluation</p>"


def _vqa(ev: dict) -> str:
    out = []
    for split, res in ev.items():
        if not isinstance(res, dict) or "by_family" not in res:
            continue
        rows = [["all", "all", res["n_mc"], res["mc_accuracy"]]]
        rows += [["all", t, v["n_mc"], v["mc_accuracy"]] for t, v in sorted(res["by_question_type"].items())]
        rows += [[f, "all", v["n_mc"], v["mc_accuracy"]] for f, v in sorted(res["by_family"].items())]
        rows += [[*k.split("|", 1), v["n_mc"], v["mc_accuracy"]] for k, v in sorted(res["by_family_and_type"].items())]
        rows += [
            [f, "longitudinal change", v["n_mc"], v["mc_accuracy"]]
            for f, v in sorted(res["longitudinal_change"].items())
        ]
        out.append(
            f"<h3>{esc(split)}</h3>" + table(["family", "question type", "items", "accuracy"], rows, numeric=(2, 3))
        )
    return "".join(out) or "<p>no VQA evaluation</p>"


def render_training_page(record: dict) -> str:
    """HTML of a training record (:func:`training.pipeline.record_runs`'s dict).

    Returns
    -------
    str
        a complete HTML document.
    """
    parts = []
    for job, h in sorted(record["jobs"].items()):
        lin = h.get("lineage_record") or {}
        m = lin.get("metrics") or {}
        head = table(
            ["status", "launcher", "steps", "images/s", "best"],
            [
                [
                    h.get("status"),
                    h.get("launcher"),
                    m.get("step"),
                    m.get("images_per_s"),
                    (
                        f"{m['best']['metric']} = {m['best']['value']:.4f} at step {m['best']['step']}"
                        if m.get("best")
                        else ""
                    ),
                ]
            ],
            numeric=(2, 3),
        )
        body = _retrieval(m.get("eval") or {}) if job == "encoder" else _vqa(m.get("eval") or {})
        parts.append(section(f"{job}", head, body))
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>training "
        f"{esc(record['snapshot_version'])}</title><style>{_STYLE}</style></head><body>"
        f"<h1>Training on snapshot {esc(record['snapshot_version'])}</h1>"
        f"<p>content hash {esc(record['content_hash'])}</p>{''.join(parts)}</body></html>"
    )
