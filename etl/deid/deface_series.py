"""Defacing one de-identified DICOM series (config ``deid.deface``): the series step around :mod:`etl.deid.deface`.

:func:`deface_series` takes the de-identified Part 10 files of one series (all in one shard), decides whether the
series is a head volume, stacks its slices into a volume in patient (LPS) space from ImagePositionPatient /
ImageOrientationPatient / PixelSpacing (single-frame files, or the per-frame functional groups of an enhanced
multi-frame file), removes the face (:func:`etl.deid.deface.face_mask`), sets the face voxels to the background in
the stored values, verifies, and only then marks each file: RecognizableVisualFeatures (0028,0302) ``NO`` and
code 113102 (Clean Recognizable Visual Features Option, PS3.16 CID 7050) added to DeidentificationMethodCodeSequence.

Outcomes (``SeriesOutcome.status``):

- ``defaced``: new payloads for every file of the volume; figures in ``SeriesOutcome.figures``.
- ``not_head``: not CT/MR, another body part, or unknown anatomy whose tissue is wider than a head.
- ``not_a_volume``: a head series too thin to render a face from (fewer than 10 slices or under 60 mm in an axis:
  localisers, single slices, a 4-slice EPI slab); left as it is, not marked.
- ``off``: config ``deid.deface: off`` (the release card says faces are kept); not marked.
- ``quarantined``: ``head_volume_withheld`` (``deid.deface: quarantine``) or ``defacing_failed`` (the detail names
  the check: ``no_geometry``, ``mixed_geometry``, ``undecodable``, a registration check, ``face_tissue_after``,
  ``face_detected_after``); every file of the series is withheld.
"""

from __future__ import annotations

import io
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pydicom
import SimpleITK as sitk
from pydicom.dataset import Dataset

from etl.deid.deface import (
    MIN_SLICES,
    DefaceError,
    detect_faces,
    face_mask,
    front_render,
    head_decision,
    is_volume,
    looks_like_body,
    tissue_threshold,
)
from etl.deid.policy import CODE_CLEAN_RVF


@dataclass
class SeriesOutcome:
    """What :func:`deface_series` did with one series.

    Attributes
    ----------
    status : str
        ``defaced``, ``not_head``, ``not_a_volume``, ``off`` or ``quarantined`` (module docstring).
    reason, detail : str or None
        the quarantine reason code and a message naming the check (never a value of the file).
    payloads : dict of str to bytes
        the new Part 10 bytes of each defaced file, by the name it was given under.
    figures : dict
        PHI-free figures for the audit: the registration checks, face region size, voxels changed, detector hits
        before and after, CPU seconds.
    preview : etl.deid.preview.Preview or None
        for ``defacing_failed`` after the volume was stacked: a sagittal and an axial view of the volume as it
        stood when the check failed (the face set to air when it got that far), the face region's box drawn
        (restricted: for the curator's review only).
    """

    status: str
    reason: str | None = None
    detail: str | None = None
    payloads: dict[str, bytes] = field(default_factory=dict)
    figures: dict = field(default_factory=dict)
    preview: Any = None


def _read(data: bytes) -> Dataset:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pydicom.dcmread(io.BytesIO(data), force=True)


def _floats(value, n: int) -> np.ndarray | None:
    try:
        out = np.array([float(v) for v in value], dtype=float)
    except (TypeError, ValueError):
        return None
    return out if out.shape == (n,) and np.isfinite(out).all() else None


@dataclass
class _Slice:
    name: str
    frame: int | None  # frame index of a multi-frame file, None for a single-frame file
    position: np.ndarray
    orientation: np.ndarray
    spacing: np.ndarray
    shape: tuple[int, int]
    slope: float = 1.0
    intercept: float = 0.0


