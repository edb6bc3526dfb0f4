"""Pixel normalisation: decoded DICOM images -> the ``images`` table's payloads.

* 2D objects (CR, DX, MG, US, XA, RF and other single images): VOI LUT / window, MONOCHROME1
  inversion, scaling to 8 or 16 bits, resize with aspect-preserving zero padding, PNG.
* 3D series (CT, MR slices): ordered along the slice normal, Modality LUT per slice, CT clipped
  to a HU window, MR clipped to the 1st-99th percentile of non-zero voxels and scaled to 0..1,
  stored as one float32 array (slices x rows x cols) in a ``.npy`` payload (:mod:`etl.pixels.npy_payload`).

Every payload comes with a ``recipe``: canonical JSON listing each step and its parameters, so
that the ML user can tell exactly what was done to the pixels. Decoding itself lives in
:mod:`etl.pixels.decode`; its :class:`NormalisationError` and :func:`decode` are re-exported here.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from typing import Any

import numpy as np
from PIL import Image
from pydicom.dataset import Dataset
from pydicom.pixels import apply_voi, apply_voi_lut
from pydicom.uid import UID

from etl.pixels.decode import (
    NormalisationError,
    check_decodable,
    decode,
    decode_image,
    element_value,
    frame_attribute,
    lut_view,
    n_frames,
    pixel_keyword,
)
from etl.pixels.mosaic import check_not_mosaic
from etl.pixels.npy_payload import NpyPayload, encode_npy
from etl.pixels.separable import is_axis_aligned, resampled_size
from etl.pixels.volumes import (
    Geometry,
    assess,
    cross3,
    dedupe,
    direction_matrix,
    exclude_outliers,
    regularise,
    resample,
    slice_geometry,
)
from medreco_reader.payloads import VOLUME_FORMATS as READER_VOLUME_FORMATS
from medreco_reader.payloads import decode_payload
from schemas.config import NormalisationConfig

__all__ = [
    "NormalisationError",
    "decode",
    "image_kind",
    "load_payload",
    "normalise_2d",
    "normalise_volume",
]

#: recipe format version; bump when a step's meaning changes
RECIPE_VERSION = 1
#: default CT resampling target [row, col, slice] in mm (MedReCo recipe; pass as ``target_spacing_mm``)
DEFAULT_CT_SPACING_MM = (0.75, 0.75, 1.5)
#: percentile window used when a 2D image carries no VOI LUT / window (percent)
PERCENTILE_WINDOW = (0.5, 99.5)
#: MR intensity clip, percent of the non-zero voxels (MedReCo recipe)
MR_PERCENTILES = (1.0, 99.0)
#: a plane is named AXIAL/CORONAL/SAGITTAL when the slice normal is within 30 degrees of an axis
_PLANE_COS = math.cos(math.radians(30.0))
#: orientation cosines may differ by DS rounding; positions closer than this are duplicates (mm)
_ORIENTATION_TOL = 1e-3
_POSITION_TOL_MM = 1e-3
_SPACING_TOL_MM = 1e-3
#: payload formats of 3D volumes: ``nifti`` (a NIfTI-1 object, images schema 2.0 on), ``npy`` (schema 1.2; what
#: :func:`normalise_volume` returns), ``npz`` (read for schema 1.1 snapshots)
VOLUME_FORMATS = READER_VOLUME_FORMATS

_VOLUME_MODALITIES = {"CT", "MR"}
#: objects that carry PixelData but are not images of the patient (segmentations, dose grids)
_NON_IMAGE_MODALITIES = {"SEG", "RTDOSE", "RTSTRUCT", "RTPLAN", "RTRECORD", "SR", "PR", "KO", "DOC", "REG"}
_SECONDARY_CAPTURE_PREFIX = "1.2.840.10008.5.1.4.1.1.7"
_LATERAL = {"LL", "RL", "LAT", "LATERAL"}


# --------------------------------------------------------------------------------------------- kinds


def image_kind(ds: Dataset) -> str:
    """Classify a DICOM object for normalisation.

    Parameters
    ----------
    ds : pydicom.dataset.Dataset

    Returns
    -------
    str
        ``"none"``: no pixel element (SR, PR, KO, RTSTRUCT, encapsulated documents ...) or a
        non-image object with pixels (SEG, RTDOSE); ``"3d_slice"``: a CT or MR image slice (or an
        enhanced multi-frame CT/MR stack), to be grouped by SeriesInstanceUID and passed to
        :func:`normalise_volume`; ``"2d"``: everything else with pixels (CR, DX, MG, US, XA, RF,
        NM, PT, secondary captures, CT localizers/scouts).
    """
    modality = str(ds.get("Modality") or "").upper()
    if pixel_keyword(ds) is None or modality in _NON_IMAGE_MODALITIES:
        return "none"
    if modality in _VOLUME_MODALITIES:
        image_type = [str(v).upper() for v in (ds.get("ImageType") or [])]
        sop = str(ds.get("SOPClassUID") or "")
        if "LOCALIZER" not in image_type and not sop.startswith(_SECONDARY_CAPTURE_PREFIX):
            return "3d_slice"
    return "2d"


def check_image_has_pixels(ds: Dataset) -> None:
    """Raise when an image object (its SOP Class is an *Image Storage* class, PS3.4 Annex B) has no pixel element.

    Such a file (cut before its Pixel Data, or sent without it) would otherwise take no part in normalisation
    and disappear from its series without a trace; non-image objects (SR, PR, KO, documents) pass.

    Raises
    ------
    etl.pixels.decode.NormalisationError
        ``no_pixel_data``.
    """
    if pixel_keyword(ds) is not None:
        return
    sop = str(ds.get("SOPClassUID") or "")
    name = UID(sop).name if sop else ""
    if "Image Storage" in name:
        raise NormalisationError("no_pixel_data", f"{name} object without a pixel data element")


# ------------------------------------------------------------------------------------------ helpers


def _recipe(kind: str, steps: list[dict[str, Any]]) -> str:
    return json.dumps({"kind": kind, "steps": steps, "version": RECIPE_VERSION}, sort_keys=True, separators=(",", ":"))


def _floats(value: Any) -> list[float] | None:
    try:
        out = [float(v) for v in value]
    except (TypeError, ValueError):
        return None
    return out if out and all(math.isfinite(v) for v in out) else None


def _pixel_spacing(ds: Dataset, frame: int | None = 0) -> list[float] | None:
    """[row, col] spacing in mm: PixelSpacing (functional groups first), else ImagerPixelSpacing."""
    for value in (
        frame_attribute(ds, "PixelMeasuresSequence", "PixelSpacing", frame),
        element_value(ds, "ImagerPixelSpacing"),
    ):
        spacing = _floats(value) if value is not None else None
        if spacing and len(spacing) == 2 and min(spacing) > 0:
            return spacing
    return None


def _view(ds: Dataset) -> str | None:
    """PA / AP / LATERAL from ViewPosition, else ViewCodeSequence CodeMeaning, else ViewPosition as is."""
    raw = str(ds.get("ViewPosition") or "").strip().upper()
    if raw in ("PA", "AP"):
        return raw
    if raw in _LATERAL:
        return "LATERAL"
    seq = ds.get("ViewCodeSequence")
    if seq and str(seq[0].get("CodeMeaning") or "").strip():
        return str(seq[0].CodeMeaning).strip()
    return raw or None


def _window_to_unit(arr: np.ndarray, ds: Dataset, frame: int | None) -> tuple[np.ndarray, dict[str, Any]]:
    """VOI LUT or window (PS3.3 C.11.2) to 0..1; percentile window when the file has none."""
    view = lut_view(ds, frame)
    has_lut = bool(view.get("VOILUTSequence"))
    has_window = "WindowCenter" in view and "WindowWidth" in view
    problem = None
    if has_lut or has_window:
        try:
            if has_lut:
                item = view.VOILUTSequence[0]
                entries = int(item.LUTDescriptor[0]) or 2**16
                first = int(item.LUTDescriptor[1])
                # the VOI LUT input is the integer Modality LUT output
                out = apply_voi(np.rint(arr).astype(np.int64), view).astype(np.float64)
                table = apply_voi(np.arange(first, first + entries, dtype=np.int64), view)
                lo, hi = float(table.min()), float(table.max())
                step: dict[str, Any] = {
                    "step": "voi",
                    "lut": "VOILUTSequence",
                    "entries": entries,
                    "first": first,
                }
            else:
                center = view["WindowCenter"].value
                width = view["WindowWidth"].value
                function = str(view.get("VOILUTFunction") or "LINEAR").strip().upper()
                c = float(center[0] if view["WindowCenter"].VM > 1 else center)
                w = float(width[0] if view["WindowWidth"].VM > 1 else width)
                if function in ("LINEAR", "LINEAR_EXACT") and w > (1.0 if function == "LINEAR" else 0.0):
                    # PS3.3 C.11.2.1.2.1 (LINEAR) and C.11.2.1.3.2 (LINEAR_EXACT), mapped straight to 0..1:
                    # y = ((x - (c - 0.5)) / (w - 1) + 0.5) clipped, resp. y = (x - c) / w + 0.5 clipped
                    x = arr.astype(np.float64, copy=False)
                    unit = ((x - (c - 0.5)) / (w - 1.0) + 0.5) if function == "LINEAR" else ((x - c) / w + 0.5)
                    return np.clip(unit, 0.0, 1.0, out=unit), {
                        "step": "voi",
                        "window_center": c,
                        "window_width": w,
                        "function": function,
                    }
                out = apply_voi_lut(arr.astype(np.float64), view, prefer_lut=False)
                ends = apply_voi_lut(np.array([-np.inf, np.inf]), view, prefer_lut=False)
                lo, hi = float(ends[0]), float(ends[1])
                step = {
                    "step": "voi",
                    "window_center": float(center[0] if view["WindowCenter"].VM > 1 else center),
                    "window_width": float(width[0] if view["WindowWidth"].VM > 1 else width),
                    "function": str(view.get("VOILUTFunction") or "LINEAR").upper(),
                }
            if hi > lo:
                return np.clip((out - lo) / (hi - lo), 0.0, 1.0), step
            problem = "VOI output range is empty"
        except (ValueError, NotImplementedError, IndexError, AttributeError) as exc:
            problem = f"{type(exc).__name__} while applying the file's VOI"
    lo, hi = (float(v) for v in np.percentile(arr, PERCENTILE_WINDOW))
    step = {"step": "voi", "percentile": list(PERCENTILE_WINDOW), "low": lo, "high": hi}
    if problem:
        step["file_voi_unusable"] = problem
    if hi <= lo:
        step["constant_image"] = True
        return np.zeros(arr.shape, dtype=np.float64), step
    return np.clip((arr.astype(np.float64) - lo) / (hi - lo), 0.0, 1.0), step


def _resize(unit: np.ndarray, size: tuple[int, int], keep_aspect: bool) -> tuple[np.ndarray, dict[str, Any]]:
    """Resize a 0..1 image (rows, cols[, 3]) to ``size``, zero-padding to keep the aspect ratio."""
    rows, cols = unit.shape[:2]
    out_r, out_c = size
    if keep_aspect:
        scale = min(out_r / rows, out_c / cols)
        new_r = min(out_r, max(1, round(rows * scale)))
        new_c = min(out_c, max(1, round(cols * scale)))
    else:
        new_r, new_c = out_r, out_c
    channels = [unit] if unit.ndim == 2 else [unit[..., c] for c in range(unit.shape[2])]
    resized = [
        np.asarray(
            Image.fromarray(np.ascontiguousarray(ch, dtype=np.float32)).resize((new_c, new_r), Image.Resampling.LANCZOS)
        )
        for ch in channels
    ]
    scaled = np.clip(resized[0] if unit.ndim == 2 else np.stack(resized, axis=-1), 0.0, 1.0)
    top = (out_r - new_r) // 2
    left = (out_c - new_c) // 2
    canvas = np.zeros((out_r, out_c) + unit.shape[2:], dtype=np.float32)
    canvas[top : top + new_r, left : left + new_c] = scaled
    step = {
        "step": "resize",
        "from": [rows, cols],
        "to": [new_r, new_c],
        "filter": "LANCZOS",
        "keep_aspect": keep_aspect,
        "pad": {
            "top": top,
            "bottom": out_r - new_r - top,
            "left": left,
            "right": out_c - new_c - left,
            "value": 0,
        },
    }
    return canvas, step


def _png(unit: np.ndarray, bit_depth: int) -> tuple[bytes, dict[str, Any]]:
    if unit.ndim == 3 and bit_depth == 16:
        bit_depth = 8  # Pillow writes RGB PNGs with 8 bits per sample only
        note: dict[str, Any] = {"rgb_written_as_8_bit": True}
    else:
        note = {}
    max_value = 2**bit_depth - 1
    data = np.rint(unit * max_value).astype(np.uint8 if bit_depth == 8 else np.uint16)
    image = Image.fromarray(data)
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=False, compress_level=1)  # lossless either way; level 1 is faster
    return buf.getvalue(), {
        "step": "encode",
        "format": "png",
        "mode": image.mode,
        "bit_depth": bit_depth,
        **note,
    }


def load_payload(payload: bytes, payload_format: str) -> np.ndarray:
    """Decode an ``images.payload`` back to an array (the inverse of the normalisers, for ML users).

    The reader package's decoder (:func:`medreco_reader.payloads.decode_payload`, one implementation): ``png``
    uint8/uint16 (rows, cols) or (rows, cols, 3); ``nifti`` the stored volume (slices, rows, cols), int16 HU for CT,
    float32 0..1 for MR; ``npy`` / ``npz`` (inline volumes of images schema 1.2 / 1.1) float32 (slices, rows, cols).

    Raises
    ------
    ValueError
        For an unknown ``payload_format`` or a payload that is not of that format.
    """
    return decode_payload(payload, payload_format)


def _result(payload: bytes, fmt: str, kind: str, steps: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {
        **fields,
        "kind": kind,
        "payload": payload,
        "payload_format": fmt,
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
        "recipe": _recipe(kind, steps),
    }


# ----------------------------------------------------------------------------------------------- 2D


def normalise_2d(ds: Dataset, cfg: NormalisationConfig) -> dict[str, Any]:
    """Normalise a 2D image (CR, DX, MG, US, XA, RF, other single images) to a PNG.

    Steps (each recorded in ``recipe``): decode and Modality LUT (:func:`etl.pixels.decode.decode_image`);
    for a multi-frame object (US cine, XA run) the middle frame ``n_frames // 2`` only; grayscale:
    the file's VOI LUT Sequence or first Window Center/Width (PS3.3 C.11.2), else a 0.5-99.5
    percentile window; MONOCHROME1 inverted once, after windowing (PS3.3 C.7.6.3.1.2); colour:
    RGB divided by its nominal maximum; resize (Lanczos) to ``cfg.image_size``, keeping the aspect
    ratio with zero padding when ``cfg.keep_aspect``; scale to 0..255 or 0..65535
    (``cfg.png_bit_depth``; RGB is always 8-bit); PNG ("L", "I;16" or "RGB").

    Parameters
    ----------
    ds : pydicom.dataset.Dataset
        A de-identified dataset with pixel data.
    cfg : schemas.config.NormalisationConfig

    Returns
    -------
    dict
        ``rows``, ``cols`` (output size, pixels), ``n_slices`` (1), ``kind`` ("2d"), ``payload``
        (PNG bytes), ``payload_format`` ("png"), ``payload_sha256`` (hex), ``spacing_mm`` (original
        [row, col] spacing in mm from PixelSpacing, else ImagerPixelSpacing, else None), ``view``
        (PA / AP / LATERAL, else ViewCodeSequence CodeMeaning, else ViewPosition, else None),
        ``recipe`` (canonical JSON).

    Raises
    ------
    NormalisationError
        Any reason from :func:`etl.pixels.decode.check_decodable`, ``decode_error`` and ``unsupported_mosaic``
        (a Siemens MOSAIC tile sheet, :func:`etl.pixels.mosaic.check_not_mosaic`).
    """
    check_not_mosaic(ds)
    frames = n_frames(ds)
    frame = frames // 2 if frames > 1 else None
    decoded = decode_image(ds, frame)
    steps = list(decoded.steps)
    arr = decoded.array
    if arr.ndim == (3 if decoded.photometric == "RGB" else 2) + 1:  # single-frame object given a frame axis
        arr = arr[0]
    if decoded.photometric == "RGB":
        lo, hi = decoded.value_range
        unit = np.clip((arr.astype(np.float64) - lo) / (hi - lo), 0.0, 1.0)
        steps.append({"step": "scale", "low": lo, "high": hi})
    else:
        unit, voi = _window_to_unit(arr, ds, frame)
        steps.append(voi)
        if decoded.photometric == "MONOCHROME1":
            unit = 1.0 - unit
            steps.append({"step": "invert", "reason": "MONOCHROME1"})
    resized, resize_step = _resize(unit, (int(cfg.image_size[0]), int(cfg.image_size[1])), cfg.keep_aspect)
    steps.append(resize_step)
    payload, encode_step = _png(resized, cfg.png_bit_depth)
    steps.append(encode_step)
    return _result(
        payload,
        "png",
        "2d",
        steps,
        rows=int(cfg.image_size[0]),
        cols=int(cfg.image_size[1]),
        n_slices=1,
        spacing_mm=_pixel_spacing(ds, frame if frame is not None else 0),
        view=_view(ds),
    )


# ----------------------------------------------------------------------------------------------- 3D


def _plane(orientation: np.ndarray) -> str:
    """AXIAL / CORONAL / SAGITTAL / OBLIQUE from ImageOrientationPatient (PS3.3 C.7.6.2.1.1)."""
    normal = cross3(orientation[:3], orientation[3:6])
    axis = int(np.argmax(np.abs(normal)))
    if abs(normal[axis]) < _PLANE_COS * np.linalg.norm(normal):
        return "OBLIQUE"
    return ("SAGITTAL", "CORONAL", "AXIAL")[axis]


def _slices(datasets: list[Dataset]) -> list[dict[str, Any]]:
    """One record per 2D slice: dataset, frame index, geometry and the checked transfer syntax (``ts``)."""
    out = []
    for i, ds in enumerate(datasets):
        check_not_mosaic(ds)  # a tile sheet of slices is no slice
        _, ts = check_decodable(ds)
        frames = n_frames(ds)
        number = element_value(ds, "InstanceNumber")
        common: dict[str, Any] = {
            "ds": ds,
            "index": i,
            "ts": ts,
            "instance": int(number) if number not in (None, "") else None,
            "rows": int(element_value(ds, "Rows")),
            "cols": int(element_value(ds, "Columns")),
            "modality": str(element_value(ds, "Modality") or "").upper(),
            "photometric": str(element_value(ds, "PhotometricInterpretation") or ""),
            "image_type": [str(v).upper() for v in (element_value(ds, "ImageType") or [])],
        }
        for f in range(frames):
            pos = _floats(frame_attribute(ds, "PlanePositionSequence", "ImagePositionPatient", f))
            ori = _floats(frame_attribute(ds, "PlaneOrientationSequence", "ImageOrientationPatient", f))
            out.append(
                {
                    **common,
                    "frame": f if frames > 1 else None,
                    "position": np.array(pos) if pos else None,
                    "orientation": np.array(ori) if ori else None,
                    "spacing": _pixel_spacing(ds, f),
                    "thickness": frame_attribute(ds, "PixelMeasuresSequence", "SliceThickness", f),
                    "image_type": list(common["image_type"]),
                }
            )
    return out


def _check_consistent(slices: list[dict[str, Any]]) -> str:
    """One modality (CT or MR), MONOCHROME slices; raises ``inconsistent_series`` / ``unsupported_modality``."""
    modality = slices[0]["modality"]
    if any(s["modality"] != modality for s in slices):
        raise NormalisationError("inconsistent_series", "slices of more than one modality")
    if modality not in _VOLUME_MODALITIES:
        raise NormalisationError("unsupported_modality", f"volumes are built for CT and MR, not {modality or 'none'}")
    if any(not s["photometric"].startswith("MONOCHROME") for s in slices):
        raise NormalisationError("inconsistent_series", "a volume slice is not MONOCHROME1/MONOCHROME2")
    oris = [s["orientation"] for s in slices]
    if any(o is not None and len(o) != 6 for o in oris):
        raise NormalisationError("inconsistent_series", "ImageOrientationPatient does not hold 6 values")
    return modality


def _check_stackable(slices: list[dict[str, Any]]) -> None:
    """After outlier exclusion: equal orientation (within DS rounding) and PixelSpacing."""
    oris = [s["orientation"] for s in slices]
    if oris[0] is not None and any(np.max(np.abs(o - oris[0])) > _ORIENTATION_TOL for o in oris):
        raise NormalisationError("inconsistent_series", "slices differ in ImageOrientationPatient")
    spacings = [s["spacing"] for s in slices]
    if any((sp is None) != (spacings[0] is None) for sp in spacings) or (
        spacings[0] is not None
        and any(max(abs(a - b) for a, b in zip(sp, spacings[0])) > _SPACING_TOL_MM for sp in spacings)
    ):
        raise NormalisationError("inconsistent_series", "slices differ in PixelSpacing")


def _has_positions(slices: list[dict[str, Any]]) -> bool:
    return slices[0]["orientation"] is not None and all(
        s["position"] is not None and len(s["position"]) == 3 for s in slices
    )


def _order_by_instance(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Order by InstanceNumber then frame when positions are missing."""
    if len(slices) == 1 or all(s["instance"] is not None for s in slices):
        ordered = sorted(slices, key=lambda s: (s["instance"] or 0, s["index"], s["frame"] or 0))
        keys = [(s["instance"], s["frame"]) for s in ordered]
        if len(set(keys)) != len(keys):
            raise NormalisationError("inconsistent_series", "slices share an InstanceNumber and have no position")
        return ordered
    raise NormalisationError(
        "inconsistent_series", "cannot order slices: neither ImagePositionPatient nor InstanceNumber on all"
    )


