"""The run ledger: exactly one row per input file per run, and the proof that it balances.

Status precedence for a file the plan left ``pending``: the first stage (in pipeline order) that
quarantined it wins; otherwise ``ingested`` when a stage recorded it as ingested. A pending file with
no recorded outcome is a pipeline fault and is recorded as ``quarantined`` / ``no_outcome_recorded``
so it is visible rather than lost.
"""

from __future__ import annotations

import json
from collections import Counter

import polars as pl
import pyarrow as pa

from etl.context import EVENT_SCHEMA, BuildContext
from etl.discover import PLAN_SCHEMA
from schemas import ledger as ledger_schema
from schemas.base import table_from_rows

STAGE_ORDER = ("discover", "deidentify", "normalise", "reports")


class LedgerImbalanceError(RuntimeError):
    """Raised when files seen != sum of per-status counts (a file was lost or counted twice)."""


def build_ledger(run_id: str, plan: pa.Table, events: pa.Table) -> pa.Table:
    """Combine the plan and the stages' events into the ledger (:data:`schemas.ledger.SCHEMA`)."""
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
            "run_id": run_id, "source_uri": p["source_uri"], "sha256": p["sha256"], "bytes": p["bytes"],
            "institution": p["institution"], "kind": p["kind"], "shard": p["shard"], "status": p["status"],
            "stage": "discover", "reason": p["reason"], "detail": p["detail"], "duplicate_of": p["duplicate_of"],
        }
        if p["status"] == "pending":
            e = outcome.get(p["source_uri"])
            if e is None:
                row.update(status="quarantined", stage="ledger", reason="no_outcome_recorded",
                           detail="no stage recorded an outcome for this file")
            else:
                row.update(status=e["status"], stage=e["stage"], reason=e["reason"], detail=e["detail"])
        rows.append(row)
    return table_from_rows(rows, ledger_schema.SCHEMA)


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
    out["balanced"] = (
        unique_files == ledger.num_rows == sum(out[s] for s in ledger_schema.STATUSES)
        and set(statuses) <= set(ledger_schema.STATUSES)
    )
    return out


def finalise(ctx: BuildContext) -> dict:
    """Write this run's ledger and quarantine records; raise if the ledger does not balance.

    Quarantine records (``quarantine/<run_id>/<sha256>.json``) point at the source file and give the
    reason code; they never copy a value out of the file.

    Raises
    ------
    LedgerImbalanceError
        when files seen != sum of statuses.
    """
    plan = ctx.storage.read_table(ctx.plan_path(), schema=PLAN_SCHEMA)
    parts = [ctx.storage.read_table(p, schema=EVENT_SCHEMA)
             for p in ctx.storage.list_files(f"{ctx.run_dir}/events") if p.endswith(".parquet")]
    events = pa.concat_tables(parts) if parts else EVENT_SCHEMA.empty_table()
    ledger = build_ledger(ctx.run_id, plan, events)
    ctx.storage.write_table(ctx.ledger_path, ledger)
    ctx.storage.delete(ctx.quarantine_dir)
    for r in ledger.filter(pa.compute.equal(ledger["status"], "quarantined")).to_pylist():
        record = {k: r[k] for k in ("run_id", "source_uri", "sha256", "institution", "kind", "stage", "reason", "detail")}
        ctx.storage.write_text(f"{ctx.quarantine_dir}/{r['sha256']}.json", json.dumps(record, indent=1, sort_keys=True))
    withheld_path = f"{ctx.run_dir}/withheld_reports.json"
    withheld = json.loads(ctx.storage.read_text(withheld_path)) if ctx.storage.is_file(withheld_path) else []
    for i, w in enumerate(withheld):
        ctx.storage.write_text(f"{ctx.quarantine_dir}/reports/{i:06d}.json", json.dumps(w, indent=1, sort_keys=True))
    result = balance(ledger)
    result["withheld_report_records"] = len(withheld)
    reasons = Counter(r for r, s in zip(ledger["reason"].to_pylist(), ledger["status"].to_pylist()) if s == "quarantined")
    result["quarantine_reasons"] = dict(sorted(reasons.items()))
    ctx.storage.write_text(f"{ctx.run_dir}/ledger_balance.json", json.dumps(result, indent=1, sort_keys=True))
    if not result["balanced"]:
        raise LedgerImbalanceError(f"ledger of run {ctx.run_id} does not balance: {result}")
    return result