def _frame_geometry(ds: Dataset, name: str) -> list[_Slice] | None:
    """The slices of one file with their geometry; None when a slice has no usable position/orientation/spacing."""
    shape = (int(ds.get("Rows", 0) or 0), int(ds.get("Columns", 0) or 0))
    slope = float(ds.get("RescaleSlope", 1) or 1)
    intercept = float(ds.get("RescaleIntercept", 0) or 0)
    frames = int(ds.get("NumberOfFrames", 1) or 1)
    if "PerFrameFunctionalGroupsSequence" not in ds:
        if frames != 1:
            return None
        ipp, iop = _floats(ds.get("ImagePositionPatient"), 3), _floats(ds.get("ImageOrientationPatient"), 6)
        ps = _floats(ds.get("PixelSpacing"), 2)
        if ipp is None or iop is None or ps is None:
            return None
        return [_Slice(name, None, ipp, iop, ps, shape, slope, intercept)]
    shared = ds.get("SharedFunctionalGroupsSequence", [Dataset()])[0]
    out = []
    for i, item in enumerate(ds.PerFrameFunctionalGroupsSequence):

        def attr(seq: str, kw: str, item=item):
            for group in (item, shared):
                if seq in group and len(group[seq].value) and kw in group[seq].value[0]:
                    return group[seq].value[0].get(kw)
            return None

        ipp = _floats(attr("PlanePositionSequence", "ImagePositionPatient"), 3)
        iop = _floats(attr("PlaneOrientationSequence", "ImageOrientationPatient"), 6)
        ps = _floats(attr("PixelMeasuresSequence", "PixelSpacing"), 2)
        if ipp is None or iop is None or ps is None:
            return None
        s = float(attr("PixelValueTransformationSequence", "RescaleSlope") or slope)
        c = float(attr("PixelValueTransformationSequence", "RescaleIntercept") or intercept)
        out.append(_Slice(name, i, ipp, iop, ps, shape, s, c))
    return out


def _stack(slices: list[_Slice]) -> tuple[list[_Slice], np.ndarray, np.ndarray, np.ndarray] | None:
    """The largest set of parallel, same-size slices sorted along their normal, with (origin, spacing, direction).

    Returns None when fewer than two slices or their spacing along the normal is not regular (within 10%)."""
    groups: dict[tuple, list[_Slice]] = {}
    for s in slices:
        groups.setdefault((s.shape, tuple(np.round(s.orientation, 3)), tuple(np.round(s.spacing, 4))), []).append(s)
    best = max(groups.values(), key=len)
    if len(best) < 2:
        return None
    row, col = best[0].orientation[:3], best[0].orientation[3:]
    normal = np.cross(row, col)
    best.sort(key=lambda s: float(s.position @ normal))
    steps = np.diff([float(s.position @ normal) for s in best])
    if steps.min() <= 0 or (steps.max() - steps.min()) > 0.1 * np.median(steps):
        return None
    spacing = np.array([best[0].spacing[1], best[0].spacing[0], float(np.median(steps))])  # x (columns), y, z
    direction = np.column_stack([row, col, normal])
    return best, best[0].position, spacing, direction


@dataclass
class _Volume:
    slices: list[_Slice]
    stored: np.ndarray  # (z, rows, cols) stored values
    image: sitk.Image  # LPS geometry; the stored values when every slice has the same rescale, else rescaled float32
    rescale: tuple[float, float]  # from image values to rescaled values (HU for CT)

    @property
    def slope(self) -> np.ndarray:
        return np.array([s.slope or 1.0 for s in self.slices], float)[:, None, None]

    @property
    def intercept(self) -> np.ndarray:
        return np.array([s.intercept for s in self.slices], float)[:, None, None]

    def to_stored(self, value: float) -> np.ndarray:
        """A rescaled value in each slice's stored units, shape (slices, 1, 1)."""
        return (value - self.intercept) / self.slope

    def image_of(self, stored: np.ndarray) -> sitk.Image:
        """``stored`` as an image like :attr:`image` (same units and geometry)."""
        same = (self.rescale != (1.0, 0.0)) or bool((self.slope == 1).all() and (self.intercept == 0).all())
        out = sitk.GetImageFromArray(stored if same else (stored * self.slope + self.intercept).astype(np.float32))
        out.CopyInformation(self.image)
        return out


