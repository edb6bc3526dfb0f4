"""The build's quality stage: run the gates on every curated table, build the curator dashboard, and
stop the build before the snapshot when a critical check fails."""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

from etl.context import BuildContext
from schemas.ontology import load_ontology
from schemas.tables import SCHEMAS

REVIEW_FILE = "reports/quarantine_review.json"


class QualityGateError(RuntimeError):
    """Raised when a critical quality check fails: the snapshot is not published."""


def load_tables(ctx: BuildContext) -> dict:
    """All curated tables of the storage root plus this run's ledger, as pyarrow Tables."""
    tables = {t: ctx.storage.read_table(f"curated/{t}", schema=s) for t, s in SCHEMAS.items() if t != "ledger"}
    tables["ledger"] = ctx.storage.read_table(ctx.ledger_path, schema=SCHEMAS["ledger"])
    return tables


def deid_audit(ctx: BuildContext) -> dict[str, int]:
    """Sum of the per-shard de-identification audit counts of this run."""
    total: Counter = Counter()
    for p in ctx.storage.list_files(f"{ctx.run_dir}/audit/deidentify"):
        total.update(json.loads(ctx.storage.read_text(p)))
    return dict(sorted(total.items()))


def _history(ctx: BuildContext) -> list[dict]:
    """Earlier runs' ledger counts and table sizes, flat, oldest first (from ``reports/history/``)."""
    out = []
    for p in ctx.storage.list_files("reports/history"):
        if p.endswith(".json"):
            h = json.loads(ctx.storage.read_text(p))
            statuses = {k: h["ledger"].get(k, 0) for k in ("ingested", "quarantined", "duplicate", "skipped")}
            out.append({"run_id": h["run_id"], **statuses, "studies": h["tables"].get("studies", 0),
                        "pairs": h["tables"].get("pairs", 0)})
    return sorted(out, key=lambda h: h["run_id"])


def quality_stage(ctx: BuildContext) -> dict:
    """Run the checks, write ``reports/quality/<run_id>.json`` and the dashboard; raise on critical failures.

    Raises
    ------
    QualityGateError
        naming the failed critical checks (counts only, never values).
    """
    from quality.checks import run_checks
    from quality.dashboard import build_dashboard

    tables = load_tables(ctx)
    plan_rows = ctx.storage.read_table(ctx.plan_path()).num_rows
    report = run_checks(tables, load_ontology(), expected_files={ctx.run_id: plan_rows})
    ctx.storage.write_text(f"reports/quality/{ctx.run_id}.json", report.to_json())
    review = json.loads(ctx.storage.read_text(REVIEW_FILE)) if ctx.storage.is_file(REVIEW_FILE) else []
    balance = json.loads(ctx.storage.read_text(f"{ctx.run_dir}/ledger_balance.json"))
    run_info = {"run_id": ctx.run_id, "deid_audit": deid_audit(ctx), "ledger": balance,
                "config": ctx.cfg.name}
    with tempfile.TemporaryDirectory() as tmp:
        history = [h for h in _history(ctx) if h["run_id"] != ctx.run_id]
        history.append({"run_id": ctx.run_id, **{k: balance.get(k, 0) for k in ("ingested", "quarantined", "duplicate", "skipped")},
                        "studies": tables["studies"].num_rows, "pairs": tables["pairs"].num_rows})
        index = build_dashboard(tables, report, run_info, Path(tmp), history=history, review=review)
        base = Path(tmp)
        for f in sorted(base.rglob("*")):
            if f.is_file():
                ctx.storage.write_bytes(f"reports/dashboard/{f.relative_to(base).as_posix()}", f.read_bytes())
        index_rel = f"reports/dashboard/{Path(index).relative_to(base).as_posix()}"
    failed = report.critical_failures
    if failed:
        names = ", ".join(f"{r.table}:{r.check}" for r in failed[:10])
        raise QualityGateError(f"{len(failed)} critical quality check(s) failed: {names} "
                               f"(see {ctx.storage.full_uri(f'reports/quality/{ctx.run_id}.json')})")
    return {"checks": len(report.results), "warnings": len(report.warnings),
            "dashboard": ctx.storage.full_uri(index_rel)}
