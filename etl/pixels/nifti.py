"""Volumes as NIfTI-1 objects: the normaliser's (slices, rows, cols) array <-> ``.nii.gz`` bytes.

Written by SimpleITK (``sitk.WriteImage``), which converts the LPS geometry of the volume (spacing, origin,
direction, :class:`etl.pixels.volumes.Geometry`) into NIfTI's RAS qform/sform, then gzipped here with
``mtime=0`` (the same array and geometry give the same bytes, so the object's sha256 is its name). Stored
types: CT as int16 HU, rounded half to even (``numpy.rint``) after resampling and clipping (the recipe's
``store`` step says so; at most 0.5 HU from the float value); MR as float32 (0..1 after the percentile scaling).

NIfTI axis order is (x, y, z) = (col, row, slice): nibabel's ``get_fdata()`` is the pipeline's array transposed
(``array.transpose(2, 1, 0)``), and its affine maps voxel (i, j, k) to RAS mm.
"""

from __future__ import annotations

import gzip
import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from medreco_reader.payloads import decode_nifti as reader_decode_nifti

#: ``payload_format`` of an images row whose volume is a NIfTI-1 object (images schema 2.0)
NIFTI_FORMAT = "nifti"
#: file name suffix of the objects
NIFTI_SUFFIX = ".nii.gz"
#: the largest |stored - float| of a CT voxel, HU (rounding to the nearest integer)
CT_MAX_ROUNDING_HU = 0.5


@dataclass(frozen=True)
class NiftiVolume:
    """One encoded volume.

    Attributes
    ----------
    data : bytes
        the ``.nii.gz`` object.
    sha256 : str
        hex sha256 of ``data`` (the object's name).
    dtype : str
        stored voxel type, ``"int16"`` (CT) or ``"float32"`` (MR and others).
    step : dict
        the recipe's ``store`` step (format, dtype, rounding, gzip level, axes, geometry source).
    """

    data: bytes
    sha256: str
    dtype: str
    step: dict[str, Any]


def _geometry(spacing_mm: Any, origin_mm: Any, direction: Any) -> tuple[tuple, tuple, tuple, str]:
    known = (
        spacing_mm is not None
        and all(v is not None for v in spacing_mm)
        and origin_mm is not None
        and direction is not None
    )
    sp = [float(v) if v is not None else 1.0 for v in (spacing_mm or [1.0, 1.0, 1.0])]
    spacing = (sp[1], sp[0], sp[2])  # SimpleITK (x, y, z) = (col, row, slice)
    origin = tuple(float(v) for v in origin_mm) if origin_mm is not None else (0.0, 0.0, 0.0)
    dirs = tuple(float(v) for v in direction) if direction is not None else (1.0, 0, 0, 0, 1.0, 0, 0, 0, 1.0)
    return spacing, origin, dirs, "row" if known else "partly unknown: unit spacing / zero origin / identity"


def encode_nifti(
    volume: np.ndarray, spacing_mm: Any, origin_mm: Any, direction: Any, modality: str, gzip_level: int = 1
) -> NiftiVolume:
    """Encode a normalised volume as a gzipped NIfTI-1 object.

    Parameters
    ----------
    volume : numpy.ndarray
        float32 (slices, rows, cols): HU for CT (clipped), 0..1 for MR.
    spacing_mm : sequence of 3 float or None
        [row, col, slice] mm (None entries: 1 mm, recorded).
    origin_mm : sequence of 3 float or None
        LPS position of voxel (0, 0, 0), mm.
    direction : sequence of 9 float or None
        row-major direction cosines (SimpleITK order).
    modality : str
        ``"CT"`` stores int16 HU, anything else float32.
    gzip_level : int
        1 (fast, default) to 9.

    Returns
    -------
    NiftiVolume

    Raises
    ------
    ValueError
        for an array that is not 3D, or CT values outside the int16 range.
    """
    import SimpleITK as sitk

    if volume.ndim != 3:
        raise ValueError(f"a volume is (slices, rows, cols); got shape {volume.shape}")
    if modality == "CT":
        rounded = np.rint(volume)
        if rounded.size and (rounded.min() < np.iinfo(np.int16).min or rounded.max() > np.iinfo(np.int16).max):
            raise ValueError("CT values outside the int16 range")
        stored = rounded.astype(np.int16)
        del rounded
        rounding = {
            "rounding": "nearest, half to even (numpy.rint), after resampling and clipping",
            "max_abs_error_hu": CT_MAX_ROUNDING_HU,
        }
    else:
        stored = np.ascontiguousarray(volume, dtype=np.float32)
        rounding = {}
    spacing, origin, dirs, source = _geometry(spacing_mm, origin_mm, direction)
    image = sitk.GetImageFromArray(stored)
    del stored
    image.SetSpacing(spacing)
    image.SetOrigin(origin)
    image.SetDirection(dirs)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "volume.nii"
        sitk.WriteImage(image, str(path), useCompression=False)
        del image
        data = gzip.compress(path.read_bytes(), compresslevel=int(gzip_level), mtime=0)
    dtype = "int16" if modality == "CT" else "float32"
    step = {
        "step": "store",
        "format": "nifti1",
        "by": "SimpleITK.WriteImage",
        "dtype": dtype,
        **rounding,
        "gzip_level": int(gzip_level),
        "axes": "x=col,y=row,z=slice",
        "coordinates": "RAS affine from LPS",
        "geometry": source,
    }
    return NiftiVolume(data, hashlib.sha256(data).hexdigest(), dtype, step)


def decode_nifti(data: bytes) -> tuple[np.ndarray, dict[str, Any]]:
    """Decode a ``.nii.gz`` object (as written by :func:`encode_nifti`) to the pipeline's array and geometry.

    The reader package's decoder (:func:`medreco_reader.payloads.decode_nifti`, one implementation): the stored
    array (int16 HU for CT, float32 for MR) as (slices, rows, cols), and ``spacing_mm`` ([row, col, slice] mm),
    ``origin_mm`` (LPS mm) and ``direction`` (9 row-major cosines, LPS) from the header converted back from RAS.

    Raises
    ------
    ValueError
        when ``data`` is not a readable NIfTI-1 volume.
    """
    return reader_decode_nifti(data)
