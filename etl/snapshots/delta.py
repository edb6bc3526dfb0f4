"""Delta Lake tables of the releases: content-addressed Parquet data files and deterministic commit files
(one commit per changed table per release; see :mod:`etl.snapshots`)."""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import posixpath
import tempfile
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from etl import zones
from etl.snapshots.manifest import TABLES_DIR, SnapshotError, code_version, sha256_file, table_uri
from etl.storage import Storage, delta_storage_options, put_if_absent
from schemas.base import key_columns
from schemas.tables import SCHEMAS

#: a table is split into data files of about this many bytes (Arrow in-memory size), rows kept in key order
TARGET_FILE_BYTES = 256 * 2**20
#: row groups of about this many bytes: small enough to fetch one image payload without reading a whole file
ROW_GROUP_BYTES = 8 * 2**20
#: Delta table properties: never drop old commit files (releases pin old versions: time travel must work)
DELTA_CONFIGURATION = {"delta.enableExpiredLogCleanup": "false"}


@dataclass(frozen=True)
class DataFile:
    """One Parquet data file of a table: its name in the Delta table folder, bytes, sha256 and rows."""

    name: str
    data: bytes = field(repr=False)
    sha256: str
    rows: int


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


def curated_table(storage: Storage, table: str) -> pa.Table:
    """A whole curated table, sorted by key (small tables and tests; :func:`publish` never calls it)."""
    schema = SCHEMAS[table]
    t = storage.read_table(zones.curated_table(table), schema=schema)
    if t.num_rows:
        t = t.sort_by([(k, "ascending") for k in key_columns(schema)])
    return t


@dataclass(frozen=True)
class PartitionFile:
    """One data file of a release's table: a curated partition file, content-addressed.

    ``partition`` is the curated file's path under ``curated/<table>/`` (``shard=00003/part-0.parquet``,
    ``institution=x/modality=CT/shard=00003.parquet``), ``name`` the data file's name in the Delta table folder
    (``part-<sha256>.zstd.parquet``), ``source`` the root-relative file the data file is linked or copied from
    (the curated file, or a re-encoded scratch file for a partition not in the table's schema), ``data`` the
    bytes when they were re-encoded in memory (None otherwise).
    """

    partition: str
    name: str
    sha256: str
    rows: int
    size: int
    source: str
    data: bytes | None = field(default=None, repr=False)


def data_file_name(sha256: str) -> str:
    """The Delta data file name of content with this sha256: ``part-<sha256>.zstd.parquet``."""
    return f"part-{sha256}.zstd.parquet"


#: an entry of the partition hash cache is trusted only for files older than the cache by this much (racy-git rule:
#: a file rewritten within the clock resolution of the cache's own write could keep its size and mtime)
RACY_NS = 2_000_000_000


def _load_hash_cache(storage: Storage, table: str) -> tuple[dict, int]:
    rel = zones.publish_hash_cache(table)
    info = storage.fs.get_file_info(storage.path(rel))
    if info.type != pafs.FileType.File:
        return {}, 0
    try:
        return json.loads(storage.read_text(rel)).get("files", {}), int(info.mtime_ns or 0)
    except (ValueError, AttributeError):
        return {}, 0


def _plain_type(t: pa.DataType) -> pa.DataType:
    """A type with list element fields renamed ``item`` (Parquet stores them as ``element``: same data)."""
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        f = t.value_field
        inner = pa.field("item", _plain_type(f.type), f.nullable)
        return pa.list_(inner) if pa.types.is_list(t) else pa.large_list(inner)
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _plain_type(f.type), f.nullable) for f in t])
    return t


def same_schema(a: pa.Schema, b: pa.Schema) -> bool:
    """True when two Arrow schemas hold the same columns, types, nullability and metadata (list element field
    names aside: a Parquet round trip names them ``element``)."""
    return (
        a.names == b.names
        and a.metadata == b.metadata
        and all(
            fa.nullable == fb.nullable and _plain_type(fa.type).equals(_plain_type(fb.type)) for fa, fb in zip(a, b)
        )
    )


