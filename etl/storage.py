"""One small storage abstraction over a local folder and ``s3://bucket/prefix``.

Built on :mod:`pyarrow.fs` (LocalFileSystem / S3FileSystem), so the same code reads and writes
Parquet and raw bytes on a laptop and on object storage. Paths handed to :class:`Storage` methods are
relative to the storage root and always use ``/``.

Zones (docs/design.md)::

    sources/<institution>/...   raw input, read-only to the pipeline (restricted: may hold PHI)
    quarantine/<run_id>/...     quarantine records (restricted: name source paths, never copy values)
    ledger/                     one row per input file per run (restricted)
    curated/<table>/            de-identified Parquet tables
    snapshots/<version>/        immutable published releases
    reports/                    dashboards, Data Docs, audit reports
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from etl.zones import RESTRICTED, UnsafePathError
from medreco_reader import root as reader_root
from medreco_reader.root import Root
from schemas.config import PipelineConfig
from schemas.errors import ReasonCodedError

#: permissions of restricted zones (:data:`etl.zones.RESTRICTED`) on local disk: folders owner-only, files
#: owner read/write (S3 separates them by bucket policy instead)
RESTRICTED_DIR_MODE = 0o700
RESTRICTED_FILE_MODE = 0o600


class StorageError(ReasonCodedError, RuntimeError):
    """Raised for a storage URI that cannot be opened or a missing object."""

    default_reason = "storage_error"
    message_format = "{message}"


def _s3_filesystem(endpoint_url: str | None, region: str) -> pafs.S3FileSystem:
    return reader_root.s3_filesystem(endpoint_url, region)


def open_filesystem(
    uri: str, *, endpoint_url: str | None = None, region: str = "us-east-1", base_dir: str | Path = "."
) -> tuple[pafs.FileSystem, str]:
    """Return ``(filesystem, base_path)`` for a local path, ``file://`` or ``s3://`` URI.

    Relative local paths are resolved from ``base_dir``. Credentials for S3 come from the standard
    AWS environment (``AWS_ACCESS_KEY_ID`` ...); ``endpoint_url`` (or ``AWS_ENDPOINT_URL``) points at an
    S3-compatible store such as MinIO or moto. The reader package's implementation
    (:func:`medreco_reader.root.open_filesystem`), so a release opens the same way with or without the project.

    Raises
    ------
    StorageError
        for an unsupported URI scheme.
    """
    try:
        return reader_root.open_filesystem(uri, endpoint_url=endpoint_url, region=region, base_dir=base_dir)
    except reader_root.UnsupportedURIError as err:
        raise StorageError(str(err)) from None


@dataclass(frozen=True)
class Storage(Root):
    """Files under one root on a pyarrow filesystem: the reader's read-only :class:`medreco_reader.root.Root`
    (``is_local``, ``full_uri``, ``exists``, ``is_file``, ``read_bytes``, ``read_text``) plus writing, listing,
    hashing and Parquet, with the project's path checks and restricted zones.

    Parameters
    ----------
    fs : pyarrow.fs.FileSystem
        the filesystem (local or S3).
    root : str
        base path on ``fs`` (for S3: ``bucket/prefix``).
    uri : str
        the URI the storage was opened from, for messages and manifests.
    """

    fs: pafs.FileSystem
    root: str
    uri: str

    @classmethod
    def open(
        cls, uri: str, *, endpoint_url: str | None = None, region: str = "us-east-1", base_dir: str | Path = "."
    ) -> Storage:
        """Open a storage root from a path or ``s3://bucket/prefix`` URI (see :func:`open_filesystem`)."""
        fs, root = open_filesystem(uri, endpoint_url=endpoint_url, region=region, base_dir=base_dir)
        if isinstance(fs, pafs.LocalFileSystem):
            fs.create_dir(root, recursive=True)
            uri = root
            for zone in RESTRICTED:  # tighten restricted zones an earlier version left world-readable
                _restrict_dir(f"{root}/{zone}")
        return cls(fs=fs, root=root, uri=uri)

    @classmethod
    def from_config(cls, cfg: PipelineConfig) -> Storage:
        """Open a pipeline config's storage root (``storage.root``, its S3 endpoint and region; a relative
        local root is resolved from the config file's folder). The one place a root is opened from a config."""
        return cls.open(
            cfg.storage.root,
            endpoint_url=cfg.storage.s3_endpoint_url,
            region=cfg.storage.s3_region,
            base_dir=cfg.base_dir,
        )

    def path(self, rel: str) -> str:
        """Absolute path on the filesystem for a root-relative path.

        Raises
        ------
        etl.zones.UnsafePathError
            ``unsafe_path`` for a path that could leave the root: a ``..`` or ``.`` component or a NUL
            character (the message never quotes the path: parts of it may come from a file header).
        """
        rel = _checked_rel(rel)
        return f"{self.root}/{rel}" if rel else self.root

    def _write_target(self, rel: str) -> str:
        """:meth:`path` for a write or delete; on local disk also refuses a target whose folder resolves
        (through a symbolic link) outside the root."""
        target = self.path(rel)
        if self.is_local:
            root = os.path.realpath(self.root)
            parent = os.path.realpath(posixpath.dirname(target))
            if parent != root and not parent.startswith(root.rstrip("/") + "/"):
                raise UnsafePathError("unsafe_path", "a write through a link that leaves the storage root was refused")
        return target

    def _make_parent(self, target: str) -> None:
        """Create a local file's folders; those inside a restricted zone owner-only (0700)."""
        parent = posixpath.dirname(target)
        rel = parent[len(self.root) :].strip("/")
        zone = rel.split("/", 1)[0]
        if zone not in RESTRICTED:
            self.fs.create_dir(parent, recursive=True)
            return
        current = self.root
        for part in rel.split("/"):
            current = f"{current}/{part}"
            if not os.path.isdir(current):
                try:
                    os.mkdir(current, RESTRICTED_DIR_MODE)
                except FileExistsError:
                    pass
                _restrict_dir(current)

    def is_restricted(self, rel: str) -> bool:
        """True when ``rel`` lies in a restricted zone (sources/, ledger/, quarantine/)."""
        return _checked_rel(rel).split("/", 1)[0] in RESTRICTED

    def _unreadable(self, message: str) -> Exception:
        """:meth:`read_bytes` (whole content of a file, as stored: a ``.gz`` object reads as gzip) raises
        :class:`StorageError` for a file it cannot read."""
        return StorageError(message)

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write a file atomically: readers see the old file or the whole new one, never a part. The bytes are
        stored as given (pyarrow's compression by suffix is off: ``x.nii.gz`` holds exactly ``data``).

        Local: write a temporary sibling, then rename. S3: the object becomes visible only when its upload
        completes (pyarrow sends a multipart upload: create, one part, complete), so readers never see a part.
        """
        target = self._write_target(rel)
        parent = posixpath.dirname(target)
        if self.is_local:
            self._make_parent(target)
            tmp = f"{parent}/.tmp-{uuid.uuid4().hex}-{posixpath.basename(target)}"
            if self.is_restricted(rel):  # owner-only from creation on: never readable by others, not even briefly
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, RESTRICTED_FILE_MODE)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.chmod(tmp, RESTRICTED_FILE_MODE)  # whatever the umask
            else:
                with self.fs.open_output_stream(tmp, compression=None) as f:
                    f.write(data)
            os.replace(tmp, target)
        else:
            with self.fs.open_output_stream(target, compression=None) as f:
                f.write(data)

    def write_text(self, rel: str, text: str) -> None:
        """Write UTF-8 text atomically."""
        self.write_bytes(rel, text.encode("utf-8"))

    def sha256(self, rel: str, chunk: int = 8 * 2**20) -> str:
        """Hex sha256 of a file's bytes as stored (no decompression), streamed in ``chunk``-byte blocks (memory:
        one block). The one file hash of the project (snapshot data files, volume objects).

        Raises
        ------
        FileNotFoundError, OSError
            when the file cannot be read.
        """
        h = hashlib.sha256()
        with self.fs.open_input_stream(self.path(rel), compression=None) as f:
            while block := f.read(chunk):
                h.update(block)
        return h.hexdigest()

    def list_files(self, rel: str = "", *, recursive: bool = True) -> list[str]:
        """Sorted root-relative paths of the files under ``rel`` (empty if it does not exist).

        Temporary files of interrupted atomic writes (``.tmp-*``) are not listed.
        """
        base = self.path(rel)
        if self.fs.get_file_info(base).type == pafs.FileType.NotFound:
            return []
        sel = pafs.FileSelector(base, recursive=recursive, allow_not_found=True)
        prefix = self.root.rstrip("/") + "/"
        out = []
        for info in self.fs.get_file_info(sel):
            if info.type != pafs.FileType.File or posixpath.basename(info.path).startswith(".tmp-"):
                continue
            out.append(info.path.removeprefix(prefix))
        return sorted(out)

    def delete(self, rel: str) -> None:
        """Delete a file or a folder tree; no error if absent (never the root itself: ``rel`` must name something
        under it).

        Raises
        ------
        etl.zones.UnsafePathError
            for a path that could leave the root, or an empty one.
        """
        if not _checked_rel(rel):
            raise UnsafePathError("unsafe_path", "deleting the storage root itself was refused")
        p = self._write_target(rel)
        info = self.fs.get_file_info(p)
        if info.type == pafs.FileType.Directory:
            self.fs.delete_dir(p)
        elif info.type == pafs.FileType.File:
            self.fs.delete_file(p)

    def write_table(self, rel: str, table: pa.Table, row_group_size: int | None = None) -> None:
        """Write one Parquet file atomically (zstd, no pandas metadata, deterministic bytes).

        ``row_group_size`` (rows) keeps row groups small for tables of large binary values.
        """
        buf = io.BytesIO()
        pq.write_table(
            table, buf, compression="zstd", write_statistics=True, store_schema=True, row_group_size=row_group_size
        )
        self.write_bytes(rel, buf.getvalue())

    def read_table(self, rel: str, schema: pa.Schema | None = None, columns: list[str] | None = None) -> pa.Table:
        """Read one Parquet file, or every ``*.parquet`` under a folder, as one table.

        A missing folder gives an empty table of ``schema`` (when given). With ``columns``, only those columns
        are read (in that order): the file is opened for random access, so the other columns' bytes are
        never fetched (a payload column stays on disk / in the object store).

        Raises
        ------
        StorageError
            if nothing exists at ``rel`` and no schema is given.
        """
        if self.is_file(rel):
            return self._read_parquet(rel, schema, columns)
        files = [f for f in self.list_files(rel) if f.endswith(".parquet")]
        if not files:
            if schema is None:
                raise StorageError(f"no Parquet files under {self.full_uri(rel)}")
            empty = schema.empty_table()
            return empty.select(columns) if columns is not None else empty
        tables = [self._read_parquet(f, schema, columns) for f in files]
        return pa.concat_tables(tables, promote_options="default") if schema is None else pa.concat_tables(tables)

    def _read_parquet(self, rel: str, schema: pa.Schema | None, columns: list[str] | None) -> pa.Table:
        if columns is None:
            return pq.read_table(io.BytesIO(self.read_bytes(rel)), schema=schema)
        try:
            with self.fs.open_input_file(self.path(rel)) as f:
                return pq.read_table(f, schema=schema, columns=columns)
        except (FileNotFoundError, OSError) as err:
            raise StorageError(f"cannot read {self.full_uri(rel)}: {err}") from None


def _checked_rel(rel: str) -> str:
    """A root-relative path with its outer ``/`` stripped and empty components collapsed.

    Raises
    ------
    etl.zones.UnsafePathError
        ``unsafe_path`` for a ``..`` or ``.`` component or a NUL character.
    """
    parts = [p for p in str(rel).split("/") if p]
    if any(p in (".", "..") or "\x00" in p for p in parts):
        raise UnsafePathError(
            "unsafe_path",
            "a storage path with a '..', '.' or NUL component was refused "
            "(paths are relative to the storage root and stay under it)",
        )
    return "/".join(parts)


def _restrict_dir(path: str) -> None:
    """Make an existing local folder owner-only (0700); no error when it is absent or not ours."""
    try:
        if os.path.isdir(path) and (os.stat(path).st_mode & 0o777) != RESTRICTED_DIR_MODE:
            os.chmod(path, RESTRICTED_DIR_MODE)
    except OSError:
        pass


_ESCAPED_BYTE = re.compile(r"\\x([89a-f][0-9a-f])")


def escape_name(name: str) -> str:
    """A local path as records hold it: bytes of the name that are not valid UTF-8 (read by Python as lone
    surrogates, PEP 383 ``surrogateescape``) written as ``\\xNN`` (Python's ``backslashreplace``), so the name
    can be written to Parquet and JSON; valid names are returned unchanged. :func:`unescaped_local_path` undoes it."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return os.fsencode(name).decode("utf-8", "backslashreplace")


def unescaped_local_path(uri: str) -> str | None:
    """The local path an escaped name (:func:`escape_name`) stands for, when ``uri`` is local, holds ``\\xNN``
    escapes (NN of 80 to ff), names no file itself and the unescaped path does; else None."""
    if "://" in uri or not _ESCAPED_BYTE.search(uri) or os.path.lexists(uri):
        return None
    real = _ESCAPED_BYTE.sub(lambda m: chr(0xDC00 + int(m.group(1), 16)), uri)
    return real if os.path.lexists(real) else None


def read_uri(uri: str, *, endpoint_url: str | None = None, region: str = "us-east-1") -> bytes:
    """Read a whole file given by a full local path or ``s3://`` URI.

    Raises
    ------
    StorageError
        if the file cannot be read.
    """
    local = unescaped_local_path(uri)
    if local is not None:  # a recorded name that is not valid UTF-8 (see escape_name): read by its real bytes
        try:
            with open(local, "rb") as fh:
                return fh.read()
        except OSError as err:
            raise StorageError(f"cannot read {uri}: {type(err).__name__}") from None
    fs, path = open_filesystem(uri, endpoint_url=endpoint_url, region=region)
    try:
        with fs.open_input_stream(path, compression=None) as f:
            return f.read()
    except (FileNotFoundError, OSError) as err:
        raise StorageError(f"cannot read {uri}: {err}") from None


# ---- object-store clients and create-if-absent -----------------------------------------------------------


def delta_storage_options(storage: Storage) -> dict[str, str] | None:
    """``storage_options`` for ``deltalake``/``polars`` (object_store keys) matching a :class:`Storage`.

    None for a local folder. For S3: region, endpoint (``aws_endpoint_url``, with ``aws_allow_http`` for
    ``http://`` endpoints such as moto or MinIO) and explicit keys when the filesystem was given any; other
    credentials come from the standard AWS environment, as for pyarrow. Read from the pyarrow ``S3FileSystem``
    itself (:func:`medreco_reader.root.storage_options`), so one opened storage root configures every client.
    """
    return reader_root.storage_options(storage.fs)


def s3_client(storage: Storage) -> Any:
    """A boto3 S3 client configured like the storage's pyarrow filesystem (:func:`delta_storage_options`)."""
    import boto3

    opts = delta_storage_options(storage) or {}
    return boto3.client(
        "s3",
        region_name=opts.get("aws_region"),
        endpoint_url=opts.get("aws_endpoint_url"),
        aws_access_key_id=opts.get("aws_access_key_id"),
        aws_secret_access_key=opts.get("aws_secret_access_key"),
        aws_session_token=opts.get("aws_session_token"),
    )


#: S3 error codes of a conditional put refused because the key exists: 412 PreconditionFailed (AWS, MinIO,
#: moto), 409 ConditionalRequestConflict (AWS, when a concurrent conditional write to the same key is in flight)
_EXISTS_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "412", "409"})


