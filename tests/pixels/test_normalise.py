"""Tests for etl.pixels.decode / etl.pixels.normalise on real DICOM files.

Sources: pydicom's bundled test files (always present with pydicom) and the public collection under
../shared/data/dicom and ../shared/data/dicom-edge (skipped cleanly when absent); the latter are
selected through their MANIFEST.csv (modality, transfer syntax, photometric interpretation).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import random
from pathlib import Path

import numpy as np
import pydicom
import pytest
from PIL import Image
from pydicom.data import get_testdata_file
from pydicom.encaps import encapsulate

from etl.pixels.decode import decode_image
from etl.pixels.normalise import (
    NormalisationError,
    decode,
    image_kind,
    load_payload,
    normalise_2d,
    normalise_volume,
)
from schemas.config import PROJECT_ROOT, NormalisationConfig

DATA = PROJECT_ROOT.parent / "shared" / "data"
DICOM = DATA / "dicom"
EDGE = DATA / "dicom-edge"
needs_data = pytest.mark.skipif(not (DICOM / "MANIFEST.csv").is_file(), reason="shared DICOM data absent")

# pydicom warns when it reads a truncated file; the tests assert what normalisation makes of it
pytestmark = pytest.mark.filterwarnings("ignore:End of file reached before delimiter:UserWarning")


def bundled(name: str) -> str:
    """A pydicom bundled test file; never downloads (a download would hang offline)."""
    path = get_testdata_file(name, download=False)
    if path is None:
        pytest.skip(f"pydicom test file {name} not installed")
    return str(path)


def read(path: str | Path) -> pydicom.Dataset:
    return pydicom.dcmread(str(path))


def manifest(root: Path) -> list[dict[str, str]]:
    with open(root / "MANIFEST.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def ct5n() -> list[pydicom.Dataset]:
    """The 5-slice axial CT series of pydicom's dicomdirtests (98892001/CT5N)."""
    folder = Path(bundled("CT_small.dcm")).parent / "dicomdirtests" / "98892001" / "CT5N"
    return [read(p) for p in sorted(folder.iterdir())]


def raw_stored(ds: pydicom.Dataset) -> np.ndarray:
    """Stored values read straight from the native PixelData bytes (independent of pydicom's decoder)."""
    assert ds.BitsAllocated == 16 and ds.SamplesPerPixel == 1
    dtype = np.dtype("<i2" if ds.PixelRepresentation == 1 else "<u2")
    n = ds.Rows * ds.Columns
    return np.frombuffer(ds.PixelData[: 2 * n], dtype=dtype).reshape(ds.Rows, ds.Columns)


CFG = NormalisationConfig()


# ------------------------------------------------------------------------------------------- decode


def test_ct_small_hu_equals_stored_times_slope_plus_intercept():
    ds = read(bundled("CT_small.dcm"))
    hu = decode(ds)
    stored = raw_stored(ds)
    slope, intercept = float(ds.RescaleSlope), float(ds.RescaleIntercept)
    assert hu.dtype == np.float32 and hu.shape == (128, 128)
    for r, c in [(0, 0), (64, 64), (100, 27)]:
        assert hu[r, c] == pytest.approx(stored[r, c] * slope + intercept)
    np.testing.assert_array_equal(hu, (stored.astype(np.float64) * slope + intercept).astype(np.float32))


@pytest.mark.parametrize("name", ["MR_small_RLE.dcm", "MR_small_jp2klossless.dcm", "MR_small_jpeg_ls_lossless.dcm"])
def test_lossless_codecs_decode_to_the_uncompressed_values(name):
    reference = decode(read(bundled("MR_small.dcm")))
    np.testing.assert_array_equal(decode(read(bundled(name))), reference)


def test_ybr_full_is_converted_to_rgb_exactly_once():
    rgb = decode(read(bundled("SC_rgb.dcm")))
    ybr = decode_image(read(bundled("SC_ybr_full_uncompressed.dcm")))
    assert ybr.photometric == "RGB" and ybr.array.shape == (100, 100, 3)
    conversions = [s for s in ybr.steps if s["step"] == "color_space"]
    assert len(conversions) == 1 and conversions[0]["from"] == "YBR_FULL"
    # same picture: only YCbCr rounding apart (a second conversion would be off by ~100)
    diff = np.abs(ybr.array - rgb)
    assert diff.max() <= 8 and diff.mean() < 2
    np.testing.assert_array_equal(ybr.array[0, 0], [254, 0, 0])