def partition_files(storage: Storage, table: str) -> list[PartitionFile]:
    """The curated partition files of ``table`` as content-addressed data files, in partition path order.

    Nothing is decoded for a partition whose file is unchanged: its sha256 and row count come from the partition
    hash cache (:func:`etl.zones.publish_hash_cache`, keyed by path, size and mtime; entries written less than
    :data:`RACY_NS` before the cache are re-checked), else the file is hashed (streamed) and its Parquet footer
    read (rows, schema). A partition file whose Arrow schema is not the table's (an older curated file) is read,
    cast, key-sorted and re-encoded in memory (:func:`encode_data_files`, one file). Files with no rows are left
    out; a table with no rows gets one empty data file (readers need a schema). The updated cache is written back.

    Raises
    ------
    SnapshotError
        when two partitions hold byte-identical content (it would be one data file: a duplicate of rows).
    """
    schema = SCHEMAS[table]
    base = zones.curated_table(table)
    cache, cache_ns = _load_hash_cache(storage, table)
    infos = []
    if storage.exists(base):
        sel = pafs.FileSelector(storage.path(base), recursive=True, allow_not_found=True)
        prefix = storage.path(base).rstrip("/") + "/"
        infos = sorted(
            (
                i
                for i in storage.fs.get_file_info(sel)
                if i.type == pafs.FileType.File
                and i.path.endswith(".parquet")
                and not posixpath.basename(i.path).startswith(".tmp-")
            ),
            key=lambda i: i.path,
        )
    out: list[PartitionFile] = []
    new_cache: dict[str, dict] = {}
    for info in infos:
        part = info.path.removeprefix(prefix)
        rel = f"{base}/{part}"
        hit = cache.get(part)
        stamp = {"size": int(info.size), "mtime_ns": int(info.mtime_ns or 0)}
        if hit and {k: hit.get(k) for k in stamp} == stamp and stamp["mtime_ns"] + RACY_NS < cache_ns:
            entry = hit
        else:
            with storage.fs.open_input_file(storage.path(rel)) as f:
                pf = pq.ParquetFile(f)
                rows, same = pf.metadata.num_rows, same_schema(pf.schema_arrow, schema)
            entry = {
                **stamp,
                "rows": int(rows),
                "schema_ok": bool(same),
                "sha256": sha256_file(storage, rel) if same else None,
            }
        new_cache[part] = entry
        if not entry["rows"]:
            continue
        if entry["schema_ok"]:
            out.append(
                PartitionFile(part, data_file_name(entry["sha256"]), entry["sha256"], entry["rows"], entry["size"], rel)
            )
        else:  # an older curated file: re-encoded once per publish (rare: a schema change rebuilds every shard)
            t = storage.read_table(rel, schema=schema)
            t = t.sort_by([(k, "ascending") for k in key_columns(schema)])
            (df,) = encode_data_files(t, target_bytes=2**62)
            out.append(PartitionFile(part, data_file_name(df.sha256), df.sha256, df.rows, len(df.data), rel, df.data))
    if not out:  # no rows at all: one empty file of the table's schema (deterministic bytes)
        (df,) = encode_data_files(schema.empty_table())
        out.append(PartitionFile("", data_file_name(df.sha256), df.sha256, 0, len(df.data), "", df.data))
    dup = [n for n, c in Counter(f.name for f in out).items() if c > 1]
    if dup:
        raise SnapshotError(
            f"{table}: partitions {', '.join(f.partition for f in out if f.name in dup)} of "
            f"{storage.full_uri(base)} hold identical content"
        )
    if new_cache != cache:
        storage.write_text(zones.publish_hash_cache(table), json.dumps({"files": new_cache}, sort_keys=True))
    return out


