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

#: per table, the columns holding pixel payloads; global tasks read every other column only
PAYLOAD_COLUMNS: dict[str, tuple[str, ...]] = {"images": images.PAYLOAD_COLUMNS}


def metadata_columns(table: str) -> list[str]:
    """The columns of ``table`` (a key of :data:`SCHEMAS`) without its payload columns, in schema order.

    Raises
    ------
    KeyError
        for a table not in :data:`SCHEMAS`.
    """
    skip = set(PAYLOAD_COLUMNS.get(table, ()))
    return [n for n in SCHEMAS[table].names if n not in skip]
