"""The curator web app (FastAPI): the static dashboard and Data Docs, plus the quarantine review page where a
curator records a decision with a click.

Served on 127.0.0.1 by ``medreco dashboard --serve`` and registered in the Airflow UI by the plugin of
``plugins/medreco_review_plugin.py`` (Airflow 3 ``fastapi_apps``). Routes (relative to where it is mounted):

- ``GET /`` redirects to ``dashboard/index.html``; ``GET /dashboard/<page>`` and ``GET /data_docs/<page>``
  serve ``reports/dashboard/`` and ``reports/data_docs/`` of the storage root, ``GET /training/<version>.html``
  the training pages of ``reports/training/`` (pages only, not the JSON records);
- ``GET /review``: every quarantined file of the latest run (opaque id, reason, PHI-scrubbed detail) with
  its decision, curator and note, and a form per file (a free-text note, two buttons: release after fix,
  reject); ``POST /review/<id>`` (form: ``decision``, ``note``) records it with the logged-in curator and
  redirects back;
- ``GET /review/<id>`` and ``GET /review/<id>/preview.png``: a file quarantined ``burned_in_text_remaining`` or
  ``defacing_failed`` shown as its de-identified pixels stood when the check failed, the failed boxes drawn
  (:func:`quality.review.preview_png`, from the restricted ledger zone; 404 for a file without one);
- ``GET /api/quarantine`` (JSON list) and ``POST /api/decisions`` (JSON ``{"id", "decision", "note"}``).

It never reads the source zone: items come from the ledger through :func:`quality.review.quarantine_items`
(no paths), pages from the reports zone. Every request is authenticated (:mod:`quality.review_auth`: the review
token of the served app, Airflow's login in the plugin; 401/403 otherwise) and checked by a
:class:`quality.review_auth.RequestGuard` (Host, Origin, frame and content-security headers); every decision
carries the authenticated curator and is appended to the restricted audit trail
(:func:`quality.review.record_decision`).
"""

from __future__ import annotations

import html
import mimetypes
from collections.abc import Callable

from fastapi import FastAPI, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response

from etl import zones
from etl.storage import Storage, StorageError
from quality.page_kit import PAGES
from quality.review import ReviewError, preview_png, quarantine_items, record_decision
from quality.review_auth import Authenticator, RequestGuard

_ZONES = {"dashboard": zones.DASHBOARD_DIR, "data_docs": zones.DATA_DOCS_DIR, "training": zones.TRAINING_DIR}
#: zones served as pages only (the training records beside them name checkpoint folders and storage URIs)
_HTML_ONLY = {"training"}
_STYLE = """body{margin:0;font:14px/1.45 system-ui,sans-serif;color:#1d2430;background:#f6f7fa}
header{background:#18263d;color:#fff;padding:12px 24px}header h1{font-size:18px;margin:0}
header .sub{color:#b8c4d8;font-size:12px}
nav{background:#223554;padding:0 24px}nav a{color:#d6e0f0;text-decoration:none;display:inline-block;padding:8px 12px}
nav a.here{background:#f6f7fa;color:#1d2430;border-radius:4px 4px 0 0}td{overflow-wrap:break-word}
input[type=text]{font-size:12px;width:14em;margin-right:4px}
main{padding:16px 24px}table{border-collapse:collapse;font-size:13px;background:#fff}
th,td{border-bottom:1px solid #d9dee7;padding:4px 10px;text-align:left}th{background:#eef1f6}
.mono{font-family:ui-monospace,monospace;font-size:12px}form{display:inline}
button{font-size:12px;padding:2px 8px;margin-right:4px;cursor:pointer}
.pending{color:#5b6576}.release{color:#2e7d4f;font-weight:600}.reject{color:#b3261e;font-weight:600}
.error{background:#fdecea;border:1px solid #b3261e;padding:6px 10px;color:#7a1a14}
td.preview img{display:block;box-sizing:border-box;max-width:160px;height:auto;border:1px solid #d9dee7}
figure{margin:0 0 16px}figure img{max-width:100%;height:auto;border:1px solid #d9dee7;background:#18263d}
figcaption{font-size:12px;color:#5b6576}
@media (max-width:1000px){table.queue,table.queue tbody,table.queue tr,table.queue td{display:block;width:auto}
table.queue thead{display:none}table.queue tr{border:1px solid #d9dee7;margin-bottom:10px;background:#fff}
table.queue td{border:0;padding:2px 10px}table.queue td::before{content:attr(data-label) ": ";color:#5b6576}
table.queue td.preview::before,table.queue td.record::before{content:""}}"""
_COLUMNS = ("id", "institution", "kind", "stage", "reason", "detail", "preview", "decision", "decided", "curator")


