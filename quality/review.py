"""Quarantine review: the quarantined files of the latest run and the decisions curators record on them.

Decisions go to ``reports/quarantine_review.json`` (:data:`etl.pipeline.ledger.REVIEW_FILE`), which the next run's
ledger honours (:func:`etl.pipeline.ledger.apply_review`). Items are shown by opaque id (the first 12 hex digits
of the file's SHA-256) with institution, stage, reason code and the PHI-scrubbed detail of
:func:`quality.dashboard.safe_ledger`: never a source path, never a value from a file.
"""

from __future__ import annotations

import datetime as dt
import json
import re

import pyarrow as pa

from etl import zones
from etl.deid.preview import PREVIEW_REASONS
from etl.pipeline.ledger import REVIEW_DECISIONS, REVIEW_FILE, load_review
from etl.storage import Storage
from schemas.errors import ReasonCodedError
from schemas.ledger import SCHEMA as LEDGER_SCHEMA

_NOTE_MAX = 200
_NOTE_OK = re.compile(r"^[A-Za-z .,;:()/_+-]*$")  # no digits, no @, no ^: nothing shaped like a date, id or name
#: a curator identity (the served app's login name, an Airflow user name): letters, digits and ``. _ @ + -``, and
#: single spaces between them ("Anne Smith"), at most 64 characters
CURATOR_RE = re.compile(r"(?=.{1,64}$)[A-Za-z0-9](?:[A-Za-z0-9._@+-]| (?=[A-Za-z0-9]))*")
#: the append-only audit trail of decisions (restricted: who decided what, when, why)
AUDIT_DIR = f"{zones.LEDGER}/review_audit"


class ReviewError(ReasonCodedError, ValueError):
    """A decision that cannot be recorded, or a preview that cannot be shown; ``reason``: ``unknown_item``,
    ``bad_decision``, ``bad_note``, ``bad_curator`` or ``no_preview``."""


LATEST_RUN_FILE = zones.LATEST_QUALITY_RUN


def latest_ledger_path(storage: Storage) -> str | None:
    """The ledger of the run the dashboard shows (``reports/quality/latest_run.json``, written by the quality
    stage), else of the greatest run id; None when no run has a ledger."""
    if storage.is_file(LATEST_RUN_FILE):
        run = json.loads(storage.read_text(LATEST_RUN_FILE))["run_id"]
        if storage.is_file(zones.ledger_file(run)):
            return zones.ledger_file(run)
    runs = [p for p in storage.list_files("ledger") if p.endswith("/ledger.parquet") and "run_id=" in p]
    return max(runs) if runs else None


def quarantine_items(storage: Storage) -> list[dict]:
    """Every quarantined file of the latest run with its decision (``"pending"`` when none).

    Returns
    -------
    list of dict
        ``{"id", "run_id", "institution", "kind", "stage", "reason", "detail", "decision", "decided_at",
        "note", "curator", "preview"}``, sorted by institution, reason and id; ``id`` is ``sha256[:12]``;
        ``preview`` is True when the file (``burned_in_text_remaining``, ``defacing_failed``) has a preview of its
        pixels (:func:`preview_png`).
    """
    from quality.dashboard import safe_ledger

    path = latest_ledger_path(storage)
    if path is None:
        return []
    ledger = safe_ledger(storage.read_table(path, schema=LEDGER_SCHEMA))
    decisions = {d["sha256"][:12]: d for d in load_review(storage)}
    previews = {p.rsplit("/", 1)[-1][:12] for p in storage.list_files(zones.PREVIEWS_DIR) if p.endswith(".png")}
    out = []
    for r in ledger.filter(pa.compute.equal(ledger["status"], "quarantined")).to_pylist():
        d = decisions.get(r["opaque_id"], {})
        out.append(
            {
                "id": r["opaque_id"],
                "run_id": r["run_id"],
                "institution": r["institution"],
                "kind": r["kind"],
                "stage": r["stage"],
                "reason": r["reason"],
                "detail": r["detail"],
                "decision": d.get("decision", "pending"),
                "decided_at": d.get("decided_at"),
                "note": d.get("note", ""),
                "curator": d.get("curator", ""),
                "preview": r["reason"] in PREVIEW_REASONS and r["opaque_id"] in previews,
            }
        )
    return sorted(out, key=lambda i: (str(i["institution"]), str(i["reason"]), i["id"]))