@needs_data
def test_wg04_ct1_in_four_lossless_syntaxes_gives_identical_hu():
    names = ["wg04_CT1_RLE_ge.dcm", "wg04_CT1_JLSL_ge.dcm", "wg04_CT1_J2KR_ge.dcm", "wg04_CT1_JPLL_ge.dcm"]
    rows = {r["file"]: r for r in manifest(DICOM)}
    syntaxes = {rows[f"chest-ct/{n}"]["transfer_syntax"] for n in names}
    assert len(syntaxes) == 4  # RLE, JPEG-LS, JPEG 2000, JPEG lossless
    arrays = [decode(read(DICOM / "chest-ct" / n)) for n in names]
    for arr in arrays[1:]:
        np.testing.assert_array_equal(arr, arrays[0])
    ds = read(DICOM / "chest-ct" / names[0])
    hu = ds.pixel_array.astype(np.float64) * float(ds.RescaleSlope) + float(ds.RescaleIntercept)
    np.testing.assert_array_equal(arrays[0], hu.astype(np.float32))  # HU, not stored values


@needs_data
def test_same_mr_image_in_nine_transfer_syntaxes_decodes_identically():
    folder = DICOM / "mr" / "dcm_qa_ts_siemens_same_image_9_transfer_syntaxes"
    rows = [r for r in manifest(DICOM) if r["file"].startswith(folder.name, len("mr/"))]
    assert len({r["transfer_syntax"] for r in rows}) >= 6
    reference = decode(read(DICOM / rows[0]["file"]))
    for r in rows[1:]:
        np.testing.assert_array_equal(decode(read(DICOM / r["file"])), reference, err_msg=r["transfer_syntax"])


def test_decode_one_frame_equals_that_frame_of_all_frames():
    ds = read(bundled("emri_small_RLE.dcm"))
    every = decode(ds)
    assert every.shape == (10, 64, 64)
    np.testing.assert_array_equal(decode(ds, frame=7), every[7])


# ------------------------------------------------------------------------------------------- errors


@needs_data
@pytest.mark.parametrize(
    "name",
    [
        "derived_truncated_mid_pixeldata.dcm",
        "derived_truncated_mid_header.dcm",
        "pydicom_emri_small_j2k_too_short.dcm",
    ],
)
def test_truncated_edge_files_raise_truncated_file(name):
    with pytest.raises(NormalisationError) as err:
        decode(read(EDGE / "truncated-or-bad-length" / name))
    assert err.value.reason == "truncated_file"


@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.99])
def test_native_file_cut_inside_pixel_data_is_truncated_not_mismatch(tmp_path, fraction):
    raw = Path(bundled("CT_small.dcm")).read_bytes()
    cut = raw[: int(len(raw) * fraction)]
    path = tmp_path / "DOE^JANE_19700101.dcm"  # a path that names a patient must not leak
    path.write_bytes(cut)
    for source in (path, io.BytesIO(cut)):
        with pytest.raises(NormalisationError) as err:
            decode(pydicom.dcmread(source))
        assert err.value.reason == "truncated_file"
        assert "DOE" not in str(err.value) and str(tmp_path) not in str(err.value)


def test_header_that_disagrees_with_pixel_data_is_a_length_mismatch():
    ds = read(bundled("CT_small.dcm"))
    ds.Rows = ds.Rows + 1
    with pytest.raises(NormalisationError) as err:
        decode(ds)
    assert err.value.reason == "pixel_data_length_mismatch"
    assert "32768" in str(err.value) and str(129 * 128 * 2) in str(err.value)


@needs_data
@pytest.mark.parametrize("name", ["orthanc_oob_monochrome_46341.dcm", "orthanc_oob_monochrome_65535.dcm"])
def test_out_of_bounds_dimensions_are_a_length_mismatch(name):
    with pytest.raises(NormalisationError) as err:
        decode(read(EDGE / "truncated-or-bad-length" / name))
    assert err.value.reason == "pixel_data_length_mismatch"


