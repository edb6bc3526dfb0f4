"""Separable linear resampling (:mod:`etl.pixels.separable`) against SimpleITK's linear ``Resample``.

Data: the 512 x 512 CT slices of ../shared/data/dicom (chest-ct and the longitudinal chest CT patients;
the shared set holds no CT series of more than one position, so the real slices are stacked into one
volume at 1.25 mm steps: real values, real in-plane spacing; skipped when absent) and pydicom's
bundled 5-slice CT series (dicomdirtests 98892001/CT5N) through :func:`etl.pixels.normalise.normalise_volume`.
Equality "to float32 rounding": the passes compute in float32, SimpleITK in double rounded once, so the
difference is bounded by a few units in the last place of the volume's largest magnitude.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pydicom
import pytest
import SimpleITK as sitk
from pydicom.data import get_testdata_file

from etl.pixels.decode import decode
from etl.pixels.normalise import DEFAULT_CT_SPACING_MM, normalise_volume
from etl.pixels.separable import axis_map, is_axis_aligned, resample_separable, resampled_size
from etl.pixels.volumes import Geometry, resample, resample_sitk, to_sitk
from schemas.config import PROJECT_ROOT, NormalisationConfig

DICOM = PROJECT_ROOT.parent / "shared" / "data" / "dicom"
CFG = NormalisationConfig()
#: float32 units in the last place of the volume's largest magnitude allowed between the two
ULPS = 4


@pytest.fixture(scope="module")
def real_stack() -> tuple[np.ndarray, list[float]]:
    """(slices, 512, 512) float32 HU of every 512 x 512 CT slice of the shared set, and [row, col, slice] mm."""
    slices, spacing = [], None
    for d in ("chest-ct", "longitudinal-chest-ct-covid19-ny-sbu"):
        for p in sorted((DICOM / d).rglob("*.dcm")):
            ds = pydicom.dcmread(p)
            if (
                ds.get("Modality") != "CT"
                or (ds.get("Rows"), ds.get("Columns")) != (512, 512)
                or "PixelSpacing" not in ds
            ):
                continue
            spacing = spacing or [float(v) for v in ds.PixelSpacing]
            slices.append(decode(ds).astype(np.float32))
    if len(slices) < 4:
        pytest.skip("the shared CT slices are not there")
    return np.stack(slices), [spacing[0], spacing[1], 1.25]


def sitk_resample(volume, spacing, target, size, default, direction=(1, 0, 0, 0, 1, 0, 0, 0, 1)):
    image = to_sitk(volume, Geometry(spacing, [10.0, -20.0, 30.0], list(direction)))
    out = sitk.Resample(
        image,
        [size[2], size[1], size[0]],
        sitk.Transform(),
        sitk.sitkLinear,
        image.GetOrigin(),
        (target[1], target[0], target[2]),
        image.GetDirection(),
        float(default),
        sitk.sitkFloat32,
    )
    return sitk.GetArrayFromImage(out)


def assert_float32_equal(ours: np.ndarray, ref: np.ndarray, volume: np.ndarray) -> None:
    assert ours.shape == ref.shape and ours.dtype == np.float32
    bound = ULPS * np.spacing(np.float32(np.abs(volume).max()))
    assert float(np.abs(ours - ref).max()) <= bound


def test_real_ct_slices_equal_simpleitk(real_stack):
    volume, spacing = real_stack
    size = resampled_size(volume.shape, spacing, DEFAULT_CT_SPACING_MM)
    assert size[1] > 512  # 0.98 mm pixels to 0.75 mm: more voxels out than in
    ours = resample_separable(volume, spacing, DEFAULT_CT_SPACING_MM, size, -1000.0)
    assert_float32_equal(ours, sitk_resample(volume, spacing, DEFAULT_CT_SPACING_MM, size, -1000.0), volume)
    assert not np.all(ours == -1000.0)


def test_grid_border_and_outside_like_simpleitk(real_stack):
    """Past the last voxel centre (up to half a voxel) SimpleITK repeats the last voxel; beyond, it writes the
    default value: an output grid larger than the input shows both."""
    volume, spacing = real_stack
    volume = volume[:, 100:164, 200:264]  # 64 x 64 in plane keeps this test small

    def clamping(n: int, sp: float) -> float:  # a target step that puts an output voxel in (n - 1, n - 0.5)
        return next(t for t in (0.6, 0.65, 0.7, 0.8, 0.55) if axis_map(n, sp, t, 400).inside > (n - 1) * sp // t + 1)

    target = (clamping(64, spacing[0]), clamping(64, spacing[1]), clamping(volume.shape[0], spacing[2]))
    fit = resampled_size(volume.shape, spacing, target)
    size = (fit[0] + 4, fit[1] + 5, fit[2] + 6)
    ours = resample_separable(volume, spacing, target, size, -1234.5)
    ref = sitk_resample(volume, spacing, target, size, -1234.5)
    assert_float32_equal(ours, ref, volume)
    for axis, n, sp, t in (
        (0, volume.shape[0], spacing[2], target[2]),
        (1, 64, spacing[0], target[0]),
        (2, 64, spacing[1], target[1]),
    ):
        amap = axis_map(n, sp, t, size[axis])
        assert fit[axis] < amap.inside < size[axis]  # some voxels clamped to the last one, some outside
        assert np.all(np.take(ours, range(amap.inside, size[axis]), axis=axis) == np.float32(-1234.5))


@pytest.mark.parametrize(
    "direction",
    [
        (-1, 0, 0, 0, 1, 0, 0, 0, -1),  # flips
        (0, 0, 1, 1, 0, 0, 0, 1, 0),  # a sagittal-like permutation
    ],
)
def test_flipped_and_permuted_grids_equal_simpleitk(real_stack, direction):
    volume, spacing = real_stack
    volume = np.ascontiguousarray(volume[:6, :96, :128])
    geometry = Geometry(spacing, [10.0, -20.0, 30.0], [float(v) for v in direction])
    ours, geo, method = resample(volume, geometry, DEFAULT_CT_SPACING_MM, -1000.0)
    assert method == "separable" and geo.direction == geometry.direction
    size = resampled_size(volume.shape, spacing, DEFAULT_CT_SPACING_MM)
    assert_float32_equal(ours, sitk_resample(volume, spacing, DEFAULT_CT_SPACING_MM, size, -1000.0, direction), volume)


def test_oblique_grids_keep_simpleitk(real_stack):
    volume, spacing = real_stack
    volume = np.ascontiguousarray(volume[:4, :64, :64])
    c, s = np.cos(0.3), np.sin(0.3)
    direction = [1.0, 0.0, 0.0, 0.0, c, -s, 0.0, s, c]
    assert not is_axis_aligned(direction)
    geometry = Geometry(spacing, [0.0, 0.0, 0.0], direction)
    ours, _, method = resample(volume, geometry, DEFAULT_CT_SPACING_MM, -1000.0)
    assert method == "SimpleITK.Resample"
    np.testing.assert_array_equal(ours, resample_sitk(volume, geometry, DEFAULT_CT_SPACING_MM, -1000.0))


def test_real_series_through_normalise_volume():
    path = get_testdata_file("CT_small.dcm", download=False)
    if path is None:
        pytest.skip("pydicom test files not installed")
    paths = sorted((Path(path).parent / "dicomdirtests" / "98892001" / "CT5N").iterdir())
    out = normalise_volume([pydicom.dcmread(p) for p in paths], CFG, target_spacing_mm=DEFAULT_CT_SPACING_MM)
    steps = json.loads(out["recipe"])["steps"]
    step = next(s for s in steps if s["step"] == "resample")
    assert step["by"] == "separable"
    # decoded slice by slice as the resampling read them: recorded as one decode of the whole series
    assert [s["step"] for s in steps[:3]] == ["sort", "decode", "modality_lut"] and steps[1]["n_slices"] == 5
    native = normalise_volume([pydicom.dcmread(p) for p in paths], NormalisationConfig(ct_hu_window=[-1e9, 1e9]))
    from etl.pixels.normalise import load_payload

    nat = load_payload(native["payload"], native["payload_format"]).astype(np.float32)
    geometry = Geometry(native["spacing_mm"], native["origin_mm"], native["direction"])
    ref = np.clip(resample_sitk(nat, geometry, DEFAULT_CT_SPACING_MM, -1000.0), *CFG.ct_hu_window)
    ours = load_payload(out["payload"], out["payload_format"])
    assert_float32_equal(ours, ref, nat)


def test_axis_aligned_means_signed_permutation():
    assert is_axis_aligned([1, 0, 0, 0, 1, 0, 0, 0, 1]) and is_axis_aligned([0, -1, 0, 1, 0, 0, 0, 0, -1])
    assert is_axis_aligned(None)
    assert not is_axis_aligned([1, 0, 0, 0, 0.9999, 0.0141, 0, -0.0141, 0.9999])
    assert not is_axis_aligned([1, 0, 0, 1, 0, 0, 0, 0, 1])  # two rows the same axis: not a permutation


def test_bad_input_refused():
    with pytest.raises(ValueError, match="float32"):
        resample_separable(np.zeros((1, 4, 4), np.float32), [1, 1, 1], [1, 1, 1], (1, 4, 4), 0.0)
    with pytest.raises(ValueError, match="out must be"):
        resample_separable(
            np.zeros((2, 4, 4), np.float32), [1, 1, 1], [1, 1, 1], (2, 4, 4), 0.0, out=np.zeros((2, 4, 5), np.float32)
        )


def test_clip_while_resampling_equals_clipping_after(real_stack):
    volume, spacing = real_stack
    volume = np.ascontiguousarray(volume[:5, :80, :80])
    size = tuple(n + 3 for n in resampled_size(volume.shape, spacing, DEFAULT_CT_SPACING_MM))  # some outside voxels
    plain = resample_separable(volume, spacing, DEFAULT_CT_SPACING_MM, size, -3000.0)
    clipped = resample_separable(volume, spacing, DEFAULT_CT_SPACING_MM, size, -3000.0, clip=(-1000.0, 1000.0))
    np.testing.assert_array_equal(clipped, np.clip(plain, -1000.0, 1000.0))
    assert clipped.min() == -1000.0  # the default value outside the input is clipped too
