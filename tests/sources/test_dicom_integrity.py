"""A file cut before its pixel data, or inside its header, is quarantined as truncated (never read as a complete,
pixel-less object); an image object without pixels is quarantined at normalisation instead of vanishing."""

from __future__ import annotations

import io
from pathlib import Path

import pydicom
import pytest
from pydicom.dataset import Dataset
from pydicom.uid import UID

from etl.deid.dicom import DeidentificationError, deidentify_dataset
from etl.keys import PseudonymKey
from etl.pixels.normalise import NormalisationError, check_image_has_pixels
from etl.sources.dicom_integrity import last_element_cut
from etl.sources.discover import classify_dicom

MR_FILE = Path("dicom/mr/dcm_qa_nih_ge_study_4_series/mr_0005/axial_epi_fmri_sequential_i_to_s-00002.dcm")
KEY = PseudonymKey(b"integrity-test-secret-0123456789abcdef")


@pytest.fixture(scope="module")
def mr_bytes(shared_data) -> bytes:
    """A real GE MR slice with a large private element just before its Pixel Data."""
    return (shared_data / MR_FILE).read_bytes()


def _read(data: bytes, **kw) -> Dataset:
    return pydicom.dcmread(io.BytesIO(data), force=True, **kw)


def test_whole_file_is_not_cut(mr_bytes):
    assert last_element_cut(_read(mr_bytes)) is None
    assert last_element_cut(Dataset()) is None


def test_file_cut_inside_a_private_element_before_pixel_data(mr_bytes):
    data = mr_bytes
    cut = _read(data[: len(data) // 2])
    assert "PixelData" not in cut  # pydicom reads it as a complete object without pixels
    assert last_element_cut(cut) == "(0043,102A)"
    with pytest.raises(DeidentificationError) as err:
        deidentify_dataset(cut, KEY, "inst-a")
    assert err.value.reason == "truncated_file" and "(0043,102A)" in str(err.value)


def test_file_cut_inside_its_header_is_truncated_not_missing_patient_id(mr_bytes):
    data = mr_bytes
    uids: dict = {}
    pid, reason, detail = classify_dicom(data[:1000], uids)  # inside a sequence of defined length
    assert (pid, reason) == (None, "truncated_file") and "header" in detail
    whole_pid, whole_reason, _ = classify_dicom(data, {})
    assert whole_reason is None and whole_pid


def test_image_object_without_pixels_is_no_pixel_data(mr_bytes):
    ds = _read(mr_bytes)
    del ds.PixelData
    with pytest.raises(NormalisationError) as err:
        check_image_has_pixels(ds)
    assert err.value.reason == "no_pixel_data" and "MR Image Storage" in str(err.value)
    check_image_has_pixels(_read(mr_bytes))  # with pixels: passes
    sr = Dataset()
    sr.SOPClassUID = UID("1.2.840.10008.5.1.4.1.1.88.11")  # Basic Text SR: not an image
    check_image_has_pixels(sr)
