"""Field cases F16, F17, F19, F20 of ../shared/tools/dicom_field_cases.py against its answer key.

The cases are generated into a temporary folder once per module; the expected values come from the
tool's ``answer_key.json`` (``assertions``), not from this file. Skipped when the tool is absent.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pydicom
import pytest
from PIL import Image

from etl.pixels.decode import decode, decode_image
from etl.pixels.normalise import NormalisationError, normalise_2d, normalise_volume
from schemas.config import PROJECT_ROOT, NormalisationConfig

TOOL = PROJECT_ROOT.parent / "shared" / "tools" / "dicom_field_cases.py"
CFG = NormalisationConfig()

pytestmark = [
    pytest.mark.skipif(not TOOL.is_file(), reason="dicom_field_cases.py absent"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict]]:
    out = tmp_path_factory.mktemp("field_cases")
    subprocess.run([sys.executable, str(TOOL), str(out), "--check"], check=True, capture_output=True)
    key = json.loads((out / "answer_key.json").read_text())
    return out, {c["id"]: c for c in key["cases"]}


def _files(cases: tuple[Path, dict[str, dict]], case_id: str) -> tuple[Path, dict]:
    root, by_id = cases
    case = by_id[case_id]
    return root / case["dir"], case


def test_f16_pixel_length_cases(cases):
    folder, case = _files(cases, "F16")
    by_file = {a["file"]: a for a in case["assertions"] if "file" in a}
    for name, assertion in by_file.items():
        ds = pydicom.dcmread(folder / name)
        text = assertion["assert"]
        if "quarantine:" in text:
            reason = text.split("quarantine:")[1].split()[0].rstrip(".")
            with pytest.raises(NormalisationError) as err:
                decode(ds)
            assert err.value.reason == reason
            assert "TAMSIN" not in str(err.value)  # no header PHI in the quarantine detail
        else:
            np.testing.assert_array_equal(decode(ds), np.array(assertion["expected_pixels"], dtype=np.float32))
    assert set(by_file) == {"short_pixel_element.dcm", "file_truncated_mid_pixels.dcm", "odd_size_8bit_padded.dcm"}


def test_f17_signed_12bit_sign_extended_high_bits_ignored(cases):
    folder, case = _files(cases, "F17")
    expected = np.array(case["assertions"][0]["expected_pixels"], dtype=np.float32)
    ds = pydicom.dcmread(folder / "signed12.dcm")
    np.testing.assert_array_equal(decode(ds), expected)
    # the same values reach the volume path (MR, one slice): percentile scaling of exactly these values
    vol = np.load(io.BytesIO(normalise_volume([ds], CFG)["payload"]))
    nonzero = expected[expected != 0]
    lo, hi = np.percentile(nonzero, [1, 99])
    np.testing.assert_allclose(vol[0], (np.clip(expected, lo, hi) - lo) / (hi - lo), atol=1e-6)


def test_f19_monochrome1_inverted_after_windowing(cases):
    folder, case = _files(cases, "F19")
    spots = case["assertions"][0]
    ds = pydicom.dcmread(folder / "dx_mono1.dcm")
    scale = 2  # the configured size has a 16-pixel minimum: the 8 x 8 image is doubled
    cfg = NormalisationConfig(image_size=(ds.Rows * scale, ds.Columns * scale), png_bit_depth=16)
    out = np.array(Image.open(io.BytesIO(normalise_2d(ds, cfg)["payload"])))
    (r0, c0), (r1, c1) = spots["expected_min_at"], spots["expected_max_at"]
    assert out.max() > out.min()
    assert out[r0 * scale : (r0 + 1) * scale, c0 * scale : (c0 + 1) * scale].min() == out.min() == 0
    assert out[r1 * scale : (r1 + 1) * scale, c1 * scale : (c1 + 1) * scale].max() == out.max() == 65535
    stored = decode(ds)
    assert stored[tuple(spots["expected_max_at"])] == 0 and stored[tuple(spots["expected_min_at"])] == 4095
    # exact complement of the MONOCHROME2 copy: inversion after the window, once
    ds2 = pydicom.dcmread(folder / "dx_mono1.dcm")
    ds2.PhotometricInterpretation = "MONOCHROME2"
    out2 = np.array(Image.open(io.BytesIO(normalise_2d(ds2, cfg)["payload"])))
    total = out.astype(np.int64) + out2.astype(np.int64)
    assert np.abs(total - 65535).max() <= 1  # complement up to rounding to 16 bits
    steps = [s["step"] for s in json.loads(normalise_2d(ds, cfg)["recipe"])["steps"]]
    assert steps.index("voi") < steps.index("invert") and steps.count("invert") == 1
    assert decode_image(ds).photometric == "MONOCHROME1"


def test_f20_sorted_by_position_exact_duplicate_dropped(cases):
    folder, case = _files(cases, "F20")
    values = case["assertions"][0]["expected_slice_values"]
    datasets = [pydicom.dcmread(folder / name) for name in case["files"]]
    out = normalise_volume(datasets, CFG)
    slope, intercept = float(datasets[0].RescaleSlope), float(datasets[0].RescaleIntercept)
    vol = np.load(io.BytesIO(out["payload"]))
    assert out["shape"] == [4, 4, 4] and out["spacing_mm"][2] == pytest.approx(2.5)
    for k, v in enumerate(values):
        np.testing.assert_array_equal(vol[k], np.float32(np.clip(v * slope + intercept, *CFG.ct_hu_window)))
    recipe = json.loads(out["recipe"])
    dedupe = next(s for s in recipe["steps"] if s["step"] == "dedupe")
    assert dedupe["warnings"] == [{"warning": "duplicate_slice_position", "dropped": 1, "identical_pixels": True}]
    assert out["origin_mm"] == [-100.0, -100.0, 0.0]
    # the same duplicate with different pixels is quarantined
    dup = next(d for d in datasets if d.InstanceNumber == 5)
    arr = dup.pixel_array.copy()
    arr[0, 0] += 1
    dup.PixelData = arr.tobytes()
    with pytest.raises(NormalisationError) as err:
        normalise_volume(datasets, CFG)
    assert err.value.reason == "duplicate_slice_position"
