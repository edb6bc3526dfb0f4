"""Registry of the curated tables and their schemas, in build order."""

from schemas import (
    entity_mentions,
    images,
    ledger,
    pairs,
    reports,
    retrieval_targets,
    series,
    splits,
    studies,
    study_labels,
    vqa,
)

SCHEMAS = {
    "ledger": ledger.SCHEMA,
    "studies": studies.SCHEMA,
    "series": series.SCHEMA,
    "images": images.SCHEMA,
    "reports": reports.SCHEMA,
    "entity_mentions": entity_mentions.SCHEMA,
    "study_labels": study_labels.SCHEMA,
    "pairs": pairs.SCHEMA,
    "vqa": vqa.SCHEMA,
    "splits": splits.SCHEMA,
    "retrieval_targets": retrieval_targets.SCHEMA,
}

#: tables published in a snapshot (the ledger is restricted and stays out of it)
SNAPSHOT_TABLES = [t for t in SCHEMAS if t != "ledger"]