@needs_data
def test_odd_length_padding_byte_is_allowed():
    ds = read(EDGE / "truncated-or-bad-length" / "fodicom_1403_odd_length_OB.dcm")
    assert len(ds.PixelData) == 28  # 3 x 3 x 3 bytes + 1 pad byte
    arr = decode(ds)
    assert arr.shape == (3, 3, 3)
    np.testing.assert_array_equal(arr.ravel(), np.frombuffer(ds.PixelData[:27], dtype=np.uint8))


def test_unsupported_transfer_syntax_is_named():
    ds = read(bundled("CT_small.dcm"))
    ds.file_meta.TransferSyntaxUID = "1.2.840.10008.1.2.4.102"  # MPEG-4 AVC/H.264: no decoder
    with pytest.raises(NormalisationError) as err:
        decode(ds)
    assert err.value.reason == "unsupported_transfer_syntax"
    assert "MPEG-4" in str(err.value) and "1.2.840.10008.1.2.4.102" in str(err.value)


def test_corrupt_codestream_is_refused():
    ds = read(bundled("MR_small_jpeg_ls_lossless.dcm"))
    ds.PixelData = encapsulate([b"\xff\xd8\xff\xf7" + bytes(range(256)) * 4])
    with pytest.raises(NormalisationError) as err:
        decode(ds)
    # its SOF55 reads 772 x 1286 for a 64 x 64 image: refused before decoding (etl.pixels.contained.preflight)
    assert err.value.reason == "declared_size_mismatch"


@needs_data
def test_object_without_pixels_is_kind_none_and_raises_no_pixel_data():
    srs = [r for r in manifest(DICOM) if r["modality"] == "SR"]
    assert srs
    for r in srs:
        ds = read(DICOM / r["file"])
        assert image_kind(ds) == "none"
        with pytest.raises(NormalisationError) as err:
            normalise_2d(ds, CFG)
        assert err.value.reason == "no_pixel_data"


def test_error_reason_codes_are_checked():
    with pytest.raises(ValueError):
        NormalisationError("not_a_reason", "x")


# -------------------------------------------------------------------------------------------- kinds


@needs_data
def test_image_kind_by_modality_and_type():
    expect = {
        "chest-cr-dx/wg04_RG1_UNCR_cr_chest_philips_uncompressed.dcm": "2d",
        "us/wg04_US1_RLE_ge_rgb.dcm": "2d",
        "chest-ct/lctsc_rt/CT01.dcm": "3d_slice",
        "mr/wg04_MR4_RLE.dcm": "3d_slice",
        "ct-other/fodicom_GH342_philips_ct_surview.dcm": "2d",  # CT LOCALIZER: a projection
        "sr-seg-other/highdicom_seg_on_cr.dcm": "none",  # SEG has PixelData but is no image
        "chest-ct/lctsc_rt/RT.dcm": "none",
    }
    for path, kind in expect.items():
        assert image_kind(pydicom.dcmread(DICOM / path, stop_before_pixels=False)) == kind, path


# ----------------------------------------------------------------------------------------------- 2D


def test_window_from_file_is_applied_exactly():
    """CT_small has no window: set one and check each output pixel against PS3.3 C.11.2.1.2.1."""
    ds = read(bundled("CT_small.dcm"))
    ds.WindowCenter, ds.WindowWidth = 40, 400
    cfg = NormalisationConfig(image_size=(128, 128))  # same size: no resampling
    out = normalise_2d(ds, cfg)
    png = load_payload(out["payload"], "png")
    hu = raw_stored(ds).astype(np.float64) * float(ds.RescaleSlope) + float(ds.RescaleIntercept)
    c, w = 40 - 0.5, 400 - 1
    unit = np.clip((hu - c) / w + 0.5, 0, 1)
    np.testing.assert_array_equal(png, np.rint(unit * 255).astype(np.uint8))
    voi = [s for s in json.loads(out["recipe"])["steps"] if s["step"] == "voi"][0]
    assert voi["window_center"] == 40 and voi["window_width"] == 400


