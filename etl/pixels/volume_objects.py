"""Volume rows to content-addressed NIfTI objects: ``curated/volumes/<sha256>.nii.gz`` under the storage root.

:func:`etl.pixels.normalise.normalise_volume` returns the float32 volume as an ``.npy`` payload; the normalise
task hands each volume row to :func:`externalise_volume` as soon as it is made (so a shard holds one volume's
pixels at a time), which encodes it (:func:`etl.pixels.nifti.encode_nifti`: CT int16 HU, MR float32), writes
the object once (its name is its sha256: an object already there is the same bytes and is not rewritten) and
returns the images row of schema 2.0 (``payload_format`` ``nifti``, ``payload`` null, ``payload_uri``,
``payload_sha256``, ``payload_bytes``, ``dtype``; the recipe's ``encode`` step replaced by the ``store`` step).
Objects are never deleted by the build: releases pin them by hash.
"""

from __future__ import annotations

import json
from typing import Any

from etl import zones
from etl.pixels.nifti import NIFTI_FORMAT, encode_nifti
from etl.pixels.npy_payload import read_npy
from etl.storage import Storage


def externalise_volume(storage: Storage, row: dict[str, Any], gzip_level: int = 1) -> dict[str, Any]:
    """Write a volume row's pixels as a NIfTI object and return the row that points at it.

    Parameters
    ----------
    storage : Storage
        the build's storage root.
    row : dict
        an images row with ``payload_format`` ``npy`` (float32 (slices, rows, cols)), ``modality``,
        ``spacing_mm``, ``origin_mm``, ``direction`` and ``recipe``. Rows of other formats are returned unchanged.
    gzip_level : int
        ``normalisation.nifti_gzip_level`` (1 fast .. 9).

    Returns
    -------
    dict
        the row with ``payload`` None, ``payload_format`` ``"nifti"``, ``payload_uri`` (root-relative),
        ``payload_sha256``, ``payload_bytes``, ``dtype`` (``int16`` CT / ``float32``) and the recipe updated.

    Raises
    ------
    ValueError
        when the payload is not an ``.npy`` volume or CT values do not fit int16.
    """
    if row.get("payload_format") != "npy":
        return row
    volume = read_npy(row["payload"])
    obj = encode_nifti(
        volume, row.get("spacing_mm"), row.get("origin_mm"), row.get("direction"), row["modality"], gzip_level
    )
    del volume
    uri = zones.curated_volume(obj.sha256)
    if not storage.is_file(uri):
        storage.write_bytes(uri, obj.data)
    recipe = json.loads(row["recipe"])
    recipe["steps"] = [s for s in recipe.get("steps", []) if s.get("step") != "encode"] + [obj.step]
    return {
        **row,
        "payload": None,
        "payload_format": NIFTI_FORMAT,
        "payload_uri": uri,
        "payload_sha256": obj.sha256,
        "payload_bytes": len(obj.data),
        "dtype": obj.dtype,
        "recipe": json.dumps(recipe, sort_keys=True, separators=(",", ":")),
    }
