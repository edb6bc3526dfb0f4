"""The dashboard's Training page: the training metrics of the release the dashboard's run published.

The quality stage builds the dashboard ahead of publishing and training, so the page starts with a placeholder
(:data:`TRAINING_PENDING`); when the training jobs of a release record their results
(``reports/training/<version>.json``, written by ``training.pipeline.record_runs``), :func:`stamp_training` fills it
with the record, if the dashboard still shows that release. Shown, per job: status, steps, throughput and the metric
that chose the best checkpoint; for the encoder, per evaluation split, the paper's 12 retrieval settings (modality
family x entity category) with Recall@k and NDCG@k, their mean and the micro average over all queries; for the VLM,
per split, multiple-choice accuracy per question type, per modality family, per family and type, and the
longitudinal change accuracy separately. Every value is escaped; no path beyond a checkpoint's file name is shown.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from etl import zones
from etl.storage import Storage
from quality.page_kit import Html, cards, esc, release_label, section, table
from schemas.ontology import CATEGORIES, FAMILIES

#: the dashboard page of this module
PAGE = "training.html"
_SLOT = re.compile(r"<!--training-->.*?<!--/training-->", re.DOTALL)
#: the page's body before the release's training jobs have recorded anything
TRAINING_PENDING = (
    "<!--training-->"
    + section(
        "Training",
        '<p class="empty" id="training-pending">No training metrics for this run\'s release yet: the training jobs '
        'write <span class="mono">reports/training/&lt;version&gt;.json</span> and fill this page.</p>',
    )
    + "<!--/training-->"
)


def _metric(v) -> str:
    """A metric for a table cell: 3 decimals, a dash when the cell has no queries or items."""
    return "–" if v is None else f"{float(v):.3f}"


def _best(metrics: Mapping) -> Html:
    best = metrics.get("best")
    if not best:
        return Html('<span class="muted">no best metric set (<span class="mono">optim.best_metric</span>)</span>')
    name = str(best.get("checkpoint") or "").rsplit("/", 1)[-1]
    return Html(
        f'<span class="mono">{esc(best.get("metric"))}</span> = {esc(_metric(best.get("value")))} at step '
        f'{esc(best.get("step"))} (<span class="mono">{esc(name)}</span>)'
    )


def _metric_order(name: str) -> tuple:
    """Recall@k by k, then NDCG@k (records are stored with sorted keys: ``NDCG@10`` would come first)."""
    kind, _, k = name.partition("@")
    return (kind != "R", int(k) if k.isdigit() else 0, name)


def _cell_order(key: str) -> tuple:
    """The ontology's family order, then anatomy, finding, condition."""
    fam, _, cat = key.partition("|")
    return (
        FAMILIES.index(fam) if fam in FAMILIES else len(FAMILIES),
        fam,
        CATEGORIES.index(cat) if cat in CATEGORIES else len(CATEGORIES),
        cat,
    )


def _retrieval(ev: Mapping) -> str:
    out = []
    for split, res in ev.items():
        if not isinstance(res, Mapping) or "cells" not in res:
            continue
        names = sorted(res.get("cells_mean") or {}, key=_metric_order)
        rows = []
        for key in sorted(res["cells"], key=_cell_order):
            c = res["cells"][key]
            family, _, category = key.partition("|")
            rows.append([family, category, c.get("n_queries"), c.get("gallery"), *[_metric(c.get(n)) for n in names]])
        rows.append(
            [
                "mean of cells",
                "",
                res.get("n_queries"),
                res.get("gallery"),
                *[_metric(res["cells_mean"][n]) for n in names],
            ]
        )
        micro = res.get("micro") or {}
        rows.append(
            [
                "all queries (micro)",
                "",
                res.get("n_queries"),
                res.get("gallery"),
                *[_metric(micro.get(n)) for n in names],
            ]
        )
        out.append(
            f'<h3 id="retrieval-{esc(split)}">Retrieval · {esc(split)}</h3>'
            + table(
                ["modality family", "entity category", "queries", "gallery", *names],
                rows,
                numeric=range(2, 4 + len(names)),
            )
        )
    return "".join(out) or '<p class="empty">no retrieval evaluation</p>'


def _acc_rows(cells: Mapping, split_key: bool = False) -> list[list]:
    rows = []
    for key, v in sorted(cells.items()):
        head = key.split("|", 1) if split_key else [key]
        rows.append([*head, v.get("n_mc"), _metric(v.get("mc_accuracy"))])
    return rows


