"""Structured content of SR objects is removed by de-identification (issue 22, item 2): ContentSequence
(0040,A730) at every depth, so no TextValue, PersonName, DateTime or UID of a content item survives
(schemas/deid/profile.yaml ``overrides``)."""

from __future__ import annotations

import io
import warnings

import pydicom
import pytest

from etl.deid.dicom import deidentify_dataset

pytestmark = pytest.mark.realdata
SR_FILES = [
    "orthanc_basic_text_sr_polish_latin2.dcm",
    "orthanc_osirix_annotations_sr.dcm",
    "highdicom_comprehensive3d_sr_tid1500.dcm",
]
CONTENT_ITEM_VALUES = ("TextValue", "PersonName", "DateTime", "Date", "Time", "UID", "ContentSequence")


def _read(data):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pydicom.dcmread(data if not isinstance(data, bytes) else io.BytesIO(data), force=True)


@pytest.mark.parametrize("name", SR_FILES)
def test_sr_content_tree_is_removed(shared_data, key, name):
    src = shared_data / "dicom" / "sr-seg-other" / name
    before = _read(src)
    assert "ContentSequence" in before
    out = _read(deidentify_dataset(_read(src), key, "shared").to_bytes())
    assert "ContentSequence" not in out
    assert [e.keyword for e in out.iterall() if e.keyword in CONTENT_ITEM_VALUES] == []
    # the document itself stays what it was: same SOP class, root concept and completion flags
    assert out.SOPClassUID == before.SOPClassUID
    assert out.get("ValueType") == before.get("ValueType") == "CONTAINER"


def test_polish_sr_licence_number_and_report_text_are_gone(shared_data, key):
    src = shared_data / "dicom" / "sr-seg-other" / "orthanc_basic_text_sr_polish_latin2.dcm"
    before = _read(src)
    texts = [e.value for e in before.iterall() if e.keyword == "TextValue"]
    assert "0000000" in texts  # the practitioner licence number ("Prawo wykonywania zawodu")
    payload = deidentify_dataset(_read(src), key, "shared").to_bytes()
    for value in ["0000000", "dgtfhglhghk", "sdadasdas", "iodsa", "i7big"]:
        assert value.encode("latin-1") not in payload
