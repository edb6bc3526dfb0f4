"""Versioned snapshots: immutable, reproducible, verifiable releases of every curated table.

Layout under the storage root (a local folder or ``s3://bucket/prefix``)::

    snapshots/tables/<table>/            one Delta Lake table per curated table (``deltalake``), shared by releases:
        part-00000-<sha256>.zstd.parquet   data files, named by the sha256 of their bytes (content addressed)
        _delta_log/<version>.json          one Delta commit per table per release that changed it
    snapshots/<version>/                 one folder per release (semantic version ``MAJOR.MINOR.PATCH``)
        manifest.json                      what the release is (below); written last: no manifest, no release
        manifest.sha256                    sha256 of manifest.json
        DATASET_CARD.md                    counts per institution, modality, entity and split, de-id codes, limits
        publish_log.json                   this publish's run ids and wall-clock time (not hashed, see below)

A release pins, per table, the Delta table version it was published as (time travel:
``DeltaTable(uri, version=n)``), the data files of that version with sha256 and row counts, and the
sha256 of the pinned commit file. Delta gives each table an atomic commit (each commit file is created
only if absent); the manifest, written after every table has committed, is the atomic commit point of
the release as a whole, so all tables of a release are consistent with each other. A table whose content
did not change keeps its Delta version (no empty rewrite); a publish interrupted after some commits is
resumed by the next one (a table whose latest Delta version already holds the wanted files is not
committed again).

Versions: the first release is ``0.1.0``; then, against the latest release, ``MAJOR`` when a table's
schema version changed or a table was removed, ``MINOR`` when rows were added, removed or changed or a
table was added, ``PATCH`` when only metadata in the content hash changed (config hash, ontology
version, code version, key fingerprint, de-identification codes, input ledger). When the content hash
equals the latest release's, nothing is written and that release is returned.

Reproducibility: the same curated tables, config, code and key, published on a root with the same
release history at the same release time, give a byte-identical release: the same ``manifest.json``
(hence ``manifest.sha256``), dataset card, data files and Delta commit files. To that end

- data files: rows sorted by key, written by pyarrow with fixed options, named by their sha256;
- Delta commit files are written here (newline-delimited JSON actions, keys in a fixed order), not by
  ``deltalake``, whose commits hold the clock and a random table id: every Delta timestamp is the release
  time, the table id is a name-based UUID of the table and key fingerprint (:func:`delta_table_id`);
- the release time (manifest ``created_at`` and ``source_date_epoch``) is ``SOURCE_DATE_EPOCH`` when set
  (reproducible-builds.org), else the clock; a release is rebuilt by setting ``SOURCE_DATE_EPOCH`` to its
  manifest's ``source_date_epoch``;
- lineage in the manifest is the path- and run-free hash and counts of the input ledger; run ids and the
  wall-clock publish time, which differ between rebuilds, are kept in ``publish_log.json``, which
  :func:`verify` does not hash.

The content hash (:func:`content_hash`) is narrower still: it leaves out times, versions and Delta
commit files, so it also matches across roots with different histories.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import math
import os
import posixpath
import re
import tempfile
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from etl.storage import Storage
from schemas.base import key_columns, schema_version
from schemas.tables import SCHEMAS, SNAPSHOT_TABLES

#: manifest format written by this module; ``/3``: release time from ``SOURCE_DATE_EPOCH``, no run ids (they
#: are in the publish log), Delta commit files written deterministically
FORMAT = "medreco-snapshot/3"
#: manifest formats :func:`verify` and the readers accept (``/2`` differs only in what it records)
READ_FORMATS = ("medreco-snapshot/2", FORMAT)
TABLES_DIR = "snapshots/tables"
MANIFEST = "manifest.json"
MANIFEST_SHA = "manifest.sha256"
CARD = "DATASET_CARD.md"
PUBLISH_LOG = "publish_log.json"
#: a table is split into data files of about this many bytes (Arrow in-memory size), rows kept in key order
TARGET_FILE_BYTES = 256 * 2**20
#: row groups of about this many bytes: small enough to fetch one image payload without reading a whole file
ROW_GROUP_BYTES = 8 * 2**20
#: Delta table properties: never drop old commit files (releases pin old versions: time travel must work)
DELTA_CONFIGURATION = {"delta.enableExpiredLogCleanup": "false"}
_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")
_LEDGER_RE = re.compile(r"^ledger/run_id=([^/]+)/ledger\.parquet$")


class SnapshotError(RuntimeError):
    """Raised for a missing release, a release whose files do not match its manifest, or a failed publish."""


@dataclass(frozen=True)
class Release:
    """A published release: its version, folder URI and manifest; ``created`` is False for an existing one."""

    version: str
    path: str
    manifest: dict
    created: bool


@dataclass(frozen=True)
class DataFile:
    """One Parquet data file of a table: its name in the Delta table folder, bytes, sha256 and rows."""

    name: str
    data: bytes = field(repr=False)
    sha256: str
    rows: int


@dataclass(frozen=True)
class TableDiff:
    """Rows of one table that differ between two releases, identified by the table's key columns.

    ``added``/``removed``/``changed`` hold key tuples (in ``key`` column order), sorted; ``status`` is
    ``unchanged``, ``changed``, ``added_table`` or ``removed_table``; ``schema`` is ``(old, new)`` schema
    versions when they differ (only the common columns are compared then).
    """

    table: str
    key: tuple[str, ...]
    status: str
    added: list[tuple] = field(default_factory=list)
    removed: list[tuple] = field(default_factory=list)
    changed: list[tuple] = field(default_factory=list)
    schema: tuple[str | None, str | None] | None = None

    def to_dict(self) -> dict:
        """JSON-ready form (key tuples become lists)."""
        return {"table": self.table, "key": list(self.key), "status": self.status, "schema": self.schema,
                "added": [list(k) for k in self.added], "removed": [list(k) for k in self.removed],
                "changed": [list(k) for k in self.changed]}


# ---- versions and manifests ---------------------------------------------------------------------------------

def _vkey(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def list_versions(storage: Storage) -> list[str]:
    """Published versions (folders ``snapshots/<MAJOR.MINOR.PATCH>/`` holding a manifest), oldest first."""
    if not storage.exists("snapshots"):
        return []
    folders = storage.fs.get_file_info(pafs.FileSelector(storage.path("snapshots"), recursive=False))
    names = [posixpath.basename(f.path) for f in folders if f.type == pafs.FileType.Directory]
    versions = [v for v in names if _VERSION_RE.match(v) and storage.is_file(f"snapshots/{v}/{MANIFEST}")]
    return sorted(versions, key=_vkey)


def resolve_version(storage: Storage, version: str = "latest") -> str:
    """``"latest"`` -> the newest published version; any other value is checked to exist.

    Raises
    ------
    SnapshotError
        when there is no release, or no release ``version``.
    """
    versions = list_versions(storage)
    if version == "latest":
        if not versions:
            raise SnapshotError(f"no published snapshot under {storage.full_uri('snapshots')}")
        return versions[-1]
    if version not in versions:
        raise SnapshotError(f"no snapshot {version} under {storage.full_uri('snapshots')}"
                            + (f" (published: {', '.join(versions)})" if versions else ""))
    return version


def read_manifest(storage: Storage, version: str) -> dict:
    """The manifest of one release (``version`` may be ``"latest"``).

    Raises
    ------
    SnapshotError
        if there is no such release.
    """
    if version == "latest":
        version = resolve_version(storage)
    path = f"snapshots/{version}/{MANIFEST}"
    if not storage.is_file(path):
        raise SnapshotError(f"no snapshot {version} under {storage.full_uri('snapshots')}")
    return json.loads(storage.read_text(path))


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
            parent_tables[t]["schema_version"] != tables[t]["schema_version"] for t in common):
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
        "tables": {t: {"schema_version": v["schema_version"], "rows": v["rows"],
                       "files": [[f["sha256"], f["rows"]] for f in v.get("files", [])]}
                   for t, v in sorted(manifest["tables"].items())},
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


# ---- storage helpers ----------------------------------------------------------------------------------------

def table_uri(storage: Storage, table: str) -> str:
    """URI of a table's Delta folder (local path or ``s3://...``)."""
    return storage.full_uri(f"{TABLES_DIR}/{table}")


