"""The fast paths of etl.pixels.decode / etl.pixels.normalise give the values of the straightforward ones.

* Modality LUT: slope/intercept in float32 straight into the stack (when exact) against pydicom's
  ``apply_modality_lut`` in float64 cast to float32, on every real CT / MR file of ../shared/data/dicom
  (skipped when absent), on pydicom's bundled files, and on synthetic rescale values;
* ``decode_image(out=..., checked=...)`` against a plain ``decode_image``;
* (the ``.npy`` payload writer is checked in test_npy_payload.py);
* ``cross3`` against ``numpy.cross``; ``element_value`` against ``Dataset.get``.

Only values are checked here; speed lives in benchmarks/bench_normalise.py.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.data import get_testdata_file
from pydicom.pixels import apply_modality_lut

from etl.pixels.decode import _rescale_into, check_decodable, decode_image, element_value, lut_view
from etl.pixels.normalise import NormalisationError, image_kind
from etl.pixels.volumes import cross3

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_no_view_only_warning_is_logged(caplog):
    """pydicom logs a warning when asked for a view it cannot give (Bits Stored < Bits Allocated)."""
    ds = pydicom.dcmread(get_testdata_file("CT_small.dcm", download=False))
    ds12 = pydicom.dcmread(get_testdata_file("CT_small.dcm", download=False))
    ds12.BitsStored, ds12.HighBit = 12, 11  # unused bits to correct: pydicom copies
    with caplog.at_level("WARNING", logger="pydicom"):
        decode_image(ds)
        decode_image(ds12)
    assert not [r for r in caplog.records if "view on the original" in r.getMessage()]


def _reference(ds: pydicom.Dataset) -> np.ndarray:
    """The former path: pydicom's pixel_array through apply_modality_lut (float64), then float32."""
    return np.asarray(apply_modality_lut(ds.pixel_array, lut_view(ds, 0)), dtype=np.float32)


def _volume_files(dicom: Path) -> list[Path]:
    out = []
    for path in sorted(dicom.rglob("*.dcm")):
        ds = pydicom.dcmread(path, stop_before_pixels=True)
        if str(ds.get("Modality")) in ("CT", "MR") and int(ds.get("NumberOfFrames") or 1) == 1:
            out.append(path)
    return out


def test_float32_modality_lut_equals_float64_path_on_real_files(shared_data):
    checked = 0
    for path in _volume_files(shared_data / "dicom"):
        ds = pydicom.dcmread(path)
        if image_kind(ds) == "none" or not str(ds.get("PhotometricInterpretation", "")).startswith("MONO"):
            continue
        try:
            decoded = decode_image(ds)
        except NormalisationError:
            continue  # the collection holds deliberately broken and undecodable files
        assert decoded.array.dtype == np.float32
        assert np.array_equal(decoded.array, _reference(ds)), path.name  # exact, not within a tolerance
        checked += 1
    assert checked >= 40


@pytest.mark.parametrize("name", ["CT_small.dcm", "MR_small.dcm", "mlut_18.dcm"])
def test_modality_lut_equals_float64_path_on_bundled_files(name):
    path = get_testdata_file(name, download=False)
    assert path is not None, f"pydicom test file {name} missing: pydicom and pydicom-data are pinned dependencies"
    ds = pydicom.dcmread(path)
    assert np.array_equal(decode_image(ds).array, _reference(ds))


@pytest.mark.parametrize(
    ("slope", "intercept"),
    [
        (1.0, -1024.0),
        (1.0, 0.0),
        (2.0, -1000.0),
        (-1.0, 32767.0),
        (0.5, -1024.0),
        (1.234567, -1000.1),
        (1.0, -1024.5),
        (256.0, -8192.0),
        (300.0, 0.0),
    ],
)
@pytest.mark.parametrize("dtype", [np.int16, np.uint16, np.uint8, np.int32])
def test_rescale_into_equals_float64_then_float32(slope, intercept, dtype):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(7)
    arr = rng.integers(max(info.min, -(2**20)), min(info.max, 2**20), size=(64, 64), endpoint=True).astype(dtype)
    arr.flat[:2] = [max(info.min, -(2**20)), min(info.max, 2**20)]  # both ends of the range
    out = np.full(arr.shape, np.nan, dtype=np.float32)
    _rescale_into(arr, (slope, intercept), out)
    expected = (arr.astype(np.float64) * slope + intercept).astype(np.float32)
    assert np.array_equal(out, expected)


def test_rescale_into_identity_is_a_cast():
    arr = np.arange(-5, 5, dtype=np.int16).reshape(2, 5)
    out = np.empty(arr.shape, dtype=np.float32)
    _rescale_into(arr, None, out)
    assert np.array_equal(out, arr.astype(np.float32))


def _ct_slice() -> pydicom.Dataset:
    return pydicom.dcmread(get_testdata_file("CT_small.dcm", download=False))


