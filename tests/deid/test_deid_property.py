"""Property: PHI planted at random depths, in private and VR UN elements and in several character sets
never survives: every generated file is either quarantined with a reason, or its output bytes hold none
of the planted values."""

from __future__ import annotations

import copy
import struct

import pydicom
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydicom.data import get_testdata_file
from pydicom.dataelem import DataElement
from pydicom.dataset import Dataset
from pydicom.filebase import DicomBytesIO
from pydicom.filewriter import write_dataset
from pydicom.sequence import Sequence

from etl.deid.dicom import DeidentificationError, deidentify_dataset
from etl.keys import PseudonymKey

KEY = PseudonymKey(b"property-test-secret-0123456789abcdef")
BASE = pydicom.dcmread(get_testdata_file("CT_small.dcm", download=False))
SCRIPTS = {
    "ISO_IR 100": "ÀÉÎÕÜàéîõüBCDFGHJKLMN",
    "ISO_IR 192": "ÁÉÍÓÚáéíóúŁŚŻĆΩЖЯBCDFG",
    "GB18030": "王李张刘陈杨黄赵吴周",
}
name = st.text(alphabet="BCDFGHJKLMNPQRSTVWXZ", min_size=5, max_size=9)
ident = st.from_regex(r"[A-Z]{2}[0-9]{6,8}", fullmatch=True)


def _un_sequence(item: Dataset) -> bytes:
    """An undefined-length sequence encoded as the value of a VR UN element (implicit VR items)."""
    fp = DicomBytesIO()
    fp.is_little_endian, fp.is_implicit_VR = True, True
    write_dataset(fp, item)
    body = fp.getvalue()
    return (
        struct.pack("<HHI", 0xFFFE, 0xE000, 0xFFFFFFFF)
        + body
        + struct.pack("<HHI", 0xFFFE, 0xE00D, 0)
        + struct.pack("<HHI", 0xFFFE, 0xE0DD, 0)
    )


@st.composite
def planted(draw):
    charset = draw(st.sampled_from(sorted(SCRIPTS)))
    # a native-script value holds at least one letter outside ASCII: a 3-letter ASCII draw such as "DCM" is a
    # coding scheme every output carries (DeidentificationMethodCodeSequence), not planted PHI
    native = draw(
        st.text(alphabet=SCRIPTS[charset], min_size=3, max_size=6).filter(lambda v: any(ord(c) > 127 for c in v))
    )
    family, given_name, mrn, acc = draw(name), draw(name), draw(ident), draw(ident)
    where = draw(
        st.lists(
            st.sampled_from(["top", "nested", "deep", "private", "private_un", "comment"]),
            min_size=1,
            max_size=6,
            unique=True,
        )
    )
    return charset, native, family, given_name, mrn, acc, where


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(planted())
def test_planted_phi_never_survives(p):
    charset, native, family, given_name, mrn, acc, where = p
    ds = copy.deepcopy(BASE)
    ds.SpecificCharacterSet = charset
    ds.PatientName = f"{family}^{given_name}"
    ds.PatientID = mrn
    ds.AccessionNumber = acc
    values = [family, given_name, mrn, acc, native]
    if "top" in where:
        ds.OtherPatientNames = f"{native}^{given_name}"
        ds.ReferringPhysicianName = f"{native}^{family}"
    if "nested" in where:
        item = Dataset()
        item.RequestedProcedureID = mrn
        item.ScheduledProcedureStepID = acc
        item.RequestingPhysician = f"{family}^{native}"
        ds.RequestAttributesSequence = Sequence([item])
    if "deep" in where:
        inner = Dataset()
        inner.ReferencedSOPInstanceUID = ds.SOPInstanceUID
        inner.ReferencedSOPClassUID = ds.SOPClassUID
        outer = Dataset()
        outer.ReferencedImageSequence = Sequence([inner])
        outer.SeriesInstanceUID = ds.SeriesInstanceUID
        outer.PerformingPhysicianName = f"{given_name}^{native}"
        ds.ReferencedSeriesSequence = Sequence([outer])
    if "private" in where:
        block = ds.private_block(0x0029, "MEDRECO PROP", create=True)
        block.add_new(0x01, "LO", f"{family} {mrn}")
        sub = Dataset()
        sub.add_new(0x00100010, "PN", f"{family}^{given_name}")
        block.add_new(0x02, "SQ", Sequence([sub]))
    if "private_un" in where:
        hidden = Dataset()
        hidden.PatientName = f"{family}^{native}"
        hidden.PatientID = mrn
        ds.add(DataElement(0x00311010, "UN", _un_sequence(hidden)))
        ds.add(DataElement(0x00310010, "LO", "HIDDEN VENDOR"))
    if "comment" in where:
        ds.ImageComments = f"pt {family} {given_name} MRN {mrn} acc {acc}"
        ds.StudyDescription = f"CT chest {family} {mrn}"
    sources = [v.encode(enc) for v in values for enc in ("utf-8", "latin-1", "gb18030") if _encodable(v, enc)]
    try:
        out = deidentify_dataset(ds, KEY, "prop").to_bytes()
    except DeidentificationError as err:
        assert err.reason in {"verification_failed", "deidentification_error"}
        return
    leaked = [s for s in sources if s in out]
    assert leaked == []


def _encodable(v: str, enc: str) -> bool:
    try:
        v.encode(enc)
        return True
    except UnicodeEncodeError:
        return False
