"""Enhanced multi-frame CT/MR objects become one volume with every frame, and Siemens MOSAIC tile sheets are
quarantined (issue 22, items 3 and 4): checked against SimpleITK (GDCM) and a per-frame computation from
the functional groups, on the shared data, and through the de-identify and normalise stages."""

from __future__ import annotations

import io
import json
import shutil
import warnings

import numpy as np
import polars as pl
import pydicom
import pytest

from etl.deid.dicom import deidentify_dataset
from etl.pixels.decode import NormalisationError
from etl.pixels.mosaic import is_mosaic
from etl.pixels.normalise import MR_PERCENTILES, load_payload, normalise_2d, normalise_volume
from schemas.config import NormalisationConfig

pytestmark = pytest.mark.realdata
BRUKER_MR = "mr/fodicom_bruker_mr_multiframe.dcm"
ENHANCED_CT = "ct-other/pydicom_eCT_Supplemental_enhanced_ct.dcm"
MOSAIC = "mr/dcm_qa_nih_siemens_study_4_series/mr_0003/epi_pe_ap-00001.dcm"


def _read(data):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pydicom.dcmread(io.BytesIO(data) if isinstance(data, bytes) else data, force=True)


def _per_frame(ds: pydicom.Dataset, keyword_seq: str, keyword: str, f: int):
    item = ds.PerFrameFunctionalGroupsSequence[f]
    if keyword_seq in item:
        return item[keyword_seq][0][keyword].value
    return ds.SharedFunctionalGroupsSequence[0][keyword_seq][0][keyword].value


def _expected(ds: pydicom.Dataset) -> dict:
    """The volume computed frame by frame from the functional groups (PS3.3 C.7.6.16.2)."""
    n = int(ds.NumberOfFrames)
    pos = np.array(
        [[float(v) for v in _per_frame(ds, "PlanePositionSequence", "ImagePositionPatient", f)] for f in range(n)]
    )
    ori = np.array(
        [[float(v) for v in _per_frame(ds, "PlaneOrientationSequence", "ImageOrientationPatient", f)] for f in range(n)]
    )
    assert np.allclose(ori, ori[0])
    normal = np.cross(ori[0][:3], ori[0][3:])
    order = np.argsort(pos @ normal)
    pixels = ds.pixel_array.astype(np.float64)
    frames = []
    for f in order:
        slope = float(_per_frame(ds, "PixelValueTransformationSequence", "RescaleSlope", f))
        intercept = float(_per_frame(ds, "PixelValueTransformationSequence", "RescaleIntercept", f))
        frames.append(pixels[f] * slope + intercept)
    spacing = [float(v) for v in _per_frame(ds, "PixelMeasuresSequence", "PixelSpacing", 0)]
    steps = np.diff((pos @ normal)[order])
    return {
        "volume": np.stack(frames),
        "origin": pos[order[0]],
        "spacing": [*spacing, float(np.median(steps))],
        "direction": np.column_stack([ori[0][:3], ori[0][3:], normal]).reshape(-1),
    }


def _intensity(volume: np.ndarray, modality: str) -> np.ndarray:
    if modality == "CT":
        return np.clip(volume, -1000.0, 1000.0)
    lo, hi = np.percentile(volume[volume != 0], MR_PERCENTILES)
    return (np.clip(volume, lo, hi) - lo) / (hi - lo)


