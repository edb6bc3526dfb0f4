"""Reading a published release: its manifest, the Parquet files it pins per table, and its views.

A release is ``snapshots/<MAJOR.MINOR.PATCH>/manifest.json`` under a storage root (a folder or
``s3://bucket/prefix``); every table is a Delta Lake table under ``snapshots/tables/<table>/`` shared by all
releases, of which a release pins one Delta version and its data files. Reads here go to exactly those files,
so a later release never changes what a loaded one returns. The one implementation: the project's
:mod:`etl.snapshots` reads releases through these functions and subclasses :class:`Snapshot`.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from medreco_reader.images import load_image
from medreco_reader.root import Root, storage_options

MANIFEST = "manifest.json"
#: the release folder's derived views (``views/<name>.parquet``): pairs and VQA items resolved to image rows
VIEWS_DIR = "views"
_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")


class SnapshotError(RuntimeError):
    """Raised for a missing release, table or view, a release whose files do not match its manifest, or a failed
    publish."""


def _vkey(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def release_dir(version: str) -> str:
    """Root-relative folder of a release (``snapshots/<version>``).

    Raises
    ------
    SnapshotError
        when ``version`` is not ``MAJOR.MINOR.PATCH``.
    """
    if not _VERSION_RE.match(str(version)):
        raise SnapshotError(f"not a release version (MAJOR.MINOR.PATCH): {version!r}")
    return f"snapshots/{version}"


def list_versions(storage: Any) -> list[str]:
    """Published versions (folders ``snapshots/<MAJOR.MINOR.PATCH>/`` holding a manifest), oldest first.

    ``storage``: a :class:`~medreco_reader.root.Root` or the project's ``Storage``.
    """
    if not storage.exists("snapshots"):
        return []
    folders = storage.fs.get_file_info(pafs.FileSelector(storage.path("snapshots"), recursive=False))
    names = [posixpath.basename(f.path) for f in folders if f.type == pafs.FileType.Directory]
    versions = [v for v in names if _VERSION_RE.match(v) and storage.is_file(f"snapshots/{v}/{MANIFEST}")]
    return sorted(versions, key=_vkey)


def resolve_version(storage: Any, version: str = "latest") -> str:
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
        raise SnapshotError(
            f"no snapshot {version} under {storage.full_uri('snapshots')}"
            + (f" (published: {', '.join(versions)})" if versions else "")
        )
    return version


def read_manifest(storage: Any, version: str) -> dict:
    """The manifest of one release (``version`` may be ``"latest"``).

    Raises
    ------
    SnapshotError
        if there is no such release.
    """
    if version == "latest":
        version = resolve_version(storage)
    path = f"{release_dir(version)}/{MANIFEST}"
    if not storage.is_file(path):
        raise SnapshotError(f"no snapshot {version} under {storage.full_uri('snapshots')}")
    return json.loads(storage.read_text(path))


def manifest_files(manifest: dict, table: str) -> list[str]:
    """Root-relative paths of a table's data files pinned by a manifest, in manifest (partition) order.

    Raises
    ------
    SnapshotError
        for a table the release does not have.
    """
    if table not in manifest["tables"]:
        raise SnapshotError(
            f"snapshot {manifest['version']} has no table {table!r}; tables: {', '.join(manifest['tables'])}"
        )
    v = manifest["tables"][table]
    return [f"{v['uri']}/{f['path']}" for f in v["files"]]


def release_files(storage: Any, version: str, table: str) -> list[str]:
    """:func:`manifest_files` of release ``version`` (rows in key order within each file, not across files)."""
    return manifest_files(read_manifest(storage, version), table)


@dataclass(frozen=True)
class Snapshot:
    """A published release, read-only.

    Parameters
    ----------
    storage : Root or the project's Storage
        the storage root the release lives under.
    version : str
        its semantic version.
    manifest : dict
        its manifest (``content_hash``, per-table ``delta_version``, ``files``, ``rows`` ...).
    """

    storage: Any
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

    @property
    def folder(self) -> str:
        """Local path or ``s3://`` URI of the release folder (its dataset card ``README.md``, ``croissant.json``,
        ``files/<table>.txt`` and ``views/`` where published by this code)."""
        return self.storage.full_uri(release_dir(self.version))

    def _entry(self, name: str) -> dict:
        try:
            return self.manifest["tables"][name]
        except KeyError:
            raise SnapshotError(
                f"snapshot {self.version} has no table {name!r}; tables: {', '.join(self.tables)}"
            ) from None

    def key_columns(self, name: str) -> list[str]:
        """The key columns of a table (unique per row)."""
        return list(self._entry(name)["key"])

    def delta_version(self, name: str) -> int:
        """The Delta table version this release pins for ``name``."""
        return int(self._entry(name)["delta_version"])

    def table_uri(self, name: str) -> str:
        """URI of the table's Delta folder (``DeltaTable(uri, version=snap.delta_version(name))``)."""
        return self.storage.full_uri(self._entry(name)["uri"])

    def files(self, name: str) -> list[str]:
        """Full URIs (local paths or ``s3://...``) of the table's pinned Parquet files, in partition order.

        For engines without Delta support: ``duckdb.read_parquet(snap.files("pairs"))``.
        """
        return [self.storage.full_uri(p) for p in manifest_files(self.manifest, name)]

    def storage_options(self) -> dict[str, str] | None:
        """object_store ``storage_options`` for polars/deltalake on this root (None for local disk)."""
        return storage_options(self.storage.fs)

    def table(self, name: str) -> pl.LazyFrame:
        """The table as a polars LazyFrame over the pinned Delta version (time travel).

        Rows come in partition order (key order within each data file): sort by the key where order matters.

        Raises
        ------
        SnapshotError
            for an unknown table.
        """
        return pl.scan_delta(
            self.table_uri(name), version=self.delta_version(name), storage_options=self.storage_options()
        )

    def dataset(self, name: str) -> pads.Dataset:
        """The table as a pyarrow dataset over the pinned data files (schema and ``medreco.*`` metadata as
        stored in the files)."""
        paths = [self.storage.path(p) for p in manifest_files(self.manifest, name)]
        with self.storage.fs.open_input_file(paths[0]) as f:
            schema = pq.read_schema(f)
        return pads.dataset(paths, schema=schema, format="parquet", filesystem=self.storage.fs)

    def read(self, name: str, columns: list[str] | None = None) -> pa.Table:
        """The whole table (or some columns) as a pyarrow Table."""
        return self.dataset(name).to_table(columns=columns)

    @property
    def views(self) -> list[str]:
        """Names of the release's views (``pair_images``, ``vqa_images``); empty for releases published before
        they existed."""
        return sorted(self.manifest.get("views", {}))

    def view(self, name: str) -> pa.Table:
        """A view of the release folder (``views/<name>.parquet``) as a pyarrow Table.

        ``pair_images``: one row per pair, ``prior_image_key`` / ``current_image_key`` the representative image
        of each study for the pair's modality and view (:func:`medreco_reader.images.representative`; null when
        the study has no image in the release). ``vqa_images``: one row per VQA item, ``image_keys`` (prior
        first) in the order of its ``study_keys``.

        Raises
        ------
        SnapshotError
            for a view the release does not have.
        """
        if name not in self.manifest.get("views", {}):
            raise SnapshotError(
                f"snapshot {self.version} has no view {name!r}; views: {', '.join(self.views) or 'none'}"
            )
        rel = f"{release_dir(self.version)}/{self.manifest['views'][name]['path']}"
        with self.storage.fs.open_input_file(self.storage.path(rel)) as f:
            return pq.read_table(f)

    def image_row(self, image_key: str, columns: list[str] | None = None) -> dict[str, Any]:
        """The ``images`` row of ``image_key`` (all columns, payload included, unless ``columns``).

        Raises
        ------
        KeyError
            when the release has no such image.
        """
        rows = self.dataset("images").to_table(columns=columns, filter=pc.field("image_key") == image_key).to_pylist()
        if not rows:
            raise KeyError(f"snapshot {self.version} has no image {image_key!r}")
        return rows[0]

    def image(self, image_key: str) -> tuple[np.ndarray, dict[str, Any]]:
        """Decoded pixels and metadata of one image (:func:`medreco_reader.images.load_image`)."""
        return load_image(self.image_row(image_key), self.storage)

    def volumes(self) -> list[dict[str, Any]]:
        """The release's volume objects as MONAI-style records, in table order: ``image`` (the full URI of the
        ``.nii.gz``: ``monai.transforms.LoadImaged(keys="image")``, nibabel, SimpleITK read it), ``image_key``,
        ``study_key``, ``patient_key``, ``modality``, ``payload_sha256``. Volumes stored inline (releases before
        images schema 2.0) are not listed."""
        names = set(self.dataset("images").schema.names)
        if "payload_uri" not in names:
            return []
        cols = ["image_key", "study_key", "patient_key", "modality", "payload_uri", "payload_sha256"]
        rows = self.read("images", columns=cols).filter(pc.is_valid(pc.field("payload_uri"))).to_pylist()
        return [{"image": self.storage.full_uri(r.pop("payload_uri")), **r} for r in rows]

    def __repr__(self) -> str:
        rows = ", ".join(f"{t}={v['rows']}" for t, v in self.manifest["tables"].items())
        return f"Snapshot({self.version}, {self.storage.full_uri('snapshots')}, {rows})"