def test_percentile_window_when_file_has_none():
    ds = read(bundled("CT_small.dcm"))
    assert "WindowCenter" not in ds and "VOILUTSequence" not in ds
    out = normalise_2d(ds, NormalisationConfig(image_size=(128, 128)))
    png = load_payload(out["payload"], "png").astype(np.float64)
    hu = decode(ds)
    lo, hi = np.percentile(hu, [0.5, 99.5])
    np.testing.assert_allclose(png, np.rint(np.clip((hu - lo) / (hi - lo), 0, 1) * 255), atol=1)
    voi = [s for s in json.loads(out["recipe"])["steps"] if s["step"] == "voi"][0]
    assert voi["percentile"] == [0.5, 99.5] and voi["low"] == pytest.approx(lo)


@needs_data
def test_monochrome1_is_inverted_once():
    ds1 = read(DICOM / "chest-cr-dx" / "highdicom_dx_image_thorax_fuji.dcm")
    assert ds1.PhotometricInterpretation == "MONOCHROME1"
    ds2 = read(DICOM / "chest-cr-dx" / "highdicom_dx_image_thorax_fuji.dcm")
    ds2.PhotometricInterpretation = "MONOCHROME2"
    cfg = NormalisationConfig(image_size=(169, 211))
    a1 = load_payload(normalise_2d(ds1, cfg)["payload"], "png").astype(int)
    a2 = load_payload(normalise_2d(ds2, cfg)["payload"], "png").astype(int)
    assert abs(a1.mean() - (255 - a2.mean())) < 0.5
    assert np.abs(a1 + a2 - 255).max() <= 1
    steps = [s["step"] for s in json.loads(normalise_2d(ds1, cfg)["recipe"])["steps"]]
    assert steps.count("invert") == 1 and steps.index("invert") > steps.index("voi")


@needs_data
def test_monochrome1_chest_radiographs_show_dark_lungs():
    """After inversion a chest PA shows lungs (lateral thirds, mid height) darker than the spine."""
    chests = [
        r for r in manifest(DICOM) if r["file"].startswith("chest-cr-dx/wg04_RG1") and r["photometric"] == "MONOCHROME1"
    ]
    assert chests, "no MONOCHROME1 chest radiograph (chest-cr-dx/wg04_RG1*) in the shared manifest"
    for r in chests:
        out = normalise_2d(read(DICOM / r["file"]), NormalisationConfig(image_size=(256, 256)))
        img = load_payload(out["payload"], "png").astype(float)
        lungs = np.r_[img[90:150, 50:90].ravel(), img[90:150, 170:210].ravel()].mean()
        spine = img[90:150, 118:138].mean()
        assert lungs < spine, r["file"]


@pytest.mark.parametrize("size", [(64, 96), (300, 200)])
def test_png_has_configured_size_and_aspect_padding(size):
    ds = read(bundled("CT_small.dcm"))  # 128 x 128
    out = normalise_2d(ds, NormalisationConfig(image_size=size))
    png = Image.open(io.BytesIO(out["payload"]))
    assert png.format == "PNG" and png.mode == "L" and png.size == (size[1], size[0])
    assert (out["rows"], out["cols"], out["n_slices"]) == (size[0], size[1], 1)
    arr = np.array(png)
    side = min(size)
    resize = [s for s in json.loads(out["recipe"])["steps"] if s["step"] == "resize"][0]
    assert resize["from"] == [128, 128] and resize["to"] == [side, side]
    pad = resize["pad"]
    assert pad["top"] + pad["bottom"] == size[0] - side and pad["left"] + pad["right"] == size[1] - side
    if pad["left"]:
        assert arr[:, : pad["left"]].max() == 0
    if pad["top"]:
        assert arr[: pad["top"]].max() == 0


def test_no_keep_aspect_stretches_without_padding():
    out = normalise_2d(read(bundled("CT_small.dcm")), NormalisationConfig(image_size=(64, 96), keep_aspect=False))
    resize = [s for s in json.loads(out["recipe"])["steps"] if s["step"] == "resize"][0]
    assert resize["to"] == [64, 96] and resize["pad"]["left"] == 0 and resize["pad"]["top"] == 0


def test_sixteen_bit_png():
    ds = read(bundled("CT_small.dcm"))
    out = normalise_2d(ds, NormalisationConfig(image_size=(128, 128), png_bit_depth=16))
    arr = load_payload(out["payload"], "png")
    assert arr.dtype == np.uint16 and arr.shape == (128, 128)
    assert arr.max() == 65535 and arr.min() == 0
    eight = load_payload(normalise_2d(ds, NormalisationConfig(image_size=(128, 128)))["payload"], "png")
    assert np.abs(arr / 257.0 - eight).max() <= 1