def _e(v) -> str:
    return html.escape("" if v is None else str(v), quote=True)


def review_page(
    items: list[dict],
    request: Request,
    message: str = "",
    curator: str = "",
    error: str = "",
    kept: tuple[str, str] = ("", ""),
) -> str:
    """The quarantine review page (HTML): one row per item with its decision, who made it, the note, and a form
    (a free-text note and the two decision buttons).

    Parameters
    ----------
    items : list of dict
        :func:`quality.review.quarantine_items`.
    request : fastapi.Request
        for the app's own URLs (the page works wherever the app is mounted).
    message : str
        a status line (the last decision recorded).
    curator : str
        the logged-in curator (shown: the name every decision from this page will carry).
    error : str
        why the last decision was not recorded (shown as an alert above the table).
    kept : (str, str)
        the item id and note of a refused decision: the note is put back in that item's form, to correct and
        send again.
    """
    rows = []
    for i in items:
        action = _e(request.url_for("post_decision", item_id=i["id"]).path)
        buttons = "".join(
            f'<button type="submit" name="decision" value="{d}" id="{d}-{_e(i["id"])}">{label}</button>'
            for d, label in (("release", "Release after fix"), ("reject", "Reject"))
        )
        value = f' value="{_e(kept[1])}"' if kept[0] == i["id"] and kept[1] else ""
        form = (
            f'<form method="post" action="{action}"><input type="text" name="note" maxlength="200" '
            f'id="note-{_e(i["id"])}" placeholder="note (letters and punctuation)"{value} '
            f'aria-label="note on {_e(i["id"])}">{buttons}</form>'
        )
        preview = ""
        if i.get("preview"):
            src = _e(request.url_for("preview", item_id=i["id"]).path)
            page = _e(request.url_for("preview_page", item_id=i["id"]).path)
            preview = (
                f'<a href="{page}" id="preview-{_e(i["id"])}"><img src="{src}" width="160" '
                f'alt="de-identified pixels of {_e(i["id"])}, failed boxes in red"></a>'
            )
        rows.append(
            f'<tr id="item-{_e(i["id"])}"><td class="mono" data-label="id">{_e(i["id"])}</td>'
            f'<td data-label="institution">{_e(i["institution"])}</td>'
            f'<td data-label="kind">{_e(i["kind"])}</td><td data-label="stage">{_e(i["stage"])}</td>'
            f'<td data-label="reason">{_e(i["reason"])}</td><td data-label="detail">{_e(i["detail"])}</td>'
            f'<td class="preview" data-label="preview">{preview}</td>'
            f'<td class="{_e(i["decision"])}" data-label="decision" data-decision="{_e(i["decision"])}">'
            f'{_e(i["decision"])}</td><td data-label="decided">{_e(str(i.get("decided_at") or "")[:10])}</td>'
            f'<td data-label="curator" data-curator>{_e(i.get("curator") or "")}</td>'
            f'<td data-label="note" data-note>{_e(i.get("note") or "")}</td><td class="record">{form}</td></tr>'
        )
    pending = sum(i["decision"] == "pending" for i in items)
    head = "".join(f"<th>{c}</th>" for c in (*_COLUMNS, "note", "record"))
    body = (
        f'<table class="queue"><thead><tr>{head}</tr></thead><tbody>'
        + ("".join(rows) or f'<tr><td colspan="{len(_COLUMNS) + 2}">no quarantined files</td></tr>')
        + "</tbody></table>"
    )
    nav = "".join(
        f'<a href="{_e(request.url_for("zone_file", zone="dashboard", path=page).path)}">{_e(title)}</a>'
        for page, title in PAGES
    )
    docs = _e(request.url_for("zone_file", zone="data_docs", path="index.html").path)
    note = f'<p role="status">{_e(message)}</p>' if message else ""
    note += f'<p role="alert" class="error" id="error">{_e(error)}</p>' if error else ""
    who = f' · signed in as <span class="mono" id="curator">{_e(curator)}</span>' if curator else ""
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,">'
        f"<title>Quarantine review · MedReCo-DB</title><style>{_STYLE}</style></head><body><header>"
        f'<h1>MedReCo-DB quarantine review</h1><div class="sub">curator review{who}</div></header>'
        f'<nav>{nav}<a href="{docs}">Data Docs</a><a class="here" href="">Quarantine review</a></nav><main>{note}'
        f"<p>{len(items)} quarantined files of the latest run, {pending} pending. A decision is stored in "
        '<span class="mono">reports/quarantine_review.json</span> with your name and note, appended to the '
        "audit trail, and honoured by the next run: a rejected "
        'file stays out for good (<span class="mono">curator_rejected</span>); a file released after fix '
        "flows on once the fix lets it pass. Files are shown by opaque id only; notes take letters and "
        "punctuation (no digits: no date, id or phone number can be typed in). A file quarantined for burned-in "
        "text still read, or a face that could not be removed, shows its de-identified pixels as they stood when "
        "the check failed, the failed boxes in red (blanked text in cyan): open it to judge. Those pixels may "
        "still show identifying text or a face: they stay in this restricted app.</p>"
        f"{body}</main></body></html>"
    )