def put_if_absent(storage: Storage, rel: str, data: bytes) -> bool:
    """Create a file only if no file exists at ``rel`` (atomic); False, writing nothing, if one does.

    The project's one create-if-absent: the mutual exclusion of a Delta commit (two writers never both
    create version N) and of the build lock. Local: the bytes go to a temporary file beside the target's
    folder (fsynced), which is hard-linked to the target (``link`` fails if the target exists; readers see
    the whole file or none). S3: ``PutObject`` with ``If-None-Match: *`` (conditional write, honoured by S3
    since August 2024; pyarrow's S3 filesystem cannot send it, so boto3 does), refused with 412 or 409
    (:data:`_EXISTS_CODES`) when the key exists.

    Raises
    ------
    OSError, botocore.exceptions.ClientError
        for other storage errors.
    """
    if storage.is_local:
        target = storage._write_target(rel)
        parent = posixpath.dirname(target)
        storage._make_parent(target)
        tmp = f"{posixpath.dirname(parent)}/.tmp-{uuid.uuid4().hex}-{posixpath.basename(target)}"
        mode = RESTRICTED_FILE_MODE if storage.is_restricted(rel) else 0o666
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, target)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        return True
    from botocore.exceptions import ClientError

    target = storage.path(rel)
    bucket, _, key = target.partition("/")
    try:
        s3_client(storage).put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") in _EXISTS_CODES:
            return False
        raise
    return True
