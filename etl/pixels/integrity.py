"""Payload integrity where payloads are written: the sha256 of every PNG / volume payload, checked once.

The normalise task (:func:`etl.pipeline.stages.normalise_shard`) writes a shard's ``images`` partitions and then
reads them back with :func:`verify_image_files`, one Parquet row group (at most
``etl.pipeline.stages.PAYLOAD_ROW_GROUP_ROWS`` rows) at a time, and hashes each ``payload`` (or, for a row
whose payload is an object under the storage root, that object, streamed in 8 MiB blocks) against the row's
``payload_sha256``. The result (:class:`PayloadIntegrity`, counts only) is recorded in the stage's incremental
state, and the global quality task reads that record (:func:`recorded_integrity`) instead of the payloads:
no global task touches pixels, and its memory does not grow with the archive.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import pyarrow.parquet as pq

from etl import zones
from etl.storage import Storage
from schemas.errors import ReasonCodedError

#: bytes read per step when hashing a payload object
HASH_BLOCK_BYTES = 8 << 20


class PayloadIntegrityError(ReasonCodedError, RuntimeError):
    """A written payload does not hash to its ``payload_sha256`` (reason ``payload_sha256_mismatch``): the write
    is retried (the task fails), never published."""


@dataclass
class PayloadIntegrity:
    """What :func:`verify_image_files` found for one shard (JSON-able, PHI-free: counts and opaque keys).

    Attributes
    ----------
    rows : int
        ``images`` rows in the files checked.
    verified : int
        rows whose payload (inline bytes or object) hashes to ``payload_sha256``.
    mismatches : list of str
        ``image_key`` of each row that does not (a missing object counts as a mismatch).
    objects : int
        rows whose payload is an object (``payload_uri``) rather than inline bytes.
    """

    rows: int = 0
    verified: int = 0
    mismatches: list[str] = field(default_factory=list)
    objects: int = 0

    def to_dict(self) -> dict:
        """The record as a plain dict (the stage result's ``payload_integrity``)."""
        return asdict(self)


def sha256_object(storage: Storage, rel: str) -> str | None:
    """Hex sha256 of a file under the storage root, streamed in :data:`HASH_BLOCK_BYTES` blocks (memory: one
    block); None when there is no such file."""
    if not storage.is_file(rel):
        return None
    return storage.sha256(rel, HASH_BLOCK_BYTES)


def verify_image_files(storage: Storage, files: Iterable[str]) -> PayloadIntegrity:
    """Hash every payload of the given ``images`` partition files against its ``payload_sha256``.

    Reads one row group at a time (columns ``image_key``, ``payload``, ``payload_sha256`` and, when the file
    has it, ``payload_uri``), through random access, so memory is one row group of payloads plus one
    :data:`HASH_BLOCK_BYTES` block. A row with a ``payload_uri`` is checked by hashing that object.

    Parameters
    ----------
    storage : Storage
    files : iterable of str
        root-relative Parquet files of the ``images`` table.

    Returns
    -------
    PayloadIntegrity
    """
    out = PayloadIntegrity()
    for rel in files:
        with storage.fs.open_input_file(storage.path(rel)) as f:
            pf = pq.ParquetFile(f)
            cols = ["image_key", "payload", "payload_sha256"]
            if "payload_uri" in pf.schema_arrow.names:
                cols.append("payload_uri")
            for i in range(pf.num_row_groups):
                rg = pf.read_row_group(i, columns=cols).to_pydict()
                uris = rg.get("payload_uri") or [None] * len(rg["image_key"])
                for key, payload, digest, uri in zip(
                    rg["image_key"], rg["payload"], rg["payload_sha256"], uris, strict=True
                ):
                    out.rows += 1
                    if uri:
                        out.objects += 1
                        got = sha256_object(storage, uri)
                    else:
                        got = hashlib.sha256(payload or b"").hexdigest()
                    if got is not None and got == (digest or "").lower():
                        out.verified += 1
                    else:
                        out.mismatches.append(key)
    return out


def recorded_integrity(storage: Storage, shard_count: int) -> dict[int, dict | None]:
    """The payload-integrity record of every shard's last normalise build (``None`` where there is none).

    Reads only the small JSON state files (``ledger/incremental/normalise/shard=N.json``), never a payload.
    """
    out: dict[int, dict | None] = {}
    for shard in range(shard_count):
        path = zones.incremental_state("normalise", shard)
        rec = None
        if storage.is_file(path):
            rec = (json.loads(storage.read_text(path)).get("result") or {}).get("payload_integrity")
        out[shard] = rec
    return out
