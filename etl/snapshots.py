"""Versioned snapshots: immutable releases of every curated table with a manifest and a dataset card.

A release is ``snapshots/<version>/`` holding one Parquet file per table (rows sorted by key, so the
bytes depend only on content), ``manifest.json`` and ``DATASET_CARD.md``. The manifest is written last:
a version folder without a manifest is an unfinished publish and is ignored. Publishing content that
equals the latest release's creates no new version (same ``content_hash``); otherwise the minor version
is bumped. (The snapshot issue replaces the file copy with a table format that gives atomic commits.)
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import os
from dataclasses import dataclass
from importlib import metadata

import pyarrow as pa
import pyarrow.parquet as pq

from etl.storage import Storage
from schemas.base import key_columns, schema_version
from schemas.tables import SCHEMAS, SNAPSHOT_TABLES

MANIFEST = "manifest.json"
MANIFEST_SHA = "manifest.sha256"
CARD = "DATASET_CARD.md"


class SnapshotError(RuntimeError):
    """Raised for a missing release or a release whose files do not match its manifest."""


@dataclass(frozen=True)
class Release:
    """A published release: its version, folder and manifest."""

    version: str
    path: str
    manifest: dict
    created: bool


def _vkey(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def list_versions(storage: Storage) -> list[str]:
    """Published versions (those with a manifest), oldest first."""
    versions = {p.split("/")[1] for p in storage.list_files("snapshots") if p.endswith("/manifest.json")}
    return sorted(versions, key=_vkey)


def read_manifest(storage: Storage, version: str) -> dict:
    """The manifest of one release. Raises SnapshotError if there is none."""
    path = f"snapshots/{version}/manifest.json"
    if not storage.is_file(path):
        raise SnapshotError(f"no snapshot {version} under {storage.full_uri('snapshots')}")
    return json.loads(storage.read_text(path))


def _code_version() -> str:
    try:
        return metadata.version("medreco-db")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "0+unknown"


def _table_bytes(storage: Storage, table: str) -> tuple[bytes, int]:
    schema = SCHEMAS[table]
    t = storage.read_table(f"curated/{table}", schema=schema)
    if t.num_rows:
        t = t.sort_by([(k, "ascending") for k in key_columns(schema)])
    buf = io.BytesIO()
    pq.write_table(t, buf, compression="zstd", row_group_size=8192)
    return buf.getvalue(), t.num_rows


def publish(storage: Storage, *, config_hash: str, ontology_version: str, run_id: str,
            key_fingerprint: str, card_facts: dict | None = None) -> Release:
    """Publish the curated tables as a release (or return the latest one if the content is unchanged).

    Returns
    -------
    Release
        ``created`` is False when the latest release already has this content.
    """
    blobs = {t: _table_bytes(storage, t) for t in SNAPSHOT_TABLES}
    tables = {
        t: {"file": f"tables/{t}.parquet", "sha256": hashlib.sha256(b).hexdigest(), "rows": n, "bytes": len(b),
            "schema_version": schema_version(SCHEMAS[t])}
        for t, (b, n) in blobs.items()
    }
    content_hash = _content_hash(tables, config_hash, ontology_version)
    versions = list_versions(storage)
    parent = versions[-1] if versions else None
    if parent:
        problems = verify(storage, parent)
        if problems:
            raise SnapshotError(f"latest snapshot {parent} failed verification, refusing to publish on top of it: "
                                + "; ".join(problems))
        latest = read_manifest(storage, parent)
        if latest["content_hash"] == content_hash:
            return Release(parent, storage.full_uri(f"snapshots/{parent}"), latest, created=False)
        major, minor, _ = _vkey(parent)
        version = f"{major}.{minor + 1}.0"
    else:
        version = "0.1.0"
    base = f"snapshots/{version}"
    for t, (b, _) in blobs.items():
        storage.write_bytes(f"{base}/{tables[t]['file']}", b)
    manifest = {
        "version": version, "parent": parent, "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "code_version": _code_version(), "config_hash": config_hash, "ontology_version": ontology_version,
        "key_fingerprint": key_fingerprint, "lineage": {"run_id": run_id}, "content_hash": content_hash,
        "tables": tables,
    }
    card = dataset_card(manifest, card_facts or {}).encode()
    manifest["card_sha256"] = hashlib.sha256(card).hexdigest()
    storage.write_bytes(f"{base}/{CARD}", card)
    text = json.dumps(manifest, indent=1, sort_keys=True).encode()
    storage.write_bytes(f"{base}/{MANIFEST}", text)
    storage.write_text(f"{base}/{MANIFEST_SHA}", hashlib.sha256(text).hexdigest() + "\n")
    if storage.is_local:  # immutable on disk too: read-only files
        for f in storage.list_files(base):
            os.chmod(storage.path(f), 0o444)
    return Release(version, storage.full_uri(base), manifest, created=True)


def _content_hash(tables: dict, config_hash: str, ontology_version: str) -> str:
    return hashlib.sha256(
        json.dumps({"tables": {t: v["sha256"] for t, v in tables.items()}, "config_hash": config_hash,
                    "ontology_version": ontology_version}, sort_keys=True).encode()
    ).hexdigest()


def dataset_card(manifest: dict, facts: dict) -> str:
    """Markdown dataset card: what is in the release and how it was made."""
    lines = [
        f"# MedReCo-DB snapshot {manifest['version']}",
        "",
        f"- parent: {manifest['parent'] or 'none'}",
        f"- content hash: `{manifest['content_hash']}`",
        f"- config hash: `{manifest['config_hash']}`; ontology {manifest['ontology_version']}; code {manifest['code_version']}",
        "- de-identification: DICOM PS3.15 Basic Application Confidentiality Profile (113100) with Retain Longitudinal "
        "Temporal Information with Modified Dates (113107) and Retain Patient Characteristics (113108); keyed "
        "HMAC-SHA256 pseudonyms; per-patient date shifts (intervals preserved).",
        "",
        "| table | rows | schema |",
        "|---|---:|---|",
    ]
    lines += [f"| {t} | {v['rows']} | {v['schema_version']} |" for t, v in manifest["tables"].items()]
    for title, counts in facts.items():
        lines += ["", f"## {title}", "", "| value | count |", "|---|---:|"]
        lines += [f"| {k} | {v} |" for k, v in counts.items()]
    lines += ["", "## Known limitations", "",
              "- Report text de-identification is rule based; residual PHI is possible in free text.",
              "- Entity labels come from rule-based extraction, not from human annotation.", ""]
    return "\n".join(lines)


def verify(storage: Storage, version: str) -> list[str]:
    """Check a release against its manifest; return the problems found (empty when intact).

    Checks: the manifest's own sha256 (``manifest.sha256``); every table file's presence, sha256 and row
    count (from the Parquet footer); the dataset card's sha256; the content hash recomputed from the table
    hashes; and that the version folder holds no file the manifest does not list.
    """
    base = f"snapshots/{version}"
    manifest = read_manifest(storage, version)
    problems = []
    text = storage.read_bytes(f"{base}/{MANIFEST}")
    if not storage.is_file(f"{base}/{MANIFEST_SHA}"):
        problems.append(f"missing file {MANIFEST_SHA}")
    elif storage.read_text(f"{base}/{MANIFEST_SHA}").strip() != hashlib.sha256(text).hexdigest():
        problems.append(f"{MANIFEST} does not match {MANIFEST_SHA} (manifest edited)")
    for t, v in manifest["tables"].items():
        path = f"{base}/{v['file']}"
        if not storage.is_file(path):
            problems.append(f"{t}: missing file {v['file']}")
            continue
        data = storage.read_bytes(path)
        if hashlib.sha256(data).hexdigest() != v["sha256"]:
            problems.append(f"{t}: sha256 mismatch in {v['file']}")
        else:
            rows = pq.ParquetFile(io.BytesIO(data)).metadata.num_rows
            if rows != v["rows"]:
                problems.append(f"{t}: {rows} rows in {v['file']}, manifest says {v['rows']}")
    card = f"{base}/{CARD}"
    if not storage.is_file(card):
        problems.append(f"missing file {CARD}")
    elif hashlib.sha256(storage.read_bytes(card)).hexdigest() != manifest.get("card_sha256"):
        problems.append(f"{CARD}: sha256 mismatch")
    if _content_hash(manifest["tables"], manifest["config_hash"], manifest["ontology_version"]) != manifest["content_hash"]:
        problems.append("content_hash does not match the table hashes")
    listed = {f"{base}/{v['file']}" for v in manifest["tables"].values()} | {
        f"{base}/{n}" for n in (MANIFEST, MANIFEST_SHA, CARD)}
    problems += [f"unlisted file {f[len(base) + 1:]}" for f in storage.list_files(base) if f not in listed]
    return problems


def table_counts(storage: Storage, version: str) -> dict[str, int]:
    """Row count per table of a release, from its manifest."""
    return {t: v["rows"] for t, v in read_manifest(storage, version)["tables"].items()}


def read_snapshot_table(storage: Storage, version: str, table: str) -> pa.Table:
    """One table of a release as a pyarrow Table."""
    manifest = read_manifest(storage, version)
    if table not in manifest["tables"]:
        raise SnapshotError(f"snapshot {version} has no table {table!r}")
    return storage.read_table(f"snapshots/{version}/{manifest['tables'][table]['file']}")