def _volume(datasets: dict[str, Dataset]) -> _Volume:
    """Stack the series' slices (raises DefaceError ``no_geometry``/``mixed_geometry``/``undecodable``)."""
    slices: list[_Slice] = []
    for name, ds in datasets.items():
        got = _frame_geometry(ds, name)
        if got is None:
            raise DefaceError(
                "defacing_failed",
                "no_geometry: a slice lacks ImagePositionPatient, ImageOrientationPatient or PixelSpacing",
            )
        slices += got
    stacked = _stack(slices)
    if stacked is None:
        raise DefaceError("defacing_failed", "mixed_geometry: the slices are not a regular stack")
    order, origin, spacing, direction = stacked
    if len(slices) - len(order) >= MIN_SLICES:  # a second stack that could show a face would be left as it was
        raise DefaceError("defacing_failed", "mixed_geometry: the series holds more than one stack of slices")
    stored: np.ndarray | None = None
    try:
        arrays: dict[str, np.ndarray] = {}
        for k, s in enumerate(order):
            if s.name not in arrays:
                arrays = {s.name: datasets[s.name].pixel_array}  # one file decoded at a time
            arr = arrays[s.name] if s.frame is None else arrays[s.name][s.frame]
            if stored is None:
                stored = np.empty((len(order), *arr.shape), arr.dtype)
            stored[k] = arr
    except Exception as err:  # noqa: BLE001  a decoder failure or a slice of another shape: fail closed
        raise DefaceError("defacing_failed", f"undecodable: {type(err).__name__} while decoding") from None
    if stored is None or stored.ndim != 3:
        raise DefaceError("defacing_failed", "mixed_geometry: colour or multi-sample pixels")
    rescales = {(s.slope or 1.0, s.intercept) for s in order}
    if len(rescales) == 1 and next(iter(rescales))[0] > 0:
        image, rescale = sitk.GetImageFromArray(stored), next(iter(rescales))
    else:  # per-slice rescale (rare): one float copy in rescaled units
        slope = np.array([s.slope or 1.0 for s in order], np.float32)[:, None, None]
        intercept = np.array([s.intercept for s in order], np.float32)[:, None, None]
        image, rescale = sitk.GetImageFromArray(stored.astype(np.float32) * slope + intercept), (1.0, 0.0)
    image.SetOrigin(origin.tolist())
    image.SetSpacing(spacing.tolist())
    image.SetDirection(direction.ravel().tolist())
    return _Volume(order, stored, image, (float(rescale[0]), float(rescale[1])))


def _background(vol: _Volume, modality: str) -> np.ndarray:
    """Per-slice stored value of air, shape (slices, 1, 1): CT -1000 HU (or the lowest value when that is
    higher), MR the lowest value."""
    lowest = float((vol.stored.min(axis=(1, 2))[:, None, None] * vol.slope + vol.intercept).min())
    target = max(lowest, -1000.0) if modality == "CT" else lowest
    value = np.round(vol.to_stored(target))
    if vol.stored.dtype.kind in "iu":
        info = np.iinfo(vol.stored.dtype)
        value = np.clip(value, info.min, info.max)
    return value.astype(vol.stored.dtype)


def add_method_code(ds: Dataset, code: tuple[str, str]) -> None:
    """Append a CID 7050 code to DeidentificationMethodCodeSequence (0012,0064) and its value to
    DeidentificationMethod (0012,0063) (LO, cut at 64 characters); nothing when the code is already there."""
    seq = ds.get("DeidentificationMethodCodeSequence") or []
    if any(str(item.get("CodeValue", "")) == code[0] for item in seq):
        return
    item = Dataset()
    item.CodeValue, item.CodingSchemeDesignator, item.CodeMeaning = code[0], "DCM", code[1]
    ds.DeidentificationMethodCodeSequence = [*seq, item]
    ds.DeidentificationMethod = (str(ds.get("DeidentificationMethod", "") or "") + " " + code[0]).strip()[:64]


def _mark(ds: Dataset) -> bytes:
    ds.RecognizableVisualFeatures = "NO"
    add_method_code(ds, CODE_CLEAN_RVF)
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    return buf.getvalue()


