"""Volume assembly: the slices of one CT/MR series -> a regular 3D grid in LPS patient coordinates.

Steps, in order (each recorded as a recipe step by the caller, :func:`etl.pixels.normalise.normalise_volume`):

1. :func:`exclude_outliers`: localizers / scouts (ImageType LOCALIZER) and slices whose
   ImageOrientationPatient or Rows x Columns differ from a strict majority of the series;
2. :func:`slice_geometry`: position of each slice along the slice normal
   n = row x column direction cosines (PS3.3 C.7.6.2.1.1), sorting, duplicate positions,
   missing slices / non-uniform steps, gantry tilt;
3. :func:`dedupe`: exact duplicates (same position, identical pixels) dropped with a warning;
   different pixels at one position -> ``duplicate_slice_position`` (or ``inconsistent_series`` when
   every position repeats equally often: a multi-phase / multi-echo series is not one volume);
4. :func:`regularise`: when the steps are not uniform or the gantry was tilted, the stack is
   interpolated (linearly, along the normal and in plane) onto a regular orthogonal grid at the
   median step, so that origin, spacing and direction describe every voxel exactly;
5. :func:`resample`: linear resampling to a target spacing, same origin and direction: three separable
   1-D passes for axis-aligned grids (:mod:`etl.pixels.separable`), else a SimpleITK image with spacing,
   origin and direction (:func:`to_sitk`) and ``sitk.Resample`` (linear).

Axes: numpy arrays are (slice, row, col); SimpleITK index (x, y, z) = (col, row, slice); direction is
the 3 x 3 matrix whose columns are the row direction (IOP[0:3]), the column direction (IOP[3:6]) and
the slice normal, flattened row-major as ``sitk.Image.GetDirection()`` returns it.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from etl.pixels.decode import NormalisationError

#: a step more than this many times the median step means missing slices
GAP_FACTOR = 1.5
#: steps differing from the median by more than this fraction (or _STEP_TOL_MM) are non-uniform
STEP_REL_TOL = 0.01
_STEP_TOL_MM = 1e-3
#: positions closer than this along the normal are the same position (mm)
POSITION_TOL_MM = 1e-3
#: in-plane drift of slice origins beyond this (mm) is gantry tilt
TILT_TOL_MM = 1e-2
_ORIENTATION_DECIMALS = 3


@dataclass
class Geometry:
    """Geometry of a regular volume in LPS patient coordinates (PS3.3 C.7.6.2.1.1).

    Attributes
    ----------
    spacing_mm : list of float
        [row, col, slice] spacing in mm (row = PixelSpacing[0], distance between rows).
    origin_mm : list of float
        LPS position (mm) of the centre of voxel (0, 0, 0): ImagePositionPatient of the first slice.
    direction : list of float
        9 direction cosines, row-major 3 x 3 matrix with columns (row dir, column dir, normal).
    steps : list of dict
        Recipe steps describing what was detected and done.
    """

    spacing_mm: list[float]
    origin_mm: list[float]
    direction: list[float]
    steps: list[dict[str, Any]] = field(default_factory=list)


def direction_matrix(orientation: np.ndarray) -> np.ndarray:
    """3 x 3 direction matrix (columns: row cosine, column cosine, normal) from ImageOrientationPatient.

    Parameters
    ----------
    orientation : numpy.ndarray
        The 6 values of ImageOrientationPatient (unit vectors, LPS).

    Returns
    -------
    numpy.ndarray
        float64, shape (3, 3); the cosines are re-normalised and the column cosine made
        orthogonal to the row cosine (DS values are rounded in files).
    """
    row = np.asarray(orientation[:3], dtype=np.float64)
    col = np.asarray(orientation[3:6], dtype=np.float64)
    row = row / np.linalg.norm(row)
    col = col - np.dot(col, row) * row
    col = col / np.linalg.norm(col)
    return np.stack([row, col, cross3(row, col)], axis=1)


def cross3(a: Any, b: Any) -> np.ndarray:
    """Cross product of two 3-vectors, float64 (3,): the same operations, in the same order, as
    ``numpy.cross`` (a1 b2 - a2 b1, a2 b0 - a0 b2, a0 b1 - a1 b0), so the same values, at a
    fraction of its cost for one pair of vectors."""
    a0, a1, a2 = (float(v) for v in a)
    b0, b1, b2 = (float(v) for v in b)
    return np.array([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], dtype=np.float64)


def exclude_outliers(slices: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Split off localizers and slices unlike the majority of the series.

    Parameters
    ----------
    slices : list of dict
        Slice records with ``image_type`` (list of str), ``orientation`` (array of 6 or None),
        ``rows``, ``cols`` and ``index`` (position in the caller's input list).

    Returns
    -------
    (kept, excluded)
        ``excluded`` items are ``{"index": int, "frame": int | None, "why": str}``.

    Raises
    ------
    NormalisationError
        ``inconsistent_series`` when the non-localizer slices differ in orientation or matrix and
        no strict majority shares one (nothing can be called the outlier).
    """
    excluded: list[dict[str, Any]] = []
    kept = []
    for s in slices:
        if "LOCALIZER" in s["image_type"]:
            excluded.append({"index": s["index"], "frame": s["frame"], "why": "ImageType LOCALIZER"})
        else:
            kept.append(s)
    if not kept:
        raise NormalisationError("inconsistent_series", "every slice of the series is a localizer")

    def key(s: dict[str, Any]) -> tuple:
        ori = s["orientation"]
        rounded = None if ori is None else tuple(np.round(ori, _ORIENTATION_DECIMALS).tolist())
        return rounded, s["rows"], s["cols"]

    counts = Counter(key(s) for s in kept)
    if len(counts) > 1:
        majority, n = counts.most_common(1)[0]
        if 2 * n <= len(kept):
            raise NormalisationError(
                "inconsistent_series",
                "slices differ in ImageOrientationPatient or Rows/Columns and no strict majority agrees",
            )
        for s in kept:
            if key(s) != majority:
                same_plane = key(s)[0] == majority[0]
                why = "Rows/Columns unlike the series" if same_plane else "orientation unlike the series"
                excluded.append({"index": s["index"], "frame": s["frame"], "why": why})
        kept = [s for s in kept if key(s) == majority]
    excluded.sort(key=lambda e: (e["index"], e["frame"] or 0))
    return kept, excluded


