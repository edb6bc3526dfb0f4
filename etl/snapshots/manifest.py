"""Release manifests: versions, the content hash, lineage of the input ledger, and reading a release's pinned files
(layout and reproducibility rules: :mod:`etl.snapshots`)."""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections import Counter
from dataclasses import dataclass
from importlib import metadata

import pyarrow as pa
import pyarrow.parquet as pq

from etl import zones
from etl.storage import Storage
from medreco_reader.snapshot import (
    SnapshotError as SnapshotError,  # the reader package's (one implementation)
)
from medreco_reader.snapshot import list_versions as list_versions
from medreco_reader.snapshot import read_manifest as read_manifest
from medreco_reader.snapshot import release_files as release_files
from medreco_reader.snapshot import resolve_version as resolve_version

#: manifest format written by this module; ``/3``: release time from ``SOURCE_DATE_EPOCH``, no run ids (they
#: are in the publish log), Delta commit files written deterministically; ``/4``: one data file per curated
#: partition file (its bytes, named by their sha256; each entry names its ``partition``), rows in partition order
FORMAT = "medreco-snapshot/4"
#: manifest formats :func:`verify` and the readers accept (``/2`` and ``/3`` differ only in what they record)
READ_FORMATS = ("medreco-snapshot/2", "medreco-snapshot/3", FORMAT)
TABLES_DIR = zones.TABLES_DIR
MANIFEST = "manifest.json"
MANIFEST_SHA = "manifest.sha256"
CARD = "DATASET_CARD.md"
PUBLISH_LOG = "publish_log.json"
_LEDGER_RE = re.compile(r"^ledger/run_id=([^/]+)/ledger\.parquet$")


@dataclass(frozen=True)
class Release:
    """A published release: its version, folder URI and manifest; ``created`` is False for an existing one."""

    version: str
    path: str
    manifest: dict
    created: bool