@needs_data
def test_every_2d_manifest_image_normalises_or_fails_with_a_reason():
    cfg = NormalisationConfig(image_size=(64, 64))
    done = 0
    for r in manifest(DICOM):
        if r["modality"] not in {"CR", "DX", "MG", "US", "XA", "RF"} or r["file"].startswith("us/orthanc_hp"):
            continue
        ds = read(DICOM / r["file"])
        try:
            out = normalise_2d(ds, cfg)
        except NormalisationError as err:
            # 12-bit JPEG Extended is beyond the installed plugins (Pillow decodes 8-bit only)
            assert err.reason == "decode_error" and r["transfer_syntax"] == "1.2.840.10008.1.2.4.51", r["file"]
            continue
        arr = load_payload(out["payload"], "png")
        colour = r["photometric"] not in ("MONOCHROME1", "MONOCHROME2")
        assert arr.shape == ((64, 64, 3) if colour else (64, 64)), r["file"]
        assert out["payload_sha256"] == hashlib.sha256(out["payload"]).hexdigest()
        done += 1
    assert done >= 15


@needs_data
def test_us_cine_takes_the_middle_frame():
    ds = read(DICOM / "us" / "orthanc_hp_us_multiframe_jpeg.dcm")
    assert int(ds.NumberOfFrames) == 34
    cfg = NormalisationConfig(image_size=(430, 480))  # the frame's own size: no resampling
    out = normalise_2d(ds, cfg)
    step = json.loads(out["recipe"])["steps"][0]
    assert step["frame"] == 17 and step["n_frames"] == 34
    png = load_payload(out["payload"], "png")
    assert png.shape == (430, 480, 3)
    np.testing.assert_array_equal(png, np.clip(np.rint(decode(ds, frame=17)), 0, 255).astype(np.uint8))


@needs_data
def test_palette_colour_ultrasound_becomes_rgb():
    ds = read(DICOM / "us" / "orthanc_philips_us_implicit_palette.dcm")
    decoded = decode_image(ds)
    assert decoded.photometric == "RGB" and decoded.array.shape == (600, 800, 3)
    lut = np.frombuffer(
        ds.RedPaletteColorLookupTableData,
        dtype="<u2" if ds.RedPaletteColorLookupTableDescriptor[2] == 16 else "u1",
    )
    first = int(ds.RedPaletteColorLookupTableDescriptor[1])
    index = int(ds.pixel_array[300, 400])
    assert decoded.array[300, 400, 0] == lut[max(index - first, 0)]


@needs_data
def test_view_and_spacing():
    cr = read(DICOM / "chest-cr-dx" / "wg04_RG1_UNCR_cr_chest_philips_uncompressed.dcm")
    assert normalise_2d(cr, NormalisationConfig(image_size=(64, 64)))["view"] == "PA"
    cr.ViewPosition = "LL"
    assert normalise_2d(cr, NormalisationConfig(image_size=(64, 64)))["view"] == "LATERAL"
    mg = read(DICOM / "mg" / "fodicom_GH133_ge_mammo_jpegll.dcm")
    out = normalise_2d(mg, NormalisationConfig(image_size=(64, 64)))
    assert out["view"] == str(mg.ViewCodeSequence[0].CodeMeaning)
    assert out["spacing_mm"] == pytest.approx([float(v) for v in mg.get("PixelSpacing") or mg.ImagerPixelSpacing])
    dx = read(DICOM / "chest-cr-dx" / "highdicom_dx_image_thorax_fuji.dcm")
    del dx.PixelSpacing
    assert normalise_2d(dx, NormalisationConfig(image_size=(64, 64)))["spacing_mm"] == pytest.approx(
        [float(v) for v in dx.ImagerPixelSpacing]
    )


