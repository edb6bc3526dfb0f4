"""The run ledger: exactly one row per input file per run, and the proof that it balances.

Status precedence for a file the plan left ``pending``: the first stage (in pipeline order) that
quarantined it wins; otherwise ``ingested`` when a stage recorded it as ingested. A pending file with
no recorded outcome is a pipeline fault and is recorded as ``quarantined`` / ``no_outcome_recorded``
so it is visible rather than lost.

Curator decisions (``reports/quarantine_review.json``, recorded from the curator dashboard) are honoured by
the next run's ledger (:func:`apply_review`): a file a curator *rejected* that is quarantined again is
recorded with reason ``curator_rejected`` (stage ``review``) and stays out for good; a file approved for
*release after fix* keeps its reason while it still fails ("pending the fix") and flows on once the fix
(a pixel-cleaning rule, a corrected delivery of the same bytes' successor, a decoder) lets it pass.
Decisions name files by sha256 only (the full digest or its first >= 12 hex digits), never by path.

Incremental runs (:mod:`etl.sources.discover`). Each run writes two ledgers: the run ledger (``ledger.parquet``),
in which a file whose content an earlier run recorded is ``duplicate`` (reason ``seen_in_earlier_run``,
``duplicate_of`` naming the earlier path, ``detail`` the earlier run) unless this run changed its outcome
or it is still quarantined (a quarantine stays open for curators until a fix or a decision closes it); and
the clean-view ledger (``inputs.parquet``): the outcome a clean build of everything under the sources gives
each file, which the snapshot's input lineage hashes, so an incremental build and a clean build of the same
deliveries publish the same content hash. The seen index is updated from the clean-view ledger.

Concurrent builds. :class:`BuildLock` is a lock object under ``ledger/`` (owner, host, pid, expiry), created
atomically (``O_CREAT | O_EXCL`` on local disk, a conditional ``If-None-Match: *`` put on S3), so two build
processes on one storage root cannot interleave; the second fails at once naming the holder.
"""

from __future__ import annotations

import json
from collections import Counter

import polars as pl
import pyarrow as pa

from etl import zones
from etl.pipeline.context import EVENT_SCHEMA, BuildContext
from etl.sources.discover import PLAN_SCHEMA, SEEN_INDEX, load_seen_index, update_seen_index
from schemas import ledger as ledger_schema
from schemas.base import table_from_rows
from schemas.errors import ReasonCodedError

STAGE_ORDER = ("discover", "deidentify", "normalise", "reports")
#: curator decisions on quarantined files (PHI-free: opaque ids, decision codes, dates)
REVIEW_FILE = zones.REVIEW_FILE
REVIEW_DECISIONS = ("release", "reject")
REJECTED_REASON = "curator_rejected"
#: ledger reason of a file whose content (sha256) an earlier run already recorded
SEEN_REASON = "seen_in_earlier_run"


class LedgerImbalanceError(ReasonCodedError, RuntimeError):
    """Raised when files seen != sum of per-status counts (a file was lost or counted twice)."""

    default_reason = "ledger_imbalance"
    message_format = "{message}"


