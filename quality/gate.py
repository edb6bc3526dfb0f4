"""The build's quality stage: run the gates on every curated table (Great Expectations Checkpoints plus the
cross-table checks), build Data Docs and the curator dashboard, and stop the build before the snapshot when a
critical check fails.

Zones written (all under ``reports/``, PHI-free): ``gx/`` (the GE file context: suites, validation
definitions, checkpoints, validation results of the last ``keep_runs`` runs), ``data_docs/`` (static Data
Docs site), ``quality/<run_id>.json``, ``quality/row_flags/<run_id>.parquet`` (rows flagged by row-level
expectations: table, key, check) and ``quality/latest_run.json``, ``dashboard/``.

Only metadata is read, one partition and one column set at a time (:func:`load_tables`), and the payload
check recorded where the payloads were written (:func:`etl.pixels.integrity.recorded_integrity`). With an ``s3://``
root the GE folders are worked on in a local temporary copy and synced back.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

from etl import zones
from etl.pipeline.context import BuildContext
from etl.pipeline.ledger import load_review
from etl.pixels.integrity import recorded_integrity
from etl.storage import Storage
from schemas.errors import ReasonCodedError
from schemas.ontology import load_ontology
from schemas.tables import SCHEMAS, metadata_columns

GX_DIR = zones.GX_DIR
DATA_DOCS_DIR = zones.DATA_DOCS_DIR


def row_flags_path(run_id: str) -> str:
    """The rows one run's row-level expectations flagged: ``reports/quality/row_flags/<run>.parquet``."""
    return f"{zones.REPORTS}/quality/row_flags/{run_id}.parquet"


class QualityGateError(ReasonCodedError, RuntimeError):
    """Raised when a critical quality check fails: the snapshot is not published."""

    default_reason = "quality_gate_failed"
    message_format = "{message}"


def load_tables(ctx: BuildContext) -> dict:
    """All curated tables of the storage root as :class:`quality.partitions.PartitionedTable` (their partition
    files, read on demand), plus this run's ledger as a pyarrow Table.

    Nothing is read here: each check later reads one partition at a time and only the columns it needs, always
    within :func:`schemas.tables.metadata_columns` (``images.payload`` is never fetched from disk or the object
    store; partition columns the Parquet readers may add are not requested), so the task's memory is bounded by
    one partition's metadata plus the key columns of the table-level invariants.
    """
    from quality.partitions import PartitionedTable

    tables: dict = {
        t: PartitionedTable.from_storage(ctx.storage, zones.curated_table(t), s, metadata_columns(t))
        for t, s in SCHEMAS.items()
        if t != "ledger"
    }
    tables["ledger"] = ctx.storage.read_table(ctx.ledger_path, schema=SCHEMAS["ledger"])
    return tables


def deid_audit(ctx: BuildContext) -> dict[str, int]:
    """Sum of the per-shard de-identification audit counts of this run."""
    total: Counter = Counter()
    for p in ctx.storage.list_files(zones.run_audit(ctx.run_id, "deidentify")):
        total.update(json.loads(ctx.storage.read_text(p)))
    return dict(sorted(total.items()))


def _history(ctx: BuildContext) -> list[dict]:
    """Earlier runs' ledger counts and table sizes, flat, oldest first (from ``reports/history/``)."""
    out = []
    for p in ctx.storage.list_files(zones.HISTORY_DIR):
        if p.endswith(".json"):
            h = json.loads(ctx.storage.read_text(p))
            statuses = {k: h["ledger"].get(k, 0) for k in ("ingested", "quarantined", "duplicate", "skipped")}
            out.append(
                {
                    "run_id": h["run_id"],
                    **statuses,
                    "studies": h["tables"].get("studies", 0),
                    "pairs": h["tables"].get("pairs", 0),
                }
            )
    return sorted(out, key=lambda h: h["run_id"])


def raise_on_critical(report, details: str = "") -> None:
    """Raise :class:`QualityGateError` when ``report`` has critical failures.

    The message names each failed check as ``<table>: <check>`` (for GE checks ``<expectation type>:<column>``,
    e.g. ``pairs: expect_column_values_to_be_between:gap_days``; for cross-table checks their name, e.g.
    ``pairs: pair_order``), at most 10 of them, and the failure counts; never a value.

    Raises
    ------
    QualityGateError
    """
    failed = report.critical_failures
    if failed:
        names = "; ".join(f"{r.table}: {r.check} ({r.message})" for r in failed[:10])
        more = f" and {len(failed) - 10} more" if len(failed) > 10 else ""
        raise QualityGateError(
            f"{len(failed)} critical quality check(s) failed: {names}{more}" + (f" (see {details})" if details else "")
        )