def open_release(
    root: str | Any, version: str = "latest", *, endpoint_url: str | None = None, region: str = "us-east-1"
) -> tuple[Any, str, dict]:
    """``(storage, version, manifest)`` of a release; ``root`` a path, ``file://`` / ``s3://`` URI or an opened
    root (anything with the :class:`~medreco_reader.root.Root` methods).

    Raises
    ------
    SnapshotError
        no storage root at a local path, no release (or no release ``version``) under it.
    """
    if isinstance(root, str):
        storage = Root.open(root, endpoint_url=endpoint_url, region=region)
        if storage.is_local and storage.fs.get_file_info(storage.root).type == pafs.FileType.NotFound:
            raise SnapshotError(f"no storage root at {storage.root}")
    else:
        storage = root
    resolved = resolve_version(storage, version)
    return storage, resolved, read_manifest(storage, resolved)


def load_snapshot(
    root: str | Any, version: str = "latest", *, endpoint_url: str | None = None, region: str = "us-east-1"
) -> Snapshot:
    """Open a published release.

    Parameters
    ----------
    root : str or Root
        the storage root (a folder, ``file://`` or ``s3://bucket/prefix``; credentials from the AWS environment).
    version : str
        ``"latest"`` (default) or a published ``MAJOR.MINOR.PATCH``.
    endpoint_url : str, optional
        S3-compatible endpoint (MinIO, moto).
    region : str
        S3 region.

    Returns
    -------
    Snapshot

    Raises
    ------
    SnapshotError
        no release (or no release ``version``) under the root.
    """
    return Snapshot(*open_release(root, version, endpoint_url=endpoint_url, region=region))