def test_2d_is_deterministic_and_recipe_is_canonical():
    ds = read(bundled("CT_small.dcm"))
    a = normalise_2d(ds, CFG)
    b = normalise_2d(read(bundled("CT_small.dcm")), CFG)
    assert a["payload"] == b["payload"] and a["payload_sha256"] == b["payload_sha256"]
    recipe = json.loads(a["recipe"])
    assert a["recipe"] == json.dumps(recipe, sort_keys=True, separators=(",", ":"))
    lut = [s for s in recipe["steps"] if s["step"] == "modality_lut"][0]
    assert lut == {
        "step": "modality_lut",
        "slope": float(ds.RescaleSlope),
        "intercept": float(ds.RescaleIntercept),
    }


# ----------------------------------------------------------------------------------------------- 3D


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def test_ct_volume_sorted_along_normal_with_spacing_and_roundtrip():
    datasets = ct5n()
    out = normalise_volume(datasets, CFG)
    vol = load_payload(out["payload"], "npy")
    assert vol.dtype == np.float32 and vol.shape == (5, 16, 16) == (out["n_slices"], out["rows"], out["cols"])
    # normal of [1,0,0, 0,1,0] is +z: ascending z = descending InstanceNumber here
    by_z = sorted(datasets, key=lambda d: float(d.ImagePositionPatient[2]))
    lo, hi = CFG.ct_hu_window
    for k, ds in enumerate(by_z):
        hu = raw_stored(ds).astype(np.float64) * float(ds.RescaleSlope) + float(ds.RescaleIntercept)
        np.testing.assert_array_equal(vol[k], np.clip(hu, lo, hi).astype(np.float32))
    assert out["spacing_mm"] == pytest.approx([0.488281, 0.488281, 2.5])
    assert out["orientation"] == "AXIAL" and out["payload_format"] == "npy"
    assert out["payload"] == _npy_bytes(vol)  # exactly numpy.save of the volume: nothing else in the payload


def test_volume_bytes_are_deterministic_whatever_the_input_order():
    datasets = ct5n()
    first = normalise_volume(datasets, CFG)
    shuffled = datasets[:]
    random.Random(7).shuffle(shuffled)
    again = normalise_volume(shuffled, CFG)
    assert first["payload"] == again["payload"] and first["recipe"] == again["recipe"]
    # the payload is numpy.save of the volume alone: no timestamps or member records to vary
    assert first["payload"] == _npy_bytes(load_payload(first["payload"], "npy"))


def test_volume_falls_back_to_instance_number():
    datasets = ct5n()
    for ds in datasets:
        del ds.ImagePositionPatient
    out = normalise_volume(datasets, CFG)
    assert json.loads(out["recipe"])["steps"][0]["by"] == "InstanceNumber"
    vol = load_payload(out["payload"], "npy")
    first = min(datasets, key=lambda d: int(d.InstanceNumber))
    np.testing.assert_array_equal(vol[0], np.clip(decode(first), *CFG.ct_hu_window))
    assert out["spacing_mm"][2] == pytest.approx(float(first.SliceThickness))


def test_slices_that_do_not_stack_are_inconsistent():
    folder = Path(bundled("CT_small.dcm")).parent / "dicomdirtests" / "98892001" / "CT2N"
    with pytest.raises(NormalisationError) as err:  # two slices, different orientations
        normalise_volume([read(p) for p in sorted(folder.iterdir())], CFG)
    assert err.value.reason == "inconsistent_series"
    datasets = ct5n()
    datasets[3].ImagePositionPatient = datasets[1].ImagePositionPatient
    with pytest.raises(NormalisationError) as err:  # one position, different pixels
        normalise_volume(datasets, CFG)
    assert err.value.reason == "duplicate_slice_position"


def test_slice_unlike_the_majority_is_excluded_and_listed():
    datasets = ct5n()
    datasets[2] = read(bundled("CT_small.dcm"))  # 128 x 128 among 16 x 16
    out = normalise_volume(datasets, CFG)
    assert out["excluded"] == [{"index": 2, "frame": None, "why": "Rows/Columns unlike the series"}]
    steps = json.loads(out["recipe"])["steps"]
    assert steps[0] == {"step": "exclude", "slices": out["excluded"]}
    kept = sorted((d for i, d in enumerate(ct5n()) if i != 2), key=lambda d: float(d.ImagePositionPatient[2]))
    z = [float(d.ImagePositionPatient[2]) for d in kept]
    geometry = next(s for s in steps if s["step"] == "geometry")
    if max(np.diff(z)) > 1.5 * np.median(np.diff(z)):  # the excluded slice was inside: a gap, interpolated
        assert geometry["missing_slices"] == 1 and not geometry["uniform"]
        assert out["n_slices"] == 5 and out["shape"] == [5, 16, 16]
        vol = load_payload(out["payload"], "npy")
        gap = int(np.argmax(np.diff(z)))
        hu = [np.clip(decode(d), *CFG.ct_hu_window) for d in kept]
        np.testing.assert_allclose(vol[gap + 1], (hu[gap] + hu[gap + 1]) / 2, rtol=0, atol=1e-3)
    else:
        assert geometry["missing_slices"] == 0 and out["n_slices"] == 4


