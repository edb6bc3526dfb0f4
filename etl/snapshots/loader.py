"""Loader for ML users: one row of the ``images`` table -> numpy array (or torch tensor) + metadata.

A row is a dict with ``payload_format`` and either ``payload`` (bytes: ``"png"``; the inline volumes of older
snapshots, ``"npy"`` of images schema 1.2 and ``"npz"`` of 1.1) or ``payload_uri`` (``"nifti"``, images schema
2.0: a ``.nii.gz`` object relative to the storage root, read from local disk or ``s3://`` through ``storage``),
as read from the Parquet table (``pyarrow.Table.to_pylist()`` or ``polars.DataFrame.iter_rows(named=True)``).
Arrays come back exactly as stored (PNG, ``.npy`` and NIfTI are lossless; CT volumes of schema 2.0 are int16 HU,
rounded once when written).
"""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

import numpy as np

from etl.pixels.normalise import VOLUME_FORMATS, load_payload
from etl.storage import Storage


def _vector(value: Any, size: int) -> list[float | None] | None:
    if value is None:
        return None
    arr = np.asarray(value, dtype=np.float64).reshape(-1)
    if arr.size != size or np.isnan(arr).all():
        return None
    return [None if np.isnan(v) else float(v) for v in arr]


def payload_bytes(row: dict[str, Any], storage: Storage | str | None = None) -> bytes:
    """The payload of an ``images`` row: its inline ``payload``, or the object at ``payload_uri`` read through
    ``storage`` (a :class:`etl.storage.Storage` or a root path / ``s3://`` URI; the release's root).

    Raises
    ------
    KeyError
        when the row has neither a ``payload`` nor a ``payload_uri``.
    ValueError
        when the row names an object and no ``storage`` is given.
    etl.storage.StorageError
        when the object cannot be read.
    """
    if row.get("payload") is not None:
        return row["payload"]
    uri = row.get("payload_uri")
    if not uri:
        raise KeyError("payload")
    if storage is None:
        raise ValueError(f"row {row.get('image_key')} keeps its volume in {uri}: pass the storage root to read it")
    st = Storage.open(storage) if isinstance(storage, str) else storage
    return st.read_bytes(uri)


def load_image(row: dict[str, Any], storage: Storage | str | None = None) -> tuple[np.ndarray, dict[str, Any]]:
    """Decode an ``images`` row to its array and metadata.

    Parameters
    ----------
    row : dict
        ``payload_format`` and ``payload`` (or ``payload_uri``) required; ``view``, ``recipe``, ``spacing_mm``,
        ``image_key`` used when present.
    storage : Storage or str, optional
        the storage root the row's ``payload_uri`` is relative to (local path or ``s3://``); needed for
        ``nifti`` rows only.

    Returns
    -------
    (numpy.ndarray, dict)
        ``png``: uint8/uint16 (rows, cols) or (rows, cols, 3); ``nifti``: (slices, rows, cols), int16 HU for CT
        (clipped, rounded), float32 0..1 for MR; ``npy`` / ``npz``: float32 (slices, rows, cols),
        HU for CT (clipped), 0..1 for MR. Metadata: ``spacing_mm`` ([row, col] for 2D, [row, col,
        slice] for volumes, mm), ``origin_mm`` (LPS mm, volumes), ``direction`` (9 row-major
        direction cosines, volumes), ``view``, ``recipe`` (parsed JSON), ``payload_format``.
        Volumes take spacing, origin and direction from the row (an ``npz`` payload of schema 1.1 also
        holds them, and those are used). PNG images also get
        ``image_spacing_mm``, the spacing of the stored (resized) pixels (:func:`png_spacing_mm`); their
        ``spacing_mm`` is the source PixelSpacing.

    Raises
    ------
    KeyError
        When ``payload`` (and ``payload_uri``) or ``payload_format`` is missing.
    ValueError
        For an unknown format or an unreadable payload (see :func:`etl.pixels.normalise.load_payload`), or a
        ``nifti`` row without ``storage``.
    """
    fmt = row["payload_format"]
    payload = payload_bytes(row, storage)
    array = load_payload(payload, fmt)
    recipe = row.get("recipe")
    meta: dict[str, Any] = {
        "payload_format": fmt,
        "view": row.get("view"),
        "recipe": json.loads(recipe) if isinstance(recipe, str) and recipe else recipe,
        "spacing_mm": row.get("spacing_mm"),
        "origin_mm": row.get("origin_mm"),
        "direction": row.get("direction"),
    }
    if fmt == "npz":
        try:
            with np.load(io.BytesIO(payload), allow_pickle=False) as npz:
                names = set(npz.files)
                for key, size in (("spacing_mm", 3), ("origin_mm", 3), ("direction", 9)):
                    if key in names:
                        meta[key] = _vector(npz[key], size)
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise ValueError(f"payload is not a readable npz: {exc}") from None
    elif fmt in VOLUME_FORMATS:
        for key in ("spacing_mm", "origin_mm", "direction"):
            if meta[key] is not None:
                meta[key] = [None if v is None else float(v) for v in meta[key]]
    else:
        if meta["spacing_mm"] is not None:
            meta["spacing_mm"] = [float(v) for v in meta["spacing_mm"]]
        meta["image_spacing_mm"] = png_spacing_mm(meta["spacing_mm"], meta["recipe"])
    return array, meta


def png_spacing_mm(spacing_mm: list[float] | None, recipe: dict | None) -> list[float] | None:
    """Pixel spacing of the stored PNG, [row, col] mm: the source ``spacing_mm`` (PixelSpacing, kept as the
    images table stores it) scaled by the recipe's ``resize`` step (``from`` / ``to`` per axis; padding adds
    pixels, not scale). None when the source spacing is unknown.
    """
    if spacing_mm is None:
        return None
    for step in recipe.get("steps", []) if isinstance(recipe, dict) else []:
        if step.get("step") == "resize":
            (r0, c0), (r1, c1) = step["from"], step["to"]
            return [float(spacing_mm[0]) * r0 / r1, float(spacing_mm[1]) * c0 / c1]
    return [float(v) for v in spacing_mm]


def to_tensor(row: dict[str, Any], storage: Storage | str | None = None) -> Any:
    """The row's array as a ``torch.Tensor`` (torch imported lazily).

    Parameters
    ----------
    row : dict
        As for :func:`load_image`.
    storage : Storage or str, optional
        As for :func:`load_image` (``nifti`` rows).

    Returns
    -------
    torch.Tensor
        volumes float32 (slices, rows, cols) (HU for CT, int16 objects converted exactly); PNG images as float32 scaled to 0..1 by their
        bit depth (8-bit / 255, 16-bit / 65535), grayscale (1, rows, cols), RGB (3, rows, cols)
        (channels first, as torchvision expects).
    """
    import torch

    array, _ = load_image(row, storage)
    if row["payload_format"] in VOLUME_FORMATS:
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
    scale = 255.0 if array.dtype == np.uint8 else 65535.0
    unit = array.astype(np.float32) / np.float32(scale)
    unit = unit[None] if unit.ndim == 2 else np.moveaxis(unit, -1, 0)
    return torch.from_numpy(np.ascontiguousarray(unit))