def preview_page(item: dict, request: Request) -> str:
    """One quarantined file's preview at full size, with its reason and detail (HTML)."""
    src = _e(request.url_for("preview", item_id=item["id"]).path)
    back = _e(request.url_for("review").path)
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,">'
        f"<title>Preview {_e(item['id'])} · MedReCo-DB</title><style>{_STYLE}</style></head><body><header>"
        f'<h1>Quarantined file <span class="mono">{_e(item["id"])}</span></h1><div class="sub">'
        f"{_e(item['reason'])} · {_e(item['institution'])}</div></header>"
        f'<nav><a href="{back}">Quarantine review</a></nav><main><figure><img id="preview" src="{src}" '
        f'alt="de-identified pixels of {_e(item["id"])}, failed boxes in red"><figcaption>{_e(item["detail"])}. '
        "Red: the boxes that failed the check; cyan: text blanked. Restricted: may still show identifying text or a "
        f"face.</figcaption></figure></main></body></html>"
    )


def create_app(
    storage: Storage | Callable[[], Storage], *, authenticate: Authenticator, guard: RequestGuard
) -> FastAPI:
    """Build the curator app.

    Parameters
    ----------
    storage : etl.storage.Storage or callable returning one
        the build's storage root; a callable is called per request (the Airflow plugin opens the root of
        ``$MEDRECO_CONFIG`` only when a page is asked for).
    authenticate : async callable(request) -> str
        the curator identity of a request, raising ``HTTPException`` 401/403 (:class:`quality.review_auth.TokenAuth`,
        :func:`quality.review_auth.airflow_curator`); required: the app has no anonymous access.
    guard : quality.review_auth.RequestGuard
        allowed hosts and frame policy.

    Returns
    -------
    fastapi.FastAPI
    """
    get_storage = storage if callable(storage) else (lambda: storage)
    app = FastAPI(title="MedReCo-DB curator dashboard", docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def _secure(request: Request, call_next):
        try:
            guard.check(request)  # Host first: a rebinding page learns nothing, not even the login prompt
            request.state.curator = await authenticate(request)
        except HTTPException as err:
            response: Response = PlainTextResponse(
                str(err.detail), status_code=err.status_code, headers=err.headers or None
            )
        else:
            response = await call_next(request)
        for name, value in guard.headers(request.url.path).items():
            response.headers[name] = value
        return response

    @app.get("/", include_in_schema=False)
    def root(request: Request) -> RedirectResponse:
        return RedirectResponse(request.url_for("zone_file", zone="dashboard", path="index.html").path, 307)

    @app.get("/review", response_class=HTMLResponse, name="review")
    def review(request: Request, message: str = "") -> HTMLResponse:
        return HTMLResponse(
            review_page(quarantine_items(get_storage()), request, message[:200], curator=request.state.curator)
        )

    @app.get("/review/{item_id}/preview.png", name="preview")
    def preview(item_id: str) -> Response:
        try:
            data = preview_png(get_storage(), item_id)
        except ReviewError as err:
            raise HTTPException(404, str(err)) from None
        return Response(data, media_type="image/png")

    @app.get("/review/{item_id}", response_class=HTMLResponse, name="preview_page")
    def preview_item(request: Request, item_id: str) -> HTMLResponse:
        item = {i["id"]: i for i in quarantine_items(get_storage())}.get(item_id.lower())
        if item is None or not item["preview"]:
            raise HTTPException(404, f"no preview for {item_id!r} in the latest run")
        return HTMLResponse(preview_page(item, request))

    @app.post("/review/{item_id}", name="post_decision")
    def post_decision(request: Request, item_id: str, decision: str = Form(...), note: str = Form("")) -> Response:
        storage = get_storage()
        try:
            entry = record_decision(storage, item_id, decision, note, curator=request.state.curator)
        except ReviewError as err:
            if err.reason == "unknown_item":
                raise HTTPException(404, str(err)) from None
            # a refused note or decision: the page again, saying why, with the note back in its form
            page = review_page(
                quarantine_items(storage),
                request,
                curator=request.state.curator,
                error=f"{item_id}: not recorded: {err.detail}",
                kept=(item_id, note[:200]),
            )
            return HTMLResponse(page, status_code=400)
        url = request.url_for("review").include_query_params(message=f"{item_id}: {entry['decision']} recorded")
        return RedirectResponse(str(url.path) + "?" + url.query, 303)

    @app.get("/api/quarantine")
    def api_items() -> JSONResponse:
        return JSONResponse(quarantine_items(get_storage()))

    @app.post("/api/decisions")
    async def api_decision(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            raise HTTPException(400, "expected a JSON object") from None
        if not isinstance(body, dict):
            raise HTTPException(400, "expected a JSON object")
        try:
            entry = record_decision(
                get_storage(),
                str(body.get("id", "")),
                str(body.get("decision", "")),
                str(body.get("note", "")),
                curator=request.state.curator,
            )
        except ReviewError as err:
            raise HTTPException(404 if err.reason == "unknown_item" else 400, str(err)) from None
        return JSONResponse(
            {
                "id": entry["sha256"][:12],
                "decision": entry["decision"],
                "decided_at": entry["decided_at"],
                "curator": entry["curator"],
            }
        )

    @app.get("/{zone}/{path:path}", name="zone_file")
    def zone_file(zone: str, path: str) -> Response:
        if zone not in _ZONES or any(part in ("", "..", ".") for part in path.split("/")):
            raise HTTPException(404, "not found")
        if zone in _HTML_ONLY and not path.endswith(".html"):
            raise HTTPException(404, "not found")
        try:
            data = get_storage().read_bytes(f"{_ZONES[zone]}/{path}")
        except StorageError:
            raise HTTPException(404, f"{zone}/{path} not found (run the build first)") from None
        media = mimetypes.guess_type(path)[0] or "application/octet-stream"
        return Response(data, media_type=media)

    return app