def delta_storage_options(storage: Storage) -> dict[str, str] | None:
    """``storage_options`` for ``deltalake``/``polars`` (object_store keys) matching a :class:`Storage`.

    None for a local folder. For S3: region, endpoint (``aws_endpoint_url``, with ``aws_allow_http`` for
    ``http://`` endpoints such as moto or MinIO) and explicit keys when the filesystem was given any; other
    credentials come from the standard AWS environment, as for pyarrow. The settings are read from the
    pyarrow ``S3FileSystem`` itself (its pickled constructor arguments), so one opened storage root
    configures every client.
    """
    if storage.is_local:
        return None
    reduced = storage.fs.__reduce__()
    kwargs: dict[str, Any] = reduced[1][0] if len(reduced) > 1 and reduced[1] and isinstance(reduced[1][0], dict) else {}
    opts = {"aws_region": kwargs.get("region") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"}
    endpoint = kwargs.get("endpoint_override") or os.environ.get("AWS_ENDPOINT_URL") or os.environ.get(
        "AWS_ENDPOINT_URL_S3")
    if endpoint:
        url = endpoint if "://" in endpoint else f"{kwargs.get('scheme') or 'https'}://{endpoint}"
        opts["aws_endpoint_url"] = url
        if url.startswith("http://"):
            opts["aws_allow_http"] = "true"
    for src, dst in (("access_key", "aws_access_key_id"), ("secret_key", "aws_secret_access_key"),
                     ("session_token", "aws_session_token")):
        if kwargs.get(src):
            opts[dst] = kwargs[src]
    return opts


def _sha256_file(storage: Storage, rel: str, chunk: int = 8 * 2**20) -> str:
    h = hashlib.sha256()
    with storage.fs.open_input_stream(storage.path(rel)) as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def _parquet_rows(storage: Storage, rel: str) -> int:
    with storage.fs.open_input_file(storage.path(rel)) as f:
        return pq.ParquetFile(f).metadata.num_rows


# ---- data files ---------------------------------------------------------------------------------------------

def _row_group_rows(table: pa.Table) -> int:
    if table.num_rows == 0:
        return 1
    per_row = max(1, table.nbytes // table.num_rows)
    return int(min(65536, max(1, ROW_GROUP_BYTES // per_row)))


def encode_data_files(table: pa.Table, target_bytes: int = TARGET_FILE_BYTES) -> list[DataFile]:
    """Split a key-sorted table into Parquet data files with deterministic bytes and names.

    Parameters
    ----------
    table : pyarrow.Table
        rows already in key order.
    target_bytes : int
        about this many bytes (Arrow in-memory size) per file; at least one file, even for no rows.

    Returns
    -------
    list of DataFile
        ``part-<index:05d>-<sha256>.zstd.parquet``, zstd, statistics, the Arrow schema stored (its
        ``medreco.*`` metadata included), row groups of about :data:`ROW_GROUP_BYTES`.
    """
    n_files = max(1, math.ceil(table.nbytes / target_bytes)) if table.num_rows else 1
    per_file = max(1, math.ceil(table.num_rows / n_files))
    rg = _row_group_rows(table)
    out = []
    for i in range(n_files):
        part = table.slice(i * per_file, per_file)
        buf = io.BytesIO()
        pq.write_table(part, buf, compression="zstd", write_statistics=True, store_schema=True, row_group_size=rg)
        data = buf.getvalue()
        sha = hashlib.sha256(data).hexdigest()
        out.append(DataFile(f"part-{i:05d}-{sha}.zstd.parquet", data, sha, part.num_rows))
    return out


def _curated_table(storage: Storage, table: str) -> pa.Table:
    schema = SCHEMAS[table]
    t = storage.read_table(f"curated/{table}", schema=schema)
    if t.num_rows:
        t = t.sort_by([(k, "ascending") for k in key_columns(schema)])
    return t


def _table_data_sha256(files: Sequence[dict]) -> str:
    return hashlib.sha256("\n".join(f["sha256"] for f in files).encode()).hexdigest()


# ---- Delta tables -------------------------------------------------------------------------------------------

def _is_delta_table(storage: Storage, table: str) -> bool:
    # checked through Storage (pyarrow), not DeltaTable.is_deltatable: the latter's listing hangs against
    # moto's S3 server (deltalake 1.6.6, moto 5.2.5), while opening a table works
    return any(p.endswith(".json") for p in storage.list_files(f"{TABLES_DIR}/{table}/_delta_log", recursive=False))


def _delta_files(storage: Storage, table: str, version: int | None = None) -> tuple[int | None, list[str]]:
    """(Delta version, data file names) of a table's latest (or given) version; (None, []) if no table."""
    from deltalake import DeltaTable

    uri, opts = table_uri(storage, table), delta_storage_options(storage)
    if version is None and not _is_delta_table(storage, table):
        return None, []
    dtab = DeltaTable(uri, version=version, storage_options=opts)
    return dtab.version(), sorted(posixpath.basename(u) for u in dtab.file_uris())


def delta_table_id(table: str, key_fingerprint: str) -> str:
    """The Delta table id (``metaData.id``) of a snapshot table: a name-based UUID (RFC 9562 version 5).

    Derived from the table name and the pseudonymisation key fingerprint, so a rebuild of the same data
    under the same key creates the same table id on any storage root (Delta readers only need it to be
    stable for the table's life; ``deltalake`` would draw a random one).
    """
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"medreco-db:{TABLES_DIR}/{table}?key_fingerprint={key_fingerprint}"))


def _protocol_action(p: dict) -> dict:
    """A Delta ``protocol`` action in a fixed key order (feature lists sorted; only where the versions allow)."""
    out: dict[str, Any] = {"minReaderVersion": int(p["minReaderVersion"]), "minWriterVersion": int(p["minWriterVersion"])}
    if out["minReaderVersion"] >= 3:
        out["readerFeatures"] = sorted(p.get("readerFeatures") or [])
    if out["minWriterVersion"] >= 7:
        out["writerFeatures"] = sorted(p.get("writerFeatures") or [])
    return out


def _delta_table_template(table: str) -> tuple[dict, dict]:
    """(``protocol``, ``metaData``) actions that ``deltalake`` writes when it creates this table.

    ``deltalake`` maps the Arrow schema to Delta's (``schemaString``) and picks the protocol the types need
    (``timestampNtz`` for a timestamp without time zone ...); it does so in a scratch local folder, whose
    commit is read back and discarded. The caller replaces the random ``id`` and the clock ``createdTime``.
    """
    from deltalake import DeltaTable

    with tempfile.TemporaryDirectory(prefix="medreco-delta-") as tmp:
        DeltaTable.create(tmp, SCHEMAS[table], name=table, description=f"MedReCo-DB table {table}",
                          configuration=DELTA_CONFIGURATION)
        with open(posixpath.join(tmp, "_delta_log", f"{0:020d}.json"), encoding="utf-8") as f:
            actions = {k: v for line in f if line.strip() for k, v in json.loads(line).items()}
    return _protocol_action(actions["protocol"]), actions["metaData"]


def _metadata_action(template: dict, table_id: str, created_ms: int) -> dict:
    """A Delta ``metaData`` action in a fixed key order from ``deltalake``'s (``id``/``createdTime`` replaced)."""
    return {"id": table_id, "name": template.get("name"), "description": template.get("description"),
            "format": {"provider": "parquet", "options": {}}, "schemaString": template["schemaString"],
            "partitionColumns": list(template.get("partitionColumns") or []), "createdTime": created_ms,
            "configuration": dict(sorted((template.get("configuration") or {}).items()))}


def _protocol_needed(current: dict, wanted: dict) -> dict | None:
    """The protocol to commit so the table supports ``wanted``'s features; None when ``current`` does."""
    features = lambda p, k: set(p.get(k) or [])  # noqa: E731
    if (wanted["minReaderVersion"] <= current["minReaderVersion"]
            and wanted["minWriterVersion"] <= current["minWriterVersion"]
            and features(wanted, "readerFeatures") <= features(current, "readerFeatures")
            and features(wanted, "writerFeatures") <= features(current, "writerFeatures")):
        return None
    return _protocol_action({
        "minReaderVersion": max(current["minReaderVersion"], wanted["minReaderVersion"]),
        "minWriterVersion": max(current["minWriterVersion"], wanted["minWriterVersion"]),
        "readerFeatures": features(current, "readerFeatures") | features(wanted, "readerFeatures"),
        "writerFeatures": features(current, "writerFeatures") | features(wanted, "writerFeatures")})


def _s3_client(storage: Storage) -> Any:
    """A boto3 S3 client configured like the storage's pyarrow filesystem (:func:`delta_storage_options`)."""
    import boto3

    opts = delta_storage_options(storage) or {}
    return boto3.client("s3", region_name=opts.get("aws_region"), endpoint_url=opts.get("aws_endpoint_url"),
                        aws_access_key_id=opts.get("aws_access_key_id"),
                        aws_secret_access_key=opts.get("aws_secret_access_key"),
                        aws_session_token=opts.get("aws_session_token"))


def put_if_absent(storage: Storage, rel: str, data: bytes) -> bool:
    """Create a file only if no file exists at ``rel`` (atomic); False, writing nothing, if one does.

    This is the mutual exclusion a Delta commit needs (two writers never both create version N). Local:
    the bytes go to a temporary file beside the target's folder, which is hard-linked to the target
    (``link`` fails if the target exists; readers see the whole file or none). S3: ``PutObject`` with
    ``If-None-Match: *`` (conditional write, refused with 412 Precondition Failed if the key exists).

    Raises
    ------
    OSError, botocore.exceptions.ClientError
        for other storage errors.
    """
    target = storage.path(rel)
    if storage.is_local:
        parent = posixpath.dirname(target)
        storage.fs.create_dir(parent, recursive=True)
        tmp = f"{posixpath.dirname(parent)}/.tmp-{uuid.uuid4().hex}-{posixpath.basename(target)}"
        with open(tmp, "wb") as f:
            f.write(data)
        try:
            os.link(tmp, target)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        return True
    from botocore.exceptions import ClientError

    bucket, _, key = target.partition("/")
    try:
        _s3_client(storage).put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict", "412"):
            return False
        raise
    return True


def _delta_log(table: str, version: int) -> str:
    return f"{TABLES_DIR}/{table}/_delta_log/{version:020d}.json"


def _write_commit(storage: Storage, table: str, version: int, actions: list[dict]) -> None:
    """Write one Delta commit file: newline-delimited JSON actions (compact, keys in the order given)."""
    data = "\n".join(json.dumps(a, separators=(",", ":"), ensure_ascii=False) for a in actions).encode()
    if not put_if_absent(storage, _delta_log(table, version), data):
        raise SnapshotError(f"{table}: another writer committed Delta version {version} of "
                            f"{table_uri(storage, table)} during the publish")


def _commit_info(operation: str, parameters: dict, epoch_ms: int, release: str, read_version: int | None) -> dict:
    info: dict[str, Any] = {"timestamp": epoch_ms, "operation": operation, "operationParameters": parameters}
    if read_version is not None:
        info.update(readVersion=read_version, isBlindAppend=False)
    info.update({"engineInfo": f"medreco-db/{code_version()}", "medreco.release": release})
    return {"commitInfo": info}


def _commit_table(storage: Storage, table: str, files: list[DataFile], release: str, epoch_ms: int,
                  key_fingerprint: str) -> int:
    """Commit ``files`` as the whole content of a table's Delta table; return the new Delta version.

    The commit files are written here, not by ``deltalake``, so that their bytes depend only on the
    release: commit ``timestamp``, ``modificationTime``, ``deletionTimestamp`` and ``createdTime`` are
    ``epoch_ms`` (the release time), the table id is :func:`delta_table_id`, keys are in a fixed order.
    A new table gets version 0 (``commitInfo``, ``protocol``, ``metaData``: what ``deltalake`` would
    write, see :func:`_delta_table_template`); the data commit removes the files of the current version
    that are not wanted and adds the wanted files that are not there (sorted by path), with a new
    ``metaData`` (and ``protocol`` if needed) when the schema changed. Each commit is created with
    :func:`put_if_absent` (Delta's mutual exclusion), then read back with ``deltalake``.

    Raises
    ------
    SnapshotError
        when another writer committed to the table meanwhile.
    """
    from deltalake import DeltaTable

    uri, opts = table_uri(storage, table), delta_storage_options(storage)
    protocol, template = _delta_table_template(table)
    schema_string = template["schemaString"]
    extra: list[dict] = []
    if not _is_delta_table(storage, table):
        _write_commit(storage, table, 0, [
            _commit_info("CREATE TABLE", {"mode": "ErrorIfExists"}, epoch_ms, release, None),
            {"protocol": protocol},
            {"metaData": _metadata_action(template, delta_table_id(table, key_fingerprint), epoch_ms)}])
        before, current = 0, []
    else:
        dtab = DeltaTable(uri, storage_options=opts)
        before = dtab.version()
        current = sorted(posixpath.basename(u) for u in dtab.file_uris())
        p = dtab.protocol()
        needed = _protocol_needed({"minReaderVersion": p.min_reader_version, "minWriterVersion": p.min_writer_version,
                                   "readerFeatures": p.reader_features, "writerFeatures": p.writer_features}, protocol)
        if needed:
            extra.append({"protocol": needed})
        if json.loads(dtab.schema().to_json()) != json.loads(schema_string):
            meta = dtab.metadata()
            extra.append({"metaData": _metadata_action(
                {"name": meta.name, "description": meta.description, "schemaString": schema_string,
                 "partitionColumns": meta.partition_columns, "configuration": meta.configuration},
                meta.id, epoch_ms)})
    wanted = {f.name: f for f in files}
    actions = [_commit_info("WRITE", {"mode": "Overwrite", "partitionBy": "[]"}, epoch_ms, release, before), *extra]
    for name in current:
        if name not in wanted:
            size = storage.fs.get_file_info(storage.path(f"{TABLES_DIR}/{table}/{name}")).size
            actions.append({"remove": {"path": name, "deletionTimestamp": epoch_ms, "dataChange": True,
                                       "extendedFileMetadata": True, "partitionValues": {}, "size": size}})
    for name in sorted(set(wanted) - set(current)):
        f = wanted[name]
        actions.append({"add": {"path": name, "partitionValues": {}, "size": len(f.data), "modificationTime": epoch_ms,
                                "dataChange": True,
                                "stats": json.dumps({"numRecords": f.rows}, separators=(",", ":"))}})
    _write_commit(storage, table, before + 1, actions)
    version, names = _delta_files(storage, table)
    if version != before + 1 or names != sorted(wanted):
        raise SnapshotError(f"{table}: another writer committed to {uri} during the publish (version {version})")
    return version


# ---- lineage ------------------------------------------------------------------------------------------------

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
    path = f"ledger/run_id={run_id}/inputs.parquet"
    if not storage.is_file(path):
        path = f"ledger/run_id={run_id}/ledger.parquet"
    if not storage.is_file(path):
        return None
    t = storage.read_table(path)
    cols = ("institution", "sha256", "bytes", "kind", "status", "reason")
    rows = sorted(zip(*(t[c].to_pylist() for c in cols), strict=True), key=lambda r: tuple(str(x) for x in r))
    digest = hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()
    statuses = Counter(t["status"].to_pylist())
    reasons = Counter(r for r, s in zip(t["reason"].to_pylist(), t["status"].to_pylist(), strict=True)
                      if s == "quarantined")
    return {"ledger_run_id": run_id, "input_ledger_sha256": digest, "files_seen": t.num_rows,
            "by_status": dict(sorted(statuses.items())), "quarantined_by_reason": dict(sorted(reasons.items()))}


# ---- publish ------------------------------------------------------------------------------------------------

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
        value, origin = source_date_epoch, "argument"
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
    rel = f"snapshots/{version}/{PUBLISH_LOG}"
    return json.loads(storage.read_text(rel)) if storage.is_file(rel) else None


def publish(storage: Storage, *, config_hash: str, ontology_version: str, run_id: str, key_fingerprint: str,
            deid_method_codes: Sequence[Sequence[str]] = (), ledger_run_id: str | None = None,
            run_ids: Sequence[str] | None = None, source_date_epoch: int | str | None = None) -> Release:
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
    data = {t: _curated_table(storage, t) for t in SNAPSHOT_TABLES}
    files = {t: encode_data_files(tbl) for t, tbl in data.items()}
    tables: dict[str, dict] = {}
    for t, fs in files.items():
        entries = [{"path": f.name, "sha256": f.sha256, "rows": f.rows, "bytes": len(f.data)} for f in fs]
        tables[t] = {"uri": f"{TABLES_DIR}/{t}", "schema_version": schema_version(SCHEMAS[t]),
                     "key": key_columns(SCHEMAS[t]), "rows": data[t].num_rows,
                     "sha256": _table_data_sha256(entries), "files": entries}
    if ledger_run_id is None:
        ledger_run_id = run_id if storage.is_file(f"ledger/run_id={run_id}/ledger.parquet") else latest_ledger_run(storage)
    inputs = input_ledger_summary(storage, ledger_run_id)
    lineage = {k: v for k, v in (inputs or {"input_ledger_sha256": None}).items() if k != "ledger_run_id"}
    manifest: dict[str, Any] = {
        "format": FORMAT, "config_hash": config_hash, "ontology_version": ontology_version,
        "code_version": code_version(), "key_fingerprint": key_fingerprint,
        "deid_method_codes": [list(c) for c in deid_method_codes],
        "schema_versions": {t: v["schema_version"] for t, v in tables.items()},
        "lineage": lineage,
        "tables": tables,
    }
    manifest["content_hash"] = content_hash(manifest)

    versions = list_versions(storage)
    parent = versions[-1] if versions else None
    if parent:
        problems = verify(storage, parent)
        if problems:
            raise SnapshotError(f"latest snapshot {parent} failed verification, refusing to publish on top of it: "
                                + "; ".join(problems))
        latest = read_manifest(storage, parent)
        if latest["content_hash"] == manifest["content_hash"]:
            return Release(parent, storage.full_uri(f"snapshots/{parent}"), latest, created=False)
        change = change_kind(latest["tables"], tables)
    else:
        change = "initial"
    version = bump_version(parent, change)

    epoch_ms = epoch * 1000
    for t, fs in files.items():
        for f in fs:
            rel = f"{TABLES_DIR}/{t}/{f.name}"
            if not (storage.is_file(rel) and _sha256_file(storage, rel) == f.sha256):
                storage.write_bytes(rel, f.data)
        delta_version, names = _delta_files(storage, t)
        if delta_version is None or names != sorted(f.name for f in fs):
            delta_version = _commit_table(storage, t, fs, version, epoch_ms, key_fingerprint)
        log = _delta_log(t, delta_version)
        tables[t]["delta_version"] = delta_version
        tables[t]["delta_log"] = {"path": log.removeprefix(f"{TABLES_DIR}/{t}/"), "sha256": _sha256_file(storage, log)}

    manifest.update(version=version, parent=parent, change=change, source_date_epoch=epoch,
                    created_at=dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat(timespec="seconds"),
                    table_format="delta")
    base = f"snapshots/{version}"
    card = dataset_card(manifest, card_facts(data, inputs)).encode()
    manifest["card_sha256"] = hashlib.sha256(card).hexdigest()
    storage.write_bytes(f"{base}/{CARD}", card)
    log_record = {"version": version, "published_at": published_at.isoformat(timespec="seconds"),
                  "publish_run_id": run_id, "run_ids": list(run_ids or [run_id]), "ledger_run_id": ledger_run_id,
                  "source_date_epoch": epoch, "source_date_epoch_from": epoch_origin}
    storage.write_text(f"{base}/{PUBLISH_LOG}", json.dumps(log_record, indent=1, sort_keys=True))
    text = json.dumps(manifest, indent=1, sort_keys=True).encode()
    storage.write_bytes(f"{base}/{MANIFEST}", text)
    storage.write_text(f"{base}/{MANIFEST_SHA}", hashlib.sha256(text).hexdigest() + "\n")
    if storage.is_local:  # immutable on disk too: read-only files (Delta only ever adds files)
        pinned = [f"{base}/{n}" for n in (CARD, PUBLISH_LOG, MANIFEST, MANIFEST_SHA)]
        for t, v in tables.items():
            pinned += [f"{TABLES_DIR}/{t}/{f['path']}" for f in v["files"]]
            pinned += [_delta_log(t, n) for n in range(v["delta_version"] + 1)
                       if storage.is_file(_delta_log(t, n))]
        for rel in pinned:
            os.chmod(storage.path(rel), 0o444)
    return Release(version, storage.full_uri(base), manifest, created=True)


# ---- dataset card -------------------------------------------------------------------------------------------

def _counts(table: pa.Table, column: str, distinct: str | None = None) -> dict[str, int]:
    if table.num_rows == 0 or column not in table.column_names:
        return {}
    if distinct:
        pairs = set(zip(table[column].to_pylist(), table[distinct].to_pylist(), strict=True))
        return dict(sorted(Counter(str(a) for a, _ in pairs).items()))
    return dict(sorted(Counter(str(v) for v in table[column].to_pylist()).items()))


def _by_split(table: pa.Table, split_of: dict[str, str], distinct: str | None = None) -> dict[str, int]:
    if table.num_rows == 0:
        return {}
    keys = table[distinct].to_pylist() if distinct else range(table.num_rows)
    seen = set()
    out: Counter = Counter()
    for k, p in zip(keys, table["patient_key"].to_pylist(), strict=True):
        if k in seen:
            continue
        seen.add(k)
        out[split_of.get(p, "unassigned")] += 1
    return dict(sorted(out.items()))


def card_facts(tables: dict[str, pa.Table], inputs: dict | None = None) -> dict:
    """Counts for the dataset card, computed from a release's tables (PHI-free: codes and counts only).

    Returns
    -------
    dict
        ``institution``/``modality``/``split``: ``{value: {measure: count}}``; ``entity``: ``{entity_id:
        {"studies_present": n, "mentions": n}}``; ``report_links``: reports per ``link_status``;
        ``inputs``: the input ledger summary (or None); ``empty_tables``: tables with no rows.
    """
    empty = pa.table({})
    get = lambda name: tables.get(name, empty)  # noqa: E731
    studies, images, reports, pairs, vqa, splits = (get(n) for n in ("studies", "images", "reports", "pairs",
                                                                      "vqa", "splits"))

    def merge(**measures: dict[str, int]) -> dict[str, dict[str, int]]:
        values = sorted({v for m in measures.values() for v in m})
        return {v: {name: m.get(v, 0) for name, m in measures.items()} for v in values}

    split_of = dict(zip(splits["patient_key"].to_pylist(), splits["split"].to_pylist(), strict=True)) \
        if splits.num_rows else {}
    labels, mentions = get("study_labels"), get("entity_mentions")
    present = labels.filter(pc.equal(labels["state"], "present")) if labels.num_rows else labels
    entity = merge(studies_present=_counts(present, "entity_id", distinct="study_key"),
                   mentions=_counts(mentions, "entity_id"))
    return {
        "institution": merge(patients=_counts(splits, "institution"), studies=_counts(studies, "institution"),
                             images=_counts(images, "institution"), reports=_counts(reports, "institution")),
        "modality": merge(studies=_counts(studies, "modality"), images=_counts(images, "modality"),
                          pairs=_counts(pairs, "modality")),
        "split": merge(patients=_counts(splits, "split"), studies=_by_split(studies, split_of),
                       pairs=_by_split(pairs, split_of), vqa_items=_counts(vqa, "split")),
        "entity": entity,
        "report_links": _counts(reports, "link_status"),
        "inputs": inputs,
        "empty_tables": sorted(t for t, tbl in tables.items() if tbl.num_rows == 0),
    }


def _entity_names() -> dict[str, tuple[str, str]]:
    try:
        from schemas.ontology import load_ontology

        return {c.id: (c.preferred_name, c.category) for c in load_ontology().concepts.values()}
    except (OSError, KeyError, ValueError):  # the card still lists ids
        return {}


def _grid(title: str, rows: dict[str, dict[str, int]], first: str) -> list[str]:
    if not rows:
        return ["", f"## {title}", "", "(none)"]
    measures = list(next(iter(rows.values())))
    out = ["", f"## {title}", "", "| " + " | ".join([first, *measures]) + " |",
           "|---|" + "---:|" * len(measures)]
    out += ["| " + " | ".join([k, *(str(v[m]) for m in measures)]) + " |" for k, v in rows.items()]
    return out


#: limitations that hold for every release (the card adds the release's own: quarantines, empty tables ...)
KNOWN_LIMITATIONS = (
    "Report text de-identification is rule based; residual PHI in free text is possible and should be reported.",
    "Entity labels come from rule-based extraction (medspaCy ConText), not from human annotation.",
    "Dates are shifted per patient (intervals within a patient are kept); absolute dates and seasons are not real.",
    "Images flagged at risk of burned-in text are quarantined unless a pixel-cleaning rule covers the device, so "
    "some modalities (ultrasound, secondary capture) are under-represented.",
    "Splits are patient level; `external_test` holds whole institutions out and differs in case mix by design.",
)


def dataset_card(manifest: dict, facts: dict) -> str:
    """Markdown dataset card of a release (deterministic: no time, no storage location).

    Parameters
    ----------
    manifest : dict
        the release manifest (version, parent, hashes, tables, de-id codes).
    facts : dict
        from :func:`card_facts`.
    """
    codes = manifest.get("deid_method_codes") or []
    lines = [
        f"# MedReCo-DB snapshot {manifest['version']}",
        "",
        f"- parent: {manifest['parent'] or 'none'} ({manifest.get('change', 'initial')} change)",
        f"- content hash: `{manifest['content_hash']}`",
        f"- code {manifest['code_version']}; config hash `{manifest['config_hash']}`; ontology "
        f"{manifest['ontology_version']}; key fingerprint `{manifest['key_fingerprint']}`",
        "- format: one Delta Lake table per table under `snapshots/tables/<table>/`, pinned per release "
        "(manifest.json: Delta version, data files, sha256, rows)",
        "",
        "Load it: `from etl.snapshots import load_snapshot; snap = load_snapshot(ROOT, version=\""
        f"{manifest['version']}\"); snap.table(\"pairs\")` (polars LazyFrame). "
        f"Check it: `medreco snapshot verify {manifest['version']}`.",
        "",
        "## Tables",
        "",
        "| table | rows | schema | key | files |",
        "|---|---:|---|---|---:|",
    ]
    lines += [f"| {t} | {v['rows']} | {v['schema_version']} | {', '.join(v.get('key', []))} | "
              f"{len(v.get('files', []))} |" for t, v in manifest["tables"].items()]
    lines += _grid("Counts per institution", facts.get("institution", {}), "institution")
    lines += _grid("Counts per modality", facts.get("modality", {}), "modality")
    lines += _grid("Counts per split", facts.get("split", {}), "split")
    names = _entity_names()
    entity = {f"{e} {names[e][0]} ({names[e][1]})" if e in names else e: v
              for e, v in facts.get("entity", {}).items()}
    lines += _grid("Entities (studies labelled present, mentions in reports)", entity, "entity")
    lines += ["", "## De-identification", "",
              "DICOM PS3.15 Annex E, DeidentificationMethodCodeSequence (CID 7050, scheme DCM):", ""]
    lines += [f"- `{c}` {m}" for c, m in codes] or ["- (not recorded)"]
    lines += ["", "Pseudonyms are keyed HMAC-SHA256 values; UIDs are remapped to `2.25.<keyed hash>`; report "
              "text is scrubbed by the rule-based text de-identifier."]
    inputs = facts.get("inputs")
    limits = list(KNOWN_LIMITATIONS)
    if inputs:
        lines += ["", "## Inputs", "", f"{inputs['files_seen']} input files in the run ledger "
                  f"(input ledger sha256 `{inputs['input_ledger_sha256']}`):", ""]
        lines += [f"- {s}: {n}" for s, n in inputs["by_status"].items()]
        if inputs["quarantined_by_reason"]:
            limits.append("Quarantined inputs are not in this release: " + ", ".join(
                f"{r} {n}" for r, n in inputs["quarantined_by_reason"].items()) + ".")
    links = {k: v for k, v in facts.get("report_links", {}).items() if k != "linked"}
    if links:
        limits.append("Reports without an image study in this release: " + ", ".join(
            f"{k} {v}" for k, v in links.items()) + ".")
    if facts.get("empty_tables"):
        limits.append("Tables with no rows in this release: " + ", ".join(facts["empty_tables"]) + ".")
    lines += ["", "## Known limitations", ""] + [f"- {x}" for x in limits] + [""]
    return "\n".join(lines)


# ---- verify -------------------------------------------------------------------------------------------------

def verify(storage: Storage, version: str) -> list[str]:
    """Check a release against its manifest; return the problems found (empty when intact).

    Checks: ``manifest.sha256`` against the manifest's bytes; the manifest format; for every table each
    data file's presence, sha256 (re-hashed, streamed) and row count (Parquet footer), the pinned Delta
    commit file's presence and sha256, and that the pinned Delta version lists exactly the manifest's data
    files; the dataset card's sha256; the content hash recomputed from the manifest; that the publish log,
    if any, names this release (it is not hashed: it records run ids and the wall-clock time); and that
    the release folder holds no other file. Each problem names the file.

    Raises
    ------
    SnapshotError
        when the release does not exist.
    """
    version = resolve_version(storage, version) if version == "latest" else version
    base = f"snapshots/{version}"
    manifest = read_manifest(storage, version)
    problems = []
    text = storage.read_bytes(f"{base}/{MANIFEST}")
    if not storage.is_file(f"{base}/{MANIFEST_SHA}"):
        problems.append(f"missing file {base}/{MANIFEST_SHA}")
    elif storage.read_text(f"{base}/{MANIFEST_SHA}").strip() != hashlib.sha256(text).hexdigest():
        problems.append(f"{base}/{MANIFEST} does not match {MANIFEST_SHA} (manifest edited)")
    if manifest.get("format") not in READ_FORMATS:
        return problems + [f"{base}/{MANIFEST}: unsupported manifest format {manifest.get('format')!r} "
                           f"(this code reads {', '.join(READ_FORMATS)})"]
    for t, v in manifest["tables"].items():
        folder = v["uri"]
        for f in v["files"]:
            rel = f"{folder}/{f['path']}"
            if not storage.is_file(rel):
                problems.append(f"{t}: missing file {rel}")
            elif _sha256_file(storage, rel) != f["sha256"]:
                problems.append(f"{t}: sha256 mismatch in {rel}")
            else:
                rows = _parquet_rows(storage, rel)
                if rows != f["rows"]:
                    problems.append(f"{t}: {rows} rows in {rel}, manifest says {f['rows']}")
        if sum(f["rows"] for f in v["files"]) != v["rows"] or _table_data_sha256(v["files"]) != v["sha256"]:
            problems.append(f"{t}: table rows/sha256 do not match its files in {base}/{MANIFEST}")
        log = f"{folder}/{v['delta_log']['path']}"
        if not storage.is_file(log):
            problems.append(f"{t}: missing file {log}")
            continue
        if _sha256_file(storage, log) != v["delta_log"]["sha256"]:
            problems.append(f"{t}: sha256 mismatch in {log}")
        try:
            _, names = _delta_files(storage, t, v["delta_version"])
        except Exception as err:  # noqa: BLE001 - any Delta read error is a verification failure
            problems.append(f"{t}: Delta version {v['delta_version']} of {folder} unreadable: {err}".splitlines()[0])
            continue
        if names != sorted(f["path"] for f in v["files"]):
            problems.append(f"{t}: Delta version {v['delta_version']} of {folder} lists other files than the manifest")
    card = f"{base}/{CARD}"
    if not storage.is_file(card):
        problems.append(f"missing file {card}")
    elif _sha256_file(storage, card) != manifest.get("card_sha256"):
        problems.append(f"{card}: sha256 mismatch")
    if content_hash(manifest) != manifest["content_hash"]:
        problems.append(f"{base}/{MANIFEST}: content_hash does not match its tables and metadata")
    log = f"{base}/{PUBLISH_LOG}"
    if storage.is_file(log):
        try:
            named = json.loads(storage.read_text(log)).get("version")
        except (ValueError, AttributeError):
            named = None
        if named != version:
            problems.append(f"{log}: not the publish log of {version}")
    listed = {f"{base}/{n}" for n in (MANIFEST, MANIFEST_SHA, CARD, PUBLISH_LOG)}
    problems += [f"unlisted file {f}" for f in storage.list_files(base) if f not in listed]
    return problems


# ---- reading and diff ---------------------------------------------------------------------------------------

def release_files(storage: Storage, version: str, table: str) -> list[str]:
    """Root-relative paths of a table's data files pinned by a release, in key order.

    Raises
    ------
    SnapshotError
        for an unknown release or table.
    """
    manifest = read_manifest(storage, version)
    if table not in manifest["tables"]:
        raise SnapshotError(f"snapshot {manifest['version']} has no table {table!r}; "
                            f"tables: {', '.join(manifest['tables'])}")
    v = manifest["tables"][table]
    return [f"{v['uri']}/{f['path']}" for f in v["files"]]


def read_snapshot_table(storage: Storage, version: str, table: str, columns: list[str] | None = None) -> pa.Table:
    """One table of a release as a pyarrow Table (the pinned data files, in key order).

    Raises
    ------
    SnapshotError
        for an unknown release or table.
    """
    parts = [pq.read_table(io.BytesIO(storage.read_bytes(p)), columns=columns)
             for p in release_files(storage, version, table)]
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def table_counts(storage: Storage, version: str) -> dict[str, int]:
    """Row count per table of a release, from its manifest."""
    return {t: v["rows"] for t, v in read_manifest(storage, version)["tables"].items()}


def _row_digests(table: pa.Table, key: list[str], columns: list[str]) -> dict[tuple, bytes]:
    """key tuple -> sha256 of the row's other columns (canonical JSON; bytes values by their sha256)."""
    def enc(v: Any) -> Any:
        if isinstance(v, bytes):
            return "sha256:" + hashlib.sha256(v).hexdigest()
        if isinstance(v, dict):
            return {k: enc(x) for k, x in v.items()}
        if isinstance(v, list):
            return [enc(x) for x in v]
        if isinstance(v, (dt.date, dt.datetime, dt.time)):
            return v.isoformat()
        return v

    out: dict[tuple, bytes] = {}
    keys = list(zip(*(table[k].to_pylist() for k in key), strict=True))
    others = [c for c in columns if c not in key]
    for batch_start in range(0, table.num_rows, 4096):
        part = table.slice(batch_start, 4096).select(others).to_pylist()
        for i, row in enumerate(part):
            digest = hashlib.sha256(json.dumps(enc(row), sort_keys=True, separators=(",", ":")).encode()).digest()
            out[keys[batch_start + i]] = digest
    return out


def diff(storage: Storage, old: str, new: str) -> dict[str, TableDiff]:
    """Rows added, removed and changed per table between two releases, by each table's key columns.

    Tables whose pinned data files are identical are reported ``unchanged`` without being read. A row is
    ``changed`` when its key is in both releases and any other column common to both schemas differs.

    Returns
    -------
    dict
        table -> :class:`TableDiff`, tables of either release in name order.

    Raises
    ------
    SnapshotError
        for an unknown release.
    """
    m_old, m_new = read_manifest(storage, old), read_manifest(storage, new)
    out = {}
    for t in sorted(set(m_old["tables"]) | set(m_new["tables"])):
        a, b = m_old["tables"].get(t), m_new["tables"].get(t)
        key = tuple((b or a)["key"])
        if a is None or b is None:
            present = b or a
            keys = list(zip(*(read_snapshot_table(storage, m_new["version"] if b else m_old["version"], t,
                                                   columns=list(key))[k].to_pylist() for k in key), strict=True))
            out[t] = TableDiff(t, key, "added_table" if b else "removed_table",
                               added=sorted(keys) if b else [], removed=[] if b else sorted(keys),
                               schema=(None, present["schema_version"]) if b else (present["schema_version"], None))
            continue
        schema = (a["schema_version"], b["schema_version"]) if a["schema_version"] != b["schema_version"] else None
        if a["sha256"] == b["sha256"]:
            out[t] = TableDiff(t, key, "unchanged", schema=schema)
            continue
        ta = read_snapshot_table(storage, m_old["version"], t)
        tb = read_snapshot_table(storage, m_new["version"], t)
        common = [c for c in tb.column_names if c in ta.column_names]
        da, db = _row_digests(ta, list(key), common), _row_digests(tb, list(key), common)
        added = sorted(k for k in db if k not in da)
        removed = sorted(k for k in da if k not in db)
        changed = sorted(k for k in db if k in da and da[k] != db[k])
        status = "changed" if added or removed or changed or schema else "unchanged"
        out[t] = TableDiff(t, key, status, added, removed, changed, schema)
    return out


def __getattr__(name: str) -> Any:
    """``load_snapshot`` and ``Snapshot`` live in :mod:`etl.snapshot_api`; importable from here too."""
    if name in ("load_snapshot", "Snapshot"):
        from etl import snapshot_api

        return getattr(snapshot_api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

