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
from collections.abc import Callable
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
            raise SnapshotError(
                f"no published snapshot under {storage.full_uri('snapshots')}: pass the storage root, the folder "
                "holding snapshots/ (medreco snapshot list --root ROOT lists its releases)"
            )
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
        if not storage.exists("snapshots"):
            storage, version = release_root(
                storage, version, lambda uri: Root.open(uri, endpoint_url=endpoint_url, region=region)
            )
    else:
        storage = root
    resolved = resolve_version(storage, version)
    return storage, resolved, read_manifest(storage, resolved)


def _parent(uri: str) -> tuple[str, str]:
    """``(parent, name)`` of a path or URI (``s3://b/p/x`` -> ``("s3://b/p", "x")``)."""
    head, _, name = str(uri).rstrip("/").rpartition("/")
    return head, name


def release_root(storage: Any, version: str, open_root: Callable[[str], Any]) -> tuple[Any, str]:
    """The storage root and version to read when ``storage`` was opened at a folder that is not a root (no
    ``snapshots/`` folder) but one inside a root: a release folder ``<root>/snapshots/<version>`` gives ``<root>``
    and that version (its manifest pins files by root-relative paths, so the root is what is read);
    ``<root>/snapshots`` gives ``<root>``. Any other folder is returned as it is (``resolve_version`` then says
    there is no release, and to pass the root).

    Parameters
    ----------
    storage : Root or the project's Storage
        opened at the folder given.
    version : str
        the version asked for (``"latest"`` or ``MAJOR.MINOR.PATCH``).
    open_root : callable(str) -> Root or Storage
        opens a root by URI (the caller's kind, endpoint and region).

    Raises
    ------
    SnapshotError
        for a release folder outside its root (a copy: its data files stay in the root's ``snapshots/tables/``),
        an exported folder (``export.json``: read it with Hugging Face ``datasets``), a release folder asked for
        another version, or a folder that is none of these; each message says what to pass instead.
    """
    parent, name = _parent(storage.full_uri(""))
    if storage.is_file("export.json"):
        raise SnapshotError(
            f"{storage.full_uri('')} is an exported release (medreco snapshot export): read it with Hugging Face "
            f"datasets, datasets.load_dataset({storage.full_uri('')!r}, 'pairs', split='train'); load_snapshot "
            "takes the storage root it was exported from"
        )
    if name == "snapshots" and parent:
        return open_root(parent), version
    if storage.is_file(MANIFEST):
        release = json.loads(storage.read_text(MANIFEST)).get("version", name)
        if _parent(parent)[1] == "snapshots" and release == name:
            if version not in ("latest", release):
                raise SnapshotError(
                    f"{storage.full_uri('')} is the release folder of {release}, not {version}: pass the storage "
                    f"root {_parent(parent)[0]} to choose a version"
                )
            return open_root(_parent(parent)[0]), release
        raise SnapshotError(
            f"{storage.full_uri('')} is a release folder ({release}) outside its storage root: its data files are "
            "in the root's snapshots/tables/ and curated/volumes/, so pass the storage root it was published under "
            "(the folder holding snapshots/); to move a release, export it (medreco snapshot export VERSION DEST)"
        )
    return storage, version  # no release here: resolve_version says so, naming where it looked


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
