"""DICOM de-identification (PS3.15 Basic Profile, table driven): remapped UIDs, per-patient date shift,
options recorded, fail-closed with verification after."""

from __future__ import annotations

import copy
import datetime as dt
import io

import pydicom
import pytest
from pydicom.data import get_testdata_file
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence

from etl.deid.dicom import DeidentificationError, deidentify_dataset, shift_date, shift_datetime


@pytest.fixture()
def ct():
    ds = pydicom.dcmread(get_testdata_file("CT_small.dcm", download=False))
    ds.PatientName = "DOE^JOHN^A"
    ds.PatientID = "MRN-778899"
    ds.AccessionNumber = "ACC123456"
    ds.PatientBirthDate = "19400102"
    ds.PatientAge = "093Y"
    ds.InstitutionName = "Springfield General Hospital"
    ds.ImageComments = "patient John Doe, see prior"
    ds.StudyDate = "20230314"
    ds.AcquisitionDateTime = "20230314101502.123456+0100"
    item = Dataset()
    item.RequestedProcedureID = "RP-998877"
    ds.RequestAttributesSequence = Sequence([item])
    block = ds.private_block(0x0009, "MEDRECO DEMO", create=True)
    block.add_new(0x01, "LO", "DOE^JOHN private copy")
    return ds


def _all_strings(ds: Dataset) -> str:
    return " ".join(str(e.value) for e in ds.iterall() if e.VR not in ("OB", "OW", "SQ", "UN"))


def test_phi_removed_and_identity_replaced(ct, key):
    pixels = ct.PixelData
    r = deidentify_dataset(ct, key, "us-a")
    out = pydicom.dcmread(io.BytesIO(r.to_bytes()))
    text = _all_strings(out) + " " + _all_strings(out.file_meta)
    for value in ("DOE", "JOHN", "MRN-778899", "ACC123456", "19400102", "Springfield", "RP-998877"):
        assert value not in text
    assert str(out.PatientName) == r.patient_key == out.PatientID
    assert out.AccessionNumber == "" and r.accession_key == key.pseudonym("accession", "us-a|ACC123456")  # Z
    assert out.PatientBirthDate == ""  # Z
    assert "ImageComments" not in out and "RequestAttributesSequence" not in out  # X
    assert out.InstitutionName == f"INSTITUTION-{key.pseudonym('institution', 'us-a', 12)}"
    assert not any(e.tag.is_private for e in out.iterall())
    assert out.PatientAge == "090Y"  # over 89 -> 90+ (Retain Patient Characteristics)
    assert out.PatientIdentityRemoved == "YES" and out.LongitudinalTemporalInformationModified == "MODIFIED"
    assert [c.CodeValue for c in out.DeidentificationMethodCodeSequence] == ["113100", "113105", "113107", "113108"]
    assert out.Rows == 128 and out.PixelData == pixels
    assert r.audit["verified"] == 1 and r.audit["removed"] > 0 and r.audit["remapped"] >= 4


def test_uids_remapped_consistently(ct, key):
    study, sop, sop_class = ct.StudyInstanceUID, ct.SOPInstanceUID, ct.SOPClassUID
    twin = copy.deepcopy(ct)
    r = deidentify_dataset(ct, key, "us-a")
    assert r.dataset.StudyInstanceUID == key.uid(study) != study
    assert r.dataset.file_meta.MediaStorageSOPInstanceUID == r.dataset.SOPInstanceUID == key.uid(sop)
    assert r.dataset.SOPClassUID == sop_class
    again = deidentify_dataset(twin, key, "us-a")
    assert again.to_bytes() == r.to_bytes(), "same input and key -> byte-identical output"


def test_dates_shift_by_one_offset_per_patient(ct, key):
    later = copy.deepcopy(ct)
    r = deidentify_dataset(ct, key, "us-a")
    shift = key.date_shift_days(r.patient_key)
    assert r.date_shift_days == shift
    expected = (dt.date(2023, 3, 14) + dt.timedelta(days=shift)).strftime("%Y%m%d")
    assert r.dataset.StudyDate == expected
    assert r.dataset.AcquisitionDateTime == expected + "101502.123456+0100"
    later.StudyDate = "20240101"
    r2 = deidentify_dataset(later, key, "us-a")
    gap = dt.datetime.strptime(r2.dataset.StudyDate, "%Y%m%d") - dt.datetime.strptime(r.dataset.StudyDate, "%Y%m%d")
    assert gap.days == (dt.date(2024, 1, 1) - dt.date(2023, 3, 14)).days  # intervals preserved exactly


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda d: setattr(d, "BurnedInAnnotation", "YES"), "burned_in_annotation_risk"),
        (lambda d: setattr(d, "Modality", "US"), "burned_in_annotation_risk"),
        (lambda d: setattr(d, "SOPClassUID", "1.2.840.10008.5.1.4.1.1.7"), "burned_in_annotation_risk"),
        (lambda d: setattr(d, "PatientID", ""), "missing_patient_id"),
        (lambda d: setattr(d, "StudyDate", "2023-03-14"), "unparseable_date"),
        (lambda d: setattr(d, "SeriesDate", "20231345"), "unparseable_date"),
        (lambda d: setattr(d, "ConvolutionKernel", "DOE JOHN"), "verification_failed"),
        (lambda d: setattr(d, "FilterType", "MRN-778899"), "verification_failed"),
    ],
)
def test_fail_closed(ct, key, mutate, reason):
    mutate(ct)
    # the header's burned-in text rule is what applies where OCR is off (config deid.burned_in_text.ocr_off);
    # with OCR on, such files are read and blanked instead (tests/deid/test_burned_in_text.py)
    from etl.deid.policy import build_policy
    from schemas.config import BurnedInTextConfig, DeidConfig

    policy = build_policy(DeidConfig(burned_in_text=BurnedInTextConfig(ocr=False)))
    with pytest.raises(DeidentificationError) as err:
        deidentify_dataset(ct, key, "us-a", policy)
    assert err.value.reason == reason
    assert "DOE" not in str(err.value) and "JOHN" not in str(err.value)