def _decode_stack(
    ordered: list[dict[str, Any]],
    steps: list[dict[str, Any]],
    volume: np.ndarray | None = None,
    clip: tuple[float, float] | None = None,
) -> np.ndarray:
    """Decode slices in order into one float32 (n, rows, cols) array (``volume`` when given, e.g. the array
    of an :class:`etl.pixels.npy_payload.NpyPayload`, else a new one); records decode / modality_lut.

    ``clip`` (low, high): each slice clipped as soon as it is decoded, while it is in cache (the values of
    clipping the whole stack afterwards; only where no step between needs the unclipped values)."""
    if volume is None:
        volume = np.empty((len(ordered), ordered[0]["rows"], ordered[0]["cols"]), dtype=np.float32)
    # every element is written below (a payload buffer starts uninitialised): one slice per row, each
    # decoded into its row or copied there whole
    if volume.shape != (len(ordered), ordered[0]["rows"], ordered[0]["cols"]):
        raise ValueError(f"stack of shape {volume.shape} for {len(ordered)} slices of the series' size")
    syntaxes: set[str] = set()
    modality_luts: list[dict[str, Any]] = []
    for k, s in enumerate(ordered):
        row = volume[k]
        decoded = decode_image(s["ds"], s["frame"], out=row, checked=s["ts"])  # checked in _slices
        if decoded.array is not row:
            if decoded.array.shape != row.shape:
                raise NormalisationError(
                    "inconsistent_series", "a slice decodes to another shape than its Rows x Columns"
                )
            row[...] = decoded.array
        if clip is not None:
            np.clip(row, clip[0], clip[1], out=row)
        for step in decoded.steps:
            if step["step"] == "decode":
                syntaxes.add(step["transfer_syntax"])
            elif step["step"] == "modality_lut":
                params = {key: v for key, v in step.items() if key != "step"}
                if params not in modality_luts:
                    modality_luts.append(params)
    steps.append({"step": "decode", "transfer_syntax": sorted(syntaxes), "n_slices": len(ordered)})
    steps.append({"step": "modality_lut", "distinct": modality_luts})
    return volume


