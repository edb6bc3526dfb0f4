"""Issue 20 item 1: volumes as content-addressed NIfTI-1 objects, opened by nibabel and SimpleITK.

The pydicom CT5N series (5 axial CT slices) goes through the normaliser (resampled to 0.75 x 0.75 x 1.5 mm and
clipped, as the build does) and :func:`etl.pixels.volume_objects.externalise_volume`; the stored object is
opened with nibabel and with SimpleITK and checked against the pipeline's float32 array: shape, the RAS
affine from the LPS geometry, values (int16 HU within 0.5 HU). The loader reads the new rows and still reads
inline ``.npy`` rows.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pydicom
import pytest
import SimpleITK as sitk
from pydicom.data import get_testdata_file

from etl.pixels.integrity import verify_image_files
from etl.pixels.nifti import decode_nifti, encode_nifti
from etl.pixels.normalise import DEFAULT_CT_SPACING_MM, normalise_volume
from etl.pixels.npy_payload import read_npy
from etl.pixels.series import image_row
from etl.pixels.volume_objects import externalise_volume
from etl.storage import Storage
from medreco_reader.tensors import load_image, to_tensor
from schemas import images as images_schema
from schemas.base import table_from_rows
from schemas.config import NormalisationConfig

LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0])


def _ct5n() -> list[pydicom.Dataset]:
    path = get_testdata_file("CT_small.dcm", download=False)
    if path is None:
        pytest.skip("pydicom test files not installed")
    folder = Path(path).parent / "dicomdirtests" / "98892001" / "CT5N"
    return [pydicom.dcmread(str(p)) for p in sorted(folder.iterdir())]


def _instance(modality: str) -> dict:
    return {
        "series_key": "se1",
        "study_key": "st1",
        "patient_key": "p1",
        "institution": "us-a",
        "modality": modality,
        "transfer_syntax": "1.2.840.10008.1.2.1",
        "shard": 0,
    }


@pytest.fixture(scope="module")
def ct(tmp_path_factory):
    storage = Storage.open(str(tmp_path_factory.mktemp("nifti") / "root"))
    res = normalise_volume(_ct5n(), NormalisationConfig(), target_spacing_mm=DEFAULT_CT_SPACING_MM)
    npy_row = image_row(_instance("CT"), res, "vol1", "3d").row
    array = read_npy(npy_row["payload"])
    row = externalise_volume(storage, npy_row, gzip_level=1)
    return storage, npy_row, row, array


def _expected_affine(row: dict) -> np.ndarray:
    """voxel (i = col, j = row, k = slice) -> RAS mm, from the row's LPS geometry."""
    d = np.asarray(row["direction"], dtype=float).reshape(3, 3)
    row_mm, col_mm, slice_mm = row["spacing_mm"]
    a = np.eye(4)
    a[:3, :3] = LPS_TO_RAS @ d @ np.diag([col_mm, row_mm, slice_mm])
    a[:3, 3] = LPS_TO_RAS @ np.asarray(row["origin_mm"], dtype=float)
    return a


def test_row_points_at_a_content_addressed_object(ct):
    storage, _, row, array = ct
    assert row["payload"] is None and row["payload_format"] == "nifti" and row["dtype"] == "int16"
    assert row["payload_uri"] == f"curated/volumes/{row['payload_sha256']}.nii.gz"
    data = storage.read_bytes(row["payload_uri"])
    assert len(data) == row["payload_bytes"]
    import hashlib

    assert hashlib.sha256(data).hexdigest() == row["payload_sha256"]
    assert row["shape"] == list(array.shape)
    steps = json.loads(row["recipe"])["steps"]
    store = steps[-1]
    assert store["step"] == "store" and store["format"] == "nifti1" and store["max_abs_error_hu"] == 0.5
    assert not [s for s in steps if s["step"] == "encode"]  # the .npy encode step is gone
    # the row fits images schema 2.0 (MAJOR: volumes left the table)
    assert images_schema.SCHEMA.metadata[b"medreco.schema_version"] == b"2.0.0"
    t = table_from_rows([row], images_schema.SCHEMA)
    assert t.column("payload").null_count == 1
    # the same volume again: the same object, not rewritten
    again = externalise_volume(storage, ct[1])
    assert again["payload_sha256"] == row["payload_sha256"]
    assert storage.list_files("curated/volumes") == [row["payload_uri"]]