def _vkey(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def bump_version(parent: str | None, change: str) -> str:
    """The next semantic version: ``0.1.0`` first, then MAJOR/MINOR/PATCH as ``change`` says.

    Parameters
    ----------
    parent : str or None
        the latest release's version.
    change : {"major", "minor", "patch"}

    Raises
    ------
    ValueError
        for another ``change``.
    """
    if parent is None:
        return "0.1.0"
    major, minor, patch = _vkey(parent)
    if change == "major":
        return f"{major + 1}.0.0"
    if change == "minor":
        return f"{major}.{minor + 1}.0"
    if change == "patch":
        return f"{major}.{minor}.{patch + 1}"
    raise ValueError(f"unknown change kind {change!r}")


def change_kind(parent_tables: dict, tables: dict) -> str:
    """How a release's tables differ from its parent's: ``major``, ``minor`` or ``patch``.

    ``major``: a table removed or a schema version changed; ``minor``: a table added or any table's data
    (sha256 over its data files) changed; ``patch``: tables identical (only metadata changed).
    """
    common = set(parent_tables) & set(tables)
    if set(parent_tables) - set(tables) or any(
        parent_tables[t]["schema_version"] != tables[t]["schema_version"] for t in common
    ):
        return "major"
    if set(tables) - set(parent_tables) or any(parent_tables[t]["sha256"] != tables[t]["sha256"] for t in common):
        return "minor"
    return "patch"


def content_hash(manifest: dict) -> str:
    """sha256 (hex) of the deterministic part of a manifest (the release's identity).

    Covers the manifest ``format``, per table its schema version, rows and data files' (sha256, rows),
    ``config_hash``, ``ontology_version``, ``code_version``, ``key_fingerprint``, ``deid_method_codes`` and
    the input ledger hash (``lineage.input_ledger_sha256``); never times, run ids, versions or Delta
    commit files.
    """
    body = {
        "format": manifest.get("format"),
        "tables": {
            t: {
                "schema_version": v["schema_version"],
                "rows": v["rows"],
                "files": [[f["sha256"], f["rows"]] for f in v.get("files", [])],
            }
            for t, v in sorted(manifest["tables"].items())
        },
        "config_hash": manifest["config_hash"],
        "ontology_version": manifest["ontology_version"],
        "code_version": manifest.get("code_version"),
        "key_fingerprint": manifest.get("key_fingerprint"),
        "deid_method_codes": manifest.get("deid_method_codes"),
        "input_ledger_sha256": (manifest.get("lineage") or {}).get("input_ledger_sha256"),
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def code_version() -> str:
    """The installed ``medreco-db`` distribution version (``0+unknown`` when run from a bare source tree)."""
    try:
        return metadata.version("medreco-db")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "0+unknown"


def table_uri(storage: Storage, table: str) -> str:
    """URI of a table's Delta folder (local path or ``s3://...``)."""
    return storage.full_uri(f"{TABLES_DIR}/{table}")


def sha256_file(storage: Storage, rel: str, chunk: int = 8 * 2**20) -> str:
    """Hex sha256 of a file under the root (:meth:`etl.storage.Storage.sha256`)."""
    return storage.sha256(rel, chunk)


def parquet_rows(storage: Storage, rel: str) -> int:
    with storage.fs.open_input_file(storage.path(rel)) as f:
        return pq.ParquetFile(f).metadata.num_rows


def latest_ledger_run(storage: Storage) -> str | None:
    """Run id of the most recently written run ledger (``ledger/run_id=<run>/ledger.parquet``), if any."""
    best: tuple[float, str] | None = None
    for p in storage.list_files("ledger", recursive=True):
        m = _LEDGER_RE.match(p)
        if m:
            mtime = storage.fs.get_file_info(storage.path(p)).mtime
            stamp = mtime.timestamp() if mtime is not None else 0.0
            if best is None or (stamp, m.group(1)) > best:
                best = (stamp, m.group(1))
    return best[1] if best else None


def input_ledger_summary(storage: Storage, run_id: str | None) -> dict | None:
    """PHI-free summary of a run's inputs (``inputs.parquet``, the clean-build view an incremental run writes,
    else ``ledger.parquet``): a hash of its inputs and counts per status and reason.

    The hash is sha256 over the sorted rows (institution, sha256, bytes, kind, status, reason) as
    canonical JSON: the same input files with the same outcomes give the same hash, wherever the storage
    root is and whatever the run id (source paths and run ids are left out). None when the run has no
    ledger.
    """
    if not run_id:
        return None
    # an incremental run also writes inputs.parquet: every input file with the outcome a clean build of all
    # deliveries gives it (files seen in earlier runs are not 'duplicate' there), so history does not change it
    path = zones.inputs_file(run_id)
    if not storage.is_file(path):
        path = zones.ledger_file(run_id)
    if not storage.is_file(path):
        return None
    t = storage.read_table(path)
    cols = ("institution", "sha256", "bytes", "kind", "status", "reason")
    rows = sorted(zip(*(t[c].to_pylist() for c in cols), strict=True), key=lambda r: tuple(str(x) for x in r))
    digest = hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()
    statuses = Counter(t["status"].to_pylist())
    reasons = Counter(
        r for r, s in zip(t["reason"].to_pylist(), t["status"].to_pylist(), strict=True) if s == "quarantined"
    )
    return {
        "ledger_run_id": run_id,
        "input_ledger_sha256": digest,
        "files_seen": t.num_rows,
        "by_status": dict(sorted(statuses.items())),
        "quarantined_by_reason": dict(sorted(reasons.items())),
    }


def read_snapshot_table(storage: Storage, version: str, table: str, columns: list[str] | None = None) -> pa.Table:
    """One table of a release as a pyarrow Table (the pinned data files in manifest order; sort by the key
    columns where row order matters).

    Raises
    ------
    SnapshotError
        for an unknown release or table.
    """
    parts = [
        pq.read_table(io.BytesIO(storage.read_bytes(p)), columns=columns)
        for p in release_files(storage, version, table)
    ]
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def table_counts(storage: Storage, version: str) -> dict[str, int]:
    """Row count per table of a release, from its manifest."""
    return {t: v["rows"] for t, v in read_manifest(storage, version)["tables"].items()}