def preview_png(storage: Storage, item_id: str) -> bytes:
    """The preview PNG of one quarantined file of the latest run (:mod:`etl.deid.preview`: the de-identified
    pixels as they stood when the check failed, the failed boxes drawn red). Restricted: the pixels may still show
    PHI; only the review app serves it, behind its login.

    Raises
    ------
    ReviewError
        ``unknown_item`` when no quarantined file of the latest run has that id, ``no_preview`` when it has none
        (another reason, or a build before previews were stored).
    """
    item = {i["id"]: i for i in quarantine_items(storage)}.get(str(item_id).lower())
    if item is None:
        raise ReviewError("unknown_item", f"no quarantined file with id {item_id!r} in the latest run")
    if not item["preview"]:
        raise ReviewError("no_preview", f"no preview for {item['id']} (reason {item['reason']})")
    sha = next(
        p.rsplit("/", 1)[-1].removesuffix(".png")
        for p in storage.list_files(zones.PREVIEWS_DIR)
        if p.rsplit("/", 1)[-1].startswith(item["id"])
    )
    return storage.read_bytes(zones.quarantine_preview(sha))


def record_decision(
    storage: Storage, item_id: str, decision: str, note: str = "", curator: str = "", now: dt.datetime | None = None
) -> dict:
    """Record (or replace) a curator's decision on one quarantined file of the latest run.

    Parameters
    ----------
    storage : etl.storage.Storage
        the build's storage root.
    item_id : str
        the item's opaque id (``sha256[:12]``, as listed by :func:`quarantine_items`).
    decision : {"release", "reject"}
        release after fix, or reject for good.
    note : str
        a short remark (letters and punctuation only, at most 200 characters: no digits, so no date, id or
        phone number can be typed into the de-identified zone).
    curator : str
        the authenticated curator (:data:`CURATOR_RE`; required: every decision names who made it).
    now : datetime.datetime, optional
        decision time (default: now, UTC).

    Returns
    -------
    dict
        the stored entry ``{"sha256", "decision", "decided_at", "note", "curator", "reason"}``; the same, with
        the decision it replaces (``previous``) and the run, is appended to the audit trail
        ``ledger/review_audit/`` (one object per decision, created only if absent: never rewritten).

    Raises
    ------
    ReviewError
        ``unknown_item`` when no quarantined file of the latest run has that id, ``bad_decision``,
        ``bad_note``, ``bad_curator`` (empty or not an identity).
    """
    if decision not in REVIEW_DECISIONS:
        raise ReviewError("bad_decision", f"decision must be one of {REVIEW_DECISIONS}")
    if len(note) > _NOTE_MAX or not _NOTE_OK.match(note):
        raise ReviewError("bad_note", "notes take letters and punctuation only (no digits, @, ^)")
    if not CURATOR_RE.fullmatch(curator or ""):
        raise ReviewError(
            "bad_curator", "a decision needs the curator's identity (letters, digits, . _ @ + - and single spaces)"
        )
    item = {i["id"]: i for i in quarantine_items(storage)}.get(str(item_id).lower())
    if item is None:
        raise ReviewError("unknown_item", f"no quarantined file with id {item_id!r} in the latest run")
    # the full digest comes from the restricted ledger; only it and the decision are stored
    path = latest_ledger_path(storage)
    ledger = storage.read_table(path, schema=LEDGER_SCHEMA)
    sha = next(s for s in ledger["sha256"].to_pylist() if s.lower().startswith(item["id"]))
    entry = {
        "sha256": sha.lower(),
        "decision": decision,
        "decided_at": (now or dt.datetime.now(dt.UTC)).isoformat(timespec="seconds"),
        "note": note.strip(),
        "curator": curator.strip(),
        "reason": item["reason"],
    }
    before = [d for d in load_review(storage) if d["sha256"][:12] == entry["sha256"][:12]]
    _audit(storage, {**entry, "previous": before[0]["decision"] if before else None, "run_id": item["run_id"]})
    entries = [d for d in load_review(storage) if d["sha256"][:12] != entry["sha256"][:12]]
    entries.append(entry)
    entries.sort(key=lambda d: d["sha256"])
    storage.write_text(REVIEW_FILE, json.dumps({"version": 1, "decisions": entries}, indent=1, sort_keys=True))
    return entry


def _audit(storage: Storage, entry: dict) -> str:
    """Append one decision to the audit trail: a new object ``ledger/review_audit/<ns>-<random>.json`` (``<ns>``: the
    clock in nanoseconds since 1970, 20 digits, so names sort in the order decisions were made, also within one
    second), created only if absent (:func:`etl.storage.put_if_absent`), so no entry is ever overwritten. Returns
    its path."""
    import time
    import uuid

    from etl.storage import put_if_absent

    while True:
        path = f"{AUDIT_DIR}/{time.time_ns():020d}-{uuid.uuid4().hex[:12]}.json"
        if put_if_absent(storage, path, json.dumps(entry, sort_keys=True).encode()):
            return path


def load_audit(storage: Storage) -> list[dict]:
    """Every audit entry (who, when, what, why, and the decision replaced), oldest first."""
    return [json.loads(storage.read_text(p)) for p in storage.list_files(AUDIT_DIR) if p.endswith(".json")]