def test_nibabel_opens_the_object_with_the_pipeline_geometry_and_values(ct):
    storage, _, row, array = ct
    img = nib.load(storage.path(row["payload_uri"]))
    assert img.shape == (array.shape[2], array.shape[1], array.shape[0])  # (x = col, y = row, z = slice)
    assert img.header.get_data_dtype() == np.int16
    np.testing.assert_allclose(img.affine, _expected_affine(row), atol=1e-4)
    data = np.asarray(img.dataobj).transpose(2, 1, 0)
    assert np.abs(data - array).max() <= 0.5
    np.testing.assert_array_equal(data, np.rint(array).astype(np.int16))
    # a voxel by its RAS world position: the same place the LPS geometry names
    k, r, c = (s // 2 for s in array.shape)
    lps = np.asarray(row["origin_mm"]) + np.asarray(row["direction"]).reshape(3, 3) @ (
        np.array([c * row["spacing_mm"][1], r * row["spacing_mm"][0], k * row["spacing_mm"][2]])
    )
    np.testing.assert_allclose(img.affine @ [c, r, k, 1.0], [*(LPS_TO_RAS @ lps), 1.0], atol=1e-3)


def test_simpleitk_opens_the_object_with_the_pipeline_geometry_and_values(ct):
    storage, _, row, array = ct
    img = sitk.ReadImage(storage.path(row["payload_uri"]))
    got = sitk.GetArrayFromImage(img)
    assert got.shape == array.shape and got.dtype == np.int16
    assert np.abs(got - array).max() <= 0.5
    np.testing.assert_allclose(
        img.GetSpacing(), [row["spacing_mm"][1], row["spacing_mm"][0], row["spacing_mm"][2]], atol=1e-5
    )
    np.testing.assert_allclose(img.GetOrigin(), row["origin_mm"], atol=1e-4)
    np.testing.assert_allclose(img.GetDirection(), row["direction"], atol=1e-5)


def test_loader_reads_the_object_and_still_reads_inline_npy(ct):
    storage, npy_row, row, array = ct
    got, meta = load_image(row, storage)
    assert got.dtype == np.int16 and np.abs(got - array).max() <= 0.5
    assert meta["spacing_mm"] == [float(v) for v in row["spacing_mm"]]
    got2, _ = load_image(row, storage.uri)  # a root path (or s3:// URI) works too
    np.testing.assert_array_equal(got, got2)
    tensor = to_tensor(row, storage)
    assert tensor.dtype.is_floating_point and tuple(tensor.shape) == array.shape
    with pytest.raises(ValueError, match="storage root"):
        load_image(row)
    old, _ = load_image(npy_row)  # images schema 1.2: the float32 volume inline
    np.testing.assert_array_equal(old, array)


def test_mr_is_float32_exact_and_decode_roundtrips():
    rng = np.random.default_rng(1)
    vol = rng.random((4, 6, 5), dtype=np.float32)
    obj = encode_nifti(vol, [0.9, 0.8, 3.0], [1.0, 2.0, 3.0], [1, 0, 0, 0, 1, 0, 0, 0, 1], "MR", gzip_level=6)
    assert obj.dtype == "float32" and obj.step["gzip_level"] == 6 and "max_abs_error_hu" not in obj.step
    back, meta = decode_nifti(obj.data)
    np.testing.assert_array_equal(back, vol)
    np.testing.assert_allclose(meta["spacing_mm"], [0.9, 0.8, 3.0], atol=1e-6)
    np.testing.assert_allclose(meta["origin_mm"], [1.0, 2.0, 3.0])
    assert gzip.decompress(obj.data)[344:348] == b"n+1\x00"  # NIfTI-1 single file magic
    # byte-identical for the same input (gzip mtime 0): the name is the content
    assert (
        encode_nifti(vol, [0.9, 0.8, 3.0], [1.0, 2.0, 3.0], [1, 0, 0, 0, 1, 0, 0, 0, 1], "MR", gzip_level=6).sha256
        == obj.sha256
    )


def test_written_objects_are_verified_where_written(ct, tmp_path):
    src, _, row, _ = ct
    storage = Storage.open(str(tmp_path / "root"))  # a copy: the module's object stays intact
    storage.write_bytes(row["payload_uri"], src.read_bytes(row["payload_uri"]))
    rel = "curated/images/institution=us-a/modality=CT/shard=00000.parquet"
    storage.write_table(rel, table_from_rows([row], images_schema.SCHEMA))
    ok = verify_image_files(storage, [rel])
    assert (ok.rows, ok.verified, ok.objects, ok.mismatches) == (1, 1, 1, [])
    data = bytearray(storage.read_bytes(row["payload_uri"]))
    data[-5] ^= 0xFF
    storage.write_bytes(row["payload_uri"], bytes(data))
    assert verify_image_files(storage, [rel]).mismatches == ["vol1"]
    storage.delete(row["payload_uri"])
    assert verify_image_files(storage, [rel]).mismatches == ["vol1"]


@pytest.fixture(scope="module")
def moto_endpoint():
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def test_loader_reads_a_volume_object_from_s3(ct, moto_endpoint, monkeypatch):
    """The same volume written to an ``s3://`` root (moto): the row's relative URI, sha256 and bytes hold, and the
    loader and ``to_tensor`` read it back through the object store with the values of the local object."""
    import boto3

    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket="medreco-vol")
    s3 = Storage.open("s3://medreco-vol/root", endpoint_url=moto_endpoint)
    local_storage, npy_row, local_row, array = ct
    row = externalise_volume(s3, npy_row, gzip_level=1)
    assert row["payload_uri"] == local_row["payload_uri"] and row["payload_sha256"] == local_row["payload_sha256"]
    assert s3.is_file(row["payload_uri"]) and s3.sha256(row["payload_uri"]) == row["payload_sha256"]
    got, meta = load_image(row, s3)
    local, _ = load_image(local_row, local_storage)
    assert got.dtype == np.int16 and got.shape == array.shape
    np.testing.assert_array_equal(got, local)
    assert meta["origin_mm"] == [float(v) for v in row["origin_mm"]]
    assert tuple(to_tensor(row, s3).shape) == array.shape