def slice_geometry(slices: list[dict[str, Any]]) -> dict[str, Any]:
    """Positions along the normal, sort order, duplicates, gaps and tilt of a slice stack.

    Parameters
    ----------
    slices : list of dict
        Slice records with ``position`` (ImagePositionPatient, 3 floats, mm) and ``orientation``
        (6 floats), all present and equal.

    Returns
    -------
    dict
        ``order`` (indices into ``slices``, ascending along the normal), ``along`` (mm, sorted),
        ``groups`` (lists of indices of slices at one position), ``normal`` (3,), ``matrix`` (3, 3).
    """
    matrix = direction_matrix(slices[0]["orientation"])
    normal = matrix[:, 2]
    along = np.array([float(np.dot(s["position"], normal)) for s in slices])
    order = sorted(range(len(slices)), key=lambda i: (along[i], slices[i]["index"], slices[i]["frame"] or 0))
    groups: list[list[int]] = []
    for i in order:
        if groups and along[i] - along[groups[-1][0]] < POSITION_TOL_MM:
            groups[-1].append(i)
        else:
            groups.append([i])
    return {"order": order, "along": along, "groups": groups, "normal": normal, "matrix": matrix}


def dedupe(groups: list[list[int]], pixels: list[np.ndarray]) -> tuple[list[int], list[dict[str, Any]]]:
    """Keep one slice per position; drop exact duplicates, refuse conflicting ones.

    Parameters
    ----------
    groups : list of list of int
        Indices of slices sharing a position (from :func:`slice_geometry`), in order.
    pixels : list of numpy.ndarray
        Decoded (physical value) pixels of every slice, by index.

    Returns
    -------
    (keep, warnings)
        One index per position (the first of its group) and ``duplicate_slice_position`` warnings.

    Raises
    ------
    NormalisationError
        ``inconsistent_series`` when every position holds the same number (>= 2) of different
        images (multi-phase, multi-echo or repeated acquisitions: several volumes in one series);
        ``duplicate_slice_position`` when some position holds images with different pixels.
    """
    keep: list[int] = []
    warnings: list[dict[str, Any]] = []
    conflicts = 0
    for group in groups:
        first = group[0]
        keep.append(first)
        same = [i for i in group[1:] if np.array_equal(pixels[i], pixels[first])]
        if len(same) != len(group) - 1:
            conflicts += 1
        elif same:
            warnings.append({"warning": "duplicate_slice_position", "dropped": len(same), "identical_pixels": True})
    if conflicts:
        sizes = {len(g) for g in groups}
        if len(groups) > 1 and len(sizes) == 1 and min(sizes) > 1 and conflicts == len(groups):
            raise NormalisationError(
                "inconsistent_series",
                f"every position holds {min(sizes)} different images: several volumes in one series",
            )
        raise NormalisationError(
            "duplicate_slice_position", f"{conflicts} slice positions hold images with different pixels"
        )
    return keep, warnings