def deface_series(
    payloads: dict[str, bytes], body_part: str | None, mode: str = "on", detector: bool = True
) -> SeriesOutcome:
    """Deface one de-identified series.

    Parameters
    ----------
    payloads : dict of str to bytes
        the series' de-identified Part 10 files by name (e.g. their storage path).
    body_part : str or None
        BodyPartExamined of the source, or the code inferred from its descriptors before they were cleaned.
    mode : str
        config ``deid.deface``: ``on``, ``quarantine`` or ``off``.
    detector : bool
        run the face detector on front renders before and after (an audit figure, and a gate: a face found after
        defacing quarantines the series).

    Returns
    -------
    SeriesOutcome
        never raises for a bad series; the module docstring lists the statuses and reasons.
    """
    t0 = time.process_time()
    datasets = {name: _read(data) for name, data in payloads.items()}
    modality = str(next(iter(datasets.values())).get("Modality", "") or "").strip().upper()
    decision = head_decision(modality, body_part)
    if decision == "other":
        return SeriesOutcome("not_head")
    frames = sum(int(ds.get("NumberOfFrames", 1) or 1) for ds in datasets.values())
    if frames < MIN_SLICES:  # single images, localisers, a few slices: no face surface to render
        return SeriesOutcome("not_a_volume", figures={"slices": frames})
    try:
        vol = _volume(datasets)
    except DefaceError as err:
        if decision == "unknown":  # unknown anatomy without a usable volume: nothing to render a face from
            return SeriesOutcome("not_a_volume", figures={"why": err.detail.split(":")[0]})
        return _quarantined(mode, err)
    if not is_volume(vol.image):
        return SeriesOutcome("not_a_volume", figures={"slices": len(vol.slices)})
    if decision == "unknown" and looks_like_body(vol.image, modality, vol.rescale):
        return SeriesOutcome("not_head", figures={"why": "tissue wider than a head"})
    if mode == "off":
        return SeriesOutcome("off")
    if mode == "quarantine":
        return SeriesOutcome(
            "quarantined", "head_volume_withheld", "config deid.deface is quarantine: head volumes are withheld"
        )
    figures: dict = {"anatomy": decision, "slices": len(vol.slices)}
    region = None
    try:
        region, report = face_mask(vol.image, modality, vol.rescale)
        figures.update(report.as_dict())
        sample = vol.stored[::2, ::4, ::4] * vol.slope[::2] + vol.intercept[::2]
        thr = tissue_threshold(sample, modality)  # rescaled units
        box = vol.stored[region.box]  # a view: the face region is changed in place
        thr_box = vol.to_stored(thr)[region.box[0]]
        bg_box = np.broadcast_to(_background(vol, modality)[region.box[0]], box.shape)
        inner = region.inner
        before = float((box > thr_box)[inner].mean()) if inner.any() else 0.0
        faces_before = None
        if detector:
            faces_before = detect_faces(front_render(vol.image, _image_threshold(vol, thr)))
        changed = int((box[inner] != bg_box[inner]).sum())
        box[inner] = bg_box[inner]
        after = float((box > thr_box)[inner].mean()) if inner.any() else 0.0
        figures.update(face_tissue_before=round(before, 4), face_tissue_after=round(after, 4), voxels_changed=changed)
        if after > 0:
            raise DefaceError(
                "defacing_failed", f"face_tissue_after: {after:.4f} of the face region above the tissue threshold"
            )
        if detector:
            figures["faces_before"] = faces_before
            figures["faces_after"] = detect_faces(front_render(vol.image_of(vol.stored), _image_threshold(vol, thr)))
            if figures["faces_after"]:
                raise DefaceError(
                    "defacing_failed",
                    "face_detected_after: the frontal-face detector finds a face on the defaced render",
                )
        stored = vol.stored
        out = _write_back(datasets, vol, stored)
    except DefaceError as err:
        figures.update(err.figures)
        figures["cpu_s"] = round(time.process_time() - t0, 3)
        return SeriesOutcome(
            "quarantined",
            err.reason,
            err.detail,
            figures=figures,
            preview=_preview(vol, None if region is None else region.box),
        )
    figures["cpu_s"] = round(time.process_time() - t0, 3)
    return SeriesOutcome("defaced", payloads=out, figures=figures)


def _preview(vol: _Volume, box: tuple[slice, slice, slice] | None):
    """:func:`etl.deid.preview.volume_views` of the volume (stored values, as they stand) with the face box; None
    when the views cannot be made (a preview never turns a quarantine into a failed task)."""
    from etl.deid.preview import volume_views

    try:
        return volume_views(vol.stored, np.array(vol.image.GetDirection()).reshape(3, 3), vol.image.GetSpacing(), box)
    except Exception:  # noqa: BLE001
        return None


def _image_threshold(vol: _Volume, thr: float) -> float:
    """A rescaled threshold in the units of ``vol.image``."""
    slope, intercept = vol.rescale
    return (thr - intercept) / slope


def _quarantined(mode: str, err: DefaceError) -> SeriesOutcome:
    if mode == "off":
        return SeriesOutcome("off")
    if mode == "quarantine":
        return SeriesOutcome("quarantined", "head_volume_withheld", "config deid.deface is quarantine")
    return SeriesOutcome("quarantined", err.reason, err.detail)


def _write_back(datasets: dict[str, Dataset], vol: _Volume, stored: np.ndarray) -> dict[str, bytes]:
    """Store the defaced values in every file of the volume (uncompressed) and mark it; returns the new bytes."""
    from etl.deid.burned_in_text import _write_pixels

    by_file: dict[str, list[tuple[int | None, int]]] = {}
    for k, s in enumerate(vol.slices):
        by_file.setdefault(s.name, []).append((s.frame, k))
    out = {}
    try:
        for name, ds in datasets.items():
            if name not in by_file:
                continue  # a slice outside the volume (localiser): kept as it is, not marked
            arr = ds.pixel_array.copy()
            for frame, k in by_file[name]:
                if frame is None:
                    arr = stored[k].astype(arr.dtype)
                else:
                    arr[frame] = stored[k].astype(arr.dtype)
            _write_pixels(ds, arr, str(ds.get("PhotometricInterpretation", "MONOCHROME2")))
            out[name] = _mark(ds)
    except Exception as err:  # noqa: BLE001  an encoder failure: fail closed
        raise DefaceError("defacing_failed", f"write_error: {type(err).__name__} while storing pixels") from None
    return out


