"""Issue 19, item 2 a-c: verifier and walker blind spots. Each attack is a real file with a planted name, MRN and UID;
the outcome is exact: the file is quarantined with a reason code, or the planted values are in no output byte."""

from __future__ import annotations

import io
import struct

import pydicom
import pytest
from pydicom.data import get_testdata_file
from pydicom.dataelem import DataElement
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence
from pydicom.uid import ImplicitVRLittleEndian

from etl.deid.dicom import DeidentificationError, deidentify_dataset

NAME, MRN, UID = "Zebulon^Quixley", "MRN99887766", "1.2.3.4.5.6.7.8.9.424242"
PLANTED = (b"Zebulon", b"Quixley", b"99887766", b"424242")


def _ct() -> Dataset:
    ds = pydicom.dcmread(get_testdata_file("CT_small.dcm", download=False))
    ds.PatientName = NAME
    ds.PatientID = MRN
    return ds


def _bytes(ds: Dataset, implicit: bool = False) -> bytes:
    buf = io.BytesIO()
    if implicit:
        ds.file_meta.TransferSyntaxUID = ImplicitVRLittleEndian
        ds.save_as(buf, implicit_vr=True, little_endian=True)
    else:
        ds.save_as(buf)
    return buf.getvalue()


def _deid(data: bytes, key):
    return deidentify_dataset(pydicom.dcmread(io.BytesIO(data), force=True), key, "inst")


def _no_planted(payload: bytes) -> None:
    for p in PLANTED:
        assert p not in payload, p


@pytest.mark.parametrize("implicit", [True, False])
def test_sequence_with_zero_length_field_is_quarantined(key, implicit):
    """2a: a 4-byte change (the sequence's length field to 0) leaves its item at dataset level as (FFFE,E000)."""
    ds = _ct()
    item = Dataset()
    item.PatientName = NAME  # nested: name, text and UID of the item
    item.TextValue = f"patient {MRN}"
    item.ReferencedSOPInstanceUID = UID
    ds.ReferencedStudySequence = Sequence([item])
    data = bytearray(_bytes(ds, implicit))
    i = data.find(struct.pack("<HH", 0x0008, 0x1110), 132)
    at = i + 4 if implicit else i + 8  # implicit: tag, length; explicit: tag, VR, reserved, length
    assert struct.unpack("<I", data[at : at + 4])[0] not in (0, 0xFFFFFFFF)
    data[at : at + 4] = struct.pack("<I", 0)
    with pytest.raises(DeidentificationError) as err:
        _deid(bytes(data), key)
    assert err.value.reason in ("malformed_structure", "deidentification_error")
    if implicit:  # the exact attack of the issue: the item is read as an element with VR "NONE"
        assert err.value.reason == "malformed_structure"
    for p in PLANTED:
        assert p.decode() not in str(err.value)


def test_unknown_public_tag_is_removed(key):
    ds = _ct()
    ds.add(DataElement(0x0020FFF0, "LO", f"{NAME} {MRN}"))  # not in the data dictionary
    out = _deid(_bytes(ds), key)
    assert 0x0020FFF0 not in out.dataset
    _no_planted(out.payload)


@pytest.mark.parametrize("keyword", ["ManufacturerModelName", "SoftwareVersions", "Manufacturer"])
def test_patient_identity_in_a_device_field_is_found(key, keyword):
    """2b: a patient's name and MRN in ManufacturerModelName were published in series.model."""
    ds = _ct()
    setattr(ds, keyword, f"{NAME.replace('^', ' ')} {MRN}")
    with pytest.raises(DeidentificationError) as err:
        _deid(_bytes(ds), key)
    assert err.value.reason == "verification_failed"
    assert "Zebulon" not in str(err.value) and "99887766" not in str(err.value)


def test_institution_in_model_name_is_found_but_a_vendor_name_is_not(key):
    ds = _ct()
    ds.InstitutionName = "Quixley Memorial Hospital"
    ds.ManufacturerModelName = "Quixley Memorial Hospital CT"
    with pytest.raises(DeidentificationError) as err:
        _deid(_bytes(ds), key)
    assert err.value.reason == "verification_failed"
    ds = _ct()  # vendor test files: InstitutionName TOSHIBA beside Manufacturer TOSHIBA_MEC
    ds.PatientName, ds.PatientID = "DOE^JANE", "ID-55443322"
    ds.InstitutionName, ds.Manufacturer = "TOSHIBA", "TOSHIBA_MEC"
    out = _deid(_bytes(ds), key)
    assert str(out.dataset.Manufacturer) == "TOSHIBA_MEC"


@pytest.mark.parametrize("vr", ["OB", "OW"])
def test_unlisted_public_element_with_a_binary_vr_is_removed(key, vr):
    """2c: names in an unlisted public element written as OB were not searched."""
    ds = _ct()
    ds.add(DataElement(0x00185100, vr, f"{NAME} {MRN} ".encode()))  # PatientPosition (CS, unlisted) as bytes
    out = _deid(_bytes(ds), key)
    assert 0x00185100 not in out.dataset
    _no_planted(out.payload)


def test_known_element_written_as_un_is_read_with_its_dictionary_vr_and_verified(key):
    ds = _ct()
    ds.add(DataElement(0x00185100, "UN", f"{NAME} {MRN} ".encode()))
    with pytest.raises(DeidentificationError) as err:
        _deid(_bytes(ds), key)
    assert err.value.reason == "verification_failed"


def test_name_spelled_in_numeric_values_is_found(key):
    ds = _ct()
    ds.add(DataElement(0x00181310, "US", list(struct.unpack("<4H", b"Zebulon "))))  # AcquisitionMatrix: US, VM 4
    with pytest.raises(DeidentificationError) as err:
        _deid(_bytes(ds), key)
    assert err.value.reason == "verification_failed"


def test_numeric_values_past_their_multiplicity_are_malformed(key):
    """Five values in a palette descriptor (US, VM 3): other bytes swallowed, whatever they spell (issue 41)."""
    ds = _ct()
    raw = b"Zebulon " + b"\x00" * 2
    ds.add(DataElement(0x00281101, "US", list(struct.unpack("<5H", raw))))
    with pytest.raises(DeidentificationError) as err:
        _deid(_bytes(ds), key)
    assert err.value.reason == "malformed_structure"


def test_pixel_data_is_still_kept(key):
    ds = _ct()
    out = _deid(_bytes(ds), key)
    assert out.dataset.PixelData == ds.PixelData