def place_data_file(storage: Storage, table: str, f: PartitionFile) -> int:
    """Make data file ``f`` present in the table's Delta folder; return the bytes written (0 when it was there).

    Content-addressed: a file already present under its name is left alone. Otherwise local disk hard-links the
    curated file (no bytes written; a copy where the link fails, e.g. across devices), S3 copies it server side
    (``CopyObject`` through pyarrow's ``copy_file``: no bytes through this process), and re-encoded bytes are
    written. Returns the bytes of the new file (linked, copied or written).
    """
    rel = f"{TABLES_DIR}/{table}/{f.name}"
    if storage.is_file(rel):
        return 0
    if f.data is not None:
        storage.write_bytes(rel, f.data)
        return f.size
    target = storage.path(rel)
    if storage.is_local:
        storage.fs.create_dir(posixpath.dirname(target), recursive=True)
        try:
            os.link(storage.path(f.source), target)
        except FileExistsError:
            pass
        except OSError:
            storage.write_bytes(rel, storage.read_bytes(f.source))
    else:
        storage.fs.copy_file(storage.path(f.source), target)
    if sha256_file(storage, rel) != f.sha256:  # the curated file changed since it was hashed: never pin it
        storage.delete(rel)
        raise SnapshotError(f"{table}: {storage.full_uri(f.source)} changed during the publish")
    return f.size


def table_data_sha256(files: Sequence[dict]) -> str:
    return hashlib.sha256("\n".join(f["sha256"] for f in files).encode()).hexdigest()


def _is_delta_table(storage: Storage, table: str) -> bool:
    # checked through Storage (pyarrow), not DeltaTable.is_deltatable: the latter's listing hangs against
    # moto's S3 server (deltalake 1.6.6, moto 5.2.5), while opening a table works
    return any(p.endswith(".json") for p in storage.list_files(f"{TABLES_DIR}/{table}/_delta_log", recursive=False))


def delta_files(storage: Storage, table: str, version: int | None = None) -> tuple[int | None, list[str]]:
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
    out: dict[str, Any] = {
        "minReaderVersion": int(p["minReaderVersion"]),
        "minWriterVersion": int(p["minWriterVersion"]),
    }
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
        DeltaTable.create(
            tmp, SCHEMAS[table], name=table, description=f"MedReCo-DB table {table}", configuration=DELTA_CONFIGURATION
        )
        with open(posixpath.join(tmp, "_delta_log", f"{0:020d}.json"), encoding="utf-8") as f:
            actions = {k: v for line in f if line.strip() for k, v in json.loads(line).items()}
    return _protocol_action(actions["protocol"]), actions["metaData"]


def _metadata_action(template: dict, table_id: str | int, created_ms: int) -> dict:
    """A Delta ``metaData`` action in a fixed key order from ``deltalake``'s (``id``/``createdTime`` replaced)."""
    return {
        "id": table_id,
        "name": template.get("name"),
        "description": template.get("description"),
        "format": {"provider": "parquet", "options": {}},
        "schemaString": template["schemaString"],
        "partitionColumns": list(template.get("partitionColumns") or []),
        "createdTime": created_ms,
        "configuration": dict(sorted((template.get("configuration") or {}).items())),
    }


def _protocol_needed(current: dict, wanted: dict) -> dict | None:
    """The protocol to commit so the table supports ``wanted``'s features; None when ``current`` does."""
    features = lambda p, k: set(p.get(k) or [])  # noqa: E731
    if (
        wanted["minReaderVersion"] <= current["minReaderVersion"]
        and wanted["minWriterVersion"] <= current["minWriterVersion"]
        and features(wanted, "readerFeatures") <= features(current, "readerFeatures")
        and features(wanted, "writerFeatures") <= features(current, "writerFeatures")
    ):
        return None
    return _protocol_action(
        {
            "minReaderVersion": max(current["minReaderVersion"], wanted["minReaderVersion"]),
            "minWriterVersion": max(current["minWriterVersion"], wanted["minWriterVersion"]),
            "readerFeatures": features(current, "readerFeatures") | features(wanted, "readerFeatures"),
            "writerFeatures": features(current, "writerFeatures") | features(wanted, "writerFeatures"),
        }
    )