def _vqa(ev: Mapping) -> str:
    out = []
    for split, res in ev.items():
        if not isinstance(res, Mapping) or "by_family" not in res:
            continue
        by_type = [["all", res.get("n_mc"), _metric(res.get("mc_accuracy"))]] + _acc_rows(res["by_question_type"])
        out.append(
            f'<h3 id="vqa-{esc(split)}">VQA · {esc(split)}</h3>'
            + '<div class="row"><div>'
            + table(["question type", "MC items", "MC accuracy"], by_type, numeric=(1, 2))
            + "</div><div>"
            + table(["modality family", "MC items", "MC accuracy"], _acc_rows(res["by_family"]), numeric=(1, 2))
            + "</div><div>"
            + table(
                ["modality family", "question type", "MC items", "MC accuracy"],
                _acc_rows(res["by_family_and_type"], split_key=True),
                numeric=(2, 3),
            )
            + "</div><div>"
            + table(
                ["modality family", "longitudinal change items", "change accuracy"],
                _acc_rows(res["longitudinal_change"]),
                numeric=(1, 2),
            )
            + "</div></div>"
        )
    return "".join(out) or '<p class="empty">no VQA evaluation</p>'


def training_section(record: Mapping) -> str:
    """The Training page's body for a training record (``reports/training/<version>.json``: ``snapshot_version``,
    ``content_hash``, ``jobs``: job -> handle with ``status``, ``launcher``, ``name`` and ``lineage_record``
    (``metrics``: ``step``, ``images_per_s``, ``best``, ``eval``) or None while the job runs).

    Returns
    -------
    str
        trusted HTML between the page's ``<!--training-->`` markers (markers included).
    """
    version = record.get("snapshot_version")
    jobs = record.get("jobs") or {}
    summary, bodies = [], []
    for job, h in sorted(jobs.items()):
        lin = h.get("lineage_record") or {}
        m = lin.get("metrics") or {}
        ips = m.get("images_per_s")
        summary.append(
            [job, h.get("name"), h.get("status"), m.get("step"), None if ips is None else round(ips, 1), _best(m)]
        )
        ev = m.get("eval") or {}
        if not lin:
            body = '<p class="empty">no metrics yet (the job has not finished)</p>'
        elif job == "encoder":
            body = _retrieval(ev)
        else:
            body = _vqa(ev)
        bodies.append(
            section(
                f"{job}: final evaluation at step {m.get('step')}" if lin else job,
                f'<div id="training-{esc(job)}">{body}</div>',
            )
        )
    head = section(
        f"Training on release {version}",
        cards([(f"{j} status", h.get("status")) for j, h in sorted(jobs.items())]),
        table(["job", "name", "status", "steps", "images/s", "best checkpoint by"], summary, numeric=(3, 4)),
        f'<p class="muted">Record <span class="mono">reports/training/{esc(version)}.json</span>; all cells also on '
        f'<a href="../training/{esc(version)}.html">the training page of the release</a>. A cell without queries '
        "or items shows a dash.</p>",
    )
    return "<!--training-->" + head + "".join(bodies) + "<!--/training-->"


def stamp_training(storage: Storage, version: str) -> bool:
    """Fill the dashboard's Training page with the training record of ``version``.

    Parameters
    ----------
    storage : etl.storage.Storage
        the storage root (``reports/dashboard/training.html``, ``reports/training/<version>.json``).
    version : str
        the release whose training was recorded.

    Returns
    -------
    bool
        True when the page was filled; False when there is no dashboard page, no record, or the dashboard shows
        another release (a later build rebuilt it; the release's own page ``reports/training/<version>.html``
        keeps the cells).
    """
    page_rel = f"{zones.DASHBOARD_DIR}/{PAGE}"
    rec_rel = zones.training_record(version)
    if not storage.is_file(page_rel) or not storage.is_file(rec_rel):
        return False
    record = json.loads(storage.read_text(rec_rel))
    page = storage.read_text(page_rel)
    if release_label(version, str(record.get("content_hash") or "")) not in page:
        return False
    new, n = _SLOT.subn(lambda _: training_section(record), page, count=1)
    if n:
        storage.write_text(page_rel, new)
    return bool(n)