def test_volume_too_large_is_refused_before_decoding():
    cfg = NormalisationConfig(volume_max_voxels=5 * 16 * 16 - 1)
    with pytest.raises(NormalisationError) as err:
        normalise_volume(ct5n(), cfg)
    assert err.value.reason == "volume_too_large"
    assert normalise_volume(ct5n(), NormalisationConfig(volume_max_voxels=5 * 16 * 16))["n_slices"] == 5


def test_volume_rejects_non_ct_mr():
    ds = read(bundled("CT_small.dcm"))
    ds.Modality = "PT"
    with pytest.raises(NormalisationError) as err:
        normalise_volume([ds], CFG)
    assert err.value.reason == "unsupported_modality"


@needs_data
def test_mr_series_is_clipped_to_nonzero_percentiles_and_scaled():
    series = sorted((DICOM / "mr" / "dcm_qa_nih_ge_study_4_series" / "mr_0004").iterdir())
    datasets = [read(p) for p in series]
    out = normalise_volume(datasets, CFG)
    vol = load_payload(out["payload"], "npy")
    assert vol.shape == (len(datasets), 64, 64)
    stacked = np.stack([decode(d) for d in sorted(datasets, key=lambda d: float(d.ImagePositionPatient[2]))])
    lo, hi = np.percentile(stacked[stacked != 0], [1, 99])
    np.testing.assert_allclose(vol, (np.clip(stacked, lo, hi) - lo) / (hi - lo), atol=1e-6)
    assert vol.min() == 0.0 and vol.max() == 1.0
    assert out["spacing_mm"] == pytest.approx([3.75, 3.75, 5.0])  # 5 mm between positions, 3 mm thick
    assert out["orientation"] == "AXIAL"


@needs_data
def test_enhanced_ct_uses_functional_group_geometry_and_rescale():
    ds = read(DICOM / "ct-other" / "pydicom_eCT_Supplemental_enhanced_ct.dcm")
    assert "RescaleSlope" not in ds  # only in the Shared Functional Groups
    out = normalise_volume([ds], CFG)
    vol = load_payload(out["payload"], "npy")
    assert vol.shape == (2, 512, 512)
    shared = ds.SharedFunctionalGroupsSequence[0]
    pvt = shared.PixelValueTransformationSequence[0]
    stored = ds.pixel_array.astype(np.float64)
    hu = stored * float(pvt.RescaleSlope) + float(pvt.RescaleIntercept)
    iop = np.array([float(v) for v in shared.PlaneOrientationSequence[0].ImageOrientationPatient])
    normal = np.cross(iop[:3], iop[3:])  # (0, 0, -1) here: the frame with the larger z comes first
    along = [
        float(np.dot([float(v) for v in f.PlanePositionSequence[0].ImagePositionPatient], normal))
        for f in ds.PerFrameFunctionalGroupsSequence
    ]
    order = np.argsort(along)
    assert list(order) == [1, 0]
    np.testing.assert_array_equal(vol, np.clip(hu[order], *CFG.ct_hu_window).astype(np.float32))
    spacing = [float(v) for v in shared.PixelMeasuresSequence[0].PixelSpacing]
    assert out["spacing_mm"][:2] == pytest.approx(spacing)


def test_load_payload_rejects_unknown_or_wrong_format():
    with pytest.raises(ValueError):
        load_payload(b"abc", "tiff")
    with pytest.raises(ValueError):
        load_payload(b"not a png", "png")
    with pytest.raises(ValueError):
        load_payload(b"not a zip", "npz")
    with pytest.raises(ValueError):
        load_payload(b"not an npy", "npy")
