"""Volume objects pinned by a release: the ``images`` rows of a release name each NIfTI object by URI and sha256.

Volumes are never copied into a release: a release's ``images`` data files (themselves pinned by sha256 in the
manifest) carry each volume's ``payload_uri`` (``curated/volumes/<sha256>.nii.gz``, content-addressed, never
deleted by the build) and ``payload_sha256``, so the release pins the objects by hash. :func:`verify_volumes`
re-hashes every pinned object (streamed, one block at a time); ``medreco snapshot verify`` runs it.
"""

from __future__ import annotations

import pyarrow.parquet as pq

from etl.snapshots.manifest import release_files, sha256_file
from etl.storage import Storage


def volume_pins(storage: Storage, version: str) -> list[tuple[str, str]]:
    """``(payload_uri, payload_sha256)`` of every volume object a release pins, sorted by URI.

    Reads the ``payload_uri`` and ``payload_sha256`` columns of the release's ``images`` files only (releases of
    images schema < 2.0 have no ``payload_uri``: no objects, an empty list); missing or unreadable data files
    are skipped (``verify`` reports them itself).
    """
    pins: set[tuple[str, str]] = set()
    for rel in release_files(storage, version, "images"):
        if not storage.is_file(rel):
            continue  # a missing data file is reported by verify's file checks
        with storage.fs.open_input_file(storage.path(rel)) as f:
            try:
                pf = pq.ParquetFile(f)
                if "payload_uri" not in pf.schema_arrow.names:
                    continue
                t = pf.read(columns=["payload_uri", "payload_sha256"]).to_pydict()
            except (OSError, ValueError):  # pyarrow.ArrowInvalid: a damaged data file, reported by its sha256
                continue
        pins.update((u, s) for u, s in zip(t["payload_uri"], t["payload_sha256"], strict=True) if u)
    return sorted(pins)


def verify_volumes(storage: Storage, version: str) -> list[str]:
    """Problems with the volume objects a release pins (missing object, sha256 mismatch); empty when intact."""
    problems = []
    for uri, digest in volume_pins(storage, version):
        if not storage.is_file(uri):
            problems.append(f"images: missing volume object {uri}")
        elif sha256_file(storage, uri) != digest:
            problems.append(f"images: sha256 mismatch in volume object {uri}")
    return problems