def test_shift_helpers_keep_precision():
    assert shift_date("20240228", 1) == "20240229"
    assert shift_date("1999.12.31", 1) == "20000101"  # ACR-NEMA form read, written as DA
    assert shift_datetime("2024022823", 2) == "2024030123"
    assert shift_datetime("20230314101502.123456+0100", -3) == "20230311101502.123456+0100"
    assert shift_datetime("202403", 40) == "202404"  # partial stays partial (moves its first day)
    assert shift_datetime("2024", 400) == "2025"
    for bad in ("2024-03-14", "20241301", "yesterday"):
        with pytest.raises(DeidentificationError):
            shift_datetime(bad, 1)


def test_output_reads_back(ct, key):
    back = pydicom.dcmread(io.BytesIO(deidentify_dataset(ct, key, "us-a").to_bytes()))
    assert back.pixel_array.shape == (128, 128)


def test_retain_safe_private_keeps_only_allow_listed(ct, key):
    from etl.deid.policy import build_policy
    from schemas.config import DeidConfig

    block = ct.private_block(0x0019, "Agfa ADC NX", create=True)
    block.add_new(0xF6, "DS", "1.5")  # Plate Sensitivity: TCIA disposition keep
    block.add_new(0x10, "LO", "DOE JOHN operator")  # not allow-listed
    n_private_in = sum(1 for e in ct if e.tag.is_private)
    policy = build_policy(DeidConfig(retain_safe_private=True))
    r = deidentify_dataset(ct, key, "us-a", policy)
    out = pydicom.dcmread(io.BytesIO(r.to_bytes()))
    private_out = [e for e in out if e.tag.is_private]
    agfa = out.private_block(0x0019, "Agfa ADC NX")  # its private creator stays
    assert out[agfa.get_tag(0xF6)].value == "1.5"
    assert b"DOE JOHN operator" not in r.to_bytes()
    assert 0 < len(private_out) < n_private_in, "only allow-listed private attributes (and their creators) stay"
    assert "113111" in [c.CodeValue for c in out.DeidentificationMethodCodeSequence]


def test_device_identity_is_an_option(ct, key):
    from etl.deid.policy import build_policy
    from schemas.config import DeidConfig

    ct.StationName = "CTSCANNER7"
    ct.DeviceSerialNumber = "SN-424242"
    twin = copy.deepcopy(ct)
    out = pydicom.dcmread(io.BytesIO(deidentify_dataset(ct, key, "us-a").to_bytes()))
    assert "StationName" not in out or not out.StationName
    assert "SN-424242" not in str(out.get("DeviceSerialNumber", ""))
    kept = deidentify_dataset(twin, key, "us-a", build_policy(DeidConfig(retain_device_identity=True)))
    out2 = pydicom.dcmread(io.BytesIO(kept.to_bytes()))
    assert out2.DeviceSerialNumber == "SN-424242" and out2.StationName == "CTSCANNER7"
    assert "113109" in [c.CodeValue for c in out2.DeidentificationMethodCodeSequence]


def test_text_not_matching_its_declared_charset_is_removed(ct, key):
    from pydicom.dataelem import RawDataElement

    ct.SpecificCharacterSet = "ISO_IR 192"  # UTF-8 declared ...
    # ... but the kept ConvolutionKernel holds ISO 8859-1 bytes: invalid UTF-8, cannot be vetted
    ct._dict[pydicom.tag.Tag(0x00181210)] = RawDataElement(
        pydicom.tag.Tag(0x00181210), "SH", 6, b"M\xfcller", 0, False, True
    )
    r = deidentify_dataset(ct, key, "us-a")
    out = pydicom.dcmread(io.BytesIO(r.to_bytes()))
    assert "ConvolutionKernel" not in out and r.audit["removed_undecodable"] == 1
    out.decode()  # everything left decodes under the declared character set


def test_name_parts_are_not_looked_for_inside_binary_values(ct, key):
    """A short name part occurring by chance in a kept binary value (here an ICC profile) is no leak;
    found by the demo build (a patient named Lee)."""
    ct.PatientName = "LEE^ANN^X"
    ct.ICCProfile = b"\x00\x01 lee \x02\x03" * 8
    r = deidentify_dataset(ct, key, "us-a")
    assert r.audit["verified"] == 1 and b" lee " in r.to_bytes()
