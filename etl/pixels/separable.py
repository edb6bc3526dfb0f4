"""Separable linear resampling of a regular volume onto a grid with the same origin and direction.

When the output grid keeps the input's origin and direction and only the spacing changes (what
:func:`etl.pixels.volumes.resample` does), output voxel index i along an axis maps to the input's
continuous index ``x = i * t / s`` along the same axis (``t`` output, ``s`` input spacing, mm): the
mapping is diagonal in index space, so trilinear interpolation is the product of three 1-D linear
interpolations, one per axis, done as three passes.

This module reproduces ``sitk.Resample(image, size, sitk.Transform(), sitk.sitkLinear, origin, spacing,
direction, default, sitk.sitkFloat32)`` (ITK's ``LinearInterpolateImageFunction`` in a
``ResampleImageFilter``), including its border rules (ITK's centred pixel convention):

- an output voxel whose continuous index along any axis lies outside ``[-0.5, n - 0.5)`` is
  outside the input and gets ``default``;
- inside, the index is clamped to ``[0, n - 1]`` and interpolated between ``floor(x)`` and the next
  voxel (the last voxel repeated past ``n - 1``: no extrapolation).

Passes, in the order that keeps the intermediate arrays smallest for the usual CT case (fewer slices,
more pixels in plane): along the slices (each output slice is a blend of two input slices), along the
columns (the last axis: a banded matrix product per block of output columns, through BLAS, over a slab
of slices at once), along the rows (the same banded products from the left, per slice, written straight
into the caller's output, e.g. a payload buffer). Each block's matrix holds the two weights of each output
voxel (``1 - w`` and ``w``) and zeros, so a product adds exact zeros to ``(1 - w) a + w b``. The passes compute in
float32, so values equal SimpleITK's (which interpolates in double and rounds once) to float32 rounding: within a few
units in the last place of the volume's largest magnitude (``tests/pixels/test_separable.py`` on a real CT series).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: output columns (rows) per block of the column (row) pass: one small matrix product each
COLUMN_BLOCK = 16
#: slices per slab of the column pass (the slab's rows go through BLAS together). One: a product of a 512-row slice
#: stays under OpenBLAS's threading threshold (m n k < 262,144), so each one runs on the calling thread (no BLAS
#: threads competing with parallel tasks; as fast on one core as larger slabs, measured with bench_normalise.py)
SLAB_SLICES = 1
#: a direction matrix entry within this of 0 or +-1 counts as axis-aligned
AXIS_ALIGNED_TOL = 1e-6


@dataclass(frozen=True)
class AxisMap:
    """Where the output voxels along one axis fall in the input (ITK's linear interpolation rules).

    Attributes
    ----------
    lower : numpy.ndarray
        intp (m,): the input voxel at or below each output voxel's clamped continuous index.
    upper : numpy.ndarray
        intp (m,): ``min(lower + 1, n - 1)``.
    weight : numpy.ndarray
        float64 (m,): weight of ``upper`` (``1 - weight`` on ``lower``), in [0, 1).
    inside : int
        the output voxels ``0 .. inside - 1`` are inside the input; the rest get the default value.
    """

    lower: np.ndarray
    upper: np.ndarray
    weight: np.ndarray
    inside: int


def axis_map(n: int, spacing_mm: float, target_mm: float, m: int) -> AxisMap:
    """Map ``m`` output voxels at ``target_mm`` steps onto ``n`` input voxels at ``spacing_mm`` (same origin).

    Parameters
    ----------
    n : int
        input voxels along the axis (>= 1).
    spacing_mm, target_mm : float
        input and output spacing (mm, > 0).
    m : int
        output voxels along the axis.

    Returns
    -------
    AxisMap
    """
    x = np.arange(m, dtype=np.float64) * (float(target_mm) / float(spacing_mm))
    inside = int(np.count_nonzero((x >= -0.5) & (x < n - 0.5)))
    xc = np.clip(x, 0.0, n - 1)
    lower = np.floor(xc).astype(np.intp)
    upper = np.minimum(lower + 1, n - 1)
    return AxisMap(lower, upper, xc - lower, inside)


def resampled_size(
    shape: Sequence[int], spacing_mm: Sequence[float], target_mm: Sequence[float]
) -> tuple[int, int, int]:
    """Output (slices, rows, cols) of :func:`etl.pixels.volumes.resample`: floor(extent / target) + 1 per axis
    with extent = (n - 1) x spacing, so that every output voxel lies inside the input grid.

    Parameters
    ----------
    shape : (int, int, int)
        input (slices, rows, cols).
    spacing_mm, target_mm : (float, float, float)
        [row, col, slice] input and output spacing (mm).
    """
    row, col, sl = (float(v) for v in spacing_mm)
    t_row, t_col, t_sl = (float(v) for v in target_mm)
    return tuple(  # type: ignore[return-value]
        int(math.floor((n - 1) * sp / t + 1e-6)) + 1 for n, sp, t in zip(shape, (sl, row, col), (t_sl, t_row, t_col))
    )


def is_axis_aligned(direction: list[float] | tuple[float, ...] | np.ndarray | None) -> bool:
    """True when the 3 x 3 direction matrix is a signed permutation (each row and column one entry of +-1,
    the rest 0, within :data:`AXIS_ALIGNED_TOL`): the identity up to flips and axis permutations.

    Parameters
    ----------
    direction : sequence of 9 float or None
        row-major direction cosines (``sitk.Image.GetDirection()`` order); None (unknown) is axis-aligned.
    """
    if direction is None:
        return True
    d = np.abs(np.asarray(direction, dtype=np.float64).reshape(3, 3))
    ones = np.abs(d - 1.0) <= AXIS_ALIGNED_TOL
    zeros = d <= AXIS_ALIGNED_TOL
    return bool(np.all(ones | zeros) and np.all(ones.sum(axis=0) == 1) and np.all(ones.sum(axis=1) == 1))


def _column_blocks(amap: AxisMap, block: int) -> list[tuple[int, int, int, int, np.ndarray]]:
    """``(o0, o1, lo, hi, W)`` per block of output columns: ``out[:, o0:o1] = in[:, lo:hi] @ W`` with W float32
    (hi - lo, o1 - o0) holding ``1 - w`` and ``w`` (two entries per column, summed where they coincide)."""
    out = []
    m = len(amap.lower)
    for o0 in range(0, m, block):
        o1 = min(o0 + block, m)
        lo, hi = int(amap.lower[o0]), int(amap.upper[o1 - 1]) + 1
        w = np.zeros((hi - lo, o1 - o0), dtype=np.float64)
        cols = np.arange(o1 - o0)
        np.add.at(w, (amap.lower[o0:o1] - lo, cols), 1.0 - amap.weight[o0:o1])
        np.add.at(w, (amap.upper[o0:o1] - lo, cols), amap.weight[o0:o1])
        out.append((o0, o1, lo, hi, w.astype(np.float32)))
    return out


def resample_separable(
    volume: np.ndarray,
    spacing_mm: Sequence[float],
    target_mm: Sequence[float],
    size: tuple[int, int, int],
    default: float,
    out: np.ndarray | None = None,
    clip: tuple[float, float] | None = None,
) -> np.ndarray:
    """Linear resampling of a (slice, row, col) volume onto the grid of the same origin and direction at
    ``target_mm``, equal to SimpleITK's linear ``Resample`` to float32 rounding (see the module docstring).

    Parameters
    ----------
    volume : numpy.ndarray
        float32 (slices, rows, cols), each axis >= 2 voxels; read only.
    spacing_mm, target_mm : (float, float, float)
        [row, col, slice] input and output spacing (mm, > 0).
    size : (int, int, int)
        output (slices, rows, cols) (:func:`resampled_size` for every voxel inside; larger sizes reach
        outside the input, where ``default`` is written).
    default : float
        value of output voxels outside the input (HU -1000 for CT, 0 for MR).
    out : numpy.ndarray, optional
        C-contiguous float32 array of shape ``size`` to write into (every element is written), e.g. the
        array of an :class:`etl.pixels.npy_payload.NpyPayload`; a new array when None.
    clip : (float, float), optional
        (low, high): each output slice clipped as soon as it is made, while it is in cache (the values of
        clipping the whole output afterwards, ``default`` included).

    Returns
    -------
    numpy.ndarray
        float32 (size), ``out`` itself when given.

    Raises
    ------
    ValueError
        for a volume that is not 3D float32 with >= 2 voxels per axis, or an ``out`` of another shape/dtype.
    """
    if volume.ndim != 3 or volume.dtype != np.float32 or min(volume.shape) < 2:
        raise ValueError("resample_separable needs a float32 (slices, rows, cols) volume with >= 2 voxels per axis")
    n0, n1, n2 = volume.shape
    m0, m1, m2 = (int(v) for v in size)
    if out is None:
        out = np.empty((m0, m1, m2), dtype=np.float32)
    elif out.shape != (m0, m1, m2) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError("out must be a C-contiguous float32 array of the output size")
    row_mm, col_mm, slice_mm = (float(v) for v in spacing_mm)
    t_row, t_col, t_slice = (float(v) for v in target_mm)
    zmap = axis_map(n0, slice_mm, t_slice, m0)
    ymap = axis_map(n1, row_mm, t_row, m1)
    xmap = axis_map(n2, col_mm, t_col, m2)
    xblocks = _column_blocks(xmap, COLUMN_BLOCK)
    # rows: the same banded blocks, transposed, applied from the left to each slice
    yblocks = [(o0, o1, lo, hi, np.ascontiguousarray(w.T)) for o0, o1, lo, hi, w in _column_blocks(ymap, COLUMN_BLOCK)]
    slab = min(SLAB_SLICES, m0)
    zs = np.empty((slab, n1, n2), dtype=np.float32)
    cs = np.empty((slab, n1, m2), dtype=np.float32)
    for k0 in range(0, m0, slab):
        k1 = min(k0 + slab, m0)
        for k in range(k0, k1):  # slices: a blend of the two input slices around each output slice
            s = zs[k - k0]
            a, b, wz = volume[zmap.lower[k]], volume[zmap.upper[k]], np.float32(zmap.weight[k])
            if wz == 0.0:
                s[...] = a
            else:
                np.subtract(b, a, out=s)
                s *= wz
                s += a
        z_flat = zs[: k1 - k0].reshape(-1, n2)
        c_flat = cs[: k1 - k0].reshape(-1, m2)
        for o0, o1, lo, hi, w in xblocks:  # columns: banded products, every row of the slab at once
            np.matmul(z_flat[:, lo:hi], w, out=c_flat[:, o0:o1])
        for k in range(k0, k1):  # rows: banded products of each slice, straight into the output
            c, o = cs[k - k0], out[k]
            for o0, o1, lo, hi, w in yblocks:
                np.matmul(w, c[lo:hi], out=o[o0:o1])
            if clip is not None:
                np.clip(o, clip[0], clip[1], out=o)
    # outside the input along any axis: the default value (only the high end can be outside: x >= 0)
    if clip is not None:
        default = min(max(float(default), clip[0]), clip[1])
    out[zmap.inside :] = default
    out[:, ymap.inside :] = default
    out[:, :, xmap.inside :] = default
    return out