def _pull(storage: Storage, rel: str, local: Path) -> dict[str, bytes]:
    """Copy ``rel`` of a (remote) root into ``local``; returns what was copied (path -> bytes)."""
    copied = {}
    for p in storage.list_files(rel):
        data = storage.read_bytes(p)
        target = local / Path(p).relative_to(rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        copied[p] = data
    return copied


def _push(storage: Storage, rel: str, local: Path, before: dict[str, bytes]) -> None:
    """Write back new or changed files of ``local`` to ``rel`` and delete those removed locally."""
    now = set()
    for f in sorted(local.rglob("*")):
        if f.is_file():
            p = f"{rel}/{f.relative_to(local).as_posix()}"
            now.add(p)
            data = f.read_bytes()
            if before.get(p) != data:
                storage.write_bytes(p, data)
    for p in sorted(set(before) - now):
        storage.delete(p)


def quality_stage(ctx: BuildContext, keep_runs: int | None = None) -> dict:
    """Run the checks, write ``reports/quality/<run_id>.json``, Data Docs and the dashboard; raise on critical failures.

    Parameters
    ----------
    ctx : etl.pipeline.context.BuildContext
    keep_runs : int, optional
        validation results kept for Data Docs, in runs (default: ``data_docs.keep_runs`` of
        ``quality/expectations.yaml``, 20).

    Returns
    -------
    dict
        ``checks``, ``warnings``, ``critical_failures`` (numbers), ``dashboard`` and ``data_docs`` (URIs of
        the index pages).

    Raises
    ------
    QualityGateError
        naming the table and the expectation (or cross-table check) of each failed critical check (counts
        only, never values): the snapshot task does not run.
    """
    from quality.checks import run_checks
    from quality.dashboard import build_dashboard

    st = ctx.storage
    tables = load_tables(ctx)
    plan_rows = st.read_table(ctx.plan_path(), columns=["sha256"]).num_rows
    review = load_review(st)
    with tempfile.TemporaryDirectory() as gx_tmp:
        if st.is_local:
            project, docs, before = Path(st.path("reports")), Path(st.path(DATA_DOCS_DIR)), None
        else:
            project, docs = Path(gx_tmp) / "reports", Path(gx_tmp) / "reports" / "data_docs"
            before = {**_pull(st, GX_DIR, project / "gx"), **_pull(st, DATA_DOCS_DIR, docs)}
        report = run_checks(
            tables,
            load_ontology(),
            expected_files={ctx.run_id: plan_rows},
            review=review,
            run_id=ctx.run_id,
            gx_project_dir=project,
            data_docs_dir=docs,
            keep_runs=keep_runs,
            payload_integrity=recorded_integrity(st, ctx.cfg.shard_count),
        )
        if before is not None:
            _push(st, GX_DIR, project / "gx", {k: v for k, v in before.items() if k.startswith(GX_DIR + "/")})
            _push(st, DATA_DOCS_DIR, docs, {k: v for k, v in before.items() if k.startswith(DATA_DOCS_DIR + "/")})
    st.write_text(zones.quality_report(ctx.run_id), report.to_json())
    if report.flags_table is not None:  # rows flagged by row-level expectations: table, key, check (no values)
        st.write_table(row_flags_path(ctx.run_id), report.flags_table)
    st.write_text(zones.LATEST_QUALITY_RUN, json.dumps({"run_id": ctx.run_id}))
    balance = json.loads(st.read_text(f"{ctx.run_dir}/ledger_balance.json"))
    withheld_path = f"{ctx.run_dir}/withheld_reports.json"
    withheld = json.loads(st.read_text(withheld_path)) if st.exists(withheld_path) else []
    run_info = {
        "run_id": ctx.run_id,
        "deid_audit": deid_audit(ctx),
        "ledger": balance,
        "config": ctx.cfg.name,
        "withheld_reports": dict(Counter(str(w.get("reason")) for w in withheld)),
    }
    with tempfile.TemporaryDirectory() as tmp:
        history = [h for h in _history(ctx) if h["run_id"] != ctx.run_id]
        history.append(
            {
                "run_id": ctx.run_id,
                **{k: balance.get(k, 0) for k in ("ingested", "quarantined", "duplicate", "skipped")},
                "studies": tables["studies"].num_rows,
                "pairs": tables["pairs"].num_rows,
            }
        )
        index = build_dashboard(
            tables,
            report,
            run_info,
            Path(tmp),
            history=history,
            review=review,
            data_docs_href="../data_docs/index.html",
        )
        base = Path(tmp)
        st.delete(zones.DASHBOARD_DIR)
        for f in sorted(base.rglob("*")):
            if f.is_file():
                st.write_bytes(f"{zones.DASHBOARD_DIR}/{f.relative_to(base).as_posix()}", f.read_bytes())
        index_rel = f"{zones.DASHBOARD_DIR}/{Path(index).relative_to(base).as_posix()}"
    raise_on_critical(report, st.full_uri(zones.quality_report(ctx.run_id)))
    return {
        "checks": len(report.results),
        "warnings": len(report.warnings),
        "critical_failures": 0,
        "dashboard": st.full_uri(index_rel),
        "data_docs": st.full_uri(f"{DATA_DOCS_DIR}/index.html"),
    }