def audit_counts(outcomes: list[SeriesOutcome]) -> Counter:
    """Dashboard counts of a shard's series outcomes: ``deface:<status>``, ``deface:quarantined:<reason>``,
    ``deface:faces_before`` / ``deface:faces_after`` (detector hits summed)."""
    c: Counter = Counter()
    for o in outcomes:
        c[f"deface:{o.status}"] += 1
        if o.reason:
            c[f"deface:quarantined:{o.reason}"] += 1
        for k in ("faces_before", "faces_after"):
            if k in o.figures:
                c[f"deface:{k}"] += int(o.figures[k])
    return c


@dataclass
class ShardDefacing:
    """What defacing did to the head series of one shard (or one ``medreco deid`` folder).

    Attributes
    ----------
    quarantined : dict of str to (str, str)
        sop_key -> (reason, detail) of every file of a series that was quarantined (its file must be removed).
    previews : dict of str to etl.deid.preview.Preview
        sop_key -> the preview of its quarantined series (:attr:`SeriesOutcome.preview`; one object per series).
    transfer_syntax : dict of str to str
        sop_key -> TransferSyntaxUID of each rewritten file (defaced pixels are stored uncompressed).
    series : list of dict
        one PHI-free audit record per head-candidate series: ``series_key``, ``status``, ``reason``, ``detail``,
        ``files`` and the figures of :class:`SeriesOutcome`.
    counts : Counter
        :func:`audit_counts` of the outcomes.
    """

    quarantined: dict[str, tuple[str, str]] = field(default_factory=dict)
    previews: dict[str, Any] = field(default_factory=dict)
    transfer_syntax: dict[str, str] = field(default_factory=dict)
    series: list[dict] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)


def deface_written(instances: list[dict], read, write, mode: str = "on", detector: bool = True) -> ShardDefacing:
    """Deface the head series among files already de-identified and written, one series in memory at a time.

    Parameters
    ----------
    instances : list of dict
        rows with ``sop_key``, ``series_key``, ``modality``, ``body_part`` and ``dicom_path`` (the ``instances``
        columns); series whose modality is not CT/MR or whose body part is another one are not read.
    read, write : callables
        ``read(path) -> bytes`` and ``write(path, bytes)`` on the written files.
    mode : str
        config ``deid.deface``.
    detector : bool
        passed to :func:`deface_series`.

    Returns
    -------
    ShardDefacing
        the caller removes the files of ``quarantined`` and their rows, and records their reason.
    """
    groups: dict[str, list[dict]] = {}
    for row in instances:
        if head_decision(str(row.get("modality") or ""), row.get("body_part")) != "other":
            groups.setdefault(row["series_key"], []).append(row)
    done = ShardDefacing()
    outcomes = []
    for series_key, rows in sorted(groups.items()):
        by_path = {r["dicom_path"]: r["sop_key"] for r in rows}
        try:
            outcome = deface_series({p: read(p) for p in by_path}, rows[0].get("body_part"), mode, detector)
        except Exception as err:  # noqa: BLE001  anything unforeseen in one series quarantines that series only
            outcome = SeriesOutcome("quarantined", "defacing_failed", f"unexpected: {type(err).__name__}")
        outcomes.append(outcome)
        done.series.append(
            {
                "series_key": series_key,
                "status": outcome.status,
                "reason": outcome.reason,
                "detail": outcome.detail,
                "files": len(rows),
                **outcome.figures,
            }
        )
        if outcome.status == "quarantined":
            for sop in by_path.values():
                done.quarantined[sop] = (outcome.reason or "defacing_failed", outcome.detail or "")
                if outcome.preview is not None:
                    done.previews[sop] = outcome.preview
            continue
        for path, data in outcome.payloads.items():
            write(path, data)
            done.transfer_syntax[by_path[path]] = str(_read_meta_ts(data))
    done.counts = audit_counts(outcomes)
    return done


def _read_meta_ts(data: bytes) -> str:
    return str(pydicom.dcmread(io.BytesIO(data), stop_before_pixels=True).file_meta.TransferSyntaxUID)
