"""One row of a release's ``images`` table -> numpy array + metadata, and which image represents a study.

A row is a dict as read from the Parquet table (``pyarrow.Table.to_pylist()``, ``polars.DataFrame.iter_rows(
named=True)``) with ``payload_format`` and either ``payload`` (bytes: ``"png"``; the inline volumes of older
releases, ``"npy"`` / ``"npz"``) or ``payload_uri`` (``"nifti"``, images schema 2.0: a ``.nii.gz`` object
relative to the storage root, read through ``storage``).
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from medreco_reader.payloads import VOLUME_FORMATS, decode_payload
from medreco_reader.root import Root


def _vector(value: Any, size: int) -> list[float | None] | None:
    if value is None:
        return None
    arr = np.asarray(value, dtype=np.float64).reshape(-1)
    if arr.size != size or np.isnan(arr).all():
        return None
    return [None if np.isnan(v) else float(v) for v in arr]


def payload_bytes(row: Mapping[str, Any], storage: Any = None) -> bytes:
    """The payload of an ``images`` row: its inline ``payload``, or the object at ``payload_uri`` read through
    ``storage`` (a :class:`~medreco_reader.root.Root`, the project's ``Storage``, or a root path / ``s3://`` URI).

    Raises
    ------
    KeyError
        when the row has neither a ``payload`` nor a ``payload_uri``.
    ValueError
        when the row names an object and no ``storage`` is given.
    OSError
        when the object cannot be read (``FileNotFoundError`` from a :class:`Root`; the project's storage raises
        its own ``StorageError``).
    """
    if row.get("payload") is not None:
        return row["payload"]
    uri = row.get("payload_uri")
    if not uri:
        raise KeyError("payload")
    if storage is None:
        raise ValueError(f"row {row.get('image_key')} keeps its volume in {uri}: pass the storage root to read it")
    st = Root.open(storage) if isinstance(storage, str) else storage
    return st.read_bytes(uri)


def png_spacing_mm(spacing_mm: list[float] | None, recipe: dict | None) -> list[float] | None:
    """Pixel spacing of the stored PNG, [row, col] mm: the source ``spacing_mm`` (PixelSpacing) scaled by the
    recipe's ``resize`` step (``from`` / ``to`` per axis; padding adds pixels, not scale). None when unknown."""
    if spacing_mm is None:
        return None
    for step in recipe.get("steps", []) if isinstance(recipe, dict) else []:
        if step.get("step") == "resize":
            (r0, c0), (r1, c1) = step["from"], step["to"]
            return [float(spacing_mm[0]) * r0 / r1, float(spacing_mm[1]) * c0 / c1]
    return [float(v) for v in spacing_mm]


def load_image(row: Mapping[str, Any], storage: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
    """Decode an ``images`` row to its array and metadata.

    Parameters
    ----------
    row : mapping
        ``payload_format`` and ``payload`` (or ``payload_uri``) required; ``view``, ``recipe``, ``spacing_mm``,
        ``origin_mm``, ``direction`` used when present.
    storage : Root, Storage or str, optional
        the storage root ``payload_uri`` is relative to; needed for ``nifti`` rows only.

    Returns
    -------
    (numpy.ndarray, dict)
        ``png``: uint8/uint16 (rows, cols) or (rows, cols, 3); ``nifti``: (slices, rows, cols), int16 HU for CT,
        float32 0..1 for MR; ``npy`` / ``npz``: float32 (slices, rows, cols). Metadata: ``spacing_mm`` ([row, col]
        for 2D, [row, col, slice] for volumes, mm), ``origin_mm`` (LPS mm), ``direction`` (9 row-major cosines),
        ``view``, ``recipe`` (parsed JSON), ``payload_format``; PNG rows also ``image_spacing_mm`` (the stored
        pixels' spacing, :func:`png_spacing_mm`).

    Raises
    ------
    KeyError
        when ``payload`` (and ``payload_uri``) or ``payload_format`` is missing.
    ValueError
        for an unknown format, an unreadable payload, or a ``nifti`` row without ``storage``.
    """
    fmt = row["payload_format"]
    payload = payload_bytes(row, storage)
    array = decode_payload(payload, fmt)
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


def study_order(row: Mapping[str, Any]) -> tuple[bool, str]:
    """Sort key of a study's images: 2D images first, then by ``image_key`` (the representative comes first)."""
    return (row["kind"] != "2d", row["image_key"])


def representative(
    rows: Iterable[Mapping[str, Any]], modality: str | None = None, view: str | None = None
) -> Mapping[str, Any] | None:
    """The image that represents a study: of ``modality`` and ``view`` when the study has one (each filter is
    dropped when nothing matches it), 2D before 3D, then the smallest ``image_key``; None for no image.

    The one rule: the release's ``pair_images`` / ``vqa_images`` views and the torch datasets both use it.

    Parameters
    ----------
    rows : iterable of mapping
        the study's ``images`` rows (``image_key``, ``kind``, ``modality``, ``view`` needed).
    modality, view : str, optional
        the pair's (or VQA item's) modality and view.
    """
    candidates = sorted(rows, key=study_order)
    if modality is not None:
        candidates = [r for r in candidates if r["modality"] == modality] or candidates
    if view is not None:
        candidates = [r for r in candidates if r["view"] == view] or candidates
    return candidates[0] if candidates else None


def index_by_study(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """``images`` rows (``image_key``, ``study_key``, ``kind``, ``modality``, ``view``) grouped by study, each group
    in :func:`study_order`."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["study_key"], []).append(r)
    for group in out.values():
        group.sort(key=study_order)
    return out


def pair_images(by_study: Mapping[str, list[Mapping[str, Any]]], pairs: Iterable[Mapping[str, Any]]) -> list[dict]:
    """Each pair resolved to the representative image of its prior and current study (:func:`representative`
    with the pair's modality and view).

    Returns
    -------
    list of dict
        ``pair_id``, ``patient_key``, ``modality``, ``view``, ``prior_study_key``, ``current_study_key``,
        ``prior_image_key``, ``current_image_key`` (None when the study has no image), in the order of ``pairs``.
    """
    out = []
    for p in pairs:
        picks = [
            representative(by_study.get(p[k], []), p["modality"], p["view"])
            for k in ("prior_study_key", "current_study_key")
        ]
        out.append(
            {
                **{
                    k: p.get(k)
                    for k in ("pair_id", "patient_key", "modality", "view", "prior_study_key", "current_study_key")
                },
                "prior_image_key": picks[0]["image_key"] if picks[0] else None,
                "current_image_key": picks[1]["image_key"] if picks[1] else None,
            }
        )
    return out


def vqa_images(
    by_study: Mapping[str, list[Mapping[str, Any]]],
    pairs_by_id: Mapping[str, Mapping[str, Any]],
    items: Iterable[Mapping[str, Any]],
) -> list[dict]:
    """Each VQA item resolved to its images: the studies of ``study_keys`` (``[study]`` or ``[prior, current]``),
    else of its pair (prior, current) or of ``study_key``; with the pair's modality and view when it has a pair.

    Returns
    -------
    list of dict
        ``item_id``, ``pair_id``, ``study_keys`` (list of str), ``image_keys`` (list, one per study, None where
        the study has no image), in the order of ``items``.
    """
    out = []
    for q in items:
        p = pairs_by_id.get(q["pair_id"]) if q.get("pair_id") else None
        studies = list(
            q.get("study_keys")
            or ([p["prior_study_key"], p["current_study_key"]] if p else [q["study_key"]] if q.get("study_key") else [])
        )
        modality, view = (p["modality"], p["view"]) if p else (None, None)
        picks = [representative(by_study.get(s, []), modality, view) for s in studies]
        out.append(
            {
                "item_id": q["item_id"],
                "pair_id": q.get("pair_id"),
                "study_keys": studies,
                "image_keys": [r["image_key"] if r else None for r in picks],
            }
        )
    return out
