"""Volume geometry against SimpleITK reads of the same files, resampling, gantry tilt, loader round trip.

Data: pydicom's bundled 5-slice CT series (dicomdirtests 98892001/CT5N) and the longitudinal chest
CT patients under ../shared/data/dicom (one slice per series; skipped when absent).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pydicom
import pytest
import SimpleITK as sitk
from pydicom.data import get_testdata_file

from etl.pixels.decode import decode
from etl.pixels.normalise import DEFAULT_CT_SPACING_MM, normalise_2d, normalise_volume
from medreco_reader.tensors import load_image, to_tensor
from schemas.config import PROJECT_ROOT, NormalisationConfig

LONGITUDINAL = PROJECT_ROOT.parent / "shared" / "data" / "dicom" / "longitudinal-chest-ct-covid19-ny-sbu"
CFG = NormalisationConfig()


def ct5n_paths() -> list[Path]:
    path = get_testdata_file("CT_small.dcm", download=False)
    if path is None:
        pytest.skip("pydicom test files not installed")
    return sorted((Path(path).parent / "dicomdirtests" / "98892001" / "CT5N").iterdir())


def sitk_series(paths: list[Path]) -> sitk.Image:
    reader = sitk.ImageSeriesReader()
    folder = str(paths[0].parent)
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(folder))
    return reader.Execute()


def test_ct5n_geometry_and_voxels_match_simpleitk():
    paths = ct5n_paths()
    out = normalise_volume([pydicom.dcmread(p) for p in paths], CFG)
    ref = sitk_series(paths)
    sx, sy, sz = ref.GetSpacing()
    assert out["spacing_mm"] == pytest.approx([sy, sx, sz], abs=1e-4)
    assert out["origin_mm"] == pytest.approx(list(ref.GetOrigin()), abs=1e-4)
    assert out["direction"] == pytest.approx(list(ref.GetDirection()), abs=1e-6)
    assert out["shape"] == list(reversed(ref.GetSize())) and out["dtype"] == "float32"
    ref_hu = np.clip(sitk.GetArrayFromImage(ref).astype(np.float64), *CFG.ct_hu_window)
    vol, meta = load_image(out)
    np.testing.assert_array_equal(vol, ref_hu.astype(np.float32))
    assert meta["origin_mm"] == out["origin_mm"] and meta["direction"] == out["direction"]


def test_resample_to_target_spacing_keeps_origin_and_direction():
    paths = ct5n_paths()
    native = normalise_volume([pydicom.dcmread(p) for p in paths], CFG)
    out = normalise_volume([pydicom.dcmread(p) for p in paths], CFG, target_spacing_mm=DEFAULT_CT_SPACING_MM)
    assert out["spacing_mm"] == [0.75, 0.75, 1.5]
    rows, cols, slices = (
        int(np.floor((n - 1) * s / t + 1e-6)) + 1
        for n, s, t in zip(
            [native["rows"], native["cols"], native["n_slices"]], native["spacing_mm"], DEFAULT_CT_SPACING_MM
        )
    )
    assert out["shape"] == [slices, rows, cols]
    assert out["origin_mm"] == native["origin_mm"] and out["direction"] == native["direction"]
    vol, _ = load_image(out)
    nat, _ = load_image(native)
    assert vol[0, 0, 0] == nat[0, 0, 0]  # voxel (0,0,0) coincides with the native one
    # slice k at 1.5 k mm lies between native slices (2.5 mm apart): linear blend of the two
    k = 1
    t = k * 1.5 / native["spacing_mm"][2]
    j = int(t)
    np.testing.assert_allclose(vol[k, 0, 0], (1 - (t - j)) * nat[j, 0, 0] + (t - j) * nat[j + 1, 0, 0], atol=1e-2)
    assert json.loads(out["recipe"])["steps"][-3]["step"] == "resample"


def test_gantry_tilt_detected_and_slices_realigned():
    datasets = [pydicom.dcmread(p) for p in ct5n_paths()]
    datasets.sort(key=lambda d: float(d.ImagePositionPatient[2]))
    spacing = float(datasets[0].PixelSpacing[0])
    for k, ds in enumerate(datasets):  # shift each origin by k whole pixels along +y (column direction)
        x, y, z = (float(v) for v in ds.ImagePositionPatient)
        ds.ImagePositionPatient = [x, y + k * spacing, z]
    out = normalise_volume(datasets, CFG)
    steps = {s["step"]: s for s in json.loads(out["recipe"])["steps"]}
    dz = float(datasets[1].ImagePositionPatient[2]) - float(datasets[0].ImagePositionPatient[2])
    assert steps["geometry"]["gantry_tilt_deg"] == pytest.approx(np.degrees(np.arctan2(spacing, dz)), abs=1e-4)
    assert steps["regularise"]["n_slices"] == 5
    vol, _ = load_image(out)
    # slice k's row r shows what the scanner put at row r + k of the first slice's grid: shifted by k rows
    hu = np.clip(decode(datasets[2]), *CFG.ct_hu_window)
    np.testing.assert_allclose(vol[2, 2:, :], hu[:-2, :], atol=1e-3)


def test_irregular_geometry_can_be_quarantined_instead():
    from etl.pixels.normalise import NormalisationError
    from schemas.config import NormalisationConfig

    datasets = [pydicom.dcmread(p) for p in ct5n_paths()]
    datasets.sort(key=lambda d: float(d.ImagePositionPatient[2]))
    del datasets[2]  # a missing slice
    strict = NormalisationConfig(irregular_slices="quarantine")
    with pytest.raises(NormalisationError) as err:
        normalise_volume(datasets, strict)
    assert err.value.reason == "irregular_slice_geometry"
    steps = {s["step"]: s for s in json.loads(normalise_volume(datasets, CFG)["recipe"])["steps"]}
    assert steps["geometry"]["missing_slices"] == 1 and steps["regularise"]["n_slices"] == 5


@pytest.mark.skipif(not LONGITUDINAL.is_dir(), reason="longitudinal chest CT data absent")
def test_longitudinal_single_slice_series_match_simpleitk():
    paths = sorted(LONGITUDINAL.glob("*/*/*.dcm"))
    assert paths
    for path in paths:
        ds = pydicom.dcmread(path)
        out = normalise_volume([ds], CFG)
        ref = sitk.ReadImage(str(path))
        sx, sy, _ = ref.GetSpacing()
        assert out["shape"] == [1, ds.Rows, ds.Columns]
        assert out["spacing_mm"][:2] == pytest.approx([sy, sx], abs=1e-5)
        assert out["spacing_mm"][2] == pytest.approx(float(ds.SliceThickness))
        assert out["origin_mm"] == pytest.approx(list(ref.GetOrigin()), abs=1e-3)
        assert out["direction"] == pytest.approx(list(ref.GetDirection()), abs=1e-5)
        assert out["orientation"] == path.parent.name.upper()  # folders: axial, coronal, sagittal


def test_parquet_round_trip_is_bit_exact(tmp_path):
    paths = ct5n_paths()
    vol_res = normalise_volume([pydicom.dcmread(p) for p in paths], CFG)
    img_res = normalise_2d(pydicom.dcmread(paths[0]), CFG)
    rows = [
        {k: r[k] for k in ("payload", "payload_format", "recipe", "view", "spacing_mm")} for r in (vol_res, img_res)
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "images.parquet", compression="zstd")
    back = pq.read_table(tmp_path / "images.parquet").to_pylist()
    vol, meta = load_image(back[0])
    expected = np.load(io.BytesIO(vol_res["payload"]))
    assert vol.dtype == expected.dtype and vol.tobytes() == expected.tobytes()
    assert meta["spacing_mm"] == vol_res["spacing_mm"] and meta["recipe"] == json.loads(vol_res["recipe"])
    img, meta2 = load_image(back[1])
    assert img.dtype == np.uint8 and img.shape == tuple(CFG.image_size)
    tensor = to_tensor(back[1])
    assert tuple(tensor.shape) == (1, *CFG.image_size)
    np.testing.assert_array_equal(tensor.numpy()[0], img.astype(np.float32) / np.float32(255))
    np.testing.assert_array_equal(to_tensor(back[0]).numpy(), expected)