class _StreamedStack:
    """The slices of a series decoded one at a time, in order, as :func:`etl.pixels.separable.resample_separable`
    reads them (``stack[j]``, j never decreasing by more than one): a (n, rows, cols) float32 volume of which
    only two slices are in memory. Every slice is decoded, also those the resampling steps over
    (:meth:`finish` decodes the rest), so a bad slice fails the series as in :func:`_decode_stack`.
    """

    ndim = 3
    dtype = np.dtype(np.float32)

    def __init__(self, ordered: list[dict[str, Any]]) -> None:
        self.ordered = ordered
        self.shape = (len(ordered), ordered[0]["rows"], ordered[0]["cols"])
        self._ring = np.empty((2,) + self.shape[1:], dtype=np.float32)
        self._next = 0  # the next slice to decode
        self._steps: list[dict[str, Any]] = []

    def __getitem__(self, j: int) -> np.ndarray:
        j = int(j)
        if not self._next - 2 <= j < self.shape[0]:
            raise IndexError("a streamed stack is read in slice order")
        while self._next <= j:
            slot = self._next % 2
            _decode_stack([self.ordered[self._next]], self._steps, self._ring[slot : slot + 1], None)
            self._next += 1
        return self._ring[j % 2]

    def finish(self) -> list[dict[str, Any]]:
        """Decode the slices not read yet; returns the ``decode`` and ``modality_lut`` steps of all slices."""
        if self._next < self.shape[0]:
            self[self.shape[0] - 1]
        syntaxes = sorted({t for st in self._steps if st["step"] == "decode" for t in st["transfer_syntax"]})
        luts: list[dict[str, Any]] = []
        for st in self._steps:
            for params in st.get("distinct", []) if st["step"] == "modality_lut" else []:
                if params not in luts:
                    luts.append(params)
        return [
            {"step": "decode", "transfer_syntax": syntaxes, "n_slices": self.shape[0]},
            {"step": "modality_lut", "distinct": luts},
        ]


