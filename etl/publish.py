"""The build's last stage: publish the snapshot and record the run's summary for people and the CLI."""

from __future__ import annotations

import json
from collections import Counter

from etl.context import BuildContext
from etl.snapshots import publish
from schemas.ontology import load_ontology
from schemas.tables import SCHEMAS


def run_summary_path(run_id: str) -> str:
    """Where a run's summary is kept (reports zone, PHI-free)."""
    return f"reports/history/{run_id}.json"


def publish_stage(ctx: BuildContext) -> dict:
    """Publish the curated tables as a snapshot; write and return the run summary.

    Returns
    -------
    dict
        ``version``, ``uri``, ``content_hash``, ``created``, ``tables`` (rows per table), ``ledger``
        (balance), ``dashboard`` (path of index.html).
    """
    st = ctx.storage
    studies = st.read_table("curated/studies", schema=SCHEMAS["studies"])
    splits = st.read_table("curated/splits", schema=SCHEMAS["splits"])
    facts = {
        "Studies per institution": dict(sorted(Counter(studies["institution"].to_pylist()).items())),
        "Studies per modality": dict(sorted(Counter(studies["modality"].to_pylist()).items())),
        "Patients per split": dict(sorted(Counter(splits["split"].to_pylist()).items())),
    }
    release = publish(
        st, config_hash=ctx.cfg.config_hash(), ontology_version=load_ontology().version, run_id=ctx.run_id,
        key_fingerprint=ctx.key.fingerprint(), card_facts=facts,
    )
    balance = json.loads(st.read_text(f"{ctx.run_dir}/ledger_balance.json"))
    summary = {
        "run_id": ctx.run_id,
        "version": release.version,
        "created": release.created,
        "uri": release.path,
        "content_hash": release.manifest["content_hash"],
        "tables": {t: v["rows"] for t, v in release.manifest["tables"].items()},
        "ledger": balance,
        "dashboard": st.full_uri("reports/dashboard/index.html"),
        "quarantined_by_reason": balance.get("quarantine_reasons", {}),
    }
    st.write_text(run_summary_path(ctx.run_id), json.dumps(summary, indent=1, sort_keys=True))
    return summary
