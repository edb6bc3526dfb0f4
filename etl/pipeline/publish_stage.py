"""The build's last stage: publish the snapshot and record the run's summary for people and the CLI."""

from __future__ import annotations

import json

from etl import zones
from etl.pipeline.context import BuildContext
from etl.snapshots import MANIFEST_SHA, publish
from schemas.ontology import load_ontology


def run_summary_path(run_id: str) -> str:
    """Where a run's summary is kept (reports zone, PHI-free)."""
    return zones.run_summary(run_id)


def run_locations(ctx: BuildContext) -> dict:
    """Where a person looks after a run, for its summary (every value PHI-free).

    Returns
    -------
    dict
        ``quarantine`` (URI of ``quarantine/<run>``: one record per quarantined file, withheld report records
        under ``reports/``), ``ledger_file`` (URI of the run's ledger), ``quality_report`` (URI of
        ``reports/quality/<run>.json``), ``quality_warnings`` (the failed warning checks the dashboard counts:
        ``[{"table", "check", "message"}]`` in table then check order; empty when there is no report) and
        ``withheld_reports_by_reason`` (``{reason: records}``).
    """
    st = ctx.storage
    report_path = zones.quality_report(ctx.run_id)
    results = json.loads(st.read_text(report_path)).get("results", []) if st.is_file(report_path) else []
    warnings = sorted(
        (
            {"table": r["table"], "check": r["check"], "message": r["message"]}
            for r in results
            if r.get("severity") == "warning" and not r.get("passed")
        ),
        key=lambda w: (w["table"], w["check"]),
    )
    withheld_path = zones.run_withheld_reports(ctx.run_id)
    withheld = json.loads(st.read_text(withheld_path)) if st.is_file(withheld_path) else []
    by_reason: dict[str, int] = {}
    for w in withheld:
        by_reason[str(w.get("reason"))] = by_reason.get(str(w.get("reason")), 0) + 1
    return {
        "quarantine": st.full_uri(zones.quarantine_dir(ctx.run_id)),
        "ledger_file": st.full_uri(zones.ledger_file(ctx.run_id)),
        "quality_report": st.full_uri(report_path),
        "quality_warnings": warnings,
        "withheld_reports_by_reason": dict(sorted(by_reason.items())),
    }


def publish_stage(ctx: BuildContext) -> dict:
    """Publish the curated tables as a snapshot (:func:`etl.snapshots.publish`); write and return the run summary.

    The de-identification method codes recorded in the release come from the run's ``deid`` config (the
    same codes the de-identifier writes into every DICOM file); lineage is this run's ledger (its path- and
    run-free hash in the manifest, this run's id in the release's ``publish_log.json``). The release time
    is ``SOURCE_DATE_EPOCH`` when set, else the clock (:func:`etl.snapshots.release_epoch`): a build with
    the same inputs, config, key and ``SOURCE_DATE_EPOCH`` publishes a byte-identical release.

    A run that saw no file at all (every source empty) publishes nothing: ``version`` is None and ``published``
    False (the build DAG's ``snapshot`` task then ends skipped, so no ``medreco://snapshot`` event triggers
    training).

    Returns
    -------
    dict
        ``published``, ``version``, ``parent``, ``change`` (initial | major | minor | patch, or the existing release's),
        ``uri``, ``content_hash``, ``manifest_sha256``, ``created_at`` (the release time, ISO 8601 UTC),
        ``created``, ``tables`` (rows per table), ``delta_versions`` (pinned
        Delta table version per table), ``ledger`` (balance, with ``withheld_report_records``), ``dashboard`` (path
        of index.html), and the keys of :func:`run_locations` (quarantine and ledger locations, quality warnings,
        withheld report records by reason).
        ``version``, ``content_hash`` and ``uri`` are what the build DAG puts in the
        ``medreco://snapshot`` Asset event's extra.
    """
    from etl.deid.policy import build_policy

    st = ctx.storage
    balance = json.loads(st.read_text(f"{ctx.run_dir}/ledger_balance.json"))
    if balance["files_seen"] == 0:
        return _nothing_published(ctx, balance)
    release = publish(
        st,
        config_hash=ctx.cfg.config_hash(),
        ontology_version=load_ontology().version,
        run_id=ctx.run_id,
        key_fingerprint=ctx.key.fingerprint(),
        deid_method_codes=build_policy(ctx.cfg.deid).release_method_codes,
    )
    summary = {
        "run_id": ctx.run_id,
        "published": True,
        "version": release.version,
        "created": release.created,
        "parent": release.manifest.get("parent"),
        "change": release.manifest.get("change"),
        "uri": release.path,
        "content_hash": release.manifest["content_hash"],
        "manifest_sha256": st.read_text(f"{zones.release_dir(release.version)}/{MANIFEST_SHA}").strip(),
        "created_at": release.manifest.get("created_at"),
        "tables": {t: v["rows"] for t, v in release.manifest["tables"].items()},
        "delta_versions": {t: v.get("delta_version") for t, v in release.manifest["tables"].items()},
        "ledger": balance,
        "dashboard": st.full_uri(zones.DASHBOARD_INDEX),
        "quarantined_by_reason": balance.get("quarantine_reasons", {}),
        **run_locations(ctx),
    }
    st.write_text(run_summary_path(ctx.run_id), json.dumps(summary, indent=1, sort_keys=True))
    return summary


def _nothing_published(ctx: BuildContext, balance: dict) -> dict:
    """The summary of a run that saw no file: no release, the latest existing one named for reference."""
    from etl.snapshots import list_versions

    st = ctx.storage
    versions = list_versions(st)
    summary = {
        "run_id": ctx.run_id,
        "published": False,
        "reason": "no files under any source: nothing published",
        "version": None,
        "created": False,
        "latest_existing_version": versions[-1] if versions else None,
        "uri": None,
        "content_hash": None,
        "tables": {},
        "ledger": balance,
        "dashboard": st.full_uri(zones.DASHBOARD_INDEX),
        "quarantined_by_reason": balance.get("quarantine_reasons", {}),
    }
    st.write_text(run_summary_path(ctx.run_id), json.dumps(summary, indent=1, sort_keys=True))
    return summary
