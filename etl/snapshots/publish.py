"""Publishing a release: every curated table committed to its Delta table, then the manifest (the commit point),
its sha256, the dataset card and the publish log (see :mod:`etl.snapshots`)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

from etl import zones
from etl.snapshots.card import card_facts, dataset_card
from etl.snapshots.delta import (
    PartitionFile,
    commit_table,
    delta_files,
    delta_log_path,
    partition_files,
    place_data_file,
    table_data_sha256,
)
from etl.snapshots.ecosystem import VIEW_INPUTS, VIEWS, build_views, parquet_bytes, release_extras
from etl.snapshots.manifest import (
    CARD,
    FORMAT,
    MANIFEST,
    MANIFEST_SHA,
    PUBLISH_LOG,
    TABLES_DIR,
    Release,
    SnapshotError,
    bump_version,
    change_kind,
    code_version,
    content_hash,
    input_ledger_summary,
    latest_ledger_run,
    list_versions,
    read_manifest,
    resolve_version,
    sha256_file,
)
from etl.snapshots.verify import verify
from etl.storage import Storage
from schemas.base import key_columns, schema_version
from schemas.tables import SCHEMAS, SNAPSHOT_TABLES

#: the columns the dataset card counts (:func:`etl.snapshots.card.card_facts`); nothing else is read for it
CARD_COLUMNS = {
    "studies": ["institution", "modality", "patient_key"],
    "images": ["institution", "modality"],
    "reports": ["institution", "link_status"],
    "pairs": ["modality", "patient_key"],
    "vqa": ["split"],
    "splits": ["institution", "split", "patient_key"],
    "study_labels": ["entity_id", "study_key", "state"],
    "entity_mentions": ["entity_id"],
}


def _card_tables(
    storage: Storage, files: dict[str, list[PartitionFile]], wanted: dict[str, list[str]] | None = None
) -> dict:
    """The card's columns of every table (or the ``wanted`` ones), read from the curated partition files (no
    payload column is read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = {}
    for t, fs in files.items():
        cols = [c for c in (wanted or CARD_COLUMNS).get(t, []) if c in SCHEMAS[t].names]
        if not cols:  # only the row count matters (empty tables): a null column holds no buffer
            out[t] = pa.table({"_rows": pa.nulls(sum(f.rows for f in fs))})
            continue
        parts = []
        for f in fs:
            if not f.rows:
                continue
            with storage.fs.open_input_file(storage.path(f.source)) as fh:
                parts.append(pq.read_table(fh, columns=cols))
        schema = pa.schema([SCHEMAS[t].field(c) for c in cols])
        out[t] = pa.concat_tables([p.cast(schema) for p in parts]) if parts else schema.empty_table()
    return out


def release_epoch(source_date_epoch: int | str | None = None) -> tuple[int, str]:
    """The release time in whole seconds since the Unix epoch (UTC), and where it came from.

    ``source_date_epoch`` when given, else the ``SOURCE_DATE_EPOCH`` environment variable (the
    reproducible-builds.org convention, https://reproducible-builds.org/specs/source-date-epoch/), else the
    clock. Every time written into a release (manifest ``created_at``, Delta commit timestamps) is this one,
    so two publishes of the same content at the same ``SOURCE_DATE_EPOCH`` write the same bytes.

    Returns
    -------
    (int, str)
        seconds; ``"argument"``, ``"SOURCE_DATE_EPOCH"`` or ``"clock"``.

    Raises
    ------
    SnapshotError
        when the value is not a non-negative integer (the specification asks a build to fail then).
    """
    if source_date_epoch is None and os.environ.get("SOURCE_DATE_EPOCH", "") != "":
        value, origin = os.environ["SOURCE_DATE_EPOCH"], "SOURCE_DATE_EPOCH"
    elif source_date_epoch is not None:
        value, origin = str(source_date_epoch), "argument"
    else:
        return int(dt.datetime.now(dt.UTC).timestamp()), "clock"
    text = str(value).strip()
    if not text.isascii() or not text.isdigit():
        raise SnapshotError(f"{origin} must be a whole number of seconds since 1970-01-01T00:00:00Z, got {value!r}")
    return int(text), origin