def delta_log_path(table: str, version: int) -> str:
    return f"{TABLES_DIR}/{table}/_delta_log/{version:020d}.json"


def _write_commit(storage: Storage, table: str, version: int, actions: list[dict]) -> None:
    """Write one Delta commit file: newline-delimited JSON actions (compact, keys in the order given)."""
    data = "\n".join(json.dumps(a, separators=(",", ":"), ensure_ascii=False) for a in actions).encode()
    if not put_if_absent(storage, delta_log_path(table, version), data):
        raise SnapshotError(
            f"{table}: another writer committed Delta version {version} of "
            f"{table_uri(storage, table)} during the publish"
        )


def _commit_info(operation: str, parameters: dict, epoch_ms: int, release: str, read_version: int | None) -> dict:
    info: dict[str, Any] = {"timestamp": epoch_ms, "operation": operation, "operationParameters": parameters}
    if read_version is not None:
        info.update(readVersion=read_version, isBlindAppend=False)
    info.update({"engineInfo": f"medreco-db/{code_version()}", "medreco.release": release})
    return {"commitInfo": info}


def commit_table(
    storage: Storage, table: str, files: Sequence[PartitionFile], release: str, epoch_ms: int, key_fingerprint: str
) -> int:
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
        _write_commit(
            storage,
            table,
            0,
            [
                _commit_info("CREATE TABLE", {"mode": "ErrorIfExists"}, epoch_ms, release, None),
                {"protocol": protocol},
                {"metaData": _metadata_action(template, delta_table_id(table, key_fingerprint), epoch_ms)},
            ],
        )
        before, current = 0, []
    else:
        dtab = DeltaTable(uri, storage_options=opts)
        before = dtab.version()
        current = sorted(posixpath.basename(u) for u in dtab.file_uris())
        p = dtab.protocol()
        needed = _protocol_needed(
            {
                "minReaderVersion": p.min_reader_version,
                "minWriterVersion": p.min_writer_version,
                "readerFeatures": p.reader_features,
                "writerFeatures": p.writer_features,
            },
            protocol,
        )
        if needed:
            extra.append({"protocol": needed})
        if json.loads(dtab.schema().to_json()) != json.loads(schema_string):
            meta = dtab.metadata()
            extra.append(
                {
                    "metaData": _metadata_action(
                        {
                            "name": meta.name,
                            "description": meta.description,
                            "schemaString": schema_string,
                            "partitionColumns": meta.partition_columns,
                            "configuration": meta.configuration,
                        },
                        meta.id,
                        epoch_ms,
                    )
                }
            )
    wanted = {f.name: f for f in files}
    actions = [_commit_info("WRITE", {"mode": "Overwrite", "partitionBy": "[]"}, epoch_ms, release, before), *extra]
    for name in current:
        if name not in wanted:
            size = storage.fs.get_file_info(storage.path(f"{TABLES_DIR}/{table}/{name}")).size
            actions.append(
                {
                    "remove": {
                        "path": name,
                        "deletionTimestamp": epoch_ms,
                        "dataChange": True,
                        "extendedFileMetadata": True,
                        "partitionValues": {},
                        "size": size,
                    }
                }
            )
    for name in sorted(set(wanted) - set(current)):
        f = wanted[name]
        actions.append(
            {
                "add": {
                    "path": name,
                    "partitionValues": {},
                    "size": f.size,
                    "modificationTime": epoch_ms,
                    "dataChange": True,
                    "stats": json.dumps({"numRecords": f.rows}, separators=(",", ":")),
                }
            }
        )
    _write_commit(storage, table, before + 1, actions)
    version, names = delta_files(storage, table)
    if version != before + 1 or names != sorted(wanted):
        raise SnapshotError(f"{table}: another writer committed to {uri} during the publish (version {version})")
    return version