def test_decode_image_writes_into_out_and_skips_a_repeated_check():
    ds = _ct_slice()
    plain = decode_image(ds)
    stack = np.zeros((2, int(ds.Rows), int(ds.Columns)), dtype=np.float32)
    into = decode_image(ds, out=stack[1], checked=check_decodable(ds)[1])
    assert into.array is stack[1] or np.shares_memory(into.array, stack)
    assert np.array_equal(stack[1], plain.array) and not stack[0].any()
    assert into.steps == plain.steps and into.value_range == plain.value_range


def test_decode_image_out_of_another_shape_is_left_alone():
    ds = _ct_slice()
    other = np.zeros((3, 3), dtype=np.float32)
    decoded = decode_image(ds, out=other)
    assert decoded.array.shape == (int(ds.Rows), int(ds.Columns)) and not other.any()


def test_rescale_values_per_slice_match_synthetic_headers():
    base = _ct_slice()
    for slope, intercept in ((1, -1024), (2, -1000), (0.5, -1024.25), (1.234567, -1000.1)):
        ds = copy.deepcopy(base)
        ds.RescaleSlope, ds.RescaleIntercept = slope, intercept
        decoded = decode_image(ds)
        assert np.array_equal(decoded.array, _reference(ds))
        assert decoded.steps[-1] == {"step": "modality_lut", "slope": float(slope), "intercept": float(intercept)}


def test_cross3_equals_numpy_cross():
    rng = np.random.default_rng(11)
    for _ in range(2000):
        a, b = rng.standard_normal(3), rng.standard_normal(3)
        assert np.array_equal(cross3(a, b), np.cross(a, b))
    assert np.array_equal(cross3([1, 0, 0], [0, 1, 0]), [0.0, 0.0, 1.0])


def test_element_value_equals_dataset_get():
    ds = _ct_slice()
    for keyword in (
        "Rows",
        "PixelSpacing",
        "ImagePositionPatient",
        "RescaleSlope",
        "ImageType",
        "PerFrameFunctionalGroupsSequence",
        "WindowCenter",
        "NumberOfFrames",
    ):
        assert element_value(ds, keyword) == ds.get(keyword), keyword


def test_volumes_built_in_place_equal_the_straightforward_stack_on_real_series(shared_data):
    """normalise_volume decodes a regular series straight into its payload and clips CT slice by slice; the
    payload must be numpy.save of the plain computation: decode each slice, sort along the normal, stack,
    clip (CT) or percentile-scale (MR). Every real CT/MR series of ../shared/data/dicom, bit for bit."""
    import io
    from collections import defaultdict

    from etl.pixels.normalise import MR_PERCENTILES, decode, normalise_volume
    from schemas.config import NormalisationConfig

    cfg = NormalisationConfig()
    series: dict[str, list[pydicom.Dataset]] = defaultdict(list)
    for path in _volume_files(shared_data / "dicom"):
        ds = pydicom.dcmread(path)
        if image_kind(ds) == "3d_slice":
            series[str(ds.SeriesInstanceUID)].append(ds)
    checked = slices = 0
    for members in series.values():
        try:
            out = normalise_volume(members, cfg)
        except NormalisationError:
            continue  # deliberately broken files, mixed series: other tests
        steps = [s["step"] for s in json.loads(out["recipe"])["steps"]]
        if {"exclude", "dedupe", "regularise"} & set(steps) or "ImagePositionPatient" not in members[0]:
            continue
        normal = np.cross(*np.asarray(members[0].ImageOrientationPatient, dtype=np.float64).reshape(2, 3))
        ordered = sorted(members, key=lambda d: float(np.dot(np.asarray(d.ImagePositionPatient, float), normal)))
        stack = np.stack([decode(d) for d in ordered]).astype(np.float32)
        if members[0].Modality == "CT":
            expected = np.clip(stack, *cfg.ct_hu_window)
        else:
            nonzero = stack[stack != 0]
            lo, hi = np.percentile(nonzero, MR_PERCENTILES)
            expected = (np.clip(stack, lo, hi) - np.float32(lo)) / np.float32(hi - lo)
        buf = io.BytesIO()
        np.save(buf, expected.astype(np.float32))
        if members[0].Modality == "CT":
            assert out["payload"] == buf.getvalue(), members[0].SeriesInstanceUID
        else:  # the normaliser scales in place in float32 (x -= lo; x /= hi - lo): equal to the float32 ulp
            np.testing.assert_allclose(np.load(io.BytesIO(out["payload"])), expected, rtol=0, atol=1e-6)
        checked += 1
        slices += len(members)
    # 57 series, 69 slices in shared/data today (Siemens MOSAIC tile sheets are quarantined, unsupported_mosaic)
    assert checked >= 55 and slices >= 66, (checked, slices)
