"""Python API for ML users: one published release, loadable in one line.

>>> from etl.snapshots import load_snapshot                       # doctest: +SKIP
>>> snap = load_snapshot("/data/medreco", version="latest")       # or "s3://bucket/prefix", or a Storage
>>> snap.version, snap.manifest["content_hash"]
>>> pairs = snap.table("pairs").filter(pl.col("gap_days") < 365).collect()   # polars LazyFrame
>>> ds = snap.dataset("images")                                   # pyarrow.dataset.Dataset

:class:`Snapshot` is the reader package's (:class:`medreco_reader.snapshot.Snapshot`: pinned files, polars,
pyarrow, views, one image's pixels), with :meth:`Snapshot.verify` added; without the project,
``pip install ./reader`` gives the same reads (``from medreco_reader import load_snapshot``). Every read goes to
the data files the release pins, so later releases never change what a loaded snapshot returns. For pixels in
batches, see :mod:`medreco_reader.torch_data`.
"""

from __future__ import annotations

import pyarrow.fs as pafs

from etl.snapshots.verify import verify
from etl.storage import Storage, open_filesystem
from medreco_reader.snapshot import Snapshot as ReaderSnapshot
from medreco_reader.snapshot import SnapshotError, open_release, release_root


class Snapshot(ReaderSnapshot):
    """A published release of MedReCo-DB, read-only (:class:`medreco_reader.snapshot.Snapshot` on the project's
    :class:`etl.storage.Storage`).

    Parameters
    ----------
    storage : Storage
        the storage root the release lives under.
    version : str
        its semantic version (``MAJOR.MINOR.PATCH``).
    manifest : dict
        its manifest (``content_hash``, per-table ``delta_version``, ``files``, ``rows`` ...).
    """

    def verify(self) -> list[str]:
        """Re-hash every file of the release (:func:`etl.snapshots.verify`); empty when intact."""
        return verify(self.storage, self.version)


def load_snapshot(
    root_or_storage: str | Storage,
    version: str = "latest",
    *,
    endpoint_url: str | None = None,
    region: str = "us-east-1",
    verify_files: bool = False,
) -> Snapshot:
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
        if not storage.exists("snapshots"):  # a release folder or snapshots/ inside a root: that root
            storage, version = release_root(
                storage, version, lambda uri: Storage.open(uri, endpoint_url=endpoint_url, region=region)
            )
    snap = Snapshot(*open_release(storage, version))
    if verify_files:
        problems = snap.verify()
        if problems:
            raise SnapshotError(f"snapshot {snap.version} failed verification: " + "; ".join(problems))
    return snap