def assess(positions: np.ndarray, along: np.ndarray, matrix: np.ndarray) -> dict[str, Any]:
    """Detect missing slices, non-uniform steps and gantry tilt of a sorted, de-duplicated stack.

    Parameters
    ----------
    positions : numpy.ndarray
        (n, 3) ImagePositionPatient of the slices in order (mm, LPS).
    along : numpy.ndarray
        (n,) their distance along the normal (mm), strictly increasing.
    matrix : numpy.ndarray
        (3, 3) direction matrix from :func:`direction_matrix`.

    Returns
    -------
    dict
        ``step_mm`` (median step), ``uniform`` (bool), ``missing`` (number of slices estimated
        missing in gaps > :data:`GAP_FACTOR` x median), ``tilt_deg`` (gantry tilt angle, 0 when
        the slice origins lie on the normal), ``offsets`` ((n, 2) in-plane drift of each slice
        origin from the first along the row and column directions, mm).
    """
    steps = np.diff(along)
    step = float(np.median(steps))
    tol = max(STEP_REL_TOL * step, _STEP_TOL_MM)
    uniform = bool(np.all(np.abs(steps - step) <= tol))
    missing = int(sum(round(g / step) - 1 for g in steps if g > GAP_FACTOR * step))
    rel = positions - positions[0]
    offsets = np.stack([rel @ matrix[:, 0], rel @ matrix[:, 1]], axis=1)
    drift = np.linalg.norm(offsets, axis=1)
    tilt = 0.0
    if drift.max() > TILT_TOL_MM:
        k = int(np.argmax(drift))
        tilt = math.degrees(math.atan2(float(drift[k]), float(along[k] - along[0])))
    return {"step_mm": step, "uniform": uniform, "missing": missing, "tilt_deg": tilt, "offsets": offsets}


def regularise(
    volume: np.ndarray, along: np.ndarray, offsets: np.ndarray, pixel_mm: tuple[float, float], step_mm: float
) -> np.ndarray:
    """Interpolate an irregular or tilted stack onto a regular orthogonal grid.

    Output slice k lies at ``along[0] + k * step_mm`` on the normal through the first slice's
    origin. Each source slice is first shifted in plane by its origin drift (linear interpolation,
    edge values repeated), then the two source slices bracketing the output position are blended
    linearly along the normal.

    Parameters
    ----------
    volume : numpy.ndarray
        float32 (n, rows, cols), slices in ascending ``along``.
    along : numpy.ndarray
        (n,) slice positions along the normal, mm.
    offsets : numpy.ndarray
        (n, 2) in-plane drift of each slice origin (row direction, column direction), mm.
    pixel_mm : (float, float)
        PixelSpacing [row, col] in mm.
    step_mm : float
        Output slice step, mm.

    Returns
    -------
    numpy.ndarray
        float32 (m, rows, cols), m = floor((along[-1] - along[0]) / step_mm + 1e-6) + 1.
    """
    from scipy import ndimage

    shifted = volume
    if np.abs(offsets).max() > TILT_TOL_MM:
        shifted = np.empty_like(volume)
        for k in range(volume.shape[0]):
            # offsets[k, 0] is along the row direction = +col index; offsets[k, 1] along +row index
            shift = (offsets[k, 1] / pixel_mm[0], offsets[k, 0] / pixel_mm[1])
            shifted[k] = ndimage.shift(volume[k], shift, order=1, mode="nearest")
    m = int(math.floor((along[-1] - along[0]) / step_mm + 1e-6)) + 1
    out = np.empty((m,) + volume.shape[1:], dtype=np.float32)
    for k in range(m):
        t = along[0] + k * step_mm
        j = int(np.clip(np.searchsorted(along, t, side="right") - 1, 0, len(along) - 2))
        w = float(np.clip((t - along[j]) / (along[j + 1] - along[j]), 0.0, 1.0))
        out[k] = (1.0 - w) * shifted[j] + w * shifted[j + 1]
    return out