def read_publish_log(storage: Storage, version: str) -> dict | None:
    """The publish log of a release (``snapshots/<version>/publish_log.json``), None if it has none.

    Not part of the release's identity: it records what differs from one publish of the same content to
    another (wall-clock publish time, the publishing run, the runs and ledger it came from), so it is not
    hashed in the manifest (:func:`verify` only checks that it names its release).
    """
    version = resolve_version(storage, version)
    rel = f"{zones.release_dir(version)}/{PUBLISH_LOG}"
    return json.loads(storage.read_text(rel)) if storage.is_file(rel) else None


def publish(
    storage: Storage,
    *,
    config_hash: str,
    ontology_version: str,
    run_id: str,
    key_fingerprint: str,
    deid_method_codes: Sequence[Sequence[str]] = (),
    ledger_run_id: str | None = None,
    run_ids: Sequence[str] | None = None,
    source_date_epoch: int | str | None = None,
) -> Release:
    """Publish the curated tables as a release, or return the latest one if the content is unchanged.

    The release's bytes (``manifest.json``, hence ``manifest.sha256``, ``DATASET_CARD.md``, data files and
    Delta commit files) depend only on the curated tables, the parameters that enter the content hash, the
    release history of the root and the release time (:func:`release_epoch`). Run ids and the wall-clock
    time go to the unhashed ``publish_log.json`` (:func:`read_publish_log`).

    Parameters
    ----------
    storage : Storage
        the storage root (local or S3); tables are read from ``curated/<table>/``.
    config_hash, ontology_version, key_fingerprint : str
        recorded and part of the content hash; ``key_fingerprint`` also names the Delta tables
        (:func:`delta_table_id`).
    run_id : str
        the publishing run (publish log).
    deid_method_codes : sequence of (CodeValue, CodeMeaning)
        DeidentificationMethodCodeSequence codes (CID 7050) of the de-identification that made the data.
    ledger_run_id : str, optional
        run whose ledger describes the inputs (default: ``run_id`` when it has a ledger, else the most
        recently written ledger); its path- and run-free hash is in the manifest's lineage.
    run_ids : sequence of str, optional
        every run that contributed (publish log; default: ``[run_id]``).
    source_date_epoch : int or str, optional
        the release time in seconds since the epoch (default: ``SOURCE_DATE_EPOCH``, else the clock); to
        rebuild a release byte for byte, pass its manifest's ``source_date_epoch``.

    Returns
    -------
    Release
        ``created`` is False when the latest release already has this content hash.

    Raises
    ------
    SnapshotError
        when the latest release fails :func:`verify` (nothing is published on top of a damaged release),
        when another writer commits to a Delta table during the publish, or for a malformed
        ``source_date_epoch``/``SOURCE_DATE_EPOCH``.
    """
    epoch, epoch_origin = release_epoch(source_date_epoch)
    published_at = dt.datetime.now(dt.UTC)
    versions = list_versions(storage)
    parent = versions[-1] if versions else None
    if parent:
        problems = verify(storage, parent, deep=False)
        if problems:
            raise SnapshotError(
                f"latest snapshot {parent} failed verification, refusing to publish on top of it: "
                + "; ".join(problems)
            )
    # (checked first: on local disk a release's data files are hard links of curated files)
    files = {t: partition_files(storage, t) for t in SNAPSHOT_TABLES}
    tables: dict[str, dict] = {}
    for t, fs in files.items():
        entries = [
            {"path": f.name, "sha256": f.sha256, "rows": f.rows, "bytes": f.size, "partition": f.partition} for f in fs
        ]
        tables[t] = {
            "uri": f"{TABLES_DIR}/{t}",
            "schema_version": schema_version(SCHEMAS[t]),
            "key": key_columns(SCHEMAS[t]),
            "rows": sum(f.rows for f in fs),
            "sha256": table_data_sha256(entries),
            "files": entries,
        }
    if ledger_run_id is None:
        ledger_run_id = run_id if storage.is_file(zones.ledger_file(run_id)) else latest_ledger_run(storage)
    inputs = input_ledger_summary(storage, ledger_run_id)
    lineage = {k: v for k, v in (inputs or {"input_ledger_sha256": None}).items() if k != "ledger_run_id"}
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "config_hash": config_hash,
        "ontology_version": ontology_version,
        "code_version": code_version(),
        "key_fingerprint": key_fingerprint,
        "deid_method_codes": [list(c) for c in deid_method_codes],
        "schema_versions": {t: v["schema_version"] for t, v in tables.items()},
        "lineage": lineage,
        "tables": tables,
    }
    manifest["content_hash"] = content_hash(manifest)

    if parent:
        latest = read_manifest(storage, parent)
        if latest["content_hash"] == manifest["content_hash"]:
            return Release(parent, storage.full_uri(zones.release_dir(parent)), latest, created=False)
        change = change_kind(latest["tables"], tables)
    else:
        change = "initial"
    version = bump_version(parent, change)

    epoch_ms = epoch * 1000
    placed = 0
    for t, fs in files.items():
        placed += sum(place_data_file(storage, t, f) for f in fs)
        delta_version, names = delta_files(storage, t)
        if delta_version is None or names != sorted(f.name for f in fs):
            delta_version = commit_table(storage, t, fs, version, epoch_ms, key_fingerprint)
        log = delta_log_path(t, delta_version)
        tables[t]["delta_version"] = delta_version
        tables[t]["delta_log"] = {"path": log.removeprefix(f"{TABLES_DIR}/{t}/"), "sha256": sha256_file(storage, log)}

    manifest.update(
        version=version,
        parent=parent,
        change=change,
        source_date_epoch=epoch,
        created_at=dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat(timespec="seconds"),
        table_format="delta",
    )
    base = zones.release_dir(version)
    card = dataset_card(manifest, card_facts(_card_tables(storage, files), inputs)).encode()
    manifest["card_sha256"] = hashlib.sha256(card).hexdigest()
    storage.write_bytes(f"{base}/{CARD}", card)
    # what the field's tools read (etl.snapshots.ecosystem): views, Hugging Face card, Croissant, file lists
    extras: dict[str, bytes] = {}
    view_inputs = _card_tables(storage, {t: files[t] for t in VIEW_INPUTS if t in files}, VIEW_INPUTS)
    manifest["views"] = {}
    for name, view in build_views(view_inputs).items():
        data = parquet_bytes(view)
        extras[f"{VIEWS}/{name}.parquet"] = data
        manifest["views"][name] = {
            "path": f"{VIEWS}/{name}.parquet",
            "rows": view.num_rows,
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    extras.update(release_extras(manifest, SCHEMAS, card.decode()))
    manifest["release_files"] = {rel: hashlib.sha256(data).hexdigest() for rel, data in sorted(extras.items())}
    for rel, data in extras.items():
        storage.write_bytes(f"{base}/{rel}", data)
    log_record = {
        "version": version,
        "published_at": published_at.isoformat(timespec="seconds"),
        "publish_run_id": run_id,
        "run_ids": list(run_ids or [run_id]),
        "ledger_run_id": ledger_run_id,
        "source_date_epoch": epoch,
        "source_date_epoch_from": epoch_origin,
        "data_bytes_added": placed,
    }
    storage.write_text(f"{base}/{PUBLISH_LOG}", json.dumps(log_record, indent=1, sort_keys=True))
    text = json.dumps(manifest, indent=1, sort_keys=True).encode()
    storage.write_bytes(f"{base}/{MANIFEST}", text)
    storage.write_text(f"{base}/{MANIFEST_SHA}", hashlib.sha256(text).hexdigest() + "\n")
    if storage.is_local:  # immutable on disk too: read-only files (Delta only ever adds files)
        pinned = [f"{base}/{n}" for n in (CARD, PUBLISH_LOG, MANIFEST, MANIFEST_SHA, *manifest["release_files"])]
        for t, v in tables.items():
            pinned += [f"{TABLES_DIR}/{t}/{f['path']}" for f in v["files"]]
            pinned += [
                delta_log_path(t, n) for n in range(v["delta_version"] + 1) if storage.is_file(delta_log_path(t, n))
            ]
        for rel in pinned:
            os.chmod(storage.path(rel), 0o444)
    return Release(version, storage.full_uri(base), manifest, created=True)