@pytest.mark.parametrize("name, n_frames, deidentified", [(BRUKER_MR, 4, True), (ENHANCED_CT, 2, False)])
def test_enhanced_multiframe_is_one_volume_of_every_frame(shared_data, key, name, n_frames, deidentified):
    """The Bruker MR is checked after de-identification (the functional groups survive it); the enhanced CT
    sample is quarantined by de-identification (verification_failed), so its source is normalised."""
    import SimpleITK as sitk

    src = shared_data / "dicom" / name
    out = _read(deidentify_dataset(_read(src), key, "shared").to_bytes()) if deidentified else _read(src)
    res = normalise_volume([out], NormalisationConfig())
    exp = _expected(_read(src))
    assert res["kind"] == "3d" and res["n_slices"] == n_frames
    assert res["shape"] == [n_frames, int(out.Rows), int(out.Columns)]
    np.testing.assert_allclose(res["spacing_mm"], exp["spacing"], rtol=0, atol=1e-9)
    np.testing.assert_allclose(res["origin_mm"], exp["origin"], rtol=0, atol=1e-9)
    np.testing.assert_allclose(res["direction"], exp["direction"], rtol=0, atol=1e-12)
    volume = load_payload(res["payload"], res["payload_format"])
    np.testing.assert_allclose(volume, _intensity(exp["volume"], str(out.Modality)), rtol=0, atol=1e-5)
    # SimpleITK (GDCM) reads the same grid and voxels from the source file (its slice axis may point the
    # other way, frames in file order: compared slice by slice at the same physical positions)
    image = sitk.ReadImage(str(src))
    assert image.GetSize() == (int(out.Columns), int(out.Rows), n_frames)
    sx, sy, sz = image.GetSpacing()
    np.testing.assert_allclose(res["spacing_mm"], [sy, sx, sz], rtol=0, atol=1e-6)
    d_ours, d_sitk = np.array(res["direction"]).reshape(3, 3), np.array(image.GetDirection()).reshape(3, 3)
    np.testing.assert_allclose(d_ours[:, :2], d_sitk[:, :2], rtol=0, atol=1e-9)
    sitk_pos = np.array(image.GetOrigin()) + np.outer(np.arange(n_frames) * sz, d_sitk[:, 2])
    order = np.argsort(sitk_pos @ d_ours[:, 2])
    ours_pos = np.array(res["origin_mm"]) + np.outer(np.arange(n_frames) * res["spacing_mm"][2], d_ours[:, 2])
    np.testing.assert_allclose(ours_pos, sitk_pos[order], rtol=0, atol=1e-6)
    ref = sitk.GetArrayFromImage(image).astype(np.float64)[order]
    np.testing.assert_allclose(volume, _intensity(ref, str(out.Modality)), rtol=0, atol=1e-5)


def test_mosaic_detected_and_quarantined(shared_data, key):
    src = _read(shared_data / "dicom" / MOSAIC)
    assert is_mosaic(src) and (0x0029, 0x1010) in src  # the CSA image header holds NumberOfImagesInMosaic
    out = _read(deidentify_dataset(src, key, "shared").to_bytes())
    assert is_mosaic(out)  # ImageType is kept: the tile sheet is recognised after de-identification
    for fn in (
        lambda: normalise_2d(out, NormalisationConfig()),
        lambda: normalise_volume([out], NormalisationConfig()),
    ):
        with pytest.raises(NormalisationError) as err:
            fn()
        assert err.value.reason == "unsupported_mosaic"


@pytest.fixture(scope="module")
def staged(shared_data, tmp_path_factory, key):
    """The Bruker enhanced MR and a MOSAIC through discover -> plan -> de-identify -> normalise."""
    from helpers import run_pixel_stages

    base = tmp_path_factory.mktemp("multiframe")
    source = base / "source"
    for name in (BRUKER_MR, MOSAIC):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shared_data / "dicom" / name, source / name)
    ctx = run_pixel_stages(base, source, "mf", key, run_id="mf-run")
    images = pl.from_arrow(ctx.storage.read_table("curated/images"))
    events = pl.from_arrow(ctx.storage.read_table(ctx.events_path("normalise", 0)))
    return {"images": images, "events": events, "source": source}


def test_stages_keep_every_frame_of_enhanced_objects(staged):
    rows = staged["images"].to_dicts()
    assert len(rows) == 1  # the mosaic has no image
    mr = rows[0]
    assert (mr["modality"], mr["kind"], mr["n_slices"], mr["shape"]) == ("MR", "3d", 4, [4, 128, 256])
    np.testing.assert_allclose(mr["spacing_mm"], [0.2, 0.1, 1.0], rtol=0, atol=1e-9)
    np.testing.assert_allclose(mr["origin_mm"], [-14.0, -9.6, -6.2], rtol=0, atol=1e-9)
    assert "exclude" not in [s["step"] for s in json.loads(mr["recipe"])["steps"]]


def test_stages_quarantine_the_mosaic(staged):
    q = staged["events"].filter(pl.col("status") == "quarantined")
    assert q["reason"].to_list() == ["unsupported_mosaic"]
    assert q["source_uri"].to_list()[0].endswith("epi_pe_ap-00001.dcm")
    assert not any(ch.isdigit() for ch in q["detail"].to_list()[0])  # no value of the file quoted
