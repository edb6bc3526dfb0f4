"""The fast paths of etl.pixels / etl.normalise give the values of the straightforward ones.

* Modality LUT: slope/intercept in float32 straight into the stack (when exact) against pydicom's
  ``apply_modality_lut`` in float64 cast to float32, on every real CT / MR file of ../shared/data/dicom
  (skipped when absent), on pydicom's bundled files, and on synthetic rescale values;
* ``decode_image(out=..., checked=...)`` against a plain ``decode_image``;
* the streamed ``.npz`` writer against ``numpy.lib.format.write_array`` (payloads assembled in one
  buffer, small and large, and its fallbacks);
* ``cross3`` against ``numpy.cross``; ``element_value`` against ``Dataset.get``.

Only values are checked here; speed lives in benchmarks/bench_normalise.py.
"""

from __future__ import annotations

import copy
import io
import zipfile
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.data import get_testdata_file
from pydicom.pixels import apply_modality_lut

from etl import normalise
from etl.normalise import NormalisationError, _npz, image_kind, load_payload
from etl.pixels import _rescale_into, check_decodable, decode_image, element_value, lut_view
from etl.volumes import cross3

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
    [(1.0, -1024.0), (1.0, 0.0), (2.0, -1000.0), (-1.0, 32767.0), (0.5, -1024.0), (1.234567, -1000.1),
     (1.0, -1024.5), (256.0, -8192.0), (300.0, 0.0)],
)
@pytest.mark.parametrize("dtype", [np.int16, np.uint16, np.uint8, np.int32])
def test_rescale_into_equals_float64_then_float32(slope, intercept, dtype):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(7)
    arr = rng.integers(max(info.min, -2**20), min(info.max, 2**20), size=(64, 64), endpoint=True).astype(dtype)
    arr.flat[:2] = [max(info.min, -2**20), min(info.max, 2**20)]  # both ends of the range
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


def _npz_reference(arrays: dict[str, np.ndarray]) -> bytes:
    """The former writer: numpy.lib.format.write_array into each stored zip member."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name in sorted(arrays):
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = 0o644 << 16
            with zf.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.ascontiguousarray(arrays[name]), allow_pickle=False)
    return buf.getvalue()


def test_npz_bytes_equal_write_array():
    rng = np.random.default_rng(3)
    arrays = {
        "volume": rng.standard_normal((5, 17, 13)).astype(np.float32),
        "spacing_mm": np.array([0.7, 0.7, np.nan]),
        "origin_mm": np.array([-1.0, 2.0, 3.5]),
        "direction": np.eye(3).reshape(-1),
    }
    payload = _npz(arrays)
    assert payload == _npz_reference(arrays)
    assert np.array_equal(load_payload(payload, "npz"), arrays["volume"])
    # a non-contiguous volume is written in C order as well; one slice and a both-C-and-F-contiguous shape
    for volume in (arrays["volume"][:, ::2, :], arrays["volume"][:1], np.zeros((1, 1, 4), dtype=np.float32)):
        other = {**arrays, "volume": volume}
        assert _npz(other) == _npz_reference(other)


def test_npz_payload_built_in_one_buffer_equals_write_array(monkeypatch):
    """Payloads of 4 MB and more are assembled in a fresh bytes object (huge-page advised); smaller ones by
    a join; the bytearray fallback (overlapping writes) and the no-ctypes fallback give the same bytes."""
    rng = np.random.default_rng(5)
    small = {
        "volume": rng.standard_normal((3, 8, 8)).astype(np.float32),
        "spacing_mm": np.array([0.7, 0.7, 1.5]),
        "origin_mm": np.array([np.nan] * 3),
        "direction": np.eye(3).reshape(-1),
    }
    large = {**small, "volume": rng.standard_normal((5, 512, 512)).astype(np.float32)}  # 5 MB
    assert normalise._HUGE_PAGE_MIN <= large["volume"].nbytes
    for arrays in (small, large):
        reference = _npz_reference(arrays)
        payload = _npz(arrays)
        assert type(payload) is bytes and payload == reference
        assert np.array_equal(load_payload(payload, "npz"), arrays["volume"])
        assert hash(payload) == hash(bytes(reference))  # an ordinary, immutable bytes object
        monkeypatch.setattr(normalise._Parts, "_segments", lambda self: None)
        assert _npz(arrays) == reference
        monkeypatch.setattr(normalise, "_new_bytes", None)
        assert _npz(arrays) == reference
        monkeypatch.undo()


def test_parts_recorder_applies_later_writes_over_earlier():
    parts = normalise._Parts()
    assert parts.write(b"abcdef") == 6
    parts.write(memoryview(np.arange(3, dtype=np.uint16)))
    assert parts.tell() == 12
    parts.seek(2)
    parts.write(b"XY")
    parts.seek(0, 2)
    parts.write(b"!")
    expected = b"abXYef" + np.arange(3, dtype=np.uint16).tobytes() + b"!"
    assert parts.getvalue() == expected
    parts.seek(1)
    parts.write(b"QQQ")  # covers parts of two earlier writes: the bytearray path
    assert parts.getvalue() == b"aQQQef" + expected[6:]


def test_cross3_equals_numpy_cross():
    rng = np.random.default_rng(11)
    for _ in range(2000):
        a, b = rng.standard_normal(3), rng.standard_normal(3)
        assert np.array_equal(cross3(a, b), np.cross(a, b))
    assert np.array_equal(cross3([1, 0, 0], [0, 1, 0]), [0.0, 0.0, 1.0])


def test_element_value_equals_dataset_get():
    ds = _ct_slice()
    for keyword in ("Rows", "PixelSpacing", "ImagePositionPatient", "RescaleSlope", "ImageType",
                    "PerFrameFunctionalGroupsSequence", "WindowCenter", "NumberOfFrames"):
        assert element_value(ds, keyword) == ds.get(keyword), keyword