def _intensity(
    volume: np.ndarray, modality: str, cfg: NormalisationConfig, clipped: bool = False
) -> tuple[np.ndarray, dict[str, Any]]:
    """CT: clip to ``cfg.ct_hu_window`` (HU; ``clipped``: already done slice by slice, see
    :func:`_decode_stack`). MR: 1st-99th percentile of non-zero voxels -> 0..1."""
    if modality == "CT":
        lo, hi = (float(v) for v in cfg.ct_hu_window)
        if not clipped:
            np.clip(volume, lo, hi, out=volume)
        return volume, {"step": "clip", "unit": "HU", "low": lo, "high": hi}
    nonzero = volume[volume != 0]
    lo, hi = (float(v) for v in np.percentile(nonzero, MR_PERCENTILES)) if nonzero.size else (0.0, 0.0)
    if hi > lo:
        np.clip(volume, lo, hi, out=volume)
        volume -= lo
        volume /= hi - lo
    else:
        volume[:] = 0.0
    step = {"step": "clip_scale", "percentile_nonzero": list(MR_PERCENTILES), "low": lo, "high": hi, "to": [0.0, 1.0]}
    return volume, step


def normalise_volume(
    datasets: list[Dataset],
    cfg: NormalisationConfig,
    target_spacing_mm: tuple[float, float, float] | list[float] | None = None,
) -> dict[str, Any]:
    """Normalise a CT or MR series to a float32 volume, stored as one ``.npy`` payload.

    Steps (each recorded in ``recipe``): every slice checked before any decoding (pixel data,
    transfer syntax, length; one modality, CT or MR); localizers / scouts (ImageType LOCALIZER)
    and slices whose orientation or Rows/Columns differ from a strict majority excluded
    (:func:`etl.pixels.volumes.exclude_outliers`; listed in ``excluded``); equal PixelSpacing checked;
    size checked against ``cfg.volume_max_voxels``; slices sorted by position along the slice
    normal n = row x column direction cosines (ImagePositionPatient . n, PS3.3 C.7.6.2.1.1), else
    by InstanceNumber; each slice decoded with its own Modality LUT (float, per frame for enhanced
    objects); slices at one position: identical pixels -> all but one dropped with a
    ``duplicate_slice_position`` warning, different pixels -> error; missing slices (a step over
    1.5 x the median), non-uniform steps and gantry tilt detected and recorded, the stack then
    interpolated linearly onto a regular orthogonal grid at the median step
    (:func:`etl.pixels.volumes.regularise`); optionally resampled (linear) to ``target_spacing_mm``
    (:func:`etl.pixels.volumes.resample`: three separable passes on axis-aligned grids, ``sitk.Resample``
    on oblique ones; recorded in the recipe's ``by``); CT clipped to ``cfg.ct_hu_window`` (HU, default [-1000, 1000]);
    MR clipped to the 1st-99th percentile of the non-zero voxels and scaled to 0..1.

    Parameters
    ----------
    datasets : list of pydicom.dataset.Dataset
        The instances of one series, in any order (single-frame slices and/or enhanced
        multi-frame objects). One slice is accepted (its slice spacing is then SliceThickness).
    cfg : schemas.config.NormalisationConfig
    target_spacing_mm : (float, float, float) or None
        [row, col, slice] output spacing in mm (e.g. :data:`DEFAULT_CT_SPACING_MM`); None keeps the
        native spacing. Ignored (and recorded so) when the geometry is unknown (no positions or
        no PixelSpacing) or the series has one slice.

    Returns
    -------
    dict
        ``rows``, ``cols`` (pixels), ``n_slices``, ``shape`` ([slices, rows, cols]), ``dtype``
        ("float32"), ``kind`` ("3d"), ``payload`` (``.npy`` of the float32 (slices, rows, cols)
        volume, :mod:`etl.pixels.npy_payload`; the geometry is in the fields below), ``payload_format`` ("npy"),
        ``payload_sha256``, ``spacing_mm`` ([row, col, slice] mm; slice = median step between
        positions, else SliceThickness; None without PixelSpacing; slice entry None when
        unknown), ``origin_mm`` (LPS position of voxel (0, 0, 0), mm, or None), ``direction``
        (9 row-major direction cosines, columns row dir / column dir / normal, or None),
        ``orientation`` and ``view`` (AXIAL / CORONAL / SAGITTAL / OBLIQUE, or None),
        ``excluded`` (list of ``{"index", "frame", "why"}`` for input datasets left out) and
        ``recipe``.

    Raises
    ------
    NormalisationError
        ``inconsistent_series`` (slices do not stack and no majority, several images at every
        position, or cannot be ordered), ``duplicate_slice_position`` (different pixels at one
        position), ``volume_too_large``, ``unsupported_modality`` (not CT/MR), ``unsupported_mosaic``
        (a Siemens MOSAIC tile sheet), ``no_pixel_data``
        (empty list) and any reason of :func:`etl.pixels.decode.check_decodable` for a bad slice.
    """
    if not datasets:
        raise NormalisationError("no_pixel_data", "empty series: no datasets given")
    slices = _slices(datasets)
    modality = _check_consistent(slices)
    slices, excluded = exclude_outliers(slices)
    _check_stackable(slices)
    n, rows, cols = len(slices), slices[0]["rows"], slices[0]["cols"]
    if n * rows * cols > cfg.volume_max_voxels:
        raise NormalisationError(
            "volume_too_large", f"{n} x {rows} x {cols} voxels exceed the limit of {cfg.volume_max_voxels}"
        )
    steps: list[dict[str, Any]] = []
    if excluded:
        steps.append({"step": "exclude", "slices": excluded})
    in_plane = slices[0]["spacing"]
    origin: list[float] | None = None
    direction: list[float] | None = None
    geo = slice_geometry(slices) if _has_positions(slices) else None
    ordered = [slices[i] for i in geo["order"]] if geo is not None else _order_by_instance(slices)
    duplicates = geo is not None and any(len(g) > 1 for g in geo["groups"])
    # one slice per position: the geometry is known before decoding (an irregular series configured
    # for quarantine fails before its pixels are decoded)
    info: dict[str, Any] | None = _assess(ordered, geo, cfg) if geo is not None and not duplicates and n > 1 else None
    regularised = info is not None and _irregular(info) and in_plane is not None
    resampled = target_spacing_mm is not None and geo is not None and in_plane is not None and n > 1
    # the volume is decoded straight into the payload's memory, and CT clipped slice by slice as it is
    # decoded, unless a later step needs the unclipped values or gives the volume another shape
    in_place = not (duplicates or regularised or resampled)
    # an axis-aligned series resampled as it is (no duplicates to drop, nothing to regularise) is decoded slice by
    # slice as the separable resampling reads it: the native stack never exists, only the resampled payload
    streamed = (
        resampled
        and geo is not None
        and not duplicates
        and not regularised
        and rows > 1
        and cols > 1
        and is_axis_aligned(geo["matrix"].reshape(-1))
    )
    payload_buffer = NpyPayload((n, rows, cols)) if in_place else None
    stack = payload_buffer.array if payload_buffer is not None else None
    clip = (float(cfg.ct_hu_window[0]), float(cfg.ct_hu_window[1])) if in_place and modality == "CT" else None
    if geo is not None:
        steps.append({"step": "sort", "by": "ImagePositionPatient.normal"})
        decode_at = len(steps)
        # a stack decoded as the resampling reads it, or the decoded array
        volume: Any = _StreamedStack(ordered) if streamed else _decode_stack(ordered, steps, stack, clip)
        if duplicates:
            rank = {i: k for k, i in enumerate(geo["order"])}
            keep, dup_warnings = dedupe(
                [[rank[i] for i in g] for g in geo["groups"]], [volume[k] for k in range(len(ordered))]
            )
            if dup_warnings:
                steps.append({"step": "dedupe", "warnings": dup_warnings, "kept": len(keep)})
                volume = volume[keep]
            ordered = [ordered[k] for k in keep]
            info = _assess(ordered, geo, cfg) if len(ordered) > 1 else None
        origin = [float(v) for v in ordered[0]["position"]]
        direction = [float(v) for v in geo["matrix"].reshape(-1)]
        if info is not None:
            slice_mm: float | None = info["step_mm"]
            steps.append(
                {
                    "step": "geometry",
                    "step_mm": info["step_mm"],
                    "uniform": info["uniform"],
                    "missing_slices": info["missing"],
                    "gantry_tilt_deg": round(info["tilt_deg"], 6),
                }
            )
            if _irregular(info) and in_plane is not None:
                assert clip is None, "regularisation must see unclipped values"
                volume = regularise(volume, info["along"], info["offsets"], tuple(in_plane), info["step_mm"])
                steps.append(
                    {
                        "step": "regularise",
                        "interpolation": "linear",
                        "step_mm": info["step_mm"],
                        "n_slices": int(volume.shape[0]),
                    }
                )
            slice_from = "positions"
        else:
            slice_mm, slice_from = _thickness(ordered[0]), "SliceThickness"
    else:
        steps.append({"step": "sort", "by": "InstanceNumber"})
        volume = _decode_stack(ordered, steps, stack, clip)
        slice_mm, slice_from = _thickness(ordered[0]), "SliceThickness"
        if slices[0]["orientation"] is not None:
            direction = [float(v) for v in direction_matrix(slices[0]["orientation"]).reshape(-1)]
    spacing: Any = None if in_plane is None else [float(in_plane[0]), float(in_plane[1]), slice_mm]
    steps.append({"step": "spacing", "slice_from": slice_from})

    if target_spacing_mm is not None:
        target = [float(v) for v in target_spacing_mm]
        if len(target) != 3 or min(target) <= 0:
            raise ValueError("target_spacing_mm must hold 3 positive spacings [row, col, slice] in mm")
        if spacing is None or slice_mm is None or origin is None or direction is None or volume.shape[0] < 2:
            steps.append({"step": "resample", "skipped": "geometry unknown or one slice", "target_mm": target})
        else:
            assert clip is None, "resampling must see unclipped values"
            default = float(cfg.ct_hu_window[0]) if modality == "CT" else 0.0
            geometry = Geometry(spacing, origin, direction)
            # the separable path writes the resampled volume straight into the payload's memory
            if is_axis_aligned(direction):
                payload_buffer = NpyPayload(resampled_size(volume.shape, spacing, target))
            out = payload_buffer.array if payload_buffer is not None else None
            streamed_stack = volume if isinstance(volume, _StreamedStack) else None
            ct_window = (float(cfg.ct_hu_window[0]), float(cfg.ct_hu_window[1])) if modality == "CT" else None
            volume, geometry, method = resample(
                volume, geometry, (target[0], target[1], target[2]), default, out=out, clip=ct_window
            )
            if ct_window is not None and method == "separable":
                clip = ct_window  # clipped slice by slice as it was resampled
            if streamed_stack is not None:
                steps[decode_at:decode_at] = streamed_stack.finish()
            spacing = geometry.spacing_mm
            steps.append(
                {
                    "step": "resample",
                    "by": method,
                    "interpolation": "linear",
                    "target_mm": target,
                    "shape": list(volume.shape),
                }
            )

    volume, intensity_step = _intensity(volume, modality, cfg, clipped=clip is not None)
    steps.append(intensity_step)

    volume = np.ascontiguousarray(volume, dtype=np.float32)
    payload = payload_buffer.finish(volume) if payload_buffer is not None else encode_npy(volume)
    steps.append({"step": "encode", "format": "npy", "dtype": "float32", "axes": "slice,row,col"})
    orientation = _plane(slices[0]["orientation"]) if slices[0]["orientation"] is not None else None
    out_slices, out_rows, out_cols = (int(v) for v in volume.shape)
    return _result(
        payload,
        "npy",
        "3d",
        steps,
        rows=out_rows,
        cols=out_cols,
        n_slices=out_slices,
        shape=[out_slices, out_rows, out_cols],
        dtype=str(volume.dtype),
        spacing_mm=spacing,
        origin_mm=origin,
        direction=direction,
        orientation=orientation,
        view=orientation,
        excluded=excluded,
    )


def _assess(ordered: list[dict[str, Any]], geo: dict[str, Any], cfg: NormalisationConfig) -> dict[str, Any]:
    """:func:`etl.pixels.volumes.assess` of slices in order (one per position), with ``along`` (their distance along
    the normal, mm) added; raises ``irregular_slice_geometry`` when the series is irregular and
    ``cfg.irregular_slices`` is ``"quarantine"``."""
    along = np.array([float(np.dot(s["position"], geo["normal"])) for s in ordered])
    info = {**assess(np.stack([s["position"] for s in ordered]), along, geo["matrix"]), "along": along}
    if _irregular(info) and cfg.irregular_slices == "quarantine":
        raise NormalisationError(
            "irregular_slice_geometry",
            f"missing slices or non-uniform spacing or gantry tilt ({info['missing']} missing, "
            f"tilt {info['tilt_deg']:.2f} deg) and the configuration quarantines such series",
        )
    return info


def _irregular(info: dict[str, Any]) -> bool:
    return not info["uniform"] or info["tilt_deg"] > 0


def _thickness(s: dict[str, Any]) -> float | None:
    thickness = _floats([s["thickness"]]) if s["thickness"] is not None else None
    return thickness[0] if thickness and thickness[0] > 0 else None