def to_sitk(volume: np.ndarray, geometry: Geometry) -> Any:
    """A SimpleITK image of a (slice, row, col) volume with its spacing, origin and direction.

    Parameters
    ----------
    volume : numpy.ndarray
        (slices, rows, cols).
    geometry : Geometry

    Returns
    -------
    SimpleITK.Image
        Spacing (x, y, z) = (col, row, slice) mm; origin and direction in LPS.
    """
    import SimpleITK as sitk

    image = sitk.GetImageFromArray(volume)
    row_mm, col_mm, slice_mm = geometry.spacing_mm
    image.SetSpacing((float(col_mm), float(row_mm), float(slice_mm)))
    image.SetOrigin(tuple(float(v) for v in geometry.origin_mm))
    image.SetDirection(tuple(float(v) for v in geometry.direction))
    return image


def resample(
    volume: np.ndarray,
    geometry: Geometry,
    target_spacing_mm: tuple[float, float, float],
    default: float,
    out: np.ndarray | None = None,
    clip: tuple[float, float] | None = None,
) -> tuple[np.ndarray, Geometry, str]:
    """Resample a regular volume to a target spacing (linear interpolation), keeping origin and direction.

    The output's size along each axis is floor(extent / target) + 1 with extent = (size - 1) x spacing
    (:func:`etl.pixels.separable.resampled_size`), so that every output voxel lies inside the input grid.
    Axis-aligned grids (direction cosines a signed permutation: the identity up to flips and axis swaps,
    :func:`etl.pixels.separable.is_axis_aligned`) are resampled by three separable 1-D passes
    (:func:`etl.pixels.separable.resample_separable`, equal to SimpleITK's linear resampling to float32
    rounding); oblique and tilted-then-regularised volumes (and volumes with one row or column) by
    ``sitk.Resample`` (linear).

    Parameters
    ----------
    volume : numpy.ndarray
        float32 (slices, rows, cols).
    geometry : Geometry
    target_spacing_mm : (float, float, float)
        [row, col, slice] spacing in mm.
    default : float
        Value for voxels outside the input (none by construction; HU -1000 for CT, 0 for MR).
    out : numpy.ndarray, optional
        C-contiguous float32 array of the output size to write into on the separable path (e.g. a payload
        buffer); ignored by the SimpleITK path.
    clip : (float, float), optional
        (low, high) applied slice by slice on the separable path (:func:`etl.pixels.separable.resample_separable`);
        ignored by the SimpleITK path (the method returned tells which).

    Returns
    -------
    (numpy.ndarray, Geometry, str)
        float32 resampled volume (``out`` when it was written), its geometry (``steps`` not copied) and the
        method: ``"separable"`` or ``"SimpleITK.Resample"``.
    """
    from etl.pixels.separable import is_axis_aligned, resample_separable, resampled_size

    spacing = [float(target_spacing_mm[0]), float(target_spacing_mm[1]), float(target_spacing_mm[2])]
    out_geometry = Geometry(spacing, list(geometry.origin_mm), list(geometry.direction))
    size = resampled_size(volume.shape, geometry.spacing_mm, target_spacing_mm)
    if is_axis_aligned(geometry.direction) and min(volume.shape) >= 2:
        if out is None or out.shape != size:
            out = None
        src = volume if volume.dtype == np.float32 else volume.astype(np.float32)
        return (
            resample_separable(src, geometry.spacing_mm, spacing, size, default, out, clip),
            out_geometry,
            "separable",
        )
    return resample_sitk(volume, geometry, target_spacing_mm, default), out_geometry, "SimpleITK.Resample"


def resample_sitk(
    volume: np.ndarray, geometry: Geometry, target_spacing_mm: tuple[float, float, float], default: float
) -> np.ndarray:
    """``sitk.Resample`` (linear, identity transform, same origin and direction) of a regular volume onto
    :func:`etl.pixels.separable.resampled_size` voxels at ``target_spacing_mm`` ([row, col, slice] mm).

    Returns
    -------
    numpy.ndarray
        float32 (slices, rows, cols).
    """
    import SimpleITK as sitk

    from etl.pixels.separable import resampled_size

    image = to_sitk(volume, geometry)
    target = (float(target_spacing_mm[1]), float(target_spacing_mm[0]), float(target_spacing_mm[2]))
    slices, rows, cols = resampled_size(volume.shape, geometry.spacing_mm, target_spacing_mm)
    out = sitk.Resample(
        image,
        [cols, rows, slices],
        sitk.Transform(),
        sitk.sitkLinear,
        image.GetOrigin(),
        target,
        image.GetDirection(),
        float(default),
        sitk.sitkFloat32,
    )
    return sitk.GetArrayFromImage(out)