def build_ledger(run_id: str, plan: pa.Table, events: pa.Table, *, clean_view: bool = False) -> pa.Table:
    """Combine the plan and the stages' events into the ledger (:data:`schemas.ledger.SCHEMA`).

    Parameters
    ----------
    run_id : str
        the run.
    plan : pyarrow.Table
        the run's plan (:data:`etl.sources.discover.PLAN_SCHEMA`, annotated by :func:`etl.sources.discover.mark_seen`).
    events : pyarrow.Table
        the stages' outcome events (:data:`etl.pipeline.context.EVENT_SCHEMA`).
    clean_view : bool
        False (the run ledger): a file an earlier run recorded (``seen_run``) is ``duplicate`` /
        ``seen_in_earlier_run`` unless it is quarantined, or ingested after an earlier non-ingested outcome
        (a fix let it through); skipped files stay skipped. True: every file keeps the outcome a clean build
        gives it (the snapshot's input lineage).

    Returns
    -------
    pyarrow.Table
        one row per plan row, sorted by source_uri.
    """
    ev = pl.from_arrow(events.cast(EVENT_SCHEMA)) if events.num_rows else pl.from_arrow(EVENT_SCHEMA.empty_table())
    order = {s: i for i, s in enumerate(STAGE_ORDER)}
    outcome: dict[str, dict] = {}
    for e in sorted(ev.iter_rows(named=True), key=lambda e: (e["source_uri"], order.get(e["stage"], 99))):
        cur = outcome.get(e["source_uri"])
        if cur is None or (cur["status"] == "ingested" and e["status"] == "quarantined"):
            outcome[e["source_uri"]] = e
    rows = []
    for p in sorted(plan.cast(PLAN_SCHEMA).to_pylist(), key=lambda r: r["source_uri"]):
        row = {
            "run_id": run_id,
            "source_uri": p["source_uri"],
            "sha256": p["sha256"],
            "bytes": p["bytes"],
            "institution": p["institution"],
            "kind": p["kind"],
            "shard": p["shard"],
            "status": p["status"],
            "stage": "discover",
            "reason": p["reason"],
            "detail": p["detail"],
            "duplicate_of": p["duplicate_of"],
        }
        if p["status"] == "pending":
            e = outcome.get(p["source_uri"])
            if e is None:
                row.update(
                    status="quarantined",
                    stage="ledger",
                    reason="no_outcome_recorded",
                    detail="no stage recorded an outcome for this file",
                )
            else:
                row.update(status=e["status"], stage=e["stage"], reason=e["reason"], detail=e["detail"])
        if not clean_view and p["seen_run"] and row["status"] != "skipped":
            if row["status"] == "quarantined":
                note = f"same sha256 as a file of run {p['seen_run']}"
                row["detail"] = f"{row['detail']}; {note}" if row["detail"] else note
            elif not (row["status"] == "ingested" and p["seen_status"] not in (None, "ingested")):
                row.update(
                    status="duplicate",
                    stage="discover",
                    reason=SEEN_REASON,
                    duplicate_of=p["seen_uri"],
                    detail=f"same sha256 as a file recorded in run {p['seen_run']}",
                )
        rows.append(row)
    return table_from_rows(rows, ledger_schema.SCHEMA)


def load_review(storage) -> list[dict]:
    """The curator decisions of a storage root (``[]`` when none was recorded yet).

    Returns
    -------
    list of dict
        ``{"sha256": <hex, >= 12 digits>, "decision": "release" | "reject", "decided_at": <ISO 8601>, ...}``;
        entries with another decision or a malformed digest are left out.
    """
    if not storage.is_file(REVIEW_FILE):
        return []
    doc = json.loads(storage.read_text(REVIEW_FILE))
    items = doc.get("decisions", []) if isinstance(doc, dict) else doc
    out = []
    for d in items if isinstance(items, list) else []:
        sha = str(d.get("sha256", "")).lower() if isinstance(d, dict) else ""
        if len(sha) >= 12 and all(c in "0123456789abcdef" for c in sha) and d.get("decision") in REVIEW_DECISIONS:
            out.append({**d, "sha256": sha})
    return out


def apply_review(ledger: pa.Table, review: list[dict]) -> tuple[pa.Table, dict]:
    """Apply curator decisions to a run's ledger (matched on sha256 prefix).

    - ``reject`` of a quarantined file: ``stage="review"``, ``reason="curator_rejected"``, the former stage
      and reason kept in ``detail``;
    - ``release`` of a file quarantined again: reason kept, ``detail`` notes the approval pending the fix;
    - a file that was ingested keeps its row (a rejected one is then counted in ``rejected_but_ingested``:
      the quality gate stops such a run before the snapshot).

    Parameters
    ----------
    ledger : pyarrow.Table
        rows of :data:`schemas.ledger.SCHEMA`.
    review : list of dict
        from :func:`load_review`.

    Returns
    -------
    (pyarrow.Table, dict)
        the ledger (same rows, same order) and counts ``rejected``, ``release_pending_fix``, ``released``,
        ``rejected_but_ingested``.
    """
    by_prefix = {d["sha256"][:12]: d for d in review}
    counts = Counter({k: 0 for k in ("rejected", "release_pending_fix", "released", "rejected_but_ingested")})
    rows = ledger.to_pylist()
    for r in rows:
        d = by_prefix.get((r["sha256"] or "").lower()[:12])
        if d is None:
            continue
        when = str(d.get("decided_at", ""))[:10]
        if d["decision"] == "reject":
            if r["status"] == "quarantined":
                r["detail"] = f"rejected by a curator {when} (was {r['stage']}: {r['reason']})".replace("  ", " ")
                r["stage"], r["reason"] = "review", REJECTED_REASON
                counts["rejected"] += 1
            elif r["status"] == "ingested":
                counts["rejected_but_ingested"] += 1
        elif r["status"] == "quarantined":
            note = f"release approved by a curator {when}, pending the fix".replace("  ", " ")
            r["detail"] = f"{r['detail']}; {note}" if r["detail"] else note
            counts["release_pending_fix"] += 1
        elif r["status"] == "ingested":
            counts["released"] += 1
    return table_from_rows(rows, ledger_schema.SCHEMA), dict(counts)


