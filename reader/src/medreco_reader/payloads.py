"""Decoding an ``images`` payload: PNG (2D), NIfTI-1 objects (volumes, images schema 2.0) and the inline
``.npy`` / ``.npz`` volumes of older releases (schemas 1.2 / 1.1).

The one implementation: the project's normaliser (:func:`etl.pixels.normalise.load_payload`) and its NIfTI
module call these functions.
"""

from __future__ import annotations

import gzip
import io
import zipfile
from typing import Any

import numpy as np

#: ``payload_format`` values whose payload is a volume (slices, rows, cols)
VOLUME_FORMATS = frozenset({"nifti", "npy", "npz"})
#: the magic string a ``.npy`` payload starts with
NPY_MAGIC = b"\x93NUMPY"


def read_npy(payload: bytes) -> np.ndarray:
    """The array of a ``.npy`` payload (a new, writable array; pickled objects refused).

    Raises
    ------
    ValueError
        When ``payload`` is not a ``.npy`` (an ``.npz`` included) or holds objects.
    """
    if not bytes(payload[:6]) == NPY_MAGIC:
        raise ValueError("payload is not an .npy array: it does not start with the .npy magic string")
    try:
        return np.load(io.BytesIO(payload), allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise ValueError(f"payload is not an .npy array: {exc}") from None


def decode_nifti(data: bytes) -> tuple[np.ndarray, dict[str, Any]]:
    """Decode a ``.nii.gz`` volume object to the pipeline's array and geometry.

    Parameters
    ----------
    data : bytes
        the object (gzipped NIfTI-1; an uncompressed ``.nii`` is accepted too).

    Returns
    -------
    (numpy.ndarray, dict)
        the stored array (int16 HU for CT, float32 for MR) as (slices, rows, cols) (NIfTI's (x, y, z) =
        (col, row, slice) transposed), and ``spacing_mm`` ([row, col, slice] mm), ``origin_mm`` (LPS mm) and
        ``direction`` (9 row-major cosines, LPS), from the header's affine converted back from RAS.

    Raises
    ------
    ValueError
        when ``data`` is not a readable 3D NIfTI-1 volume.
    """
    import nibabel as nib

    try:
        raw = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
        img = nib.Nifti1Image.from_bytes(raw)
        array = np.asarray(img.dataobj.get_unscaled())  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001  nibabel raises several types for a bad header
        raise ValueError(f"payload is not a readable NIfTI-1 volume: {type(exc).__name__}: {exc}") from None
    if array.ndim != 3:
        raise ValueError(f"NIfTI volume has {array.ndim} dimensions, expected 3")
    affine = np.diag([-1.0, -1.0, 1.0, 1.0]) @ img.affine  # RAS -> LPS
    zooms = np.linalg.norm(affine[:3, :3], axis=0)
    direction = affine[:3, :3] / zooms
    meta = {
        "spacing_mm": [float(zooms[1]), float(zooms[0]), float(zooms[2])],
        "origin_mm": [float(v) for v in affine[:3, 3]],
        "direction": [float(v) for v in direction.reshape(-1)],
    }
    return np.ascontiguousarray(array.transpose(2, 1, 0)), meta


def decode_payload(payload: bytes, payload_format: str) -> np.ndarray:
    """Decode an ``images`` payload to its array, exactly as stored (all formats are lossless).

    Parameters
    ----------
    payload : bytes
        the ``payload`` column value, or for ``nifti`` the bytes of the object at ``payload_uri``.
    payload_format : str
        ``"png"``, ``"nifti"``, ``"npy"`` or ``"npz"`` (the ``payload_format`` column).

    Returns
    -------
    numpy.ndarray
        ``png``: uint8 or uint16, (rows, cols) grayscale or (rows, cols, 3) RGB; ``nifti``: (slices, rows, cols),
        int16 HU for CT, float32 0..1 for MR (:func:`decode_nifti`); ``npy``: float32 (slices, rows, cols);
        ``npz``: its ``volume`` member, the same.

    Raises
    ------
    ValueError
        for an unknown ``payload_format`` or a payload that is not of that format.
    """
    if payload_format == "png":
        from PIL import Image

        try:
            with Image.open(io.BytesIO(payload)) as image:
                if image.format != "PNG":
                    raise ValueError(f"payload is {image.format}, not PNG")
                return np.array(image)
        except OSError as exc:
            raise ValueError(f"payload is not a readable PNG: {exc}") from None
    if payload_format == "npy":
        return read_npy(payload)
    if payload_format == "nifti":
        return decode_nifti(payload)[0]
    if payload_format == "npz":
        try:
            with np.load(io.BytesIO(payload), allow_pickle=False) as npz:
                return npz["volume"]
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as exc:
            raise ValueError(f"payload is not an npz holding 'volume': {exc}") from None
    raise ValueError(f"unknown payload_format {payload_format!r}; expected 'png', 'nifti', 'npy' or 'npz'")
