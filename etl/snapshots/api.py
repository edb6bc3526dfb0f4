"""Python API for ML users: one published release, loadable in one line.

>>> from etl.snapshots import load_snapshot                       # doctest: +SKIP
>>> snap = load_snapshot("/data/medreco", version="latest")       # or "s3://bucket/prefix", or a Storage
>>> snap.version, snap.manifest["content_hash"]
>>> pairs = snap.table("pairs").filter(pl.col("gap_days") < 365).collect()   # polars LazyFrame
>>> ds = snap.dataset("images")                                   # pyarrow.dataset.Dataset

Every read goes to the data files the release pins (the Delta table version recorded in its manifest),
so later releases never change what a loaded snapshot returns. For pixels, see :mod:`etl.snapshots.torch_data`.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from etl.snapshots.manifest import SnapshotError, read_manifest, release_files, resolve_version, table_uri
from etl.snapshots.verify import verify
from etl.storage import Storage, delta_storage_options, open_filesystem


@dataclass(frozen=True)
class Snapshot:
    """A published release of MedReCo-DB, read-only.

    Parameters
    ----------
    storage : Storage
        the storage root the release lives under.
    version : str
        its semantic version (``MAJOR.MINOR.PATCH``).
    manifest : dict
        its manifest (``content_hash``, per-table ``delta_version``, ``files``, ``rows`` ...).
    """

    storage: Storage
    version: str
    manifest: dict

    @property
    def content_hash(self) -> str:
        """The release's content hash (identical for identical content, config, code and key)."""
        return self.manifest["content_hash"]

    @property
    def tables(self) -> list[str]:
        """Table names of the release."""
        return list(self.manifest["tables"])

    def _entry(self, name: str) -> dict:
        try:
            return self.manifest["tables"][name]
        except KeyError:
            raise SnapshotError(f"snapshot {self.version} has no table {name!r}; tables: "
                                f"{', '.join(self.tables)}") from None

    def key_columns(self, name: str) -> list[str]:
        """The key columns of a table (unique per row)."""
        return list(self._entry(name)["key"])

    def delta_version(self, name: str) -> int:
        """The Delta table version this release pins for ``name``."""
        return int(self._entry(name)["delta_version"])

    def table_uri(self, name: str) -> str:
        """URI of the table's Delta folder (``DeltaTable(uri, version=snap.delta_version(name))``)."""
        self._entry(name)
        return table_uri(self.storage, name)

    def files(self, name: str) -> list[str]:
        """Full URIs (local paths or ``s3://...``) of the table's pinned Parquet data files, in manifest (partition) order.

        For engines without Delta support (DuckDB offline: ``read_parquet(snap.files("pairs"))``).
        """
        return [self.storage.full_uri(p) for p in release_files(self.storage, self.version, name)]

    def storage_options(self) -> dict[str, str] | None:
        """object_store ``storage_options`` for polars/deltalake on this root (None for local disk)."""
        return delta_storage_options(self.storage)

    def table(self, name: str) -> pl.LazyFrame:
        """The table as a polars LazyFrame over the pinned Delta version (time travel).

        Rows come in partition order (key order within each data file); sort by the key where order matters. Raises :class:`SnapshotError` for an unknown table.
        """
        return pl.scan_delta(self.table_uri(name), version=self.delta_version(name),
                             storage_options=self.storage_options())

    def dataset(self, name: str) -> pads.Dataset:
        """The table as a pyarrow dataset over the pinned data files (read through the root's filesystem).

        The schema is the one stored in the files (with its ``medreco.*`` metadata).
        """
        paths = [self.storage.path(p) for p in release_files(self.storage, self.version, name)]
        with self.storage.fs.open_input_file(paths[0]) as f:
            schema = pq.read_schema(f)
        return pads.dataset(paths, schema=schema, format="parquet", filesystem=self.storage.fs)

    def read(self, name: str, columns: list[str] | None = None) -> pa.Table:
        """The whole table (or some columns) as a pyarrow Table."""
        return self.dataset(name).to_table(columns=columns)

    def verify(self) -> list[str]:
        """Re-hash every file of the release (:func:`etl.snapshots.verify`); empty when intact."""
        return verify(self.storage, self.version)

    def __repr__(self) -> str:
        rows = ", ".join(f"{t}={v['rows']}" for t, v in self.manifest["tables"].items())
        return f"Snapshot({self.version}, {self.storage.full_uri('snapshots')}, {rows})"


def load_snapshot(root_or_storage: str | Storage, version: str = "latest", *, endpoint_url: str | None = None,
                  region: str = "us-east-1", verify_files: bool = False) -> Snapshot:
    """Open a published release.

    Parameters
    ----------
    root_or_storage : str or Storage
        the storage root (a folder, ``file://`` or ``s3://bucket/prefix``) or an opened :class:`Storage`.
    version : str
        ``"latest"`` (default) or a published ``MAJOR.MINOR.PATCH``.
    endpoint_url : str, optional
        S3-compatible endpoint (MinIO, moto) when a URI is given; credentials from the AWS environment.
    region : str
        S3 region when a URI is given.
    verify_files : bool
        re-hash every file first (reads the whole release) and refuse a damaged one.

    Returns
    -------
    Snapshot

    Raises
    ------
    SnapshotError
        no release (or no release ``version``) under the root, or ``verify_files`` found a problem.
    """
    if isinstance(root_or_storage, Storage):
        storage = root_or_storage
    else:
        fs, base = open_filesystem(str(root_or_storage), endpoint_url=endpoint_url, region=region)
        if isinstance(fs, pafs.LocalFileSystem) and fs.get_file_info(base).type == pafs.FileType.NotFound:
            raise SnapshotError(f"no storage root at {base}")  # (Storage.open would create the folder)
        storage = Storage.open(str(root_or_storage), endpoint_url=endpoint_url, region=region)
    resolved = resolve_version(storage, version)
    snap = Snapshot(storage, resolved, read_manifest(storage, resolved))
    if verify_files:
        problems = snap.verify()
        if problems:
            raise SnapshotError(f"snapshot {resolved} failed verification: " + "; ".join(problems))
    return snap