def balance(ledger: pa.Table) -> dict:
    """Counts per status and whether ``files_seen == sum(statuses)`` with one row per file.

    Returns
    -------
    dict
        ``{"files_seen", "ingested", "quarantined", "duplicate", "skipped", "balanced"}``.
    """
    statuses = Counter(ledger["status"].to_pylist())
    unique_files = len(set(ledger["source_uri"].to_pylist()))
    out = {"files_seen": unique_files, **{s: statuses.get(s, 0) for s in ledger_schema.STATUSES}}
    out["balanced"] = unique_files == ledger.num_rows == sum(out[s] for s in ledger_schema.STATUSES) and set(
        statuses
    ) <= set(ledger_schema.STATUSES)
    return out


def finalise(ctx: BuildContext) -> dict:
    """Write this run's ledger and quarantine records; raise if the ledger does not balance.

    Quarantine records (``quarantine/<run_id>/<sha256>.json``) point at the source file and give the
    reason code (and the curator decision, when one was recorded); they never copy a value out of the file.
    Curator decisions of ``reports/quarantine_review.json`` are applied first (:func:`apply_review`).
    Also writes the clean-view ledger (``ledger/run_id=<run>/inputs.parquet``) and updates the seen index
    (:data:`etl.sources.discover.SEEN_INDEX`) with it.

    Raises
    ------
    LedgerImbalanceError
        when files seen != sum of statuses.
    """
    plan = ctx.storage.read_table(ctx.plan_path(), schema=PLAN_SCHEMA)
    parts = [
        ctx.storage.read_table(p, schema=EVENT_SCHEMA)
        for p in ctx.storage.list_files(f"{ctx.run_dir}/events")
        if p.endswith(".parquet")
    ]
    events = pa.concat_tables(parts) if parts else EVENT_SCHEMA.empty_table()
    review = load_review(ctx.storage)
    ledger, review_counts = apply_review(build_ledger(ctx.run_id, plan, events), review)
    inputs, _ = apply_review(build_ledger(ctx.run_id, plan, events, clean_view=True), review)
    ctx.storage.write_table(ctx.ledger_path, ledger)
    ctx.storage.write_table(ctx.inputs_ledger_path, inputs)
    ctx.storage.write_table(SEEN_INDEX, update_seen_index(load_seen_index(ctx.storage), inputs, ctx.run_id))
    ctx.storage.delete(ctx.quarantine_dir)
    decided = {d["sha256"][:12]: d for d in review}
    for r in ledger.filter(pa.compute.equal(ledger["status"], "quarantined")).to_pylist():
        record = {
            k: r[k] for k in ("run_id", "source_uri", "sha256", "institution", "kind", "stage", "reason", "detail")
        }
        d = decided.get(r["sha256"].lower()[:12])
        if d is not None:
            record["review"] = {"decision": d["decision"], "decided_at": d.get("decided_at")}
        ctx.storage.write_text(f"{ctx.quarantine_dir}/{r['sha256']}.json", json.dumps(record, indent=1, sort_keys=True))
    withheld_path = zones.run_withheld_reports(ctx.run_id)
    withheld = json.loads(ctx.storage.read_text(withheld_path)) if ctx.storage.is_file(withheld_path) else []
    for i, w in enumerate(withheld):
        ctx.storage.write_text(f"{ctx.quarantine_dir}/reports/{i:06d}.json", json.dumps(w, indent=1, sort_keys=True))
    result = balance(ledger)
    # every configured institution, also one whose (existing) source is empty: the summary says "no files" for it
    per_institution = Counter(ledger["institution"].to_pylist())
    result["files_by_institution"] = {i.id: per_institution.get(i.id, 0) for i in ctx.cfg.institutions}
    result["withheld_report_records"] = len(withheld)
    result["review"] = review_counts
    reasons = Counter(
        r for r, s in zip(ledger["reason"].to_pylist(), ledger["status"].to_pylist()) if s == "quarantined"
    )
    result["quarantine_reasons"] = dict(sorted(reasons.items()))
    ctx.storage.write_text(f"{ctx.run_dir}/ledger_balance.json", json.dumps(result, indent=1, sort_keys=True))
    if not result["balanced"]:
        raise LedgerImbalanceError(f"ledger of run {ctx.run_id} does not balance: {result}")
    return result
